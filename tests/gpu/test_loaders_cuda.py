"""Loaders on a real GPU: pinned host batches, timed copies, device-resident outputs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from multicard.loaders import LOADERS
from tests.unit.loaders.test_loaders import config, tree  # noqa: F401  (fixture)

pytestmark = pytest.mark.gpu


def test_pin_memory_batches_are_pinned_and_copies_are_timed(tree: Path) -> None:  # noqa: F811
    cfg = dataclasses.replace(config(tree), device=torch.device("cuda", 0), pin_memory=True,
                              num_workers=2)
    loader = LOADERS["torch"](cfg)
    host_images, _, _ = next(iter(loader.loader))  # type: ignore[attr-defined]
    assert host_images.is_pinned()
    batches = list(loader.epoch(0))
    torch.cuda.synchronize()
    assert all(b[0].is_cuda for b in batches)
    assert loader.h2d_seconds() > 0


def test_unpinned_batches_are_pageable(tree: Path) -> None:  # noqa: F811
    cfg = dataclasses.replace(config(tree), device=torch.device("cuda", 0), num_workers=1)
    loader = LOADERS["torch"](cfg)
    host_images, _, _ = next(iter(loader.loader))  # type: ignore[attr-defined]
    assert not host_images.is_pinned()


def test_nhwc_survives_pinning_and_the_copy(tree: Path) -> None:  # noqa: F811
    cfg = dataclasses.replace(config(tree), device=torch.device("cuda", 0), pin_memory=True,
                              layout="nhwc", num_workers=1)
    images, _, _ = next(LOADERS["torch"](cfg).epoch(0))
    assert images.is_cuda and images.is_contiguous(memory_format=torch.channels_last)
