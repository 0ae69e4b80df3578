"""Images/s of each loader without a model, against the no-loading bound and a plain memory copy.

    python benchmarks/loader_throughput.py [--size 300] [--images 4096] [--workers 2]

One process, rank 0 of 1, on CUDA when available, else CPU (DALI with CPU operators). Every
loader serves `--images` Scenario B images per epoch (JPEG files, decoded and normalised to float32
3xNxN); the second epoch is timed (files in the page cache, workers warm). The references:
`synthetic` (one resident batch: the bound where loading costs nothing) and a plain copy of the
same number of float32 bytes (host->device on CUDA, host->host on CPU).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from multicard.data import mnist, scenario_b
from multicard.loaders import LOADERS, LoaderConfig

ROOT = Path(__file__).resolve().parents[1]


def loader_rate(name: str, config: LoaderConfig) -> float:
    loader = LOADERS[name](config)
    for _ in loader.epoch(0):  # warm-up epoch: page cache, worker start, DALI prefetch
        pass
    start = time.perf_counter()
    images = 0
    for batch, _, _ in loader.epoch(1):
        images += len(batch)
    if config.device.type == "cuda":
        torch.cuda.synchronize()
    return images / (time.perf_counter() - start)


def copy_rate(config: LoaderConfig, images: int) -> float:
    """Images/s of copying their float32 bytes once: host->device on CUDA, host->host on CPU."""
    shape = (config.batch_size, 3, config.image_size, config.image_size)
    cuda = config.device.type == "cuda"
    source = torch.randn(shape, pin_memory=cuda)
    target = torch.empty(shape, device=config.device)
    steps = max(1, images // config.batch_size)
    target.copy_(source, non_blocking=cuda)
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        target.copy_(source, non_blocking=cuda)
    if cuda:
        torch.cuda.synchronize()
    return steps * config.batch_size / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=300)
    parser.add_argument("--images", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    data = mnist.default_root()
    tree = scenario_b.tree_path(data, args.size, "jpeg")
    if not (tree / scenario_b.DATASET_JSON).exists():
        scenario_b.prepare(scenario_b.Request(data / "mnist", tree, args.size, "jpeg"))
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    base = LoaderConfig(
        scenario="b", mnist_dir=data / "mnist", tree=tree, split="train", image_size=args.size,
        batch_size=args.batch, rank=0, world=1, seed=0, subset=0, epoch_samples=args.images,
        num_workers=args.workers, pin_memory=device.type == "cuda", prefetch_factor=2,
        persistent_workers=False, layout="nchw", normalize="cpu", dali_threads=args.workers,
        dali_affinity=False, device=device)
    rows = [(f"torch, {args.workers} workers", loader_rate("torch", base))]
    rows.append(("torch, in-process (0 workers)",
                 loader_rate("torch", LoaderConfig(**{**base.__dict__, "num_workers": 0}))))
    rows.append((f"dali, {args.workers} threads", loader_rate("dali", base)))
    synthetic = loader_rate("synthetic", base)
    copy = copy_rate(base, args.images)
    print(f"\n{args.images} images of {args.size}x{args.size} per epoch, batch {args.batch}, {device}")
    print(f"{'loader':<32} {'images/s':>10} {'/ synthetic':>12} {'/ copy':>8}")
    for name, rate in rows:
        print(f"{name:<32} {rate:>10.0f} {rate / synthetic:>12.4f} {rate / copy:>8.4f}")
    print(f"{'synthetic (no loading)':<32} {synthetic:>10.0f} {1:>12.4f} {synthetic / copy:>8.4f}")
    print(f"{'plain copy of the bytes':<32} {copy:>10.0f} {copy / synthetic:>12.4f} {1:>8.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
