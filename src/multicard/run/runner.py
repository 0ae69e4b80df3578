"""Run an experiment: every planned trial as its own process group, one record per attempt.

A trial is one fresh launch (torchrun + its ranks) in a new session, so a timeout can kill the
whole group and trials stay independent samples. Results are appended to DIR/trials.jsonl as they
finish; running again on the same DIR does only the trials that have no ok record yet, except
one that timed out: its record is a censored time, which a faster second attempt would hide. A trial
that fails, times out or runs out of memory becomes a record with its cause; the sweep goes on.

A trial across several nodes is still one process of this runner: one launcher step (srun) that
starts every node's part (multicard.run.cluster); this runner, on one host, is the only one that
plans and writes records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from multicard import integrity
from multicard.data import mnist, page_cache
from multicard.errors import InputError
from multicard.judge import adaptive, claims, operating_point
from multicard.measure import devices, environment, gpu_state, observe, processes, telemetry
from multicard.measure.meters import LaunchMeters
from multicard.plan import calibrate, launch
from multicard.plan import spec as specmod
from multicard.plan.spec import PlannedTrial, Spec
from multicard.profiling import nsys, parse
from multicard.run import cluster, locks, preflight, store
from multicard.run.stopping import GATE, Interrupted, stop_on_signals
from multicard.workloads import registry

STDERR_TAIL_CHARS = 4000
# SIGTERM, then SIGKILL for what is left: well inside Slurm's KillWait (30 s by default)
KILL_GRACE_S = 5.0
OOM_PATTERNS = ("CUDA out of memory", "OutOfMemoryError", "out of memory",
                "DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory",
                # Slurm's cgroup OOM killer, in slurmstepd's and srun's words
                "oom_kill event", "oom-kill event", ": Out Of Memory")
# Causes that a traceback's exception type would hide (a DataLoader worker dying shows up as a
# RuntimeError); the first pattern found in the stderr tail names the failure.
CAUSES = (
    # the DataLoader's shared-memory errors (a full /dev/shm), not any full disk
    (re.compile(r"unable to (?:write to|mmap) .*(?:shm|torch_)|Bus error"), "SharedMemoryExhausted"),
    (re.compile(r"DataLoader worker \(pid\(?s?\)? ?[\d, ]+\)? (?:is killed by signal|exited unexpectedly)"),
     "DataLoaderWorkerKilled"),
    # torchrun's summary when a rank got SIGKILL (the kernel's OOM killer sends it); a rank that
    # crashed on another signal (SIGSEGV, SIGABRT) is no resource limit
    (re.compile(r"Signal 9 \(SIGKILL\) received by PID \d+"), "RankKilled"),
    (re.compile(r"Signal \d+ \(SIG\w+\) received by PID \d+"), "RankSignalled"),
    # NCCL out of system resources or of device memory; its usage errors and hangs are not
    (re.compile(r"ncclSystemError|ncclUnhandledCudaError|NCCL.{0,80}out of memory"), "NCCLError"),
)
_EXCEPTION_LINE = re.compile(r"^\s*(?:\[rank\d+\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception)):\s*(.*)$")


class RunStopped(Exception):  # noqa: N818 (a condition of the machine, reported as such)
    """The run cannot go on on this machine or cluster; one line says why (exit status 1)."""


class ClusterFailure(RunStopped):
    """The nodes cannot run trials: the preflight failed, or trials in a row never started."""


# multi-node trials in a row that never started on some node, or failed within FAST_FAIL_S of
# their step's start, before the run stops (a launcher, an image or a node that broke mid-run)
MAX_UNSTARTED = 3
FAST_FAIL_S = 10.0
# multi-node trials in a row that hung on the same node (each waited out its timeout)
MAX_HUNG = 2
# how long a run waits for another preparing the same inputs in a shared cache
PREPARE_WAIT_S = 3600.0


class StorageFull(RunStopped):
    """The run directory's file system is full (or over quota): the run stops; every record
    written before stays, and the same command resumes once there is space."""


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def append_record(trials_file: Path, record: dict[str, Any]) -> None:
    with GATE.hold():  # a stop never tears a record
        store.append(trials_file, record)


@dataclass(frozen=True)
class RunOutcome:
    out: Path
    ran: int
    ok: int
    failed: int
    skipped: int  # configs this machine cannot run (reason recorded)
    already_ok: int  # trials a previous invocation finished
    left: int = 0  # trials not started: they would have outrun the deadline


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Nodes:
    """How the trials with nnodes > 1 reach their nodes: the launcher step and where the nodes'
    torchrun processes meet (HOST:PORT on the first node, the same for every trial)."""

    launcher: cluster.Launcher
    rdzv_endpoint: str
    stage_dir: Path | None = None  # node-local disk for Scenario B trees (each node copies)


def run(spec: Spec, out: Path, trials: int | None = None, echo: Callable[[str], None] = print,
        data_dir: Path | None = None, trace: str | None = None,
        nodes: Nodes | None = None, deadline_unix: float | None = None,
        shard: specmod.Shard | None = None, rates: Mapping[str, calibrate.Rate] | None = None
        ) -> RunOutcome:
    """Run (or resume) `spec` into `out`; `trace` overrides the spec's `[trials].trace`; with
    `shard`, only that part of the plan (shard.json says which). `rates`: measured rates
    (plan --calibrate) for the trials' estimates, beside those this run measures as it goes.

    A trial with nnodes > 1 is one step of `nodes.launcher` (one part per node, multicard.run.cluster),
    after a preflight step over the nodes; this process alone plans, and alone writes `out`'s
    records. No trial starts whose estimate reaches past `deadline_unix` (a job's time limit):
    those are left for the next run (`RunOutcome.left`, left.json), the others still run.
    """
    if any(int(s["nnodes"]) > 1 for _, _, s in specmod.configs(spec)) and nodes is None:
        raise InputError(f"{spec.path}: nnodes > 1 needs --rdzv-endpoint HOST:PORT (on the first "
                         "node) and a launcher (srun by default)")
    if why := registry.refused_here(spec.workload):
        raise InputError(f"{spec.path}: {why}")
    if shard and spec.auto:
        raise InputError(f"{spec.path}: --shard with [trials].count = \"auto\": each part would decide "
                         "when to stop from its own trials alone; give a number of trials")
    # everything that can refuse the run does so before a file is written
    spec = dataclasses.replace(spec, trials=trials or spec.trials,
                               trace=resolve_trace(spec, trace or spec.trace, echo))
    gpus = _check_devices(spec, specmod.plan(spec))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{out}: cannot create the run directory ({exc.strerror})") from None
    try:
        with locks.run_lock(out) as lease_lost:
            data_dir = (data_dir or mnist.default_root()).resolve()
            with stop_on_signals():
                _check_shard(out, shard)
                _prepare(spec, out, data_dir, gpus)
                _prepare_inputs(spec, out, data_dir, echo)
                outcome = _run_pending(spec, out, data_dir, echo, nodes, deadline_unix, shard,
                                       Estimator(spec, out, rates or {}), lease_lost)
                _record_gpus_at_end(out)
                return outcome
    except Interrupted as stop:
        stop.out = out
        raise
    except OSError as exc:
        if exc.errno not in DISK_FULL:
            raise
        kept = len(store.read(out / store.TRIALS_FILE))
        where = f" ({exc.filename})" if exc.filename else ""
        raise StorageFull(f"{out}: {exc.strerror}{where}; the run stopped with {kept} record(s) "
                          f"kept in {store.TRIALS_FILE}; free some space and run the same command "
                          "to resume") from None


def resolve_trace(spec: Spec, mode: str, echo: Callable[[str], None]) -> str:
    """The trace mode to use: nsys only where it is installed (else torch, if the spec allows)."""
    if mode != "nsys" or nsys.find_nsys():
        return mode
    if spec.trace_fallback:
        echo("nsys is not on PATH: tracing with the PyTorch profiler instead ([trials].trace_fallback)")
        return "torch"
    raise InputError(f"{spec.path}: trace = 'nsys' but nsys is not on PATH (install Nsight Systems, "
                     "use --trace torch, or set [trials].trace_fallback = true)")


def _prepare(spec: Spec, out: Path, data_dir: Path, gpus: list[devices.GpuIdentity]) -> None:
    """Write spec.toml and env.json, or check that `out` holds a run of this same spec. A new
    run's env.json also holds the idle power of the trial GPUs (`gpus`), read here, before its
    first trial (gpu_state.idle_power: 5 s)."""
    spec_file = out / "spec.toml"
    if spec_file.exists():
        existing = specmod.load(spec_file)
        comparable = dataclasses.replace(existing, path=spec.path, trials=spec.trials,
                                         trace=spec.trace)
        if comparable != spec:
            raise InputError(f"{out}: holds a run of a different spec or profile "
                             f"({existing.name}, profile {existing.profile}); use another --out")
    integrity.write_text_atomic(spec_file, specmod.to_toml(spec))
    env_file = out / "env.json"
    env = environment.capture_env(data_dir)
    if env_file.exists():  # a resumed run: keep the first environment, record this one beside it
        env_file = out / f"env-resume-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    else:
        env[gpu_state.IDLE_KEY] = gpu_state.idle_power(gpus)
    integrity.write_text_atomic(env_file, json.dumps(env, indent=1))


def _check_shard(out: Path, shard: specmod.Shard | None) -> None:
    """A run directory holds one part of the plan for good: a resume must ask for the same."""
    held = store.read_shard(out)
    if held is not None and held != shard:
        raise InputError(f"{out}: holds part {held.index}/{held.count} of the plan; resume it with "
                         f"--shard {held.index}/{held.count}, or use another --out")
    if held is None and shard is not None and (out / "spec.toml").exists():
        raise InputError(f"{out}: holds a run of the whole plan; a --shard needs another --out")
    if shard is not None and held is None:
        integrity.write_text_atomic(out / store.SHARD_FILE, json.dumps(dataclasses.asdict(shard)))


def _record_gpus_at_end(out: Path) -> None:
    """The GPUs' state when the run's trials ended, beside env.json's from its start, and how
    long power, heat or another limit held each one's clocks down in between."""
    found, why = gpu_state.every_gpu()
    env = out / "env.json"
    found = gpu_state.with_held_down(found, json.loads(env.read_text()).get("gpus") or []
                                     if env.is_file() else [])
    integrity.write_text_atomic(out / gpu_state.END_FILE, json.dumps(
        {"captured": datetime.now(UTC).isoformat(timespec="seconds"), "gpus": found, "why_none": why},
        indent=1))


PREPARE_LOCK = ".prepare.lock"


def _prepare_inputs(spec: Spec, out: Path, data_dir: Path, echo: Callable[[str], None]) -> None:
    """The workload's inputs exist and check out before any trial; datasets.json says which.

    Prepared by this runner alone, before any trial starts on any node, and under a lock in the
    shared cache: two runs (two jobs) sharing it prepare each input once; the second waits, then
    verifies what the first wrote."""
    with _prepare_lock(mnist.derived_root(data_dir), echo):
        used = registry.WORKLOADS[spec.workload].prepare(spec, data_dir, echo)
    if used:
        integrity.write_text_atomic(out / "datasets.json", json.dumps(used, indent=1))


@contextlib.contextmanager
def _prepare_lock(cache: Path, echo: Callable[[str], None]) -> Iterator[None]:
    try:
        cache.mkdir(parents=True, exist_ok=True)
        locks.check_flock(cache / PREPARE_LOCK)
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        yield  # a read-only cache: nothing can be prepared into it, only checked
        return
    with locks.waiting_lock(cache / PREPARE_LOCK, f"another run preparing inputs in {cache}",
                            PREPARE_WAIT_S, echo):
        yield


class Estimator:
    """A planned trial's seconds: from measured rates where there are some (those given, and the
    ones this run's own ok trials give, which win), else the guessed cost model."""

    def __init__(self, spec: Spec, out: Path, given: Mapping[str, calibrate.Rate]) -> None:
        self.spec, self.out, self.given = spec, out, dict(given)
        self.settings = {cid: settings for cid, _, settings in specmod.configs(spec)}
        self.rates = dict(given)

    def learn(self, records: list[dict[str, Any]]) -> None:
        mine = [(self.settings[r["config_id"]], r) for r in records if r.get("config_id") in self.settings]
        self.rates = {**self.given, **calibrate.fit(self.spec.workload, [(str(self.out), mine)])}

    def seconds(self, planned: PlannedTrial) -> float:
        return calibrate.estimate(self.spec.workload, planned.params, self.rates, planned.trace).seconds


def _run_pending(spec: Spec, out: Path, data_dir: Path, echo: Callable[[str], None],
                 nodes: Nodes | None = None, deadline_unix: float | None = None,
                 shard: specmod.Shard | None = None, estimator: Estimator | None = None,
                 lease_lost: Callable[[], str | None] = lambda: None) -> RunOutcome:
    trials_file = out / store.TRIALS_FILE
    records = store.read(trials_file)
    estimator = estimator or Estimator(spec, out, {})
    estimator.learn(records)
    done = store.finished(records)
    late = store.censored(records) - done
    planned = [p for p in specmod.plan(spec) if shard is None or shard.holds(p)]
    todo = [p for p in planned if p.key not in done and p.key not in late]
    estimates = [estimator.seconds(p) for p in todo]
    kept = sum(p.key in late for p in planned)
    censored = f", {kept} timed out (kept, censored: not run again)" if kept else ""
    part = f", part {shard.index}/{shard.count} of the plan" if shard else ""
    echo(f"{spec.name} ({spec.profile}{part}): {len(planned)} trials planned, "
         f"{sum(p.key in done for p in planned)} already ok{censored}, {len(todo)} to run, "
         f"estimated {format_duration(sum(estimates))}")
    machine = registry.this_machine(_check_devices(spec, todo))
    (out / LEFT_FILE).unlink(missing_ok=True)  # says what the last invocation left, if anything
    across = [p for p in todo if int(p.params["nnodes"]) > 1
              and not registry.WORKLOADS[spec.workload].unrunnable(p.params, p.trace, machine)]
    if nodes is not None and across:
        _preflight(spec, out, data_dir, nodes, across, echo)
    tally = Tally(len(todo), echo)
    started_at = clock()
    rounds = RoundKeeper(spec, trials_file, out / AUTO_FILE, echo)
    for index, planned_trial in enumerate(todo):
        if not rounds.wanted(planned_trial):
            continue
        reason = registry.WORKLOADS[spec.workload].unrunnable(planned_trial.params, planned_trial.trace,
                                                              machine)
        needed = time_needed(estimator.seconds(planned_trial), planned_trial, records)
        if not reason and deadline_unix is not None:
            if needed > deadline_unix - started_at:  # more than this whole job: never fits one
                reason = ("NeedsLongerJob", f"needs about {format_duration(needed)}; this run had "
                          f"{format_duration(deadline_unix - started_at)} before its deadline")
            elif clock() + needed > deadline_unix:  # the next job may have the time
                tally.leave(describe(planned_trial), needed)
                continue
        GATE.check()  # a stop that came while the last record was written
        if why := lease_lost():
            raise RunStopped(f"{why}; this run stops before its next trial, its {len(records)} "
                             "record(s) kept: two jobs must not write one run directory")
        record = skipped_record(spec, planned_trial, *reason) if reason else \
            _run_recorded(spec, planned_trial, out, data_dir, nodes, trials_file)
        append_record(trials_file, record)
        records.append(record)
        estimator.learn(records)  # the next estimates use what this trial measured
        GATE.check()  # a stop that came after the trial ended: its record is safe now
        tally.add(record, describe(planned_trial), index)
    if tally.left_for_later:
        _leave_for_later(out, tally.left_for_later, deadline_unix or 0.0, echo)
    else:  # a run that paused for the deadline has not ended: no final auto decision
        rounds.finish()
    return tally.outcome(spec.name, out, trials_file, len(planned) - len(todo))


LEFT_FILE = "left.json"
# the wall clock the deadline is read against (tests inject their own)
clock = time.time


def _leave_for_later(out: Path, left: list[tuple[str, float]], deadline_unix: float,
                     echo: Callable[[str], None]) -> None:
    """The trials not started because they would have outrun the deadline; left.json says so
    (a Slurm template requeues the job when this run wrote it)."""
    time_left = max(0.0, deadline_unix - clock())
    what, needed = left[0]
    echo(f"not started: {len(left)} trial(s) that would outrun the deadline ({format_duration(time_left)} "
         f"left; the first, {what}, needs about {format_duration(needed)}); left for the next run")
    integrity.write_text_atomic(out / LEFT_FILE, json.dumps(
        {"left": len(left), "trials": [{"trial": w, "needed_s": round(n, 1)} for w, n in left],
         "time_left_s": round(time_left, 1), "deadline_unix": deadline_unix}, indent=1))


def _run_recorded(spec: Spec, planned: PlannedTrial, out: Path, data_dir: Path, nodes: Nodes | None,
                  trials_file: Path) -> dict[str, Any]:
    """The trial's record; a stop mid-trial records the attempt in flight as interrupted."""
    try:
        return run_trial(spec, planned, out, data_dir, nodes)
    except Interrupted as stop:
        if stop.record:  # the attempt in flight: ended, and recorded as interrupted
            append_record(trials_file, stop.record)
        raise


# an interrupted attempt ran at least this long: its wall time is a lower bound, and one a
# little longer than it is what the next attempt needs at the least
INTERRUPTED_MARGIN = 1.1


def time_needed(estimate: float, planned: PlannedTrial, records: list[dict[str, Any]]) -> float:
    """How long a trial will take at least: the estimate, or longer when an earlier attempt of it
    ran longer (an interrupted one: a tenth more than it ran). A trial that outran a job's time
    limit would otherwise be started, and interrupted, in every requeued job."""
    earlier = [float(r.get("wall_s") or 0.0) *
               (INTERRUPTED_MARGIN if r.get("status") == "interrupted" else 1.0) for r in records
               if r.get("config_id") == planned.config_id and r.get("trial") == planned.trial
               and r.get("trace", "none") == planned.trace]
    return max([estimate, *earlier])


class Tally:
    """The run's counts and ETA line after each record; stops the run when trials in a row
    never started on any node (the launcher broke: each further trial would fail the same way)."""

    def __init__(self, todo: int, echo: Callable[[str], None]) -> None:
        self.todo, self.echo = todo, echo
        self.ok = self.failed = self.skipped = self.unstarted = 0
        self.broken_configs: set[str] = set()  # the configs of the streak's trials
        self.hung: list[int] = []  # the node each multi-node trial in a row hung on
        self.walls: list[float] = []
        self.left_for_later: list[tuple[str, float]] = []  # (trial, seconds needed)

    def leave(self, what: str, needed: float) -> None:
        self.left_for_later.append((what, needed))

    def add(self, record: dict[str, Any], what: str, index: int) -> None:
        status = record["status"]
        if status != "skipped":
            self.walls.append(record["wall_s"])
        self.ok += status == "ok"
        self.skipped += status == "skipped"
        self.failed += status not in ("ok", "skipped")
        remaining = self.todo - index - 1
        eta = sum(self.walls) / len(self.walls) * remaining if self.walls else 0.0
        self.echo(f"[{index + 1:>{len(str(self.todo))}}/{self.todo}] {what}: {status} in "
                  f"{record['wall_s']:.1f} s | ETA {format_duration(eta)}")
        self._count_broken(record)
        self._count_hung(record)

    def _count_hung(self, record: dict[str, Any]) -> None:
        """The same node hung (NodeHung) in MAX_HUNG multi-node trials in a row: each further
        trial would wait out its timeout on it. Single-node trials between them do not count."""
        if not record.get("nodes"):
            return
        error = record.get("error") or {}
        self.hung = [*self.hung, error.get("node")] if error.get("type") == "NodeHung" else []
        if len(self.hung) >= MAX_HUNG and len(set(self.hung[-MAX_HUNG:])) == 1:
            raise ClusterFailure(f"node {self.hung[-1]} hung in {MAX_HUNG} multi-node trials in a row "
                                 f"(the last: {error.get('message')}); the run stops, their records "
                                 "say so; take the node out of the job (drain it, or --exclude it) "
                                 "and run the same command to resume")

    def _count_broken(self, record: dict[str, Any]) -> None:
        """Multi-node steps where some node never started its part, or that failed within
        FAST_FAIL_S (a node's image that cannot import, a bind path gone): the launcher or a node
        is broken, and each further trial would fail the same way. Single-node trials between
        them neither count nor reset the count. Trials are interleaved across configs, so one
        config's trials meet in a row only where no other config's are left: those stop the run
        too (they would all fail alike), and the line says it may be that config's setting."""
        nodes = record.get("nodes")
        if not nodes:
            return
        never = any(not n.get("started", True) for n in nodes)
        fast = record["status"] == "failed" and record["wall_s"] < FAST_FAIL_S
        if not (never or fast):
            self.unstarted, self.broken_configs = 0, set()
            return
        self.unstarted += 1
        # a step no node started says nothing of its config's setting
        self.broken_configs.add(NOT_STARTED if never else str(record.get("config_id")))
        if self.unstarted >= MAX_UNSTARTED:
            error = record.get("error") or {}
            one = f", all of config {record.get('config_id')} (its setting may be the cause)" \
                if self.broken_configs == {str(record.get("config_id"))} else ""
            raise ClusterFailure(f"{self.unstarted} multi-node trials in a row where a node never "
                                 f"started its part or the step failed within {FAST_FAIL_S:.0f} s"
                                 f"{one} (the last: {error.get('message')}); the run stops, their "
                                 "records say so; fix the launcher, the node or the setting and "
                                 "run the same command to resume")

    def outcome(self, name: str, out: Path, trials_file: Path, already: int) -> RunOutcome:
        reasons = " (reasons in the records)" if self.skipped else ""
        left = f", {len(self.left_for_later)} left for the next run" if self.left_for_later else ""
        self.echo(f"{name}: {self.ok} ok, {self.failed} failed, {self.skipped} skipped{reasons}{left}; "
                  f"records in {trials_file}")
        return RunOutcome(out, self.ok + self.failed + self.skipped, self.ok, self.failed,
                          self.skipped, already, len(self.left_for_later))


def _preflight(spec: Spec, out: Path, data_dir: Path, nodes: Nodes, multi: list[PlannedTrial],
               echo: Callable[[str], None]) -> None:
    """One step over the nodes before the sweep (multicard.run.preflight), for the multi-node
    trials to run; ClusterFailure, naming the first problem, when a node cannot run them."""
    nnodes = max(int(p.params["nnodes"]) for p in multi)
    gpus = max((int(p.params["gpus"]) for p in multi if p.params["device"] == "cuda"), default=0)
    step_dir, attempt = _fresh_dir(out / preflight.DIR / "a")
    rdzv = launch.Rendezvous(nodes.rdzv_endpoint, cluster.rendezvous_id(out, spec.name, "preflight", attempt),
                             preflight.RDZV_TIMEOUT_S)
    seen = [str(p) for p in dict.fromkeys((data_dir, mnist.derived_root(data_dir), out.resolve()))]
    command = launch.torchrun_argv("multicard.run.preflight", ["--out", str(step_dir), "--device",
                                                           "cuda" if gpus else "cpu",
                                                           *(w for p in seen for w in ("--path", p))],
                                   nproc_per_node=max(1, gpus), nnodes=nnodes, rdzv=rdzv)
    argv = cluster.step_argv(nodes.launcher, nnodes, cluster.NodePart(step_dir, max(1, gpus), gpus, {}),
                             command, os.environ)
    integrity.write_text_atomic(step_dir / "launch.json", json.dumps({"argv": argv}, indent=1))
    echo(f"preflight: one step over {nnodes} nodes")
    t0, started_unix = time.monotonic(), time.time()
    returncode, timed_out, _, _ = _execute(argv, launch.trial_env(os.environ, max(1, gpus), None),
                                           step_dir, preflight.TIMEOUT_S, False, [], False)
    ended_unix = time.time()
    tails = {n: _tail(cluster.node_dir(step_dir, n) / "stderr.log") for n in range(nnodes)}
    found = preflight.problems(step_dir, nnodes, gpus, returncode, timed_out,
                               _tail(step_dir / "stderr.log"), tails,
                               cpus_per_node=cluster.job_cpus_per_node(os.environ)
                               if nodes.launcher.is_srun else None,
                               commit=environment.source_commit(),
                               step_unix=(started_unix, ended_unix))
    wall = time.monotonic() - t0
    integrity.write_text_atomic(out / preflight.SUMMARY, json.dumps(
        preflight.summary(step_dir, nnodes, found, wall), indent=1))
    if found:
        raise ClusterFailure(f"preflight: {found[0]} ({len(found)} problem(s) in "
                             f"{out / preflight.SUMMARY}); no trial was started")
    echo(f"preflight: {nnodes} nodes passed in {wall:.1f} s")


AUTO_FILE = "auto.json"


class RoundKeeper:
    """With `[trials].count = "auto"`: after the pilot rounds ask adaptive.decide how many
    rounds the claims' comparisons need (before each new round, so that a resume asks again),
    and skip the rounds after a stop. Every decision is written to auto.json (why the run
    stopped). Without auto every planned trial is wanted."""

    def __init__(self, spec: Spec, trials_file: Path, target: Path, echo: Callable[[str], None]) -> None:
        self.spec, self.trials_file, self.target, self.echo = spec, trials_file, target, echo
        self.round = -1
        self.stopped_at: int | None = None
        self.decision: adaptive.Decision | None = None
        self.aimed = adaptive.aims(spec, claims.load(claims.default_file())) if spec.auto else []

    def wanted(self, planned: PlannedTrial) -> bool:
        auto = self.spec.auto
        if auto is None or planned.trace != "none":
            return True
        if self.stopped_at is not None:
            return planned.trial < self.stopped_at
        if planned.trial > self.round:
            self.round = planned.trial
            done = self.round - specmod.first_timing(self.spec)  # timing rounds before this one
            # decide only at a round's start: a round begun before a resume is finished first
            if done >= auto.pilot_rounds and not self._begun(self.round) and self._decide(done).stop:
                self.stopped_at = self.round
                return False
        return True

    def _begun(self, trial: int) -> bool:
        return any(r.get("trial") == trial and r.get("trace", "none") == "none"
                   for r in store.read(self.trials_file))

    def _decide(self, rounds_done: int) -> adaptive.Decision:
        auto = self.spec.auto
        assert auto is not None
        records = store.read(self.trials_file)
        skipped = {r["config_id"] for r in records if r.get("status") == "skipped"}
        self.decision = adaptive.decide(self.spec, auto, records, rounds_done, skipped, self.aimed)
        integrity.write_text_atomic(self.target, json.dumps({
            "pilot_rounds": auto.pilot_rounds, "max_rounds": auto.max_rounds,
            "min_judged": auto.min_judged, "half_width": auto.half_width,
            "rounds": self.decision.rounds, "stopped": self.decision.stop,
            "reason": self.decision.reason, "judged_rounds_needed": self.decision.needed},
            indent=1))
        self.echo(f"auto: {'stop' if self.decision.stop else 'go on'}: {self.decision.reason}")
        return self.decision

    def finish(self) -> None:
        """After the last planned round: record why the run ended there."""
        if self.spec.auto is not None and self.stopped_at is None:
            self._decide(self.spec.auto.max_rounds - specmod.first_timing(self.spec))


def _check_devices(spec: Spec, todo: list[PlannedTrial]) -> list[devices.GpuIdentity]:
    """The GPUs a trial's CUDA will see; bad input when the plan needs CUDA and there is none."""
    if not any(p.params["device"] == "cuda" for p in todo):
        return []
    found = telemetry.visible_gpus()
    if not found:
        raise InputError(f"{spec.path}: device = 'cuda' but no GPU is visible here "
                         "(the smoke profile runs on CPU: --profile smoke)")
    return found


def skipped_record(spec: Spec, planned: PlannedTrial, kind: str, message: str) -> dict[str, Any]:
    """A trial that was not launched because this machine cannot run it."""
    return {
        "schema": store.SCHEMA, "experiment": spec.name, "config_id": planned.config_id,
        "config": planned.config, "trial": planned.trial, "attempt": None, "order": planned.order,
        "seed": int(planned.params["seed"]) + planned.trial, "profile": spec.profile,
        "status": "skipped", "started": utc_now(), "started_unix": round(time.time(), 3),
        "wall_s": 0.0, "metrics": {}, "error": {"type": kind, "message": message, "stderr_tail": ""},
        "artifacts": [], "returncode": None,
    }


def describe(planned: PlannedTrial) -> str:
    factors = " ".join(f"{k}={v}" for k, v in planned.config.items())
    traced = f" ({planned.trace} trace)" if planned.trace != "none" else ""
    return f"{factors} trial {planned.trial}{traced}"


def format_duration(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def _trial_dir(out: Path, planned: PlannedTrial) -> tuple[Path, int]:
    """raw/<config_id>-t<trial>[-<trace>]-a<attempt>: a new directory per attempt, never reused."""
    return _fresh_dir(out / "raw" / f"{trial_stem(planned)}-a")


def trial_settings(planned: PlannedTrial) -> dict[str, Any]:
    """The settings a trial runs with: its config's, seeded by its trial number (independent
    samples, reproducible)."""
    return {**planned.params, "seed": int(planned.params["seed"]) + planned.trial}


def trial_stem(planned: PlannedTrial) -> str:
    return f"{planned.config_id}-t{planned.trial}" + (f"-{planned.trace}" if planned.trace != "none" else "")


def _fresh_dir(prefix: Path) -> tuple[Path, int]:
    """PREFIX<N> for the first N that does not exist yet, made."""
    attempt = 0
    while (path := prefix.parent / f"{prefix.name}{attempt}").exists():
        attempt += 1
    path.mkdir(parents=True)
    return path, attempt


def trial_command(spec: Spec, planned: PlannedTrial, out: Path, data_dir: Path, trial_dir: Path,
                  attempt: int, settings: dict[str, Any], nodes: Nodes | None
                  ) -> tuple[list[str], dict[str, str]]:
    """The trial's argv and environment: torchrun on this node, or the launcher step that starts
    it on every node (each node's part makes its own environment from the pairs it is given)."""
    workload = registry.WORKLOADS[spec.workload]
    nnodes, gpus = int(settings["nnodes"]), int(settings["gpus"])
    wait_policy = launch.cpu_trial_env(str(settings["device"]), os.environ)
    if nnodes == 1:
        argv, extra_env = workload.command(settings, trial_dir, data_dir, registry.TrialLaunch(planned.trace))
        own = launch.own_gpus(str(settings["device"]), gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
        return argv, launch.trial_env({**os.environ, **wait_policy, **own, **extra_env}, gpus,
                                      launch.allocated_cpus())
    assert nodes is not None  # run() refuses nnodes > 1 without them
    trial_key = f"{planned.config_id}-t{planned.trial}-{planned.trace}"
    rdzv = launch.Rendezvous(nodes.rdzv_endpoint,
                             cluster.rendezvous_id(out, spec.name, trial_key, attempt))
    how = registry.TrialLaunch(planned.trace, rdzv)
    argv, extra_env = workload.command(settings, trial_dir, data_dir, how)
    # the ranks find prepared inputs (Scenario B trees) where this planner prepared them, not
    # where the image's own environment points
    cache = {"MULTICARD_CACHE_DIR": str(mnist.derived_root(data_dir))}
    part = cluster.NodePart(trial_dir, gpus, gpus if settings["device"] == "cuda" else 0,
                            {**wait_policy, **cache, **extra_env}, workload.page_cache(settings, data_dir),
                            nodes.stage_dir)
    return cluster.step_argv(nodes.launcher, nnodes, part, argv, os.environ), \
        launch.trial_env(os.environ, gpus, None)


def dry_run(spec: Spec, out: Path, data_dir: Path | None = None, nodes: Nodes | None = None,
            shard: specmod.Shard | None = None) -> list[tuple[str, list[list[str]]]]:
    """What `run` would start, trial by trial, starting nothing and writing nothing: each trial
    the run has still to do (by `out`'s records, where it has some) and its command lines (one
    node: torchrun; several: the launcher, each node's part and torchrun, cluster.step_parts)."""
    data_dir = (data_dir or mnist.default_root()).resolve()
    records = store.read(out / store.TRIALS_FILE) if (out / store.TRIALS_FILE).exists() else []
    skip = store.finished(records) | store.censored(records)
    shown = []
    for planned in (p for p in specmod.plan(spec) if p.key not in skip and (shard is None or shard.holds(p))):
        settings = trial_settings(planned)
        argv, _ = trial_command(spec, planned, out, data_dir, out / "raw" / f"{trial_stem(planned)}-a0", 0,
                                settings, nodes)
        parts = cluster.step_parts(argv) if int(settings["nnodes"]) > 1 else [argv]
        shown.append((describe(planned), parts))
    return shown


def run_trial(spec: Spec, planned: PlannedTrial, out: Path, data_dir: Path,
              nodes: Nodes | None = None) -> dict[str, Any]:
    """Launch one trial, wait for it (with the spec's timeout) and return its record."""
    trial_dir, attempt = _trial_dir(out, planned)
    settings = trial_settings(planned)
    workload = registry.WORKLOADS[spec.workload]
    argv, env = trial_command(spec, planned, out, data_dir, trial_dir, attempt, settings, nodes)
    changed = {k: v for k, v in env.items() if os.environ.get(k) != v}
    dropped = [k for k in os.environ if k not in env]
    cleared = launch.cleared_env(os.environ)  # TF32 overrides: their values, for the record
    integrity.write_text_atomic(trial_dir / "launch.json", json.dumps(
        {"argv": argv, "env_set": changed, "env_dropped": dropped, "cleared_env": cleared,
         "cwd": str(Path.cwd())}, indent=1))
    one_node = int(settings["nnodes"]) == 1
    if one_node and (cache := workload.page_cache(settings, data_dir)):  # across nodes, each
        page_cache.apply(*cache)  # node's part sets its own; outside the trial's clock
    started, started_unix = utc_now(), time.time()
    t0 = time.monotonic()
    # across nodes the ranks are no children of this process (slurmstepd starts them)
    trial_gpus = telemetry.visible_gpus()[:int(settings["gpus"])] \
        if settings["device"] == "cuda" and one_node else []
    try:
        returncode, timed_out, sampled, not_sampled = _execute(
            argv, env, trial_dir, spec.timeout_s, workload.sample_memory and one_node, trial_gpus, one_node)
        if workload.sample_memory and not one_node:
            not_sampled = dict.fromkeys(LaunchMeters.METRICS, "not sampled on a multi-node "
                                        "trial: its ranks are no children of the runner")
    except Interrupted as stop:
        stop.record = interrupted_record(spec, planned, attempt, settings, started, started_unix,
                                         time.monotonic() - t0, stop.signum, trial_dir, out)
        raise
    wall = time.monotonic() - t0
    with GATE.hold():  # the trial has ended: its record is made before any stop is served
        return _finished_record(spec, planned, out, trial_dir, attempt, settings, workload, started,
                                started_unix, wall, returncode, timed_out, sampled, not_sampled)


def _finished_record(spec: Spec, planned: PlannedTrial, out: Path, trial_dir: Path, attempt: int,
                     settings: dict[str, Any], workload: registry.Workload, started: str, started_unix: float,
                     wall: float, returncode: int | None, timed_out: bool,
                     sampled: dict[str, Any], not_sampled: dict[str, str]) -> dict[str, Any]:
    nnodes = int(settings["nnodes"])
    result = workload.result(trial_dir, settings)
    if nnodes > 1:
        reports = cluster.node_reports(trial_dir, nnodes)
        status, error = _classify_nodes(trial_dir, reports, returncode, timed_out, result, spec.timeout_s)
    else:
        reports = []
        status, error = classify(returncode, timed_out, _tail(trial_dir / "stderr.log"), result,
                                 spec.timeout_s, rank_failure(trial_dir))
    traces = collect_traces(trial_dir, out) if planned.trace != "none" else {}
    metrics = {**result["metrics"], **sampled} if result and status == "ok" else {}
    unmeasured = {**result.get("unmeasured", {}), **not_sampled} if result and status == "ok" else {}
    return {
        "schema": store.SCHEMA,
        "experiment": spec.name,
        "config_id": planned.config_id,
        "config": planned.config,
        "trial": planned.trial,
        "attempt": attempt,
        "order": planned.order,
        "seed": settings["seed"],
        "profile": spec.profile,
        "trace": planned.trace,
        "status": status,
        "started": started,
        "started_unix": round(started_unix, 3),
        "wall_s": round(wall, 3),
        "metrics": metrics,
        # metric -> why it is null (never 0 for "not measured")
        "unmeasured": unmeasured,
        # GPU-bound or host-bound, from the step probe (judge.operating_point); none for a failure
        "bound": operating_point.trial_bound(spec.workload, metrics, unmeasured) if metrics else None,
        "cleared_env": launch.cleared_env(os.environ),
        "trace_metrics": traces,
        # metric -> how it was read, where there is more than one way (energy: counter or power)
        "measured_how": result.get("measured_how", {}) if result and status == "ok" else {},
        # LLM trials on random weights: time and memory are valid, the loss means nothing
        **({"random_weights": True} if result and result.get("random_weights") else {}),
        "error": error,
        "artifacts": sorted(p.relative_to(out).as_posix() for p in trial_dir.rglob("*") if p.is_file()),
        "returncode": returncode,
        **({"nodes": [summarize_node(r, trial_dir) for r in reports]} if reports else {}),
    }


def summarize_node(report: dict[str, Any], trial_dir: Path) -> dict[str, Any]:
    """A node's part as the record keeps it (its full node.json stays in the trial directory),
    with the transports NCCL says it used there."""
    kept = {k: report[k] for k in ("node", "host", "started", "returncode", "wall_s", "ended_unix",
                                   "stop_signal", "stop_unix", "cpus_allowed", "page_cache") if k in report}
    where = cluster.node_dir(trial_dir, int(report["node"]))
    said = "".join(_tail(where / name, NCCL_LOG_CHARS) for name in ("stdout.log", "stderr.log"))
    nccl = cluster.nccl_transports(said)
    return kept | ({"nccl": nccl} if nccl else {})


NOT_STARTED = "NotStarted"


def _classify_nodes(trial_dir: Path, reports: list[dict[str, Any]], returncode: int | None,
                    timed_out: bool, result: dict[str, Any] | None, timeout_s: float
                    ) -> tuple[str, dict[str, Any] | None]:
    """(status, error) of a multi-node trial, classified from the node that ended it
    (cluster.blame): its ranks' own words, its stderr after the launcher's; the error names the
    node and the nodes it took down."""
    own = _tail(trial_dir / "stderr.log")
    tails = {int(r["node"]): _tail(cluster.node_dir(trial_dir, int(r["node"])) / "stderr.log")
             for r in reports}
    # past the timeout this planner ended the step (srun then kills every node's part at once):
    # no node caused it, unless one had stopped making progress (a hung node)
    found = _timed_out_blame(reports) if timed_out else cluster.blame(reports, tails, own, is_oom)
    quarter = STDERR_TAIL_CHARS // 4
    cause = tails.get(found.node if found.node is not None else 0, "")
    tail = own[-quarter:] + cause[-(STDERR_TAIL_CHARS - quarter):]
    said = cluster.blame_message(found, reports)
    named = rank_failure(trial_dir, node_ranks(reports, found.node)) if found.node is not None else None
    nothing_ran = found.how == "never started" and found.node is None
    if nothing_ran:
        named = {"type": NOT_STARTED, "message": f"no node started its part: the launcher exited "
                 f"with status {returncode}{preflight.last_line(own, ': ')}"}
    elif found.how in ("lost", "never started") and not named:
        named = {"type": "NodeLost", "message": said}
    status, error = classify(returncode, timed_out, tail, result, timeout_s, named)
    if nothing_ran:  # whatever the clock says, not a censored time: run again
        status, error = "failed", named
    if found.how == "oom" and status not in ("timeout", "oom"):  # the cause, whatever the ranks said
        status, error = "oom", {"type": "OutOfMemory", "message": said, "stderr_tail": tail}
    if found.how.startswith("hung") or (timed_out and found.node is not None):  # run again on resume
        status, error = "failed", {"type": "NodeHung", "message": said, "stderr_tail": tail}
    if error is not None and found.node is not None:
        if said not in error["message"]:
            error["message"] = f"{error['message']} ({said})"
        error |= {"node": found.node, "collateral": list(found.collateral)}
    return status, error


def _timed_out_blame(reports: list[dict[str, Any]]) -> cluster.Blame:
    """At a timeout: no node started at all (srun still creating the step: a trial not started,
    run again, never a censored time); a node whose part never started while another's did (it
    hung before it could start: a dead mount under the image), else one whose heartbeat fell
    behind; else none."""
    never = [int(r["node"]) for r in reports if not r.get("started", True)]
    if never and len(never) == len(reports):  # still creating the step (srun's --immediate)
        return cluster.Blame(None, "never started")
    how, hung = ("hung before start", never) if never else ("hung", cluster.hung_nodes(reports))
    if not hung:
        return cluster.Blame(None, "stopped")
    return cluster.Blame(hung[0], how, tuple(int(r["node"]) for r in reports if int(r["node"]) != hung[0]))


def is_oom(text: str) -> bool:
    return any(p in text for p in OOM_PATTERNS)


def node_ranks(reports: list[dict[str, Any]], node: int | None) -> range | None:
    """The global ranks of `node`'s part (static ranks: node R holds R*G .. R*G+G-1)."""
    if node is None:
        return None
    per_node = next((int(r["ranks_per_node"]) for r in reports if "ranks_per_node" in r), None)
    return range(node * per_node, (node + 1) * per_node) if per_node else None


# Where traces land in a trial directory: nsys's SQLite export per rank, multicard's own Kineto
# trace per rank, and torchtune's profiler output (profiling/iteration_<N>/<worker>.pt.trace.json.gz)
TRACE_PATTERNS = ("rank*.sqlite", "trace-rank*.json.gz", "*.pt.trace.json.gz", "*.pt.trace.json")


def trace_files(trial_dir: Path) -> list[Path]:
    """Every trace under the trial directory, at any depth, sorted."""
    return sorted({p for pattern in TRACE_PATTERNS for p in trial_dir.rglob(pattern) if p.is_file()})


def interrupted_record(spec: Spec, planned: PlannedTrial, attempt: int, settings: dict[str, Any],
                       started: str, started_unix: float, wall: float, signum: int,
                       trial_dir: Path, out: Path) -> dict[str, Any]:
    """An attempt ended because the runner was told to stop: neither ok nor failed; resumed."""
    name = signal.Signals(signum).name
    return {
        "schema": store.SCHEMA, "experiment": spec.name, "config_id": planned.config_id,
        "config": planned.config, "trial": planned.trial, "attempt": attempt,
        "order": planned.order, "seed": settings["seed"], "profile": spec.profile,
        "trace": planned.trace, "status": "interrupted", "started": started,
        "started_unix": round(started_unix, 3), "wall_s": round(wall, 3), "metrics": {},
        "unmeasured": {}, "trace_metrics": {},
        "error": {"type": "Interrupted", "message": f"{name} to the runner after {wall:.1f} s: "
                  "every process of the trial was ended; a resume runs it again",
                  "stderr_tail": _tail(trial_dir / "stderr.log")},
        "artifacts": sorted(p.relative_to(out).as_posix() for p in trial_dir.rglob("*") if p.is_file()),
        "returncode": None,
    }


def collect_traces(trial_dir: Path, out: Path) -> dict[str, dict[str, Any]]:
    """Summarise every rank's trace (keyed by its path in the run), then compress SQLite exports;
    nsys reports (.nsys-rep) are compressed already, Kineto traces are written gzipped."""
    summaries = {}
    for path in trace_files(trial_dir):
        try:
            summary = parse.summarize(path)
        except InputError as exc:  # a trace cut short by a failed trial: keep it, say why
            summary = {"error": str(exc)}
        if path.suffix == ".sqlite":
            packed = path.with_name(path.name + ".gz")
            with path.open("rb") as source, gzip.open(packed, "wb") as target:
                shutil.copyfileobj(source, target)
            path.unlink()
            path = packed
        summaries[path.relative_to(out).as_posix()] = summary
    return summaries


def _execute(argv: list[str], env: dict[str, str], trial_dir: Path, timeout_s: float,
             sample_memory: bool, gpus: list[devices.GpuIdentity], observe_here: bool = True
             ) -> tuple[int | None, bool, dict[str, Any], dict[str, str]]:
    """Run argv in its own session; on timeout or a stop request end every process of the trial.
    `observe_here`: answer the ranks' mid-epoch requests from this process (one node; on several
    each node's part does, multicard.run.node_step).

    Returns (exit status, timed out, memory metrics sampled from outside when asked, why any of
    them is null)."""
    runner_pid = os.getpid()
    # before the launch: the memory others hold on the trial's GPUs is read here
    meters = LaunchMeters(gpus, sample_memory)
    # the observer answers the ranks' mid-epoch requests from outside (multicard.measure.observe)
    with (trial_dir / "stdout.log").open("wb") as stdout, (trial_dir / "stderr.log").open("wb") as stderr, \
            observe.Observer(trial_dir) if observe_here else contextlib.nullcontext():
        proc = subprocess.Popen(
            argv, stdout=stdout, stderr=stderr, env=env, start_new_session=True,
            preexec_fn=lambda: launch.set_parent_death_signal(runner_pid),
        )
        try:
            with meters:
                meters.start(proc.pid)
                returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with GATE.hold():
                end_trial(proc)
            return proc.returncode, True, {}, {}
        except BaseException:  # a stop request or an error here: leave no process behind
            with GATE.hold():
                end_trial(proc)
            raise
    return returncode, False, *meters.record(trial_dir)


def end_trial(proc: subprocess.Popen[bytes], grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM every process of the trial, SIGKILL whatever is left after `grace_s`.

    The trial is the launcher's whole process tree, not its process group: torchrun starts each
    rank in a session of its own. The tree is read before any signal, because a process whose
    parent dies leaves it (re-parented to init), and read again from every member still alive
    (a process started meanwhile); the launcher's own pid only while it is unreaped, as a reaped
    pid may already belong to someone else."""
    members = set(processes.process_tree(proc.pid)) | {proc.pid}
    _signal_all(members, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while True:
        members = {pid for pid in _grown(members, proc) if _alive(pid)}
        if not members or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    _signal_all(members, signal.SIGKILL)
    proc.wait()


def _grown(members: set[int], proc: subprocess.Popen[bytes]) -> set[int]:
    alive_launcher = proc.poll() is None  # poll reaps it once it has exited
    found = set(members) - ({proc.pid} if not alive_launcher else set())
    for pid in list(found):
        found |= set(processes.process_tree(pid))
    return found


def _signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _alive(pid: int) -> bool:
    """Running or sleeping; a zombie (dead, not yet reaped) does not count."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


# how much of a node's log (its end) is searched for NCCL's start-up lines: a node's log is
# short, its ranks' own lines and NCCL's INIT,NET ones
NCCL_LOG_CHARS = 1 << 20


def _tail(path: Path, chars: int = STDERR_TAIL_CHARS) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - chars))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def rank_failure(trial_dir: Path, ranks: range | None = None) -> dict[str, Any] | None:
    """The cause a rank named itself (failure-rank<R>.json), the lowest rank's first (among
    `ranks` where given: one node's)."""
    for path in sorted(trial_dir.glob("failure-rank*.json")):
        number = path.stem.removeprefix("failure-rank")
        if ranks is not None and not (number.isdigit() and int(number) in ranks):
            continue
        try:
            found = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(found, dict) and {"type", "message"} <= set(found):
            return found
    return None


def classify(returncode: int | None, timed_out: bool, stderr_tail: str,
             result: dict[str, Any] | None, timeout_s: float,
             named: dict[str, Any] | None = None) -> tuple[str, dict[str, Any] | None]:
    """(status, error) of a finished trial; error is None exactly when status is ok. A cause the
    rank named itself (`named`) wins over what the stderr tail suggests."""
    tail = stderr_tail[-STDERR_TAIL_CHARS:]
    if timed_out:
        return "timeout", {"type": "Timeout", "message": f"killed after {timeout_s:g} s",
                           "stderr_tail": tail}
    if returncode == 0 and result is not None:
        return "ok", None
    if named:
        return "failed", {"type": str(named["type"]), "message": str(named["message"]),
                          "stderr_tail": tail}
    kind, message = root_exception(tail)
    if is_oom(tail):
        return "oom", {"type": kind or "OutOfMemory", "message": message or "out of memory",
                       "stderr_tail": tail}
    for pattern, name in CAUSES:
        if match := pattern.search(tail):
            kind, message = name, cause_message(tail, match, message)
            break
    if kind is None and returncode == -signal.SIGKILL:
        # the launcher itself got SIGKILL from outside: the OOM killer, or a scheduler's limit
        return "failed", {"type": "RankKilled", "message": "killed by signal 9 (SIGKILL: the "
                          "kernel's OOM killer or a scheduler)", "stderr_tail": tail}
    if kind is None:
        kind = "ExitCode"
        message = (f"exit status {returncode}" if returncode == 0 or returncode is None
                   or returncode > 0 else f"killed by signal {-returncode}")
        if returncode == 0:
            message += " but no result.json was written"
    return "failed", {"type": kind, "message": message, "stderr_tail": tail}


def cause_message(tail: str, match: re.Match[str], root_message: str | None) -> str:
    """The words that name a cause. A rank's first exception may be a side effect that raced
    ahead of it (a killed worker's socket resets before the DataLoader reports the death), so
    it is kept only when it states the cause itself."""
    line_end = tail.find("\n", match.end())
    cause = tail[match.start(): None if line_end < 0 else line_end].strip()
    return root_message if root_message and match.group(0) in root_message else cause


def root_exception(text: str) -> tuple[str | None, str | None]:
    """The first exception line of a rank (torchrun's own ChildFailedError summary is skipped)."""
    for line in text.splitlines():
        match = _EXCEPTION_LINE.match(line)
        if match and not match.group(1).endswith("ChildFailedError"):
            return match.group(1).rsplit(".", 1)[-1], match.group(2).strip()
    return None, None
