"""The vision workload on a real GPU: nccl, CUDA-event timings, pinned copies, NVML, precisions."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from multicard.plan import spec
from multicard.run import runner, store
from tests.helpers import DATA, trial_timeout, write_spec

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
SMALL = {"device": "cuda", "image_size": 64, "epochs": 2, "max_steps": 20, "batch_size": 32,
         "num_workers": 2, "train_subset": 4096, "test_subset": 512}


def run_grid(tmp_path: Path, grid: dict[str, list[Any]], **fixed: Any) -> list[dict[str, Any]]:
    path = write_spec(tmp_path, fixed={**SMALL, **fixed}, grid=grid,
                      trials={"count": 1, "timeout_s": trial_timeout(900)})
    outcome = runner.run(spec.load(path), tmp_path / "run", data_dir=DATA, echo=lambda _: None)
    records = store.read(tmp_path / "run" / "trials.jsonl")
    assert outcome.failed == 0, [r["error"] for r in records if r["error"]]
    return records


def result_of(tmp_path: Path, record: dict[str, Any]) -> dict[str, Any]:
    trial = tmp_path / "run" / f"raw/{record['config_id']}-t0-a0"
    return json.loads((trial / "result.json").read_text())


def test_one_gpu_trial_measures_copies_waits_utilisation_and_memory(tmp_path: Path) -> None:
    for record in run_grid(tmp_path, {"pin_memory": [False, True]}):
        m = record["metrics"]
        assert m["h2d_time_s"] > 0
        assert 0 < m["gpu_util_mean"] <= 1
        assert 0 < m["data_wait_fraction"] + m["h2d_wait_fraction"] < 1
        # NVML's charge to the process holds the CUDA context and the allocator's reserve; where
        # NVML cannot name the process (a sandbox's PID namespace), the record says why
        if m["nvml_process_mem_bytes"] is None:
            assert "PID" in record["unmeasured"]["nvml_process_mem_bytes"]
        else:
            assert m["nvml_process_mem_bytes"] > m["peak_mem_bytes"] > 0
        assert sum(m["epoch_time_s"]) == pytest.approx(m["train_time_s"], rel=0.05, abs=0.05)
        # the CUDA-event step times (device timeline) and the host clock agree over the same spans
        rank = result_of(tmp_path, record)["ranks"][0]
        assert sum(rank["step_times_s"]) == pytest.approx(sum(rank["step_span_host_s"]), rel=0.05)


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_tf32_flags_are_read_back_as_set(tmp_path: Path, precision: str) -> None:
    [record] = run_grid(tmp_path, {"precision": [precision]})
    flags = result_of(tmp_path, record)["tf32_flags"]
    expected = precision == "tf32"
    assert (flags["cuda_matmul_allow_tf32"], flags["cudnn_allow_tf32"]) == (expected, expected)
    # what cuBLAS and cuDNN really did, from the error against float64
    assert (flags["measured"]["matmul_tf32"], flags["measured"]["conv_tf32"]) == (expected, expected)
    assert set(flags["env"].values()) == {None}


def test_nvidia_tf32_override_in_the_callers_environment_does_not_reach_the_tf32_arm(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")  # would force TF32 off inside the libraries
    [record] = run_grid(tmp_path, {"precision": ["tf32"]})
    assert record["cleared_env"] == {"NVIDIA_TF32_OVERRIDE": "0"}
    assert result_of(tmp_path, record)["tf32_flags"]["measured"]["matmul_tf32"] is True


def test_fp64_bf16_and_nhwc_train(tmp_path: Path) -> None:
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    records = run_grid(tmp_path, {"precision": ["fp64", "bf16"], "layout": ["nchw", "nhwc"]},
                       cast="host")
    assert len(records) == 4 and all(r["status"] == "ok" for r in records)
    for record in records:
        result = result_of(tmp_path, record)
        expected = {"fp64": "float64", "bf16": "bfloat16"}[record["config"]["precision"]]
        assert result["host_dtype"] == expected
        assert record["metrics"]["train_loss"] == record["metrics"]["train_loss"]  # not NaN


def test_cudnn_benchmark_never_meets_a_new_shape_inside_the_clock(tmp_path: Path) -> None:
    [record] = run_grid(tmp_path, {"cudnn_benchmark": [True]}, max_steps=0, train_subset=1000)
    rank = result_of(tmp_path, record)["ranks"][0]
    assert rank["batch_sizes_timed"] == rank["batch_sizes_warmed"] == [8, 32]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_over_nccl(tmp_path: Path) -> None:
    [record] = run_grid(tmp_path, {"gpus": [2]})
    result = result_of(tmp_path, record)
    assert result["world_size"] == 2
    assert len({r["gpu_uuid"] for r in result["ranks"]}) == 2  # two different GPUs
    assert record["metrics"]["throughput_samples_s"] > 0


def test_a_gpu_trial_measures_its_energy_and_its_processes_memory(tmp_path: Path) -> None:
    [record] = run_grid(tmp_path, {"pin_memory": [True]}, epochs=3, max_steps=0)
    m = record["metrics"]
    # three epochs of 4096 images: seconds; NVML's counter reads a window of 5 s and more, and a
    # shorter one has no energy (null, with why: never another way of reading it)
    assert m["train_time_s"] > 1.0
    if m["train_time_s"] < 5.0:
        assert m["energy_j"] is None and m["mean_power_w"] is None and m["energy_per_sample_j"] is None
        assert "shorter than the 5 s the energy counter needs" in record["unmeasured"]["energy_j"]
        assert "energy_j" not in record["measured_how"]
    else:
        assert m["energy_j"] > 0 and record["measured_how"]["energy_j"] == "NVML counter"
        assert m["energy_per_sample_j"] == pytest.approx(m["energy_j"] / (3 * 4096), rel=0.01)
        assert 10 < m["mean_power_w"] < 1500  # one GPU's board power
    # the GPUs and the CPU packages together where both were read (RAPL: root), else null with why
    if m["node_energy_per_sample_j"] is None:
        assert record["unmeasured"]["node_energy_per_sample_j"].startswith(("the CPU packages: ",
                                                                            "the GPUs: "))
    else:
        assert m["node_energy_per_sample_j"] > m["energy_per_sample_j"]
    assert m["rank_cpu_s"] > 0 and m["workers_cpu_s"] > 0 and m["dali_threads_cpu_s"] is None
    rank = result_of(tmp_path, record)["ranks"][0]
    # the trial saw its own GPU only: torchrun's binding divides a node among the GPUs it sees
    launched = json.loads((tmp_path / "run" / f"raw/{record['config_id']}-t0-a0" / "launch.json").read_text())
    shown = launched["env_set"].get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    from multicard.measure import devices

    [mine] = devices.visible(devices.nvml_gpus(), shown)  # one GPU, and the one CUDA used
    assert mine.uuid == rank["gpu_uuid"]
    # the mid-epoch look came from outside the rank (the runner), and said what it cost there
    assert rank["observed_reason"] is None and rank["observed_s"]["gpu_processes"] > 0
    assert rank["affinity"]["workers"]  # the two DataLoader workers, alive mid-epoch
    if rank["gpu_memory_by_process"] is None:  # a sandbox's PID namespace hides our PIDs
        assert "PID" in rank["stray_contexts_reason"]
    else:  # one GPU: the rank's memory is on it, and nothing can be elsewhere
        own = [p for p in rank["gpu_memory_by_process"] if p["pid"] == rank["pid"]]
        assert [p["gpu"] for p in own] == [rank["gpu_uuid"]] and own[0]["bytes"] > 0
        assert m["stray_contexts"] == 0

