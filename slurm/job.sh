# shellcheck shell=bash
# What every multicard job does around its planner; sourced by the sbatch templates, which set
# RUN (the run's name), OUT (its directory on this host) and SIF (the image, absolute) first.
#
# - The job's end, less a margin for the trial in flight to be ended and recorded, becomes the
#   planner's deadline (MULTICARD_DEADLINE): no trial starts that would outrun it.
# - 600 s before the end Slurm sends USR1 (--signal=B:USR1@600): the planner is told to stop (the
#   trial in flight is ended and recorded as interrupted) and, with MULTICARD_REQUEUE=1, the job
#   requeues itself; so it does when the planner left trials for lack of time (OUT/left.json,
#   written by this job's planner).
#   A requeue is done at most MULTICARD_MAX_REQUEUES times (SLURM_RESTART_COUNT counts them): a
#   trial that never fits in a job ends the chain instead of looping.
# - TERM (scancel, pre-emption) stops the planner the same way, without a requeue.
# - The report and verify run in a job of their own (slurm/report.sbatch), submitted at the
#   start with afterany on this one: in this job the time limit's KILL (KillWait after TERM)
#   could end them midway. One pending report job per run is enough.

MULTICARD_MAX_REQUEUES=${MULTICARD_MAX_REQUEUES:-3}
# the templates' --signal=B:USR1@600 lead, plus the up to 60 s earlier Slurm may send it
# (sbatch(1), --signal), plus 60 s to end and record the trial in flight: change them together
SIGNAL_LEAD_S=600
MARGIN_S=$((SIGNAL_LEAD_S + 60 + 60))
# the nox session leaves the report and verify to the report job (noxfile.py)
export MULTICARD_REPORT_ELSEWHERE=1 APPTAINERENV_MULTICARD_REPORT_ELSEWHERE=1

job_end() {
    # Slurm >= 23.02 exports the job's end; before, squeue says it (local time, or UNLIMITED)
    if [ -n "${SLURM_JOB_END_TIME:-}" ]; then
        echo "$SLURM_JOB_END_TIME"
        return
    fi
    local end
    end=$(squeue -h -j "$SLURM_JOB_ID" -o %e 2>/dev/null || true)
    if [[ "$end" =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}T ]]; then
        date -d "$end" +%s
    fi
}

set_deadline() {
    local end
    end=$(job_end)
    if [ -n "$end" ]; then
        export MULTICARD_DEADLINE="@$((end - MARGIN_S))"
        # apptainer passes APPTAINERENV_X into the image as X, --cleanenv or not
        export APPTAINERENV_MULTICARD_DEADLINE=$MULTICARD_DEADLINE
    fi
}

# `apptainer run --cleanenv` keeps the host's environment (a PYTHONPATH, a venv's variables) out
# of the image; what the run needs of it goes in by name (APPTAINERENV_X is X inside): the job's
# SLURM_* (its id for the run directory's lease, its provenance in env.json), the GPUs Slurm gave
# it, NCCL_* a site sets, and MULTICARD_*
pass_into_image() {
    local name
    for name in $(compgen -e); do
        case $name in
            SLURM_* | NCCL_* | MULTICARD_* | CUDA_VISIBLE_DEVICES) export "APPTAINERENV_$name=${!name}" ;;
        esac
    done
}

submit_report() {
    local name="multicard-report-$RUN"
    if [ -n "$(squeue -h -u "${USER:-$(id -un)}" -n "$name" -o %i 2>/dev/null || true)" ]; then
        return
    fi
    # the run's own partition and account: a site's default may not take the job, or bill another;
    # a GPU partition that refuses a job asking no GPU: MULTICARD_REPORT_PARTITION names another
    local where=() partition=${MULTICARD_REPORT_PARTITION:-${SLURM_JOB_PARTITION:-}}
    local account=${MULTICARD_REPORT_ACCOUNT:-${SLURM_JOB_ACCOUNT:-}}
    [ -n "$partition" ] && where+=(--partition="$partition")
    [ -n "$account" ] && where+=(--account="$account")
    sbatch --parsable --dependency="afterany:$SLURM_JOB_ID" --job-name="$name" ${where[@]+"${where[@]}"} \
        --export="ALL,MULTICARD_SIF=$SIF" slurm/report.sbatch "$RUN" >/dev/null ||
        echo "multicard: could not submit the report job; after this job: sbatch slurm/report.sbatch $RUN"
}

requeue_or_say() {
    local restarts=${SLURM_RESTART_COUNT:-0}
    if [ "${MULTICARD_REQUEUE:-0}" != 1 ]; then
        echo "multicard: $1; not requeued (MULTICARD_REQUEUE=1 requeues): the same sbatch line resumes $RUN"
    elif [ "$restarts" -ge "$MULTICARD_MAX_REQUEUES" ]; then
        echo "multicard: $1; requeued $restarts time(s) already (MULTICARD_MAX_REQUEUES=$MULTICARD_MAX_REQUEUES): not again; the report job writes what $RUN has"
    else
        echo "multicard: $1; requeueing $RUN ($((restarts + 1)) of at most $MULTICARD_MAX_REQUEUES)"
        stopping=1
        scontrol requeue "$SLURM_JOB_ID"
    fi
}

child=""
stopping=""
stop() {
    # once: `scontrol requeue` sends TERM to this shell as well
    if [ -n "$stopping" ]; then
        return
    fi
    stopping=1
    echo "multicard: $1: stopping $RUN, recording the trial in flight"
    if [ -n "$child" ]; then
        kill -TERM "$child" 2>/dev/null || true
        # a second signal ends a `wait` early: wait until the planner has recorded and gone
        while kill -0 "$child" 2>/dev/null; do
            wait "$child" || true
        done
    fi
    if [ "$2" = requeue ]; then
        requeue_or_say "the time limit is near"
    fi
    exit 143
}
trap 'stop "the time limit is near" requeue' USR1
trap 'stop "told to stop (SIGTERM)" no' TERM

run_planner() {
    # In the background, so that a trap runs while the planner does (bash runs a trap only
    # between commands). Its exit status is the job's; `|| status=$?`: under set -e a failed
    # planner must not skip what follows.
    # left.json counts only when this job's planner wrote it, not one an earlier job left behind
    rm -f "$OUT/left.json"
    "$@" &
    child=$!
    local status=0
    wait "$child" || status=$?
    child=""
    if [ -f "$OUT/left.json" ]; then
        requeue_or_say "trials are left that need more time than this job had ($OUT/left.json)"
    fi
    return "$status"
}
