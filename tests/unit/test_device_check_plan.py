"""benchmarks/device_check.py's plan and its pure parts: the estimate against its 8 minutes,
what a resume still runs, what the trials run teach the estimate, the comparison's verdict."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from multicard.plan import calibrate, cost
from multicard.plan import spec as specmod
from multicard.run import store
from tests.helpers import ROOT, load_script

device_check = load_script(ROOT / "benchmarks" / "device_check.py", "device_check")


def test_the_dry_run_fits_8_minutes_on_one_gpu_with_nsys(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert device_check.main(["--dry-run", "--out", str(tmp_path / "new")]) == 0
    lines = capsys.readouterr().out.splitlines()
    parts = [line.split(":")[0] for line in lines[:4]]
    assert parts == ["harness", "precision", "pin_memory", "nsys"]  # no nccl: one GPU
    assert lines[0].startswith("harness: 3 of 3 trials left + 3 plain-loop process(es), estimated ")
    total = next(line for line in lines if line.startswith("total: estimated "))
    assert "(within the 8m 00s target; the cost model's guesses" in total
    assert not (tmp_path / "new").exists()


def test_the_comparisons_windows_are_planned_at_10_s_and_a_margin_on_a_gpu_by_the_cost_model() -> None:
    plan = device_check.specs(device_check.parts("cuda", 1, False), Path("x"))
    settings = specmod.plan(plan["harness"])[0].params
    window = int(settings["epochs"]) * int(settings["max_steps"]) * cost.vision_step_seconds(settings)
    assert 11.5 <= window < 11.6  # 10 s, 15 % to spare
    assert int(settings["max_steps"]) <= 60_000 // 64  # within an epoch's full batches
    assert settings["precision"] == "fp16" and settings["layout"] == "nhwc"
    assert settings["loader"] == "synthetic" and plan["harness"].trials == 3


@pytest.mark.parametrize(("total", "epochs", "per_epoch", "expected"), [
    (50, 2, 937, (2, 25)),
    (2500, 2, 937, (3, 834)),  # one epoch of MNIST cannot hold half: more epochs, not more steps
    (1875, 2, 937, (3, 625)),
    (7, 2, 4, (2, 4)),
])
def test_steps_spread_over_more_epochs_where_one_cannot_hold_them(
        total: int, epochs: int, per_epoch: int, expected: tuple[int, int]) -> None:
    found = cost.steps_over_epochs(total, epochs, per_epoch)
    assert found == expected and found[0] * found[1] >= total and found[1] <= per_epoch
    assert cost.full_batches(0, 64, 1) == 937 and cost.full_batches(1024, 16, 2) == 32


def test_a_rerun_trial_stands_for_what_it_finally_did_and_its_attempts_stay_counted() -> None:
    records = [{"config_id": "a", "trial": 0, "status": "failed"},
               {"config_id": "a", "trial": 0, "status": "ok"},
               {"config_id": "b", "trial": 0, "status": "ok"},
               {"config_id": "b", "trial": 0, "status": "interrupted"},  # after its ok: not final
               {"config_id": "c", "trial": 0, "status": "timeout"},
               {"config_id": "c", "trial": 0, "trace": "nsys", "status": "failed"}]
    found = [(r["config_id"], r.get("trace", "none"), r["status"], n)
             for r, n in device_check.final_records(records)]
    assert found == [("a", "none", "ok", 2), ("b", "none", "ok", 2), ("c", "none", "timeout", 1),
                     ("c", "nsys", "failed", 1)]


def test_a_later_plain_loop_round_is_learned_from_the_first_less_its_probe_and_timm() -> None:
    first = {"process_wall_s": 60.0, "probe_s": 4.0,
             "loops": {"ddp": {"loop_s": 15.0}, "bare": {"loop_s": 14.0}, "timm": {"loop_s": 16.0}}}
    assert device_check.plain_later_s({}) is None
    assert device_check.plain_later_s({0: first}) == 40.0
    assert device_check.plain_later_s({0: first, 1: {"process_wall_s": 38.0},
                                       2: {"process_wall_s": 42.0}}) == 40.0


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
    failed_round = [{"round": 1, "why": "failed (exit 1)"}]
    assert device_check.finish_status({**passed, "plain_loop_failed": failed_round}, {}, Path("o"), 1.0) == 1
    assert "run it again with --out o" in capsys.readouterr().out


def test_a_failed_plain_loop_is_kept_and_fails_the_check_until_a_later_call_runs_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failing = tmp_path / "plain_loop.py"
    failing.write_text("import sys\nprint('loading the model')\nsys.exit('CUDA error: out of memory')\n")
    monkeypatch.setattr(device_check, "PLAIN_LOOP", failing)
    plan = device_check.specs(device_check.parts("cpu", 0, False), tmp_path)
    out = tmp_path / "check"
    said: list[str] = []
    device_check.run_plain_round(plan["harness"], out, 0, "cpu", said.append)
    device_check.run_plain_round(plan["harness"], out, 0, "cpu", said.append)  # a later call, again
    assert said[0] == "plain loop, round 0: failed (exit 1); see round-0.log: CUDA error: out of memory"
    assert "see round-0-1.log" in said[1]  # the first attempt's output is kept
    assert "loading the model" in (out / "plain_loop" / "round-0.log").read_text()
    assert [f["round"] for f in device_check.plain_loop_failures(out, 3)] == [0]
    (out / "plain_loop" / "round-0.json").write_text("{}")  # a later call ran it
    assert device_check.plain_loop_failures(out, 3) == []


def test_each_comparison_sets_like_against_like(tmp_path: Path) -> None:
    # the harness runs in DDP: it meets the DDP loop; the bare loop (no DDP) meets timm's, also bare
    for t, (ddp, bare) in enumerate([(2000.0, 2500.0), (2100.0, 2600.0), (1900.0, 2400.0)]):
        loops = {"ddp": {"images_s": ddp, "window_s": 12.0}, "bare": {"images_s": bare, "window_s": 10.0}}
        if t == 0:
            loops["timm"] = {"images_s": 1250.0, "window_s": 11.0}
        (tmp_path / "plain_loop").mkdir(exist_ok=True)
        (tmp_path / "plain_loop" / f"round-{t}.json").write_text(json.dumps({"loops": loops}))
        store.append(tmp_path / "harness" / store.TRIALS_FILE,
                     {"status": "ok", "metrics": {"throughput_samples_s": ddp / 2, "train_time_s": 10.5}})
    found = device_check.comparison(tmp_path, "cuda")
    assert found["multicard / plain loop"]["ratio"] == pytest.approx(0.5)
    assert found["plain loop / bare loop"]["ratio"] == pytest.approx(
        statistics.geometric_mean([2000, 2100, 1900]) / statistics.geometric_mean([2500, 2600, 2400]))
    # one timm loop: a ratio of means, without an interval
    assert found["bare loop / timm"]["ratio"] == pytest.approx(2500.0 / 1250.0)
    assert found["bare loop / timm"]["n"] == [3, 1] and math.isnan(found["bare loop / timm"]["ci_lo"])
    assert found["shortest_window_s"] == 10.0 and found["windows_long_enough"] is True
    assert device_check.comparison(tmp_path, "cpu")["windows_long_enough"] is None  # reported only


def test_clocks_held_down_are_summed_over_parts_and_unknown_where_one_part_lacks_them(tmp_path: Path) -> None:
    from multicard.measure import gpu_state

    for part, power in (("harness", 1.5), ("precision", None)):
        (tmp_path / part).mkdir()
        (tmp_path / part / gpu_state.END_FILE).write_text(json.dumps(
            {"gpus": [{"uuid": "GPU-a", "held_down_s": {"power": power, "thermal": 0.5}}]}))
    found = device_check.clocks_held_down([tmp_path / "harness", tmp_path / "precision"])
    assert found == {"power": None, "thermal": 1.0}  # a sum without one part's would read low
    assert device_check.held_down_text(found) == "power n/a, thermal 1 s"
    assert device_check.clocks_held_down([tmp_path / "none"]) is None


H200_CHECK = ROOT / "tests" / "fixtures" / "device_check" / "h200_device_check.json"


def test_the_summary_of_a_real_h200_check_says_no_evidence_where_the_interval_is_wide() -> None:
    summary = json.loads(H200_CHECK.read_text())["summary"]
    # that run predates the bare-loop-against-timm comparison, whose ratio its loops give
    summary["bare loop / timm"] = {"ratio": 2655.2 / 2644.3, "ci_lo": math.nan, "ci_hi": math.nan,
                                   "n": [3, 1]}
    lines = device_check.summary_lines(summary)
    assert lines[0] == ("multicard / plain loop: 0.914 [0.775, 1.08] (n 3/3) (1872 vs 2049 images/s; "
                        "costs more than 10%: not shown (the interval reaches above))")
    assert lines[2].endswith("both without DDP): 1 (n 3/1)")
    energy = next(line for line in lines if line.startswith("GPU energy"))
    assert "read by NVML integrated power): fp64 123.6 mJ;" in energy and "two ways" not in energy
    summary["energy_read_by"] = ["NVML counter", "NVML integrated power"]
    energy = next(line for line in device_check.summary_lines(summary) if line.startswith("GPU energy"))
    assert energy.endswith("; read two ways, so not comparable with each other")
    assert device_check.summary_lines({**summary, "harness_costs_too_much": True})[0].endswith(
        "costs more than 10%: True (the interval lies wholly below))")
