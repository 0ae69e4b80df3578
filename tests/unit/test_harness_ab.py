"""benchmarks/harness_ab.py's pure parts: its arguments, the pairs' ratio and goal, the line it
prints per operating point, and a CPU run's OpenMP setting."""

from __future__ import annotations

import math

import pytest

from tests.helpers import ROOT, load_script

harness_ab = load_script(ROOT / "benchmarks" / "harness_ab.py", "harness_ab")


def test_blocks_default_to_5_s_on_a_gpu_and_half_a_second_on_cpu() -> None:
    gpu = harness_ab.parse(["--out", "x.json"])
    assert (gpu.block_s, gpu.pairs, gpu.control_pairs, gpu.bare_pairs) == (5.0, 10, 4, 4)
    assert [p.name for p in gpu.points] == ["host-bound", "judged"]
    cpu = harness_ab.parse(["--out", "x.json", "--device", "cpu", "--points", "judged"])
    assert cpu.block_s == 0.5 and [p.name for p in cpu.points] == ["judged"]
    assert harness_ab.parse(["--out", "x", "--block-s", "2.5"]).block_s == 2.5


@pytest.mark.parametrize("argv", [["--points", "nowhere"], ["--block-s", "0"], ["--pairs", "-1"]])
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        harness_ab.parse(["--out", "x.json", *argv])
    assert stop.value.code == 2


def test_the_points_are_the_device_checks_host_bound_one_and_the_first_evidences() -> None:
    host, judged = harness_ab.POINTS["cuda"]
    assert host.label == "100 px, batch 64, fp16" and host.bare
    assert host.settings["layout"] == "nhwc" and host.settings["cast"] == "host"
    assert judged.label == "224 px, batch 128, fp32" and not judged.bare
    assert all(p.settings["precision"] == "fp32" for p in harness_ab.POINTS["cpu"])


def blocks(order: list[str], speeds: list[float]) -> list[dict[str, object]]:
    # images / seconds = speed: 100 images each
    return [{"slot": slot, "arm": "x", "seconds": 100.0 / v, "steps": 10, "images": 100}
            for slot, v in zip(order, speeds, strict=True)]


def test_the_pairs_ratio_is_of_images_per_second_and_says_whether_the_goal_was_met() -> None:
    order = ["A", "B", "B", "A"]
    tight = harness_ab.paired(blocks(order, [99.0, 100.0, 100.0, 99.0]))
    assert tight["ratio"] == pytest.approx(0.99) and tight["pairs"] == 2
    assert tight["ci_lo"] == pytest.approx(0.99) and tight["half_width"] == pytest.approx(0.0)
    assert tight["goal_met"] is True
    wide = harness_ab.paired(blocks(order, [90.0, 100.0, 100.0, 99.0]))
    assert wide["half_width"] > 0.02 and wide["goal_met"] is False
    # one pair: no interval, so the goal is not met; JSON's null, never NaN
    one = harness_ab.paired(blocks(["A", "B"], [99.0, 100.0]))
    assert one["ci_lo"] is None and one["half_width"] is None and one["goal_met"] is False
    none = harness_ab.paired([])
    assert none["ratio"] is None and none["pairs"] == 0


def test_each_point_prints_one_line_and_ddps_bookkeeping_where_measured() -> None:
    results = {"main": {"ratio": 0.99, "ci_lo": 0.98, "ci_hi": 1.0001, "pairs": 10, "goal_met": True},
               "control": {"ratio": 1.0, "ci_lo": 0.995, "ci_hi": 1.005, "pairs": 4},
               "bare": {"ratio": 0.93, "ci_lo": 0.9, "ci_hi": 0.96, "pairs": 4}}
    lines = harness_ab.point_lines({"label": "100 px, batch 64, fp16", "results": results})
    assert lines == [
        "harness / plain loop at 100 px, batch 64, fp16: 0.9900 [0.9800, 1.0001] (10 pairs; goal "
        "+-2 %: met); A/A control: 1.0000 [0.9950, 1.0050]",
        "plain loop / bare loop at 100 px, batch 64, fp16 (DDP's host bookkeeping): 0.9300 "
        "[0.9000, 0.9600] (4 pairs)"]
    del results["bare"]
    results["main"] = {**results["main"], "ci_lo": None, "ci_hi": None, "goal_met": False}
    [line] = harness_ab.point_lines({"label": "224 px, batch 128, fp32", "results": results})
    assert line.startswith("harness / plain loop at 224 px, batch 128, fp32: 0.9900 [no interval] "
                           "(10 pairs; goal +-2 %: not met)")


def test_a_cpu_run_gets_a_cpu_trials_spin_count(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(name, raising=False)
    assert harness_ab.cpu_trial_env(["--out", "x", "--device", "cpu"]) == {"GOMP_SPINCOUNT": "1000"}
    assert harness_ab.cpu_trial_env(["--device=cpu"]) == {"GOMP_SPINCOUNT": "1000"}
    assert harness_ab.cpu_trial_env(["--out", "x"]) == {}  # a GPU run keeps the libraries' default
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert harness_ab.cpu_trial_env(["--device", "cpu"]) == {}  # the caller's choice wins


def test_no_nan_reaches_the_json() -> None:
    assert harness_ab._finite(math.nan) is None and harness_ab._finite(1.5) == 1.5
