"""Trial records -> tidy numeric tables: one row per trial, and one row per config.

Numbers only; `report` turns them into text and figures. A list-valued metric (one value per
epoch) enters the per-config statistics as its per-trial mean.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from multicard.judge import ladder, operating_point, stats
from multicard.measure import energy, numa
from multicard.plan import cost, precision
from multicard.plan import spec as specmod
from multicard.plan.params import PROPORTION_METRICS
from multicard.plan.spec import Spec
from multicard.profiling import parse

# Metrics where larger is better: their speedup is mean(x) / mean(baseline).
HIGHER_IS_BETTER = frozenset({"throughput_samples_s", "test_accuracy", "gpu_util_mean",
                              "tokens_per_s_per_gpu"})
SUMMARY_FIELDS = ("n", "mean", "std", "ci_lo", "ci_hi", "median", "min", "max", "outliers")
# A config's energy is shown from this many ok trials that measured it: one reading has no
# interval, two an interval on one degree of freedom (t = 12.7, against 4.3 at n = 3).
MIN_ENERGY_TRIALS = 3
ENERGY_METRICS = frozenset({*energy.ENERGY_METRICS, "energy_per_token_j"})  # the last: LLM trials'


def energy_gate(n: int) -> str | None:
    """Why a statistic of `n` energy readings is not shown; None from MIN_ENERGY_TRIALS on."""
    if n >= MIN_ENERGY_TRIALS:
        return None
    return "no trial measured it" if n == 0 else f"n < {MIN_ENERGY_TRIALS} (n = {n})"


def gated_energy(values: Sequence[float | None]) -> tuple[stats.Summary | None, str | None]:
    """One group's energy readings (None: a trial that did not measure it) as a summary with
    its 95 % interval, or None and why (energy_gate)."""
    measured = [v for v in values if v is not None and not math.isnan(v)]
    why = energy_gate(len(measured))
    return (None, why) if why else (stats.summarize(measured), None)


def energy_by_group(values: Mapping[str, Sequence[float | None]]
                    ) -> dict[str, tuple[stats.Summary | None, str | None]]:
    """Per group (a precision, a config) of per-trial energy readings: gated_energy."""
    return {group: gated_energy(found) for group, found in values.items()}


def withheld(metric: str, summary: stats.Summary) -> tuple[stats.Summary, str | None]:
    """A config's summary of `metric` as the tables show it: an energy metric that 1 or 2 ok
    trials measured keeps its n and loses every other number, with why (none measured it:
    left as it is, the tables say "not measured")."""
    why = energy_gate(summary.n) if metric in ENERGY_METRICS and summary.n else None
    if why is None:
        return summary, None
    nan = stats.NAN
    return replace(summary, mean=nan, std=nan, ci_lo=nan, ci_hi=nan, median=nan, min=nan, max=nan,
                   outliers=0), why


def scalar(value: Any) -> float:
    """A metric value as one number: lists by their mean, missing values as NaN."""
    if isinstance(value, list):
        numbers = [v for v in value if v is not None]
        return float(np.mean(numbers)) if numbers else float("nan")
    return float("nan") if value is None else float(value)


def _timing(record: dict[str, Any], spec: Spec) -> bool:
    """An ok, untraced trial of this experiment outside `auto`'s pilot rounds: the only kind the
    timing statistics use."""
    return (record.get("experiment") == spec.name and record.get("status") == "ok"
            and record.get("trace", "none") == "none"
            and record.get("trial") not in specmod.pilot_trials(spec))


def pilot_count(spec: Spec, records: Iterable[dict[str, Any]]) -> int:
    """The ok untraced trials of `auto`'s pilot rounds (they set the count; no statistic reads them)."""
    pilot = specmod.pilot_trials(spec)
    return len({(r["config_id"], r["trial"]) for r in records if r.get("trial") in pilot
                and r.get("experiment") == spec.name and r.get("status") == "ok"
                and r.get("trace", "none") == "none"})


def trial_table(spec: Spec, records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """One row per ok, untraced trial (the last ok record wins a duplicate)."""
    factors = list(spec.grid)
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for record in records:
        if not _timing(record, spec):
            continue
        row = {k: record["config"].get(k) for k in factors}
        row |= {"config_id": record["config_id"], "trial": record["trial"]}
        row |= {m: scalar(record["metrics"].get(m)) for m in spec.metrics}
        row[WHOLE] = whole_throughput(record)
        row[OPERATING_POINT] = (record.get("bound") or {}).get("label")
        rows[(record["config_id"], record["trial"])] = row
    columns = [*factors, "config_id", "trial", *spec.metrics, WHOLE, OPERATING_POINT]
    return pd.DataFrame(list(rows.values()), columns=columns)


def stray_trials(spec: Spec, records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """The ok trials (traced ones too) whose ranks held memory on a GPU they do not train on:
    config, trial, how many (process, GPU) pairs, and where the details are."""
    rows = []
    for record in records:
        count = (record.get("metrics") or {}).get("stray_contexts")
        if record.get("experiment") == spec.name and record.get("status") == "ok" and count:
            details = stray_details(record.get("artifacts", []))
            rows.append({**{k: record["config"].get(k) for k in spec.grid},
                         "config_id": record["config_id"], "trial": record["trial"],
                         "stray_contexts": int(count), "details": details})
    return pd.DataFrame(rows, columns=[*spec.grid, "config_id", "trial", "stray_contexts", "details"])


def stray_details(artifacts: list[str]) -> str | None:
    """Where a trial's stray contexts are listed: the runner's view of every GPU (LLM trials)
    or each rank's own (vision)."""
    from multicard.measure.telemetry import PROCESSES_FILE

    found = next((a for a in artifacts if a.endswith("/" + PROCESSES_FILE)), None)
    if found:
        return found
    result = next((a for a in artifacts if a.endswith("/result.json")), None)
    return f"{result}, ranks[].stray_contexts" if result else None


def energy_sources(records: Iterable[dict[str, Any]]) -> dict[str, int]:
    """How many ok trials read their GPU energy each way (the records' `measured_how`)."""
    counts: dict[str, int] = {}
    for record in records:
        how = (record.get("measured_how") or {}).get("energy_j")
        if record.get("status") == "ok" and how:
            counts[how] = counts.get(how, 0) + 1
    return counts


WHOLE = "throughput_whole_samples_s"  # FlagPerf's p_whole: start-up and evaluation included
OPERATING_POINT = "operating_point"  # GPU-bound / host-bound / mixed (judge.operating_point)


def whole_throughput(record: dict[str, Any]) -> float:
    """Images trained per second of the whole launch (the record's wall time)."""
    m = record["metrics"]
    rate, seconds, wall = m.get("throughput_samples_s"), m.get("train_time_s"), record.get("wall_s")
    if not isinstance(rate, (int, float)) or not isinstance(seconds, (int, float)) or not wall:
        return float("nan")
    return rate * seconds / wall


def failures(spec: Spec, records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """Every attempt of this experiment that did not end ok, with its cause."""
    rows = []
    for r in records:
        if r.get("experiment") == spec.name and r.get("status") != "ok":
            error = r.get("error") or {}
            rows.append({**{k: r["config"].get(k) for k in spec.grid}, "config_id": r["config_id"],
                         "trial": r["trial"], "status": r["status"],
                         "error_type": error.get("type"), "message": error.get("message")})
    return pd.DataFrame(rows, columns=[*spec.grid, "config_id", "trial", "status", "error_type",
                                       "message"])


def failure_causes(failed: pd.DataFrame) -> pd.DataFrame:
    """The failures of `failures()` grouped by cause: how many, in which configs, one message."""
    if failed.empty:
        return pd.DataFrame(columns=["cause", "attempts", "configs", "message"])
    frame = failed.assign(cause=[cause(s, t) for s, t in zip(failed["status"], failed["error_type"],
                                                               strict=True)])
    grouped = frame.groupby("cause", sort=True)
    return pd.DataFrame({
        "attempts": grouped.size(),
        "configs": grouped["config_id"].nunique(),
        "message": grouped["message"].first(),
    }).reset_index()


@dataclass(frozen=True)
class Spent:
    device: str  # "cuda" (GPU-hours) or "cpu" (rank-hours)
    attempts: int  # launched trials, ok or not (skipped ones cost nothing)
    wall_hours: float
    device_hours: float  # wall x processes per node x nodes


def compute_spent(spec: Spec, records: Iterable[dict[str, Any]]) -> Spent:
    """What the recorded attempts of this experiment cost, from their wall times."""
    attempts, wall, device = 0, 0.0, 0.0
    for r in records:
        if r.get("experiment") != spec.name or r.get("status") == "skipped":
            continue
        attempts += 1
        wall += r["wall_s"]
        device += cost.device_seconds(r["wall_s"], {**spec.fixed, **r["config"]})
    return Spent(str(spec.fixed.get("device", "cuda")), attempts, wall / 3600, device / 3600)


def breakdown(trials: pd.DataFrame) -> dict[str, float]:
    """Mean training time split three ways: blocked in the loader's next(), blocked in the
    host-to-device copy, and everything else (compute, and GPU work a copy did not wait for)."""
    if trials.empty:
        return {"breakdown.data_wait_s": float("nan"), "breakdown.h2d_wait_s": float("nan"),
                "breakdown.compute_s": float("nan")}
    wait = trials["train_time_s"] * trials["data_wait_fraction"]
    copy = trials["train_time_s"] * trials["h2d_wait_fraction"].fillna(0.0)
    return {"breakdown.data_wait_s": float(wait.mean()), "breakdown.h2d_wait_s": float(copy.mean()),
            "breakdown.compute_s": float((trials["train_time_s"] - wait - copy).mean())}


def config_table(spec: Spec, trials: pd.DataFrame, failed: pd.DataFrame) -> pd.DataFrame:
    """One row per config in grid order: statistics per metric, speedup, paper values, failures."""
    rows = []
    for cid, config, _ in specmod.configs(spec):
        mine = trials[trials["config_id"] == cid]
        row: dict[str, Any] = {**config, "config_id": cid}
        for metric in spec.metrics:
            summary, why = withheld(metric, stats.summarize(mine[metric].dropna().tolist(),
                                                            metric in PROPORTION_METRICS))
            row |= {f"{metric}.{f}": getattr(summary, f) for f in SUMMARY_FIELDS}
            if metric in ENERGY_METRICS:
                row[f"{metric}.withheld"] = why
        row |= _speedup(spec, trials, config, mine)
        row |= bound(spec, trials, config, mine)
        row[OPERATING_POINT] = operating_point.combined(mine.get(OPERATING_POINT, pd.Series()))
        ordered = mine.sort_values("trial")[spec.primary].dropna().tolist() if len(mine) else []
        steadiness = stats.stability(ordered)
        row |= {"stability.iqr": steadiness.iqr_over_median, "stability.max": steadiness.max_over_median,
                "stability.first": steadiness.first_over_rest, "warnings": list(steadiness.flags)}
        if spec.breakdown:
            row |= breakdown(mine)
        # an interrupted attempt (the runner was stopped) is no failure of the config: it is
        # listed in the report's failures section and runs again on resume
        causes = failed[(failed["config_id"] == cid) & (failed["status"] != "interrupted")]
        row["failed"] = len(causes)
        row["failure_causes"] = sorted({cause(s, t) for s, t in zip(causes["status"],
                                                                   causes["error_type"], strict=True)})
        row["paper"] = _references(spec, config)
        rows.append(row)
    return pd.DataFrame(rows)


def _speedup(spec: Spec, trials: pd.DataFrame, config: dict[str, Any],
             mine: pd.DataFrame) -> dict[str, Any]:
    base_config = specmod.baseline_config(spec, config)
    if base_config is None:
        return {}
    if base_config == config:
        return {"baseline": True}
    base_id = next(cid for cid, c, _ in specmod.configs(spec) if c == base_config)
    base = trials[trials["config_id"] == base_id][spec.primary].dropna().tolist()
    other = mine[spec.primary].dropna().tolist()
    if spec.primary in HIGHER_IS_BETTER:
        base, other = other, base
    ratio = stats.ratio_of_means(base, other)
    # time reduction and gain are increasing functions of the ratio, so the CI maps end to end
    return {
        "baseline": False,
        "speedup": ratio.value, "speedup.lo": ratio.ci_lo, "speedup.hi": ratio.ci_hi,
        "speedup.method": ratio.method, "speedup.bootstrap_lo": ratio.boot_lo,
        "speedup.bootstrap_hi": ratio.boot_hi,
        "time_reduction": stats.time_reduction(ratio.value),
        "time_reduction.lo": stats.time_reduction(ratio.ci_lo),
        "time_reduction.hi": stats.time_reduction(ratio.ci_hi),
        "gain": stats.gain(ratio.value), "gain.lo": stats.gain(ratio.ci_lo),
        "gain.hi": stats.gain(ratio.ci_hi),
    }


CEILING_LOADER = "synthetic"  # batches made on the device: no loading, the compute ceiling


def bound(spec: Spec, trials: pd.DataFrame, config: dict[str, Any], mine: pd.DataFrame) -> dict[str, Any]:
    """Whether a config is data-bound: its images/s against its twin with the synthetic loader
    (same settings otherwise), with the ratio's interval (multicard.judge.ladder). Only where the
    grid has the synthetic loader; the twin itself is the `ceiling`."""
    loaders = spec.grid.get("loader", [])
    if CEILING_LOADER not in loaders or "throughput_samples_s" not in trials:
        return {}
    if config.get("loader") == CEILING_LOADER:
        return {"bound": "ceiling"}
    twin = {**config, "loader": CEILING_LOADER}
    twin_id = next((cid for cid, c, _ in specmod.configs(spec) if c == twin), None)
    ceiling = trials[trials["config_id"] == twin_id]["throughput_samples_s"].dropna().tolist()
    found = ladder.classify(mine["throughput_samples_s"].dropna().tolist(), ceiling)
    return {"bound": found.label, "bound.ratio": found.ratio, "bound.lo": found.ci_lo,
            "bound.hi": found.ci_hi}


# What decides a loader's rate: a loader-only trial with these settings equal, and the same
# dtype of the batches it makes, is a training config's loader-only rung. The layout is one (the
# DataLoader's collate makes channels_last batches, DALI writes HWC), as are the samples drawn
# (max_steps, train_subset, seed), the CPUs its workers get (numa_policy) and the page cache;
# the model, optimizer and epochs load nothing.
LOADING_SETTINGS = ("device", "scenario", "data_format", "image_size", "loader", "batch_size",
                    "num_workers", "dali_threads", "dali_affinity", "pin_memory", "prefetch_factor",
                    "persistent_workers", "layout", "normalize", "gpus", "nnodes", "numa_policy",
                    "page_cache", "max_steps", "train_subset", "seed")
LoaderRates = dict[tuple[Any, ...], float]


def loading_key(settings: dict[str, Any]) -> tuple[Any, ...]:
    return (*(settings.get(k) for k in LOADING_SETTINGS), host_dtype(settings))


def host_dtype(settings: dict[str, Any]) -> str:
    """The dtype of the batches the loader makes: the model's input dtype where the cast is on
    the host (cast = host), else float32."""
    if settings.get("cast") != "host" or settings.get("precision") not in precision.PRECISIONS:
        return "float32"
    return precision.input_dtype(precision.PRECISIONS[settings["precision"]])


def is_loader_only(spec: Spec) -> bool:
    """A run of the loader alone (mode = loader_only): no model, no claim of the paper."""
    return spec.fixed.get("mode") == "loader_only"


def loader_only_rates(spec: Spec, trials: pd.DataFrame) -> LoaderRates:
    """Mean images/s onto the device per loading settings, from a run with mode = loader_only
    (empty for any other run)."""
    if not is_loader_only(spec) or "throughput_samples_s" not in trials:
        return {}
    means = trials.groupby("config_id")["throughput_samples_s"].mean()
    return {loading_key(settings): float(means[cid]) for cid, _, settings in specmod.configs(spec)
            if cid in means.index and not np.isnan(means[cid])}


def ladder_table(spec: Spec, trials: pd.DataFrame, loader_only: LoaderRates | None = None) -> pd.DataFrame:
    """Per config with a synthetic-loader twin: mean images/s of the whole trial (p_whole), of
    the training loop (p_train), of the twin (the ceiling) and, where a loader-only run with
    the same loading settings is given, of the loader alone."""
    columns = [*spec.grid, "config_id", "p_whole", "p_train", "ceiling", "loader_only"]
    if CEILING_LOADER not in spec.grid.get("loader", []) or "throughput_samples_s" not in trials:
        return pd.DataFrame(columns=columns)
    means = trials.groupby("config_id")[["throughput_samples_s", WHOLE]].mean()
    rows = []
    for cid, config, settings in specmod.configs(spec):
        twin = next((t for t, c, _ in specmod.configs(spec)
                     if c == {**config, "loader": CEILING_LOADER}), None)
        if config.get("loader") == CEILING_LOADER or cid not in means.index or twin not in means.index:
            continue
        rows.append({**config, "config_id": cid, "p_whole": means.at[cid, WHOLE],
                     "p_train": means.at[cid, "throughput_samples_s"],
                     "ceiling": means.at[twin, "throughput_samples_s"],
                     "loader_only": (loader_only or {}).get(loading_key(settings), float("nan"))})
    return pd.DataFrame(rows, columns=columns)


def _traced(records: Iterable[dict[str, Any]], spec: Spec) -> list[dict[str, Any]]:
    return [r for r in records if r.get("experiment") == spec.name and r.get("status") == "ok"
            and r.get("trace", "none") != "none" and r.get("trace_metrics")]


def trace_trials(spec: Spec, records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """One row per traced trial: every trace metric averaged over the trial's ranks."""
    rows = []
    for record in _traced(records, spec):
        per_rank = pd.DataFrame([s for s in record["trace_metrics"].values() if "error" not in s])
        if per_rank.empty:
            continue
        # skipna=False: a breakdown part one rank could not tell (host wait) is not its mean
        # over the others
        numbers = per_rank.drop(columns=list(parse.NOT_NUMBERS), errors="ignore").astype(float).mean(
            skipna=False)
        rows.append({**record["config"], "config_id": record["config_id"], "trial": record["trial"],
                     "trace": record["trace"], **numbers.to_dict()})
    return _in_grid_order(spec, pd.DataFrame(rows)) if rows else pd.DataFrame()


def trace_table(spec: Spec, records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """Per config: every trace metric, averaged over the ranks of a trial, then over its traced
    trials (counts, bytes, nanoseconds per rank), and what tracing cost: the traced trials' mean
    primary metric (a time) over the untraced trials' (NaN without both)."""
    records = list(records)
    frame = trace_trials(spec, records)
    if frame.empty:
        return frame
    frame = frame.drop(columns="trial")
    keys = [*spec.grid, "config_id", "trace"]
    table = frame.groupby(keys, sort=False).mean(numeric_only=True).reset_index()
    table.insert(len(keys), "n", frame.groupby(keys, sort=False).size().to_numpy())
    cost = tracing_cost(spec, records)
    table.insert(len(keys) + 1, "traced / untraced",
                 [cost.get(cid, float("nan")) for cid in table["config_id"]])
    return table


def tracing_cost(spec: Spec, records: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Per config: mean primary metric of its ok traced trials / of its ok untraced ones."""
    found: dict[str, dict[bool, list[float]]] = {}
    for r in records:
        value = (r.get("metrics") or {}).get(spec.primary)
        if r.get("experiment") == spec.name and r.get("status") == "ok" and value:
            traced = r.get("trace", "none") != "none"
            found.setdefault(r["config_id"], {True: [], False: []})[traced].append(float(scalar(value)))
    return {cid: float(np.mean(arms[True]) / np.mean(arms[False]))
            for cid, arms in found.items() if arms[True] and arms[False]}


def _in_grid_order(spec: Spec, frame: pd.DataFrame) -> pd.DataFrame:
    order = {cid: i for i, (cid, _, _) in enumerate(specmod.configs(spec))}
    return frame.sort_values("config_id", key=lambda ids: ids.map(order), kind="stable")


def pause_table(spec: Spec, records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """Per config and epoch: the pause before its first step (ns), the longest over the ranks of a
    trial (the job waits for its slowest rank), averaged over traced trials."""
    rows = []
    for record in _traced(records, spec):
        pauses = [{int(e): ns for e, ns in s.get("epoch_pauses_ns", {}).items()}
                  for s in record["trace_metrics"].values()]
        for epoch in sorted({e for p in pauses for e in p}):
            longest = max(p[epoch] for p in pauses if epoch in p)
            rows.append({**record["config"], "config_id": record["config_id"], "epoch": epoch,
                         "pause_ns": longest})
    if not rows:
        return pd.DataFrame()
    frame = _in_grid_order(spec, pd.DataFrame(rows))
    keys = [*spec.grid, "config_id", "epoch"]
    return frame.groupby(keys, sort=False).agg(n=("pause_ns", "size"),
                                               pause_ns=("pause_ns", "mean")).reset_index()


def effects(spec: Spec, trials: pd.DataFrame, factor: str, base: Any, metric: str) -> pd.DataFrame:
    """For each other level of `factor`, mean(metric at base) / mean(metric at level), with its
    95% interval (stats.ratio_of_means) and where that interval lies, within every combination
    of the other factors.
    For a time, a ratio above 1 means the level is faster than the base."""
    if factor not in spec.grid or base not in spec.grid[factor] or trials.empty:
        return pd.DataFrame()
    others = [k for k in spec.grid if k != factor]
    groups = trials.groupby(others, sort=False) if others else [((), trials)]
    rows = []
    for keys, group in groups:
        keys = keys if isinstance(keys, tuple) else (keys,)
        reference = group.loc[group[factor] == base, metric].dropna().tolist()
        for level in spec.grid[factor]:
            values = group.loc[group[factor] == level, metric].dropna().tolist()
            if level == base or not values or not reference:
                continue
            ratio = stats.ratio_of_means(reference, values, cross_check=False)  # intervals only
            rows.append({**dict(zip(others, keys, strict=True)), "factor": factor, factor: level,
                         "versus": base,
                         "metric": metric, "ratio": ratio.value, "ci_lo": ratio.ci_lo,
                         "ci_hi": ratio.ci_hi, "ci": stats.direction(ratio.ci_lo, ratio.ci_hi),
                         "n_base": len(reference), "n": len(values)})
    return pd.DataFrame(rows)


STATUS_WORDS = {"timeout": "timed out", "oom": "out of memory", "failed": "failed"}


def attempts_ending(records: list[dict[str, Any]]) -> str:
    """"of 5 attempts 4 out of memory, 1 ok" / "of 1 attempts 1 failed (ModuleNotFoundError)"."""
    kinds: dict[str, int] = {}
    for r in records:
        error = (r.get("error") or {}).get("type")
        word = "ok" if r["status"] == "ok" else STATUS_WORDS.get(r["status"], r["status"])
        key = f"{word} ({error})" if r["status"] == "failed" and error else word
        kinds[key] = kinds.get(key, 0) + 1
    return f"of {len(records)} attempts " + ", ".join(f"{n} {k}" for k, n in kinds.items())


def cause(status: str, error_type: str | None) -> str:
    """"oom", "timeout", "interrupted", or "failed: <exception type>" for the failure column."""
    return status if status in ("oom", "timeout", "interrupted") or not error_type \
        else f"{status}: {error_type}"


def _references(spec: Spec, config: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for ref in spec.references:
        if ref.applies_to({**spec.fixed, **config}):
            values |= ref.values
            if ref.outcome:
                values["outcome"] = ref.outcome
            if ref.inferred:
                values["inferred"] = True
    return values


# --- the NUMA hypothesis ---------------------------------------------------------------------

CONTROLS = (("page_cache", "warm"), ("persistent_workers", False), ("normalize", "cpu"))
PENALTY_GPUS = (3, 4)
# the DataLoader's penalty left under binding that still counts as removed (claims.toml's
# [tolerance.numa] gives the reason; claims pass theirs)
PENALTY_TOLERANCE = 0.05


# the NUMA test's first question reads these arms, (loader, numa_policy), at PENALTY_GPUS
NUMA_ARMS = frozenset({("torch", "none"), ("dali", "none"), ("torch", "local"), ("dali", "local")})


def reads_numa(settings: Mapping[str, Any]) -> bool:
    """Whether the NUMA test's first question reads a config with these settings: either loader,
    no binding or `local`, at the GPU counts of the penalty."""
    return (settings.get("loader"), settings.get("numa_policy")) in NUMA_ARMS \
        and settings.get("gpus") in PENALTY_GPUS


def answers_penalty(spec: Spec) -> bool:
    """Whether a run of `spec` holds all four arms of the first question (a profile with one
    loader, as the controls, cannot answer it)."""
    held = {(s.get("loader"), s.get("numa_policy")) for _, _, s in specmod.configs(spec) if reads_numa(s)}
    return held >= NUMA_ARMS


def held_penalty_configs(spec: Spec, trials: pd.DataFrame, records: list[dict[str, Any]]) -> str:
    """The configs of the first question that cannot decide, named: fewer than min_ok ok trials,
    none (how their attempts ended), a timed-out attempt (a censored time), or, when the run has
    records, a planned config never attempted. "" when every one can. Configs are matched by
    their factor values."""
    def key(config: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(config.get(k) for k in spec.grid)

    configs = {key(row): {k: row[k] for k in spec.grid if k in row} for row in trials.to_dict("records")
               if reads_numa({**spec.fixed, **row})}
    if records:
        configs |= {key(config): config for _, config, settings in specmod.configs(spec)
                    if reads_numa(settings)}
    attempts: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in records:
        if r.get("experiment") == spec.name and r.get("trace", "none") == "none" \
                and r.get("status") != "interrupted" and key(r.get("config", {})) in configs:
            attempts.setdefault(key(r["config"]), []).append(r)
    ok = {k: len(rows) for k, rows in trials.groupby(list(spec.grid), sort=False)} \
        if not trials.empty and set(spec.grid) <= set(trials) else {}
    held = [f"{_arm_label(spec, config)}: {why}" for k, config in configs.items()
            if (why := _why_held(int(ok.get(k, 0)), attempts.get(k, []), spec.min_ok))]
    return "; ".join(held)


def _why_held(ok: int, attempts: list[dict[str, Any]], minimum: int) -> str:
    if any(r["status"] == "timeout" for r in attempts):
        return "censored by a timed-out attempt"
    if ok == 0:
        tried = [r for r in attempts if r["status"] != "skipped"]
        return f"no ok trial ({attempts_ending(tried)})" if tried else (
            "skipped" if attempts else "not attempted")
    return f"n = {ok} < {minimum}" if ok < minimum else ""


def _arm_label(spec: Spec, config: Mapping[str, Any]) -> str:
    c = {**spec.fixed, **config}
    others = "".join(f", {k}={v}" for k, v in config.items() if k not in ("loader", "numa_policy", "gpus"))
    return f"{c['loader']}/{c['numa_policy']} at {c['gpus']} GPUs{others}"


@dataclass(frozen=True)
class Finding:
    """One answer: a code for the verdict ("yes", "no", "mixed", "inconclusive", "not run", or
    the controls' names), its evidence, and why, where the answer is a test's."""

    question: str
    answer: str
    evidence: pd.DataFrame
    why: str = ""


def _select(table: pd.DataFrame, gpus: Iterable[int], **match: Any) -> pd.DataFrame:
    """Rows of an effects table for the DataLoader (when the grid has loaders) at `gpus`."""
    if table.empty:
        return table
    keep = table["gpus"].isin(list(gpus))
    if "loader" in table and "loader" not in match:
        keep &= table["loader"] == "torch"
    for column, value in match.items():
        keep &= table[column].isin(value if isinstance(value, list) else [value]) if column in table \
            else False
    return table[keep]


def removes_penalty(spec: Spec, trials: pd.DataFrame, tolerance: float) -> tuple[str, str]:
    """(answer, why): does binding remove the DataLoader's penalty T_torch / T_dali at 3-4 GPUs?

    The penalty is the log ratio; three intervals read it. Without binding, pooled over the
    groups (every GPU count of 3-4 and every other factor: stats.pooled_log_ratio), above 0:
    there is one to remove. The change binding makes, the penalty without binding minus under
    `local`, pooled the same way (stats.pooled_log_ratio_change), above 0: binding lowers it; a
    penalty that binding leaves as it is stays within the tolerance when it is small, so only
    this comparison tells removing it from leaving it alone. Under `local`, each group's own
    interval below log(1 + tolerance): what is left is within the tolerance. `yes` needs all
    three (each at 95 %). `no` where a group's penalty under local lies wholly above the
    tolerance, `mixed` where another's then lies wholly below it and binding lowers the penalty:
    those read intervals at the level the groups share (stats.shared_level), since among several
    groups one interval wholly outside is otherwise chance. Otherwise `inconclusive`, saying why."""
    groups = _penalty_groups(spec, trials)
    if not groups:
        return "not run", "no 3-4 GPU trials of both loaders under both none and local"
    limit, k = math.log1p(tolerance), len(groups)
    unbound = stats.pooled_log_ratio([arms["none"] for arms in groups.values()])
    change = stats.pooled_log_ratio_change([(arms["none"], arms["local"]) for arms in groups.values()])
    bound = {label: stats.log_contrast(arms["local"], (1.0, -1.0)) for label, arms in groups.items()}
    with stats.confidence_level(stats.shared_level(k)):
        shared = {label: stats.log_contrast(arms["local"], (1.0, -1.0)) for label, arms in groups.items()}
    left = [label for label, d in shared.items() if d.ci_lo > limit]
    gone = [label for label, d in shared.items() if d.ci_hi < limit]
    exists, lowers = unbound.ci_lo > 0, change.ci_lo > 0
    if left:
        answer = "mixed" if gone and exists and lowers else "no"
    else:
        within = all(d.ci_hi < limit for d in bound.values())
        answer = "yes" if exists and lowers and within else "inconclusive"
    return answer, _penalty_why(unbound, change, bound, left, gone, tolerance, k)


Arms = dict[str, tuple[list[float], list[float]]]  # policy -> (T_torch, T_dali)


def _penalty_groups(spec: Spec, trials: pd.DataFrame) -> dict[str, Arms]:
    """{group label: {"none": (torch, dali), "local": (torch, dali)}} of train times, for every
    3-4 GPU group (the values of the other factors) that has all four arms."""
    need = {"loader", "numa_policy", "gpus", "train_time_s"}
    if trials.empty or not need <= set(trials):
        return {}
    frame = trials[trials["gpus"].isin(PENALTY_GPUS) & trials["numa_policy"].isin(["none", "local"])]
    others = [k for k in spec.grid if k not in ("loader", "numa_policy") and k in frame]
    values = {keys: group["train_time_s"].dropna().tolist()
              for keys, group in frame.groupby([*others, "loader", "numa_policy"], sort=False)}
    found: dict[str, Arms] = {}
    for keys in dict.fromkeys(k[:-2] for k in values):
        arms = {policy: tuple(values.get((*keys, loader, policy), []) for loader in ("torch", "dali"))
                for policy in ("none", "local")}
        if all(a and b for a, b in arms.values()):
            found[", ".join(f"{k}={v}" for k, v in zip(others, keys, strict=True))] = arms  # type: ignore[assignment]
    return found


def level_percent(level: float) -> str:
    """97.5, 98.33, 99.72: a confidence level as a percentage, two decimals at most."""
    return f"{100 * level:.2f}".rstrip("0").rstrip(".")


def _penalty_why(unbound: stats.Difference, change: stats.Difference,
                 bound: dict[str, stats.Difference], left: list[str], gone: list[str],
                 tolerance: float, k: int) -> str:
    def ratio(d: stats.Difference) -> str:
        return f"{math.exp(d.value):.3f}x [{math.exp(d.ci_lo):.3f}, {math.exp(d.ci_hi):.3f}]" \
            if not math.isnan(d.ci_lo) else "no interval"

    limit = math.log1p(tolerance)
    said = [f"penalty T_torch/T_dali without binding, over {k} group(s): {ratio(unbound)}"
            + ("" if unbound.ci_lo > 0 else ", not above 1: no penalty shown to remove"),
            f"binding's change of it (penalty without / under local, over {k} group(s)): {ratio(change)}"
            + ("" if change.ci_lo > 0 else ", not above 1: binding not shown to lower it"),
            f"under local, removed when below {1 + tolerance:g}: "
            + "; ".join(f"{label}: {ratio(d)}" for label, d in bound.items())]
    if k > 1:
        said.append(f"read at the level the {k} groups share ({level_percent(stats.shared_level(k))} %): "
                    f"left in {' / '.join(left) or 'none'}, removed in {' / '.join(gone) or 'none'}")
    undecided = [label for label, d in bound.items() if not d.ci_hi < limit and label not in left]
    if undecided:
        said.append(f"undecided: {' / '.join(undecided)}")
    return "; ".join(said)


def numa_findings(spec: Spec, trials: pd.DataFrame, tolerance: float = PENALTY_TOLERANCE,
                  records: list[dict[str, Any]] | None = None) -> list[Finding]:
    """The questions of the NUMA test, answered from confidence intervals.

    1. Does `local` remove the DataLoader's 3-4 GPU penalty? (penalty_finding)
    2. Does `remote` create a penalty? `yes` when remote is slower than none (CI below 1) for the
       DataLoader at some GPU count.
    3. Which control explains what is left? Every control (page cache, persistent workers,
       normalisation on the device) whose effect on time or pauses has a CI excluding 1.
    4. numactl `local` vs torchrun's `--numa-binding` vs none (torchrun_finding).
    """
    gpus = spec.grid.get("gpus", [spec.fixed.get("gpus")])
    policy = effects(spec, trials, "numa_policy", "none", "train_time_s")
    remote = _select(policy, gpus, numa_policy="remote")
    creates = "not run" if remote.empty else ("yes" if (remote["ci"] == "below").any() else "no")
    tried = [effects(spec, trials, factor, base, metric) for factor, base in CONTROLS
             for metric in ("train_time_s", "first_batch_latency_s")]
    tried = [t for t in tried if not t.empty]
    controls = pd.concat(tried, ignore_index=True) if tried else pd.DataFrame()
    significant = controls[controls["ci"].isin(["above", "below"])] if tried else controls
    explains = "not run" if not tried else ", ".join(sorted(set(significant["factor"]))) or "none"
    return [
        penalty_finding(spec, trials, tolerance, records, policy),
        Finding("Does `remote` create a penalty?", creates, remote),
        Finding("Which control explains what is left?", explains, controls),
        torchrun_finding(spec, trials, gpus),
    ]


def penalty_finding(spec: Spec, trials: pd.DataFrame, tolerance: float = PENALTY_TOLERANCE,
                    records: list[dict[str, Any]] | None = None,
                    policy: pd.DataFrame | None = None, with_evidence: bool = True) -> Finding:
    """Does `local` remove the DataLoader's 3-4 GPU penalty? The penalty is T_torch / T_dali under
    one policy (removes_penalty): `yes` when, at 3-4 GPUs, it is there without binding (the
    interval pooled over the groups above 1), binding lowers it (the pooled interval of the
    penalty without binding over the penalty under it above 1) and it is within `tolerance` of
    1 under local in every group (each interval below 1 + tolerance); `no` only where a penalty
    wholly above the tolerance remains under local; `inconclusive` otherwise, with why, and
    where a config it reads cannot decide (held_penalty_configs, where `records` are given: too
    few ok trials, none, a timed-out attempt); `not run` without 3-4 GPU trials of both loaders
    under both policies. The evidence (`with_evidence`): every GPU count's ratios (the answer
    reads only 3-4 GPUs)."""
    removes, why = removes_penalty(spec, trials, tolerance)
    held = held_penalty_configs(spec, trials, records) if records is not None and removes != "not run" else ""
    if held:
        removes, why = "inconclusive", f"not every config it reads can decide: {held}"
    question = "Does `local` remove the DataLoader's 3-4 GPU penalty?"
    if not with_evidence:
        return Finding(question, removes, pd.DataFrame(), why)
    gpus = spec.grid.get("gpus", [spec.fixed.get("gpus")])
    if policy is None:
        policy = effects(spec, trials, "numa_policy", "none", "train_time_s")
    pauses = effects(spec, trials, "numa_policy", "none", "first_batch_latency_s")
    penalty = effects(spec, trials, "loader", "torch", "train_time_s")
    evidence = [t for t in (_select(policy, gpus, numa_policy="local"),
                            _select(penalty, gpus, numa_policy=["none", "local"], loader="dali"),
                            _select(pauses, gpus, numa_policy="local")) if not t.empty]
    return Finding(question, removes, pd.concat(evidence, ignore_index=True) if evidence else pd.DataFrame(),
                   why)


def torchrun_finding(spec: Spec, trials: pd.DataFrame, gpus: Iterable[int]) -> Finding:
    """numactl `local` vs torchrun's own `--numa-binding` vs none: for each torchrun policy the
    run has, the DataLoader's time against none and against local at every GPU count."""
    question = "numactl `local` vs torchrun's `--numa-binding` vs none?"
    modes = [p for p in spec.grid.get("numa_policy", []) if p in numa.TORCHRUN_POLICIES]
    tables = {base: effects(spec, trials, "numa_policy", base, "train_time_s") for base in ("none", "local")}
    answers, evidence = [], []
    for mode in modes:
        found = {base: _select(table, gpus, numa_policy=mode) for base, table in tables.items()}
        if all(f.empty for f in found.values()):
            continue
        evidence += [f for f in found.values() if not f.empty]
        answers.append(f"{mode}: {_compared(found['none'], 'none')}, {_compared(found['local'], 'local')}")
    if not answers:
        return Finding(question, "not run", pd.DataFrame())
    return Finding(question, "; ".join(answers), pd.concat(evidence, ignore_index=True))


def _compared(effect: pd.DataFrame, base: str) -> str:
    """In words, where the intervals of time(base) / time(level) lie at every GPU count."""
    where = set(effect["ci"]) if not effect.empty else set()
    if not where or where == {"undetermined"}:
        return f"not compared with {base}"
    if where == {"above"}:
        return f"faster than {base}"
    if where == {"below"}:
        return f"slower than {base}"
    if {"above", "below"} <= where:
        return f"faster than {base} at some GPU counts, slower at others"
    if where & {"above", "below"}:
        side = "faster" if "above" in where else "slower"
        return f"{side} than {base} at some GPU counts, no different at others"
    return f"no different from {base} (every CI contains 1)"
