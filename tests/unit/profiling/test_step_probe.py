"""The step probe's tally on hand-made Chrome-trace events, and the probe on this CPU with the
real profiler (no kernels here: its host side is what a CPU can check)."""

from __future__ import annotations

import pytest

from multicard.profiling import step_probe


def kernel(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}


def test_busy_time_is_the_union_of_compute_kernels_and_leaves_nccl_out() -> None:
    events = [
        kernel("sm90_xmma_fprop", 0.0, 10.0), kernel("elementwise", 5.0, 10.0),  # overlap: 15 us
        kernel("bn_fw", 20.0, 5.0),
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0.0, 100.0),  # waits for the others
        {"ph": "X", "cat": "cpu_op", "name": "aten::conv2d", "ts": 0.0, "dur": 1.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add_", "ts": 1.0, "dur": 1.0},
        {"ph": "X", "cat": "cpu_op", "name": "DistributedDataParallel.forward", "ts": 0.0, "dur": 9.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0.0, "dur": 3.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel_v7000", "ts": 3.0, "dur": 3.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernelExC", "ts": 6.0, "dur": 3.0},
        {"ph": "i", "cat": "kernel", "name": "an instant, not a kernel", "ts": 0.0},
        "not an event",
    ]
    found = step_probe.tally(events, steps=2, wall_s=0.5)
    assert found["probe_kernels_per_step"] == 2.0
    assert found["probe_kernel_s_per_step"] == pytest.approx(125e-6 / 2)
    assert found["probe_busy_s_per_step"] == pytest.approx(20e-6 / 2)
    assert found["probe_aten_ops_per_step"] == 1.0
    assert found["probe_launches_per_step"] == 1.0
    assert found["probe_wall_s_per_step"] == 0.25


def test_the_probe_profiles_real_steps_and_counts_their_aten_ops() -> None:
    import torch

    layer = torch.nn.Linear(8, 8)
    x = torch.ones(4, 8)

    def step() -> None:
        layer(x).sum().backward()

    found = step_probe.probe(step, steps=3, synchronize=lambda: None)
    # no GPU: nothing to count kernels on, so their counts are null, not 0
    assert all(found[key] is None for key in step_probe.GPU_COUNTS)
    # a linear layer's forward and backward and a sum: several ATen ops in every step
    assert found["probe_aten_ops_per_step"] >= 3
    assert found["probe_wall_s_per_step"] > 0
