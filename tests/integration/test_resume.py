"""Kill the runner with SIGKILL mid-run, start it again: every planned trial ends ok exactly once."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from multicard.plan import spec
from multicard.run import store
from tests.helpers import ROOT, write_spec

pytestmark = pytest.mark.slow


def trial_processes(marker: str) -> list[int]:
    """PIDs whose command line mentions `marker` (the run directory)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.mark.e2e  # the fast tier's kill-and-resume
def test_sigkill_then_resume_runs_each_trial_once(tmp_path: Path) -> None:
    path = write_spec(tmp_path, fixed={"device": "cpu", "image_size": 32, "epochs": 1,
                                       "max_steps": 2, "batch_size": 8, "num_workers": 0,
                                       "warmup_steps": 0, "train_subset": 128, "test_subset": 32},
                      grid={"precision": ["fp32", "bf16"]}, trials={"count": 1, "timeout_s": 300})
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "multicard", "run", str(path), "--out", str(out)]
    first = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if len(store.read(out / "trials.jsonl")) >= 1 and len(list((out / "raw").iterdir())) >= 2:
            break
        time.sleep(0.2)
    else:
        first.kill()
        pytest.fail("the first run never got past its first trial")
    first.send_signal(signal.SIGKILL)
    first.wait()
    # the trial in flight dies with its runner (PR_SET_PDEATHSIG), it is not left training
    deadline = time.monotonic() + 30
    while trial_processes(str(out)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert trial_processes(str(out)) == []
    done_before = len(store.read(out / "trials.jsonl"))
    assert done_before < 2

    subprocess.run(argv, cwd=ROOT, check=True, capture_output=True)
    records = store.read(out / "trials.jsonl")
    ok = Counter((r["config_id"], r["trial"]) for r in records if r["status"] == "ok")
    planned = {(p.config_id, p.trial) for p in spec.plan(spec.load(path))}
    assert set(ok) == planned and set(ok.values()) == {1}
    assert len(records) == 2  # nothing ran twice
    # a killed attempt's directory is kept (no data lost) beside its retry's
    recorded = {a.split("/")[1] for r in records for a in r["artifacts"]}
    on_disk = {p.name for p in (out / "raw").iterdir()}
    assert recorded <= on_disk and len(on_disk - recorded) <= 1


def test_a_second_runner_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    from filelock import FileLock

    path = write_spec(tmp_path)
    out = tmp_path / "run"
    out.mkdir()
    with FileLock(str(out / ".run.lock")):
        result = subprocess.run([sys.executable, "-m", "multicard", "run", str(path), "--out", str(out)],
                                cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"multicard: error: {out}: another multicard run is using this directory"]


def test_resuming_with_another_spec_is_refused(tmp_path: Path) -> None:
    from multicard.errors import InputError
    from multicard.run import runner

    out = tmp_path / "run"
    out.mkdir()
    (out / "spec.toml").write_text(spec.to_toml(spec.load(write_spec(tmp_path))))
    other = write_spec(tmp_path, name="other", grid={"precision": ["fp64"]})
    with pytest.raises(InputError, match="holds a run of a different spec"):
        runner.run(spec.load(other), out, echo=lambda _: None)
    assert {p.name for p in out.iterdir()} == {"spec.toml", ".run.lock"}  # nothing written or lost
