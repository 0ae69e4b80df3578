"""The operating point of the vision step: where does the GPU, and where does the host, set its pace?

    python -m multicard.workloads.step_profile --out FILE [--device cuda] [--sizes 100,224,300]
        [--precisions fp64,fp32,fp16] [--batch-size 128] [--steps 10] [--ddp lean,default,none]
        [--ddp-at 224:fp32] [-- VISION FLAGS]

One process, one GPU, one rank (a process group of one, as a one-GPU trial has). For every
precision x image size, and for every one-rank DDP wrapping at one of them (`--ddp-at`), it
builds the model as a trial does (workloads.vision: the same model, precision policy, TF32
switches, optimizer and warm-up), then on the warm-up's resident batch (no loader: the data's
cost is the trials' to show):
- times `--steps` steps, the device synchronised at both ends: the step's wall time, and the
  process's CPU seconds per step (the host's work: Python, ATen dispatch, launches);
- profiles `--steps` more (profiling.step_probe): kernels per step, their time, the GPU's busy
  time, ATen ops and launches per step (on CPU the ATen ops only);
- labels the point: the busy time over the unprofiled step (step_probe.label).
It writes FILE (JSON: one row per point, with the settings) and prints one line per point.
On CPU there are no kernels: the rows say so, and the host's numbers (step, CPU seconds, ATen
ops: DDP's bookkeeping is host work) are still measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from multicard import integrity
from multicard.errors import InputError, OneLineParser
from multicard.loaders import LOADERS
from multicard.profiling import step_probe
from multicard.profiling.capture import NoTracer
from multicard.workloads import vision


@dataclass(frozen=True)
class Point:
    precision: str
    image_size: int
    single_rank_ddp: str


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = OneLineParser(prog="multicard.workloads.step_profile", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON file of the rows")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--sizes", default="100,224,300", help="image sizes, comma-separated")
    parser.add_argument("--precisions", default="fp64,fp32,fp16", help="precisions, comma-separated")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10, help="timed steps, and as many profiled")
    parser.add_argument("--ddp", default="lean,default,none",
                        help="one-rank DDP wrappings compared at --ddp-at (single_rank_ddp)")
    parser.add_argument("--ddp-at", default="224:fp32", help="SIZE:PRECISION of the DDP comparison")
    args = parser.parse_args(argv[:cut])
    if args.steps < 1 or args.batch_size < 1:
        parser.error("--steps and --batch-size must be at least 1")
    return args, argv[cut + 1:]


def points(args: argparse.Namespace) -> list[Point]:
    """Every precision x size with the default wrapping, then the DDP comparison's other wrappings."""
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        size_at, precision_at = args.ddp_at.split(":")
        ddp_size = int(size_at)
    except ValueError:
        raise InputError(f"--sizes/--ddp-at: expected integers and SIZE:PRECISION, got "
                         f"{args.sizes!r} and {args.ddp_at!r}") from None
    default = str(vision_default("single_rank_ddp"))
    found = [Point(p, s, default) for p in args.precisions.split(",") if p.strip() for s in sizes]
    found += [Point(precision_at, ddp_size, w) for w in args.ddp.split(",") if w.strip()
              and Point(precision_at, ddp_size, w) not in found]
    return found


def vision_default(name: str) -> Any:
    from multicard.plan.params import VISION

    return VISION[name].default


def settings_for(point: Point, args: argparse.Namespace, extra: list[str]) -> argparse.Namespace:
    """The vision workload's settings of one point, as a trial's rank parses them."""
    flags = ["--device", args.device, "--precision", point.precision, "--image-size",
             str(point.image_size), "--batch-size", str(args.batch_size), "--single-rank-ddp",
             point.single_rank_ddp, *extra]
    with tempfile.TemporaryDirectory() as scratch:
        return vision.parse_args([*flags, "--out", scratch])


def measure(point: Point, settings: argparse.Namespace, steps: int, device: torch.device) -> dict[str, Any]:
    """One point's row: timed steps, then profiled ones (GPU only), then its label."""
    numerics = vision.set_numerics(settings, device)
    config = vision.loader_config(settings, "train", 0, 1, device, numerics.policy)
    torch.manual_seed(settings.seed)
    batch = LOADERS["synthetic"](config)
    training = vision.set_up_training(settings, config, numerics, batch.samples_per_rank, 0)
    images, labels, _ = next(batch.epoch(0))

    def step() -> None:
        vision.train_step(training.ddp, training.optimizer, training.scaler,
                          images.to(numerics.model_input), labels, numerics.autocast, NoTracer())

    def sync() -> None:
        vision.synchronize(device)

    step()
    sync()  # sync point: the warm-up's queued work stays out of the window
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    sync()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    row: dict[str, Any] = {"precision": point.precision, "image_size": point.image_size,
                           "batch_size": settings.batch_size, "single_rank_ddp": point.single_rank_ddp,
                           "steps": steps, "step_s": wall / steps, "rank_cpu_s_per_step": cpu / steps}
    row |= step_probe.probe(step, steps, sync)  # on CPU too: the host's ATen ops are counted
    if device.type == "cuda":
        row["gpu_busy_fraction"] = row["probe_busy_s_per_step"] / row["step_s"]
    else:
        row |= {"gpu_busy_fraction": None, "why": "CPU run: there are no GPU kernels"}
    row["bound"] = step_probe.label(row["gpu_busy_fraction"])
    return row


def main(argv: list[str] | None = None) -> int:
    try:
        return profile(sys.argv[1:] if argv is None else argv)
    except InputError as exc:  # bad input: one line, exit 2, nothing written
        print(f"multicard.workloads.step_profile: {exc}", file=sys.stderr)
        return 2


def profile(argv: list[str]) -> int:
    args, extra = parse(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise InputError("--device cuda but torch.cuda.is_available() is False")
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    rows = []
    with tempfile.TemporaryDirectory() as rendezvous:
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{rendezvous}/store",
                                rank=0, world_size=1)
        try:
            for point in points(args):
                rows.append(measure(point, settings_for(point, args, extra), args.steps, device))
                print(line(rows[-1]), flush=True)
                if cuda:
                    torch.cuda.empty_cache()  # the next point's model starts from a clean pool
        finally:
            dist.destroy_process_group()
    integrity.write_text_atomic(args.out, json.dumps({"device": args.device, "torch": torch.__version__,
                                                      "threshold": step_probe.GPU_BOUND_AT,
                                                      "rows": rows}, indent=1))
    return 0


def line(row: dict[str, Any]) -> str:
    busy = row["gpu_busy_fraction"]
    kernels = f"{row['probe_aten_ops_per_step']:.0f} ATen ops/step, no kernels (CPU)" if busy is None else (
        f"GPU busy {busy:.0%} ({row['probe_busy_s_per_step'] * 1e3:.1f} ms), "
        f"{row['probe_kernels_per_step']:.0f} kernels, {row['probe_aten_ops_per_step']:.0f} ATen ops/step")
    return (f"{row['precision']} {row['image_size']} px batch {row['batch_size']} "
            f"ddp={row['single_rank_ddp']}: step {row['step_s'] * 1e3:.1f} ms, rank CPU "
            f"{row['rank_cpu_s_per_step'] * 1e3:.1f} ms/step, {kernels}: {row['bound'] or 'no label'}")


if __name__ == "__main__":
    raise SystemExit(main())
