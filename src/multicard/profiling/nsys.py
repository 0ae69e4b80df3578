"""The Nsight Systems wrapper around one rank: one report per rank, SQLite exported beside it."""

from __future__ import annotations

import shutil
from pathlib import Path

# The fewest trace domains the metrics and the breakdown read: CUDA (API calls, kernels, copies,
# memsets) and NVTX (the epoch and step ranges); only the window the workload opens with
# cudaProfilerStart/Stop (the timed training, not start-up or evaluation). OS runtime, cuDNN and
# cuBLAS ranges and device memory use over time are read by no metric and each slows the traced
# trial (a report shows traced / untraced time per config); no CPU sampling or context-switch
# tracing either: they need perf_event_open, which containers usually deny.
NSYS_PROFILE = (
    "profile",
    "--trace=cuda,nvtx",
    "--sample=none",
    "--cpuctxsw=none",
    "--cuda-memory-usage=false",
    "--capture-range=cudaProfilerApi",
    "--capture-range-end=stop",
    "--export=sqlite",
    "--force-overwrite=true",
)


def find_nsys() -> str | None:
    return shutil.which("nsys")


def wrapper(nsys: str, trial_dir: Path) -> list[str]:
    """`nsys profile ... --output=<trial>/rank<RANK>` (nsys expands %q{RANK} per process)."""
    return [nsys, *NSYS_PROFILE, f"--output={trial_dir}/rank%q{{RANK}}"]
