"""Trials until the answer is clear (`[trials].count = "auto[:PILOT..MAX]"`, `--trials auto`).

Stein's two-stage rule. The runner runs PILOT rounds of interleaved trials (round t = trial t of
every config); after them, `decide` reads the pilot's variances and fixes how many rounds follow:
for each comparison a claim makes on this experiment (its `against` and `compare` configs within
each group of the other factors, on the claim's metric; without a claim, each config against its
baseline, or its own mean), the fewest rounds n at which a Welch interval of that comparison
would have a half-width of log(1 + half_width) on the log scale (a ratio within about +-2 %), or
the claim's tolerance in the metric's units (`not_worse`, a difference):
t(0.975, k (n - 1)) * sqrt(sum of the arms' variances / n) <= target. The run takes the most of
these, at least the verdict minimum and at most MAX - PILOT, and stops there.

The pilot's rounds set the count and no statistic reads them (spec.pilot_trials). A count chosen
from a variance is, for normal log-times, independent of the judged rounds, so the judged
intervals keep their fixed-n coverage and false support; judging the pilot too would bias them
(a pilot whose variance happened to be small stops early with that small variance in the
interval, and with it too narrow). tests/unit/judge/test_adaptive.py simulates the rule.
The rule reads only the pilot's records, so a resumed run takes the same decision.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

from multicard.judge import claims as claimsmod
from multicard.plan import spec as specmod
from multicard.plan.spec import Auto, Spec

ASSUMED_CV = 0.03
RATIO_KINDS = ("range", "direction", "negligible", "shrinks")  # judged on the log of a ratio


@dataclass(frozen=True)
class Aim:
    """One comparison the count is chosen for: `compare` against `against` (None: the interval
    of `compare`'s own mean), on `metric`, with the half-width it aims at."""

    label: str
    against: str | None
    compare: str
    metric: str
    log: bool  # variances of log values (a ratio) or of the values (a difference)
    target: float  # half-width: on the log scale, or in the metric's units


@dataclass(frozen=True)
class Decision:
    stop: bool
    rounds: int  # complete rounds of timing trials so far, the pilot's included
    reason: str
    needed: dict[str, int]  # aim label -> rounds after the pilot it needs


def aims(spec: Spec, claim_list: Iterable[claimsmod.Claim]) -> list[Aim]:
    """The comparisons the claims make on this experiment's configs; without any, each config
    against its baseline (or its own mean)."""
    found = [aim for claim in claim_list for part in _leaves(claim)
             for aim in _claim_aims(spec, part)]
    return found or _baseline_aims(spec)


def _leaves(claim: claimsmod.Claim) -> list[claimsmod.Claim]:
    return [leaf for part in claim.parts for leaf in _leaves(part)] if claim.parts else [claim]


def _claim_aims(spec: Spec, claim: claimsmod.Claim) -> list[Aim]:
    ratio = claim.kind in RATIO_KINDS
    if claim.experiment != spec.name or claim.metric not in spec.metrics \
            or not (ratio or claim.kind == "not_worse"):
        return []  # trace metrics are read from traced trials, which `auto` does not count
    target = math.log1p(spec.half_width) if ratio else claimsmod.tolerance_of(claim)
    ids = {tuple(sorted(settings.items())): cid for cid, _, settings in specmod.configs(spec)}
    found = []
    for cid, _, settings in specmod.configs(spec):
        if not claimsmod.matches(settings, {**claim.against, **claim.where}):
            continue
        partner = ids.get(tuple(sorted({**settings, **claim.compare}.items())))
        if partner is not None and partner != cid:
            found.append(Aim(f"{claim.id}: {partner} vs {cid}", cid, partner, claim.metric,
                             ratio, target))
    return found


def _baseline_aims(spec: Spec) -> list[Aim]:
    ids = {tuple(sorted(config.items())): cid for cid, config, _ in specmod.configs(spec)}
    target = math.log1p(spec.half_width)
    found = []
    for cid, config, _ in specmod.configs(spec):
        base_config = specmod.baseline_config(spec, config)
        base = None if base_config is None else ids.get(tuple(sorted(base_config.items())))
        against = None if base == cid else base
        label = f"{cid} vs {against}" if against else f"{cid} (its mean)"
        found.append(Aim(label, against, cid, spec.primary, True, target))
    return found


def rounds_needed(variances: tuple[float, ...], target: float, low: int, high: int) -> int:
    """The fewest rounds n in [low, high] at which t(0.975, k(n-1)) * sqrt(sum(variances) / n)
    <= target, k = len(variances) arms; `high` when none (or a variance is unknown)."""
    total = sum(variances)
    if math.isnan(total):
        return high
    for n in range(max(2, low), high + 1):
        if _t975(len(variances) * (n - 1)) * math.sqrt(total / n) <= target:
            return n
    return high


@functools.cache
def _t975(df: int) -> float:
    return float(sps.t.ppf(0.975, df))


def pilot_values(spec: Spec, records: Iterable[dict[str, Any]], metric: str,
                 log: bool) -> dict[str, np.ndarray]:
    """config_id -> the metric's values in the ok untraced pilot trials (logs for a ratio)."""
    pilot = specmod.pilot_trials(spec)
    found: dict[str, list[float]] = {}
    for r in records:
        value = (r.get("metrics") or {}).get(metric)
        if r.get("experiment") == spec.name and r.get("status") == "ok" \
                and r.get("trace", "none") == "none" and r.get("trial") in pilot \
                and isinstance(value, int | float) and (value > 0 or not log):
            found.setdefault(r["config_id"], []).append(math.log(value) if log else float(value))
    return {cid: np.asarray(values) for cid, values in found.items()}


def _variance(values: np.ndarray | None) -> float:
    return float(np.var(values, ddof=1)) if values is not None and len(values) >= 2 else math.nan


def decide(spec: Spec, auto: Auto, records: list[dict[str, Any]], rounds_done: int,
           skipped: set[str], aimed: list[Aim]) -> Decision:
    """Whether to start another round. An aim with a config in `skipped` (it cannot run here),
    or with a config that had no ok pilot trial (it keeps failing), does not hold the run open;
    one with a single ok pilot trial has no variance and asks for the most rounds."""
    if rounds_done < auto.pilot_rounds:
        return Decision(False, rounds_done, f"pilot: {rounds_done} of {auto.pilot_rounds} rounds", {})
    pilot = specmod.pilot_trials(spec)
    ok = {r["config_id"] for r in records if r.get("status") == "ok"
          and r.get("trace", "none") == "none" and r.get("trial") in pilot}
    low, high = auto.min_judged, auto.max_rounds - auto.pilot_rounds
    values: dict[tuple[str, bool], dict[str, np.ndarray]] = {}  # one pass per metric and scale
    needed: dict[str, int] = {}
    left_out = 0
    for aim in aimed:
        arms = [cid for cid in (aim.against, aim.compare) if cid is not None]
        if any(cid in skipped for cid in arms):
            continue
        if any(cid not in ok for cid in arms):
            left_out += 1
            continue
        key = (aim.metric, aim.log)
        if key not in values:
            values[key] = pilot_values(spec, records, aim.metric, aim.log)
        variances = tuple(_variance(values[key].get(cid)) for cid in arms)
        needed[aim.label] = rounds_needed(variances, aim.target, low, high)
    return _decision(auto, rounds_done, needed, left_out)


def _decision(auto: Auto, rounds_done: int, needed: dict[str, int], left_out: int) -> Decision:
    pilot = auto.pilot_rounds
    if not needed:
        return Decision(True, rounds_done, f"no comparison has ok pilot trials after {pilot} "
                        "rounds", needed)
    worst = max(needed, key=lambda label: needed[label])
    total = pilot + needed[worst]
    aside = f"; {left_out} comparison(s) with a config that had no ok pilot trial left out" \
        if left_out else ""
    why = (f"the {pilot} pilot rounds' variances ask for {needed[worst]} judged rounds ({worst}"
           f"{', the most allowed' if total == auto.max_rounds else ''}): {total} in all{aside}")
    return Decision(rounds_done >= total, rounds_done, why, needed)


def expected_rounds(auto: Auto, cv: float = ASSUMED_CV) -> int:
    """Rounds in all (the pilot's included) that a ratio of two arms with relative noise `cv`
    needs for a half-width within the target."""
    variance = math.log1p(cv * cv)
    judged = rounds_needed((variance, variance), math.log1p(auto.half_width), auto.min_judged,
                           auto.max_rounds - auto.pilot_rounds)
    return auto.pilot_rounds + judged
