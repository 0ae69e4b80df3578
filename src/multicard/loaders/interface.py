"""What every loader takes and gives: its flat settings (`LoaderConfig`), the `Loader` protocol, a
batch, and the samples every loader draws (`sample_indices`); the package docstring says why."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch

Batch = tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]


@dataclass(frozen=True)
class LoaderConfig:
    scenario: str  # "a": MNIST upsampled in the Dataset; "b": prepared files
    mnist_dir: Path
    tree: Path | None  # the Scenario B tree of this image size and format
    split: str
    image_size: int
    batch_size: int
    rank: int
    world: int
    seed: int
    subset: int  # first N images of the split; 0 = all
    epoch_samples: int  # > 0: a fixed, seeded random subset of this many images (max_steps)
    num_workers: int
    pin_memory: bool
    prefetch_factor: int
    persistent_workers: bool
    layout: str  # "nchw" | "nhwc" (channels_last)
    normalize: str  # "cpu" (in the workers, as in the paper) | "device" (after the copy)
    dali_threads: int
    dali_affinity: bool  # DALI pins its threads near the GPU (CUDA only)
    device: torch.device
    host_dtype: str = "float32"  # the dtype the loader casts batches to before the copy


class Loader(Protocol):
    steps_per_epoch: int
    samples_per_rank: int  # per epoch: every batch is full but the last
    pin_memory: bool  # as actually used (only with a CUDA device)

    def epoch(self, epoch: int) -> Iterator[Batch]:
        """Exactly `steps_per_epoch` batches as `next()` makes them; iterate to the end so the
        loader can reset. Each goes through `to_device` before use."""
        ...

    def to_device(self, batch: Batch) -> Batch:
        """The batch on the training device, normalised and in its memory format."""
        ...

    def h2d_seconds(self) -> float | None:
        """Host-to-device copy time of the last epoch (after a device sync); None if not measured."""
        ...

    def dead_workers(self) -> list[tuple[int, int]]:
        """(pid, exit code) of the loader's worker processes that died: what the rank knows of
        a failure, whatever exception reached it first (a negative code is the signal)."""
        ...


def sample_indices(total: int, subset: int, epoch_samples: int, seed: int,
                   world: int = 1) -> np.ndarray:
    """The dataset indices a loader draws from: the first `subset` (0 = all), then, when
    `epoch_samples` > 0, a fixed seeded random selection of that many, then the first multiple of
    `world` of them. Every loader uses this, so all of them train on the same images."""
    indices = np.arange(min(total, subset) if subset else total)
    if epoch_samples and epoch_samples < len(indices):
        chosen = np.random.default_rng(seed).choice(len(indices), size=epoch_samples, replace=False)
        indices = indices[np.sort(chosen)]
    return indices[:len(indices) - len(indices) % world]
