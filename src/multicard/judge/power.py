"""What the verdict rules say in worlds we can state: every claim judged, by claims.judge itself,
on trials drawn at random from a world where the paper is right (at its value, at each end of its
span), where there is no effect, and where the effect is half the paper's.

A world sets, for each part of a claim, the effect of its comparison: the log of the ratio
mean(against) / mean(compare) in each group (or, for `not_worse`, the loss in the metric's units;
for `numa`, the DataLoader's penalty without binding and under it; for `outcome`, whether the
named configs fail for a resource). Every other config of the experiment has no effect. Trials
are log-normal with the stated CV (times and rates: their noise is multiplicative), accuracy is
normal in points; each arm gets `trials` ok trials, drawn independently. The outcomes the paper
states of an experiment (C17: QAT out of memory on 1-3 GPUs) hold in every world of another claim
that reads it, as they do on the paper's node.

Claims on trace metrics (C4, C18) are not simulated: their noise is that of a profiler's counts,
which no CV here describes. The fractions are estimates from `runs` draws, seeded.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from multicard.errors import InputError
from multicard.judge import claims
from multicard.judge.summarize import PENALTY_GPUS
from multicard.plan import spec
from multicard.plan.params import PROPORTION_METRICS

# the paper right; no effect (for a claim of no difference: a large one); half the paper's effect
# (claims with a number only); "other" worlds are shown, not held to a rule
ROLES = ("paper", "none", "half")
TIME_BASE = 10.0  # any positive mean: ratios do not depend on it
ACCURACY_BASE = 0.99  # MNIST test accuracy of a 20-epoch MobileNetV2
ACCURACY_SD_PER_CV = 0.1  # accuracy's spread in points per 1 % of CV (2 % CV: 0.2 points)
TRIAL_LADDER = (3, 5, 8, 10, 15, 20, 30)


@dataclass(frozen=True)
class Part:
    """What a world says of one part of a claim. `effect` is a log ratio per group (index, count)."""
    effect: Callable[[int, int], float] = lambda g, n: 0.0
    loss: float = 0.0  # not_worse: mean(against) - mean(compare), in the metric's units
    penalty: tuple[float, float] = (0.0, 0.0)  # numa: log penalty without binding, under local
    fails: bool = False  # outcome: the named configs fail for a resource
    # the paper's own values where it gives them: (the group's settings, its log ratio or, for
    # not_worse, its loss); they take the place of `effect` / `loss` in those groups
    values: tuple[tuple[dict[str, Any], float], ...] = ()


@dataclass(frozen=True)
class World:
    role: str  # one of ROLES, or "other"
    name: str
    parts: tuple[Part, ...]


@dataclass(frozen=True)
class Characteristic:
    claim: str
    world: str
    role: str
    trials: int
    cv: float
    runs: int
    shares: dict[str, float] = field(default_factory=dict)  # verdict -> fraction of runs


def constant(value: float) -> Callable[[int, int], float]:
    return lambda g, n: value


def end_to_end(first: float, last: float) -> Callable[[int, int], float]:
    """Groups spread evenly from `first` (the first group) to `last`."""
    return lambda g, n: first + (last - first) * (g / (n - 1) if n > 1 else 0.0)


def _signed(part: claims.Claim, effect: float) -> float:
    return -effect if part.side == "below" else effect


def part_worlds(part: claims.Claim) -> list[tuple[str, str, Part]]:
    """(role, name, what the world says) for one simple claim, by its kind; where the paper gives
    per-group values (claims.paper_values), a world at those values too (values_world)."""
    found = _kind_worlds(part)
    at_values = values_world(part, found)
    if at_values is not None:
        first_other = next((i for i, (role, _, _) in enumerate(found) if role != "paper"), len(found))
        found.insert(first_other, at_values)
    return found


def _kind_worlds(part: claims.Claim) -> list[tuple[str, str, Part]]:
    tol = part.tolerance or 0.0
    if part.kind == "range":
        low, high = sorted(claims.as_log_ratio(part.quantity, v) for v in part.range or (1, 1))
        return [("paper", "paper right: its span's low end", Part(constant(low))),
                ("paper", "paper right: its span's high end", Part(constant(high))),
                ("paper", "paper right: its span end to end", Part(end_to_end(high, low))),
                ("none", "no effect", Part()), ("half", "half its span's low end", Part(constant(low / 2)))]
    if part.kind == "direction":  # qualitative: any effect its way is the claim; sizes assumed
        assumed = 2 * math.log1p(tol)
        return [("paper", f"an effect of {math.expm1(assumed):.0%} its way (the paper gives no number)",
                 Part(constant(_signed(part, assumed)))), ("none", "no effect", Part()),
                ("other", f"an effect of {math.expm1(assumed / 2):.0%} its way",
                 Part(constant(_signed(part, assumed / 2))))]
    if part.kind == "negligible":  # the paper right is no effect; the wrong world, a large one
        return [("paper", "no effect", Part()),
                ("other", f"an effect of half the tolerance ({tol / 2:.0%})",
                 Part(constant(math.log1p(tol / 2)))),
                ("none", f"an effect of twice the tolerance ({2 * tol:.0%})",
                 Part(constant(math.log1p(2 * tol))))]
    if part.kind == "not_worse":
        return [("paper", "no loss", Part()), ("other", "half the margin lost", Part(loss=tol / 2)),
                ("none", "twice the margin lost", Part(loss=2 * tol))]
    if part.kind == "shrinks":  # a trend: half the change is still the trend
        low, high = sorted(claims.as_log_ratio(part.quantity, v) for v in part.range or (1, 1))
        middle = (low + high) / 2
        return [("paper", "paper right: its span's high end at the fewest GPUs, its low end at the most",
                 Part(end_to_end(high, low))), ("none", "no change", Part(constant(middle))),
                ("other", "half the change",
                 Part(end_to_end(middle + (high - low) / 4, middle - (high - low) / 4)))]
    if part.kind == "numa":  # the paper names no size of penalty
        return _numa_worlds()
    if part.kind == "outcome":
        says_fails = part.outcome == "fails"
        return [("paper", "paper right", Part(fails=says_fails)),
                ("none", "every config runs", Part(fails=False))]
    return []


def _numa_worlds() -> list[tuple[str, str, Part]]:
    """The DataLoader's penalty (log T_torch / T_dali at 3-4 GPUs) without binding and under it.
    A small penalty that binding leaves as it is lies inside the removal tolerance: those worlds
    (3 %, 5 %) are the ones only a comparison of binding with no binding tells from removal."""
    three, five, fifteen = math.log(1.03), math.log(1.05), math.log(1.15)
    return [("paper", "binding removes a 15 % penalty", Part(penalty=(fifteen, 0.0))),
            ("paper", "binding removes a 5 % penalty", Part(penalty=(five, 0.0))),
            ("half", "binding leaves 5 % of a 15 % penalty", Part(penalty=(fifteen, five))),
            ("none", "a 15 % penalty binding does not change", Part(penalty=(fifteen, fifteen))),
            ("other", "binding changes nothing: a 3 % penalty with and without it",
             Part(penalty=(three, three))),
            ("other", "binding changes nothing: a 5 % penalty with and without it",
             Part(penalty=(five, five))),
            ("other", "no penalty", Part())]


def values_world(part: claims.Claim,
                 kind_worlds: list[tuple[str, str, Part]]) -> tuple[str, str, Part] | None:
    """The paper at its own per-group values (Table 5's four, C3's two accuracies), the groups it
    gives none for at its first paper-right world; role `paper` where every value lies inside
    the claim's band, `other` where one does not (C3: the paper's own 1.26-point loss). None
    without values, and for a trend, whose paper-right world is already its ends."""
    first = next((p for role, _, p in kind_worlds if role == "paper"), None)
    if not part.values or first is None or part.kind == "shrinks":
        return None
    unit = " points" if part.kind == "not_worse" else ("x" if part.quantity == "ratio" else " %")
    scale = 100 if part.kind == "not_worse" else 1
    shown = ", ".join(f"{_label(v.group)}: {scale * v.value:g}{unit}" for v in part.values)
    if part.kind == "not_worse":
        entries = tuple((v.group, v.value) for v in part.values)
    else:
        entries = tuple((v.group, claims.as_log_ratio(part.quantity, v.value)) for v in part.values)
    holds = all(claims.inside_band(part, effect) for _, effect in entries)
    name = f"the paper's own values ({shown})" + ("" if holds else ": outside its own claim")
    return ("paper" if holds else "other"), name, replace(first, values=entries)


def _label(group: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in group.items()) or "every group"


def worlds(claim: claims.Claim) -> list[World]:
    """A claim's worlds: its own kind's, or for `all` the paper right, no effect and half the
    effect in every part at once (a part without a half world keeps its paper-right one; no half
    world where no part has one), and where a part has several paper-right worlds (a span's ends,
    C10's 5 % penalty), one more each, the other parts at their first."""
    if not claim.parts:
        return [World(role, name, (part,)) for role, name, part in part_worlds(claim)]
    if any(part.kind == "numa" for part in claim.parts):
        return _penalty_worlds(claim)
    options = [part_worlds(part) for part in claim.parts]
    found = []
    for role in ROLES:
        if role == "half" and not any(r == "half" for o in options for r, _, _ in o):
            continue  # no part has a number to halve (C11, C16, C17)
        chosen = []
        for part_options in options:
            # a part without a world of this role keeps the paper's (an outcome has no half)
            pick = next((p for r, _, p in part_options if r == role), None) or next(
                (p for r, _, p in part_options if r == "paper"), None)
            if pick is None:
                return []
            chosen.append(pick)
        name = {"paper": "paper right in every part", "none": "no effect in any part",
                "half": "half the effect in every part"}[role]
        found.append(World(role, name, tuple(chosen)))
        if role == "paper":
            found += _paper_variants(tuple(chosen), options)
    return found


def _penalty_worlds(claim: claims.Claim) -> list[World]:
    """A claim of the DataLoader's 3-4 GPU penalty (C10): one penalty that every part reads, so
    each world of its numa part sets the penalty without binding in every direction part too
    (NHWC keeps it, as the claim says: the ratio its arms compare is that penalty); any other
    part stays at its first paper-right world. Drawn apart, a part could hold a penalty the
    numa part's world does not have."""
    [numa] = [part for part in claim.parts if part.kind == "numa"]
    found = []
    for role, name, says in part_worlds(numa):
        parts = tuple(says if part is numa else _with_penalty(part, says.penalty[0]) for part in claim.parts)
        found.append(World(role, f"{name} (the same penalty in every part)", parts))
    return found


def _with_penalty(part: claims.Claim, penalty: float) -> Part:
    if part.kind == "direction":
        return Part(constant(_signed(part, penalty)))
    return next(p for role, _, p in part_worlds(part) if role == "paper")


def _paper_variants(first: tuple[Part, ...], options: list[list[tuple[str, str, Part]]]) -> list[World]:
    """One world per further paper-right world of a part, the other parts at their first."""
    variants = []
    for i, part_options in enumerate(options):
        for _, name, part in [o for o in part_options if o[0] == "paper"][1:]:
            parts = (*first[:i], part, *first[i + 1:])
            variants.append(World("paper", f"paper right in every part; part {i + 1}: {name}", parts))
    return variants


def simulable(claim: claims.Claim) -> bool:
    parts = claim.parts or (claim,)
    return all(p.kind in ("range", "direction", "negligible", "not_worse", "shrinks", "numa", "outcome")
               and not p.metric.startswith("trace.") for p in parts)


# --- drawing trials --------------------------------------------------------------------------

def _parts(claim: claims.Claim) -> tuple[claims.Claim, ...]:
    return claim.parts or (claim,)


def _groups(part: claims.Claim, grid: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """The part's groups: every combination of the factors its arms do not vary, in grid order."""
    varied = set(part.compare) | set(part.against)
    others = [k for k in grid if k not in varied]
    levels = [[v for v in grid[k] if claims.matches({k: v}, {k: part.where[k]} if k in part.where else {})]
              for k in others]
    return [dict(zip(others, combo, strict=True)) for combo in itertools.product(*levels)]


def _log_mean(config: dict[str, Any], metric: str, parts: list[tuple[claims.Claim, Part]],
              grid: Mapping[str, list[Any]]) -> float:
    """The log of a config's mean under the world: each part's effect where the config is its
    compare arm (in the part's group), the numa penalty on the DataLoader."""
    total = 0.0
    for part, says in parts:
        if part.kind == "numa" and metric == "train_time_s":
            if config.get("loader") == "torch" and config.get("gpus") in PENALTY_GPUS:
                total += says.penalty[1] if config.get("numa_policy") == "local" else says.penalty[0]
            continue
        if part.metric != metric or not claims.matches(config, {**part.compare, **part.where}):
            continue
        given = next((v for group, v in says.values if claims.matches(config, group)), None)
        if part.kind == "not_worse":
            total -= says.loss if given is None else given  # in points, on the metric's own scale
            continue
        groups = _groups(part, grid)
        key = {k: config[k] for k in groups[0]} if groups else {}
        index = groups.index(key) if key in groups else 0
        total -= says.effect(index, len(groups)) if given is None else given
    return total


def _draw(metric: str, shift: float, cv: float, n: int, rng: np.random.Generator) -> np.ndarray:
    if metric in PROPORTION_METRICS:  # accuracy: normal in points, shifted by the loss
        values = ACCURACY_BASE + shift + rng.normal(0.0, ACCURACY_SD_PER_CV * cv, n)
        return np.clip(values, 0.0, 1.0)
    sigma = math.sqrt(math.log1p(cv**2))
    return TIME_BASE * np.exp(shift + rng.normal(0.0, sigma, n))


def draw_results(claim: claims.Claim, world: World, facts: list[claims.Claim], profile: str,
                 experiments: Path, trials: int, cv: float, rng: np.random.Generator,
                 verdict_minimum: int | None = None,
                 counts: Mapping[str, int] | None = None) -> dict[str, list[claims.Results]]:
    """One run of every experiment the claim reads, drawn from the world: `trials` attempts per
    config it reads (`counts[experiment]` where given: each experiment at its own plan's count),
    each ok with the metrics its parts read, or out of memory where an outcome (the world's, or
    one of `facts`) says the config fails; `verdict_minimum` in place of the profile's min_ok (a
    budget that lowered it)."""
    pairs = list(zip(_parts(claim), world.parts, strict=True))
    out: dict[str, list[claims.Results]] = {}
    for name in dict.fromkeys(p.experiment for p, _ in pairs):
        base = _spec(experiments / f"{name}.toml", profile)
        mine = [(p, says) for p, says in pairs if p.experiment == name]
        fails = [p.compare for p, says in mine if p.kind == "outcome" and says.fails]
        fails += [f.compare for f in facts if f.experiment == name and f.outcome == "fails"]
        grid = _read_grid(base, [p for p, _ in mine])
        run = replace(base, grid=grid, min_ok=verdict_minimum or base.min_ok)
        n = (counts or {}).get(name, trials)
        # the NUMA test reads the pauses too (its evidence), drawn like times
        numa = {"train_time_s", "first_batch_latency_s"} if any(p.kind == "numa" for p, _ in mine) else set()
        metrics = sorted({p.metric for p, _ in mine if p.metric} | numa)
        rows, records = [], []
        for cid, config, _ in spec.configs(run):
            # a claim may name a setting the profile fixes (C11's 500 px, 2 GPUs): matched as
            # the judge matches it, on the fixed settings and the config together
            settings = {**run.fixed, **config}
            failed = any(claims.matches(settings, sel) for sel in fails)
            base_record = {"experiment": name, "config": config, "config_id": cid, "trace": "none"}
            if failed:
                records += [{**base_record, "trial": t, "status": "oom", "metrics": {},
                             "error": {"type": "OutOfMemoryError"}} for t in range(n)]
                continue
            values = {m: _draw(m, _log_mean(settings, m, mine, grid), cv, n, rng) for m in metrics}
            for t in range(n):
                drawn = {m: float(values[m][t]) for m in metrics}
                rows.append({**config, "config_id": cid, "trial": t, **drawn})
                records.append({**base_record, "trial": t, "status": "ok", "metrics": {}, "error": None})
        frame = pd.DataFrame(rows, columns=[*grid, "config_id", "trial", *metrics])
        out[name] = [claims.Results(run, frame, pd.DataFrame(), records)]
    return out


@functools.lru_cache(maxsize=32)
def _spec(path: Path, profile: str) -> spec.Spec:
    return spec.load(path, profile)


def _read_grid(base: spec.Spec, parts: list[claims.Claim]) -> dict[str, list[Any]]:
    """The grid cut to the levels the parts read: a numa part reads the penalty's configs only."""
    grid = {k: list(v) for k, v in base.grid.items()}
    if any(p.kind == "numa" for p in parts):
        narrowed = {"numa_policy": ["none", "local"], "gpus": list(PENALTY_GPUS)}
        return {k: [v for v in grid[k] if v in narrowed.get(k, grid[k])] for k in grid}
    for key in grid:
        wanted = set()
        for part in parts:
            for selector in (part.compare, part.against, part.where):
                if key in selector:
                    wanted |= set(selector[key] if isinstance(selector[key], list) else [selector[key]])
        chooses = all(key in p.compare or key in p.against or key in p.where for p in parts)
        if wanted and chooses:
            grid[key] = [v for v in grid[key] if v in wanted]
    return grid


# --- operating characteristics -----------------------------------------------------------------

def characteristic(claim: claims.Claim, world: World, facts: list[claims.Claim], profile: str,
                   experiments: Path, trials: int, cv: float, runs: int, seed: int,
                   verdict_minimum: int | None = None,
                   counts: Mapping[str, int] | None = None) -> Characteristic:
    """The share of `runs` draws (draw_results) that read each verdict; `counts`: each
    experiment's own trials per config, in place of `trials`."""
    rng = np.random.default_rng([seed, trials, round(cv * 1e6), *claim.id.encode()])
    verdicts: Counter[str] = Counter()
    for _ in range(runs):
        data = draw_results(claim, world, facts, profile, experiments, trials, cv, rng, verdict_minimum,
                            counts)
        verdicts[claims.judge(claim, data).verdict] += 1
    return Characteristic(claim.id, world.name, world.role, trials, cv, runs,
                          {v: verdicts[v] / runs for v in claims.VERDICTS if verdicts[v]})


def planned_counts(claim: claims.Claim, profile: str, experiments: Path) -> dict[str, int]:
    """Trials per config that `profile` plans in each experiment the claim reads (its timing
    trials: claims.timing_trials), for a claim whose parts run apart (C10: nhwc_layout and
    numa_binding)."""
    found = {}
    for part in _parts(claim):
        found[part.experiment] = claims.timing_trials(_spec(experiments / f"{part.experiment}.toml", profile))
    return found


def outcome_facts(claim_list: list[claims.Claim], claim: claims.Claim) -> list[claims.Claim]:
    """The outcome parts of every other claim: what the paper says fails holds in every world."""
    return [p for c in claim_list if c.id != claim.id for p in _parts(c) if p.kind == "outcome"]


def trials_for_power(claim: claims.Claim, paper: list[World], facts: list[claims.Claim], profile: str,
                     experiments: Path, cv: float, runs: int, seed: int,
                     target: float = 0.8, above: int = 0) -> int | None:
    """The fewest trials per config of TRIAL_LADDER (above `above`) at which every world of
    `paper` reads supported in at least `target` of the runs; None when even the most do not."""
    for n in (n for n in TRIAL_LADDER if n > above):
        if all(characteristic(claim, w, facts, profile, experiments, n, cv, runs, seed)
               .shares.get("supported", 0.0) >= target for w in paper):
            return n
    return None


@dataclass(frozen=True)
class ClaimPower:
    """A claim's operating characteristics at one CV, or why it has none."""
    claim: claims.Claim
    cv: float
    trials: int
    rows: tuple[Characteristic, ...] = ()
    needed: int | None = None  # trials per config for 80 % supported where the paper is right
    skipped: str = ""
    searched: bool = False  # whether `needed` was searched for (None then means "more than 30")


def claims_power(claim_list: list[claims.Claim], profile: str, experiments: Path, cvs: list[float],
                 trials: int | None, runs: int, seed: int, needed: bool = True) -> list[ClaimPower]:
    """Every claim's characteristics in each of its worlds at each CV, at `trials` per config (the
    profile's own count when None), and the trials its paper-right worlds need for 80 %."""
    found = []
    for claim in claim_list:
        for cv in cvs:
            found.append(claim_power(claim_list, claim, profile, experiments, cv, trials, runs,
                                      seed, needed))
    return found


def claim_power(claim_list: list[claims.Claim], claim: claims.Claim, profile: str,
                 experiments: Path, cv: float, trials: int | None, runs: int, seed: int,
                 needed: bool, verdict_minimum: int | None = None,
                 roles: tuple[str, ...] = (*ROLES, "other"),
                 counts: Mapping[str, int] | None = None) -> ClaimPower:
    """At `trials` per config in every experiment, or at `counts` (each experiment's own, as a
    plan that runs C10's two parts apart has them), or else at the profile's own counts."""
    if not simulable(claim):
        return ClaimPower(claim, cv, trials or 0, skipped="reads trace metrics: not simulated")
    try:
        specs = [_spec(experiments / f"{p.experiment}.toml", profile) for p in _parts(claim)]
    except InputError as exc:
        return ClaimPower(claim, cv, trials or 0, skipped=f"no {profile} profile ({exc})")
    if not all(claims.device_ok(p, s) for p, s in zip(_parts(claim), specs, strict=True)):
        return ClaimPower(claim, cv, trials or 0,
                          skipped=f"the {profile} profile runs on another device than the claim's")
    if not all(claims.holds_arms(p, s) for p, s in zip(_parts(claim), specs, strict=True)):
        where = "; ".join(f"{k}={v}" for p in _parts(claim) for k, v in p.where.items())
        return ClaimPower(claim, cv, trials or 0, skipped=f"the {profile} profile runs no config "
                          "it compares" + (f" (where {where})" if where else ""))
    n = max(counts.values()) if counts else trials or max(s.trials for s in specs)
    if counts is None and not trials:  # the profile's own counts: each experiment at its own
        counts = {p.experiment: s.trials for p, s in zip(_parts(claim), specs, strict=True)}
    facts = outcome_facts(claim_list, claim)
    rows = tuple(characteristic(claim, w, facts, profile, experiments, n, cv, runs, seed, verdict_minimum,
                                counts)
                 for w in worlds(claim) if w.role in roles and _values_apply(w, specs))
    paper = [w for w in worlds(claim) if w.role == "paper"]
    fewest = (trials_for_power(claim, paper, facts, profile, experiments, cv, runs, seed)
              if needed and paper else None)
    return ClaimPower(claim, cv, n, rows, fewest, searched=needed and bool(paper))


def _values_apply(world: World, specs: list[spec.Spec]) -> bool:
    """Whether the paper's per-group values a world sets meet a config of the profile (C3's 2-GPU
    cells do not in a 1-GPU profile: that world would be the paper right, mislabelled)."""
    for says, run in zip(world.parts, specs, strict=True):
        settings = [s for _, _, s in spec.configs(run)]
        if says.values and not any(claims.matches(s, group) for group, _ in says.values for s in settings):
            return False
    return True


def weakest_paper(found: ClaimPower) -> float | None:
    """P(supported) in the claim's weakest paper-right world; None without one."""
    papers = [r.shares.get("supported", 0.0) for r in found.rows if r.role == "paper"]
    return min(papers) if papers and not found.skipped else None


def paper_support(claim_list: list[claims.Claim], claim: claims.Claim, profile: str,
                  experiments: Path, cv: float, trials: int, draws: int = 50,
                  seed: int = 0, verdict_minimum: int | None = None) -> float | None:
    """P(supported) in the claim's weakest paper-right world at `trials` per config of `profile`
    and noise `cv` (and `verdict_minimum` in place of the profile's, where a budget lowered it);
    None when it cannot be simulated (trace metrics, an experiment or profile outside
    `experiments`, another device, no paper-right world)."""
    found = claim_power(claim_list, claim, profile, experiments, cv, trials, draws, seed,
                         needed=False, verdict_minimum=verdict_minimum, roles=("paper",))
    return weakest_paper(found)


@dataclass(frozen=True)
class RunPower:
    """A report's power for one claim: P(supported) where the paper is right at its runs' median
    ok trials per config `n` and measured noise, and where that is under `target`, the trials per
    config that would reach it (None: more than TRIAL_LADDER's most)."""
    support: float
    n: int
    target: float = 0.8
    needed: int | None = None

    @property
    def underpowered(self) -> bool:
        return self.support < self.target


def paper_right_support(claim_list: list[claims.Claim], claim: claims.Claim,
                        runs: list[tuple[spec.Spec, pd.DataFrame]], experiments: Path, cv: float,
                        draws: int = 50, seed: int = 0, target: float = 0.8) -> RunPower | None:
    """paper_support at the profile of the runs that read the claim's first part, their median
    ok trials per config and their verdict minimum (a budget may have lowered it), and below
    `target` the trials it would need (trials_for_power); None as there, or without such a run."""
    first = _parts(claim)[0].experiment
    mine = [(s, t) for s, t in runs if s.name == first and not t.empty]
    if not mine:
        return None
    run_spec, trials = mine[0]
    n = max(2, int(np.median(trials.groupby("config_id").size())))
    found = paper_support(claim_list, claim, run_spec.profile, experiments, cv, n, draws, seed,
                          verdict_minimum=run_spec.min_ok)
    if found is None:
        return None
    if found >= target:
        return RunPower(found, n, target)
    paper = [w for w in worlds(claim) if w.role == "paper"]
    needed = trials_for_power(claim, paper, outcome_facts(claim_list, claim), run_spec.profile,
                              experiments, cv, draws, seed, target, above=n)
    return RunPower(found, n, target, needed)


def measured_cv(specs_and_trials: list[tuple[spec.Spec, pd.DataFrame]]) -> tuple[float | None, int]:
    """The run-to-run CV of finished runs: the median over configs (of at least 2 ok trials) of
    sd / mean of each run's primary metric, and how many configs it comes from; None without any."""
    cvs = []
    for run_spec, trials in specs_and_trials:
        if trials.empty or run_spec.primary not in trials:
            continue
        for _, group in trials.groupby("config_id"):
            values = group[run_spec.primary].dropna()
            if len(values) >= 2 and values.mean() > 0:
                cvs.append(float(values.std(ddof=1) / values.mean()))
    return (float(np.median(cvs)) if cvs else None), len(cvs)
