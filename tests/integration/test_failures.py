"""Failures are records, never a crash of the sweep."""

from __future__ import annotations

from pathlib import Path

import pytest

from multicard.plan import spec
from multicard.run import runner, store
from tests.helpers import write_spec

pytestmark = pytest.mark.slow


def test_a_failing_trial_is_recorded_with_its_cause_and_the_sweep_goes_on(tmp_path: Path) -> None:
    empty_data = tmp_path / "no-data"
    (empty_data / "mnist").mkdir(parents=True)
    path = write_spec(tmp_path, grid={"precision": ["fp32", "bf16"]})
    outcome = runner.run(spec.load(path), tmp_path / "run", data_dir=empty_data, echo=lambda _: None)
    assert (outcome.ran, outcome.ok, outcome.failed) == (2, 0, 2)
    records = store.read(tmp_path / "run" / "trials.jsonl")
    assert [r["status"] for r in records] == ["failed", "failed"]
    error = records[0]["error"]
    assert error["type"] == "InputError"
    assert "missing MNIST file" in error["message"] and str(empty_data) in error["message"]
    assert "Traceback" in error["stderr_tail"]
    assert records[0]["metrics"] == {}


def test_a_trial_past_its_timeout_is_killed_with_its_whole_group(tmp_path: Path) -> None:
    from tests.integration.test_resume import trial_processes

    path = write_spec(tmp_path, grid={"gpus": [2]}, trials={"count": 1, "timeout_s": 3})
    outcome = runner.run(spec.load(path), tmp_path / "run", echo=lambda _: None)
    assert (outcome.ok, outcome.failed) == (0, 1)
    [record] = store.read(tmp_path / "run" / "trials.jsonl")
    assert record["status"] == "timeout"
    assert record["error"]["message"] == "killed after 3 s"
    assert record["wall_s"] < 3 + runner.KILL_GRACE_S + 5
    assert trial_processes(str(tmp_path / "run")) == []
    # a resume keeps the timed-out attempt (a censored time) instead of running it until it is fast
    said: list[str] = []
    again = runner.run(spec.load(path), tmp_path / "run", echo=said.append)
    assert (again.ok, again.failed) == (0, 0)
    assert "0 already ok, 1 timed out (kept, censored: not run again), 0 to run" in said[0]
    assert len(store.read(tmp_path / "run" / "trials.jsonl")) == 1
