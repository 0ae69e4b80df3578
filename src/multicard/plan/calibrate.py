"""Measured rates for the cost model, fitted from the ok trials of finished runs.

`multicard plan --calibrate RUN...` reads every ok trial of the runs (or a calibration
file saved before) and fits, per rate key (every setting of the trial except how much work it
does and where its files are: a rate measured at 1 GPU says nothing of 4, nor DataLoader workers
of DALI; a profiled trial's rate is apart from the timing trials'):
- vision: training images/s of one rank (on CPU, where the ranks of a node share its cores, of
  the node);
- LLM: training tokens/s per GPU;
each a trial's own work (`work`) over its timed seconds (vision `train_time_s`, LLM median step
time x steps), and, for both, the start-up seconds of a trial: its wall time less its timed part (launch, data
preparation, warm-up and evaluation) plus the runner's time before its clock started (the gap
since the trial before ended: a page cache warmed or dropped, placement checked). A planned trial
whose key was measured is estimated as start-up + its own amount of work / the rate, and marked
`measured` with the run the rate came from and how many trials back it; a key whose trials that
run skipped (a policy this machine cannot run) is estimated at the seconds the skip took; any
other is the guessed cost model (`multicard.plan.cost`), marked `guessed`. Pure functions on records;
the CLI loads the runs and prints.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from multicard.data.mnist import MNIST_TEST
from multicard.errors import InputError
from multicard.plan import cost, params
from multicard.plan.params import Value

SCHEMA = 1
# The settings that are how much work a trial does (the rate turns them into seconds), or where
# its files are (machine-specific paths): every other setting is part of the rate's key.
# The test set is work too (eval_work), and the step probe runs after everything the rate times.
NOT_KEYED = {"vision": frozenset({"epochs", "max_steps", "train_subset", "test_subset", "seed",
                                  "probe_steps"}),
             "llm": frozenset({"max_steps", "seed", "weights", "tokenizer", "data"})}


@dataclass(frozen=True)
class Rate:
    per_s: float  # work() per timed second: images of one rank or CPU node (vision), tokens per GPU (LLM)
    startup_s: float  # mean wall time of a trial outside its timed work (and its modelled evaluation)
    trials: int  # ok trials behind both (skipped ones where `skipped`)
    source: str  # the run they came from
    skipped: bool = False  # that run skipped every trial of the key: it takes `startup_s`
    run_start: bool = False  # not a trial's: a run's one-off start (`startup_s`), once per run
    # vision on GPUs, what carries the rate to another image size or batch (scaled_estimate):
    step_s: float | None = None  # the trials' mean median step (CUDA events)
    gpu_share: float | None = None  # the part of a step the GPU computes, at most 1
    gpu_share_from: str | None = None  # the step probe, or NVML utilisation (an upper bound)


@dataclass(frozen=True)
class Estimate:
    seconds: float
    how: str  # "measured", "scaled" (a measured rate carried to another size or batch) or "guessed"
    source: str | None = None  # for a measured or scaled one: its run and trial count


def rate_key(workload: str, settings: Mapping[str, Value], trace: str = "none") -> str:
    """A profiled trial is slower than a timing one: its rate is its own (`trace=` in the key)."""
    names = [k for k in params.WORKLOAD_PARAMS[workload] if k not in NOT_KEYED[workload]]
    traced = [] if trace == "none" else [f"trace={trace}"]
    return "|".join([workload, *(f"{k}={settings.get(k)}" for k in names), *traced])


def work(workload: str, settings: Mapping[str, Value]) -> float:
    """What a trial does in its timed part in the rate's unit: images per rank (per node on CPU,
    vision), tokens per GPU (LLM)."""
    if workload == "vision":
        return cost.vision_images(settings) / _units(settings)
    per_step = int(settings["batch_size"]) * int(settings["seq_len"])
    return int(settings["max_steps"]) * per_step * int(settings["gradient_accumulation_steps"])


def _units(settings: Mapping[str, Value]) -> int:
    """What a vision rate is per: a rank with its GPU, or a CPU node whose ranks share its cores."""
    nodes = int(settings.get("nnodes", 1))
    return nodes if settings["device"] == "cpu" else nodes * int(settings["gpus"])


# Forward-only evaluation of an image costs about a third of a training step's (cost.py): what a
# trial's evaluation takes at its measured rate, so that its test set is work, not part of the key
EVAL_SHARE = 1 / 3


def eval_work(workload: str, settings: Mapping[str, Value]) -> float:
    """A vision trial's evaluation in training images of one rank (or CPU node); 0 for LLM trials."""
    if workload != "vision":
        return 0.0
    test = (int(settings["test_subset"]) or MNIST_TEST) * EVAL_SHARE
    return test / _units(settings) if settings["mode"] == "train" else 0.0


def observation(workload: str, settings: Mapping[str, Value], record: Mapping[str, Any]
                ) -> tuple[float, float] | None:
    """(rate, start-up seconds) of one ok trial, or None when its record lacks them. The rate is
    the trial's own work over its timed seconds, so that the estimate of the same settings gives
    back the same seconds (torchtune's tokens/s counts only non-padding tokens, for one). The
    start-up is the wall time less the timed part and the evaluation at that rate."""
    metrics, wall = record.get("metrics") or {}, record.get("wall_s")
    if record.get("status") != "ok" or not wall:
        return None
    if workload == "vision":
        timed = metrics.get("train_time_s")
    else:
        step, steps = metrics.get("step_time_median_s"), metrics.get("steps")
        timed = step * steps if step and steps else None
    if not timed or not math.isfinite(timed) or timed <= 0:
        return None
    rate = work(workload, settings) / float(timed)
    return rate, max(0.0, float(wall) - float(timed) - eval_work(workload, settings) / rate)


def run_start_key(workload: str) -> str:
    return f"{workload}|run start"


def fit_run_start(workload: str, name: str, captured: str | None, records: list[Mapping[str, Any]]
                  ) -> dict[str, Rate]:
    """The one-off start of the run `name` (its env.json's `captured` time, ISO 8601) as a rate
    entry; none without the times."""
    from datetime import datetime

    try:
        captured_unix = datetime.fromisoformat(captured).timestamp() if captured else None
    except ValueError:
        captured_unix = None
    seconds = run_start(captured_unix, records)
    return {} if seconds is None else {run_start_key(workload): Rate(0.0, seconds, 1, name, run_start=True)}


def run_start(captured_unix: float | None, records: list[Mapping[str, Any]]) -> float | None:
    """A run's one-off start (environment, dataset checks): from its env.json being captured to
    its first trial's start; None without the times."""
    starts = [float(r["started_unix"]) for r in records if r.get("started_unix") is not None]
    if captured_unix is None or not starts:
        return None
    return max(0.0, min(starts) - captured_unix)


def fit(workload: str, runs: Iterable[tuple[str, Iterable[tuple[Mapping[str, Value], Mapping[str, Any]]]]]
        ) -> dict[str, Rate]:
    """Rates per key from (run name, [(settings, record)]) of one workload; a key measured in
    several runs takes the run with the most trials behind it (a measured rate before a skip)."""
    found: dict[str, Rate] = {}
    for name, trials in runs:
        seen: dict[str, list[tuple[float, float, Mapping[str, Any]]]] = {}
        skips: dict[str, list[float]] = {}
        listed = list(trials)
        for (settings, record), before in zip(listed, gaps([r for _, r in listed]), strict=True):
            key = rate_key(workload, settings, str(record.get("trace") or "none"))
            if (point := observation(workload, settings, record)) is not None:
                seen.setdefault(key, []).append((point[0], point[1] + before, record.get("metrics") or {}))
            elif record.get("status") == "skipped":
                skips.setdefault(key, []).append(float(record.get("wall_s") or 0.0) + before)
        # the harmonic mean: trials of equal work take their mean time (a mean of rates would not)
        rates = {key: Rate(statistics.harmonic_mean([p[0] for p in points]),
                           statistics.fmean(p[1] for p in points), len(points), name,
                           **step_shares([p[2] for p in points]))
                 for key, points in seen.items()}
        rates |= {key: Rate(0.0, statistics.fmean(walls), len(walls), name, skipped=True)
                  for key, walls in skips.items() if key not in seen}
        for key, rate in rates.items():
            if key not in found or better(rate, found[key]):
                found[key] = rate
    return found


def step_shares(metrics: list[Mapping[str, Any]]) -> dict[str, Any]:
    """What carries a key's rate to other image sizes and batches: its mean median step and the
    part of it the GPU computes, from the step probe where every trial has one, else NVML's
    utilisation (the share of time some kernel ran: an upper bound); none without either."""
    steps = [m.get("step_time_median_s") for m in metrics]
    if not steps or any(not isinstance(v, int | float) or v <= 0 for v in steps):
        return {}
    for key, how in (("gpu_busy_fraction", "step probe"),
                     ("gpu_util_mean", "NVML utilisation, an upper bound")):
        shares = [m.get(key) for m in metrics]
        if all(isinstance(v, int | float) and v >= 0 for v in shares):
            return {"step_s": statistics.fmean(steps),  # type: ignore[arg-type]
                    "gpu_share": min(1.0, statistics.fmean(shares)), "gpu_share_from": how}  # type: ignore[arg-type]
    return {}


def gaps(records: list[Mapping[str, Any]]) -> list[float]:
    """Per record, the seconds between the end of the trial that ran before it and its start:
    what the runner spent preparing it. 0 for the first, without the times, and where the one
    before is not the plan's previous trial or was interrupted (a stop and a resume between them)."""
    order = sorted(range(len(records)), key=lambda i: float(records[i].get("started_unix") or 0.0))
    found = [0.0] * len(records)
    for previous, i in itertools.pairwise(order):
        this, before = records[i], records[previous]
        if this.get("started_unix") is None or before.get("started_unix") is None:
            continue
        follows = this.get("order") is not None and before.get("order") in (this["order"] - 1, this["order"])
        if before.get("status") == "interrupted" or not follows:
            continue  # a retry has its trial's order; any other step is a stop and a resume
        found[i] = max(0.0, float(this["started_unix"]) - float(before["started_unix"])
                       - float(before.get("wall_s") or 0.0))
    return found


def better(rate: Rate, than: Rate) -> bool:
    """Which of two rates of one key to keep: measured before skipped, then more trials."""
    return (not rate.skipped, rate.trials) > (not than.skipped, than.trials)


def estimate(workload: str, settings: Mapping[str, Value], rates: Mapping[str, Rate],
             trace: str = "none") -> Estimate:
    """A planned trial's seconds: from its measured rate where there is one, else guessed."""
    rate = rates.get(rate_key(workload, settings, trace))
    if rate is None:
        return scaled_estimate(workload, settings, rates, trace) or \
            Estimate(cost.trial_seconds(workload, settings), "guessed")
    if rate.skipped:
        return Estimate(rate.startup_s, "measured", f"{rate.source}: skipped there, {rate.trials} trial(s)")
    return Estimate(rate.startup_s + (work(workload, settings) + eval_work(workload, settings)) / rate.per_s,
                    "measured", f"{rate.source}, {rate.trials} trial(s)")


# What a measured vision rate is carried across: image size and batch by the model below; the
# one-rank DDP wrapping as it is, which overstates a lean or unwrapped rank (less host work per
# step) when the rate was measured with PyTorch's defaults (every run before the setting existed)
SCALED = ("image_size", "batch_size", "single_rank_ddp")


def scaled_estimate(workload: str, settings: Mapping[str, Value], rates: Mapping[str, Rate],
                    trace: str = "none") -> Estimate | None:
    """A vision GPU trial whose key was measured at another image size or batch only. A step is
    split by the measured GPU share g: the GPU's part g x step grows with the pixels and the batch
    (MobileNetV2's work), the rest (1 - g) x step, the host's gaps, stays per step. Adding the
    two, rather than taking the larger, is conservative: it assumes none of the host's work
    hides behind the GPU's. The warm-up's steps scale alike; start-up is the measured one."""
    found = _carrier(workload, settings, rates, trace)
    if found is None:
        return None
    fields, rate = found
    size0, batch0 = int(fields["image_size"]), int(fields["batch_size"])
    g, step0 = float(rate.gpu_share or 0.0), float(rate.step_s or 0.0)
    step1 = _scaled_step(settings, fields, rate)
    per_image1 = (1 / rate.per_s) * (step1 / step0) * (batch0 / int(settings["batch_size"]))
    warmup = int(settings["warmup_steps"]) * (step1 - step0)
    images = work(workload, settings) + eval_work(workload, settings)
    seconds = rate.startup_s + warmup + images * per_image1
    wrapped = "" if fields["single_rank_ddp"] == str(settings["single_rank_ddp"]) else \
        f", one-rank DDP {fields['single_rank_ddp']}"
    return Estimate(seconds, "scaled", f"{rate.source}, {rate.trials} trial(s) at {size0} px, "
                                       f"batch {batch0}{wrapped}; GPU share {g * 100:.0f} % "
                                       f"({rate.gpu_share_from})")


def _carrier(workload: str, settings: Mapping[str, Value], rates: Mapping[str, Rate],
             trace: str = "none") -> tuple[dict[str, str], Rate] | None:
    """The measured rate (and its key's fields) that can carry to `settings`: the same key but for
    SCALED, with a GPU share; of several, the one with the most trials."""
    if workload != "vision" or settings["device"] != "cuda":
        return None
    wanted = _key_fields(rate_key(workload, settings, trace))
    found = [(fields, r) for key, r in rates.items() if r.gpu_share is not None and not r.skipped
             and _same_but(fields := _key_fields(key), wanted, SCALED)]
    return max(found, key=lambda f: f[1].trials) if found else None


def _scaled_step(settings: Mapping[str, Value], fields: Mapping[str, str], rate: Rate) -> float:
    growth = (int(settings["batch_size"]) / int(fields["batch_size"])) * \
        (int(settings["image_size"]) / int(fields["image_size"])) ** 2
    g, step0 = float(rate.gpu_share or 0.0), float(rate.step_s or 0.0)
    return step0 * (g * growth + (1 - g))


def step_seconds(settings: Mapping[str, Value], rates: Mapping[str, Rate]) -> float:
    """One training step of one vision rank: measured (the key's own median step), carried from
    another size or batch (scaled_estimate's model), else the guessed cost model."""
    found = _carrier("vision", settings, rates)
    if found is None:
        return cost.vision_step_seconds(settings)
    return _scaled_step(settings, *found)


def _key_fields(key: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in key.split("|") if "=" in part)


def _same_but(a: Mapping[str, str], b: Mapping[str, str], free: tuple[str, ...]) -> bool:
    return a.keys() == b.keys() and all(a[k] == b[k] for k in a if k not in free)


def save(rates: Mapping[str, Rate], path: Path, noise: tuple[float, int] | None = None) -> None:
    """The rates, and the runs' trial-to-trial CV with the configs it comes from where measured
    (the noise a later plan's power assumes)."""
    from multicard import integrity

    doc: dict[str, Any] = {"schema": SCHEMA, "rates": {k: asdict(r) for k, r in sorted(rates.items())}}
    if noise is not None:
        doc["noise"] = {"cv": noise[0], "configs": noise[1]}
    integrity.write_text_atomic(path, json.dumps(doc, indent=1) + "\n")


def load_noise(path: Path) -> tuple[float, int] | None:
    """The trial-to-trial CV a calibration file saved, and its configs; None where it has none."""
    try:
        noise = json.loads(path.read_text()).get("noise")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
    if not isinstance(noise, dict) or not isinstance(noise.get("cv"), int | float) \
            or not 0 < noise["cv"] < 10 or not isinstance(noise.get("configs"), int):
        return None
    return float(noise["cv"]), noise["configs"]


def load(path: Path) -> dict[str, Rate]:
    try:
        doc = json.loads(path.read_text())
        if doc.get("schema") != SCHEMA:
            raise InputError(f"{path}: calibration schema {doc.get('schema')!r}, expected {SCHEMA}")
        rates = {str(k): Rate(**v) for k, v in doc["rates"].items()}
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{path}: not a calibration file ({exc})") from None
    for key, rate in rates.items():
        numbers = (rate.per_s, rate.startup_s, rate.trials)
        if not all(isinstance(n, int | float) and not isinstance(n, bool) and math.isfinite(n) and n >= 0
                   for n in numbers) or (rate.per_s <= 0 and not (rate.skipped or rate.run_start)) \
                or rate.trials < 1:
            raise InputError(f"{path}: rate {key!r}: expected per_s > 0, startup_s >= 0 and trials >= 1")
    return rates
