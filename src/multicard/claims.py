"""The paper's claims C1-C19 as predicates over experiment results, and their verdicts.

experiments/claims.toml holds one `[[claim]]` per claim: which experiment it reads, which configs
it compares (`compare` against `against`, within every combination of the other factors, after
`where`), on which metric, and what the paper says (`kind` + value). Verdicts come only from
confidence intervals (README, "Claims and verdicts"):

- `range` (C1, C2, C5, C15): the paper's range [lo, hi] for a quantity of the ratio
  mean(against)/mean(compare) (the ratio itself, the gain (ratio - 1) or the time reduction
  1 - 1/ratio, in %). A group supports it when its estimate lies in the range and contradicts it
  when its whole CI lies outside; otherwise the group is inconclusive.
- `direction` (C4, C7, C8, C12, C13, C16, C19...): the ratio is above 1 (`above`) or below 1
  (`below`). Supported when the CI lies on that side of 1, contradicted when it lies on the other.
- `negligible` (C3, C9, C14): no difference larger than `tolerance` (a fraction): supported when
  the CI lies within 1 +- tolerance, contradicted when it lies entirely outside.
- `outcome` (C11, C17): configs that the paper says fail (or run): supported when every attempt
  of such a config ended in failure (or one ended ok), contradicted when the opposite happened.
- `numa` (C10): the NUMA test's first answer (yes: supported, no: contradicted, partly:
  inconclusive; README, NUMA).
- `shrinks` (C6): the ratio is smaller at the largest value of `along` (e.g. 4 GPUs) than at the
  smallest: supported when the two CIs do not overlap that way round, contradicted when they do
  not overlap the other way round.
- `dominates` (C18): in the traced trials of each config, the summed trace metrics `numerator`
  exceed the summed `denominator` (ratio of means with its CI above 1).
- `all`: several of the above (`parts`); contradicted if any part is, supported if all are.

A metric named `trace.<key>` reads the per-trial trace summaries (profiled trials) instead of the
timing trials.

Across groups: supported if every evaluated group supports, contradicted if every one
contradicts, inconclusive if they disagree or none decides; `not run` when the report has no
trials the claim can read (for example a CPU smoke run for a claim about GPUs).
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from multicard import stats, summarize
from multicard.errors import InputError
from multicard.params import WORKLOAD_METRICS, WORKLOAD_PARAMS
from multicard.profiling.parse import empty_summary
from multicard.spec import Spec

KINDS = ("range", "direction", "negligible", "outcome", "numa", "dominates", "shrinks", "all")
QUANTITIES = ("ratio", "gain_pct", "time_reduction_pct")
VERDICTS = ("supported", "contradicted", "inconclusive", "not run")


@dataclass(frozen=True)
class Claim:
    id: str
    text: str
    paper: str
    kind: str
    experiment: str = ""
    metric: str = ""
    compare: dict[str, Any] = field(default_factory=dict)
    against: dict[str, Any] = field(default_factory=dict)
    where: dict[str, Any] = field(default_factory=dict)
    quantity: str = "ratio"
    range: tuple[float, float] | None = None
    side: str = "above"
    tolerance: float = 0.05
    outcome: str = "fails"
    along: str = "gpus"
    numerator: tuple[str, ...] = ()
    denominator: tuple[str, ...] = ()
    device: str = "cuda"
    parts: tuple[Claim, ...] = ()


@dataclass(frozen=True)
class Evidence:
    """One number behind a verdict: a group's ratio (or gain, time reduction) with its 95% CI, or
    how the attempts of a config ended."""

    label: str  # the group: the values of the factors the claim does not compare
    value: float = math.nan
    ci_lo: float = math.nan
    ci_hi: float = math.nan
    unit: str = "x"  # "x": a ratio; "%": a gain or time reduction
    statuses: tuple[str, ...] = ()  # outcome claims


@dataclass(frozen=True)
class Verdict:
    claim: Claim
    verdict: str
    why: str
    evidence: tuple[Evidence, ...] = ()


@dataclass(frozen=True)
class Results:
    """What one run of one experiment produced."""

    spec: Spec
    trials: pd.DataFrame  # ok timing trials with every metric of the workload
    traces: pd.DataFrame  # ok traced trials, trace metrics per rank (summarize.trace_trials)
    records: list[dict[str, Any]]


def results_of(spec: Spec, records: list[dict[str, Any]]) -> Results:
    everything = replace(spec, metrics=list(WORKLOAD_METRICS[spec.workload]))
    return Results(spec, summarize.trial_table(everything, records),
                   summarize.trace_trials(spec, records), records)


# --- loading -----------------------------------------------------------------------------------

FILE_NAME = "claims.toml"
SETTINGS = frozenset(name for table in WORKLOAD_PARAMS.values() for name in table)
METRICS = frozenset(m for metrics in WORKLOAD_METRICS.values() for m in metrics) | frozenset(
    f"trace.{key}" for key in empty_summary("") if key not in ("format", "epoch_pauses_ns"))
TRACE_METRICS = frozenset(m.removeprefix("trace.") for m in METRICS if m.startswith("trace."))


def default_file() -> Path:
    """experiments/claims.toml of the working directory (the image's /opt/multicard), else of the
    source checkout; $MULTICARD_CLAIMS names another."""
    if env := os.environ.get("MULTICARD_CLAIMS"):
        return Path(env)
    here = Path.cwd() / "experiments" / FILE_NAME
    return here if here.is_file() else Path(__file__).resolve().parents[2] / "experiments" / FILE_NAME


def load(path: Path) -> list[Claim]:
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"{path}: not a readable claims file ({exc})") from None
    if set(doc) != {"claim"} or not isinstance(doc["claim"], list):
        raise InputError(f"{path}: not a claims file: expected only [[claim]] tables "
                         f"(experiments/claims.toml), got {', '.join(sorted(doc)) or 'nothing'}")
    claims = [_claim(path, entry) for entry in doc["claim"]]
    ids = [c.id for c in claims]
    if len(set(ids)) != len(ids):
        raise InputError(f"{path}: [[claim]].id: expected unique ids, got {ids}")
    return claims


def _claim(path: Path, entry: dict[str, Any]) -> Claim:
    where = f"{path}: claim {entry.get('id', '?')}"
    if entry.get("kind") not in KINDS:
        raise InputError(f"{where}: kind: expected one of {', '.join(KINDS)}, got {entry.get('kind')!r}")
    if entry.get("quantity", "ratio") not in QUANTITIES:
        raise InputError(f"{where}: quantity: expected one of {', '.join(QUANTITIES)}")
    values = dict(entry)
    parts = tuple(_claim(path, {"id": entry["id"], "text": "", "paper": "", **p})
                  for p in values.pop("parts", []))
    for key in ("range", "numerator", "denominator"):
        if key in values:
            values[key] = tuple(values[key])
    try:
        claim = Claim(**values, parts=parts)
    except TypeError as exc:
        raise InputError(f"{where}: {exc}") from None
    _check_names(where, claim)
    return claim


def _check_names(where: str, claim: Claim) -> None:
    """A misspelt setting or metric would silently select nothing: refuse it instead."""
    for key in ("compare", "against", "where"):
        unknown = sorted(set(getattr(claim, key)) - SETTINGS)
        if unknown:
            raise InputError(f"{where}: {key}: unknown setting(s) {unknown}")
    if claim.metric and claim.metric not in METRICS:
        raise InputError(f"{where}: metric: unknown metric {claim.metric!r}")
    unknown = sorted(set(claim.numerator + claim.denominator) - TRACE_METRICS)
    if unknown:
        raise InputError(f"{where}: numerator/denominator: unknown trace metric(s) {unknown}")
    needs = {"range": ("metric", "range"), "direction": ("metric",), "negligible": ("metric",),
             "shrinks": ("metric",), "outcome": ("compare",), "dominates": ("numerator", "denominator")}
    missing = [k for k in needs.get(claim.kind, ()) if not getattr(claim, k)]
    if claim.kind != "all" and not claim.experiment:
        missing.insert(0, "experiment")
    if claim.kind == "all" and not claim.parts:
        missing.append("parts")
    if missing:
        raise InputError(f"{where}: kind {claim.kind!r} needs {', '.join(missing)}")


# --- evaluation --------------------------------------------------------------------------------

def evaluate(claims: Iterable[Claim], results: Mapping[str, list[Results]]) -> list[Verdict]:
    return [judge(c, results) for c in claims]


def judge(claim: Claim, results: Mapping[str, list[Results]]) -> Verdict:
    if claim.kind == "all":
        return _combine_parts(claim, [judge(part, results) for part in claim.parts])
    present = results.get(claim.experiment, [])
    if not present:
        return Verdict(claim, "not run", f"no run of {claim.experiment} in this report")
    runs = [r for r in present if _device_ok(claim, r.spec)]
    if runs:
        return JUDGES[claim.kind](claim, runs)
    # e.g. the CPU smoke run: its numbers are shown so the path is visible, but judge nothing
    devices = sorted({str(r.spec.fixed.get("device", "?")) for r in present})
    shown = JUDGES[claim.kind](claim, present)
    return Verdict(claim, "not run", f"only {'/'.join(devices)} trials of {claim.experiment}; the "
                   f"claim is about {claim.device}" + ("; their numbers are shown, not judged"
                                                       if shown.evidence else ""), shown.evidence)


def _device_ok(claim: Claim, spec: Spec) -> bool:
    device = spec.fixed.get("device")
    return claim.device == "any" or device == claim.device or device is None


def _selected(frame: pd.DataFrame, selector: Mapping[str, Any]) -> pd.Series:
    keep = pd.Series(True, index=frame.index)
    for key, wanted in selector.items():
        if key not in frame:
            return pd.Series(False, index=frame.index)
        keep &= frame[key].isin(_levels(wanted))
    return keep


def _ratios(claim: Claim, runs: list[Results]) -> Verdict:
    groups: list[tuple[str, stats.Ratio]] = []
    metric = claim.metric.removeprefix("trace.")
    for run in runs:
        source = run.traces if claim.metric.startswith("trace.") else run.trials
        if source.empty or metric not in source:
            continue
        frame = _with_fixed(source, run.spec)
        frame = frame[_selected(frame, claim.where)]
        varied = set(claim.compare) | set(claim.against)
        others = [k for k in run.spec.grid if k not in varied and k in frame]
        grouped = frame.groupby(others, sort=False) if others else [((), frame)]
        for keys, group in grouped:
            keys = keys if isinstance(keys, tuple) else (keys,)
            a = group.loc[_selected(group, claim.against), metric].dropna().tolist()
            b = group.loc[_selected(group, claim.compare), metric].dropna().tolist()
            if a and b:
                label = ", ".join(f"{k}={v}" for k, v in zip(others, keys, strict=True)) or "all"
                groups.append((label, stats.ratio_of_means(a, b)))
    if not groups:
        return Verdict(claim, "not run", f"no trials of {claim.experiment} match the comparison")
    decisions = [_decide(claim, ratio) for _, ratio in groups]
    evidence = tuple(_evidence(claim, label, ratio) for label, ratio in groups)
    return Verdict(claim, _across(decisions), _why(decisions), evidence)


def _with_fixed(trials: pd.DataFrame, spec: Spec) -> pd.DataFrame:
    """Trial rows with the spec's fixed settings as columns too (selectors may name them)."""
    frame = trials.copy()
    for key, value in spec.fixed.items():
        if key not in frame:
            frame[key] = value
    return frame


def _quantity(claim: Claim, ratio: float) -> float:
    if claim.quantity == "gain_pct":
        return 100 * stats.gain(ratio)
    if claim.quantity == "time_reduction_pct":
        return 100 * stats.time_reduction(ratio)
    return ratio


def _decide(claim: Claim, ratio: stats.Ratio) -> str:
    if math.isnan(ratio.ci_lo):
        return "inconclusive"
    lo, hi = sorted((_quantity(claim, ratio.ci_lo), _quantity(claim, ratio.ci_hi)))
    if claim.kind == "range":
        assert claim.range is not None
        low, high = claim.range
        if hi < low or lo > high:
            return "contradicted"
        return "supported" if low <= _quantity(claim, ratio.value) <= high else "inconclusive"
    if claim.kind == "direction":
        side = stats.direction(ratio.ci_lo, ratio.ci_hi)
        other = "below" if claim.side == "above" else "above"
        return "supported" if side == claim.side else "contradicted" if side == other else "inconclusive"
    band = (1 - claim.tolerance, 1 + claim.tolerance)  # negligible
    if band[0] <= ratio.ci_lo and ratio.ci_hi <= band[1]:
        return "supported"
    return "contradicted" if ratio.ci_hi < band[0] or ratio.ci_lo > band[1] else "inconclusive"


def _across(decisions: list[str]) -> str:
    if all(d == "supported" for d in decisions):
        return "supported"
    if all(d == "contradicted" for d in decisions):
        return "contradicted"
    return "inconclusive"


def _why(decisions: list[str]) -> str:
    counts = {v: decisions.count(v) for v in ("supported", "contradicted", "inconclusive") if v in decisions}
    text = ", ".join(f"{n} {v}" for v, n in counts.items())
    return f"{len(decisions)} comparison(s): {text}"


def _evidence(claim: Claim, label: str, ratio: stats.Ratio) -> Evidence:
    """The ratio as the quantity the claim states (gain and time reduction grow with the ratio,
    so the CI maps end to end)."""
    return Evidence(label, _quantity(claim, ratio.value), _quantity(claim, ratio.ci_lo),
                    _quantity(claim, ratio.ci_hi), "x" if claim.quantity == "ratio" else "%")


def _outcome(claim: Claim, runs: list[Results]) -> Verdict:
    by_config: dict[str, set[str]] = {}  # statuses of every attempt of each named config
    for run in runs:
        for record in run.records:
            settings = {**run.spec.fixed, **record["config"]}
            if record.get("experiment") == run.spec.name and record.get("status") != "interrupted" \
                    and all(settings.get(k) in _levels(v) for k, v in claim.compare.items()):
                by_config.setdefault(str(record["config"]), set()).add(record["status"])
    expected_run = claim.outcome == "runs"
    decisions = [("ok" in statuses) == expected_run for statuses in by_config.values()
                 if statuses != {"skipped"}]
    if not decisions:
        return Verdict(claim, "not run", "no attempted trial of the configs the claim names")
    verdicts = ["supported" if agrees else "contradicted" for agrees in decisions]
    evidence = tuple(Evidence(config, statuses=tuple(sorted(s))) for config, s in by_config.items())
    return Verdict(claim, _across(verdicts), _why(verdicts), evidence)


def _levels(wanted: Any) -> list[Any]:
    return wanted if isinstance(wanted, list) else [wanted]


def _shrinks(claim: Claim, runs: list[Results]) -> Verdict:
    decisions: list[str] = []
    evidence: list[Evidence] = []
    for run in runs:
        if claim.along not in run.spec.grid or len(run.spec.grid[claim.along]) < 2:
            continue
        ends = sorted(run.spec.grid[claim.along])
        ratios = []
        for value in (ends[0], ends[-1]):
            where = {**claim.where, claim.along: value}
            frame = _with_fixed(run.trials, run.spec)
            frame = frame[_selected(frame, where)]
            a = frame.loc[_selected(frame, claim.against), claim.metric].dropna().tolist()
            b = frame.loc[_selected(frame, claim.compare), claim.metric].dropna().tolist()
            ratios.append(stats.ratio_of_means(a, b) if a and b else None)
        first, last = ratios
        if first is None or last is None or math.isnan(first.ci_lo) or math.isnan(last.ci_lo):
            decisions.append("inconclusive")
            continue
        decisions.append("supported" if last.ci_hi < first.ci_lo else
                         "contradicted" if last.ci_lo > first.ci_hi else "inconclusive")
        evidence += [_evidence(claim, f"{claim.along}={ends[0]}", first),
                     _evidence(claim, f"{claim.along}={ends[-1]}", last)]
    if not decisions:
        return Verdict(claim, "not run", f"no run of {claim.experiment} varies {claim.along}")
    return Verdict(claim, _across(decisions), _why(decisions), tuple(evidence))


def _dominates(claim: Claim, runs: list[Results]) -> Verdict:
    decisions: list[str] = []
    evidence: list[Evidence] = []
    for run in runs:
        frame = run.traces
        if frame.empty or not set(claim.numerator + claim.denominator) <= set(frame):
            continue
        frame = frame[_selected(_with_fixed(frame, run.spec), claim.where)]
        for cid, group in frame.groupby("config_id", sort=False):
            ratio = stats.ratio_of_means(group[list(claim.numerator)].sum(axis=1).tolist(),
                                         group[list(claim.denominator)].sum(axis=1).tolist())
            decisions.append(_decide(replace(claim, kind="direction", side="above"), ratio))
            evidence.append(_evidence(claim, str(cid), ratio))
    if not decisions:
        return Verdict(claim, "not run", f"no traced trials of {claim.experiment} (--trace torch|nsys)")
    return Verdict(claim, _across(decisions), _why(decisions), tuple(evidence))


def _numa(claim: Claim, runs: list[Results]) -> Verdict:
    answers = [summarize.numa_findings(run.spec, run.trials)[0].answer for run in runs]
    if all(a == "not run" for a in answers):
        return Verdict(claim, "not run", "no 3-4 GPU DataLoader trials under both none and local")
    mapping = {"yes": "supported", "no": "contradicted", "partly": "inconclusive"}
    decisions = [mapping[a] for a in answers if a in mapping]
    return Verdict(claim, _across(decisions), f"NUMA test answer(s): {', '.join(answers)}")


JUDGES: dict[str, Callable[[Claim, list[Results]], Verdict]] = {
    "range": _ratios, "direction": _ratios, "negligible": _ratios, "outcome": _outcome,
    "shrinks": _shrinks, "dominates": _dominates, "numa": _numa,
}


def _combine_parts(claim: Claim, verdicts: list[Verdict]) -> Verdict:
    kinds = [v.verdict for v in verdicts]
    if all(k == "not run" for k in kinds):
        verdict = "not run"
    elif "contradicted" in kinds:
        verdict = "contradicted"
    elif all(k == "supported" for k in kinds):
        verdict = "supported"
    else:
        verdict = "inconclusive"
    why = "; ".join(f"part {i + 1}: {v.verdict} ({v.why})" for i, v in enumerate(verdicts))
    return Verdict(claim, verdict, why, tuple(e for v in verdicts for e in v.evidence))
