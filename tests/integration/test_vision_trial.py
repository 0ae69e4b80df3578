"""A real 2-rank gloo trial of the vision workload, launched the way `multicard run` launches it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from multicard.plan import spec
from multicard.run import runner, store
from tests.helpers import DATA, TINY_FIXED, write_spec

# the fast tier's 2-rank gloo torchrun trial (every test here reads the one trial)
pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("vision")
    # 40 images over 2 ranks in batches of 8... per rank 20: 8, 8 and a short last batch of 4
    fixed = {**TINY_FIXED, "max_steps": 0, "train_subset": 41}
    path = write_spec(directory, fixed=fixed, grid={"precision": ["fp32"], "gpus": [2]})
    os.environ["NVIDIA_TF32_OVERRIDE"] = "0"  # what a careless environment may carry
    try:
        outcome = runner.run(spec.load(path), directory / "run", data_dir=DATA, echo=lambda _: None)
    finally:
        del os.environ["NVIDIA_TF32_OVERRIDE"]
    assert (outcome.ok, outcome.failed) == (1, 0)
    return directory / "run"


def test_record_and_raw_files(finished_run: Path) -> None:
    [record] = store.read(finished_run / "trials.jsonl")
    assert record["status"] == "ok" and record["error"] is None
    assert record["config"] == {"precision": "fp32", "gpus": 2}
    raw = f"raw/{record['config_id']}-t0-a0/"
    assert {raw + f for f in ("launch.json", "result.json", "stderr.log", "stdout.log")} <= set(
        record["artifacts"])
    assert record["wall_s"] > record["metrics"]["train_time_s"] > 0
    assert (finished_run / "spec.toml").exists() and (finished_run / "env.json").exists()


def test_metrics_are_plausible(finished_run: Path) -> None:
    [record] = store.read(finished_run / "trials.jsonl")
    m = record["metrics"]
    assert m["throughput_samples_s"] > 0
    # 2 ranks x 20 images x 2 epochs were trained in train_time_s (41 trimmed to 40)
    assert m["throughput_samples_s"] * m["train_time_s"] == pytest.approx(80)
    assert 0.0 <= m["test_accuracy"] <= 1.0
    assert len(m["epoch_time_s"]) == 2 and len(m["first_batch_latency_s"]) == 2
    assert sum(m["epoch_time_s"]) == pytest.approx(m["train_time_s"], rel=0.05, abs=0.05)
    assert 0.0 < m["step_time_median_s"] < m["train_time_s"]
    assert 0.0 <= m["data_wait_fraction"] <= 1.0
    # the loader's next() and the copy (on CPU: device-side normalisation) are timed apart
    assert m["data_wait_fraction"] + m["h2d_wait_fraction"] <= 1.0
    assert m["data_wait_s"] > 0 and m["h2d_wait_s"] >= 0
    assert m["data_wait_s"] == pytest.approx(m["data_wait_fraction"] * m["train_time_s"], rel=0.2)
    assert m["peak_mem_bytes"] > 10 * 2**20
    assert m["h2d_time_s"] is None and m["gpu_util_mean"] is None  # CPU run: nothing to measure
    assert record["unmeasured"]["h2d_time_s"] == "CPU run: there is no host-to-device copy"


# on CPU, what a rank can measure (CPU time, affinity) and what it cannot (GPU energy, NVML's
# processes, RAPL in this VM, DALI threads with the torch loader, NUMA without the probe)
MEASURED_ON_CPU = ("rank_cpu_s", "workers_cpu_s", "cpu_cores_mean", "rank_cores_mean", "workers_cores_mean")
NOT_MEASURED_ON_CPU = ("h2d_time_s", "gpu_util_mean", "nvml_process_mem_bytes", "energy_j",
                       "energy_per_sample_j", "mean_power_w", "stray_contexts",
                       "dali_threads_cpu_s", "dali_threads_cores_mean", "local_page_fraction",
                       "cpus_on_gpu_node_fraction", "far_dram_count", "near_dram_count",
                       "far_dram_fraction", "gpu_busy_fraction", "probe_busy_s_per_step",
                       "probe_kernels_per_step", "probe_aten_ops_per_step")


def test_every_metric_is_measured_or_null_with_a_reason(finished_run: Path) -> None:
    [record] = store.read(finished_run / "trials.jsonl")
    m, why = record["metrics"], record["unmeasured"]
    assert m["rank_cpu_s"] > 0 and m["workers_cpu_s"] >= 0 and m["cpu_cores_mean"] > 0
    assert not set(MEASURED_ON_CPU) & set(why)
    for metric in NOT_MEASURED_ON_CPU:
        assert m[metric] is None and why[metric] and why[metric] != "None", metric
    # the VM may or may not expose RAPL: either a number or a reason, never 0 for "not read"
    assert (m["cpu_energy_j"] is None) == ("cpu_energy_j" in why)
    assert all(v is None or k not in why for k, v in m.items())  # a reason only for a null
    assert set(why) <= {k for k, v in m.items() if v is None}
    assert why["energy_j"] == "rank 0: CPU run: no GPU"
    # no GPU, no kernels: the trial has no operating point, and its record says why
    assert why["gpu_busy_fraction"] == "CPU run: there are no GPU kernels"
    assert record["bound"] == {"label": None, "gpu_busy_fraction": None, "threshold": 0.8,
                               "reason": "CPU run: there are no GPU kernels"}
    result = json.loads((finished_run / f"raw/{record['config_id']}-t0-a0/result.json").read_text())
    for rank in result["ranks"]:
        assert rank["affinity"]["rank"] == sorted(os.sched_getaffinity(0))
        assert rank["gpu_memory_by_process"] is None and rank["stray_contexts_reason"] == "CPU run: no GPU"


def test_result_records_ranks_flags_and_test_set(finished_run: Path) -> None:
    [record] = store.read(finished_run / "trials.jsonl")
    result = json.loads((finished_run / f"raw/{record['config_id']}-t0-a0/result.json").read_text())
    assert result["world_size"] == 2 and [r["rank"] for r in result["ranks"]] == [0, 1]
    assert len({r["pid"] for r in result["ranks"]}) == 2
    assert result["tf32_flags"] == {"cuda_matmul_allow_tf32": False, "cudnn_allow_tf32": False,
                                    "measured": None,  # CPU: no TF32 to measure
                                    "env": {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": None,
                                            "NVIDIA_TF32_OVERRIDE": None}}
    assert record["cleared_env"] == {"NVIDIA_TF32_OVERRIDE": "0"}  # what the caller had
    assert result["test_images"] == 64  # the whole (subset) test set, split over the ranks
    assert result["steps_per_epoch"] == 3
    for rank in result["ranks"]:
        # cuDNN never meets a new batch shape inside the clock
        assert rank["batch_sizes_timed"] == rank["batch_sizes_warmed"] == [4, 8]
        assert rank["parent_death"] == "pdeathsig"  # torchrun's agent is the direct parent
    assert result["pin_memory_effective"] is False
    timeline = result["timeline"]
    order = ["process_start", "imported", "dist_ready", "data_ready", "model_ready", "warmup_done",
             "clock_start", "train_done", "eval_done"]
    assert [timeline[k] for k in order] == sorted(timeline[k] for k in order)
