"""Scenario B: MNIST prepared once at a larger native resolution and stored as files.

    multicard data prepare --size 300 --format jpeg --out data/scenario_b/300px-jpeg

Layout of a prepared tree (every file is listed in MANIFEST.sha256, coreutils format):

    dataset.json              size, format, counts, source digests; written last (completion mark)
    train/<class>/<index>.jpg one grayscale image per MNIST training image, index = position in
    test/<class>/<index>.jpg  the original IDX file (zero-padded to 5 digits)
    train_index.txt           "<path> <index>" per image, in index order (DALI file_list syntax)
    test_index.txt
    labels_train.npy          class of every index (uint8)
    labels_test.npy

The images are the Scenario A pixels (bilinear upsampling, align_corners=False) rounded to uint8.
JPEG is the default format: it is what DALI decodes on the GPU (nvJPEG, its "mixed" decoder) and
what the PyTorch DataLoader decodes on the CPU (libjpeg-turbo), so both loaders read the same bytes
and each uses its own natural path, which is the comparison the paper makes. PNG would make DALI
decode on the CPU as well; npy removes decoding altogether (a useful control, torch loader only).
Quality 95, grayscale: the same bytes on every run, so preparation is reproducible.

Work is split into chunks written by a process pool. Every image is written under a temporary
name and renamed, and every finished chunk leaves its checksum part, so an interrupted run resumes
where it stopped, and running it again on a finished tree does nothing.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from multicard import integrity
from multicard.data import mnist
from multicard.errors import InputError

FORMATS = ("jpeg", "png", "npy")
EXTENSIONS = {"jpeg": "jpg", "png": "png", "npy": "npy"}
JPEG_QUALITY = 95
CHUNK = 2000
MANIFEST = "MANIFEST.sha256"
DATASET_JSON = "dataset.json"
PARTS = ".parts"
SPLITS = ("train", "test")


@dataclass(frozen=True)
class Request:
    mnist_dir: Path
    out: Path
    size: int
    fmt: str
    limit: int = 0  # first N images of each split; 0 = all

    def counts(self) -> dict[str, int]:
        full = {"train": mnist.MNIST_TRAIN, "test": mnist.MNIST_TEST}
        return {s: min(n, self.limit) if self.limit else n for s, n in full.items()}

    def description(self) -> dict[str, Any]:
        return {"size": self.size, "format": self.fmt, "limit": self.limit, "counts": self.counts(),
                "interpolation": "bilinear, align_corners=False, rounded to uint8",
                "jpeg_quality": JPEG_QUALITY if self.fmt == "jpeg" else None,
                "source_sha256": mnist.SHA256, "file_lists": "<path> <sample index>"}


def tree_path(data_root: Path, size: int, fmt: str) -> Path:
    """Where the runner and the workload expect the tree for (size, format)."""
    return mnist.derived_root(data_root) / "scenario_b" / f"{size}px-{fmt}"


def relative_path(split: str, label: int, index: int, fmt: str) -> str:
    return f"{split}/{label}/{index:05d}.{EXTENSIONS[fmt]}"


# --- encoding -------------------------------------------------------------------------------

def upsampled_uint8(images: np.ndarray, size: int) -> np.ndarray:
    """(n, 28, 28) uint8 -> (n, size, size) uint8, the Scenario A resize before normalisation."""
    import torch

    from multicard.data.scenario_a import resize_unit

    batch = torch.from_numpy(np.array(images, dtype=np.uint8))  # a writable copy
    return resize_unit(batch, size).mul_(255).round_().clamp_(0, 255).to(torch.uint8).numpy()


def encode(image: np.ndarray, fmt: str) -> bytes:
    if fmt == "npy":
        buffer = io.BytesIO()
        np.save(buffer, image, allow_pickle=False)
        return buffer.getvalue()
    from PIL import Image

    buffer = io.BytesIO()
    if fmt == "jpeg":
        Image.fromarray(image, mode="L").save(buffer, "JPEG", quality=JPEG_QUALITY)
    else:
        Image.fromarray(image, mode="L").save(buffer, "PNG")
    return buffer.getvalue()


# --- the chunked, resumable writer -----------------------------------------------------------

_SOURCE: dict[str, mnist.Split] = {}


def _load_source(mnist_dir: Path) -> None:
    """Pool initializer: read MNIST once per worker process; one thread each, the pool is the
    parallelism."""
    import torch

    torch.set_num_threads(1)
    for split in SPLITS:
        _SOURCE[split] = mnist.load(mnist_dir, split)


def _write_chunk(out: Path, split: str, start: int, stop: int, size: int, fmt: str) -> int:
    source = _SOURCE[split]
    lines = []
    for first in range(start, stop, 64):
        last = min(first + 64, stop)
        pixels = upsampled_uint8(source.images[first:last], size)
        for offset, image in enumerate(pixels):
            index = first + offset
            rel = relative_path(split, int(source.labels[index]), index, fmt)
            data = encode(image, fmt)
            _write_atomic(out / rel, data)
            lines.append(f"{integrity.sha256_bytes(data)}  {rel}\n")
    _write_atomic(out / PARTS / f"{split}-{start:05d}.sha256", "".join(lines).encode())
    return stop - start


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    integrity.write_bytes_atomic(path, data, durable=False)


def _chunks(request: Request) -> Iterator[tuple[str, int, int]]:
    for split, count in request.counts().items():
        for start in range(0, count, CHUNK):
            yield split, start, min(start + CHUNK, count)


def estimate_bytes(request: Request) -> int:
    """Disk use from a sample of 32 encoded images, each rounded up to a 4 KiB block."""
    sample = mnist.load(request.mnist_dir, "test").images[:: mnist.MNIST_TEST // 32][:32]
    sizes = [len(encode(img, request.fmt)) for img in upsampled_uint8(sample, request.size)]
    per_file = sum(-(-s // 4096) * 4096 for s in sizes) / len(sizes)
    return int(per_file * sum(request.counts().values()))


def prepare(request: Request, workers: int | None = None, echo: Callable[[str], None] = print,
            progress: bool = True) -> Path:
    """Write (or finish, or confirm) the tree for `request`; returns its path."""
    if request.fmt not in FORMATS:
        raise InputError(f"--format: expected one of {', '.join(FORMATS)}, got {request.fmt!r}")
    out = request.out
    if _is_complete(out, request):
        echo(f"{out}: already prepared ({sum(request.counts().values())} images), nothing to do")
        return out
    mnist.verify(request.mnist_dir)
    needed = estimate_bytes(request)
    existing = next(p for p in [out, *out.parents] if p.exists())  # checked before creating
    free = shutil.disk_usage(existing).free
    echo(f"Scenario B: {sum(request.counts().values())} images, {request.size}x{request.size} "
         f"{request.fmt} -> about {needed / 2**30:.2f} GiB in {out} ({free / 2**30:.1f} GiB free)")
    if needed > free:
        raise InputError(f"{out}: needs about {needed / 2**30:.2f} GiB, only {free / 2**30:.2f} GiB free")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{out}: cannot be created ({exc.strerror})") from None
    todo = [c for c in _chunks(request)
            if not (out / PARTS / f"{c[0]}-{c[1]:05d}.sha256").exists()]
    _run_chunks(request, todo, workers or os.cpu_count() or 1, progress)
    _finish(request)
    echo(f"{out}: prepared; check it with `multicard data verify {out}`")
    return out


def _run_chunks(request: Request, todo: list[tuple[str, int, int]], workers: int,
                progress: bool) -> None:
    from rich.progress import Progress

    total = sum(stop - start for _, start, stop in todo)
    with (Progress(disable=not progress, transient=False) as bar,
          # spawn, not fork: a child forked after torch has started its OpenMP threads can hang
        ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                            initializer=_load_source, initargs=(request.mnist_dir,)) as pool):
        task = bar.add_task("writing images", total=total)
        futures = [pool.submit(_write_chunk, request.out, split, start, stop, request.size,
                               request.fmt) for split, start, stop in todo]
        try:
            for future in as_completed(futures):
                bar.advance(task, future.result())
        except BaseException:  # a stop request: end the workers now, not after every chunk
            _stop_pool(pool)
            raise


def _stop_pool(pool: ProcessPoolExecutor) -> None:
    """Cancel the queued chunks and end the running ones. Every chunk writes its files
    atomically and its checksum list last, so a resume redoes exactly the unfinished ones."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # gone after shutdown
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.kill()


def _finish(request: Request) -> None:
    out = request.out
    parts = sorted((out / PARTS).glob("*.sha256"))
    listing = "".join(p.read_text() for p in parts)
    labels = {s: mnist.load(request.mnist_dir, s).labels[: request.counts()[s]] for s in SPLITS}
    for split in SPLITS:
        lines = [f"{relative_path(split, int(label), i, request.fmt)} {i}\n"
                 for i, label in enumerate(labels[split])]
        _write_atomic(out / f"{split}_index.txt", "".join(lines).encode())
        buffer = io.BytesIO()
        np.save(buffer, labels[split].astype(np.uint8), allow_pickle=False)
        _write_atomic(out / f"labels_{split}.npy", buffer.getvalue())
    extra = [f"{split}_index.txt" for split in SPLITS] + [f"labels_{split}.npy" for split in SPLITS]
    listing += "".join(f"{integrity.sha256_file(out / name)}  {name}\n" for name in extra)
    _write_atomic(out / MANIFEST, "".join(sorted(listing.splitlines(keepends=True))).encode())
    _write_atomic(out / DATASET_JSON, json.dumps(request.description(), indent=1).encode())
    shutil.rmtree(out / PARTS)


def _is_complete(out: Path, request: Request) -> bool:
    meta = out / DATASET_JSON
    if not meta.exists():
        return False
    found = json.loads(meta.read_text())
    wanted = request.description()
    if found != wanted:
        raise InputError(f"{out}: holds a different dataset ({found.get('size')}px "
                         f"{found.get('format')}, limit {found.get('limit')}); use another --out")
    return True


def read_description(tree: Path) -> dict[str, Any]:
    meta = tree / DATASET_JSON
    if not meta.exists():
        raise InputError(f"{tree}: not a prepared Scenario B tree (no {DATASET_JSON}); "
                         "run `multicard data prepare`")
    return dict(json.loads(meta.read_text()))


def verify(tree: Path) -> integrity.VerifyResult:
    """Every listed file against MANIFEST.sha256; files in the tree but not listed are named too."""
    read_description(tree)
    return integrity.verify(tree, sums_name=MANIFEST, ignore=(DATASET_JSON,))


def stage(tree: Path, root: Path) -> dict[str, Any]:
    """Copy a prepared tree to `root` (node-local disk), in the same place under it as under the
    shared cache, so that a rank given MULTICARD_CACHE_DIR=root reads the local copy; a copy with
    the same MANIFEST.sha256 is kept (the first trial on a node pays, the others do not). The copy
    is made under a temporary name and renamed: a node killed while copying leaves no half tree.
    Returns what was done, for the node's record."""
    target = root / "scenario_b" / tree.name
    manifest = (tree / MANIFEST).read_bytes()
    started = time.monotonic()
    if not ((target / MANIFEST).is_file() and (target / MANIFEST).read_bytes() == manifest
            and (target / DATASET_JSON).is_file()):
        staging = target.with_name(f"{target.name}.staging-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(tree, staging, ignore=shutil.ignore_patterns(PARTS))
        shutil.rmtree(target, ignore_errors=True)
        staging.replace(target)
        copied = True
    else:
        copied = False
    return {"from": str(tree), "to": str(target), "copied": copied,
            "bytes": sum(p.stat().st_size for p in target.rglob("*") if p.is_file()),
            "seconds": round(time.monotonic() - started, 3)}
