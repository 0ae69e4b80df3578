"""Stop requests as a cluster sends them: SIGTERM or SIGHUP to the runner, to every process of the
job (what Slurm's slurmstepd does), or to nox. No process of the trial may survive 10 s, the
attempt is recorded as interrupted, and running the same command again resumes it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multicard.measure import processes
from multicard.run import store
from tests.helpers import ROOT, TINY_FIXED, write_spec

pytestmark = pytest.mark.slow
# 2 gloo ranks with a DataLoader worker each: runner -> torchrun -> ranks -> workers
LONG = {**TINY_FIXED, "epochs": 3, "max_steps": 40, "num_workers": 1}


def wait_for_workers(root: int, deadline_s: float = 120) -> set[int]:
    """The trial's processes once both ranks have a DataLoader worker (a worker is forked from
    its rank: four processes of the vision workload). Counting the whole tree would not do: the
    runner's own helpers (the environment it records) could make up the number before a trial."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        tree = set(processes.process_tree(root))
        if sum(b"multicard.workloads.vision" in _cmdline(pid) for pid in tree) >= 4:
            return tree - {root}
        time.sleep(0.2)
    pytest.fail("the trial's ranks and workers never appeared")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def alive(pids: set[int]) -> set[int]:
    found = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            found.add(pid)
    return found


def start(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)


@pytest.mark.parametrize(("sig", "to_everyone"), [(signal.SIGTERM, False), (signal.SIGHUP, False),
                                                  (signal.SIGTERM, True)],
                         ids=["SIGTERM to the runner", "SIGHUP to the runner",
                              "SIGTERM to every process, as srun and scancel send it"])
def test_a_stop_signal_ends_the_trial_records_it_and_a_resume_runs_it(
        tmp_path: Path, sig: signal.Signals, to_everyone: bool) -> None:
    path = write_spec(tmp_path, fixed=LONG, grid={"gpus": [2]}, trials={"count": 1, "timeout_s": 300})
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "multicard", "run", str(path), "--out", str(out)]
    proc = start(argv)
    trial = wait_for_workers(proc.pid)
    sent = time.monotonic()
    for pid in [proc.pid, *trial] if to_everyone else [proc.pid]:
        os.kill(pid, sig)
    _, stderr = proc.communicate(timeout=30)
    while alive(trial) and time.monotonic() - sent < 10:
        time.sleep(0.2)
    assert alive(trial) == set(), "processes of the trial outlived the signal by 10 s"
    assert proc.returncode == 128 + sig
    lines = stderr.strip().splitlines()
    assert lines[-1] == (f"multicard: stopped by {sig.name}, the trial in flight ended and recorded "
                         f"as interrupted; run the same command to resume {out}"), stderr[-2000:]
    [record] = store.read(out / "trials.jsonl")
    assert record["status"] == "interrupted" and record["error"]["type"] == "Interrupted"
    assert record["error"]["message"].startswith(f"{sig.name} to the runner after ")
    if sig == signal.SIGTERM and not to_everyone:
        resumed = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert [r["status"] for r in store.read(out / "trials.jsonl")] == ["interrupted", "ok"]


@pytest.mark.long
def test_sigterm_to_nox_reaches_the_run_and_its_trial(tmp_path: Path) -> None:
    path = write_spec(tmp_path, fixed=LONG, grid={"gpus": [2]}, trials={"count": 1, "timeout_s": 300})
    out = tmp_path / "run"
    env = {**os.environ, "MULTICARD_IN_CONTAINER": "1"}  # nox uses this Python: no venv to build
    noxfile = tmp_path / "noxfile.py"
    noxfile.write_text((ROOT / "noxfile.py").read_text().replace(
        "ROOT = Path(__file__).resolve().parent", f"ROOT = Path({str(ROOT)!r})") + f'''

@nox.session(python=False, name="one-run")
def one_run(session: nox.Session) -> None:
    multicard(session, sys.executable, "run", {str(path)!r}, "--out", {str(out)!r})
''')
    proc = start([sys.executable, "-m", "nox", "-f", str(noxfile), "-s", "one-run"], env)
    trial = wait_for_workers(proc.pid)
    sent = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)  # nox alone, as `kill <pid>` or a scheduler would
    proc.communicate(timeout=60)
    while alive(trial) and time.monotonic() - sent < 10:
        time.sleep(0.2)
    assert alive(trial) == set()
    assert proc.returncode != 0
    assert [r["status"] for r in store.read(out / "trials.jsonl")] == ["interrupted"]


def test_a_stop_after_a_trial_ended_waits_until_its_record_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from multicard.plan import spec
    from multicard.run import runner
    from multicard.run.stopping import Interrupted

    real = runner.classify

    def classify_then_stop(*args: object, **kwargs: object) -> object:
        os.kill(os.getpid(), signal.SIGTERM)  # between the trial's end and its record
        time.sleep(0.05)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "classify", classify_then_stop)
    path = write_spec(tmp_path, grid={"precision": ["fp32", "bf16"]}, trials={"count": 1})
    with pytest.raises(Interrupted):
        runner.run(spec.load(path), tmp_path / "run", echo=lambda _: None)
    [record] = store.read(tmp_path / "run" / "trials.jsonl")
    assert record["status"] == "ok"  # the finished trial's record was kept; the next never started


def test_sigterm_to_data_prepare_ends_its_workers_at_once(tmp_path: Path) -> None:
    proc = start([sys.executable, "-m", "multicard", "data", "prepare", "--size", "256",
                  "--out", str(tmp_path / "tree"), "--workers", "2"])
    deadline = time.monotonic() + 60
    while len(processes.process_tree(proc.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)  # the runner and its two spawned workers
    time.sleep(2.0)  # chunks are being written
    workers = set(processes.process_tree(proc.pid)) - {proc.pid}
    assert workers
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 10, "prepare waited for the queued chunks"
    assert proc.returncode == 143, stderr[-2000:]
    assert stderr.strip().splitlines()[-1] == "multicard: stopped by SIGTERM; run the same command to resume"
    while alive(workers) and time.monotonic() - sent < 10:
        time.sleep(0.2)
    assert alive(workers) == set(), "workers outlived the signal by 10 s"
