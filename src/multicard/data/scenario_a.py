"""Scenario A: MNIST upsampled on the fly inside the Dataset (docs/paper.md section 2.2).

Each 28x28 grayscale digit is scaled to [0, 1], resized to NxN with bilinear interpolation
(align_corners=False; the paper does not name its method), normalised with the MNIST mean/std and
repeated to 3 channels. The work happens in `__getitem__`, i.e. in DataLoader workers on the CPU,
which is the load the paper created on purpose.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from multicard.data.mnist import MEAN, STD, Split


class UpsampledMNIST(Dataset[tuple[torch.Tensor, int, int]]):
    """Items are (image, label, index): the index lets loaders report which samples they served."""

    def __init__(self, split: Split, image_size: int) -> None:
        # One shared uint8 tensor: workers inherit it copy-on-write instead of pickling 47 MB each.
        self.images = torch.from_numpy(split.images.copy())
        self.labels = torch.from_numpy(split.labels.astype("int64"))
        self.image_size = image_size

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        return upsample(self.images[index], self.image_size), int(self.labels[index]), index


def resize_unit(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 (..., 28, 28) -> float32 (..., size, size) in [0, 1]; bilinear, align_corners=False.

    Scenario B stores exactly these pixels (rounded to uint8), so both scenarios show the model
    the same images.
    """
    lead = images.shape[:-2]
    x = images.reshape(-1, 1, *images.shape[-2:]).to(torch.float32).div_(255.0)
    if size != x.shape[-1]:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return x.reshape(*lead, size, size)


def normalize(unit: torch.Tensor) -> torch.Tensor:
    """[0, 1] pixels -> MNIST-normalised values (in place)."""
    return unit.sub_(MEAN).div_(STD)


def upsample(image: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 (28, 28) -> normalised float32 (3, size, size)."""
    x = normalize(resize_unit(image, size))
    # expand() is a view; the collate function's stack makes the batch contiguous.
    return x.expand(3, size, size)
