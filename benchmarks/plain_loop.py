"""The harness's training step with nothing around it, in its own process: the reference the
device check holds the harness against, like for like.

    python3 benchmarks/plain_loop.py --out FILE --order ddp,bare -- --device cuda --precision fp16 ...

The flags after `--` are the vision workload's (multicard.params.VISION), the same a harness trial
gets: the same model, precision policy, TF32 switches, cuDNN setting, optimizer, warm-up steps and
resident batch (the synthetic loader's), and `epochs x max_steps` timed steps. What it leaves out
is the harness: torchrun, the loader's epochs, the step clock, the meters, evaluation. Each loop
of `--order` builds its own model and runs in turn in this one process:

- `ddp`: the model wrapped in a one-rank DistributedDataParallel, as the harness wraps it (reducer
  hooks, bucket copies, buffer broadcast);
- `bare`: no DDP at all, so DDP's own cost shows apart;
- `timm`: timm's mobilenetv2_100 without DDP, where timm imports (another library's model of the
  same network, the step timm's benchmark.py times).

It writes FILE: images/s and the timed window of each loop, and the process's wall time.
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
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from multicard import precision  # noqa: E402
from multicard.artifact import write_text_atomic  # noqa: E402
from multicard.loaders import LOADERS  # noqa: E402
from multicard.profiling.capture import NoTracer  # noqa: E402
from multicard.timing import warmup_batch_sizes  # noqa: E402
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
                        help="instead of epochs x max_steps, time as many steps (a multiple of the "
                             "epochs) as fill this many seconds with a quarter to spare, from a short "
                             "probe of the first loop: the device check then gives its harness trials "
                             "the steps this picked")
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
            if args.window_s is not None:
                settings.max_steps = steps_per_epoch_for(args.window_s, args.order[0], settings, device)
            found = {name: run_loop(name, settings, device) for name in args.order}
        finally:
            dist.destroy_process_group()
    write_text_atomic(args.out, json.dumps({
        "order": args.order, "loops": found, "epochs": settings.epochs,
        "max_steps": settings.max_steps, "steps": settings.epochs * settings.max_steps,
        "warmup_steps": settings.warmup_steps, "pid": os.getpid(),
        "process_wall_s": time.monotonic() - T_START}, indent=1))


PROBE_STEPS = 20


def steps_per_epoch_for(window_s: float, name: str, settings: argparse.Namespace,
                        device: torch.device) -> int:
    """max_steps per epoch for a timed window of at least `window_s`, a quarter to spare: from
    PROBE_STEPS timed steps of loop `name` (after its warm-up)."""
    probe = argparse.Namespace(**{**vars(settings), "epochs": 1, "max_steps": PROBE_STEPS})
    step_s = run_loop(name, probe, device)["window_s"] / PROBE_STEPS
    return max(PROBE_STEPS, math.ceil(1.25 * window_s / (step_s * settings.epochs)))


def run_loop(name: str, settings: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """One loop's images/s over `epochs x max_steps` steps after the harness's warm-up."""
    policy = precision.PRECISIONS[settings.precision]
    precision.apply_tf32(policy)  # the switches the harness sets, for this precision
    torch.backends.cudnn.benchmark = settings.cudnn_benchmark
    torch.manual_seed(settings.seed)
    model = build_model(name, settings, device, policy)
    if model is None:
        return {"images_s": None, "why": "timm does not import"}
    stepped = DDP(model, device_ids=[0] if device.type == "cuda" else None) if name == "ddp" else model
    config = vision.loader_config(settings, "train", 0, 1, device, policy)
    batch = LOADERS["synthetic"](config)  # the harness's resident batch, as its synthetic loader serves it
    images, labels, _ = next(batch.epoch(0))
    model_input = precision.torch_dtype(policy.param_dtype if settings.cast == "device"
                                        else precision.input_dtype(policy))
    autocast = torch.autocast(device.type, dtype=precision.torch_dtype(policy.autocast_dtype)) \
        if policy.autocast_dtype else nullcontext()
    optimizer = vision.make_optimizer(model, settings)
    scaler = torch.amp.GradScaler(device.type, enabled=policy.grad_scaler)

    def step() -> None:  # the harness's call, its cast to the model's input dtype included
        vision.train_step(stepped, optimizer, scaler, images.to(model_input), labels, autocast, NoTracer())

    warmed = warmup_batch_sizes(batch.samples_per_rank, settings.batch_size)
    for _ in range(settings.warmup_steps if warmed else 0):
        step()
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
