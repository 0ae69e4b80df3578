"""The training loop's clocks without a GPU: event reuse, the wait split, the start, warm-up sizes."""

from __future__ import annotations

import re
import time
from contextlib import ExitStack
from typing import Any

import pytest

from multicard.measure.timing import BatchTimer, EventPool, StepClock, start_together, warmup_batch_sizes
from tests.helpers import ROOT


class CountingEvent:
    """Records the times it is recorded at; elapsed_time in milliseconds, as CUDA events do."""

    made = 0

    def __init__(self) -> None:
        CountingEvent.made += 1
        self.at = 0.0

    def record(self) -> None:
        self.at = time.perf_counter()

    def elapsed_time(self, end: Any) -> float:
        return (end.at - self.at) * 1000.0


def test_step_clock_events_are_made_once_per_trial_not_per_step_or_epoch() -> None:
    CountingEvent.made = 0
    clock = StepClock(marks=6, make_event=CountingEvent)
    for _ in range(3):  # epochs
        clock.start_epoch()
        for _ in range(6):
            clock.mark()
        assert len(clock.intervals_s()) == 5
    assert CountingEvent.made == 6


def test_pool_events_are_recorded_once_when_made_and_refuse_overuse() -> None:
    recorded: list[int] = []

    class Event(CountingEvent):
        def record(self) -> None:
            recorded.append(id(self))

    pool = EventPool(2, Event)
    assert len(recorded) == 2  # PyTorch creates the CUDA event at its first record: do it now
    pool.take(), pool.take()
    with pytest.raises(RuntimeError, match="more than 2 events"):
        pool.take()
    pool.reset()
    assert pool.take() is pool.events[0]


def test_host_step_clock_measures_the_gaps_between_marks() -> None:
    clock = StepClock(marks=3)
    clock.start_epoch()
    for _ in range(3):
        clock.mark()
        time.sleep(0.02)
    assert all(0.015 < gap < 0.2 for gap in clock.intervals_s())


class SlowLoader:
    """next() takes `wait` seconds, the copy `copy` seconds (a pageable copy that blocks)."""

    def __init__(self, wait: float, copy: float, batches: int) -> None:
        self.wait, self.copy, self.batches = wait, copy, batches

    def epoch(self) -> Any:
        for i in range(self.batches):
            time.sleep(self.wait)
            yield i

    def to_device(self, batch: int) -> int:
        time.sleep(self.copy)
        return batch * 10


def test_the_loaders_next_and_the_copy_are_timed_apart() -> None:
    loader = SlowLoader(wait=0.01, copy=0.05, batches=4)
    timer: BatchTimer[int] = BatchTimer()
    batches = loader.epoch()
    start = time.perf_counter()
    got = [timer.next_batch(batches, loader.to_device, start if i == 0 else None) for i in range(4)]
    assert got == [0, 10, 20, 30]
    assert 0.04 <= timer.data_wait_s < 0.15  # 4 x 10 ms: the copy is not in it
    assert 0.2 <= timer.h2d_wait_s < 0.4  # 4 x 50 ms
    assert len(timer.first_waits) == 1 and 0.01 <= timer.first_waits[0] < 0.05


def test_the_first_wait_counts_from_the_epoch_start() -> None:
    timer: BatchTimer[int] = BatchTimer()
    epoch_start = time.perf_counter()
    time.sleep(0.03)  # worker start-up before the first next()
    timer.next_batch(iter([1]), lambda b: b, epoch_start)
    assert timer.first_waits[0] >= 0.03 and timer.data_wait_s >= 0.03


def test_samplers_start_before_the_barrier_and_the_clock_after_it() -> None:
    events: list[str] = []

    class Sampler:
        def __enter__(self) -> None:
            events.append("sampler started")

        def __exit__(self, *exc: object) -> None:
            events.append("sampler stopped")

    class Meter(Sampler):
        def mark_start(self) -> None:  # a meter's window starts after the barrier
            events.append("meter window starts")

    with ExitStack() as stack:
        t0 = start_together([Sampler(), Meter()], lambda: events.append("barrier"), stack)
        events.append("timed")
    assert events == ["sampler started", "sampler started", "barrier", "meter window starts", "timed",
                      "sampler stopped", "sampler stopped"]
    assert t0 <= time.perf_counter()


@pytest.mark.parametrize(("per_rank", "batch", "sizes"),
                         [(20, 8, [8, 4]), (16, 8, [8]), (5, 8, [5]), (64, 64, [64]),
                          (30000, 64, [64, 48])])
def test_warm_up_covers_every_batch_size_the_epoch_yields(per_rank: int, batch: int,
                                                          sizes: list[int]) -> None:
    assert warmup_batch_sizes(per_rank, batch) == sizes


def test_the_meter_listed_last_starts_last_and_stops_first() -> None:
    """RankMeters lists the GPU's meters last: their windows hold none of the CPU meters' reads."""
    events: list[str] = []

    class Meter:
        def __init__(self, name: str) -> None:
            self.name = name

        def __enter__(self) -> None:
            events.append(f"{self.name} entered")

        def mark_start(self) -> None:
            events.append(f"{self.name} window starts")

        def __exit__(self, *exc: object) -> None:
            events.append(f"{self.name} window ends")

    with ExitStack() as stack:
        start_together([Meter("cpu"), Meter("gpu")], lambda: events.append("barrier"), stack)
    assert events == ["cpu entered", "gpu entered", "barrier", "cpu window starts", "gpu window starts",
                      "gpu window ends", "cpu window ends"]
    source = (ROOT / "src/multicard/measure/meters.py").read_text()
    listed = re.search(r"start_together\(\[(.*?)\],", source, re.S)
    assert listed is not None
    assert [n.strip() for n in listed.group(1).split(",")][-2:] == ["self.util", "self.gpu_energy"]
