"""The harness's training step with nothing around it, in its own process: a standalone second
opinion on the step itself (the device check's comparison is benchmarks/harness_ab.py, in one
process, A-B-B-A; this script no longer runs there).

    python3 benchmarks/plain_loop.py --out FILE --order ddp,bare -- --device cuda --precision fp16 ...

The flags after `--` are the vision workload's (multicard.plan.params.VISION), the same a harness trial
gets: the same model, precision policy, TF32 switches, cuDNN setting, optimizer, warm-up (its
steps, then the model, optimizer and GradScaler reset), resident batch (the synthetic loader's),
and `epochs x max_steps` timed steps. What it leaves out is the harness: torchrun, the loader's
epochs, the step clock, the meters, evaluation. Each loop of `--order` builds its own model and
runs in turn in this one process:

- `ddp`: the model wrapped as a one-rank harness trial wraps it (vision.wrap with the settings'
  `single_rank_ddp`: lean DDP by default, no per-forward buffer broadcast, gradients as bucket
  views; `default`: PyTorch's defaults, reducer hooks, bucket copies, buffer broadcast);
- `bare`: no DDP at all, so DDP's own cost shows apart;
- `timm`: timm's mobilenetv2_100 without DDP, where timm imports (another library's model of the
  same network, the step timm's benchmark.py times); where it does not import or fails, the loop
  says why and the others still count.

With `--window-s`, a short probe of the bare loop (the fastest) first sets the steps: every loop
then times at least that many seconds, over more epochs where one epoch of the training set
cannot hold them (as the harness's loader ends an epoch at its last full batch).

It writes FILE: images/s, the timed window and the wall time of each loop, the probe's, the
steps as set, and the process's wall time.
"""

from __future__ import annotations

import time

T_START = time.monotonic()  # before the imports: the device check learns a loop's start-up cost

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable  # noqa: E402
from contextlib import nullcontext  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # a bare checkout: no install needed
    sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torchvision  # noqa: E402

from multicard.integrity import write_text_atomic  # noqa: E402
from multicard.loaders import LOADERS  # noqa: E402
from multicard.measure.timing import warmup_batch_sizes  # noqa: E402
from multicard.plan import cost, precision  # noqa: E402
from multicard.profiling.capture import NoTracer  # noqa: E402
from multicard.workloads import vision  # noqa: E402

LOOPS = ("ddp", "bare", "timm")


def parse(argv: list[str]) -> tuple[argparse.Namespace, argparse.Namespace]:
    """This script's arguments, and the vision workload's settings after `--`."""
    cut = argv.index("--") if "--" in argv else len(argv)
    ours, theirs = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON file this loop writes")
    parser.add_argument("--order", default="ddp,bare",
                        help=f"the loops to run, in this order, comma-separated ({', '.join(LOOPS)})")
    parser.add_argument("--window-s", type=float,
                        help="instead of epochs x max_steps, time at least this many seconds in "
                             "every loop, by a short probe of the bare loop: the device check then "
                             "gives its harness trials the epochs and steps this picked")
    parser.add_argument("--probe-steps", type=int, default=20, help="timed steps of the probe")
    args = parser.parse_args(ours)
    args.order = [name.strip() for name in args.order.split(",") if name.strip()]
    if not args.order or set(args.order) - set(LOOPS):
        parser.error(f"--order: expected some of {', '.join(LOOPS)}, got {args.order}")
    with tempfile.TemporaryDirectory() as scratch:  # vision's --out: this loop writes no trial
        settings = vision.parse_args([*theirs, "--out", scratch])
    return args, settings


def main(argv: list[str] | None = None) -> None:
    args, settings = parse(sys.argv[1:] if argv is None else argv)
    cuda = settings.device == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    with tempfile.TemporaryDirectory() as rendezvous:
        # one rank, as the harness's one-GPU trial: nccl on GPUs, gloo on CPU
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{rendezvous}/store",
                                rank=0, world_size=1)
        try:
            probe_s = None
            if args.window_s is not None:
                started = time.monotonic()
                settings.epochs, settings.max_steps = steps_for(args.window_s, args.probe_steps,
                                                                settings, device)
                probe_s = time.monotonic() - started
            found = {name: run_timed(name, settings, device) for name in args.order}
        finally:
            dist.destroy_process_group()
    write_text_atomic(args.out, json.dumps({
        "order": args.order, "loops": found, "epochs": settings.epochs,
        "max_steps": settings.max_steps, "steps": settings.epochs * settings.max_steps,
        "warmup_steps": settings.warmup_steps, "probe_s": probe_s, "pid": os.getpid(),
        "process_wall_s": time.monotonic() - T_START}, indent=1))


def steps_for(window_s: float, probe_steps: int, settings: argparse.Namespace,
              device: torch.device) -> tuple[int, int]:
    """(epochs, max_steps) that time at least `window_s` in the bare loop, by `probe_steps` of
    it (after its warm-up), each epoch within the training set's full batches."""
    probe = argparse.Namespace(**{**vars(settings), "epochs": 1, "max_steps": probe_steps})
    step_s = run_loop("bare", probe, device)["window_s"] / probe_steps
    per_epoch = cost.full_batches(settings.train_subset, settings.batch_size, 1)
    return cost.steps_over_epochs(math.ceil(window_s / step_s), settings.epochs, per_epoch)


def run_timed(name: str, settings: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """run_loop with its wall time (model, warm-up and steps); timm's failure said, not raised:
    another library's model is a second opinion, not the reference."""
    started = time.monotonic()
    try:
        found = run_loop(name, settings, device)
    except Exception as exc:
        if name != "timm":
            raise
        found = {"images_s": None, "why": f"timm failed: {type(exc).__name__}: {exc}"}
    return {**found, "loop_s": time.monotonic() - started}


def run_loop(name: str, settings: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """One loop's images/s over `epochs x max_steps` steps after the harness's warm-up."""
    policy = precision.PRECISIONS[settings.precision]
    precision.apply_tf32(policy)  # the switches the harness sets, for this precision
    torch.backends.cudnn.benchmark = settings.cudnn_benchmark
    torch.manual_seed(settings.seed)
    model = build_model(name, settings, device, policy)
    if model is None:
        return {"images_s": None, "why": "timm does not import"}
    # as the harness wraps a one-rank trial's model (its `single_rank_ddp`), not DDP's defaults
    stepped = vision.wrap(model, settings.single_rank_ddp, 1, 0 if device.type == "cuda" else None) \
        if name == "ddp" else model
    config = vision.loader_config(settings, "train", 0, 1, device, policy)
    batch = LOADERS["synthetic"](config)  # the harness's resident batch, as its synthetic loader serves it
    images, labels, _ = next(batch.epoch(0))
    model_input = precision.torch_dtype(policy.param_dtype if settings.cast == "device"
                                        else precision.input_dtype(policy))
    autocast = torch.autocast(device.type, dtype=precision.torch_dtype(policy.autocast_dtype)) \
        if policy.autocast_dtype else nullcontext()
    # the harness's own warm-up: its steps and batch sizes, then the model, optimizer and
    # GradScaler reset (a fresh scaler's first fp16 steps may be skipped ones, as the harness's are)
    warmed = warmup_batch_sizes(batch.samples_per_rank, settings.batch_size) if settings.warmup_steps else []
    optimizer, scaler = vision.warm_up(stepped, model, settings, config, model_input, autocast, policy,
                                       warmed)

    def step() -> None:  # the harness's call, its cast to the model's input dtype included
        vision.train_step(stepped, optimizer, scaler, images.to(model_input), labels, autocast, NoTracer())

    steps = settings.epochs * settings.max_steps
    seconds = timed(step, steps, device)
    return {"images_s": steps * len(labels) / seconds, "window_s": seconds, "steps": steps}


def build_model(name: str, settings: argparse.Namespace, device: torch.device,
                policy: precision.PrecisionPolicy) -> torch.nn.Module | None:
    if name == "timm":
        try:
            import timm
        except ImportError:
            return None
        model = timm.create_model("mobilenetv2_100", num_classes=10, in_chans=3)
    else:
        model = torchvision.models.mobilenet_v2(num_classes=10)
    model = model.to(device=device, dtype=precision.torch_dtype(policy.param_dtype))
    return model.to(memory_format=torch.channels_last) if settings.layout == "nhwc" else model


def timed(step: Callable[[], None], steps: int, device: torch.device) -> float:
    """Seconds of `steps` steps, the device synchronised before and after (sync points: the
    queued work of the warm-up stays out, the loop's own is in)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
