"""A real torchtune recipe on CPU through the runner: tiny Llama 3, generated assets, pin_memory hook."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from multicard.plan import spec
from multicard.run import runner, store
from multicard.workloads import llm
from tests.helpers import DATA, write_spec

pytestmark = pytest.mark.slow

TINY = {"device": "cpu", "model": "tiny", "data": "synthetic", "dtype": "fp32", "seq_len": 64,
        "max_steps": 5, "warmup_steps": 1}


@pytest.mark.e2e  # the fast tier's `tune run` trial
def test_lora_recipe_run_is_parsed_from_its_own_metric_log(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "mnist").symlink_to(DATA / "mnist", target_is_directory=True)
    path = write_spec(tmp_path, fixed=TINY, grid={"pin_memory": [True]}, experiment_workload="llm")
    outcome = runner.run(spec.load(path), tmp_path / "run", data_dir=data, echo=lambda _: None)
    assert outcome.ok == 1
    [record] = store.read(tmp_path / "run" / "trials.jsonl")
    assert record["random_weights"] is True
    trial = tmp_path / "run" / f"raw/{record['config_id']}-t0-a0"
    [log] = (trial / "logs").glob("log_*.txt")
    steps = llm.parse_metric_log(log.read_text())  # torchtune's own DiskLogger lines
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]
    assert all("wall_time" in s and "tokens_per_second_per_gpu" in s for s in steps)
    m = record["metrics"]
    assert m["steps"] == 5 and m["step_time_median_s"] > 0 and m["tokens_per_s_per_gpu"] > 0
    assert m["peak_process_mem_bytes"] > 100 * 2**20
    assert m["peak_mem_active_bytes"] is None  # torchtune does not report memory on CPU
    assert record["unmeasured"]["peak_mem_active_bytes"] == "torchtune logs no device memory on CPU"
    assert m["peak_device_mem_bytes"] is None and record["unmeasured"]["peak_device_mem_bytes"] == \
        "CPU run: no GPU"
    # the resource evidence the runner takes from outside: the launch's CPU (torchrun, the rank
    # and what they waited for), measured on CPU too; energy and NVML's process lists not
    assert m["launch_cpu_s"] > 0 and 0 < m["launch_cpu_cores_mean"] <= os.cpu_count()
    assert m["launch_cpu_cores_mean"] == pytest.approx(m["launch_cpu_s"] / record["wall_s"], rel=0.1)
    for metric in ("energy_j", "energy_per_token_j", "mean_power_w", "stray_contexts"):
        assert m[metric] is None and record["unmeasured"][metric] == "CPU run: no GPU", metric
    assert set(record["unmeasured"]) <= {k for k, v in m.items() if v is None}
    stderr = (trial / "stderr.log").read_text()
    assert "multicard: StatefulDataLoader pin_memory=True (MULTICARD_PIN_MEMORY)" in stderr
    assert (data / "llm" / "weights" / "random-tiny-seed0" / "consolidated.00.pth").exists()


def test_a_traced_llm_trial_has_its_torchtune_traces_parsed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "mnist").symlink_to(DATA / "mnist", target_is_directory=True)
    fixed = {**TINY, "max_steps": 7}  # torchtune's profiler: 2 waiting, 1 warm-up, 3 active steps
    path = write_spec(tmp_path, fixed=fixed, grid={"method": ["lora"]}, experiment_workload="llm",
                      trials={"count": 1, "trace": "torch", "trace_count": 1, "timeout_s": 600})
    outcome = runner.run(spec.load(path), tmp_path / "run", data_dir=data, echo=lambda _: None)
    assert outcome.ok == 2  # the timing trial and the traced one
    traced = [r for r in store.read(tmp_path / "run" / "trials.jsonl") if r["trace"] == "torch"]
    [(name, summary)] = traced[0]["trace_metrics"].items()
    # torchtune writes profiling/iteration_<N>/<worker>.pt.trace.json.gz, below the trial's top level
    assert "/profiling/iteration_" in name and name.endswith(".pt.trace.json.gz")
    assert summary["format"] == "kineto-json" and "error" not in summary
    assert (tmp_path / "run" / name).exists()
