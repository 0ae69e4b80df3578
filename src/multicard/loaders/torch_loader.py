"""The `torch` loader: DataLoader + DistributedSampler, CPU workers, timed host-to-device copy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler

from multicard.loaders import Batch, LoaderConfig
from multicard.loaders.datasets import collate_for, finish_on_device, make_dataset, training_subset


class TorchLoader:
    def __init__(self, config: LoaderConfig) -> None:
        self.config = config
        self.cuda = config.device.type == "cuda"
        # Pinning needs an accelerator; on a CPU-only run it is switched off here, once, rather
        # than letting every DataLoader warn about it.
        self.pin_memory = config.pin_memory and self.cuda
        dataset = training_subset(config, make_dataset(config, config.split))
        # DistributedSampler pads every rank to ceil(n / world) samples by repeating the first
        # ones, so all ranks take the same number of steps.
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
        self._copies: list[tuple[Any, Any]] = []

    def epoch(self, epoch: int) -> Iterator[Batch]:
        self.sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
        self._copies = []
        for images, labels, indices in self.loader:  # non-persistent workers start here
            yield self._to_device(images), labels.to(self.config.device, non_blocking=True), indices

    def _to_device(self, images: torch.Tensor) -> torch.Tensor:
        if not self.cuda:
            return finish_on_device(images, self.config)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()  # events on the current stream: they time the copy, not the host
        images = images.to(self.config.device, non_blocking=True)
        end.record()
        self._copies.append((start, end))
        return finish_on_device(images, self.config)

    def h2d_seconds(self) -> float | None:
        if not self.cuda:
            return None
        return sum(a.elapsed_time(b) for a, b in self._copies) / 1000.0
