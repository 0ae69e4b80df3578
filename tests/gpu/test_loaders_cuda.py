"""Loaders on a real GPU: pinned host batches, timed copies, DALI's GPU decoder and shards."""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from multicard.loaders import LOADERS
from tests.unit.loaders.test_loaders import N, config, tree  # noqa: F401  (fixture)

pytestmark = pytest.mark.gpu
needs_dali = pytest.mark.skipif(importlib.util.find_spec("nvidia.dali") is None,
                                reason="nvidia.dali is not installed")
CUDA0 = torch.device("cuda", 0)


def test_pin_memory_batches_are_pinned_and_copies_are_timed(tree: Path) -> None:  # noqa: F811
    cfg = dataclasses.replace(config(tree), device=CUDA0, pin_memory=True, num_workers=2)
    loader = LOADERS["torch"](cfg)
    host_images, _, _ = next(iter(loader.loader))  # type: ignore[attr-defined]
    assert host_images.is_pinned()
    batches = [loader.to_device(b) for b in loader.epoch(0)]
    torch.cuda.synchronize()
    assert all(b[0].is_cuda and b[1].is_cuda for b in batches)
    assert loader.h2d_seconds() > 0


def test_no_cuda_event_is_created_or_destroyed_inside_the_timed_epochs(
        tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    # Counted on the events themselves, not in a torch.profiler trace: Kineto leaves
    # cudaEventCreate, cudaEventCreateWithFlags and cudaEventDestroy out of its traces (its
    # CuptiCbidRegistry blocklists them as noise; older versions cudaEventRecord too), so a trace
    # shows none whatever the harness does. PyTorch creates an event's CUDA event at its first
    # record() and destroys it with the object: both are seen here.
    from multicard.measure.timing import StepClock

    made, first_recorded, destroyed = [], [], []

    class CountedEvent(torch.cuda.Event):  # type: ignore[misc]
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            self.recorded = False
            made.append(time.perf_counter())

        def record(self, stream: object = None) -> None:
            if not self.recorded:
                first_recorded.append(time.perf_counter())
                self.recorded = True
            super().record(stream)

        def __del__(self) -> None:
            destroyed.append(time.perf_counter())

    monkeypatch.setattr(torch.cuda, "Event", CountedEvent)
    loader = LOADERS["torch"](dataclasses.replace(config(tree), device=CUDA0))
    clock = StepClock(loader.steps_per_epoch + 1, lambda: torch.cuda.Event(enable_timing=True))
    torch.cuda.synchronize()
    window_start = time.perf_counter()
    for epoch in range(2):
        clock.start_epoch()
        for batch in loader.epoch(epoch):
            clock.mark()
            loader.to_device(batch)
        clock.mark()
        torch.cuda.synchronize()
        assert loader.h2d_seconds() > 0 and len(clock.intervals_s()) == loader.steps_per_epoch
    window_end = time.perf_counter()
    # the pools' events: two per copy and one per step boundary, made and first recorded before
    assert len(made) == 2 * loader.steps_per_epoch + loader.steps_per_epoch + 1
    inside = [t for t in made + first_recorded + destroyed if window_start <= t <= window_end]
    assert inside == [], f"{len(inside)} event(s) made, first recorded or destroyed inside the epochs"


def test_unpinned_batches_are_pageable(tree: Path) -> None:  # noqa: F811
    cfg = dataclasses.replace(config(tree), device=CUDA0, num_workers=1)
    loader = LOADERS["torch"](cfg)
    host_images, _, _ = next(iter(loader.loader))  # type: ignore[attr-defined]
    assert not host_images.is_pinned()


def test_nhwc_survives_pinning_and_the_copy(tree: Path) -> None:  # noqa: F811
    cfg = dataclasses.replace(config(tree), device=CUDA0, pin_memory=True, layout="nhwc",
                              num_workers=1)
    loader = LOADERS["torch"](cfg)
    images, _, _ = loader.to_device(next(loader.epoch(0)))
    assert images.is_cuda and images.is_contiguous(memory_format=torch.channels_last)


def test_a_host_cast_halves_the_bytes_of_the_copy(tree: Path) -> None:  # noqa: F811
    sizes = {}
    for dtype in ("float32", "float16"):
        loader = LOADERS["torch"](dataclasses.replace(config(tree), device=CUDA0, host_dtype=dtype))
        host, _, _ = next(loader.epoch(0))
        images, _, _ = loader.to_device((host, torch.zeros(16, dtype=torch.int64), torch.arange(16)))
        assert images.dtype == getattr(torch, dtype) and images.is_cuda
        sizes[dtype] = host.numel() * host.element_size()
    assert sizes["float16"] * 2 == sizes["float32"]


@needs_dali
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_dali_decodes_on_the_gpu_in_the_asked_layout(tree: Path, layout: str) -> None:  # noqa: F811
    loader = LOADERS["dali"](dataclasses.replace(config(tree), device=CUDA0, layout=layout))
    batches = [loader.to_device(b) for b in loader.epoch(0)]
    images, labels, _ = batches[0]
    assert images.is_cuda and labels.is_cuda and images.dtype == torch.float32
    assert images.shape == (16, 3, 32, 32)
    if layout == "nhwc":  # DALI wrote HWC: an NCHW view with channels_last strides
        assert images.is_contiguous(memory_format=torch.channels_last)
    else:
        assert images.is_contiguous()


@needs_dali
def test_dali_gpu_and_the_dataloader_decode_the_same_pixels(tree: Path) -> None:  # noqa: F811
    by_index = {}
    torch_loader = LOADERS["torch"](dataclasses.replace(config(tree), device=CUDA0))
    for batch in torch_loader.epoch(0):
        images, labels, indices = torch_loader.to_device(batch)
        by_index |= {int(i): (x, int(y)) for x, y, i in zip(images, labels, indices, strict=True)}
    dali = LOADERS["dali"](dataclasses.replace(config(tree), device=CUDA0))
    for images, labels, indices in dali.epoch(0):
        for x, y, i in zip(images, labels, indices, strict=True):
            expected, label = by_index[int(i)]
            assert int(y) == label
            # nvJPEG and libjpeg-turbo may round differently: a few 8-bit steps at most
            assert torch.allclose(x, expected, atol=3 / 255 / 0.3081 + 1e-6)


@needs_dali
@pytest.mark.parametrize("world", [2, 3])
def test_dali_gpu_shards_are_equal_and_disjoint(tree: Path, world: int) -> None:  # noqa: F811
    seen: Counter[int] = Counter()
    for rank in range(world):
        loader = LOADERS["dali"](dataclasses.replace(config(tree, world=world, rank=rank,
                                                            batch_size=10), device=CUDA0))
        batches = list(loader.epoch(0))
        assert all(len(labels) > 0 for _, labels, _ in batches)
        assert sum(len(labels) for _, labels, _ in batches) == (N - N % world) // world
        for _, _, indices in batches:
            seen.update(indices.tolist())
    assert seen == Counter(range(N - N % world))


@needs_dali
def test_dali_makes_its_first_gpu_batch_at_the_first_next(tree: Path) -> None:  # noqa: F811
    loader = LOADERS["dali"](dataclasses.replace(config(tree), device=CUDA0))
    assert loader.iterator._first_batch is None  # type: ignore[attr-defined]
    assert len(list(loader.epoch(0))) == loader.steps_per_epoch
