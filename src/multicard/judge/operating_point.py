"""Is a trial GPU-bound or host-bound? The label beside every vision trial and every verdict.

A precision or layout claim is about the GPU's arithmetic; it can only show where the GPU's work
sets the pace of a step. On the H200 run, MobileNetV2 at 100 px and batch 64 kept the GPU busy
5-12 ms of a ~30 ms step: the host (Python, ATen dispatch, kernel launches, DDP's bookkeeping)
set the pace, and FP16 read slower than FP64. So each trial carries:
- `gpu_busy_fraction`: the step probe's compute-kernel time per step over the trial's own median
  timed step (workloads.vision.busy_fraction; profiling.step_probe says how it is read);
- the label: `GPU-bound` where that share is at least GPU_BOUND_AT, `host-bound` below it, and
  none (with why) where there was no probe (CPU runs, `probe_steps = 0`, LLM trials).
A config's label is its trials' (`mixed` where they differ); a claim judged on host-bound
configs says so beside its verdict (judge.claims).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from multicard.profiling.step_probe import GPU_BOUND, GPU_BOUND_AT, HOST_BOUND, label

__all__ = ["GPU_BOUND", "GPU_BOUND_AT", "HOST_BOUND", "MIXED", "combined", "config_label", "label",
           "trial_bound"]
MIXED = "mixed"


def trial_bound(workload: str, metrics: Mapping[str, Any], unmeasured: Mapping[str, str]) -> dict[str, Any]:
    """The record's `bound` entry: the label, the share it was read from, the threshold, and why
    there is none where there is none."""
    if workload != "vision":
        return {"label": None, "gpu_busy_fraction": None, "threshold": GPU_BOUND_AT,
                "reason": "LLM trials run torchtune's own loop, which the step probe does not enter"}
    fraction = metrics.get("gpu_busy_fraction")
    reason = None if fraction is not None else unmeasured.get("gpu_busy_fraction", "no step probe")
    return {"label": label(fraction), "gpu_busy_fraction": fraction, "threshold": GPU_BOUND_AT,
            "reason": reason}


def config_label(records: Iterable[Mapping[str, Any]]) -> str | None:
    """One config's label from its ok trials' records (combined)."""
    return combined((r.get("bound") or {}).get("label") for r in records if r.get("status") == "ok")


def combined(labels: Iterable[str | None]) -> str | None:
    """Trials' labels as one: theirs where they agree, `mixed` where they differ, None where no
    trial has one."""
    found = {found for found in labels if isinstance(found, str)}
    if not found:
        return None
    return found.pop() if len(found) == 1 else MIXED
