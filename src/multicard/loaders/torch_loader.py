"""The `torch` loader: DataLoader + DistributedSampler, CPU workers, timed host-to-device copy."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler

from multicard.loaders.datasets import collate_for, finish_on_device, make_dataset, training_subset
from multicard.loaders.interface import Batch, LoaderConfig
from multicard.measure.timing import EventPool


class TorchLoader:
    def __init__(self, config: LoaderConfig) -> None:
        self.config = config
        self.cuda = config.device.type == "cuda"
        # Pinning needs an accelerator; on a CPU-only run it is switched off here, once, rather
        # than letting every DataLoader warn about it.
        self.pin_memory = config.pin_memory and self.cuda
        dataset = training_subset(config, make_dataset(config, config.split))
        # The samples are a multiple of the world size (sample_indices), so the sampler gives
        # every rank the same number without padding by repeated samples.
        self.sampler: DistributedSampler[Any] = DistributedSampler(
            dataset, num_replicas=config.world, rank=config.rank, shuffle=True, seed=config.seed)
        workers = config.num_workers > 0
        self.loader = DataLoader(
            dataset, batch_size=config.batch_size, sampler=self.sampler,
            num_workers=config.num_workers, pin_memory=self.pin_memory, drop_last=False,
            collate_fn=collate_for(config),
            prefetch_factor=config.prefetch_factor if workers else None,
            persistent_workers=config.persistent_workers and workers,
        )
        self.steps_per_epoch = len(self.loader)
        self.samples_per_rank = len(self.sampler)
        # two events per copy, made once: none are created or destroyed inside the timed epochs
        self.copies = EventPool(2 * self.steps_per_epoch,
                                lambda: torch.cuda.Event(enable_timing=True)) if self.cuda else None

    def epoch(self, epoch: int) -> Iterator[Batch]:
        self.sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
        if self.copies:
            self.copies.reset()
        self.iterator = iter(self.loader)  # non-persistent workers start at its first next()
        self.failed: list[tuple[int, int]] | None = None  # set once a worker is found dead
        try:
            yield from self.iterator
        except Exception:
            self._stop_after_failure()
            raise

    def dead_workers(self, wait_s: float = 2.0) -> list[tuple[int, int]]:
        """Workers of the current epoch that exited with a non-zero code. Called after an
        exception: a killed worker's socket can reset (ConnectionResetError) a moment before the
        kernel has reaped it, so this waits up to `wait_s` for one to report its code. Once one
        is found dead the iterator is shut down (_stop_after_failure) and the answer kept."""
        if getattr(self, "failed", None) is None:
            self._stop_after_failure(wait_s)
        return list(self.failed or [])

    def _dead(self, wait_s: float) -> list[tuple[int, int]]:
        workers = getattr(getattr(self, "iterator", None), "_workers", [])
        deadline = time.monotonic() + wait_s
        while True:
            dead = [(w.pid, w.exitcode) for w in workers if not w.is_alive() and w.exitcode]
            if dead or not workers or time.monotonic() > deadline:
                return dead
            time.sleep(0.05)

    def _stop_after_failure(self, wait_s: float = 2.0) -> None:
        """The dead workers named and, where there are any, the iterator shut down. Once a
        worker has died, the DataLoader's SIGCHLD handler raises again at every later child's
        exit while the iterator's worker pids stay registered, anywhere in the rank (or in a test
        process, long after); shutting the iterator down unregisters them."""
        with _sigchld_quiet():
            dead = self._dead(wait_s)
            if not dead:
                return
            self.failed = dead
            shutdown = getattr(getattr(self, "iterator", None), "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()

    def to_device(self, batch: Batch) -> Batch:
        images, labels, indices = batch
        if not self.copies:
            return finish_on_device(images, self.config), labels, indices
        start, end = self.copies.take(), self.copies.take()
        start.record()  # events on the current stream: they time the copy, not the host
        images = images.to(self.config.device, non_blocking=True)
        labels = labels.to(self.config.device, non_blocking=True)
        end.record()
        return finish_on_device(images, self.config), labels, indices

    def h2d_seconds(self) -> float | None:
        if not self.copies:
            return None
        events = self.copies.taken()
        return sum(a.elapsed_time(b) for a, b in zip(events[::2], events[1::2], strict=True)) / 1000.0


@contextlib.contextmanager
def _sigchld_quiet() -> Iterator[None]:
    """The DataLoader's SIGCHLD handler raises "worker ... is killed" at every child's exit
    once a worker has died; while the dead worker is being named (after the first such error),
    another child ending must not raise it again in the middle of the naming."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, previous if previous is not None else signal.SIG_DFL)
