"""The cost model's rates fitted from finished trials: constructed records with known rates."""

from __future__ import annotations

from pathlib import Path

import pytest

from multicard import calibrate, cost, params
from multicard.errors import InputError

CPU = params.resolve("vision", {"device": "cpu", "image_size": 32, "epochs": 2, "max_steps": 4,
                                "batch_size": 16, "gpus": 2, "train_subset": 0})
GPU = params.resolve("vision", {"device": "cuda", "image_size": 300, "epochs": 20, "batch_size": 64,
                                "gpus": 4, "loader": "dali"})


def record(throughput: float, train: float, wall: float, status: str = "ok", trace: str = "none") -> dict:
    return {"status": status, "trace": trace, "wall_s": wall,
            "metrics": {"throughput_samples_s": throughput, "train_time_s": train}}


def test_a_rate_is_per_rank_on_gpus_and_per_node_on_cpu() -> None:
    # 2 epochs x 4 steps x 16 images x 2 ranks = 256 images
    assert cost.vision_images(CPU) == 256
    assert calibrate.work("vision", CPU) == 256  # CPU ranks share their node's cores
    assert calibrate.work("vision", GPU) == 20 * 60000 / 4  # each GPU its share


def test_rates_are_the_mean_of_ok_timing_trials_and_their_start_up() -> None:
    trials = [(CPU, record(100.0, 2.56, 10.0)), (CPU, record(140.0, 1.83, 9.0)),
              (CPU, record(999.0, 0.1, 1.0, status="oom")), (CPU, record(5.0, 50.0, 60.0, trace="nsys")),
              ({**CPU, "precision": "fp64"}, record(20.0, 12.8, 20.0))]
    rates = calibrate.fit("vision", [("run-a", trials)])
    mine = rates[calibrate.rate_key("vision", CPU)]
    assert (mine.per_s, mine.trials, mine.source) == (120.0, 2, "run-a")
    assert mine.startup_s == pytest.approx(((10.0 - 2.56) + (9.0 - 1.83)) / 2)
    found = calibrate.estimate("vision", CPU, rates)
    assert found.how == "measured" and found.source == "run-a, 2 trial(s)"
    assert found.seconds == pytest.approx(mine.startup_s + 256 / 120.0)
    # the same key at another GPU count or epoch count is measured too; another layout is not
    assert calibrate.estimate("vision", {**CPU, "gpus": 1, "epochs": 20}, rates).how == "measured"
    other = calibrate.estimate("vision", {**CPU, "layout": "nhwc"}, rates)
    assert other == calibrate.Estimate(cost.trial_seconds("vision", {**CPU, "layout": "nhwc"}), "guessed")


def test_a_key_measured_in_two_runs_takes_the_one_with_more_trials() -> None:
    few = [(GPU, record(4000.0, 300.0, 400.0))]
    many = [(GPU, record(3000.0, 400.0, 500.0)) for _ in range(3)]
    rates = calibrate.fit("vision", [("few", few), ("many", many)])
    assert rates[calibrate.rate_key("vision", GPU)].source == "many"
    assert rates[calibrate.rate_key("vision", GPU)].per_s == 750.0  # 3000 images/s over 4 GPUs


def test_llm_rates_are_tokens_per_gpu_and_the_rest_of_the_launch_is_start_up() -> None:
    settings = params.resolve("llm", {"device": "cpu", "model": "tiny", "method": "lora",
                                      "seq_len": 128, "batch_size": 2, "max_steps": 10})
    done = {"status": "ok", "wall_s": 20.0,
            "metrics": {"tokens_per_s_per_gpu": 512.0, "step_time_median_s": 0.5, "steps": 10}}
    rates = calibrate.fit("llm", [("llm-run", [(settings, done)])])
    found = calibrate.estimate("llm", settings, rates)
    tokens = 10 * 2 * 128 * int(settings["gradient_accumulation_steps"])
    assert found.seconds == pytest.approx((20.0 - 5.0) + tokens / 512.0) and found.how == "measured"


def test_a_calibration_file_round_trips_and_a_wrong_one_is_bad_input(tmp_path: Path) -> None:
    rates = calibrate.fit("vision", [("run-a", [(CPU, record(100.0, 2.56, 10.0))])])
    calibrate.save(rates, tmp_path / "calibration.json")
    assert calibrate.load(tmp_path / "calibration.json") == rates
    (tmp_path / "bad.json").write_text('{"schema": 1, "rates": {"k": {"per_s": 1}}}')
    with pytest.raises(InputError, match="not a calibration file"):
        calibrate.load(tmp_path / "bad.json")
    (tmp_path / "old.json").write_text('{"schema": 0, "rates": {}}')
    with pytest.raises(InputError, match="calibration schema 0"):
        calibrate.load(tmp_path / "old.json")
