"""Skip tests marked `gpu` where CUDA is unavailable; keep every test's prepared data where the
test puts it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _own_cache_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # the images set MULTICARD_CACHE_DIR for their runs; a test that names its data folder
    # (MULTICARD_DATA_DIR, --data-dir) expects what is prepared from it there, not in a shared cache
    monkeypatch.delenv("MULTICARD_CACHE_DIR", raising=False)
    yield


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
