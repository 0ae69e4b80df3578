"""Device memory of a trial: its own processes only, or the growth over what was in use before."""

from __future__ import annotations

import os

import pytest

from multicard import telemetry


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


def test_a_trials_processes_are_its_launchers_tree_not_its_process_group() -> None:
    # torchrun starts each rank in a session of its own: only parent links find them
    parents = {10: 1, 11: 10, 12: 11, 13: 11, 14: 12, 20: 1, 21: 20}
    assert telemetry.descendants(10, parents) == {10, 11, 12, 13, 14}
    assert telemetry.descendants(21, parents) == {21}


def test_a_real_child_in_its_own_session_is_in_the_tree() -> None:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             start_new_session=True)
    try:
        tree = telemetry.process_tree(os.getpid())
        assert os.getpid() in tree and child.pid in tree and tree[child.pid] > 0
        assert os.getpgid(child.pid) != os.getpgrp()
    finally:
        child.kill()
        child.wait()


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
    import subprocess
    import sys
    import time
    from pathlib import Path

    from multicard import devices

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        fake = nvml_stand_in([os.getpid(), child.pid])
        monkeypatch.setattr(telemetry, "_nvml_or_none", lambda: fake)  # type: ignore[attr-defined]
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
    import sys
    import time
    from types import SimpleNamespace

    from multicard.telemetry import GpuUtilSampler

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
