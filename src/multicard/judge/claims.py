"""The paper's claims C1-C19 as predicates over experiment results, and their verdicts.

experiments/claims.toml holds one `[[claim]]` per claim: which experiment it reads, which configs
it compares (`compare` against `against`, within every combination of the other factors, after
`where`), on which metric, and what the paper says (`kind` + value), and one `[tolerance.<kind>]`
per kind of claim: what reproducing a claim of that kind means (a reproduction runs on other GPUs,
drivers and software than the paper's, so it matches the paper's effect within a tolerance, not to
the digit), with its reason. Verdicts come only from 95 % intervals (stats: Welch's t on log values
for a ratio of means, Welch's t for a difference), read as two one-sided tests at 2.5 % each
against the tolerant band (an equivalence test), and only from groups where each arm has at least
the spec's `[trials].min_ok` ok trials (5 in the paper profile, 3 otherwise; 3 traced trials for
trace metrics). Labels (docs/claims.md):

- `supported` / `contradicted`: the interval lies where the paper says / wholly where it does not;
  over several groups (or parts): every one supported / one contradicted, read at the level the
  groups share (each interval at 1 - 0.05/k, Bonferroni: _at_shared_level), since among many
  groups one interval wholly outside is otherwise chance.
- `consistent (imprecise)`: the estimate agrees but the interval reaches beyond (a range or band).
- `mixed`: groups (say 1 and 4 GPUs) decide both ways, at the shared level; the why names which.
- `inconclusive`: intervals too wide, or too few ok trials (the why says n).
- `invalid`: an attempt failed for a reason that is no resource limit (a harness error).
- `not run`: the report holds no trials the claim can read.

Kinds (all but `negligible`, which reads the ratio within 1 +- tol, judged on the log of the
ratio, the effect):
- `range` (C1, C2, C5, C15): the paper's span over configurations (a gain, a time reduction or a
  ratio) as log ratios, widened by the tolerance as a share of the effect, the end nearer no
  effect towards it and the other away (span_band): every group's interval inside supports it,
  one wholly outside contradicts it;
- `direction`: contradicted when the interval lies wholly short of 1 + tol on the claimed side (no
  effect of the size that matters, one too small to matter, or the other way); else supported
  when it lies on that side of 1;
- `negligible` (within 1 +- tol), `not_worse` (C3: mean(against) - mean(compare) at most tol, in
  the metric's units), `shrinks` (C6: the change of the log ratio from the fewest to the most
  GPUs, by one Welch interval, read as `direction` reads a ratio);
- `outcome` (C11, C17: configs the paper says fail, or run; "fails" needs a resource cause: out of
  memory, shared memory, a killed worker or rank, an NCCL error), `numa` (C10: summarize's NUMA
  test with the tolerance: the penalty pooled over 3-4 GPUs without binding, the change binding
  makes to it pooled the same way, each group's under `local`), `dominates` (C18: summed trace
  metrics), `all` (parts: contradicted if any part is, supported if all are).
Where the paper gives a value for one group (Table 5, C3's two accuracies), the claim carries it
(`values`, from the experiment's [[reference]] entries) and its evidence shows it beside ours.
A metric named `trace.<key>` reads the traced trials' summaries. Failed and timed-out attempts of
a group are named in its why ("precision=fp64: 2 of 5 attempts timed out"), and a timed-out
attempt censors its group (its time only exceeds the timeout: the ok trials' mean is biased
low), which then decides nothing; a group whose arm
failed every attempt for a resource (out of memory: what C17 says of QAT) is an outcome, left
out of a comparison and named.
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from multicard.errors import InputError
from multicard.judge import operating_point, stats, summarize
from multicard.plan import spec as specmod
from multicard.plan.params import WORKLOAD_METRICS, WORKLOAD_PARAMS
from multicard.plan.spec import Spec, level_rank
from multicard.profiling.parse import NOT_NUMBERS, empty_summary

KINDS = ("range", "direction", "negligible", "not_worse", "outcome", "numa", "dominates", "shrinks",
         "all")
QUANTITIES = ("ratio", "gain_pct", "time_reduction_pct")
CONSISTENT = "consistent (imprecise)"
VERDICTS = ("supported", "contradicted", CONSISTENT, "mixed", "inconclusive", "invalid", "not run")
TRACED_MIN_OK = 3  # traced trials per config before a trace metric decides anything
# a group with a timed-out attempt: its time is only known to exceed the timeout, so the ok
# trials' mean is biased low; it decides nothing (and a resume does not run the attempt again)
CENSORED = "censored"
# a group whose arms' energy was read two ways (NVML's counter in one, power integrated in the
# other): the two are not the same measurement, so they are not compared
READ_APART = "read differently"
UNDECIDED = ("too few", CENSORED, READ_APART)
# how an energy metric's value was read: the keys of a record's `measured_how` it rests on
ENERGY_READINGS = {"energy_j": ("energy_j",), "energy_per_sample_j": ("energy_j",),
                   "energy_per_token_j": ("energy_j",), "mean_power_w": ("energy_j",),
                   "cpu_energy_j": ("cpu_energy_j",),
                   "node_energy_per_sample_j": ("energy_j", "cpu_energy_j")}
# kinds whose verdict reads a tolerance: [tolerance.<kind>] of the claims file, or the claim's own
TOLERANT_KINDS = ("range", "direction", "negligible", "not_worse", "numa", "shrinks", "dominates")
# how a ratio mean(against) / mean(compare) is read as the number the paper states
READINGS = {"ratio": "ratio", "gain_pct": "gain (ratio - 1)",
            "time_reduction_pct": "time reduction (1 - 1/ratio)"}
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
    tolerance: float | None = None  # None: the file's [tolerance.<kind>]
    tolerance_reason: str = ""
    outcome: str = "fails"
    along: str = "gpus"
    numerator: tuple[str, ...] = ()
    denominator: tuple[str, ...] = ()
    device: str = "cuda"
    # a metric read where a run measured none of `metric`, and what the verdict then says
    # (E2, E3: "GPU energy only" where the CPU packages' energy could not be read)
    fallback_metric: str = ""
    fallback_label: str = ""
    metric_label: str = ""  # what a verdict on `metric` itself says (E2, E3: "GPU + CPU packages")
    # a not_worse claim about converged training: below this mean of its `against` arm the
    # verdict says the trials stopped short of convergence (C3: the paper's 98 % target)
    converged_at: float | None = None
    parts: tuple[Claim, ...] = ()
    # the paper's value per group where it gives one: from the experiment's [[reference]] entries
    # (paper_values), in the claim's quantity (a loss in the metric's units for not_worse)
    values: tuple[PaperValue, ...] = ()
    # a setting the claim holds under one level of only (C4: cast, named in `where`): the verdict
    # is the one under that level, and the others the runs hold are judged and named beside it
    condition: str = ""


@dataclass(frozen=True)
class PaperValue:
    """The paper's number for one group of a claim (Table 5's 3.50 % at gpus=4)."""

    group: dict[str, Any]  # the settings of the group (factors the claim does not compare)
    value: float
    source: str
    inferred: bool = False  # the cell, or its config, is inferred (the reference says so)


@dataclass(frozen=True)
class Evidence:
    """One number behind a verdict: a group's ratio (or gain, time reduction) with its 95% CI, or
    how the attempts of a config ended."""

    label: str  # the group: the values of the factors the claim does not compare
    value: float = math.nan
    ci_lo: float = math.nan
    ci_hi: float = math.nan
    unit: str = "x"  # "x": a ratio; "%": a gain or time reduction; " points": a difference
    reading: str = ""  # how the number reads the ratio (READINGS), "" for other numbers
    statuses: tuple[str, ...] = ()  # outcome claims
    n: tuple[int, int] = (0, 0)  # ok trials of `against` and of `compare`
    decision: str = ""  # this group's verdict
    paper: float = math.nan  # the paper's value for this group, in the same unit (PaperValue)
    paper_inferred: bool = False  # ... inferred, not given (Table 5's mapping, Table 3's ends)


@dataclass(frozen=True)
class Verdict:
    claim: Claim
    verdict: str
    why: str
    evidence: tuple[Evidence, ...] = ()
    groups: int = 0  # comparisons that reached a decision of their own (not too few, censored)
    read_as: str = ""  # the claim's fallback_label where a run was judged on its fallback metric


@dataclass(frozen=True)
class Results:
    """What one run of one experiment produced."""

    spec: Spec
    trials: pd.DataFrame  # ok timing trials with every metric of the workload
    traces: pd.DataFrame  # ok traced trials, trace metrics per rank (summarize.trace_trials)
    records: list[dict[str, Any]]

    @functools.cached_property
    def attempts(self) -> tuple[tuple[dict[str, Any], dict[str, Any]], ...]:
        """(settings, record) of every attempt of this experiment that ended (not skipped, not
        interrupted): read once, matched per group and arm."""
        return tuple(({**self.spec.fixed, **r["config"]}, r) for r in self.records
                     if r.get("experiment") == self.spec.name
                     and r["status"] not in ("skipped", "interrupted"))

    @functools.cached_property
    def statuses(self) -> frozenset[str]:
        """How its attempts ended: with only "ok", no group lost an attempt (most runs)."""
        return frozenset(r["status"] for _, r in self.attempts)


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
    return here if here.is_file() else Path(__file__).resolve().parents[3] / "experiments" / name


def load(path: Path) -> list[Claim]:
    if path.exists() and not path.is_file():
        raise InputError(f"{path}: not a regular file: not a claims file")
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"{path}: not a readable claims file ({exc})") from None
    if "claim" not in doc or set(doc) - {"claim", "tolerance"} or not isinstance(doc["claim"], list):
        raise InputError(f"{path}: not a claims file: expected [[claim]] and [tolerance.<kind>] "
                         f"tables (experiments/claims.toml), got {', '.join(sorted(doc)) or 'nothing'}")
    rules = _tolerances(path, doc.get("tolerance", {}))
    claims = [_with_values(_with_tolerance(path, _claim(path, entry), rules), path.parent)
              for entry in doc["claim"]]
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


def _tolerances(path: Path, table: Any) -> dict[str, tuple[float, str]]:
    """[tolerance.<kind>] tables: {kind: (value, reason)}; a rule without its reason is refused."""
    if not isinstance(table, dict):
        raise InputError(f"{path}: tolerance: expected [tolerance.<kind>] tables")
    rules = {}
    for kind, rule in table.items():
        where = f"{path}: tolerance.{kind}"
        if kind not in TOLERANT_KINDS:
            raise InputError(f"{where}: expected one of {', '.join(TOLERANT_KINDS)}")
        if not isinstance(rule, dict) or set(rule) != {"value", "reason"}:
            raise InputError(f"{where}: expected exactly `value` and `reason`")
        value, reason = rule["value"], rule["reason"]
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
            raise InputError(f"{where}.value: expected a number in [0, 1), got {value!r}")
        if not isinstance(reason, str) or not reason.strip():
            raise InputError(f"{where}.reason: expected the reason for this tolerance, as text")
        rules[kind] = (float(value), reason.strip())
    return rules


def _with_tolerance(path: Path, claim: Claim, rules: dict[str, tuple[float, str]]) -> Claim:
    """The claim (and its parts) with the tolerance of its kind, unless it states its own,
    which then needs its own reason."""
    parts = tuple(_with_tolerance(path, part, rules) for part in claim.parts)
    if claim.kind not in TOLERANT_KINDS:
        return replace(claim, parts=parts)
    where = f"{path}: claim {claim.id}"
    if claim.tolerance is not None:
        if not claim.tolerance_reason.strip():
            raise InputError(f"{where}: tolerance: a claim's own tolerance needs its tolerance_reason")
        return replace(claim, parts=parts)
    if claim.kind not in rules:
        raise InputError(f"{where}: kind {claim.kind!r} needs a tolerance: a [tolerance.{claim.kind}] "
                         "table (value, reason) or the claim's own tolerance and tolerance_reason")
    value, reason = rules[claim.kind]
    return replace(claim, tolerance=value, tolerance_reason=reason, parts=parts)


def _with_values(claim: Claim, folder: Path) -> Claim:
    """The claim (and its parts) with the paper's per-group values, from the [[reference]]
    entries of its experiment's spec where `folder` holds it (a claims file of one's own
    elsewhere: none)."""
    if claim.parts:
        return replace(claim, parts=tuple(_with_values(p, folder) for p in claim.parts))
    spec_file = folder / f"{claim.experiment}.toml"
    if not claim.experiment or not spec_file.is_file():
        return claim
    return replace(claim, values=paper_values(claim, specmod.load(spec_file).references))


def paper_values(claim: Claim, references: Iterable[specmod.Reference]) -> tuple[PaperValue, ...]:
    """The paper's single values (not spans) for the groups of `claim`: a reference that selects
    the claim's `compare` arm and states the claim's quantity (`speedup_x` for a ratio) gives
    the value of the group its other settings name; for `not_worse`, the loss of the metric
    between references of both arms in one group (C3: 99.20 % - 97.94 %)."""
    references = list(references)
    if claim.kind == "not_worse":
        return _paper_losses(claim, references)
    if claim.kind not in ("range", "direction", "negligible", "shrinks"):
        return ()
    key = "speedup_x" if claim.quantity == "ratio" else claim.quantity
    found = []
    for ref in references:
        value, group = ref.values.get(key), _group_named(claim, ref.match, claim.compare)
        if isinstance(value, int | float) and group is not None:
            found.append(PaperValue(group, float(value), ref.source, ref.inferred))
    return tuple(found)


def _paper_losses(claim: Claim, references: list[specmod.Reference]) -> tuple[PaperValue, ...]:
    found = []
    for ref in references:
        group, value = _group_named(claim, ref.match, claim.compare), ref.values.get(claim.metric)
        if group is None or not isinstance(value, int | float):
            continue
        base = next((r for r in references if r.match == {**claim.against, **group}
                     and isinstance(r.values.get(claim.metric), int | float)), None)
        if base is not None:
            loss = float(base.values[claim.metric]) - float(value)  # type: ignore[arg-type]
            found.append(PaperValue(group, loss, f"{base.source}; {ref.source}",
                                    base.inferred or ref.inferred))
    return tuple(found)


def _group_named(claim: Claim, match: Mapping[str, Any], arm: Mapping[str, Any]) -> dict[str, Any] | None:
    """The group a reference's `match` names when it selects `arm` (its other settings, inside
    the claim's `where`); None when it selects another arm or lies outside `where`."""
    if not arm or set(arm) - set(match) or not matches(match, arm):
        return None
    group = {k: v for k, v in match.items() if k not in arm}
    if set(group) & set(claim.against) or not matches(group, {k: w for k, w in claim.where.items()
                                                              if k in group}):
        return None
    return group


def paper_value_at(claim: Claim, settings: Mapping[str, Any]) -> PaperValue | None:
    """The paper's value for the group with these settings (a profile's fixed ones included:
    table5's eval fixes gpus = 4); None where it gives none."""
    return next((v for v in claim.values if all(settings.get(k) == want for k, want in v.group.items())),
                None)


def _paper_evidence(claim: Claim, settings: Mapping[str, Any]) -> dict[str, Any]:
    """Evidence fields for the paper's value of a group, in the evidence's unit (points for a loss)."""
    found = paper_value_at(claim, settings)
    if found is None:
        return {}
    scale = 100 if claim.kind == "not_worse" else 1
    return {"paper": found.value * scale, "paper_inferred": found.inferred}


def _check_names(where: str, claim: Claim) -> None:
    """A misspelt setting or metric would silently select nothing: refuse it instead."""
    for key in ("compare", "against", "where"):
        unknown = sorted(set(getattr(claim, key)) - SETTINGS)
        if unknown:
            raise InputError(f"{where}: {key}: unknown setting(s) {unknown}")
    if claim.metric and claim.metric not in METRICS:
        raise InputError(f"{where}: metric: unknown metric {claim.metric!r}")
    if claim.fallback_metric and (claim.fallback_metric not in METRICS or not claim.fallback_label):
        raise InputError(f"{where}: fallback_metric: expected a known metric with its fallback_label "
                         f"(what a verdict on it says), got {claim.fallback_metric!r}")
    unknown = sorted(set(claim.numerator + claim.denominator) - TRACE_METRICS)
    if unknown:
        raise InputError(f"{where}: numerator/denominator: unknown trace metric(s) {unknown}")
    needs = {"range": ("metric", "range"), "direction": ("metric",), "negligible": ("metric",),
             "not_worse": ("metric",), "shrinks": ("metric",), "outcome": ("compare",),
             "dominates": ("numerator", "denominator")}
    missing = [k for k in needs.get(claim.kind, ()) if not getattr(claim, k)]
    if claim.condition and claim.condition not in claim.where:
        raise InputError(f"{where}: condition {claim.condition!r}: name the level the claim "
                         f"holds under in `where` ({claim.condition} = ...)")
    if claim.kind != "all" and not claim.experiment:
        missing.insert(0, "experiment")
    if claim.kind == "all" and not claim.parts:
        missing.append("parts")
    if missing:
        raise InputError(f"{where}: kind {claim.kind!r} needs {', '.join(missing)}")


# --- evaluation --------------------------------------------------------------------------------

def evaluate(claims: Iterable[Claim], results: Mapping[str, list[Results]]) -> list[Verdict]:
    return [judge(c, results) for c in claims]


# verdicts that reject a hypothesis (the claim's band, or its complement), which a family of
# judgements must pay for; the others reject nothing
DECISIVE = ("supported", "contradicted", "mixed")
HOLM_UNDECIDED = "inconclusive (Holm)"
FAMILY_ALPHA = 1 - stats.CONFIDENCE  # the raw verdicts' two-sided level, now for the family


def judged(verdicts: Iterable[Verdict]) -> int:
    """How many verdicts are judgements: all but `not run` and `invalid`, which test nothing."""
    return sum(v.verdict not in ("not run", "invalid") for v in verdicts)


def holm(verdicts: list[Verdict], results: Mapping[str, list[Results]],
         alpha: float = FAMILY_ALPHA) -> list[str]:
    """Each verdict after Holm's step-down over the family of judged claims: a decisive verdict
    stands only where it still holds with intervals at 1 - alpha / (m - k), k being the verdicts
    that stood before it (run as passes: every verdict that holds at a pass's level stands, as
    Holm's sorted p-values would have it); one that does not becomes HOLM_UNDECIDED. The chance
    of any wrong decisive verdict is then at most that of one raw verdict."""
    adjusted = [v.verdict for v in verdicts]
    family = judged(verdicts)
    open_ = [i for i, v in enumerate(verdicts) if v.verdict in DECISIVE]
    stood = 0
    while open_:
        with stats.confidence_level(1 - alpha / (family - stood)):
            holding = [i for i in open_ if judge(verdicts[i].claim, results).verdict
                       == verdicts[i].verdict]
        if not holding:
            break
        stood += len(holding)
        open_ = [i for i in open_ if i not in holding]
    for i in open_:
        adjusted[i] = HOLM_UNDECIDED
    return adjusted


def judge(claim: Claim, results: Mapping[str, list[Results]]) -> Verdict:
    if claim.kind == "all":
        parts = [judge(part, results) for part in claim.parts]
        return _at_shared_level(_combine_parts(claim, parts), _judged_parts(parts),
                                lambda: _combine_parts(claim, [judge(p, results) for p in claim.parts]),
                                "parts")
    present = results.get(claim.experiment, [])
    if not present:
        return Verdict(claim, "not run", f"no run of {claim.experiment} in this report")
    runs = [r for r in present if device_ok(claim, r.spec)]
    if runs and claim.condition:
        return _conditional(claim, results, runs)
    if runs:
        raw = JUDGES[claim.kind](claim, runs)
        return _at_shared_level(raw, raw.groups, lambda: JUDGES[claim.kind](claim, runs))
    # e.g. the CPU smoke run: its numbers are shown so the path is visible, but judge nothing
    devices = sorted({str(r.spec.fixed.get("device", "?")) for r in present})
    shown = JUDGES[claim.kind](claim, present)
    return Verdict(claim, "not run", f"only {'/'.join(devices)} trials of {claim.experiment}; the "
                   f"claim is about {claim.device}" + ("; their numbers are shown, not judged"
                                                       if shown.evidence else ""), shown.evidence)


def _conditional(claim: Claim, results: Mapping[str, list[Results]], runs: list[Results]) -> Verdict:
    """The verdict under the claim's own level of its condition, said to be conditional, with the
    verdict under each other level the runs hold beside it (C4: FP16 halves the bytes a host cast
    copies; a device cast copies FP32 whatever the precision)."""
    key, own = claim.condition, claim.where[claim.condition]
    found = judge(replace(claim, condition=""), results)
    levels = {values.get(key) for r in runs for _, _, values in specmod.configs(r.spec)} - {own, None}
    others = [(level, judge(replace(claim, condition="", where={**claim.where, key: level}), results))
              for level in sorted(levels, key=str)]
    beside = "; ".join(f"with {key}={level}: {v.verdict}" + (f" ({evidence_summary(v)})"
                                                             if v.evidence else "") for level, v in others)
    return replace(found, why=f"conditional on {key}={own}: {found.why}"
                   + (f". {beside}" if beside else f". No run holds another {key} to compare"))


def evidence_summary(verdict: Verdict) -> str:
    """A verdict's first groups as `label value [lo, hi]`, for a line that names it beside another."""
    return ", ".join(f"{e.label} {e.value:.3g}{e.unit.strip()} [{e.ci_lo:.3g}, {e.ci_hi:.3g}]"
                     for e in verdict.evidence[:3] if not math.isnan(e.value))


def _at_shared_level(raw: Verdict, groups: int, again: Callable[[], Verdict],
                     what: str = "comparisons") -> Verdict:
    """A claim holds in every group (or part) it reads: `supported` needs each group's interval
    where the paper says (an intersection-union test: no adjustment), but one group's interval
    wholly outside is enough for `contradicted`, and one each way for `mixed`, so those read
    intervals the groups share: each at 1 - (1 - level) / groups (Bonferroni). `again` judges
    the claim once more, at that level, when the raw verdict is one of them."""
    if raw.verdict not in ("contradicted", "mixed") or groups <= 1:
        return raw
    level = stats.shared_level(groups)
    with stats.confidence_level(level):
        shared = again()
    each, together = summarize.level_percent(level), summarize.level_percent(stats.level())
    note = (f"read at the level its {groups} {what} share (each interval at {each} %, so that "
            f"together they hold at {together} %: among many, one interval wholly outside is "
            "otherwise chance)")
    # the evidence shows the groups' own 95 % intervals, with the decisions read at the shared level
    evidence = raw.evidence if len(raw.evidence) != len(shared.evidence) else tuple(
        replace(e, decision=s.decision) for e, s in zip(raw.evidence, shared.evidence, strict=True))
    return replace(shared, why=f"{shared.why}; {note}", evidence=evidence, groups=raw.groups)


def _judged_parts(parts: list[Verdict]) -> int:
    """The parts whose verdict rests on intervals (an outcome's does not) and judged something."""
    return sum(v.verdict not in ("not run", "invalid") and v.claim.kind != "outcome" for v in parts)



def device_ok(claim: Claim, spec: Spec) -> bool:
    device = spec.fixed.get("device")
    return claim.device == "any" or device == claim.device or device is None


def can_decide(claim: Claim, spec: Spec) -> bool:
    """Whether a run of `spec` as planned holds what `claim` (a claim without parts) needs to be
    decided: its experiment on the claim's device, a config of each arm, a second level of
    `along` (C6), and the verdict minimum of trials: ok timing trials for a timing metric (the
    pilot's left out), 3 traced trials for a trace metric, one attempt for an outcome."""
    if not device_ok(claim, spec) or not holds_arms(claim, spec):
        return False
    if claim.kind == "outcome":
        return True
    if claim.kind == "dominates" or claim.metric.startswith("trace."):
        return spec.trace != "none" and spec.trace_count >= TRACED_MIN_OK
    return timing_trials(spec) >= spec.min_ok


def holds_arms(claim: Claim, spec: Spec) -> bool:
    """Whether `spec`'s configs hold what `claim` (a claim without parts) compares, whatever the
    device and trials: its experiment, a config of each arm, a second level of `along` (C6), both
    loaders under none and local at 3-4 GPUs (the NUMA test)."""
    if claim.experiment != spec.name or summarize.is_loader_only(spec):  # it trains nothing
        return False
    settings = [values for _, _, values in specmod.configs(spec)]
    arms = [arm for arm in (claim.compare, claim.against) if arm]
    if not all(any(matches(s, {**arm, **claim.where}) for s in settings) for arm in arms):
        return False
    if claim.kind == "shrinks" and len({s.get(claim.along) for s in settings}) < 2:
        return False
    return claim.kind != "numa" or summarize.answers_penalty(spec)


def timing_trials(spec: Spec) -> int:
    """Timing trials per config a run of `spec` makes at most: traced ones that come first and
    `auto`'s pilot rounds are not among them."""
    return spec.trials - specmod.first_timing(spec) - len(specmod.pilot_trials(spec))


def decided_by(claim: Claim, specs: list[Spec]) -> list[int]:
    """For each part of `claim` (the claim itself without parts), whether any of `specs` can decide
    it: 1 or 0, in the order of its parts."""
    parts = list(claim.parts) or [claim]
    return [int(any(can_decide(part, s) for s in specs)) for part in parts]


def _selected(frame: pd.DataFrame, selector: Mapping[str, Any]) -> np.ndarray:
    """The rows of `frame` that `selector` picks, as a boolean mask (a plain array: the judge
    selects thousands of times per power simulation, and a Series per step costs more than the
    selection itself)."""
    keep = np.ones(len(frame), dtype=bool)
    for key, wanted in selector.items():
        if key not in frame:
            return np.zeros(len(frame), dtype=bool)
        levels = _levels(wanted)
        keep &= [value in levels for value in frame[key].tolist()]
    return keep


def _values(frame: pd.DataFrame, selector: Mapping[str, Any], metric: str) -> list[float]:
    """The non-missing values of `metric` in the rows `selector` picks."""
    picked = frame[metric].to_numpy()[_selected(frame, selector)].tolist()
    return [value for value in picked if not pd.isna(value)]


def _ratios(claim: Claim, runs: list[Results]) -> Verdict:
    """range, direction, negligible and not_worse: one decision per group of the other factors."""
    groups: list[Evidence] = []
    notes: list[str] = []
    left_out: list[str] = []  # groups whose arm ran out of a resource: outcomes (C17), not data
    read_as: set[str] = set()
    # the factors any run of the experiment varies: groups of two runs (a profile that fixes a
    # factor the other varies) get the same labels, and the better evidence of a group is kept
    factors = list(dict.fromkeys(k for run in runs for k in run.spec.grid))
    for run in runs:
        traced = claim.metric.startswith("trace.")
        source = run.traces if traced else run.trials
        metric, fell_back = _metric_read(claim, run, source)
        if source.empty or metric not in source:
            continue
        if fell_back:
            read_as.add(claim.fallback_label)
            notes.append(fell_back)
        frame = _with_fixed(source, run.spec, claim)
        frame = frame[_selected(frame, claim.where)]
        varied = set(claim.compare) | set(claim.against)
        others = [k for k in factors if k not in varied and k in frame]
        grouped = _in_grid_order(frame.groupby(others, sort=False), others, run.spec) if others \
            else [((), frame)]
        minimum = TRACED_MIN_OK if traced else run.spec.min_ok
        for keys, group in grouped:
            keys = keys if isinstance(keys, tuple) else (keys,)
            a, b = _values(group, claim.against, metric), _values(group, claim.compare, metric)
            label = ", ".join(f"{k}={v}" for k, v in zip(others, keys, strict=True)) or "all"
            where = dict(zip(others, keys, strict=True))
            lost = _attempt_notes(claim, run, where, traced)
            paper = _paper_evidence(claim, {**run.spec.fixed, **where})
            if a and b and _timed_out(claim, run, where, traced):
                groups.append(replace(_group(claim, label, a, b, minimum), decision=CENSORED, **paper))
            elif a and b and (readings := _readings(metric, claim, run, where)):
                groups.append(replace(_group(claim, label, a, b, minimum), decision=READ_APART, **paper))
                notes.append(f"{label}: energy read as {' / '.join(readings)}")
            elif a and b:
                groups.append(replace(_group(claim, label, a, b, minimum), **paper))
                notes += _reading_notes(claim, label, group, a, run.spec)
            elif outcome := _resource_outcome(claim, run, where, traced, (a, b)):
                left_out.append(f"{label} left out: {outcome}")
                continue
            elif (a or b) and lost:  # an arm with no ok trial at all: say so, decide nothing
                groups.append(Evidence(label, n=(len(a), len(b)), decision="too few"))
            notes += lost
    if not groups and left_out:
        return Verdict(claim, "inconclusive", "every group left out: " + "; ".join(left_out))
    if not groups:
        return Verdict(claim, "not run", f"no trials of {claim.experiment} match the comparison")
    return replace(_verdict(claim, groups, left_out + notes), read_as=" / ".join(sorted(read_as)))


def _in_grid_order(groups: Any, keys: list[str], spec: Spec) -> list[tuple[Any, pd.DataFrame]]:
    """Groups in the spec's own order of levels (fp64 before fp32, 1 GPU before 2), not in the
    order the interleaved trials happened to run."""
    def rank(item: tuple[Any, pd.DataFrame]) -> list[int]:
        values = item[0] if isinstance(item[0], tuple) else (item[0],)
        return [level_rank(spec, k, v) for k, v in zip(keys, values, strict=True)]

    return sorted(groups, key=rank)


def _group(claim: Claim, label: str, a: list[float], b: list[float], minimum: int) -> Evidence:
    """One group's evidence and decision; too few ok trials decide nothing."""
    if claim.kind == "not_worse":
        diff = stats.difference_of_means(a, b)
        value, lo, hi, unit = diff.value, diff.ci_lo, diff.ci_hi, " points"
        decision = _decide_margin(claim, diff) if min(len(a), len(b)) >= minimum else "too few"
        scale = 100.0  # accuracy fractions are shown in percentage points
        return Evidence(label, scale * value, scale * lo, scale * hi, unit, n=(len(a), len(b)),
                        decision=decision)
    ratio = stats.ratio_of_means(a, b, cross_check=False)
    decision = _decide(claim, ratio) if min(len(a), len(b)) >= minimum else "too few"
    return replace(_evidence(claim, label, ratio), n=(len(a), len(b)), decision=decision)


def _reading_notes(claim: Claim, label: str, group: pd.DataFrame, against: list[float],
                   spec: Spec) -> list[str]:
    """What a reader must know beside a group's verdict: that the trials were host-bound (a
    speed claim then measures the host more than the GPU; judge.operating_point), or stopped
    short of convergence (an accuracy claim about converged training): epochs capped at
    `max_steps` (kick, first evidence, smoke) whatever the accuracy, or a baseline below it."""
    notes = []
    if claim.metric != "test_accuracy" and "gpu_busy_fraction" in group:
        for arm in (claim.against, claim.compare):
            shares = _values(group, arm, "gpu_busy_fraction")
            if shares and min(shares) < operating_point.GPU_BOUND_AT:
                name = ", ".join(f"{k}={v}" for k, v in arm.items())
                notes.append(f"{label}: judged on host-bound trials ({name}: the GPU computed "
                             f"{min(shares):.0%}-{max(shares):.0%} of a step, below "
                             f"{operating_point.GPU_BOUND_AT:.0%}): the ratio says more of the host "
                             "than of the GPU")
    if claim.converged_at is None or not against:
        return notes
    mean, capped = statistics.fmean(against), int(spec.fixed.get("max_steps", 0) or 0)
    if capped or mean < claim.converged_at:
        why = f"epochs of {capped} steps" if capped \
            else f"below the {claim.converged_at:.0%} the claim is about"
        notes.append(f"{label}: not at convergence ({why}; the baseline's mean {mean:.1%}): read, "
                     "not decisive of converged training")
    return notes


def _arm_attempts(claim: Claim, run: Results, group: Mapping[str, Any], arm: Mapping[str, Any],
                  traced: bool) -> list[dict[str, Any]]:
    """The records of the attempts (not skipped, not interrupted) of one arm of one group."""
    wanted = {**group, **arm, **claim.where}
    return [r for settings, r in run.attempts
            if (r.get("trace", "none") != "none") == traced and matches(settings, wanted)]


def _resource_outcome(claim: Claim, run: Results, group: Mapping[str, Any], traced: bool,
                      values: tuple[list[float], list[float]]) -> str:
    """Why a group is an outcome rather than a comparison: an arm without an ok value whose every
    attempt failed for a resource (out of memory, ...); "" when no arm did."""
    for arm, found in zip((claim.against, claim.compare), values, strict=True):
        attempts = _arm_attempts(claim, run, group, arm, traced)
        if not found and attempts and all(_failure_kind(r) == "resource" for r in attempts):
            label = ", ".join(f"{k}={v}" for k, v in {**arm, **group}.items())
            ending = summarize.attempts_ending(attempts)
            return (f"{label} failed every attempt for a resource ({ending}): an "
                    "outcome, not missing data")
    return ""


def _metric_read(claim: Claim, run: Results, source: pd.DataFrame) -> tuple[str, str]:
    """The metric a run is judged on, and why it is the claim's fallback where it is: the
    claim's metric, or its `fallback_metric` where the run measured none of the first (E2, E3:
    GPU and CPU-package energy, GPU energy alone where the packages could not be read)."""
    metric = claim.metric.removeprefix("trace.")
    if not claim.fallback_metric or (metric in source and source[metric].notna().any()) \
            or claim.fallback_metric not in source:
        return metric, ""
    why = next((r.get("unmeasured", {}).get(metric) for _, r in run.attempts
                if r["status"] == "ok" and r.get("unmeasured", {}).get(metric)), "not measured")
    return claim.fallback_metric, f"{claim.fallback_label}: {metric} not measured ({why})"


def _readings(metric: str, claim: Claim, run: Results, group: Mapping[str, Any]) -> list[str]:
    """For an energy metric, the ways its ok trials in the group's two arms were read, where
    there are several (NVML's counter and power integrated over a short window, say); []
    otherwise."""
    keys = ENERGY_READINGS.get(metric, ())
    if not keys:
        return []
    found = set()
    for arm in (claim.against, claim.compare):
        for r in _arm_attempts(claim, run, group, arm, False):
            how = r.get("measured_how") or {}
            if keys and r["status"] == "ok" and all(how.get(k) for k in keys):  # a null one says nothing
                found.add(" + ".join(str(how[k]) for k in keys))
    return sorted(found) if len(found) > 1 else []


def _timed_out(claim: Claim, run: Results, group: Mapping[str, Any], traced: bool) -> bool:
    """Whether an arm of the group has an attempt that ran past its timeout: a value censored
    at `timeout_s`, which the ok trials' mean would leave out (the slowest, dropped)."""
    return "timeout" in run.statuses and any(
        r["status"] == "timeout" for arm in (claim.against, claim.compare)
        for r in _arm_attempts(claim, run, group, arm, traced))


def _attempt_notes(claim: Claim, run: Results, group: Mapping[str, Any], traced: bool) -> list[str]:
    """"precision=fp64: 2 of 5 attempts timed out" for each arm of a group that lost attempts."""
    notes: list[str] = []
    if run.statuses <= {"ok"}:
        return notes
    for arm in (claim.against, claim.compare):
        statuses = [r["status"] for r in _arm_attempts(claim, run, group, arm, traced)]
        bad = [s for s in statuses if s != "ok"]
        if bad:
            arm_label = ", ".join(f"{k}={v}" for k, v in {**arm, **group}.items())
            causes = ", ".join(f"{n} {summarize.STATUS_WORDS.get(s, s)}" for s, n in sorted(
                {s: bad.count(s) for s in bad}.items()))
            notes.append(f"{arm_label}: {len(bad)} of {len(statuses)} attempts not ok ({causes})")
    return notes


def matches(settings: Mapping[str, Any], selector: Mapping[str, Any]) -> bool:
    return all(settings.get(k) in _levels(v) for k, v in selector.items())


def reads(claim: Claim, experiment: str, config: Mapping[str, Any]) -> bool:
    """Whether `claim` (or one of its parts) reads this config of `experiment`: one of its arms
    matches it, or it is a config of the NUMA test's first question (summarize.reads_numa), or
    the claim has no arms and reads every config."""
    if claim.parts:
        return any(reads(part, experiment, config) for part in claim.parts)
    if claim.experiment != experiment:
        return False
    if claim.kind == "numa":
        return summarize.reads_numa(config)
    arms = [a for a in (claim.compare, claim.against) if a]
    return not arms or any(matches(config, {**arm, **claim.where}) for arm in arms)


def _verdict(claim: Claim, groups: list[Evidence], notes: list[str]) -> Verdict:
    groups = _best_per_label(groups)
    decisions = ["inconclusive" if g.decision in UNDECIDED else g.decision for g in groups]
    verdict = _across(decisions)
    why = _why(groups, verdict)
    if notes:
        why += "; " + "; ".join(notes)
    return Verdict(claim, verdict, why, tuple(groups), sum(g.decision not in UNDECIDED for g in groups))


def _best_per_label(groups: list[Evidence]) -> list[Evidence]:
    """One group per label: where several runs of an experiment hold the same group (a traced
    profile's timing trials beside the paper run's), the one with the most trials per arm."""
    best: dict[str, Evidence] = {}
    for g in groups:
        if g.label not in best or min(g.n) > min(best[g.label].n):
            best[g.label] = g
    return list(best.values())


def _with_fixed(trials: pd.DataFrame, spec: Spec, claim: Claim | None = None) -> pd.DataFrame:
    """Trial rows with the spec's fixed settings as columns too (selectors may name them): the
    ones the claim's selectors name, or every one without a claim."""
    names = None if claim is None else set(claim.compare) | set(claim.against) | set(claim.where)
    added = {k: v for k, v in spec.fixed.items() if k not in trials and (names is None or k in names)}
    return trials.assign(**added) if added else trials.copy()


def _quantity(claim: Claim, ratio: float) -> float:
    if claim.quantity == "gain_pct":
        return 100 * stats.gain(ratio)
    if claim.quantity == "time_reduction_pct":
        return 100 * stats.time_reduction(ratio)
    return ratio


def _decide(claim: Claim, ratio: stats.Ratio) -> str:
    if math.isnan(ratio.ci_lo) or ratio.ci_lo <= 0:
        return "inconclusive"
    lo, hi, point = math.log(ratio.ci_lo), math.log(ratio.ci_hi), math.log(ratio.value)
    if claim.kind == "range":
        return _inside(lo, hi, point, *span_band(claim))
    if claim.kind == "direction":
        return _one_sided(lo, hi, claim.side, tolerance_of(claim))
    return _inside(ratio.ci_lo, ratio.ci_hi, ratio.value,
                   1 - tolerance_of(claim), 1 + tolerance_of(claim))  # negligible


def tolerance_of(claim: Claim) -> float:
    assert claim.tolerance is not None, f"{claim.id}: loaded without its tolerance"
    return claim.tolerance


def as_log_ratio(quantity: str, value: float) -> float:
    """The paper's number (a gain or a time reduction in %, or a ratio) as the log of the ratio
    mean(against) / mean(compare)."""
    if quantity == "gain_pct":
        return math.log1p(value / 100)
    if quantity == "time_reduction_pct":
        return -math.log1p(-value / 100)
    return math.log(value)


def from_log_ratio(quantity: str, effect: float) -> float:
    """as_log_ratio's inverse: the log of a ratio as the claim's quantity."""
    return _quantity(Claim("", "", "", "range", quantity=quantity), math.exp(effect))


def inside_band(claim: Claim, effect: float) -> bool:
    """Whether a true effect (the log of the ratio; for not_worse, the loss in the metric's units)
    is one the claim says, inside its tolerant band: what the paper's own values are checked by."""
    tol = tolerance_of(claim)
    if claim.kind == "range":
        low, high = span_band(claim)
        return low <= effect <= high
    if claim.kind == "negligible":
        return 1 - tol <= math.exp(effect) <= 1 + tol
    if claim.kind == "not_worse":
        return effect <= tol
    if claim.kind == "direction":
        return effect > 0 if claim.side == "above" else effect < 0
    return True


def span_band(claim: Claim) -> tuple[float, float]:
    """The paper's span as log ratios, widened by the tolerance as a share of the effect: the end
    nearer no effect moves towards it by that share, the farther end away from it (a span that
    holds no effect widens at both ends)."""
    assert claim.range is not None
    low, high = sorted(as_log_ratio(claim.quantity, v) for v in claim.range)
    share = tolerance_of(claim)
    if low >= 0:
        return low * (1 - share), high * (1 + share)
    if high <= 0:
        return low * (1 + share), high * (1 - share)
    return low * (1 + share), high * (1 + share)


def _one_sided(lo: float, hi: float, side: str, minimum: float) -> str:
    """An interval of a log ratio against a claimed side: contradicted when it lies wholly short of
    log(1 + minimum) on that side (no effect of the size that matters, or one the other way, even
    where an effect too small to matter is shown), else supported when it lies wholly on that side
    of 0, else inconclusive. The two readings never hold at once."""
    if side == "below":
        lo, hi = -hi, -lo
    if hi < math.log1p(minimum):
        return "contradicted"
    if lo > 0:
        return "supported"
    return "inconclusive"


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
    """One verdict from the groups': supported only when every group is; contradicted when a
    group is and none supports it, mixed when groups decide both ways (judge then reads those
    at the level the groups share: _at_shared_level)."""
    found = set(decisions)
    if not found:
        return "not run"
    if "invalid" in found:
        return "invalid"
    if found == {"supported"}:
        return "supported"
    if "contradicted" in found:
        return "mixed" if "supported" in found else "contradicted"
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
        named = len(by) > 1 or verdict in ("mixed", "inconclusive", CONSISTENT) or decision in UNDECIDED
        if decision == CENSORED:
            parts.append(f"{len(labels)} censored by a timed-out attempt, undecided "
                         f"({', '.join(labels)})")
        elif decision == READ_APART:
            parts.append(f"{len(labels)} not compared, its arms' energy read differently "
                         f"({', '.join(labels)})")
        elif decision == "too few":
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
                    READINGS[claim.quantity], n=(ratio.n_baseline, ratio.n_other))


def _outcome(claim: Claim, runs: list[Results]) -> Verdict:
    """Each named config ran (an ok attempt) or failed for a resource; anything else is a harness
    error (invalid), and attempts that only timed out cannot tell slow from failing."""
    by_config: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        for record in run.records:
            if record.get("experiment") == run.spec.name and record.get("status") not in (
                    "interrupted", "skipped") and record.get("trace", "none") == "none" \
                    and matches({**run.spec.fixed, **record["config"]}, claim.compare):
                label = ", ".join(f"{k}={v}" for k, v in record["config"].items())
                by_config.setdefault(label, []).append(record)
    if not by_config:
        return Verdict(claim, "not run", "no attempted trial of the configs the claim names")
    groups = [_outcome_group(claim, config, records) for config, records in by_config.items()]
    notes = [f"{config}: {summarize.attempts_ending(records)}" for config, records in by_config.items()]
    # no interval to widen: how attempts ended is read as it is, whatever the level
    return replace(_verdict(claim, groups, notes), groups=0)


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
    """The ratio at the fewest against the most of `along` (GPUs), by one Welch interval of the
    change of its log (stats.log_ratio_change), read as `direction` reads a ratio: contradicted
    when it lies wholly short of the tolerance, else supported when it is above 0."""
    groups: list[Evidence] = []
    decisions: list[str] = []
    for run in runs:
        if claim.along not in run.spec.grid or len(run.spec.grid[claim.along]) < 2:
            continue
        ends = sorted(run.spec.grid[claim.along])
        arms = [_arms_at(claim, run, {**claim.where, claim.along: value}) for value in (ends[0], ends[-1])]
        if not all(a and b for a, b in arms):
            continue
        change = stats.log_ratio_change(*arms)
        enough = min(len(x) for pair in arms for x in pair) >= run.spec.min_ok
        if not enough:
            decision = "too few"
        elif any(_timed_out(claim, run, {claim.along: v}, False) for v in (ends[0], ends[-1])):
            decision = CENSORED
        elif math.isnan(change.ci_lo):
            decision = "inconclusive"
        else:
            decision = _one_sided(change.ci_lo, change.ci_hi, "above", tolerance_of(claim))
        decisions.append(decision)
        for value, (a, b) in zip((ends[0], ends[-1]), arms, strict=True):
            ratio = stats.ratio_of_means(a, b, cross_check=False)
            groups.append(replace(_evidence(claim, f"{claim.along}={value}", ratio), decision=decision))
        groups.append(Evidence(f"change of the log ratio, {claim.along}={ends[0]} -> {ends[-1]}",
                               change.value, change.ci_lo, change.ci_hi, "", "log ratio",
                               n=(change.n_a, change.n_b), decision=decision))
    if not groups:
        return Verdict(claim, "not run", f"no run of {claim.experiment} varies {claim.along}")
    verdict = _across(["inconclusive" if d in UNDECIDED else d for d in decisions])
    changes = [g for g in groups if g.reading == "log ratio"]
    return Verdict(claim, verdict, _why(changes, verdict), tuple(groups),
                   sum(d not in UNDECIDED for d in decisions))


def _arms_at(claim: Claim, run: Results, where: dict[str, Any]) -> tuple[list[float], list[float]]:
    """The ok values of `against` and of `compare` under `where`."""
    frame = _with_fixed(run.trials, run.spec, claim)
    frame = frame[_selected(frame, where)]
    return (frame.loc[_selected(frame, claim.against), claim.metric].dropna().tolist(),
            frame.loc[_selected(frame, claim.compare), claim.metric].dropna().tolist())


def _dominates(claim: Claim, runs: list[Results]) -> Verdict:
    """Per traced config, the summed numerator metrics against the summed denominator ones. A
    trace whose metrics are unknown (None: the breakdown could not tell the GPU's waits apart)
    is left out, never read as zero; a config whose denominator is zero in every trace (no copy
    ever stalled the GPU) is dominated outright where its numerator is not."""
    groups: list[Evidence] = []
    notes: list[str] = []
    names = list(claim.numerator + claim.denominator)
    for run in runs:
        frame = run.traces
        if frame.empty or not set(names) <= set(frame):
            continue
        frame = frame[_selected(_with_fixed(frame, run.spec, claim), claim.where)]
        for cid, group in frame.groupby("config_id", sort=False):
            known = group[group[names].notna().all(axis=1)]
            if len(known) < len(group):
                notes.append(f"{cid}: {len(group) - len(known)} of {len(group)} trace(s) without "
                             f"{' / '.join(names)} (left out, not read as 0)")
            groups.append(_dominance(claim, str(cid), known[list(claim.numerator)].sum(axis=1).tolist(),
                                     known[list(claim.denominator)].sum(axis=1).tolist()))
    if not groups:
        return Verdict(claim, "not run", f"no traced trials of {claim.experiment} (--trace torch|nsys)")
    return _verdict(claim, groups, notes)


def _dominance(claim: Claim, label: str, numerator: list[float], denominator: list[float]) -> Evidence:
    n = (len(numerator), len(denominator))
    if len(numerator) < TRACED_MIN_OK:
        return Evidence(label, n=n, decision="too few")
    if not any(denominator):
        if not any(numerator):
            return Evidence(label, n=n, decision="too few")
        return Evidence(label, math.inf, math.inf, math.inf, n=n, reading=READINGS["ratio"],
                        decision="supported")
    ratio = stats.ratio_of_means(numerator, denominator, cross_check=False)
    return replace(_evidence(claim, label, ratio), decision=_decide(replace(claim, kind="direction",
                                                                            side="above"), ratio))


def _numa(claim: Claim, runs: list[Results]) -> Verdict:
    """summarize's NUMA test (its first question: does `local` remove the DataLoader's 3-4 GPU
    penalty?) on each run that can answer it (both loaders under none and local: not the
    controls): supported only where binding is compared with no binding and lowers the penalty
    (summarize.removes_penalty), so a small penalty binding leaves as it is, within the
    tolerance either way, is not read as removed. The test reads its groups at the level they
    share and names the configs that cannot decide (too few ok trials, none, a timed-out
    attempt). Several runs that answer share the level the same way (`groups`)."""
    answering = [r for r in runs if summarize.answers_penalty(r.spec)]
    answers = [summarize.penalty_finding(r.spec, r.trials, tolerance_of(claim), r.records,
                                         with_evidence=False) for r in answering]
    said = [(f.answer, f.why) for f in answers if f.answer != "not run"]
    if not said:
        return Verdict(claim, "not run", "no 3-4 GPU trials of both loaders under both none and local")
    mapping = {"yes": "supported", "no": "contradicted", "mixed": "mixed"}
    decisions = [mapping.get(a, "inconclusive") for a, _ in said]
    return Verdict(claim, _across(decisions),
                   "NUMA test answer(s): " + "; ".join(f"{a} ({why})" for a, why in said),
                   groups=len(said))


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
