"""benchmarks/device_check.py end to end on CPU: a first call that the budget cuts short, a second
that finishes it, the checks, a verifiable run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multicard import integrity
from multicard.run import store
from tests.helpers import ROOT, load_script

pytestmark = pytest.mark.slow
SCRIPT = ROOT / "benchmarks" / "device_check.py"


def test_a_check_the_budget_cuts_short_is_continued_by_a_second_call(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cpu-device-check"
    device_check = load_script(SCRIPT, "device_check")
    harness = out / "harness" / store.TRIALS_FILE

    # time as the check sees it: none passes until the comparison has run, then the budget is
    # all spent but one second, however fast or slow this machine ran it
    def clock() -> float:
        return 999.0 if harness.exists() and len(store.read(harness)) == 3 else 0.0

    first = device_check.main(["--device", "cpu", "--budget-s", "1000", "--out", str(out)], clock=clock)
    said = capsys.readouterr().out
    assert first == 3, said[-3000:]  # nothing failed: parts were left, which is not a failure
    assert "precision: left for the next call (needs about" in said
    assert "run it again with --out" in said
    summary = json.loads((out / "device_check.json").read_text())["summary"]
    assert summary["parts_run"] == ["harness"] and set(summary["parts_left"]) == {"precision", "pin_memory"}
    assert integrity.verify(out).ok and not (out / "REPORT.md").exists()  # figures once, at the end
    loops = sorted((out / "plain_loop").glob("round-*.json"))
    pids = [json.loads(p.read_text())["pid"] for p in loops]

    # the second call: what is left, learned from what ran (a budget any machine meets)
    second = device_check.main(["--device", "cpu", "--budget-s", "3000", "--out", str(out)])
    said = capsys.readouterr().out
    assert second == 0, said[-3000:]
    assert "learned from 3 trial(s) run" in said and "harness: 0 of 3 trials left + 0 plain-loop" in said
    assert [json.loads(p.read_text())["pid"] for p in loops] == pids  # not run again
    assert len(store.read(harness)) == 3
    summary = json.loads((out / "device_check.json").read_text())["summary"]
    assert summary["parts_run"] == ["harness", "precision", "pin_memory"] and summary["parts_left"] == {}
    assert summary["trials"] == summary["ok"] == 10
    assert summary["tf32_flags_as_set"] is True and summary["step_clock_within_tolerance"] is True
    # like for like: 3 harness trials against 3 plain loops in a one-rank DDP, and DDP's own cost
    compared = summary["multicard / plain loop"]
    assert compared["n"] == [3, 3] and compared["ci_lo"] < compared["ratio"] < compared["ci_hi"]
    assert summary["plain loop / bare loop"]["n"] == [3, 3]
    # reported, not judged on CPU (the cores' other load moves the loops' speed)
    assert summary["windows_long_enough"] is None and summary["shortest_window_s"] > 0
    steps = json.loads(loops[0].read_text())["steps"]
    assert all(json.loads(p.read_text())["steps"] == steps for p in loops)
    assert {r["config"]["precision"] for r in store.read(harness)} == {"bf16"}
    # on CPU there is no GPU energy: every precision says so, none is 0
    assert summary["energy_per_sample_j"] == dict.fromkeys(
        ("fp64", "fp32", "tf32", "fp16", "bf16"), "not measured: rank 0: CPU run: no GPU")
    assert "## Device check" in (out / "REPORT.md").read_text()
    assert (out / "env.json").is_file()
    assert len(list(out.glob("env-resume-*.json"))) == 1  # the second call's, beside the first
    assert integrity.verify(out).ok
