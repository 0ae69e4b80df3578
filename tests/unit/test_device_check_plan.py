"""benchmarks/device_check.py's plan and its pure parts: the estimate against its 8 minutes,
what a resume still runs, what the trials run teach the estimate, the comparison's verdict."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from multicard import calibrate, cost
from multicard import spec as specmod
from tests.helpers import ROOT, load_script

device_check = load_script(ROOT / "benchmarks" / "device_check.py", "device_check")


def test_the_dry_run_fits_8_minutes_on_one_gpu_with_every_optional_part(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert device_check.main(["--dry-run", "--out", str(tmp_path / "new")]) == 0
    lines = capsys.readouterr().out.splitlines()
    parts = [line.split(":")[0] for line in lines[:5]]
    assert parts == ["harness", "precision", "pin_memory", "nsys", "nccl"]
    assert lines[0].startswith("harness: 3 of 3 trials left + 3 plain-loop process(es), estimated ")
    total = next(line for line in lines if line.startswith("total: estimated "))
    assert "(within the 8m 00s target; the cost model's guesses" in total
    assert not (tmp_path / "new").exists()


def test_the_comparisons_windows_are_planned_at_10_s_on_a_gpu_by_the_cost_model() -> None:
    plan = device_check.specs(device_check.parts("cuda", 1, False), Path("x"))
    settings = specmod.plan(plan["harness"])[0].params
    window = int(settings["epochs"]) * int(settings["max_steps"]) * cost.vision_step_seconds(settings)
    assert 10.0 <= window < 10.1
    assert settings["precision"] == "fp16" and settings["layout"] == "nhwc"
    assert settings["loader"] == "synthetic" and plan["harness"].trials == 3


def test_a_resume_runs_only_what_has_no_final_record() -> None:
    plan = device_check.specs(device_check.parts("cpu", 0, False), Path("x"))
    s = plan["precision"]
    planned = specmod.plan(s)
    records = [{"config_id": p.config_id, "trial": p.trial, "status": status}
               for p, status in zip(planned, ["ok", "timeout", "failed", "interrupted"], strict=False)]
    left = device_check.pending(s, records)
    assert [p.key for p in left] == [p.key for p in planned[2:]]  # failed and interrupted run again


def test_the_estimate_learns_measured_rates_and_scales_the_guesses() -> None:
    plan = device_check.specs(device_check.parts("cpu", 0, False), Path("x"))
    [fp64, *others] = specmod.plan(plan["precision"])
    guess = cost.trial_seconds("vision", fp64.params)
    record = {"status": "ok", "wall_s": 3 * guess, "metrics": {"train_time_s": guess / 2}}
    learned = device_check.Learned(calibrate.fit("vision", [("run", [(fp64.params, record)])]), scale=3.0)
    assert learned.trial_s(fp64) == pytest.approx(3 * guess)  # its own rate, measured
    other = others[0]
    assert learned.trial_s(other) == pytest.approx(3 * cost.trial_seconds("vision", other.params))


@pytest.mark.parametrize(("ratio", "lo", "hi", "verdict"), [
    (0.95, 0.90, 1.01, False),         # within 10 %
    (0.80, 0.70, 0.93, False),         # slower, but the interval reaches into the 10 %: no evidence
    (0.80, 0.75, 0.86, True),          # wholly below 0.9: the harness costs too much
    (0.85, math.nan, math.nan, True),  # one round: the point alone
])
def test_the_harness_fails_only_where_its_cost_is_shown_beyond_the_tolerance(
        ratio: float, lo: float, hi: float, verdict: bool) -> None:
    found = {"ratio": ratio, "ci_lo": lo, "ci_hi": hi, "n": [3, 3]}
    assert device_check.harness_costs_too_much(found) is verdict
    assert device_check.harness_costs_too_much(None) is None


def test_an_incomplete_check_exits_3_and_a_failed_one_1(capsys: pytest.CaptureFixture[str]) -> None:
    passed = {"not_ok": [], "step_clock_within_tolerance": True, "tf32_flags_as_set": True,
              "harness_costs_too_much": False, "windows_long_enough": True, "ok": 5, "trials": 5}
    assert device_check.finish_status(passed, {}, Path("o"), 1.0) == 0
    assert device_check.finish_status(passed, {"pin_memory": "needs about 1m"}, Path("o"), 1.0) == 3
    assert device_check.finish_status({**passed, "windows_long_enough": False}, {}, Path("o"), 1.0) == 1
    assert device_check.finish_status({**passed, "not_ok": [{}]}, {"x": "y"}, Path("o"), 1.0) == 1
    assert "run it again with --out o" in capsys.readouterr().out
