from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from multicard.data import mnist
from multicard.errors import InputError
from tests.helpers import DATA


def test_original_files_decode_to_the_published_shapes_and_counts() -> None:
    train = mnist.load(DATA / "mnist", "train")
    test = mnist.load(DATA / "mnist", "test")
    assert train.images.shape == (60000, 28, 28) and train.images.dtype == np.uint8
    assert test.images.shape == (10000, 28, 28)
    # label counts from data/mnist/SOURCE.md
    assert np.bincount(test.labels).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert np.bincount(train.labels)[0] == 5923
    assert train.images.mean() / 255 == pytest.approx(mnist.MEAN, abs=1e-4)


def test_limit_keeps_the_first_images() -> None:
    assert len(mnist.load(DATA / "mnist", "test", limit=100).labels) == 100


def copy_mnist(tmp_path: Path) -> Path:
    target = tmp_path / "mnist"
    shutil.copytree(DATA / "mnist", target)
    return target


def test_corrupt_file_is_named_with_both_digests(tmp_path: Path) -> None:
    target = copy_mnist(tmp_path)
    victim = target / "t10k-labels-idx1-ubyte.gz"
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(InputError) as info:
        mnist.load(target, "train")  # any load verifies every file
    assert str(victim) in str(info.value)
    assert mnist.SHA256[victim.name] in str(info.value)


def test_missing_file_is_named(tmp_path: Path) -> None:
    target = copy_mnist(tmp_path)
    (target / "train-images-idx3-ubyte.gz").unlink()
    with pytest.raises(InputError, match=r"train-images-idx3-ubyte\.gz: missing MNIST file"):
        mnist.verify(target)


def test_read_idx_refuses_a_file_that_is_not_idx(tmp_path: Path) -> None:
    import gzip

    bogus = tmp_path / "x.gz"
    bogus.write_bytes(gzip.compress(b"\x00\x00\x09\x99" + b"\x00" * 8))
    with pytest.raises(InputError, match="not an IDX file"):
        mnist.read_idx(bogus)


def test_prepared_data_goes_to_the_cache_dir_when_an_image_names_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert mnist.derived_root(tmp_path / "data") == tmp_path / "data"
    monkeypatch.setenv("MULTICARD_CACHE_DIR", str(tmp_path / "cache"))  # a read-only image's bind
    assert mnist.derived_root(tmp_path / "data") == tmp_path / "cache"
