"""NVML's energy counter on a real GPU: a window of 5 s and more is read from it, a shorter one
is null with why, and the GPU's idle power is the counter's delta over 5 s with nothing on it."""

from __future__ import annotations

import time

import pytest
import torch

from multicard.measure import devices, energy, gpu_state

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")]


def test_the_counter_reads_a_5_s_window_and_nothing_shorter() -> None:
    [gpu] = devices.from_environment(1)
    with energy.GpuEnergyMeter(gpu.uuid) as short:
        time.sleep(0.5)
    found = short.energy()
    assert found.joules is None and "shorter than the 5 s the energy counter needs" in str(found.reason)
    with energy.GpuEnergyMeter(gpu.uuid) as meter:
        time.sleep(energy.MIN_COUNTER_WINDOW_S + 0.2)
    found = meter.energy()
    assert found.source == "counter" and found.reason is None
    assert 5.0 < energy.mean_power(found.joules, energy.MIN_COUNTER_WINDOW_S + 0.2) < 2000.0  # one board


def test_idle_power_is_read_over_5_s_on_every_gpu_given() -> None:
    gpus = devices.from_environment()
    record = gpu_state.idle_power(gpus)
    assert record["reason"] is None and [g["uuid"] for g in record["gpus"]] == [g.uuid for g in gpus]
    for entry in record["gpus"]:
        assert entry["window_s"] >= gpu_state.IDLE_WINDOW_S
        if entry["processes"]:  # a shared machine: another job on the GPU is no idle reading
            assert entry["watts"] is None and entry["reason"].startswith("not idle")
        else:
            assert 5.0 < entry["watts"] < 1000.0, entry  # an idle board draws tens of watts
