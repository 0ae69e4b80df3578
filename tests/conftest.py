"""Skip tests marked `gpu` where CUDA is unavailable; keep every test's prepared data where the
test puts it."""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # the images set MULTICARD_CACHE_DIR for their runs; a test that names its data folder
    # (MULTICARD_DATA_DIR, --data-dir) expects what is prepared from it there, not in a cache the
    # smoke run filled. Dropped before any fixture, module-scoped ones included; a test that wants
    # it sets it itself.
    os.environ.pop("MULTICARD_CACHE_DIR", None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
