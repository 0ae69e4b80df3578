"""The three loaders behind one signature, on a small real Scenario B tree (CPU, DALI CPU ops)."""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from multicard.data import scenario_b
from multicard.loaders import LOADERS, LoaderConfig, sample_indices
from tests.helpers import DATA

N = 203  # odd: exercises uneven shards, padding and a partial last batch


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("loaders") / "32px-jpeg"
    scenario_b.prepare(scenario_b.Request(DATA / "mnist", out, 32, "jpeg", N), workers=2,
                       echo=lambda _: None, progress=False)
    return out


def config(tree: Path | None, **changes: object) -> LoaderConfig:
    base = LoaderConfig(
        scenario="b", mnist_dir=DATA / "mnist", tree=tree, split="train", image_size=32,
        batch_size=16, rank=0, world=1, seed=7, subset=0, epoch_samples=0, num_workers=0,
        pin_memory=False, prefetch_factor=2, persistent_workers=False, layout="nchw",
        normalize="cpu", dali_threads=1, dali_affinity=False, device=torch.device("cpu"))
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def epoch_batches(loader_name: str, cfg: LoaderConfig, epoch: int = 0) -> list:
    loader = LOADERS[loader_name](cfg)
    batches = [loader.to_device(b) for b in loader.epoch(epoch)]
    assert len(batches) == loader.steps_per_epoch
    return batches


@pytest.mark.parametrize("world", [1, 2, 3])
def test_torch_and_dali_give_the_same_shapes_dtypes_and_step_counts(tree: Path, world: int) -> None:
    for rank in range(world):
        torch_batches = epoch_batches("torch", config(tree, world=world, rank=rank))
        dali_batches = epoch_batches("dali", config(tree, world=world, rank=rank))
        assert len(torch_batches) == len(dali_batches)
        for (ti, tl, _), (di, dl, _) in zip(torch_batches, dali_batches, strict=True):
            assert ti.shape[1:] == di.shape[1:] == (3, 32, 32)
            assert ti.dtype == di.dtype == torch.float32
            assert tl.dtype == dl.dtype == torch.int64
        assert torch_batches[0][0].shape == dali_batches[0][0].shape


def test_both_loaders_decode_the_same_pixels_and_labels(tree: Path) -> None:
    by_index = {}
    for images, labels, indices in epoch_batches("torch", config(tree)):
        by_index |= {int(i): (x, int(y)) for x, y, i in zip(images, labels, indices, strict=True)}
    for images, labels, indices in epoch_batches("dali", config(tree)):
        for x, y, i in zip(images, labels, indices, strict=True):
            expected, label = by_index[int(i)]
            assert int(y) == label
            # one step of 8-bit JPEG rounding, normalised, is the most the decoders may differ by
            assert torch.allclose(x, expected, atol=1 / 255 / 0.3081 + 1e-6)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_loader_trains_on_the_same_samples_in_equal_shards(tree: Path, world: int) -> None:
    # 203 images: the first 203 - 203 % world, so every rank gets the same number, none twice
    # (the DistributedSampler no longer pads with repeats, DALI's shards never end empty)
    used = N - N % world
    for name in ("torch", "dali"):
        seen: Counter[int] = Counter()
        for rank in range(world):
            batches = epoch_batches(name, config(tree, world=world, rank=rank, batch_size=10))
            assert all(len(labels) > 0 for _, labels, _ in batches), (name, rank)
            assert sum(len(labels) for _, labels, _ in batches) == used // world, (name, rank)
            for _, _, indices in batches:
                seen.update(indices.tolist())
        assert seen == Counter(range(used)), name


def test_the_dali_iterator_makes_no_batch_before_the_first_next(tree: Path) -> None:
    loader = LOADERS["dali"](config(tree))
    assert loader.iterator._ever_scheduled is False  # type: ignore[attr-defined]
    assert loader.iterator._first_batch is None  # type: ignore[attr-defined]
    batches = [loader.to_device(b) for b in loader.epoch(0)]
    assert len(batches) == loader.steps_per_epoch and len(batches[0][1]) == 16


def test_the_torch_loader_yields_host_batches_and_finishes_them_in_to_device(tree: Path) -> None:
    loader = LOADERS["torch"](config(tree, normalize="device", layout="nhwc"))
    host_images, _, _ = next(loader.epoch(0))
    assert host_images.dtype == torch.uint8  # next() is the loader alone: no device-side work
    images, _, _ = loader.to_device((host_images, torch.zeros(16, dtype=torch.int64),
                                     torch.arange(16)))
    assert images.dtype == torch.float32
    assert images.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize(("dtype", "element_size"), [("float16", 2), ("bfloat16", 2),
                                                      ("float64", 8)])
def test_a_host_cast_makes_the_batch_in_the_precisions_dtype_before_the_copy(
        tree: Path, dtype: str, element_size: int) -> None:
    for name in ("torch", "synthetic"):
        loader = LOADERS[name](config(tree, host_dtype=dtype, num_workers=1))
        images, _, _ = next(loader.epoch(0))
        assert images.dtype == getattr(torch, dtype), name
        assert images.element_size() == element_size  # the bytes the copy moves follow it
        list(loader.epoch(0))


def test_nhwc_batches_are_channels_last(tree: Path) -> None:
    for name in ("torch", "dali", "synthetic"):
        images, _, _ = epoch_batches(name, config(tree, layout="nhwc"))[0]
        assert images.shape == (16, 3, 32, 32)
        assert images.is_contiguous(memory_format=torch.channels_last), name
        assert not images.is_contiguous(), name


def test_pin_memory_on_a_cpu_run_is_switched_off_once_without_warnings(tree: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = LOADERS["torch"](config(tree, pin_memory=True, num_workers=1))
        for _ in range(2):
            list(loader.epoch(0))
    assert loader.pin_memory is False
    assert not [w for w in caught if "pin_memory" in str(w.message)]


def test_synthetic_serves_one_resident_batch_with_the_torch_step_structure(tree: Path) -> None:
    for world in (1, 2):
        torch_sizes = [len(b[1]) for b in epoch_batches("torch", config(tree, world=world))]
        synthetic = epoch_batches("synthetic", config(tree, world=world))
        assert [len(b[1]) for b in synthetic] == torch_sizes
        assert all(b[0].data_ptr() == synthetic[0][0].data_ptr() for b in synthetic)


def test_device_normalisation_matches_cpu_normalisation(tree: Path) -> None:
    cpu = epoch_batches("torch", config(tree))
    device = epoch_batches("torch", config(tree, normalize="device"))
    for (a, _, ia), (b, _, ib) in zip(cpu, device, strict=True):
        assert torch.equal(ia, ib)
        assert torch.allclose(a, b, atol=1e-5)


def test_max_steps_budget_is_the_same_seeded_subset_for_every_loader(tree: Path) -> None:
    chosen = set(sample_indices(N, 0, 48, seed=7).tolist())
    assert len(chosen) == 48 and chosen == set(sample_indices(N, 0, 48, seed=7).tolist())
    for name in ("torch", "dali"):
        seen = {int(i) for _, _, ind in epoch_batches(name, config(tree, epoch_samples=48))
                for i in ind}
        assert seen == chosen, name
    assert sample_indices(N, 100, 0, 0).tolist() == list(range(100))


def test_scenario_a_through_the_torch_loader() -> None:
    cfg = config(None, scenario="a", subset=64, batch_size=32)
    batches = epoch_batches("torch", cfg)
    assert [b[0].shape for b in batches] == [(32, 3, 32, 32)] * 2
    assert sorted(int(i) for b in batches for i in b[2]) == list(range(64))
    assert np.isclose(float(batches[0][0].mean()), 0.0, atol=1.0)


@pytest.mark.parametrize("epoch_samples", [0, 48, 150, 10_000])
def test_every_loader_says_how_many_samples_a_rank_trains_on(tree: Path, epoch_samples: int) -> None:
    # a budget at or above the dataset's size keeps the whole (trimmed) set: a short last batch
    for name in ("torch", "dali", "synthetic"):
        loader = LOADERS[name](config(tree, world=2, epoch_samples=epoch_samples))
        sizes = [len(labels) for _, labels, _ in (loader.to_device(b) for b in loader.epoch(0))]
        assert loader.samples_per_rank == sum(sizes), name


def test_a_killed_worker_is_named_by_its_pid_and_signal(tree: Path) -> None:
    import os
    import signal

    loader = LOADERS["torch"](config(tree, num_workers=1))
    batches = loader.epoch(0)
    next(batches)
    assert loader.dead_workers(wait_s=0) == []  # all alive
    [worker] = loader.iterator._workers  # type: ignore[attr-defined]
    # the DataLoader's SIGCHLD handler raises in the main thread at any moment after the kill; a
    # kill in the middle of handing a batch's shared memory over reads as EOFError instead
    with pytest.raises((RuntimeError, ConnectionError, EOFError)):
        os.kill(worker.pid, signal.SIGKILL)
        list(batches)
    assert loader.dead_workers() == [(worker.pid, -signal.SIGKILL)]
    assert LOADERS["synthetic"](config(tree)).dead_workers() == []
