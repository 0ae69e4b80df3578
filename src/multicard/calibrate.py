"""Measured rates for the cost model, fitted from the ok trials of finished runs.

`multicard plan --calibrate RUN...` reads every ok timing trial of the runs (or a calibration
file saved before) and fits, per rate key:
- vision: training images/s of one rank (`throughput_samples_s` / ranks; on CPU, where the ranks
  of a node share its cores, of the node) by device, precision, image size, loader, layout, batch
  size and mode;
- LLM: training tokens/s per GPU (`tokens_per_s_per_gpu`) by device, model, method, batch size,
  sequence length and gradient accumulation;
and, for both, the start-up seconds of a trial: its wall time less its timed part (launch, data
preparation, warm-up and evaluation). A planned trial whose key was measured is estimated as
start-up + its own amount of work / the rate, and marked `measured` with the run the rate came
from and how many trials back it; any other is the guessed cost model (`multicard.cost`),
marked `guessed`. Pure functions on records; the CLI loads the runs and prints.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from multicard import cost
from multicard.errors import InputError
from multicard.params import Value

SCHEMA = 1
VISION_KEY = ("device", "precision", "image_size", "loader", "layout", "batch_size", "mode")
LLM_KEY = ("device", "model", "method", "batch_size", "seq_len", "gradient_accumulation_steps")


@dataclass(frozen=True)
class Rate:
    per_s: float  # images/s of one rank, or of a CPU node (vision); tokens/s per GPU (LLM)
    startup_s: float  # mean wall time of a trial outside its timed work
    trials: int  # ok trials behind both
    source: str  # the run they came from


@dataclass(frozen=True)
class Estimate:
    seconds: float
    how: str  # "measured" or "guessed"
    source: str | None = None  # for a measured one: its run and trial count


def rate_key(workload: str, settings: Mapping[str, Value]) -> str:
    names = VISION_KEY if workload == "vision" else LLM_KEY
    return "|".join([workload, *(f"{k}={settings.get(k)}" for k in names)])


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


def observation(workload: str, settings: Mapping[str, Value], record: Mapping[str, Any]
                ) -> tuple[float, float] | None:
    """(rate, start-up seconds) of one ok timing trial, or None when its record lacks them."""
    metrics, wall = record.get("metrics") or {}, record.get("wall_s")
    if record.get("status") != "ok" or record.get("trace", "none") != "none" or not wall:
        return None
    if workload == "vision":
        total, timed = metrics.get("throughput_samples_s"), metrics.get("train_time_s")
        rate = total / _units(settings) if total else None
    else:
        rate, step, steps = (metrics.get(k) for k in ("tokens_per_s_per_gpu", "step_time_median_s", "steps"))
        timed = step * steps if step and steps else None
    if not rate or not timed or not math.isfinite(rate) or rate <= 0:
        return None
    return float(rate), max(0.0, float(wall) - float(timed))


def fit(workload: str, runs: Iterable[tuple[str, Iterable[tuple[Mapping[str, Value], Mapping[str, Any]]]]]
        ) -> dict[str, Rate]:
    """Rates per key from (run name, [(settings, record)]) of one workload; a key measured in
    several runs takes the run with the most trials behind it."""
    found: dict[str, Rate] = {}
    for name, trials in runs:
        seen: dict[str, list[tuple[float, float]]] = {}
        for settings, record in trials:
            if (point := observation(workload, settings, record)) is not None:
                seen.setdefault(rate_key(workload, settings), []).append(point)
        for key, points in seen.items():
            rate = Rate(statistics.fmean(p[0] for p in points), statistics.fmean(p[1] for p in points),
                        len(points), name)
            if key not in found or rate.trials > found[key].trials:
                found[key] = rate
    return found


def estimate(workload: str, settings: Mapping[str, Value], rates: Mapping[str, Rate]) -> Estimate:
    """A planned trial's seconds: from its measured rate where there is one, else guessed."""
    rate = rates.get(rate_key(workload, settings))
    if rate is None:
        return Estimate(cost.trial_seconds(workload, settings), "guessed")
    return Estimate(rate.startup_s + work(workload, settings) / rate.per_s, "measured",
                    f"{rate.source}, {rate.trials} trial(s)")


def save(rates: Mapping[str, Rate], path: Path) -> None:
    from multicard import artifact

    artifact.write_text_atomic(path, json.dumps(
        {"schema": SCHEMA, "rates": {k: asdict(r) for k, r in sorted(rates.items())}}, indent=1) + "\n")


def load(path: Path) -> dict[str, Rate]:
    try:
        doc = json.loads(path.read_text())
        if doc.get("schema") != SCHEMA:
            raise InputError(f"{path}: calibration schema {doc.get('schema')!r}, expected {SCHEMA}")
        return {k: Rate(**v) for k, v in doc["rates"].items()}
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{path}: not a calibration file ({exc})") from None
