"""`multicard first-evidence`: the first verdicts one GPU can give, in one command of at most 9 minutes.

    PYTHONPATH=src python3 -m multicard first-evidence --dry-run   # the plan and its estimate
    PYTHONPATH=src python3 -m multicard first-evidence             # run, report, verify
    PYTHONPATH=src python3 -m multicard first-evidence --out DIR   # again: go on where it stopped

It needs Python, torch, torchvision and the small wheels NEEDED names (no nox, DALI or
torchtune) and writes one collection,
`artifact/runs/1x<gpu>-first-evidence-<UTC>/` by default:
1. `operating_point/`: the step profile (multicard.workloads.step_profile) at 100, 224 and 300 px for
   FP64, FP32 and FP16 and the one-rank DDP wrappings at 224 px in FP32 (the trials at 224 px
   probe themselves): where the GPU, and where the host, sets the pace of a step;
2. `table2_precision-first_evidence/`: FP64, FP32 and FP16 at 224 px, batch 128, one GPU, 5
   trials each, interleaved (experiments/table2_precision.toml, profile first_evidence), started
   with a deadline so that the report still fits; C1 and C2 are judged, C3 read off the same
   trials (not at convergence, and said so);
3. `multicard report` and `multicard verify` over the collection.
The plan comes first: each part's estimate from the rates measured in the runs named by
--calibrate (default: the committed GPU runs under artifact/runs/), carried to 224 px and batch
128 by the GPU's share of a step (plan/calibrate.py), and whether it fits --budget-s.
Exit status: 0 every part ran and the report verified; 1 a part failed, the verification failed,
or (--dry-run) the plan does not fit; 2 bad input; 3 trials were left for lack of time (run it
again with --out DIR).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from multicard.errors import InputError
from multicard.measure import telemetry
from multicard.plan import calibrate, params
from multicard.plan import spec as specmod
from multicard.publish.runs import calibration
from multicard.run.runner import format_duration

BUDGET_S = 9 * 60
EXPERIMENT, PROFILE = "table2_precision", "first_evidence"
PROFILE_SIZES, PROFILE_PRECISIONS = (100, 224, 300), ("fp64", "fp32", "fp16")
PROFILE_DDP_AT, PROFILE_DDP = (224, "fp32"), ("lean", "default", "none")
PROFILE_STEPS = 10  # timed, and as many profiled, per point
# guessed, and said so in the plan: the step profile's process start (imports, CUDA, a group of
# one) and each point's profiler start, trace export and read; the report's tables, figures
# and checksums, and verify
PROFILE_START_S, PROFILE_POINT_S, REPORT_S = 15.0, 3.0, 30.0
LEFT_FOR_LATER = 3


@dataclass(frozen=True)
class Part:
    name: str
    seconds: float
    how: str  # where the estimate comes from


def plan(spec: specmod.Spec, rates: dict[str, calibrate.Rate]) -> list[Part]:
    """The parts in the order they run, each with its estimate and where that comes from."""
    trials = [calibrate.estimate(spec.workload, p.params, rates, p.trace) for p in specmod.plan(spec)]
    start = rates.get(calibrate.run_start_key(spec.workload))
    sources = sorted({f"{e.how} ({e.source})" if e.source else e.how for e in trials})
    trials_s = sum(e.seconds for e in trials) + (start.startup_s if start else 0.0)
    return [Part("operating point", profile_seconds(spec, rates),
                 f"step times as the trials'; {PROFILE_START_S:g} s start and {PROFILE_POINT_S:g} s "
                 "per point guessed"),
            Part(f"trials ({len(trials)})", trials_s, "; ".join(sources)),
            Part("report and verify", REPORT_S, "guessed")]


def profile_points(spec: specmod.Spec) -> list[dict[str, params.Value]]:
    """The step profile's points as vision settings: the trials' own at another size, precision
    or one-rank wrapping (what step_profile makes of profile_argv's flags)."""
    base = specmod.plan(spec)[0].params
    found = [{**base, "image_size": s, "precision": p} for p in PROFILE_PRECISIONS for s in PROFILE_SIZES]
    size, precision = PROFILE_DDP_AT
    return found + [{**base, "image_size": size, "precision": precision, "single_rank_ddp": w}
                    for w in PROFILE_DDP if w != base["single_rank_ddp"]]


def profile_seconds(spec: specmod.Spec, rates: dict[str, calibrate.Rate]) -> float:
    """Each point's warm-up, one step, its timed and its profiled steps at its step time."""
    steps = int(specmod.plan(spec)[0].params["warmup_steps"]) + 1 + 2 * PROFILE_STEPS
    return PROFILE_START_S + sum(PROFILE_POINT_S + steps * calibrate.step_seconds(point, rates)
                                 for point in profile_points(spec))


# set by step_profile's own flags for each point; the trials' other settings go after `--`
POINT_SETTINGS = ("device", "precision", "image_size", "batch_size", "single_rank_ddp")


def profile_argv(spec: specmod.Spec, out: Path) -> list[str]:
    from multicard.plan import params
    base = specmod.plan(spec)[0].params
    size, precision = PROFILE_DDP_AT
    rest = {k: v for k, v in base.items() if k not in POINT_SETTINGS}
    return [sys.executable, "-m", "multicard.workloads.step_profile", "--out", str(out),
            "--device", str(base["device"]), "--batch-size", str(base["batch_size"]),
            "--sizes", ",".join(map(str, PROFILE_SIZES)), "--precisions", ",".join(PROFILE_PRECISIONS),
            "--steps", str(PROFILE_STEPS), "--ddp", ",".join(PROFILE_DDP),
            "--ddp-at", f"{size}:{precision}", "--", *params.to_flags(rest)]


def default_sources(runs: Path) -> list[Path]:
    """The committed runs a plan is calibrated from: every collection under `runs` but the CPU
    smoke and bench ones (a CPU rate never matches a GPU key anyway)."""
    if not runs.is_dir():
        return []
    return sorted(d for d in runs.iterdir() if d.is_dir() and not d.name.startswith(("smoke-", "bench-")))


def run_name(gpu_names: list[str]) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    model = re.sub(r"[^a-z0-9]+", "-", (gpu_names[0] if gpu_names else "cpu").lower()).strip("-")
    return f"{'1x' if gpu_names else ''}{model}-first-evidence-{stamp}"


def show(parts: list[Part], budget_s: float) -> bool:
    """Print the plan; whether it fits the budget."""
    for part in parts:
        print(f"{part.name}: estimated {format_duration(part.seconds)} ({part.how})")
    total = sum(p.seconds for p in parts)
    fits = total <= budget_s
    print(f"total: estimated {format_duration(total)} ({'within' if fits else 'OVER'} the "
          f"{format_duration(budget_s)} target)")
    return fits


def main(args: argparse.Namespace) -> int:
    """`args`: out, dry_run, budget_s (None: BUDGET_S), calibrate (None: default_sources) and
    experiments, as `multicard first-evidence` parses them."""
    args.budget_s = BUDGET_S if args.budget_s is None else args.budget_s
    if not 0 < args.budget_s < 86_400:
        raise InputError(f"--budget-s: expected seconds between 0 and a day, got {args.budget_s:g}")
    spec_file = args.experiments / f"{EXPERIMENT}.toml"
    if not spec_file.is_file():
        raise InputError(f"{spec_file}: not found (run from the checkout's root, or give --experiments)")
    spec = load_spec(spec_file)
    sources = args.calibrate if args.calibrate is not None else default_sources(Path("artifact/runs"))
    rates = calibration(sources)
    parts = plan(spec, rates)
    fits = show(parts, args.budget_s)
    if args.dry_run:
        print("--dry-run: nothing started")
        return 0 if fits else 1
    check_machine(telemetry.visible_gpus(), missing_modules())
    # a hung step profile must not eat the trials' minutes: three times its estimate
    return collect(args, spec_file, sources, profile_limit_s=3 * parts[0].seconds)


# beyond torch and torchvision: the runner's statistics, the report's tables and figures, the
# GPUs' NVML readings and the run directory's files
NEEDED = ("numpy", "pandas", "scipy", "matplotlib", "tabulate", "filelock", "pynvml", "tomli_w")


def missing_modules() -> list[str]:
    return [name for name in ("torch", "torchvision", *NEEDED) if importlib.util.find_spec(name) is None]


def check_machine(gpus: list[Any], missing: list[str]) -> None:
    """Bad input before anything is written: no GPU (the plan is for one; --dry-run plans on any
    machine) or a module the parts import."""
    if not gpus:
        raise InputError("first-evidence: no GPU visible (it runs on one; --dry-run plans on any machine)")
    if missing:
        raise InputError(f"first-evidence: missing Python modules: {', '.join(missing)} "
                         "(small wheels: pip install them beside torch)")


def collect(args: argparse.Namespace, spec_file: Path, sources: list[Path], profile_limit_s: float) -> int:
    """Run the three parts into the collection; the exit status the module's docstring gives."""
    started = time.time()
    gpus = [g.name or "gpu" for g in telemetry.visible_gpus()[:1]]
    out = args.out or Path("artifact/runs") / run_name(gpus)
    failed = step_profile(load_spec(spec_file), out / "operating_point", profile_limit_s)
    # no trial starts that would leave the report too little time
    deadline = started + args.budget_s - REPORT_S
    calibrated = ["--calibrate", *map(str, sources)] if sources else []
    trials = call(["run", str(spec_file), "--profile", PROFILE, "--out", str(out / f"{EXPERIMENT}-{PROFILE}"),
                   "--deadline", f"@{deadline:.0f}", *calibrated])
    reported = call(["report", str(out)]) == 0 and call(["verify", str(out)]) == 0
    print(f"first-evidence: {out} in {format_duration(time.time() - started)}")
    if failed or trials not in (0, LEFT_FOR_LATER) or not reported:
        return 1
    return LEFT_FOR_LATER if trials == LEFT_FOR_LATER else 0


def load_spec(spec_file: Path) -> specmod.Spec:
    return specmod.load(spec_file, PROFILE)


def step_profile(spec: specmod.Spec, where: Path, limit_s: float) -> bool:
    """The operating point part (once: a collection that has it keeps it); whether it failed."""
    found = where / "step_profile.json"
    if found.is_file():
        print(f"operating point: kept from {found}")
        return False
    where.mkdir(parents=True, exist_ok=True)
    with (where / "step_profile.log").open("w") as log:
        try:
            done = subprocess.run(profile_argv(spec, found), stdout=log, stderr=subprocess.STDOUT,
                                  check=False, timeout=limit_s).returncode
        except subprocess.TimeoutExpired:
            done = None
    print((where / "step_profile.log").read_text(errors="replace"), end="")
    if done is None:
        print(f"operating point: failed: stopped after {limit_s:.0f} s (3x its estimate)")
    return done != 0


def call(words: list[str]) -> int:
    """`multicard WORDS` in a process of its own, as a user would type it; its exit status."""
    return subprocess.run([sys.executable, "-m", "multicard", *words], check=False).returncode
