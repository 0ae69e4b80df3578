"""A real GPU's settings and state through NVML, as env.json and gpu-state-end.json keep them."""

from __future__ import annotations

import pytest
import torch

from multicard.measure import environment, gpu_state

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")]


def test_every_gpu_has_its_limits_clocks_modes_and_link_read() -> None:
    found, why = gpu_state.every_gpu()
    assert why is None and found
    for gpu in found:
        state = gpu["state"]
        assert state["enforced_power_limit_w"] > 0 and state["sm_clock_mhz"] > 0
        assert isinstance(state["throttle_reasons"], list)
        assert state["compute_mode"] in gpu_state.COMPUTE_MODES.values()
        assert state["pcie_generation"] is None or state["pcie_generation"] >= 1
    env = environment.capture_env()
    assert all("state" in g for g in env["gpus"]) and env["torch"]["nccl"]


def test_the_clocks_held_down_counters_only_grow_between_two_reads() -> None:
    before, _ = gpu_state.every_gpu()
    x = torch.randn(4096, 4096, device="cuda")
    for _ in range(50):  # some work between the reads
        x = x @ x / 64
    torch.cuda.synchronize()
    after, _ = gpu_state.every_gpu()
    held = gpu_state.with_held_down(after, before)
    for gpu in held:
        assert gpu["state"]["held_down_ns"]["power"] is not None  # a datacenter GPU counts it
        assert all(s is None or s >= 0 for s in gpu["held_down_s"].values())
