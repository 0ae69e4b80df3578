"""MobileNetV2 on upsampled MNIST with DDP + DistributedSampler (the paper's "DDP-DS").

The rank entry point that torchrun starts, one process per GPU (per gloo rank on CPU):

    torchrun --standalone --nproc-per-node=2 -m multicard.workloads.vision \
        --out DIR --data-dir data --device cpu --precision bf16 --image-size 32 ...

Every setting is declared once in `multicard.plan.params.VISION`. Rank 0 writes DIR/result.json with
the metrics named in docs/design.md. What is timed, and why:

- `warmup_steps` untimed steps run first (oneDNN/cuDNN initialisation, allocator growth, DDP
  bucket rebuild), then the model and optimizer are reset to their initial state, so the timed
  training starts from scratch exactly as an untimed run would.
- Each epoch is timed from `iter(loader)` (worker start: the paper's pre-epoch pause) through its
  last step and the loader's shutdown, with the device synchronised after the last step. There is
  no sync inside the step loop; per-step times come from CUDA events made once per trial and read
  after the epoch (host clock on CPU).
- The host's wait for each batch is split: `data_wait_s` is the loader's `next()` alone,
  `h2d_wait_s` the host blocked in `to_device` (a pageable copy waits for the queued GPU work).
- Test accuracy is measured after training, outside the timed region.
"""

import time

T_PROCESS_START = time.time()  # before the heavy imports: the harness benchmark splits launch cost

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager, nullcontext  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchvision  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, Subset  # noqa: E402

from multicard import integrity  # noqa: E402
from multicard.data import mnist, scenario_b  # noqa: E402
from multicard.loaders import LOADERS, LoaderConfig  # noqa: E402
from multicard.loaders.datasets import collate_for, finish_on_device, make_dataset  # noqa: E402
from multicard.measure import devices, energy  # noqa: E402
from multicard.measure.meters import RankMeters  # noqa: E402
from multicard.measure.telemetry import rank_device_bytes  # noqa: E402
from multicard.measure.timing import BatchTimer, StepClock, warmup_batch_sizes  # noqa: E402
from multicard.plan import params, precision  # noqa: E402
from multicard.plan.launch import DROPPED_ENV, die_with_agent  # noqa: E402
from multicard.profiling import TRACE_MODES, step_probe  # noqa: E402
from multicard.profiling.capture import TRACERS, NoTracer, TraceConfig, Tracer  # noqa: E402

T_IMPORTED = time.time()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="trial directory for result.json")
    parser.add_argument("--data-dir", type=Path, default=mnist.default_root())
    parser.add_argument("--trace", choices=TRACE_MODES, default="none",
                        help="record ranges and a trace of the timed training (profiling/capture.py)")
    for name, param in params.VISION.items():
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            default=param.default,
            type=lambda text, p=param: params.parse_flag_value(p, text),
            help=param.help,
        )
    return parser.parse_args(argv)


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
    tracer: Tracer,
) -> torch.Tensor:
    with tracer.range("forward"), autocast:
        loss = F.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    # A disabled scaler passes the loss through and calls optimizer.step() unchanged.
    with tracer.range("backward"):
        scaler.scale(loss).backward()
    with tracer.range("optimizer_step"):
        scaler.step(optimizer)
        scaler.update()
    return loss.detach()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    parent_death = die_with_agent()
    timeline = {"process_start": T_PROCESS_START, "imported": T_IMPORTED}
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    device = init_distributed(args.device, local_rank)
    timeline["dist_ready"] = time.time()
    numerics = set_numerics(args, device)

    # --- data: the loader shards by rank; every rank must take the same number of steps -----
    train_config = loader_config(args, "train", rank, world, device, numerics.policy)
    loader = LOADERS[args.loader](train_config)
    steps_per_epoch = agree_on_steps(loader.steps_per_epoch, device)
    tracer = TRACERS[args.trace](TraceConfig(args.out, rank, steps_per_epoch, args.epochs,
                                             device.type == "cuda"))
    uuid = gpu_uuid(device) if device.type == "cuda" else None
    # built now (the placement probe reads the topology), started at the clock
    meters = RankMeters(args.out, rank, local_rank, args.device, uuid, args.numa_evidence)
    timeline["data_ready"] = time.time()

    # --- model and warm-up: untimed steps on a fixed batch, then back to the initial state ---
    torch.manual_seed(args.seed)
    training = set_up_training(args, train_config, numerics, loader.samples_per_rank, local_rank) \
        if args.mode == "train" else None  # loader_only: no model, only batches onto the device
    timeline["model_ready"] = training.ready if training else time.time()
    clock = StepClock(steps_per_epoch + 1, (lambda: torch.cuda.Event(enable_timing=True))
                      if device.type == "cuda" else None)  # events made (and first recorded) before the clock
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    synchronize(device)
    timeline["warmup_done"] = time.time()

    # --- timed epochs -----------------------------------------------------------------------
    with failure_named(args.out, rank, loader), meters:
        timed = timed_epochs(args, loader, steps_per_epoch, clock, tracer, meters, training,
                             numerics, device, timeline)
    timeline["train_done"] = time.time()
    # memory at the end of training: evaluation's larger batches must not set the peak
    memory = end_of_training_memory(device, uuid)
    measured = meters.record(timed.train_time)

    accuracy, test_images = None, None
    if training:
        test_config = loader_config(args, "test", rank, world, device, numerics.policy)
        correct, test_images = evaluate(training.model, test_config, args, numerics.model_input,
                                        numerics.autocast)
        accuracy = correct / max(1, test_images)
    timeline["eval_done"] = time.time()
    probed = probe_record(args, training, train_config, numerics, device)
    timeline["probe_done"] = time.time()

    local = rank_record(rank, timed, training, memory, {**measured, **probed}, uuid, parent_death,
                        args.epochs * steps_per_epoch)
    gathered: list[dict[str, Any]] = [{} for _ in range(world)]
    dist.all_gather_object(gathered, local)
    if rank == 0:  # one trial directory, shared by every node
        write_json_atomic(args.out / "result.json", {
            "metrics": combine_ranks(gathered, accuracy),
            "unmeasured": unmeasured(gathered),
            "measured_how": energy.trial_sources(gathered),
            "ranks": gathered,
            "world_size": world,
            "steps_per_epoch": steps_per_epoch,
            "test_images": test_images,
            "pin_memory_effective": loader.pin_memory,
            "host_dtype": train_config.host_dtype,
            "tf32_flags": numerics.tf32_flags,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "torch": torch.__version__,
            "timeline": timeline,
        })
    dist.destroy_process_group()


def init_distributed(device_kind: str, local_rank: int) -> torch.device:
    """This rank's device, with the process group up: nccl on GPUs, gloo on CPU."""
    cuda = device_kind == "cuda"
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("device = 'cuda' but torch.cuda.is_available() is False")
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    return device


@dataclass(frozen=True)
class Numerics:
    """The precision policy as this rank applies it."""

    policy: precision.PrecisionPolicy
    param_dtype: torch.dtype
    model_input: torch.dtype  # what a batch is cast to before the forward pass
    autocast: Any  # torch.autocast, or a null context
    tf32_flags: dict[str, Any]  # what was asked, what the libraries really did, and the env


def set_numerics(args: argparse.Namespace, device: torch.device) -> Numerics:
    policy = precision.PRECISIONS[args.precision]
    # what was asked, what the libraries really did, and the override variables the rank saw
    tf32_flags = {**precision.apply_tf32(policy), "measured": precision.measure_tf32(device),
                  "env": {name: os.environ.get(name) for name in DROPPED_ENV}}
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    # cast = "host": batches arrive in the input dtype; "device": float32, cast after the copy
    model_input = precision.torch_dtype(policy.param_dtype if args.cast == "device"
                                        else precision.input_dtype(policy))
    autocast = (
        torch.autocast(device.type, dtype=precision.torch_dtype(policy.autocast_dtype))
        if policy.autocast_dtype else nullcontext()
    )
    return Numerics(policy, precision.torch_dtype(policy.param_dtype), model_input, autocast, tf32_flags)


@dataclass(frozen=True)
class Training:
    """The model in training, warmed up and reset to its initial state."""

    model: torch.nn.Module
    ddp: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    warmed: list[int]  # the batch sizes the warm-up ran
    ready: float  # wall time the model was built, before its warm-up


def set_up_training(args: argparse.Namespace, config: LoaderConfig, numerics: Numerics,
                    samples_per_rank: int, local_rank: int) -> Training:
    model = torchvision.models.mobilenet_v2(num_classes=10).to(device=config.device,
                                                               dtype=numerics.param_dtype)
    if args.layout == "nhwc":
        model = model.to(memory_format=torch.channels_last)
    ddp = wrap(model, args.single_rank_ddp, config.world,
               local_rank if config.device.type == "cuda" else None)
    ready = time.time()
    warmed = warmup_batch_sizes(samples_per_rank, args.batch_size) if args.warmup_steps else []
    optimizer, scaler = warm_up(ddp, model, args, config, numerics.model_input, numerics.autocast,
                                numerics.policy, warmed)
    return Training(model, ddp, optimizer, scaler, warmed, ready)


def wrap(model: torch.nn.Module, single_rank: str, world: int, device_id: int | None) -> torch.nn.Module:
    """The model as the training step calls it. Several ranks: DDP with PyTorch's defaults (the
    paper's DDP-DS). One rank (`single_rank_ddp`): DDP still broadcasts every buffer before each
    forward and copies every gradient into its buckets, host work and kernels that only dilute a
    one-GPU ratio (about 1,100 more ATen ops per step on the H200 run); "lean" drops both,
    "none" the wrapper, "default" keeps PyTorch's defaults."""
    ids = [device_id] if device_id is not None else None
    if world > 1 or single_rank == "default":
        return DDP(model, device_ids=ids)
    if single_rank == "lean":
        # torch >= 2.14 names the per-forward broadcast `forward_sync_buffers` and warns at the old
        # name; the NGC image's 2.6 knows only `broadcast_buffers`
        import inspect

        forward = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters \
            else "broadcast_buffers"
        return DDP(model, device_ids=ids, gradient_as_bucket_view=True, **{forward: False})
    return model


@dataclass
class Timed:
    """What the clock saw over the timed epochs."""

    loss_sum: torch.Tensor  # on the device: no sync inside the step loop
    train_time: float = 0.0
    epoch_times: list[float] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    step_spans: list[float] = field(default_factory=list)  # host clock over the span of step_times
    h2d: list[float | None] = field(default_factory=list)  # the loader's copy time, each epoch
    sizes: set[int] = field(default_factory=set)  # the batch sizes timed
    samples: int = 0
    timer: BatchTimer[Any] = field(default_factory=BatchTimer)


def timed_epochs(args: argparse.Namespace, loader: Any, steps_per_epoch: int, clock: StepClock,
                 tracer: Tracer, meters: RankMeters, training: Training | None,
                 numerics: Numerics, device: torch.device, timeline: dict[str, float]) -> Timed:
    timed = Timed(torch.zeros((), device=device, dtype=torch.float64))
    # the capture starts before the clock: nsys's start-up (cudaProfilerStart) is not timed
    tracer.start()
    # meters first, then the barrier: every rank's clock starts right after it
    t_train = meters.start(dist.barrier)
    timeline["clock_start"] = time.time()
    for epoch in range(args.epochs):
        t_epoch = time.perf_counter()
        with tracer.range(f"epoch_start {epoch}"):  # a marker: the pause is measured from it
            batches = loader.epoch(epoch)  # the first next() starts non-persistent workers
        clock.start_epoch()
        span_start = time.perf_counter()
        for step in range(steps_per_epoch):
            clock.mark()
            if epoch == 0 and step == steps_per_epoch // 2:
                meters.snapshot()  # mid-epoch: the workers are alive and have touched their data
            # The first wait counts from the epoch start: worker start-up is the pause.
            images, labels, _ = timed.timer.next_batch(batches, loader.to_device,
                                                       t_epoch if step == 0 else None, tracer.range)
            timed.sizes.add(len(labels))
            with tracer.range("step"):
                if training:
                    timed.loss_sum += train_step(training.ddp, training.optimizer, training.scaler,
                                                 images.to(numerics.model_input), labels,
                                                 numerics.autocast, tracer)
            tracer.step()
            timed.samples += len(labels)
        clock.mark()
        # sync point: the epoch's queued GPU work is done, so the step clock's span (first to
        # last mark) ends here on the device timeline and on the host's clock alike
        synchronize(device)
        timed.step_spans.append(time.perf_counter() - span_start)
        if next(batches, None) is not None:  # run the loader to its end: shutdown, reset
            raise RuntimeError(f"loader {args.loader} yielded more than {steps_per_epoch} batches")
        timed.epoch_times.append(time.perf_counter() - t_epoch)
        timed.step_times += clock.intervals_s()
        timed.h2d.append(loader.h2d_seconds())
    synchronize(device)
    timed.train_time = time.perf_counter() - t_train
    # the meters' windows end where train_time does, not after the tracer's export
    meters.finish()
    tracer.stop()
    return timed


def probe_record(args: argparse.Namespace, training: Training | None, config: LoaderConfig,
                 numerics: Numerics, device: torch.device) -> dict[str, Any]:
    """The step probe's metrics (profiling.step_probe), or each null with why. It runs after
    evaluation, so nothing it does is timed or changes the accuracy; every rank runs it, as DDP's
    steps need them all."""
    why = ("probe_steps = 0" if not args.probe_steps else "CPU run: there are no GPU kernels"
           if device.type != "cuda" else "mode = loader_only: there is no training step"
           if training is None else None)
    if why:
        return {**dict.fromkeys(step_probe.METRICS), "probe_reason": why}
    assert training is not None
    images, labels, _ = next(LOADERS["synthetic"](config).epoch(0))
    training.model.train()

    def step() -> None:
        train_step(training.ddp, training.optimizer, training.scaler, images.to(numerics.model_input),
                   labels, numerics.autocast, NoTracer())

    step()  # sync point follows in probe(): evaluation's shapes and modes are behind us
    return {**step_probe.probe(step, args.probe_steps, lambda: synchronize(device)), "probe_reason": None}


def rank_record(rank: int, timed: Timed, training: Training | None, memory: dict[str, Any],
                measured: dict[str, Any], uuid: str | None, parent_death: str, steps: int
                ) -> dict[str, Any]:
    """What this rank measured, for rank 0 to combine (docs/design.md names)."""
    return {
        "rank": rank,
        # the node whose part started this rank (multicard.run.node_step), None on one node: with
        # static ranks rank 0 is node 0's
        "node": int(os.environ["MULTICARD_NODE"]) if "MULTICARD_NODE" in os.environ else None,
        "train_time_s": timed.train_time,
        "epoch_time_s": timed.epoch_times,
        "step_times_s": timed.step_times,
        "step_span_host_s": timed.step_spans,  # host clock over the span the step times cover
        "first_batch_latency_s": timed.timer.first_waits,
        "data_wait_s": timed.timer.data_wait_s,
        "h2d_wait_s": timed.timer.h2d_wait_s,
        "h2d_time_s": None if None in timed.h2d else sum(timed.h2d),  # type: ignore[arg-type]
        "samples": timed.samples,
        "batch_sizes_warmed": sorted(training.warmed) if training else [],
        "batch_sizes_timed": sorted(timed.sizes),
        "loss_mean": timed.loss_sum.item() / max(1, steps),
        **memory,
        **measured,
        "host": os.uname().nodename,
        "pid": os.getpid(),
        "gpu_uuid": uuid,
        "parent_death": parent_death,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),  # its binding's share (numa_bind)
        "torch_threads": torch.get_num_threads(),
    }


@contextmanager
def failure_named(out: Path, rank: int, loader: Any) -> Iterator[None]:
    """On an exception, write what this rank knows of its cause to failure-rank<R>.json for the
    runner: a killed DataLoader worker is named by its pid and signal from the worker's exit
    status, not from which exception happened to reach stderr first."""
    try:
        yield
    except Exception:
        dead = loader.dead_workers()
        if dead:
            pid, code = dead[0]
            how = (f"is killed by signal: {signal.strsignal(-code)}" if code < 0
                   else f"exited with status {code}")
            write_json_atomic(out / f"failure-rank{rank}.json", {
                "type": "DataLoaderWorkerKilled",
                "message": f"DataLoader worker (pid {pid}) {how}", "workers": dead})
        raise


def loader_config(args: argparse.Namespace, split: str, rank: int, world: int,
                  device: torch.device, policy: precision.PrecisionPolicy) -> LoaderConfig:
    """The loader's flat settings; `max_steps` becomes a fixed per-epoch sample budget."""
    training = split == "train"
    return LoaderConfig(
        scenario=args.scenario, mnist_dir=args.data_dir / "mnist",
        tree=scenario_b.tree_path(args.data_dir, args.image_size, args.data_format)
        if args.scenario == "b" else None,
        split=split, image_size=args.image_size, batch_size=args.batch_size, rank=rank,
        world=world, seed=args.seed, subset=args.train_subset if training else args.test_subset,
        epoch_samples=args.max_steps * args.batch_size * world if training else 0,
        num_workers=args.num_workers, pin_memory=args.pin_memory,
        prefetch_factor=args.prefetch_factor, persistent_workers=args.persistent_workers,
        layout=args.layout, normalize=args.normalize, dali_threads=args.dali_threads,
        dali_affinity=args.dali_affinity, device=device,
        host_dtype=precision.input_dtype(policy) if args.cast == "host" else "float32",
    )


def agree_on_steps(steps: int, device: torch.device) -> int:
    """DDP hangs if one rank takes a step the others do not: check before the first step."""
    bounds = torch.tensor([steps, -steps], device=device)
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX)
    if int(bounds[0]) != -int(bounds[1]):
        raise RuntimeError(f"ranks disagree on steps per epoch ({-int(bounds[1])}..{int(bounds[0])})")
    return steps


def warm_up(ddp: torch.nn.Module, model: torch.nn.Module, args: argparse.Namespace,
            config: LoaderConfig, model_input: torch.dtype, autocast: Any,
            policy: precision.PrecisionPolicy, sizes: list[int],
            ) -> tuple[torch.optim.Optimizer, torch.amp.GradScaler]:
    """Run `warmup_steps` untimed steps (library initialisation, allocator growth, DDP bucket
    rebuild) on the synthetic loader's fixed batch, then one step at every other batch size of
    `sizes` (cuDNN's autotuner tunes each new shape once: never inside the clock), then reset
    model, optimizer and scaler."""
    initial_state = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = make_optimizer(model, args)
    scaler = torch.amp.GradScaler(config.device.type, enabled=policy.grad_scaler)
    if sizes:
        fixed = LOADERS["synthetic"](config)
        images, labels, _ = next(fixed.epoch(0))
        for n in [sizes[0]] * args.warmup_steps + sizes[1:]:
            train_step(ddp, optimizer, scaler, images[:n].to(model_input), labels[:n], autocast,
                       NoTracer())
        with torch.no_grad():
            model.load_state_dict(initial_state)
        optimizer = make_optimizer(model, args)
        scaler = torch.amp.GradScaler(config.device.type, enabled=policy.grad_scaler)
    return optimizer, scaler


def evaluate(
    model: torch.nn.Module,
    config: LoaderConfig,
    args: argparse.Namespace,
    model_input: torch.dtype,
    autocast: Any,
) -> tuple[int, int]:
    """(correct, total) over the whole test set, each rank scoring a contiguous, disjoint shard."""
    test_set = make_dataset(config, "test")
    shard = np.array_split(np.arange(len(test_set)), config.world)[config.rank].tolist()  # type: ignore[arg-type]
    loader = DataLoader(Subset(test_set, shard), batch_size=2 * args.batch_size,
                        num_workers=args.num_workers, collate_fn=collate_for(config))
    counts = torch.zeros(2, dtype=torch.int64, device=config.device)
    model.eval()
    with torch.no_grad(), autocast:
        for images, labels, _ in loader:
            images = finish_on_device(images.to(config.device, non_blocking=True), config)
            labels = labels.to(config.device, non_blocking=True)
            counts[0] += (model(images.to(model_input)).argmax(dim=1) == labels).sum()
            counts[1] += len(labels)
    dist.all_reduce(counts)  # sums over ranks; the shards do not overlap
    return int(counts[0]), int(counts[1])


def combine_ranks(ranks: list[dict[str, Any]], test_accuracy: float | None) -> dict[str, Any]:
    """One trial's metrics from every rank's measurements (docs/design.md names).

    A job is as slow as its slowest rank, so times take the max over ranks; the pause before an
    epoch likewise, and memory. Waits, fractions and utilisation are averaged; samples summed.
    `data_wait_*` is the loader's next() alone; `h2d_wait_*` the host blocked in the copy.
    """
    train_time = max(r["train_time_s"] for r in ranks)
    epochs = len(ranks[0]["epoch_time_s"])
    step_times = [s for r in ranks for s in r["step_times_s"]]
    h2d = [r["h2d_time_s"] for r in ranks if r["h2d_time_s"] is not None]

    def mean_of(key: str) -> float | None:
        values = [r[key] for r in ranks if r.get(key) is not None]
        return statistics.fmean(values) if values else None

    def max_of(key: str) -> Any:
        values = [r[key] for r in ranks if r.get(key) is not None]
        return max(values) if values else None

    per_epoch = [max(r["epoch_time_s"][e] for r in ranks) for e in range(epochs)]
    return {
        "train_time_s": train_time,
        "epoch_time_s": per_epoch,
        # the epochs after the first, each: the first's one-off costs (workers' start, the data's
        # first touch) weigh more in train_time_s the fewer the epochs (a budget halves them)
        "steady_epoch_s": statistics.fmean(per_epoch[1:]) if epochs > 1 else None,
        "step_time_median_s": statistics.median(step_times) if step_times else None,
        "throughput_samples_s": sum(r["samples"] for r in ranks) / train_time,
        "data_wait_fraction": statistics.fmean(r["data_wait_s"] / r["train_time_s"] for r in ranks),
        "data_wait_s": mean_of("data_wait_s"),
        "h2d_wait_fraction": statistics.fmean(r["h2d_wait_s"] / r["train_time_s"] for r in ranks),
        "h2d_wait_s": mean_of("h2d_wait_s"),
        "first_batch_latency_s": [max(r["first_batch_latency_s"][e] for r in ranks)
                                  for e in range(epochs)],
        "h2d_time_s": max(h2d) if h2d else None,
        "test_accuracy": test_accuracy,
        "peak_mem_bytes": max_of("peak_mem_bytes"),
        "nvml_process_mem_bytes": max_of("nvml_process_mem_bytes"),
        "gpu_util_mean": mean_of("gpu_util_mean"),
        "train_loss": statistics.fmean(r["loss_mean"] for r in ranks),
        "local_page_fraction": mean_of("local_page_fraction"),
        "cpus_on_gpu_node_fraction": mean_of("cpus_on_gpu_node_fraction"),
        **{metric: mean_of(metric) for metric in step_probe.METRICS},
        "gpu_busy_fraction": busy_fraction(ranks),
        **trial_energy(ranks)[0],
        **trial_resources(ranks, train_time),
    }


def busy_fraction(ranks: list[dict[str, Any]]) -> float | None:
    """The share of a timed step in which the GPU computes: the probe's busy time per step over
    the rank's own median timed step (CUDA events), averaged over the ranks. It is measured, not
    clipped: a value over 1 says the probe's steps and the timed ones differ (shapes, clocks)."""
    shares = [r["probe_busy_s_per_step"] / statistics.median(r["step_times_s"]) for r in ranks
              if r.get("probe_busy_s_per_step") is not None and r["step_times_s"]
              and statistics.median(r["step_times_s"]) > 0]
    return statistics.fmean(shares) if len(shares) == len(ranks) else None


def trial_resources(ranks: list[dict[str, Any]], train_time: float) -> dict[str, Any]:
    """CPU the trial burned over its timed epochs (ranks with their threads, DALI's threads
    alone, loader workers), as seconds and mean cores, and how many stray CUDA contexts its
    ranks held."""
    def summed(key: str) -> float | None:
        values = [r.get(key) for r in ranks]
        return sum(values) if all(v is not None for v in values) else None  # type: ignore[arg-type]

    def cores(seconds: float | None) -> float | None:  # mean CPU cores busy over the timed epochs
        return seconds / train_time if seconds is not None and train_time > 0 else None

    rank_s, workers_s, dali_s = summed("rank_cpu_s"), summed("workers_cpu_s"), summed("dali_threads_cpu_s")
    strays = [r.get("stray_contexts") for r in ranks]
    return {"rank_cpu_s": rank_s, "workers_cpu_s": workers_s, "dali_threads_cpu_s": dali_s,
            "rank_cores_mean": cores(rank_s), "workers_cores_mean": cores(workers_s),
            "dali_threads_cores_mean": cores(dali_s),
            "cpu_cores_mean": cores(rank_s + workers_s)
            if rank_s is not None and workers_s is not None else None,
            "stray_contexts": sum(len(s) for s in strays if s is not None)
            if all(s is not None for s in strays) else None}


def trial_energy(ranks: list[dict[str, Any]]) -> tuple[dict[str, float | None], dict[str, str]]:
    """Energy over the timed epochs: every GPU's, per image, mean power; the nodes' CPU packages."""
    return energy.trial_metrics(ranks, sum(r["samples"] for r in ranks),
                                max(r["train_time_s"] for r in ranks))


UNMEASURED_ON_CPU = {
    "h2d_time_s": "CPU run: there is no host-to-device copy",
    "gpu_util_mean": "CPU run: no GPU to sample",
    "nvml_process_mem_bytes": "CPU run: no GPU",
}


def unmeasured(ranks: list[dict[str, Any]]) -> dict[str, str]:
    """Why each metric that is null could not be measured (DESIGN: null with a reason, never 0)."""
    reasons = trial_energy(ranks)[1]
    if len(ranks[0]["epoch_time_s"]) < 2:
        reasons["steady_epoch_s"] = "one epoch: none after the first"
    cpu_why = next((r.get("cpu_reason") or "the rank recorded no CPU time" for r in ranks
                    if r.get("rank_cpu_s") is None), None)
    if cpu_why:
        reasons |= dict.fromkeys(("rank_cpu_s", "workers_cpu_s", "cpu_cores_mean", "rank_cores_mean",
                                  "workers_cores_mean"), cpu_why)
    for metric, why_key in (("stray_contexts", "stray_contexts_reason"),
                            ("dali_threads_cpu_s", "dali_threads_reason")):
        why = next((r.get(why_key) or "not recorded" for r in ranks if r.get(metric) is None), None)
        if why:
            reasons[metric] = why
    if any(r.get("probe_busy_s_per_step") is None for r in ranks):
        why = next(r.get("probe_reason") or "the probe found no kernels" for r in ranks
                   if r.get("probe_busy_s_per_step") is None)
        reasons |= dict.fromkeys((*step_probe.METRICS, "gpu_busy_fraction"), why)
    if "dali_threads_cpu_s" in reasons:
        reasons["dali_threads_cores_mean"] = reasons["dali_threads_cpu_s"]
    for metric in ("local_page_fraction", "cpus_on_gpu_node_fraction"):
        if all(r.get(metric) is None for r in ranks):
            reasons[metric] = ("numa_evidence is off: no NUMA placement probe in this trial"
                               if all(metric not in r for r in ranks)
                               else "the placement probe found none (numa/ in the trial directory)")
    if all(r["gpu_uuid"] is None for r in ranks):
        reasons |= UNMEASURED_ON_CPU
    else:
        if all(r["gpu_util_mean"] is None for r in ranks):
            reasons["gpu_util_mean"] = "NVML gave no utilisation samples for this GPU"
        why = next((r["nvml_process_mem_reason"] for r in ranks if r.get("nvml_process_mem_reason")), None)
        if why and all(r["nvml_process_mem_bytes"] is None for r in ranks):
            reasons["nvml_process_mem_bytes"] = why
        if all(r["h2d_time_s"] is None for r in ranks):
            reasons["h2d_time_s"] = "the loader copies inside its own pipeline (DALI) or not at all"
    return reasons


def end_of_training_memory(device: torch.device, uuid: str | None) -> dict[str, Any]:
    """Peak allocated device memory of the training (torch's allocator) and what NVML charges
    this process on its GPU now (context, allocator reserve, DALI and NCCL pools); on CPU the
    rank process's peak RSS."""
    if device.type != "cuda":
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        return {"peak_mem_bytes": rss, "nvml_process_mem_bytes": None, "nvml_process_mem_reason": None}
    nvml_bytes, reason = rank_device_bytes(devices.GpuIdentity(-1, uuid, None))
    return {"peak_mem_bytes": int(torch.cuda.max_memory_allocated(device)),
            "nvml_process_mem_bytes": nvml_bytes, "nvml_process_mem_reason": reason}


def gpu_uuid(device: torch.device) -> str:
    """NVML identifies GPUs by UUID; CUDA_VISIBLE_DEVICES renumbers indices but not UUIDs."""
    return "GPU-" + str(torch.cuda.get_device_properties(device).uuid)


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    integrity.write_text_atomic(path, json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
