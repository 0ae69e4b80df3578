from __future__ import annotations

import pytest

from multicard.workloads.vision import combine_ranks


def rank(train: float, epochs: list[float], first: list[float], wait: float, samples: int,
         mem: int, steps: list[float]) -> dict:
    return {"train_time_s": train, "epoch_time_s": epochs, "first_batch_latency_s": first,
            "data_wait_s": wait, "samples": samples, "peak_mem_bytes": mem,
            "step_times_s": steps, "h2d_time_s": None, "gpu_util_mean": None, "loss_mean": 2.0}


def test_slowest_rank_sets_times_and_samples_add_up() -> None:
    metrics = combine_ranks(
        [rank(10.0, [4.0, 5.9], [0.5, 0.2], 1.0, 100, 10, [0.1, 0.3]),
         rank(9.0, [4.5, 4.4], [0.1, 0.9], 3.0, 100, 20, [0.2])],
        test_accuracy=0.5,
    )
    assert metrics["train_time_s"] == 10.0
    assert metrics["epoch_time_s"] == [4.5, 5.9]
    assert metrics["first_batch_latency_s"] == [0.5, 0.9]
    assert metrics["throughput_samples_s"] == pytest.approx(20.0)
    assert metrics["data_wait_fraction"] == pytest.approx((1 / 10 + 3 / 9) / 2)
    assert metrics["step_time_median_s"] == pytest.approx(0.2)
    assert metrics["peak_mem_bytes"] == 20
    assert metrics["h2d_time_s"] is None and metrics["gpu_util_mean"] is None
    assert metrics["test_accuracy"] == 0.5
