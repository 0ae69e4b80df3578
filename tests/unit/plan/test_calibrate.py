"""The cost model's rates fitted from finished trials: constructed records with known rates."""

from __future__ import annotations

from pathlib import Path

import pytest

from multicard.errors import InputError
from multicard.plan import calibrate, cost, params

CPU = params.resolve("vision", {"device": "cpu", "image_size": 32, "epochs": 2, "max_steps": 4,
                                "batch_size": 16, "gpus": 2, "train_subset": 0, "test_subset": 30})
EVAL = 10  # 30 test images, a third of a training image's time each, on the CPU node
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
    # the start-up is what is left of the wall time after training and evaluation at that rate
    assert mine.startup_s == pytest.approx(((10.0 - 2.56 - EVAL * 2.56 / 256)
                                            + (9.0 - 1.83 - EVAL * 1.83 / 256)) / 2)
    found = calibrate.estimate("vision", CPU, rates)
    assert found.how == "measured" and found.source == "run-a, 2 trial(s)"
    assert found.seconds == pytest.approx(mine.startup_s + (256 + EVAL) / mine.per_s)
    # a profiled trial has its own rate: the nsys one took 50 s of training and 10 s else
    traced = calibrate.estimate("vision", CPU, rates, trace="nsys")
    assert traced.seconds == pytest.approx(60.0) and traced.source == "run-a, 1 trial(s)"
    assert calibrate.estimate("vision", CPU, rates, trace="torch").how == "guessed"
    # more work of the same key is measured too, a larger test set included; another layout, GPU
    # count or worker count is not
    larger = {**CPU, "epochs": 20, "train_subset": 512, "test_subset": 3000}
    more = calibrate.estimate("vision", larger, rates)
    assert more.how == "measured"
    assert more.seconds == pytest.approx(mine.startup_s + (20 * 4 * 16 * 2 + 1000) / mine.per_s)
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
    assert rates[calibrate.rate_key("vision", CPU)].startup_s == pytest.approx((8.0 + 17.0) / 2
                                                                             - EVAL * 2.0 / 256)
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


H200 = params.resolve("vision", {"device": "cuda", "image_size": 100, "batch_size": 64, "epochs": 2,
                                 "max_steps": 50, "test_subset": 2000, "precision": "fp64"})


def h200_record(share: str = "gpu_util_mean") -> dict:
    # as the H200 run's fp64 trial: 6,400 images in 3.1 s, 27.4 ms steps, the GPU busy 43 %
    return {"status": "ok", "wall_s": 21.0, "metrics": {"train_time_s": 3.1, "step_time_median_s": 0.0274,
                                                        share: 0.43}}


def test_a_rate_is_carried_to_another_size_and_batch_by_the_gpus_share_of_a_step() -> None:
    rates = calibrate.fit("vision", [("h200", [(H200, h200_record())])])
    rate = rates[calibrate.rate_key("vision", H200)]
    assert (rate.step_s, rate.gpu_share) == (0.0274, 0.43)
    assert rate.gpu_share_from == "NVML utilisation, an upper bound"
    bigger = {**H200, "image_size": 224, "batch_size": 128, "test_subset": 1000}
    found = calibrate.estimate("vision", bigger, rates)
    assert found.how == "scaled" and "at 100 px, batch 64; GPU share 43 %" in found.source
    growth = 2 * (224 / 100) ** 2  # the batch doubled, the pixels x5.02: the GPU's part of a step
    step1 = 0.0274 * (0.43 * growth + 0.57)
    per_image = (3.1 / 6400) * (step1 / 0.0274) / 2
    images = 2 * 50 * 128 + 1000 / 3
    assert found.seconds == pytest.approx(rate.startup_s + 5 * (step1 - 0.0274) + images * per_image)
    # at the measured size and batch it is the measured estimate again
    same = calibrate.estimate("vision", {**H200, "test_subset": 1000}, rates)
    assert same.how == "measured"
    # another precision, or a rate without a GPU share, is not carried over
    assert calibrate.estimate("vision", {**bigger, "precision": "fp16"}, rates).how == "guessed"
    bare = calibrate.fit("vision", [("h200", [(H200, record(2000.0, 3.1, 21.0))])])
    assert calibrate.estimate("vision", bigger, bare).how == "guessed"


def test_the_step_probes_share_is_preferred_to_nvmls_upper_bound() -> None:
    both = h200_record()
    both["metrics"]["gpu_busy_fraction"] = 0.3
    rate = calibrate.fit("vision", [("r", [(H200, both)])])[calibrate.rate_key("vision", H200)]
    assert (rate.gpu_share, rate.gpu_share_from) == (0.3, "step probe")
