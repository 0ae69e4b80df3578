"""The paper's claims C1-C19 as predicates over experiment results, and their verdicts.

experiments/claims.toml holds one `[[claim]]` per claim: which experiment it reads, which configs
it compares (`compare` against `against`, within every combination of the other factors, after
`where`), on which metric, and what the paper says (`kind` + value). Verdicts come only from
intervals (stats: Welch's t on log values for a ratio of means, Welch's t for a difference), and
only from groups where each arm has at least the spec's `[trials].min_ok` ok trials (5 in the
paper profile, 3 otherwise; 3 traced trials for trace metrics). Labels (README, "Claims and
verdicts"):

- `supported` / `contradicted`: the interval lies where the paper says / wholly where it does not.
- `consistent (imprecise)`: the estimate agrees but the interval reaches beyond (a range or band).
- `mixed`: groups (say 1 and 4 GPUs) decide both ways; the why names which.
- `inconclusive`: intervals too wide, or too few ok trials (the why says n).
- `invalid`: an attempt failed for a reason that is no resource limit (a harness error).
- `not run`: the report holds no trials the claim can read.

Kinds: `range` (C1, C2, C5, C15: the paper's range for the ratio, gain or time reduction),
`direction` (the ratio is above or below 1), `negligible` (within 1 +- tolerance), `not_worse`
(C3: mean(against) - mean(compare) at most `tolerance`, in the metric's units), `outcome` (C11,
C17: configs the paper says fail, or run; "fails" needs a resource cause: out of memory, shared
memory, a killed worker or rank, an NCCL error), `numa` (C10), `shrinks` (C6), `dominates` (C18:
summed trace metrics), `all` (parts: contradicted if any part is, supported if all are). A metric
named `trace.<key>` reads the traced trials' summaries. Failed and timed-out attempts of a group
are named in its why ("precision=fp64: 2 of 5 attempts timed out").
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
from multicard.profiling.parse import NOT_NUMBERS, empty_summary
from multicard.spec import Spec

KINDS = ("range", "direction", "negligible", "not_worse", "outcome", "numa", "dominates", "shrinks",
         "all")
QUANTITIES = ("ratio", "gain_pct", "time_reduction_pct")
CONSISTENT = "consistent (imprecise)"
VERDICTS = ("supported", "contradicted", CONSISTENT, "mixed", "inconclusive", "invalid", "not run")
TRACED_MIN_OK = 3  # traced trials per config before a trace metric decides anything
# failures that are the claim's "cannot run" (C11, C17), not a harness error
RESOURCE_ERRORS = frozenset({"OutOfMemoryError", "OutOfMemory", "SharedMemoryExhausted",
                             "DataLoaderWorkerKilled", "RankKilled", "NCCLError"})


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
    unit: str = "x"  # "x": a ratio; "%": a gain or time reduction; " points": a difference
    statuses: tuple[str, ...] = ()  # outcome claims
    n: tuple[int, int] = (0, 0)  # ok trials of `against` and of `compare`
    decision: str = ""  # this group's verdict


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
QUESTIONS_FILE = "energy_questions.toml"  # the artifact's own questions, answered the same way
SETTINGS = frozenset(name for table in WORKLOAD_PARAMS.values() for name in table)
METRICS = frozenset(m for metrics in WORKLOAD_METRICS.values() for m in metrics) | frozenset(
    f"trace.{key}" for key in empty_summary("") if key not in NOT_NUMBERS)
TRACE_METRICS = frozenset(m.removeprefix("trace.") for m in METRICS if m.startswith("trace."))


def default_file(name: str = FILE_NAME) -> Path:
    """experiments/<name> of the working directory (the image's /opt/multicard), else of the
    source checkout; $MULTICARD_CLAIMS names another claims file."""
    if name == FILE_NAME and (env := os.environ.get("MULTICARD_CLAIMS")):
        return Path(env)
    here = Path.cwd() / "experiments" / name
    return here if here.is_file() else Path(__file__).resolve().parents[2] / "experiments" / name


def load(path: Path) -> list[Claim]:
    if path.exists() and not path.is_file():
        raise InputError(f"{path}: not a regular file: not a claims file")
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
             "not_worse": ("metric",), "shrinks": ("metric",), "outcome": ("compare",),
             "dominates": ("numerator", "denominator")}
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
    """range, direction, negligible and not_worse: one decision per group of the other factors."""
    groups: list[Evidence] = []
    notes: list[str] = []
    metric = claim.metric.removeprefix("trace.")
    # the factors any run of the experiment varies: groups of two runs (a profile that fixes a
    # factor the other varies) get the same labels, and the better evidence of a group is kept
    factors = list(dict.fromkeys(k for run in runs for k in run.spec.grid))
    for run in runs:
        traced = claim.metric.startswith("trace.")
        source = run.traces if traced else run.trials
        if source.empty or metric not in source:
            continue
        frame = _with_fixed(source, run.spec)
        frame = frame[_selected(frame, claim.where)]
        varied = set(claim.compare) | set(claim.against)
        others = [k for k in factors if k not in varied and k in frame]
        grouped = frame.groupby(others, sort=False) if others else [((), frame)]
        minimum = TRACED_MIN_OK if traced else run.spec.min_ok
        for keys, group in grouped:
            keys = keys if isinstance(keys, tuple) else (keys,)
            a = group.loc[_selected(group, claim.against), metric].dropna().tolist()
            b = group.loc[_selected(group, claim.compare), metric].dropna().tolist()
            label = ", ".join(f"{k}={v}" for k, v in zip(others, keys, strict=True)) or "all"
            lost = _attempt_notes(claim, run, dict(zip(others, keys, strict=True)), traced)
            if a and b:
                groups.append(_group(claim, label, a, b, minimum))
            elif (a or b) and lost:  # an arm with no ok trial at all: say so, decide nothing
                groups.append(Evidence(label, n=(len(a), len(b)), decision="too few"))
            notes += lost
    if not groups:
        return Verdict(claim, "not run", f"no trials of {claim.experiment} match the comparison")
    return _verdict(claim, groups, notes)


def _group(claim: Claim, label: str, a: list[float], b: list[float], minimum: int) -> Evidence:
    """One group's evidence and decision; too few ok trials decide nothing."""
    if claim.kind == "not_worse":
        diff = stats.difference_of_means(a, b)
        value, lo, hi, unit = diff.value, diff.ci_lo, diff.ci_hi, " points"
        decision = _decide_margin(claim, diff) if min(len(a), len(b)) >= minimum else "too few"
        scale = 100.0  # accuracy fractions are shown in percentage points
        return Evidence(label, scale * value, scale * lo, scale * hi, unit, n=(len(a), len(b)),
                        decision=decision)
    ratio = stats.ratio_of_means(a, b)
    decision = _decide(claim, ratio) if min(len(a), len(b)) >= minimum else "too few"
    return replace(_evidence(claim, label, ratio), n=(len(a), len(b)), decision=decision)


def _attempt_notes(claim: Claim, run: Results, group: Mapping[str, Any], traced: bool) -> list[str]:
    """"precision=fp64: 2 of 5 attempts timed out" for each arm of a group that lost attempts."""
    notes = []
    for arm in (claim.against, claim.compare):
        statuses = [r["status"] for r in run.records if r.get("experiment") == run.spec.name
                    and (r.get("trace", "none") != "none") == traced
                    and r["status"] not in ("skipped", "interrupted")
                    and _matches({**run.spec.fixed, **r["config"]}, {**group, **arm, **claim.where})]
        bad = [s for s in statuses if s != "ok"]
        if bad:
            arm_label = ", ".join(f"{k}={v}" for k, v in {**arm, **group}.items())
            causes = ", ".join(f"{n} {_STATUS_WORDS.get(s, s)}" for s, n in sorted(
                {s: bad.count(s) for s in bad}.items()))
            notes.append(f"{arm_label}: {len(bad)} of {len(statuses)} attempts not ok ({causes})")
    return notes


_STATUS_WORDS = {"timeout": "timed out", "oom": "out of memory", "failed": "failed"}


def _matches(settings: Mapping[str, Any], selector: Mapping[str, Any]) -> bool:
    return all(settings.get(k) in _levels(v) for k, v in selector.items())


def reads(claim: Claim, experiment: str, config: Mapping[str, Any]) -> bool:
    """Whether `claim` (or one of its parts) reads this config of `experiment`: one of its arms
    matches it, or it reads every config (a claim without arms, e.g. the NUMA verdict)."""
    if claim.parts:
        return any(reads(part, experiment, config) for part in claim.parts)
    if claim.experiment != experiment:
        return False
    arms = [a for a in (claim.compare, claim.against) if a]
    return not arms or any(_matches(config, {**arm, **claim.where}) for arm in arms)


def _verdict(claim: Claim, groups: list[Evidence], notes: list[str]) -> Verdict:
    groups = _best_per_label(groups)
    decisions = ["inconclusive" if g.decision == "too few" else g.decision for g in groups]
    verdict = _across(decisions)
    why = _why(groups, verdict)
    if notes:
        why += "; " + "; ".join(notes)
    return Verdict(claim, verdict, why, tuple(groups))


def _best_per_label(groups: list[Evidence]) -> list[Evidence]:
    """One group per label: where several runs of an experiment hold the same group (a traced
    profile's timing trials beside the paper run's), the one with the most trials per arm."""
    best: dict[str, Evidence] = {}
    for g in groups:
        if g.label not in best or min(g.n) > min(best[g.label].n):
            best[g.label] = g
    return list(best.values())


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
    point = _quantity(claim, ratio.value)
    if claim.kind == "range":
        assert claim.range is not None
        return _inside(lo, hi, point, *claim.range)
    if claim.kind == "direction":
        side = stats.direction(ratio.ci_lo, ratio.ci_hi)
        other = "below" if claim.side == "above" else "above"
        return "supported" if side == claim.side else "contradicted" if side == other else "inconclusive"
    return _inside(ratio.ci_lo, ratio.ci_hi, ratio.value,
                   1 - claim.tolerance, 1 + claim.tolerance)  # negligible


def _inside(lo: float, hi: float, point: float, low: float, high: float) -> str:
    """An interval against the band [low, high]: within it, wholly outside it, or only the point."""
    if low <= lo and hi <= high:
        return "supported"
    if hi < low or lo > high:
        return "contradicted"
    return CONSISTENT if low <= point <= high else "inconclusive"


def _decide_margin(claim: Claim, diff: stats.Difference) -> str:
    """not_worse: the loss (against - compare) is at most `tolerance`."""
    if math.isnan(diff.ci_lo):
        return "inconclusive"
    if diff.ci_hi <= claim.tolerance:
        return "supported"
    if diff.ci_lo > claim.tolerance:
        return "contradicted"
    return CONSISTENT if diff.value <= claim.tolerance else "inconclusive"


def _across(decisions: list[str]) -> str:
    """One verdict from the groups': every group must agree for supported or contradicted."""
    found = set(decisions)
    if not found:
        return "not run"
    if "invalid" in found:
        return "invalid"
    if found == {"supported"}:
        return "supported"
    if found == {"contradicted"}:
        return "contradicted"
    if "contradicted" in found and found & {"supported", CONSISTENT}:
        return "mixed"
    if found <= {"supported", CONSISTENT}:
        return CONSISTENT
    return "inconclusive"


def _why(groups: list[Evidence], verdict: str) -> str:
    """How many groups decided what, naming the groups when they disagree or had too few trials."""
    by: dict[str, list[str]] = {}
    for g in groups:
        by.setdefault(g.decision, []).append(g.label)
    parts = []
    for decision, labels in by.items():
        named = verdict in ("mixed", "inconclusive", CONSISTENT) or decision == "too few"
        if decision == "too few":
            shown = ", ".join(f"{g.label} (n = {g.n[0]}/{g.n[1]})" for g in groups
                              if g.decision == "too few")
            parts.append(f"{len(labels)} with too few ok trials per arm: {shown}")
        else:
            parts.append(f"{len(labels)} {decision}" + (f" ({', '.join(labels)})" if named else ""))
    return f"{len(groups)} comparison(s): " + ", ".join(parts)


def _evidence(claim: Claim, label: str, ratio: stats.Ratio) -> Evidence:
    """The ratio as the quantity the claim states (gain and time reduction grow with the ratio,
    so the CI maps end to end)."""
    return Evidence(label, _quantity(claim, ratio.value), _quantity(claim, ratio.ci_lo),
                    _quantity(claim, ratio.ci_hi), "x" if claim.quantity == "ratio" else "%",
                    n=(ratio.n_baseline, ratio.n_other))


def _outcome(claim: Claim, runs: list[Results]) -> Verdict:
    """Each named config ran (an ok attempt) or failed for a resource; anything else is a harness
    error (invalid), and attempts that only timed out cannot tell slow from failing."""
    by_config: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        for record in run.records:
            if record.get("experiment") == run.spec.name and record.get("status") not in (
                    "interrupted", "skipped") and record.get("trace", "none") == "none" \
                    and _matches({**run.spec.fixed, **record["config"]}, claim.compare):
                label = ", ".join(f"{k}={v}" for k, v in record["config"].items())
                by_config.setdefault(label, []).append(record)
    if not by_config:
        return Verdict(claim, "not run", "no attempted trial of the configs the claim names")
    groups = [_outcome_group(claim, config, records) for config, records in by_config.items()]
    notes = [f"{config}: {_ending(records)}" for config, records in by_config.items()]
    return _verdict(claim, groups, notes)


def _ending(records: list[dict[str, Any]]) -> str:
    """"4 of 5 attempts out of memory, 1 ok" / "1 of 1 failed (ModuleNotFoundError)"."""
    kinds: dict[str, int] = {}
    for r in records:
        error = (r.get("error") or {}).get("type")
        word = "ok" if r["status"] == "ok" else _STATUS_WORDS.get(r["status"], r["status"])
        key = f"{word} ({error})" if r["status"] == "failed" and error else word
        kinds[key] = kinds.get(key, 0) + 1
    return f"of {len(records)} attempts " + ", ".join(f"{n} {k}" for k, n in kinds.items())


def _outcome_group(claim: Claim, config: str, records: list[dict[str, Any]]) -> Evidence:
    statuses = tuple(sorted({r["status"] for r in records}))
    if "ok" in statuses:
        ran = True
    else:
        causes = {_failure_kind(r) for r in records}
        if "harness" in causes:
            return Evidence(config, statuses=statuses, decision="invalid", n=(len(records), 0))
        if causes == {"timeout"}:
            return Evidence(config, statuses=statuses, decision="inconclusive", n=(len(records), 0))
        ran = False
    agrees = ran == (claim.outcome == "runs")
    return Evidence(config, statuses=statuses, n=(len(records), 0),
                    decision="supported" if agrees else "contradicted")


def _failure_kind(record: dict[str, Any]) -> str:
    """"resource", "timeout" or "harness" for an attempt that did not end ok."""
    if record["status"] == "oom":
        return "resource"
    if record["status"] == "timeout":
        return "timeout"
    error = record.get("error") or {}
    return "resource" if error.get("type") in RESOURCE_ERRORS else "harness"


def _levels(wanted: Any) -> list[Any]:
    return wanted if isinstance(wanted, list) else [wanted]


def _shrinks(claim: Claim, runs: list[Results]) -> Verdict:
    groups: list[Evidence] = []
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
        if first is None or last is None:
            continue
        enough = min(first.n_baseline, first.n_other, last.n_baseline, last.n_other) >= run.spec.min_ok
        if not enough:
            decision = "too few"
        elif math.isnan(first.ci_lo) or math.isnan(last.ci_lo):
            decision = "inconclusive"
        else:
            decision = ("supported" if last.ci_hi < first.ci_lo else
                        "contradicted" if last.ci_lo > first.ci_hi else "inconclusive")
        for value, ratio in ((ends[0], first), (ends[-1], last)):
            groups.append(replace(_evidence(claim, f"{claim.along}={value}", ratio),
                                  decision=decision))
    if not groups:
        return Verdict(claim, "not run", f"no run of {claim.experiment} varies {claim.along}")
    # the two ends of one run make one decision: count it once
    pairs = groups[::2]
    verdict = _across(["inconclusive" if g.decision == "too few" else g.decision for g in pairs])
    return Verdict(claim, verdict, _why(pairs, verdict), tuple(groups))


def _dominates(claim: Claim, runs: list[Results]) -> Verdict:
    groups: list[Evidence] = []
    for run in runs:
        frame = run.traces
        if frame.empty or not set(claim.numerator + claim.denominator) <= set(frame):
            continue
        frame = frame[_selected(_with_fixed(frame, run.spec), claim.where)]
        for cid, group in frame.groupby("config_id", sort=False):
            ratio = stats.ratio_of_means(group[list(claim.numerator)].sum(axis=1).tolist(),
                                         group[list(claim.denominator)].sum(axis=1).tolist())
            decision = _decide(replace(claim, kind="direction", side="above"), ratio) \
                if len(group) >= TRACED_MIN_OK else "too few"
            groups.append(replace(_evidence(claim, str(cid), ratio), decision=decision))
    if not groups:
        return Verdict(claim, "not run", f"no traced trials of {claim.experiment} (--trace torch|nsys)")
    return _verdict(claim, groups, [])


def _numa(claim: Claim, runs: list[Results]) -> Verdict:
    answers = []
    for run in runs:
        thin = _thin_numa_arms(run)
        answers.append(f"too few ok trials ({thin})" if thin else
                       summarize.numa_findings(run.spec, run.trials)[0].answer)
    if all(a == "not run" for a in answers):
        return Verdict(claim, "not run", "no 3-4 GPU DataLoader trials under both none and local")
    mapping = {"yes": "supported", "no": "contradicted", "partly": "inconclusive"}
    decisions = [mapping.get(a, "inconclusive") for a in answers if a != "not run"]
    return Verdict(claim, _across(decisions), f"NUMA test answer(s): {', '.join(answers)}")


def _thin_numa_arms(run: Results) -> str:
    """The 3-4 GPU arms of the NUMA test's first question that have fewer than min_ok trials."""
    frame = _with_fixed(run.trials, run.spec)
    needed = [("torch", "none"), ("torch", "local"), ("dali", "local")]
    thin = []
    for gpus in summarize.PENALTY_GPUS:
        for loader, policy in needed:
            n = int(((frame.get("loader") == loader) & (frame.get("numa_policy") == policy)
                     & (frame.get("gpus") == gpus)).sum()) if {"loader", "numa_policy", "gpus"} \
                <= set(frame) else 0
            if 0 < n < run.spec.min_ok:
                thin.append(f"{loader}/{policy} at {gpus} GPUs: n = {n} < {run.spec.min_ok}")
    return "; ".join(thin)


JUDGES: dict[str, Callable[[Claim, list[Results]], Verdict]] = {
    "range": _ratios, "direction": _ratios, "negligible": _ratios, "not_worse": _ratios,
    "outcome": _outcome, "shrinks": _shrinks, "dominates": _dominates, "numa": _numa,
}


def _combine_parts(claim: Claim, verdicts: list[Verdict]) -> Verdict:
    """A claim of several parts holds when every part does and fails when any part does."""
    kinds = [v.verdict for v in verdicts]
    if all(k == "not run" for k in kinds):
        verdict = "not run"
    elif "invalid" in kinds:
        verdict = "invalid"
    elif "contradicted" in kinds:
        verdict = "contradicted"
    elif all(k == "supported" for k in kinds):
        verdict = "supported"
    elif "mixed" in kinds:
        verdict = "mixed"
    elif set(kinds) <= {"supported", CONSISTENT}:
        verdict = CONSISTENT
    else:
        verdict = "inconclusive"
    why = "; ".join(f"part {i + 1}: {v.verdict} ({v.why})" for i, v in enumerate(verdicts))
    return Verdict(claim, verdict, why, tuple(e for v in verdicts for e in v.evidence))
