"""The cost model's rates fitted from finished trials: constructed records with known rates."""

from __future__ import annotations

from pathlib import Path

import pytest

from multicard.errors import InputError
from multicard.plan import calibrate, cost, params

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
    # 256 images each in 2.56 s and 1.83 s (the rate is the trial's work over its timed part, not
    # its throughput metric): a mean of 2.195 s, i.e. 116.6 images/s, not the mean rate 120
    assert (mine.trials, mine.source) == (2, "run-a")
    assert mine.per_s == pytest.approx(256 / 2.195)
    assert mine.startup_s == pytest.approx(((10.0 - 2.56) + (9.0 - 1.83)) / 2)
    found = calibrate.estimate("vision", CPU, rates)
    assert found.how == "measured" and found.source == "run-a, 2 trial(s)"
    assert found.seconds == pytest.approx(mine.startup_s + 256 / mine.per_s)
    # a profiled trial has its own rate: the nsys one took 50 s of training and 10 s else
    traced = calibrate.estimate("vision", CPU, rates, trace="nsys")
    assert traced.seconds == pytest.approx(60.0) and traced.source == "run-a, 1 trial(s)"
    assert calibrate.estimate("vision", CPU, rates, trace="torch").how == "guessed"
    # more work of the same key is measured too; another layout, GPU count or worker count is not
    assert calibrate.estimate("vision", {**CPU, "epochs": 20, "train_subset": 512}, rates).how == "measured"
    for changed in ({"layout": "nhwc"}, {"gpus": 1}, {"num_workers": 0}, {"numa_policy": "local"}):
        other = calibrate.estimate("vision", {**CPU, **changed}, rates)
        assert other == calibrate.Estimate(cost.trial_seconds("vision", {**CPU, **changed}), "guessed")


def test_the_runners_time_between_trials_is_start_up_and_a_skipped_key_costs_its_skip() -> None:
    first = {**record(100.0, 2.0, 10.0), "started_unix": 1000.0, "order": 0}
    warmed = {**record(100.0, 2.0, 10.0), "started_unix": 1019.0, "order": 1}  # 9 s after the first
    skipped = {"status": "skipped", "wall_s": 0.0, "started_unix": 1029.5, "order": 2}  # 0.5 s after
    assert calibrate.gaps([warmed, first, skipped]) == [9.0, 0.0, 0.5]
    # a stop and a resume between two trials is no preparation: an interrupted one before, or a
    # trial of the plan missing (killed with the runner), and the retry of a trial follows it
    stopped = {**first, "status": "interrupted"}
    resumed = {**record(100.0, 2.0, 10.0), "started_unix": 9000.0, "order": 3}
    retried = {**record(100.0, 2.0, 10.0), "started_unix": 9011.0, "order": 3}
    assert calibrate.gaps([stopped, warmed, resumed, retried]) == [0.0, 0.0, 0.0, 1.0]
    assert calibrate.run_start(990.0, [warmed, first]) == 10.0 and calibrate.run_start(None, [first]) is None
    local = {**CPU, "numa_policy": "local"}
    rates = calibrate.fit("vision", [("run", [(CPU, first), (CPU, warmed), (local, skipped)])])
    assert rates[calibrate.rate_key("vision", CPU)].startup_s == pytest.approx((8.0 + 17.0) / 2)
    found = calibrate.estimate("vision", local, rates)
    assert found == calibrate.Estimate(0.5, "measured", "run: skipped there, 1 trial(s)")
    # a run that measured the key wins over one that skipped it
    measured = calibrate.fit("vision", [("ran", [(local, first)]), ("run", [(local, skipped)])])
    assert not measured[calibrate.rate_key("vision", local)].skipped


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
    # its timed part is 10 steps x 0.5 s, whatever torchtune's tokens/s (non-padding tokens) says
    assert rates[calibrate.rate_key("llm", settings)].per_s == pytest.approx(tokens / 5.0)
    assert found.seconds == pytest.approx(20.0) and found.how == "measured"


def test_a_calibration_file_round_trips_and_a_wrong_one_is_bad_input(tmp_path: Path) -> None:
    rates = calibrate.fit("vision", [("run-a", [(CPU, record(100.0, 2.56, 10.0))])])
    calibrate.save(rates, tmp_path / "calibration.json")
    assert calibrate.load(tmp_path / "calibration.json") == rates
    (tmp_path / "bad.json").write_text('{"schema": 1, "rates": {"k": {"per_s": 1}}}')
    with pytest.raises(InputError, match="not a calibration file"):
        calibrate.load(tmp_path / "bad.json")
    (tmp_path / "zero.json").write_text('{"schema": 1, "rates": {"k": {"per_s": 0.0, "startup_s": 1.0, '
                                        '"trials": 2, "source": "r"}}}')
    with pytest.raises(InputError, match="expected per_s > 0"):
        calibrate.load(tmp_path / "zero.json")
    (tmp_path / "old.json").write_text('{"schema": 0, "rates": {}}')
    with pytest.raises(InputError, match="calibration schema 0"):
        calibrate.load(tmp_path / "old.json")
