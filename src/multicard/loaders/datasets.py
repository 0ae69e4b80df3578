"""The torch Datasets behind the `torch` and `synthetic` loaders and evaluation.

Every item is `(image, label, index)`. Images are float32 (3, N, N), normalised with the MNIST
mean/std on the CPU, or uint8 when normalisation is left to the device.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Subset, default_collate

from multicard.data import mnist, scenario_b
from multicard.data.scenario_a import UpsampledMNIST, normalize
from multicard.errors import InputError
from multicard.loaders.interface import LoaderConfig, sample_indices

Item = tuple[torch.Tensor, int, int]


class ImageTree(Dataset[Item]):
    """Scenario B: one prepared file per image, decoded on every access (no caching)."""

    def __init__(self, tree: Path, split: str, normalize_on_cpu: bool) -> None:
        lines = (tree / f"{split}_index.txt").read_text().split("\n")
        self.paths = [str(tree / line.rsplit(" ", 1)[0]) for line in lines if line]
        self.labels = np.load(tree / f"labels_{split}.npy")
        self.format = scenario_b.read_description(tree)["format"]
        self.normalize_on_cpu = normalize_on_cpu

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> Item:
        image = decode(self.paths[index], self.format)
        if self.normalize_on_cpu:
            image = normalize(image.to(torch.float32).div_(255.0))
        return image, int(self.labels[index]), index


def decode(path: str, fmt: str) -> torch.Tensor:
    """A file of the tree -> uint8 (3, N, N); gray is repeated to three channels.

    JPEG and PNG are decoded by Pillow (libjpeg-turbo, zlib), as torchvision's ImageFolder does.
    """
    if fmt == "npy":
        gray = np.load(path)
    else:
        from PIL import Image

        with Image.open(path) as image:
            gray = np.array(image.convert("L"))  # a writable copy
    return torch.from_numpy(gray).expand(3, -1, -1)


def make_dataset(config: LoaderConfig, split: str) -> Dataset[Item]:
    """The Scenario A or B dataset of `split`, restricted to `config.subset` first images."""
    if config.scenario == "a":
        dataset: Dataset[Item] = UpsampledMNIST(mnist.load(config.mnist_dir, split), config.image_size)
        total = len(dataset)  # type: ignore[arg-type]
    else:
        tree = checked_tree(config)
        dataset = ImageTree(tree, split, normalize_on_cpu=config.normalize == "cpu")
        total = len(dataset)
    if config.subset and config.subset > total:
        raise InputError(f"subset of {config.subset} images but {split} has {total}")
    if config.subset and config.subset < total:
        dataset = Subset(dataset, range(config.subset))
    return dataset


def checked_tree(config: LoaderConfig) -> Path:
    if config.tree is None:
        raise InputError("Scenario B needs a prepared tree (multicard data prepare)")
    description = scenario_b.read_description(config.tree)
    if description["size"] != config.image_size:
        raise InputError(f"{config.tree}: images are {description['size']}px, "
                         f"the experiment asks for {config.image_size}px")
    return config.tree


def training_subset(config: LoaderConfig, dataset: Dataset[Item]) -> Dataset[Item]:
    """What one epoch draws from: everything, or the fixed selection of `epoch_samples`, trimmed
    to a multiple of the world size."""
    indices = sample_indices(len(dataset), 0, config.epoch_samples, config.seed,  # type: ignore[arg-type]
                             config.world)
    if len(indices) == len(dataset):  # type: ignore[arg-type]
        return dataset
    return Subset(dataset, indices.tolist())


def collate(items: list[Item], channels_last: bool,
            dtype: str = "float32") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """default_collate, then the batch in the requested memory format and, for normalised
    (floating) images, dtype: in the worker, on the CPU, before pinning and the copy."""
    images, labels, indices = default_collate(items)
    if images.is_floating_point():
        images = images.to(getattr(torch, dtype))
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images, labels, indices


def collate_for(config: LoaderConfig) -> functools.partial[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    return functools.partial(collate, channels_last=config.layout == "nhwc", dtype=config.host_dtype)


def finish_on_device(images: torch.Tensor, config: LoaderConfig) -> torch.Tensor:
    """Device-side normalisation (uint8 batches) and memory format; a no-op otherwise."""
    if images.dtype == torch.uint8:
        images = normalize(images.to(torch.float32).div_(255.0))
    if config.layout == "nhwc":
        images = images.contiguous(memory_format=torch.channels_last)
    return images
