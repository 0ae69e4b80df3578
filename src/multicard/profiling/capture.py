"""In-rank instrumentation: named ranges and the capture window, one object per trace mode.

The training loop always calls `tracer.range(...)`, `tracer.start()`, `tracer.step()` and
`tracer.stop()`; with `--trace none` these are no-ops (a shared null context), so an untraced
trial runs the same code with nothing recorded.

- `nsys`: NVTX ranges, and cudaProfilerStart/Stop around the timed training, which is what
  `nsys profile --capture-range=cudaProfilerApi` records. nsys itself wraps the rank from outside.
- `torch`: the PyTorch profiler (Kineto) with `record_function` ranges and a wait/warm-up/active
  schedule: 6 steps around the first epoch boundary (3 before, 3 after, so the trace shows the
  pause), or the first 6 steps of a one-epoch run. One gzipped Chrome trace per rank.

Range names: `epoch_start <e>` (a marker at the start of epoch e), `data_wait`, `step`, `forward`,
`backward`, `optimizer_step`; the parser finds the pauses from the markers and `step`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

TRACE_STEPS = 6
_NULL = nullcontext()


@dataclass(frozen=True)
class TraceConfig:
    out_dir: Path
    rank: int
    steps_per_epoch: int
    epochs: int
    cuda: bool


class Tracer(Protocol):
    def range(self, name: str) -> AbstractContextManager[object]: ...
    def start(self) -> None: ...
    def step(self) -> None: ...
    def stop(self) -> None: ...


class NoTracer:
    def __init__(self, config: TraceConfig | None = None) -> None:
        pass

    def range(self, name: str) -> AbstractContextManager[object]:
        return _NULL

    def start(self) -> None:
        pass

    def step(self) -> None:
        pass

    def stop(self) -> None:
        pass


class NsysTracer(NoTracer):
    def __init__(self, config: TraceConfig) -> None:
        self.cuda = config.cuda

    def range(self, name: str) -> AbstractContextManager[object]:
        return torch.cuda.nvtx.range(name)

    def start(self) -> None:
        if self.cuda:
            torch.cuda.cudart().cudaProfilerStart()

    def stop(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()  # let queued kernels land inside the capture
            torch.cuda.cudart().cudaProfilerStop()


class TorchTracer(NoTracer):
    def __init__(self, config: TraceConfig) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if config.cuda else [])
        if config.epochs >= 2:  # straddle the first epoch boundary
            wait = max(0, config.steps_per_epoch - TRACE_STEPS // 2 - 1)
            warmup = 1 if config.steps_per_epoch > TRACE_STEPS // 2 else 0
        else:  # include the first epoch's start
            wait, warmup = 0, 0
        self.target = config.out_dir / f"trace-rank{config.rank}.json.gz"
        self.profiler = profile(
            activities=activities,
            schedule=schedule(wait=wait, warmup=warmup, active=TRACE_STEPS, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(str(self.target)),
        )

    def range(self, name: str) -> AbstractContextManager[object]:
        return torch.profiler.record_function(name)

    def start(self) -> None:
        self.profiler.start()

    def step(self) -> None:
        self.profiler.step()

    def stop(self) -> None:
        self.profiler.stop()


TRACERS: dict[str, Callable[[TraceConfig], Tracer]] = {
    "none": NoTracer,
    "nsys": NsysTracer,
    "torch": TorchTracer,
}
