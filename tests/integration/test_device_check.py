"""benchmarks/device_check.py end to end on CPU: a first call that the budget cuts short after the
comparison (benchmarks/harness_ab.py), a second that finishes it, the checks, a verifiable run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multicard import integrity
from tests.helpers import ROOT, load_script

pytestmark = pytest.mark.slow
SCRIPT = ROOT / "benchmarks" / "device_check.py"


@pytest.mark.long
def test_a_check_the_budget_cuts_short_is_continued_by_a_second_call(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cpu-device-check"
    device_check = load_script(SCRIPT, "device_check")
    compared = out / "harness" / device_check.HARNESS_FILE

    # time as the check sees it: none passes until the comparison has run, then the budget is
    # all spent but one second, however fast or slow this machine ran it
    def clock() -> float:
        return 999.0 if compared.exists() else 0.0

    first = device_check.main(["--device", "cpu", "--budget-s", "1000", "--out", str(out)], clock=clock)
    said = capsys.readouterr().out
    assert first == 3, said[-3000:]  # nothing failed: parts were left, which is not a failure
    assert "precision: left for the next call (needs about" in said
    assert "run it again with --out" in said
    summary = json.loads((out / "device_check.json").read_text())["summary"]
    assert summary["parts_run"] == ["harness"] and set(summary["parts_left"]) == {"precision", "pin_memory"}
    assert integrity.verify(out).ok and not (out / "REPORT.md").exists()  # figures once, at the end
    written = json.loads(compared.read_text())
    assert [p["name"] for p in written["points"]] == ["host-bound", "judged"]
    assert (written["pairs"], written["control_pairs"], written["bare_pairs"]) == (4, 2, 2)
    assert (out / "harness" / "harness_ab.log").is_file()

    # the second call: what is left (a budget any machine meets); the comparison is not run again
    second = device_check.main(["--device", "cpu", "--budget-s", "3000", "--out", str(out)])
    said = capsys.readouterr().out
    assert second == 0, said[-3000:]
    assert "harness: done (harness/harness_ab.json), estimated 0s" in said
    assert json.loads(compared.read_text())["pid"] == written["pid"]
    summary = json.loads((out / "device_check.json").read_text())["summary"]
    assert summary["parts_run"] == ["harness", "precision", "pin_memory"] and summary["parts_left"] == {}
    assert summary["trials"] == summary["ok"] == 7
    assert summary["tf32_flags_as_set"] is True and summary["step_clock_within_tolerance"] is True
    # like for like, paired: the host-bound point's ratio with its interval, DDP's bookkeeping
    ratio = summary["harness / plain loop"]
    assert ratio["pairs"] == 4 and ratio["ci_lo"] <= ratio["ratio"] <= ratio["ci_hi"]
    assert summary["plain loop / bare loop"]["pairs"] == 2
    assert summary["harness_costs_too_much"] is None  # reported, not judged on CPU
    assert summary["harness_failed"] is None and summary["shortest_block_s"] > 0
    assert summary["harness_lines"] == written["lines"] and len(written["lines"]) == 3
    # on CPU there is no GPU energy: every precision says so, none is 0
    assert summary["energy_per_sample_j"] == dict.fromkeys(
        ("fp64", "fp32", "tf32", "fp16", "bf16"), "not measured: rank 0: CPU run: no GPU")
    report = (out / "REPORT.md").read_text()
    assert "## Device check" in report and written["lines"][0] in report
    assert (out / "env.json").is_file()
    assert len(list(out.glob("env-resume-*.json"))) == 1  # the second call's, beside the first
    assert integrity.verify(out).ok
