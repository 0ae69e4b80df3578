"""benchmarks/device_check.py's plan and its pure parts: the estimate against its 8 minutes,
what a resume still runs, what the trials run teach the estimate, the comparison (harness_ab.json)
read and judged."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from multicard.plan import calibrate, cost
from multicard.plan import spec as specmod
from tests.helpers import ROOT, load_script

device_check = load_script(ROOT / "benchmarks" / "device_check.py", "device_check")


def test_the_dry_run_fits_8_minutes_on_one_gpu_with_nsys(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert device_check.main(["--dry-run", "--out", str(tmp_path / "new")]) == 0
    lines = capsys.readouterr().out.splitlines()
    parts = [line.split(":")[0] for line in lines[:4]]
    assert parts == ["harness", "precision", "pin_memory", "nsys"]  # no nccl: one GPU
    assert lines[0] == ("harness: 1 of 1 comparison left (2 points in one process, 68 blocks of 2.5 s), "
                        "estimated 3m 45s")
    total = next(line for line in lines if line.startswith("total: estimated "))
    assert "(within the 8m 00s target; the cost model's guesses" in total
    assert total.startswith("total: estimated 7m 33s")  # 7m 39s with the three rounds of old
    assert not (tmp_path / "new").exists()


def test_the_comparison_is_one_process_of_paired_blocks_sized_to_fit_the_budget() -> None:
    harness = device_check.parts("cuda", 1, False)["harness"]
    assert harness == device_check.Harness("cuda", 2.5, 10, 4, 4)
    # per point a settling block of each arm, 10 pairs and 4 control pairs; 4 bare pairs at one
    assert harness.blocks == 2 * 2 * (1 + 10 + 4) + 2 * 4 == 68
    assert harness.guess_s() == pytest.approx(15 + 2 * 8 + 68 * (2.5 * 1.1 + 0.1))
    argv = harness.argv(Path("h.json"))
    assert argv[1:] == [str(device_check.HARNESS_AB), "--out", "h.json", "--device", "cuda", "--block-s",
                        "2.5", "--pairs", "10", "--control-pairs", "4", "--bare-pairs", "4",
                        "--data-dir", str(ROOT / "data")]
    assert device_check.parts("cpu", 0, False)["harness"].blocks == 2 * 2 * (1 + 4 + 2) + 2 * 2


def test_the_check_counts_harness_abs_points_as_they_are() -> None:
    harness_ab = load_script(ROOT / "benchmarks" / "harness_ab.py", "harness_ab")
    for device in ("cuda", "cpu"):
        points = harness_ab.POINTS[device]
        assert len(points) == device_check.HARNESS_POINTS and [p.bare for p in points] == [True, False]
        assert points[0].name == "host-bound"  # the point the check judges
    # the host-bound point is the precision and pin_memory parts' size: their 100 px, batch 64
    host = harness_ab.POINTS["cuda"][0].settings
    sizes = device_check.SIZES["cuda"]
    assert (host["image_size"], host["batch_size"]) == (sizes["image_size"], sizes["batch_size"])
    assert host["precision"] == device_check.COMPARED_PRECISION["cuda"]


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
    (0.85, math.nan, math.nan, True),  # one pair (an older summary's NaN): the point alone
    (0.95, None, None, False),         # one pair (harness_ab.json's null): the point alone
])
def test_the_harness_fails_only_where_its_cost_is_shown_beyond_the_tolerance(
        ratio: float, lo: float | None, hi: float | None, verdict: bool) -> None:
    found = {"ratio": ratio, "ci_lo": lo, "ci_hi": hi, "pairs": 10}
    assert device_check.harness_costs_too_much(found) is verdict
    assert device_check.harness_costs_too_much(None) is None
    assert device_check.harness_costs_too_much({"ratio": None, "pairs": 0}) is None


def test_an_incomplete_check_exits_3_and_a_failed_one_1(capsys: pytest.CaptureFixture[str]) -> None:
    passed = {"not_ok": [], "step_clock_within_tolerance": True, "tf32_flags_as_set": True,
              "harness_costs_too_much": False, "harness_failed": None, "ok": 5, "trials": 5}
    assert device_check.finish_status(passed, {}, Path("o"), 1.0) == 0
    assert device_check.finish_status(passed, {"pin_memory": "needs about 1m"}, Path("o"), 1.0) == 3
    assert device_check.finish_status({**passed, "harness_costs_too_much": True}, {}, Path("o"), 1.0) == 1
    assert device_check.finish_status({**passed, "not_ok": [{}]}, {"x": "y"}, Path("o"), 1.0) == 1
    failed = {"why": "failed (exit 1)"}
    assert device_check.finish_status({**passed, "harness_failed": failed}, {}, Path("o"), 1.0) == 1
    assert "run it again with --out o" in capsys.readouterr().out


def test_a_failed_comparison_is_kept_and_fails_the_check_until_a_later_call_runs_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failing = tmp_path / "harness_ab.py"
    failing.write_text("import sys\nprint('loading the model')\nsys.exit('CUDA error: out of memory')\n")
    monkeypatch.setattr(device_check, "HARNESS_AB", failing)
    out = tmp_path / "check"
    said: list[str] = []
    harness = device_check.Harness.on("cpu")
    device_check.run_harness(harness, out, said.append)
    device_check.run_harness(harness, out, said.append)  # a later call, again
    assert said[0] == "harness: failed (exit 1); see harness_ab.log: CUDA error: out of memory"
    assert "see harness_ab-1.log" in said[1]  # the first attempt's output is kept
    assert "loading the model" in (out / "harness" / "harness_ab.log").read_text()
    assert device_check.harness_failure(out) == {"why": said[1].removeprefix("harness: ")}
    assert (out / "harness" / "gpu-state-end.json").is_file()  # read on CPU too: no GPUs, and why
    assert not device_check.harness_done(out)
    (out / "harness" / device_check.HARNESS_FILE).write_text("{}")  # a later call ran it
    assert device_check.harness_failure(out) is None and device_check.harness_done(out)


def harness_file(out: Path) -> Path:
    """A harness_ab.json as harness_ab writes it (made-up numbers: the reading is tested)."""
    def ratio(value: float, lo: float | None, hi: float | None, pairs: int) -> dict[str, object]:
        return {"ratio": value, "ci_lo": lo, "ci_hi": hi, "pairs": pairs, "of": "images/s",
                "half_width": None if hi is None else hi / value - 1,
                "goal_met": hi is not None and hi / value - 1 <= 0.02}

    def block(seconds: float) -> dict[str, object]:
        return {"run": "main", "slot": "A", "arm": "harness", "seconds": seconds, "steps": 80, "images": 5120}

    points = [{"name": "host-bound", "label": "100 px, batch 64, fp16", "blocks": [block(2.6), block(2.4)],
               "results": {"main": ratio(0.97, 0.96, 0.98, 10), "control": ratio(1.0, 0.99, 1.01, 4),
                           "bare": ratio(0.9, 0.88, 0.92, 4)}},
              {"name": "judged", "label": "224 px, batch 128, fp32", "blocks": [block(2.55)],
               "results": {"main": ratio(0.995, None, None, 1), "control": ratio(1.0, 0.98, 1.02, 4)}}]
    path = out / "harness" / device_check.HARNESS_FILE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"block_s": 2.5, "points": points, "lines": ["line 1", "line 2", "line 3"]}))
    return path


def test_the_host_bound_point_is_judged_and_every_points_lines_are_kept(tmp_path: Path) -> None:
    assert device_check.harness_comparison(tmp_path)["harness / plain loop"] is None  # not run
    harness_file(tmp_path)
    found = device_check.harness_comparison(tmp_path)
    assert found["harness / plain loop"]["ratio"] == 0.97
    assert found["harness_point"] == "100 px, batch 64, fp16"
    assert found["plain loop / bare loop"]["ratio"] == 0.9  # DDP's host bookkeeping
    assert set(found["harness_ab"]) == {"host-bound", "judged"}
    assert found["harness_ab"]["judged"]["label"] == "224 px, batch 128, fp32"
    assert found["shortest_block_s"] == 2.4 and found["block_s"] == 2.5
    assert found["harness_lines"] == ["line 1", "line 2", "line 3"]
    summary = device_check.summarize_checks([], found, "cuda")
    assert summary["harness_costs_too_much"] is False
    assert device_check.summarize_checks([], found, "cpu")["harness_costs_too_much"] is None  # the path only


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


def test_the_summary_lines_of_a_check(tmp_path: Path) -> None:
    # a real H200 check's summary (its energy, clocks and checks), with a comparison read from a
    # made-up harness_ab.json: that run predates it
    summary = json.loads(H200_CHECK.read_text())["summary"]
    harness_file(tmp_path)
    summary |= {**device_check.harness_comparison(tmp_path), "harness_failed": None,
                "harness_costs_too_much": False}
    lines = device_check.summary_lines(summary)
    assert lines[:3] == ["line 1", "line 2", "line 3"]  # harness_ab's own, each point's
    assert lines[3] == ("harness costs more than 10% of the plain loop's images/s at 100 px, batch 64, "
                        "fp16: not shown (the interval reaches above)")
    assert lines[4] == "shortest harness / plain-loop block: 2.4 s (sized for 2.5 s)"
    energy = next(line for line in lines if line.startswith("GPU energy"))
    assert "read by NVML integrated power): fp64 123.6 mJ;" in energy and "two ways" not in energy
    summary["energy_read_by"] = ["NVML counter", "NVML integrated power"]
    energy = next(line for line in device_check.summary_lines(summary) if line.startswith("GPU energy"))
    assert energy.endswith("; read two ways, so not comparable with each other")
    assert device_check.summary_lines({**summary, "harness_costs_too_much": True})[3].endswith(
        "fp16: True (the interval lies wholly below)")
    assert "harness comparison failed: no" in lines
    failed = device_check.summary_lines({**summary, "harness_failed": {"why": "timed out after 600 s"}})
    assert "harness comparison failed: timed out after 600 s" in failed
    none = device_check.summary_lines({**summary, **device_check.harness_comparison(tmp_path / "none")})
    assert none[:2] == ["harness / plain loop: n/a (the harness part has not run)",
                        "harness costs more than 10% of the plain loop's images/s at the host-bound "
                        "point: n/a (the comparison has not run)"]


def test_energy_by_precision_needs_three_trials_and_shows_the_interval() -> None:
    def row(precision: str, joules: float | None) -> dict[str, object]:
        return {"part": "precision", "status": "ok", "precision": precision,
                "energy_per_sample_j": joules, "energy_reason": None if joules else "window 3.1 s < 5 s"}
    rows = [row("fp16", 0.09), row("fp16", 0.08), row("fp16", 0.10), row("fp64", 0.12),
            row("fp64", 0.13), row("fp32", None),
            {"part": "ddp", "status": "ok", "precision": "fp32", "energy_per_sample_j": 1.0}]
    energy = device_check.energy_by_precision(rows)
    assert list(energy) == ["fp64", "fp32", "fp16"]
    assert energy["fp64"] == "n < 3 (n = 2)"
    assert energy["fp32"] == "not measured: window 3.1 s < 5 s"
    fp16 = energy["fp16"]
    assert fp16["n"] == 3 and fp16["mean"] == pytest.approx(0.09)
    assert fp16["ci_lo"] < 0.09 < fp16["ci_hi"]
    text = device_check.energy_text(energy)
    assert text.startswith("fp64 n < 3 (n = 2); fp32 not measured") and "fp16 90 mJ [" in text
