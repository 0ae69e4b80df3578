"""The harness's own cost, measured well enough to state: its epoch path against a plain loop of
the same step, in A-B-B-A blocks of one process, with an A/A control.

    python3 benchmarks/harness_ab.py --out FILE.json                  # one GPU, both points, ~6 min
    python3 benchmarks/harness_ab.py --out FILE.json --device cpu     # tiny sizes, blocks of 0.5 s
    python3 benchmarks/harness_ab.py --out F --block-s 2.5 --pairs 10 --control-pairs 4 --bare-pairs 4

The arms share one model, optimizer, GradScaler and resident batch (the synthetic loader's, built
by vision.loader_config and set up by vision.set_up_training: the harness's model, its one-rank
wrapping `single_rank_ddp`, precision policy, TF32 switches, cuDNN setting and warm-up):

- A, the harness: vision.timed_epochs as a trial's timed epochs run it: a fresh RankMeters (NVML
  utilisation and energy threads, RAPL, the rank's CPU times, perf's window; started with the
  group's barrier, a mid-epoch snapshot request written as under the runner, finished at the
  end), the loader's epoch iterator (EPOCHS_PER_BLOCK epochs a block, each ended by a
  synchronize and the loader run to its end), the BatchTimer around every next() and copy, the
  step clock's marks (CUDA events made once per point, as once per trial), the loss summed on the
  device. Its seconds are the harness's own `train_time` (its clock, from the barrier to the
  last synchronize); the meters' set-up and finish around it are kept as `call_s`, outside.
- B, the plain loop: vision.train_step on the same model and batch, the same number of steps,
  with a synchronize and time.perf_counter() before and after the block, nothing else.
- bare (DDP's host bookkeeping, at the point that says so): B's loop on a second model built the
  same way but without DDP (`single_rank_ddp = "none"`), its own optimizer and scaler.

What A leaves out of a trial: the runner's observer answering the snapshot from another process
(its /proc scans use other cores), the loader's workers (the synthetic loader has none) and a
trace. Why A-B-B-A: a GPU's clocks and the host's load drift, and blocks of one process are not
independent trials; pair k is the k-th A block with the k-th B block, and in each A-B-B-A quartet
A runs first in one pair and last in the other, so a linear drift cancels in the mean (an A-B
order would keep it as a bias). The ratio is judge.stats.paired_log_ratio over the pairs' images/s
(harness over plain loop: below 1, the harness is slower), its 95 % interval Student's t over the
pairs; the goal is an interval within +-GOAL (its relative half-width), and the output says only
whether it was met. The A/A control runs the harness arm against itself in the same order: it
must read about 1, and its interval is the method's own noise.

Each block lasts about --block-s: a short probe of B after the warm-up sets the steps, over
EPOCHS_PER_BLOCK epochs of the loader (more where one epoch of the training set's full batches
cannot hold them); one block of each arm then settles (kept, in no ratio). Both points run in this
one process, one after the other: a second process would spend its start (imports, a CUDA
context, a process group: ~10 s on the H200) on nothing measured, and what one point leaves
behind (the allocator's cache, cuDNN's plans) weighs on both arms of the next alike, since every
ratio is taken within a point. The process is one rank of a one-rank group (file://
rendezvous), as a one-GPU trial: nccl on GPUs, gloo on CPU.

It writes FILE: every block's raw seconds, steps and images (hyperfine style: the samples beside
the summary), the probe, the settings, the ratios and the lines it prints, one per point:
`harness / plain loop at <size>: R [lo, hi] (n pairs; goal +-2 %: met|not met); A/A control: R [lo, hi]`.
"""

from __future__ import annotations

import time

T_START = time.monotonic()  # before the imports: a caller learns this process's start-up cost

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # a bare checkout: no install needed
    sys.path.insert(0, str(ROOT / "src"))

from multicard.plan import launch  # noqa: E402


def cpu_trial_env(argv: list[str]) -> dict[str, str]:
    """A CPU run's OpenMP spin count, as a CPU trial's (launch.cpu_trial_env says why: on 2 shared
    cores the default spin made a 0.2 s step take seconds); {} on a GPU, or where it is set."""
    device = "cuda"
    for i, arg in enumerate(argv):
        if arg == "--device" and i + 1 < len(argv):
            device = argv[i + 1]
        elif arg.startswith("--device="):
            device = arg.split("=", 1)[1]
    return launch.cpu_trial_env(device, os.environ)


os.environ.update(cpu_trial_env(sys.argv[1:]))  # libgomp reads it once, when torch loads

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from multicard.integrity import write_text_atomic  # noqa: E402
from multicard.judge import stats  # noqa: E402
from multicard.loaders import LOADERS  # noqa: E402
from multicard.measure import observe  # noqa: E402
from multicard.measure.meters import RankMeters  # noqa: E402
from multicard.measure.timing import StepClock  # noqa: E402
from multicard.plan import cost, params  # noqa: E402
from multicard.profiling.capture import NoTracer  # noqa: E402
from multicard.workloads import vision  # noqa: E402

GOAL = 0.02  # the interval's relative half-width this measurement aims at
BLOCK_S = {"cuda": 5.0, "cpu": 0.5}
PAIRS, CONTROL_PAIRS, BARE_PAIRS = 10, 4, 4
PROBE_STEPS = {"cuda": 20, "cpu": 5}
# as a trial's timed epochs: the epoch boundary (iter(loader), the synchronize, the loader run to
# its end) is part of the harness's path, so every block crosses one
EPOCHS_PER_BLOCK = 2
NO_TRACE = NoTracer()


@dataclass(frozen=True)
class Point:
    """An operating point: the vision settings both arms run, and whether DDP's host bookkeeping
    (the plain loop against a bare model) is measured there too."""

    name: str
    settings: dict[str, Any]
    bare: bool = False

    @property
    def label(self) -> str:
        s = self.settings
        return f"{s['image_size']} px, batch {s['batch_size']}, {s['precision']}"


# host-bound: the device check's harness settings (fp16 at 100 px, batch 64: the host sets the
# pace, so the harness's host work weighs the most: the worst case); judged: the first evidence's
# operating point (table2_precision@first_evidence, fp32 at 224 px, batch 128: GPU-bound).
# On CPU, tiny stand-ins of both, in fp32 (a CPU without bf16 units emulates it: a 32 px step of
# batch 16 took 1-4 s on the 2-core development machine against 0.3 s in fp32), for the path,
# not the numbers.
POINTS: dict[str, tuple[Point, ...]] = {
    "cuda": (Point("host-bound", {"image_size": 100, "batch_size": 64, "precision": "fp16",
                                  "layout": "nhwc", "cast": "host"}, bare=True),
             Point("judged", {"image_size": 224, "batch_size": 128, "precision": "fp32",
                              "cast": "host"})),
    "cpu": (Point("host-bound", {"image_size": 32, "batch_size": 8, "precision": "fp32",
                                 "layout": "nhwc", "cast": "host", "warmup_steps": 1,
                                 "train_subset": 1024}, bare=True),
            Point("judged", {"image_size": 48, "batch_size": 16, "precision": "fp32", "cast": "host",
                             "warmup_steps": 1, "train_subset": 1024})),
}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON file of raw blocks and ratios")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--block-s", type=float, help=f"seconds a block lasts (default {BLOCK_S})")
    parser.add_argument("--pairs", type=int, default=PAIRS, help="A-B pairs of harness and plain loop")
    parser.add_argument("--control-pairs", type=int, default=CONTROL_PAIRS,
                        help="pairs of the A/A control (the harness arm against itself)")
    parser.add_argument("--bare-pairs", type=int, default=BARE_PAIRS,
                        help="pairs of plain loop and bare loop where a point measures DDP's host "
                             "bookkeeping (0: none)")
    parser.add_argument("--points", help=f"comma-separated, of {', '.join(p.name for p in POINTS['cuda'])}"
                                         " (default: all, in that order)")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data")
    args = parser.parse_args(argv)
    if args.block_s is None:
        args.block_s = BLOCK_S[args.device]
    if args.block_s <= 0 or min(args.pairs, args.control_pairs, args.bare_pairs) < 0:
        parser.error("--block-s must be > 0 and every pair count >= 0")
    known = {p.name: p for p in POINTS[args.device]}
    names = [n.strip() for n in (args.points or ",".join(known)).split(",") if n.strip()]
    if not names or set(names) - set(known):
        parser.error(f"--points: expected some of {', '.join(known)}, got {args.points!r}")
    args.points = [known[n] for n in names]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)  # before minutes of blocks, not after
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    with one_rank_group(device):
        points = [measure_point(point, args, device) for point in args.points]
    lines = [line for found in points for line in point_lines(found)]
    write_text_atomic(args.out, json.dumps({
        "schema": 1, "device": args.device,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__, "host": socket.gethostname(), "pid": os.getpid(),
        "argv": sys.argv if argv is None else argv, "block_s": args.block_s, "pairs": args.pairs,
        "control_pairs": args.control_pairs, "bare_pairs": args.bare_pairs,
        "confidence": stats.CONFIDENCE, "goal_half_width": GOAL, "points": points, "lines": lines,
        "process_wall_s": time.monotonic() - T_START}, indent=1))
    for line in lines:
        print(line)
    return 0


@contextmanager
def one_rank_group(device: torch.device) -> Iterator[None]:
    """A one-rank process group, as a one-GPU trial has (the meters' barrier, DDP's reducer)."""
    with tempfile.TemporaryDirectory() as rendezvous:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                init_method=f"file://{rendezvous}/store", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


# --- one operating point ----------------------------------------------------------------------

@dataclass
class Arms:
    """Everything a block of each arm runs on, set up once per point."""

    settings: argparse.Namespace
    numerics: vision.Numerics
    training: vision.Training
    loader: Any
    clock: StepClock
    device: torch.device
    scratch: Path
    bare: vision.Training | None = None
    uuid: str | None = None
    batch: tuple[torch.Tensor, torch.Tensor] = field(init=False)

    def __post_init__(self) -> None:
        # the plain loop's batch: the resident one the harness's loader serves (every block's
        # batches are full: the loader's epoch is max_steps x batch images)
        images, labels, _ = next(self.loader.epoch(0))
        self.batch = (images, labels)

    @property
    def steps(self) -> int:
        return self.settings.epochs * self.loader.steps_per_epoch

    def harness(self) -> dict[str, Any]:
        """A: one run of the harness's timed epochs, as a trial runs them."""
        vision.synchronize(self.device)  # as before a trial's clock: nothing queued from before
        meters = RankMeters(self.scratch, 0, 0, self.device.type, self.uuid, numa_evidence=False)
        started = time.perf_counter()
        with meters:
            timed = vision.timed_epochs(self.settings, self.loader, self.loader.steps_per_epoch,
                                        self.clock, NO_TRACE, meters, self.training, self.numerics,
                                        self.device, {})
        return {"seconds": timed.train_time, "steps": self.steps, "images": timed.samples,
                "call_s": time.perf_counter() - started, "step_clock_s": sum(timed.step_times)}

    def plain(self) -> dict[str, Any]:
        """B: the same steps of the same model, a synchronize and the host clock around them."""
        return plain_block(self.training, self.batch, self.numerics, self.steps, self.device)

    def bare_loop(self) -> dict[str, Any]:
        """B's loop on the model without DDP."""
        assert self.bare is not None
        return plain_block(self.bare, self.batch, self.numerics, self.steps, self.device)


def plain_block(training: vision.Training, batch: tuple[torch.Tensor, torch.Tensor],
                numerics: vision.Numerics, steps: int, device: torch.device) -> dict[str, Any]:
    """`steps` training steps timed from a synchronize to a synchronize: the queued work before
    stays out, the loop's own is in. The cast to the model's input dtype is the harness's call."""
    images, labels = batch
    vision.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        vision.train_step(training.ddp, training.optimizer, training.scaler,
                          images.to(numerics.model_input), labels, numerics.autocast, NO_TRACE)
    vision.synchronize(device)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "steps": steps, "images": steps * len(labels)}


def point_settings(point: Point, device: torch.device, data_dir: Path, scratch: Path) -> argparse.Namespace:
    """The vision rank's settings at this point, as a trial's command line gives them."""
    values = {**point.settings, "device": device.type, "loader": "synthetic"}
    return vision.parse_args([*params.to_flags(values), "--data-dir", str(data_dir), "--out", str(scratch)])


def set_up(point: Point, args: argparse.Namespace, device: torch.device,
           scratch: Path) -> tuple[Arms, dict[str, Any]]:
    """The point's model (and its bare twin), warmed up as a trial warms up; the probe; the
    loader and step clock sized for blocks of about --block-s. Returns the arms and the probe."""
    settings = point_settings(point, device, args.data_dir, scratch)
    numerics = vision.set_numerics(settings, device)
    probe_steps = PROBE_STEPS[device.type]
    settings.epochs, settings.max_steps = 1, probe_steps
    config = vision.loader_config(settings, "train", 0, 1, device, numerics.policy)
    first = LOADERS["synthetic"](config)
    torch.manual_seed(settings.seed)
    training = vision.set_up_training(settings, config, numerics, first.samples_per_rank, 0)
    bare = bare_training(settings, config, numerics, first.samples_per_rank) \
        if point.bare and args.bare_pairs else None
    images, labels, _ = next(first.epoch(0))
    probe_s = plain_block(training, (images, labels), numerics, probe_steps, device)["seconds"]
    total = math.ceil(args.block_s / max(probe_s / probe_steps, 1e-6))
    per_epoch = cost.full_batches(settings.train_subset, settings.batch_size, 1)
    settings.epochs, settings.max_steps = cost.steps_over_epochs(total, EPOCHS_PER_BLOCK, per_epoch)
    loader = LOADERS["synthetic"](vision.loader_config(settings, "train", 0, 1, device, numerics.policy))
    # as vision.main makes it: events made (and first recorded) once, reused by every block
    clock = StepClock(loader.steps_per_epoch + 1, (lambda: torch.cuda.Event(enable_timing=True))
                      if device.type == "cuda" else None)
    uuid = vision.gpu_uuid(device) if device.type == "cuda" else None
    arms = Arms(settings, numerics, training, loader, clock, device, scratch, bare, uuid)
    return arms, {"steps": probe_steps, "seconds": probe_s}


def bare_training(settings: argparse.Namespace, config: Any, numerics: vision.Numerics,
                  samples_per_rank: int) -> vision.Training:
    """The same model, set up the same way, without DDP: DDP's host bookkeeping shows apart."""
    bare = argparse.Namespace(**{**vars(settings), "single_rank_ddp": "none"})
    torch.manual_seed(settings.seed)
    found = vision.set_up_training(bare, config, numerics, samples_per_rank, 0)
    if isinstance(found.ddp, DDP):  # a vision.py that no longer knows single_rank_ddp = "none"
        raise RuntimeError("vision.set_up_training wrapped the bare model in DDP")
    return found


def measure_point(point: Point, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Set up, settle, then the A-B pairs, the A/A control and (where the point says) the plain
    loop against the bare loop, each in A-B-B-A order; raw blocks and ratios."""
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        # an observer's marker: the mid-epoch snapshot writes its request, as under the runner
        observe.marker(scratch, socket.gethostname()).write_text("{}")
        started = time.monotonic()
        arms, probe = set_up(point, args, device, scratch)
        setup_s = time.monotonic() - started
        settle = [{"arm": "harness", **arms.harness()}, {"arm": "plain", **arms.plain()}]
        runs = {"main": run_blocks(stats.abba_order(args.pairs), {"A": ("harness", arms.harness),
                                                                 "B": ("plain", arms.plain)}),
                "control": run_blocks(stats.abba_order(args.control_pairs),
                                      {"A": ("harness", arms.harness), "B": ("harness", arms.harness)})}
        if arms.bare is not None:
            runs["bare"] = run_blocks(stats.abba_order(args.bare_pairs), {"A": ("plain", arms.plain),
                                                                        "B": ("bare", arms.bare_loop)})
    s = arms.settings
    return {"name": point.name, "label": point.label,
            "settings": {k: v for k, v in vars(s).items() if k in params.VISION},
            "epochs": s.epochs, "steps_per_epoch": arms.loader.steps_per_epoch, "steps": arms.steps,
            "probe": probe, "setup_s": setup_s, "settle": settle,
            "blocks": [{"run": run, **block} for run, blocks in runs.items() for block in blocks],
            "results": {run: paired(blocks) for run, blocks in runs.items()}}


def run_blocks(order: list[str], arms: dict[str, tuple[str, Callable[[], dict[str, Any]]]]
               ) -> list[dict[str, Any]]:
    """One block per slot of `order`, each by its slot's arm; raw seconds, steps and images."""
    found = []
    for slot in order:
        name, run = arms[slot]
        found.append({"slot": slot, "arm": name, **run()})
    return found


def paired(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """The A slots' images/s over the B slots', pair by pair, with its interval and half-width."""
    a, b = stats.paired_blocks([x["slot"] for x in blocks], [x["images"] / x["seconds"] for x in blocks])
    r = stats.paired_log_ratio(a, b)
    half = stats.relative_half_width(r)
    return {"ratio": _finite(r.value), "ci_lo": _finite(r.ci_lo), "ci_hi": _finite(r.ci_hi),
            "pairs": len(a), "half_width": _finite(half), "goal_met": bool(half <= GOAL),
            "of": "images/s"}


def _finite(value: float) -> float | None:
    """JSON has no NaN: an undefined value is null."""
    return value if math.isfinite(value) else None


# --- what it prints ---------------------------------------------------------------------------

def ratio_text(found: dict[str, Any] | None) -> str:
    """`R [lo, hi]`, `R [no interval]` with fewer than two pairs, `n/a` where nothing ran."""
    if found is None or found.get("ratio") is None:
        return "n/a"
    if found.get("ci_lo") is None:
        return f"{found['ratio']:.4f} [no interval]"
    return f"{found['ratio']:.4f} [{found['ci_lo']:.4f}, {found['ci_hi']:.4f}]"


def point_lines(point: dict[str, Any]) -> list[str]:
    """The point's lines: the harness against the plain loop with the goal and the A/A control;
    DDP's host bookkeeping where it was measured."""
    results = point["results"]
    main = results["main"]
    goal = "met" if main["goal_met"] else "not met"
    lines = [f"harness / plain loop at {point['label']}: {ratio_text(main)} ({main['pairs']} pairs; "
             f"goal +-{GOAL * 100:g} %: {goal}); A/A control: {ratio_text(results['control'])}"]
    if "bare" in results:
        lines.append(f"plain loop / bare loop at {point['label']} (DDP's host bookkeeping): "
                     f"{ratio_text(results['bare'])} ({results['bare']['pairs']} pairs)")
    return lines


if __name__ == "__main__":
    sys.exit(main())
