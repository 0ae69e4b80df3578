from __future__ import annotations

import numpy as np
import pytest
import torch

from multicard.data.mnist import MEAN, STD, Split
from multicard.data.scenario_a import UpsampledMNIST, upsample


def test_upsampled_sample_is_three_equal_normalised_channels() -> None:
    image = torch.zeros(28, 28, dtype=torch.uint8)
    image[10:18, 10:18] = 255
    x = upsample(image, 100)
    assert x.shape == (3, 100, 100) and x.dtype == torch.float32
    assert torch.equal(x[0], x[1]) and torch.equal(x[1], x[2])
    assert x[0, 0, 0].item() == pytest.approx((0 - MEAN) / STD)  # black background
    assert x[0, 50, 50].item() == pytest.approx((1 - MEAN) / STD)  # inside the white square
    assert x.min().item() >= (0 - MEAN) / STD - 1e-6 and x.max().item() <= (1 - MEAN) / STD + 1e-6


def test_native_size_is_only_normalised() -> None:
    image = torch.arange(28 * 28, dtype=torch.int32).remainder(256).to(torch.uint8).reshape(28, 28)
    x = upsample(image, 28)
    expected = (image.float() / 255 - MEAN) / STD
    assert torch.allclose(x[0], expected)


def test_dataset_returns_images_and_integer_labels() -> None:
    split = Split(np.zeros((4, 28, 28), dtype=np.uint8), np.array([3, 1, 4, 1], dtype=np.uint8))
    ds = UpsampledMNIST(split, 64)
    assert len(ds) == 4
    image, label, index = ds[2]
    assert image.shape == (3, 64, 64) and label == 4 and index == 2
    batch = torch.utils.data.default_collate([ds[i] for i in range(4)])
    assert batch[0].shape == (4, 3, 64, 64) and batch[0].is_contiguous()
    assert batch[1].tolist() == [3, 1, 4, 1] and batch[2].tolist() == [0, 1, 2, 3]
