"""The Nsight Systems wrapper around one rank: one report per rank, SQLite exported beside it."""

from __future__ import annotations

import shutil
from pathlib import Path

# What the paper's metrics need (CUDA API, kernels, copies, NVTX, OS runtime), plus the cuDNN and
# cuBLAS ranges; device memory use over time; only the window the workload opens with
# cudaProfilerStart/Stop (the timed training, not start-up or evaluation). No CPU sampling or
# context-switch tracing: they need perf_event_open, which containers usually deny, and the
# metrics do not use them.
NSYS_PROFILE = (
    "profile",
    "--trace=cuda,nvtx,osrt,cudnn,cublas",
    "--sample=none",
    "--cpuctxsw=none",
    "--cuda-memory-usage=true",
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
