"""The GPUs' view of a trial: device memory of its own processes only (or the growth over what was
in use before), stray contexts, utilisation."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multicard.measure import telemetry
from multicard.measure.telemetry import StrayContext


def test_only_the_trials_processes_are_counted() -> None:
    # another user's 40 GiB process on the same GPU is not the trial's memory
    processes = [(100, 3 * 2**30), (101, 2**30), (555, 40 * 2**30)]
    assert telemetry.trial_device_bytes(processes, {100, 101}, used_now=44 * 2**30,
                                        used_before=40 * 2**30) == (4 * 2**30, "per-process")


def test_where_nvml_cannot_name_the_trials_processes_the_growth_is_counted() -> None:
    # in a container NVML reports host PIDs: none of them is one of ours
    assert telemetry.trial_device_bytes([(98765, 3 * 2**30)], {100, 101}, used_now=45 * 2**30,
                                        used_before=41 * 2**30) == (4 * 2**30, "device-delta")
    # per-process numbers not reported (None)
    assert telemetry.trial_device_bytes([(100, None)], {100}, 10, 4) == (6, "device-delta")
    assert telemetry.trial_device_bytes([], {100}, used_now=3, used_before=5) == (0, "device-delta")


def test_a_ranks_own_memory_or_the_reason_it_cannot_be_read() -> None:
    assert telemetry.own_device_bytes([(7, 2**30), (8, 5)], 7) == (2**30, None)
    value, reason = telemetry.own_device_bytes([(9, 2**30)], 7)
    assert value is None and "PID namespace" in reason  # type: ignore[operator]
    assert telemetry.own_device_bytes([(7, None)], 7) == (
        None, "NVML does not report per-process memory on this system")


def nvml_stand_in(trial: list[int]) -> object:
    """The pynvml calls the trial sampler makes, answering for two GPUs: the trial's GPU-a and
    GPU-b, where a process of the trial (its pinning thread's context) holds 300 MiB."""
    from types import SimpleNamespace

    lists = {"GPU-a": [(trial[0], 4 << 30), (999, 1 << 30)], "GPU-b": [(trial[-1], 300 << 20)]}
    return SimpleNamespace(
        NVMLError=type("NVMLError", (Exception,), {}),
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda index: ["GPU-a", "GPU-b"][index],
        nvmlDeviceGetHandleByUUID=lambda uuid: uuid,
        nvmlDeviceGetUUID=lambda handle: handle,
        nvmlDeviceGetMemoryInfo=lambda handle: SimpleNamespace(used=5 << 30),
        nvmlDeviceGetComputeRunningProcesses=lambda handle: [
            SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in lists[handle]],
        nvmlDeviceGetTotalEnergyConsumption=lambda handle: 1000,
        nvmlShutdown=lambda: None)


def test_the_trial_sampler_sees_a_stray_context_on_a_gpu_outside_the_trial(
        monkeypatch: object, tmp_path: object) -> None:
    import json
    import sys

    from multicard.measure import devices

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        fake = nvml_stand_in([os.getpid(), child.pid])
        monkeypatch.setattr(telemetry, "_nvml_started", lambda: (fake, None))
        sampler = telemetry.TrialMemorySampler([devices.GpuIdentity(0, "GPU-a", None)], period_s=0.02)
        with sampler.watch(os.getpid()):
            time.sleep(0.2)
        sampler.write_processes(Path(str(tmp_path)) / telemetry.PROCESSES_FILE)
    finally:
        child.kill()
        child.wait()
    metrics = sampler.metrics()
    assert metrics["peak_device_mem_bytes"] == 4 << 30 and metrics["stray_contexts"] == 1
    assert "stray_contexts" not in sampler.unmeasured()
    kept = json.loads((Path(str(tmp_path)) / telemetry.PROCESSES_FILE).read_text())
    assert kept["trial_gpus"] == ["GPU-a"]
    # listed in pid order: the child's pid is lower than ours once the pids have wrapped around
    assert kept["processes"] == sorted([{"pid": os.getpid(), "gpu": "GPU-a", "bytes": 4 << 30},
                                        {"pid": child.pid, "gpu": "GPU-b", "bytes": 300 << 20}],
                                       key=lambda entry: entry["pid"])
    cpu_only = telemetry.TrialMemorySampler([])
    assert cpu_only.metrics()["stray_contexts"] is None
    assert cpu_only.unmeasured()["stray_contexts"] == "CPU run: no GPU"


def test_gpu_utilisation_counts_from_a_second_into_the_window_not_from_the_barrier(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from multicard.measure.telemetry import GpuUtilSampler

    now = {"t": 0.0, "gpu": 0}  # the sampler's clock, and what NVML says

    def settle(until: float) -> None:  # wait for a sample taken at `until` (the clock is ours)
        deadline = time.monotonic() + 30
        while not any(t >= until for t, _ in util.samples) and time.monotonic() < deadline:
            time.sleep(0.005)

    monkeypatch.setitem(sys.modules, "pynvml", SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetHandleByUUID=lambda uuid: uuid,
        nvmlDeviceGetUtilizationRates=lambda handle: SimpleNamespace(gpu=now["gpu"])))
    with GpuUtilSampler("GPU-a", period_s=0.001, clock=lambda: now["t"]) as util:
        settle(0.0)  # the barrier: no kernels
        now["gpu"] = 30  # NVML's sample still averages the idle time before the window
        now["t"] = 10.0
        util.mark_start()
        now["t"] = 10.5
        settle(10.5)
        assert util.mean() == pytest.approx(0.3)  # a window shorter than the lag: all of it
        now["gpu"] = 100
        now["t"] = 11.0
        settle(11.0)
    assert util.mean() == 1.0  # from a second in: neither the barrier nor the lag


def test_a_rank_holding_memory_on_another_gpu_is_a_stray_context() -> None:
    # two ranks on GPU-a and GPU-b; rank 1 (pid 20) and its pinning thread hold 500 MiB on GPU-a
    trains_on = {10: "GPU-a", 11: "GPU-a", 20: "GPU-b", 21: "GPU-b"}
    held = {"GPU-a": [(10, 8 << 30), (20, 500 << 20), (999, 1 << 30)],  # 999: someone else's
            "GPU-b": [(20, 8 << 30), (21, None)]}
    assert telemetry.stray_contexts(trains_on, held) == [StrayContext(20, "GPU-a", 500 << 20, "GPU-b")]
    assert telemetry.stray_contexts(trains_on, {"GPU-a": [(10, 1)], "GPU-b": [(20, 1)]}) == []


def test_memory_per_process_per_gpu_and_strays_seen_while_they_lived(monkeypatch: pytest.MonkeyPatch) -> None:
    from multicard.measure import telemetry

    me = os.getpid()
    looks = iter([({"GPU-a": [(me, 4 << 30)], "GPU-0": [(me, 300 << 20), (1, 9)]}, None),
                  ({"GPU-a": [(me, 6 << 30)], "GPU-0": []}, None)])  # the stray one ended
    monkeypatch.setattr(telemetry, "processes_on_gpus", lambda: next(looks))
    seen = telemetry.GpuProcesses("GPU-a")
    seen.look()
    seen.look()
    found = seen.record()
    assert found["gpu_memory_by_process"] == [{"pid": me, "gpu": "GPU-0", "bytes": 300 << 20},
                                              {"pid": me, "gpu": "GPU-a", "bytes": 6 << 30}]
    assert found["stray_contexts"] == [{"pid": me, "gpu": "GPU-0", "bytes": 300 << 20, "trains_on": "GPU-a"}]
    assert telemetry.GpuProcesses(None).record()["stray_contexts_reason"] == "CPU run: no GPU"
    mig = telemetry.GpuProcesses("MIG-5c1c")
    mig.look()
    assert mig.record()["stray_contexts"] is None
    assert mig.record()["stray_contexts_reason"] == (
        "a MIG instance: NVML's process lists are per physical GPU")


def test_from_outside_a_process_on_two_trial_gpus_strays_on_the_smaller() -> None:
    # a 2-GPU trial: rank 20 trains on GPU-b and its pinning thread holds 300 MiB on GPU-a; a
    # worker (30) of rank 10 holds memory on GPU-z, which is not the trial's
    held = {(10, "GPU-a"): 8 << 30, (20, "GPU-a"): 300 << 20, (20, "GPU-b"): 8 << 30,
            (30, "GPU-z"): 100 << 20}
    assert telemetry.strays_seen_from_outside(held, {"GPU-a", "GPU-b"}) == [
        StrayContext(20, "GPU-a", 300 << 20, "GPU-b"),
        StrayContext(30, "GPU-z", 100 << 20, "the trial's GPUs")]
    assert telemetry.strays_seen_from_outside({(10, "GPU-a"): 1, (20, "GPU-b"): 1}, {"GPU-a", "GPU-b"}) == []
