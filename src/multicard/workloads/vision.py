"""MobileNetV2 on upsampled MNIST with DDP + DistributedSampler (the paper's "DDP-DS").

The rank entry point that torchrun starts, one process per GPU (per gloo rank on CPU):

    torchrun --standalone --nproc-per-node=2 -m multicard.workloads.vision \
        --out DIR --data-dir data --device cpu --precision bf16 --image-size 32 ...

Every setting is declared once in `multicard.params.VISION`. Rank 0 writes DIR/result.json with
the metrics named in DESIGN.md. What is timed, and why:

- `warmup_steps` untimed steps run first (oneDNN/cuDNN initialisation, allocator growth, DDP
  bucket rebuild), then the model and optimizer are reset to their initial state, so the timed
  training starts from scratch exactly as an untimed run would.
- Each epoch is timed from `iter(loader)` (worker start: the paper's pre-epoch pause) to the end of
  its last step, with the device synchronised at both ends. There is no sync inside the step loop;
  per-step times come from CUDA events read after the epoch (host clock on CPU).
- Test accuracy is measured after training, outside the timed region.
"""

import time

T_PROCESS_START = time.time()  # before the heavy imports: the harness benchmark splits launch cost

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
from contextlib import nullcontext  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchvision  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, Subset  # noqa: E402

from multicard import params, precision  # noqa: E402
from multicard.data import mnist  # noqa: E402
from multicard.data.scenario_a import UpsampledMNIST  # noqa: E402
from multicard.launch import set_parent_death_signal  # noqa: E402
from multicard.telemetry import GpuUtilSampler  # noqa: E402

T_IMPORTED = time.time()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="trial directory for result.json")
    parser.add_argument("--data-dir", type=Path, default=mnist.default_root())
    for name, param in params.VISION.items():
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            default=param.default,
            type=lambda text, p=param: params.parse_flag_value(p, text),
            help=param.help,
        )
    return parser.parse_args(argv)


class StepClock:
    """Timestamps on the device timeline (CUDA events) or the host clock; read after a sync."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()  # enqueued on the current stream, no host-device sync
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def intervals_s(self) -> list[float]:
        pairs = zip(self.marks, self.marks[1:], strict=False)
        if self.cuda:
            return [a.elapsed_time(b) / 1000.0 for a, b in pairs]
        return [b - a for a, b in pairs]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_optimizer(model: torch.nn.Module, args: argparse.Namespace) -> torch.optim.Optimizer:
    if args.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                               weight_decay=args.weight_decay)
    return torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    images: torch.Tensor,
    labels: torch.Tensor,
    autocast: Any,
) -> torch.Tensor:
    with autocast:
        loss = F.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    # A disabled scaler passes the loss through and calls optimizer.step() unchanged.
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    set_parent_death_signal(os.getppid())
    timeline = {"process_start": T_PROCESS_START, "imported": T_IMPORTED}
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])

    # --- distributed setup: nccl on GPUs, gloo on CPU ---------------------------------------
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("device = 'cuda' but torch.cuda.is_available() is False")
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    timeline["dist_ready"] = time.time()

    policy = precision.PRECISIONS[args.precision]
    tf32_flags = precision.apply_tf32(policy)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    param_dtype = precision.torch_dtype(policy.param_dtype)
    autocast = (
        torch.autocast(device.type, dtype=precision.torch_dtype(policy.autocast_dtype))
        if policy.autocast_dtype else nullcontext()
    )

    # --- data: Scenario A, sharded by DistributedSampler ------------------------------------
    mnist_dir = args.data_dir / "mnist"
    train_set = UpsampledMNIST(mnist.load(mnist_dir, "train", args.train_subset), args.image_size)
    test_set = UpsampledMNIST(mnist.load(mnist_dir, "test", args.test_subset), args.image_size)
    sampler: DistributedSampler[tuple[torch.Tensor, int]] = DistributedSampler(
        train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    # pin_memory needs an accelerator; on CPU it is turned off here once instead of letting
    # every DataLoader warn about it.
    pin_memory = args.pin_memory and cuda
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler,
                        num_workers=args.num_workers, pin_memory=pin_memory, drop_last=False)
    steps_per_epoch = min(len(loader), args.max_steps) if args.max_steps else len(loader)
    timeline["data_ready"] = time.time()

    # --- model ----------------------------------------------------------------------------
    torch.manual_seed(args.seed)
    model = torchvision.models.mobilenet_v2(num_classes=10).to(device=device, dtype=param_dtype)
    ddp = DDP(model, device_ids=[local_rank] if cuda else None)
    initial_state = {k: v.clone() for k, v in model.state_dict().items()}
    timeline["model_ready"] = time.time()

    # --- warm-up: untimed steps on one batch built without the loader, then reset -----------
    warm_images = torch.stack([train_set[i][0] for i in range(min(args.batch_size, len(train_set)))])
    warm_labels = torch.tensor([train_set[i][1] for i in range(len(warm_images))])
    warm_images = warm_images.to(device=device, dtype=param_dtype)
    warm_labels = warm_labels.to(device)
    optimizer = make_optimizer(model, args)
    scaler = torch.amp.GradScaler(device.type, enabled=policy.grad_scaler)
    for _ in range(args.warmup_steps):
        train_step(ddp, optimizer, scaler, warm_images, warm_labels, autocast)
    with torch.no_grad():
        model.load_state_dict(initial_state)
    optimizer = make_optimizer(model, args)
    scaler = torch.amp.GradScaler(device.type, enabled=policy.grad_scaler)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    synchronize(device)
    dist.barrier()  # all ranks start the clock together
    timeline["warmup_done"] = time.time()

    # --- timed training ---------------------------------------------------------------------
    epoch_times, first_waits, waits, step_times, h2d_ms = [], [], [], [], []
    samples = 0
    loss_sum = torch.zeros((), device=device, dtype=torch.float64)
    util = GpuUtilSampler(gpu_uuid(device) if cuda else None)
    with util:
        t_train = time.perf_counter()
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)  # a different shuffle every epoch, the same on every rank
            t_epoch = time.perf_counter()
            batches = iter(loader)  # non-persistent workers start here
            clock = StepClock(device)
            copy_events = []
            for step in range(steps_per_epoch):
                clock.mark()
                # The first wait counts from iter(): starting the workers is part of the pause.
                t_wait = t_epoch if step == 0 else time.perf_counter()
                images, labels = next(batches)
                waits.append(time.perf_counter() - t_wait)
                if step == 0:
                    first_waits.append(waits[-1])
                if cuda:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                images = images.to(device, non_blocking=True)
                labels = labels.to(device, non_blocking=True)
                if cuda:
                    end.record()
                    copy_events.append((start, end))
                images = images.to(param_dtype)  # fp64 only; a no-op for float32
                loss_sum += train_step(ddp, optimizer, scaler, images, labels, autocast)
                samples += len(labels)
            clock.mark()
            del batches  # worker shutdown belongs to the epoch, as in an untimed run
            synchronize(device)  # sync point: the epoch includes all of its queued GPU work
            epoch_times.append(time.perf_counter() - t_epoch)
            step_times += clock.intervals_s()
            h2d_ms += [a.elapsed_time(b) for a, b in copy_events]
        synchronize(device)
        train_time = time.perf_counter() - t_train
    timeline["train_done"] = time.time()

    correct, total = evaluate(model, test_set, rank, world, args, device, param_dtype, autocast)
    timeline["eval_done"] = time.time()

    local = {
        "rank": rank,
        "train_time_s": train_time,
        "epoch_time_s": epoch_times,
        "step_times_s": step_times,
        "first_batch_latency_s": first_waits,
        "data_wait_s": sum(waits),
        "h2d_time_s": sum(h2d_ms) / 1000.0 if cuda else None,
        "samples": samples,
        "loss_mean": loss_sum.item() / max(1, args.epochs * steps_per_epoch),
        "peak_mem_bytes": peak_memory_bytes(device),
        "gpu_util_mean": util.mean(),
        "host": os.uname().nodename,
        "pid": os.getpid(),
    }
    gathered: list[dict[str, Any]] = [{} for _ in range(world)]
    dist.all_gather_object(gathered, local)
    if rank == 0:
        result = {
            "metrics": combine_ranks(gathered, correct / max(1, total)),
            "ranks": gathered,
            "world_size": world,
            "steps_per_epoch": steps_per_epoch,
            "test_images": total,
            "pin_memory_effective": pin_memory,
            "tf32_flags": tf32_flags,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "torch": torch.__version__,
            "timeline": timeline,
        }
        write_json_atomic(args.out / "result.json", result)
    dist.destroy_process_group()


def evaluate(
    model: torch.nn.Module,
    test_set: UpsampledMNIST,
    rank: int,
    world: int,
    args: argparse.Namespace,
    device: torch.device,
    param_dtype: torch.dtype,
    autocast: Any,
) -> tuple[int, int]:
    """(correct, total) over the whole test set, each rank scoring a contiguous, disjoint shard."""
    shard = np.array_split(np.arange(len(test_set)), world)[rank].tolist()
    loader = DataLoader(Subset(test_set, shard), batch_size=2 * args.batch_size,
                        num_workers=args.num_workers)
    counts = torch.zeros(2, dtype=torch.int64, device=device)
    model.eval()
    with torch.no_grad(), autocast:
        for images, labels in loader:
            images = images.to(device=device, dtype=param_dtype, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            counts[0] += (model(images).argmax(dim=1) == labels).sum()
            counts[1] += len(labels)
    dist.all_reduce(counts)  # sums over ranks; the shards do not overlap
    return int(counts[0]), int(counts[1])


def combine_ranks(ranks: list[dict[str, Any]], test_accuracy: float) -> dict[str, Any]:
    """One trial's metrics from every rank's measurements (DESIGN.md names).

    A job is as slow as its slowest rank, so times take the max over ranks; the pause before an
    epoch likewise. Fractions and utilisation are averaged; samples are summed.
    """
    train_time = max(r["train_time_s"] for r in ranks)
    epochs = len(ranks[0]["epoch_time_s"])
    step_times = [s for r in ranks for s in r["step_times_s"]]
    h2d = [r["h2d_time_s"] for r in ranks if r["h2d_time_s"] is not None]
    utils = [r["gpu_util_mean"] for r in ranks if r["gpu_util_mean"] is not None]
    return {
        "train_time_s": train_time,
        "epoch_time_s": [max(r["epoch_time_s"][e] for r in ranks) for e in range(epochs)],
        "step_time_median_s": statistics.median(step_times) if step_times else None,
        "throughput_samples_s": sum(r["samples"] for r in ranks) / train_time,
        "data_wait_fraction": statistics.fmean(r["data_wait_s"] / r["train_time_s"] for r in ranks),
        "first_batch_latency_s": [max(r["first_batch_latency_s"][e] for r in ranks)
                                  for e in range(epochs)],
        "h2d_time_s": max(h2d) if h2d else None,
        "test_accuracy": test_accuracy,
        "peak_mem_bytes": max(r["peak_mem_bytes"] for r in ranks),
        "gpu_util_mean": statistics.fmean(utils) if utils else None,
        "train_loss": statistics.fmean(r["loss_mean"] for r in ranks),
    }


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated device memory on CUDA; on CPU the rank process's peak RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def gpu_uuid(device: torch.device) -> str:
    """NVML identifies GPUs by UUID; CUDA_VISIBLE_DEVICES renumbers indices but not UUIDs."""
    return "GPU-" + str(torch.cuda.get_device_properties(device).uuid)


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    tmp.replace(path)


if __name__ == "__main__":
    main()
