"""The `synthetic` loader: one real batch, resident on the device, served every step.

It takes as many steps per epoch as the `torch` loader, with the same batch sizes (the last one
partial), so the difference in training time between the two is the cost of loading.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from multicard.loaders.datasets import collate, finish_on_device, make_dataset, training_subset
from multicard.loaders.interface import Batch, LoaderConfig


class SyntheticLoader:
    pin_memory = False

    def __init__(self, config: LoaderConfig) -> None:
        dataset = training_subset(config, make_dataset(config, config.split))
        per_rank = math.ceil(len(dataset) / config.world)  # type: ignore[arg-type]
        self.samples_per_rank = per_rank
        self.steps_per_epoch = math.ceil(per_rank / config.batch_size)
        self.last_size = per_rank - (self.steps_per_epoch - 1) * config.batch_size
        size = min(config.batch_size, len(dataset))  # type: ignore[arg-type]
        images, labels, indices = collate([dataset[i] for i in range(size)], channels_last=False,
                                          dtype=config.host_dtype)
        self.images = finish_on_device(images.to(config.device), config)
        self.labels = labels.to(config.device)
        self.indices = indices

    def epoch(self, epoch: int) -> Iterator[Batch]:
        for step in range(self.steps_per_epoch):
            n = self.last_size if step == self.steps_per_epoch - 1 else len(self.labels)
            yield self.images[:n], self.labels[:n], self.indices[:n]

    def to_device(self, batch: Batch) -> Batch:
        return batch  # resident on the device already

    def dead_workers(self) -> list[tuple[int, int]]:
        return []  # no worker processes

    def h2d_seconds(self) -> float | None:
        return None
