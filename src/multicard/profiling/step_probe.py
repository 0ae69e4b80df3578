"""What one training step asks of the GPU and of the host: the probe behind a trial's bound label.

After a trial's timed epochs and its evaluation (nothing timed is left), the rank runs
`probe_steps` more training steps on the warm-up's resident batch under torch.profiler (CPU and
CUDA activity) and reads from the profiler's Chrome trace, per step:
- `probe_kernels_per_step`, `probe_kernel_s_per_step`: every kernel, and their summed durations;
- `probe_busy_s_per_step`: the time some compute kernel runs (the union of their intervals: two
  streams' overlapping kernels count once). NCCL's kernels are left out, since a collective's
  kernel spins while it waits for the other ranks: that is waiting, not computing;
- `probe_aten_ops_per_step`, `probe_launches_per_step`: ATen operators the host dispatched and
  cudaLaunchKernel calls it made (DDP's bookkeeping shows here);
- `probe_wall_s_per_step`: the host clock over the profiled steps, device synchronised. The
  profiler slows every launch (CUPTI), so this is not the trial's step time: the bound label
  holds the busy time against the timed epochs' own median step (judge.operating_point).
The Chrome trace is read, not the profiler's Python event list: its format is the same from
torch 2.2 to today, and profiling.parse reads it already (tested on committed traces).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from multicard.profiling import breakdown, parse

# The GPU computes for at least 80 % of a step: the host's part (launches, the loader's
# next(), the copy) is then too small to decide a ratio of the GPU's speeds; below it, a faster
# kernel mostly lengthens the GPU's idle gaps (judge.operating_point labels trials by it).
GPU_BOUND_AT = 0.8
GPU_BOUND, HOST_BOUND = "GPU-bound", "host-bound"


def label(fraction: float | None) -> str | None:
    """The operating point a GPU-busy share says: GPU-bound, host-bound, or None (not measured)."""
    if fraction is None:
        return None
    return GPU_BOUND if fraction >= GPU_BOUND_AT else HOST_BOUND


METRICS = ("probe_kernels_per_step", "probe_kernel_s_per_step", "probe_busy_s_per_step",
           "probe_aten_ops_per_step", "probe_launches_per_step", "probe_wall_s_per_step")


def tally(events: Sequence[Any], steps: int, wall_s: float) -> dict[str, float]:
    """The probe's metrics per step from a Chrome trace's events (dicts; others are skipped)."""
    complete = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]
    kernels = [e for e in complete if e.get("cat") == "kernel"]
    compute = [e for e in kernels if "nccl" not in str(e.get("name", "")).lower()]
    starts = np.array([round(float(e["ts"]) * 1000) for e in compute], dtype=np.int64)
    ends = starts + np.array([round(float(e["dur"]) * 1000) for e in compute], dtype=np.int64)
    aten = sum(1 for e in complete
               if e.get("cat") == "cpu_op" and str(e.get("name", "")).startswith("aten::"))
    launches = sum(1 for e in complete if e.get("cat") == "cuda_runtime"
                   and parse.api_name(str(e.get("name", ""))) == "cudaLaunchKernel")
    kernel_s = sum(float(e["dur"]) for e in kernels) / 1e6  # Kineto's durations are microseconds
    return {"probe_kernels_per_step": len(kernels) / steps, "probe_kernel_s_per_step": kernel_s / steps,
            "probe_busy_s_per_step": breakdown.covered(starts, ends) / 1e9 / steps,
            "probe_aten_ops_per_step": aten / steps, "probe_launches_per_step": launches / steps,
            "probe_wall_s_per_step": wall_s / steps}


# what only a GPU's activity can count: null, not 0, where the probe ran without one
GPU_COUNTS = ("probe_kernels_per_step", "probe_kernel_s_per_step", "probe_busy_s_per_step",
              "probe_launches_per_step")


def probe(step: Callable[[], None], steps: int, synchronize: Callable[[], None]) -> dict[str, float | None]:
    """Run `steps` steps under torch.profiler (the caller has warmed the step up) and tally them;
    without a GPU the GPU's counts are None (there was nothing to count them on)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    # CUDA activity only where there is a GPU (elsewhere the profiler warns and drops it)
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])]
    with tempfile.TemporaryDirectory() as scratch:
        with profile(activities=activities) as prof:
            synchronize()  # sync points: the window holds these steps' GPU work and nothing else
            started = time.perf_counter()
            for _ in range(steps):
                step()
            synchronize()
            wall_s = time.perf_counter() - started
        trace = Path(scratch) / "probe.json"
        prof.export_chrome_trace(str(trace))
        doc = json.loads(trace.read_text(encoding="utf-8", errors="replace"))
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    found: dict[str, float | None] = dict(tally(events, steps, wall_s))
    if ProfilerActivity.CUDA not in activities:
        found |= dict.fromkeys(GPU_COUNTS)
    return found
