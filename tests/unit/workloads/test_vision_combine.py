from __future__ import annotations

from pathlib import Path

import pytest

from multicard.measure import energy
from multicard.measure.energy import Energy
from multicard.workloads.vision import combine_ranks, unmeasured


def rank(train: float, epochs: list[float], first: list[float], wait: float, samples: int,
         mem: int, steps: list[float], copy_wait: float = 0.0) -> dict:
    return {"train_time_s": train, "epoch_time_s": epochs, "first_batch_latency_s": first,
            "data_wait_s": wait, "h2d_wait_s": copy_wait, "samples": samples,
            "peak_mem_bytes": mem, "nvml_process_mem_bytes": None, "step_times_s": steps,
            "h2d_time_s": None, "gpu_util_mean": None, "loss_mean": 2.0, "gpu_uuid": None}


PROBED = {"probe_kernels_per_step": 900.0, "probe_kernel_s_per_step": 0.02, "probe_busy_s_per_step": 0.018,
          "probe_aten_ops_per_step": 2400.0, "probe_launches_per_step": 900.0,
          "probe_wall_s_per_step": 0.035, "probe_reason": None}


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


def test_the_wait_for_the_loader_and_the_wait_for_the_copy_stay_apart() -> None:
    metrics = combine_ranks([rank(10.0, [10.0], [0.5], 1.0, 10, 1, [0.1], copy_wait=4.0),
                             rank(8.0, [8.0], [0.5], 2.0, 10, 1, [0.1], copy_wait=2.0)], None)
    assert metrics["data_wait_fraction"] == pytest.approx((0.1 + 0.25) / 2)
    assert metrics["h2d_wait_fraction"] == pytest.approx((0.4 + 0.25) / 2)
    assert (metrics["data_wait_s"], metrics["h2d_wait_s"]) == (1.5, 3.0)


def test_what_was_not_measured_says_why() -> None:
    cpu = [rank(1.0, [1.0], [0.1], 0.1, 1, 1, [0.1])]
    assert unmeasured(cpu)["gpu_util_mean"] == "CPU run: no GPU to sample"
    measured = {**energy.rank_record(Energy(300.0, "counter"), Energy(40.0, "counter")),
                "rank_cpu_s": 3.0, "workers_cpu_s": 1.0, "stray_contexts": [],
                "dali_threads_cpu_s": 0.5, "local_page_fraction": 0.9, "cpus_on_gpu_node_fraction": 1.0,
                **PROBED}
    gpu = [{**cpu[0], "gpu_uuid": "GPU-1", "h2d_time_s": 0.2, "gpu_util_mean": 0.9,
            "nvml_process_mem_reason": "NVML lists no process with this PID on the GPU", **measured}]
    assert unmeasured(gpu) == {"nvml_process_mem_bytes": "NVML lists no process with this PID on the GPU",
                               "steady_epoch_s": "one epoch: none after the first"}


def test_the_epochs_after_the_first_are_kept_apart_from_its_one_off_costs() -> None:
    two = [rank(6.0, [5.0, 1.0], [0.1, 0.1], 0.1, 100, 1, [0.1, 0.1])]  # workers start in epoch 0
    metrics = combine_ranks(two, None)
    assert metrics["train_time_s"] == 6.0 and metrics["steady_epoch_s"] == 1.0
    assert combine_ranks([rank(1.0, [1.0], [0.1], 0.1, 1, 1, [0.1])], None)["steady_epoch_s"] is None


def test_energy_is_summed_over_ranks_per_image_and_null_with_a_reason_on_cpu() -> None:
    ranks = [{**rank(2.0, [2.0], [0.1], 0.1, 300, 1, [0.1]), "rank": r, "gpu_uuid": f"GPU-{r}",
              **energy.rank_record(Energy(250.0, "counter"), Energy(60.0, "counter") if r == 0 else None)}
             for r in range(2)]
    metrics = combine_ranks(ranks, None)
    assert metrics["energy_j"] == 500.0 and metrics["energy_per_sample_j"] == pytest.approx(500 / 600)
    assert metrics["mean_power_w"] == 250.0 and metrics["cpu_energy_j"] == 60.0
    cpu = [{**rank(2.0, [2.0], [0.1], 0.1, 300, 1, [0.1]), "rank": 0,
            **energy.rank_record(Energy(None, None, "CPU run: no GPU"),
                                 Energy(None, None, "no RAPL package domain"))}]
    assert combine_ranks(cpu, None)["energy_j"] is None
    assert unmeasured(cpu)["energy_per_sample_j"] == "rank 0: CPU run: no GPU"
    assert unmeasured(cpu)["cpu_energy_j"] == "rank 0: no RAPL package domain"


def test_cpu_time_adds_up_over_ranks_and_stray_contexts_are_counted() -> None:
    base = rank(2.0, [2.0], [0.1], 0.1, 10, 1, [0.1])
    stray = {"pid": 7, "gpu": "GPU-0", "bytes": 500 << 20, "trains_on": "GPU-1"}
    ranks = [{**base, "rank_cpu_s": 3.0, "workers_cpu_s": 5.0, "stray_contexts": []},
             {**base, "rank_cpu_s": 2.0, "workers_cpu_s": 4.0, "stray_contexts": [stray]}]
    metrics = combine_ranks(ranks, None)
    assert (metrics["rank_cpu_s"], metrics["workers_cpu_s"], metrics["cpu_cores_mean"]) == (5.0, 9.0, 7.0)
    assert metrics["stray_contexts"] == 1
    cpu = [{**base, "rank_cpu_s": None, "cpu_reason": "/proc: gone",
            "stray_contexts": None, "stray_contexts_reason": "CPU run: no GPU"}]
    assert combine_ranks(cpu, None)["cpu_cores_mean"] is None
    assert unmeasured(cpu)["cpu_cores_mean"] == "/proc: gone"
    assert unmeasured(cpu)["stray_contexts"] == "CPU run: no GPU"
    assert unmeasured(cpu)["local_page_fraction"] == (
        "numa_evidence is off: no NUMA placement probe in this trial")


def test_dali_threads_are_counted_apart_and_null_without_dali() -> None:
    base = rank(2.0, [2.0], [0.1], 0.1, 10, 1, [0.1])
    dali = [{**base, "rank_cpu_s": 3.0, "workers_cpu_s": 0.0, "dali_threads_cpu_s": 2.5},
            {**base, "rank_cpu_s": 3.0, "workers_cpu_s": 0.0, "dali_threads_cpu_s": 1.5}]
    metrics = combine_ranks(dali, None)
    assert metrics["dali_threads_cpu_s"] == 4.0
    # over the 2 s of training: mean cores of each part, and of the rank and workers together
    assert (metrics["rank_cores_mean"], metrics["workers_cores_mean"], metrics["dali_threads_cores_mean"],
            metrics["cpu_cores_mean"]) == (3.0, 0.0, 2.0, 3.0)
    torch_loader = [{**base, "rank_cpu_s": 3.0, "workers_cpu_s": 1.0, "dali_threads_cpu_s": None,
                     "dali_threads_reason": "no DALI thread in this rank"}]
    assert combine_ranks(torch_loader, None)["dali_threads_cpu_s"] is None
    assert unmeasured(torch_loader)["dali_threads_cpu_s"] == "no DALI thread in this rank"
    assert unmeasured(torch_loader)["dali_threads_cores_mean"] == "no DALI thread in this rank"


def test_the_gpus_busy_share_is_the_probes_busy_time_over_each_ranks_own_median_step() -> None:
    ranks = [{**rank(1.0, [1.0], [0.1], 0.1, 1, 1, [0.02, 0.04, 0.03]), **PROBED},
             {**rank(1.0, [1.0], [0.1], 0.1, 1, 1, [0.06, 0.06]), **PROBED}]
    metrics = combine_ranks(ranks, None)
    assert metrics["gpu_busy_fraction"] == pytest.approx((0.018 / 0.03 + 0.018 / 0.06) / 2)
    assert metrics["probe_aten_ops_per_step"] == 2400.0
    assert "gpu_busy_fraction" not in unmeasured(ranks)


def test_without_a_probe_the_busy_share_is_null_and_says_why() -> None:
    ranks = [{**rank(1.0, [1.0], [0.1], 0.1, 1, 1, [0.1]), "probe_busy_s_per_step": None,
              "probe_reason": "CPU run: there are no GPU kernels"}]
    assert combine_ranks(ranks, None)["gpu_busy_fraction"] is None
    assert unmeasured(ranks)["gpu_busy_fraction"] == "CPU run: there are no GPU kernels"
    assert unmeasured(ranks)["probe_aten_ops_per_step"] == "CPU run: there are no GPU kernels"


def test_one_rank_is_wrapped_lean_bare_or_as_pytorch_defaults_and_several_always_in_ddp(
        tmp_path: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from multicard.workloads.vision import wrap

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        model = torch.nn.Linear(2, 2)
        lean = wrap(model, "lean", 1, None)
        assert isinstance(lean, DDP) and not lean.broadcast_buffers and lean.gradient_as_bucket_view
        default = wrap(model, "default", 1, None)
        assert default.broadcast_buffers and not default.gradient_as_bucket_view
        assert wrap(model, "none", 1, None) is model
        several = wrap(model, "none", 2, None)  # the world size decides: DDP-DS with its defaults
        assert isinstance(several, DDP) and several.broadcast_buffers
    finally:
        dist.destroy_process_group()
