"""The clocks of the training loop, as small pieces that CPU tests can check without a GPU.

- `EventPool`: CUDA events made once per trial and reused. Events made and destroyed every step
  would put the harness's own cudaEventCreate/Destroy calls inside a trace's capture window.
- `StepClock`: one timestamp per step boundary, on the device timeline (events from a pool) or
  the host clock; read after the epoch's closing synchronize.
- `BatchTimer`: splits the host's wait for a batch into the loader's `next()` (`data_wait_s`)
  and the host-to-device copy (`h2d_wait_s`). A pageable copy blocks the host until the stream
  has drained the queued GPU work, so counting it as data wait would charge GPU compute to the
  loader (the pin_memory comparison).
- `start_together`: every rank's samplers run before the barrier, so the clocks start together.
- `warmup_batch_sizes`: every batch size the timed loop will see, so cuDNN's autotuner
  (`cudnn_benchmark`) never tunes inside the clock for the short last batch.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")
B = TypeVar("B")


class Event(Protocol):
    """What the clocks use of `torch.cuda.Event(enable_timing=True)`."""

    def record(self) -> None: ...
    def elapsed_time(self, end: Any) -> float: ...  # milliseconds


class EventPool:
    """`size` events from `make_event`, made now; `take()` hands them out in turn until `reset()`.

    Each event is recorded once here: PyTorch creates the CUDA event lazily at its first record,
    which would otherwise happen inside the timed (and traced) epoch."""

    def __init__(self, size: int, make_event: Callable[[], Event]) -> None:
        self.events = [make_event() for _ in range(size)]
        for event in self.events:
            event.record()
        self.used = 0

    def take(self) -> Event:
        if self.used == len(self.events):
            raise RuntimeError(f"more than {len(self.events)} events asked for in one epoch")
        self.used += 1
        return self.events[self.used - 1]

    def reset(self) -> None:
        self.used = 0

    def taken(self) -> list[Event]:
        return self.events[:self.used]


class StepClock:
    """Timestamps of step boundaries: CUDA events (recorded on the current stream, no sync) when
    a `make_event` is given, else `time.perf_counter()`; `marks` is the most per epoch."""

    def __init__(self, marks: int, make_event: Callable[[], Event] | None = None) -> None:
        self.pool = EventPool(marks, make_event) if make_event else None
        self.host: list[float] = []

    def start_epoch(self) -> None:
        if self.pool:
            self.pool.reset()
        self.host = []

    def mark(self) -> None:
        if self.pool:
            self.pool.take().record()
        else:
            self.host.append(time.perf_counter())

    def intervals_s(self) -> list[float]:
        """Seconds between consecutive marks of this epoch (after a device synchronize)."""
        if self.pool:
            events = self.pool.taken()
            return [a.elapsed_time(b) / 1000.0 for a, b in itertools.pairwise(events)]
        return [b - a for a, b in itertools.pairwise(self.host)]


class BatchTimer(Generic[B]):
    """Host seconds blocked in the loader's `next()` and in the copy to the device, apart.

    The first batch of an epoch is timed from `epoch_start` (the DataLoader's workers start there:
    the pre-epoch pause is data wait, not copy)."""

    def __init__(self) -> None:
        self.data_wait_s = 0.0
        self.h2d_wait_s = 0.0
        self.first_waits: list[float] = []

    def next_batch(self, batches: Iterator[T], to_device: Callable[[T], B],
                   epoch_start: float | None = None,
                   ranges: Callable[[str], AbstractContextManager[object]] | None = None) -> B:
        t_wait = time.perf_counter() if epoch_start is None else epoch_start
        with _range(ranges, "data_wait"):
            host = next(batches)
        t_copy = time.perf_counter()
        with _range(ranges, "h2d"):
            batch = to_device(host)
        t_done = time.perf_counter()
        self.data_wait_s += t_copy - t_wait
        self.h2d_wait_s += t_done - t_copy
        if epoch_start is not None:
            self.first_waits.append(t_copy - t_wait)
        return batch


def _range(ranges: Callable[[str], AbstractContextManager[object]] | None,
           name: str) -> AbstractContextManager[object]:
    return ranges(name) if ranges else nullcontext()


@runtime_checkable
class MarksStart(Protocol):
    """A sampler whose window can start after it was entered (energy counters, CPU times)."""

    def mark_start(self) -> None: ...


def start_together(samplers: list[AbstractContextManager[Any]], barrier: Callable[[], None],
                   stack: ExitStack) -> float:
    """Enter every sampler (NVML start-up takes a while), then meet the other ranks, then start
    the meters' windows and read the clock: no rank's clock starts while another rank is still
    starting its samplers, and no meter counts the wait at the barrier. Windows start in the
    order given and the stack closes them in reverse: list the GPU's meters last, so that their
    windows hold none of the other meters' reads (/proc scans, RAPL)."""
    for sampler in samplers:
        stack.enter_context(sampler)
    barrier()
    for sampler in samplers:
        if isinstance(sampler, MarksStart):
            sampler.mark_start()
    return time.perf_counter()


def warmup_batch_sizes(samples_per_rank: int, batch_size: int) -> list[int]:
    """The batch sizes an epoch of `samples_per_rank` samples yields: full, then a short last one."""
    sizes = [min(batch_size, samples_per_rank)]
    last = samples_per_rank % batch_size
    if last and samples_per_rank > batch_size:
        sizes.append(last)
    return sizes
