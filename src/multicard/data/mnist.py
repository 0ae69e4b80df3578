"""Read the original MNIST IDX files (gzip) after checking each file's SHA-256.

The expected digests are the published ones (data/mnist/SOURCE.md); a missing or altered file is
an `InputError` that names it, never a silently different dataset. Only numpy is needed here.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from multicard.errors import InputError
from multicard.integrity import sha256_file

SHA256 = {
    "train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}
SPLITS = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
          "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}
IDX_MAGIC = {2051: 3, 2049: 1}  # images: 3 dims (n, rows, cols); labels: 1 dim (n)
MNIST_TRAIN, MNIST_TEST = 60_000, 10_000
# Pixel statistics of the training images scaled to [0, 1] (SOURCE.md "Content checks").
MEAN, STD = 0.1307, 0.3081


@dataclass(frozen=True)
class Split:
    images: np.ndarray  # uint8 (n, 28, 28)
    labels: np.ndarray  # uint8 (n,)


def default_root() -> Path:
    """Where data/mnist lives: $MULTICARD_DATA_DIR, else ./data, else the source checkout's data/."""
    if env := os.environ.get("MULTICARD_DATA_DIR"):
        return Path(env)
    here = Path.cwd() / "data"
    if (here / "mnist").is_dir():
        return here
    return Path(__file__).resolve().parents[3] / "data"


def derived_root(data_root: Path) -> Path:
    """Where data made from the originals goes (Scenario B trees, LLM assets): $MULTICARD_CACHE_DIR,
    else next to them. A read-only image (Apptainer SIF) points the variable at a writable bind."""
    return Path(os.environ["MULTICARD_CACHE_DIR"]) if os.environ.get("MULTICARD_CACHE_DIR") else data_root


def verify(mnist_dir: Path) -> None:
    """Raise InputError naming the first missing or altered file."""
    for name, expected in SHA256.items():
        path = mnist_dir / name
        if not path.is_file():
            raise InputError(f"{path}: missing MNIST file (copy the originals, see data/mnist/SOURCE.md)")
        actual = sha256_file(path)
        if actual != expected:
            raise InputError(f"{path}: SHA-256 mismatch, expected {expected}, got {actual}")


def read_idx(path: Path) -> np.ndarray:
    """Decode one gzip IDX file (big-endian header, uint8 payload)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic = int.from_bytes(raw[0:4], "big")
    if magic not in IDX_MAGIC:
        raise InputError(f"{path}: not an IDX file (magic {magic})")
    ndim = IDX_MAGIC[magic]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise InputError(f"{path}: header says {shape}, payload has {data.size} bytes")
    return data.reshape(shape)


def load(mnist_dir: Path, split: str, limit: int = 0) -> Split:
    """Verified images and labels of `split` ("train" or "test"); `limit` > 0 keeps the first N."""
    verify(mnist_dir)
    images_name, labels_name = SPLITS[split]
    images, labels = read_idx(mnist_dir / images_name), read_idx(mnist_dir / labels_name)
    if len(images) != len(labels):
        raise InputError(f"{mnist_dir}: {split} has {len(images)} images but {len(labels)} labels")
    if limit:
        images, labels = images[:limit], labels[:limit]
    return Split(images, labels)
