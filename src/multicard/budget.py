"""Fit a collection of experiments into a time budget, giving up as little of each claim as it can.

Levers, in the order they are pulled (each only as far as the budget needs):
1. configs no claim reads (no claim's arms or parts match them) are dropped, the experiment where
   they cost the most first (an experiment that no claim reads at all keeps its configs: its
   question is its own; a loader_only run's configs are never claimed);
2. trials per config go down, never below the verdict minimum (`[trials].min_ok`: fewer ok
   trials and no verdict could use them): given the claims' power (`power`: the least P(supported)
   where the paper is right among an experiment's claims at n trials, power.paper_support), one
   trial at a time from the experiment that keeps the most power without it, so the trials stay
   where power is lowest; without it, all experiments one step at a time;
3. epochs go down (halved each step, the costliest experiment first), never below what the
   claims need: an experiment with an accuracy claim keeps its epochs (the paper's 20: accuracy
   is the claim), any other keeps at least MIN_EPOCHS (a pause before a later epoch needs one).
   LLM trials keep their steps.
If every lever at its floor still does not fit, no plan fits, and the least plan is said.
Fitting is pure: the estimates come in as a function; the CLI prints. A plan that fits is saved
(`plan --save-budget FILE`) and applied run by run (`run --budget-plan FILE`): the run's
spec.toml then says, in its `[budget]` table, what it kept and gave up.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from multicard.artifact import write_text_atomic
from multicard.errors import InputError

MIN_EPOCHS = 2
PLAN_FILE = "budget.json"  # a collection's budget plan (`nox -s reproduce -- --budget D`)
ACCURACY_METRICS = frozenset({"test_accuracy"})
Settings = Mapping[str, Any]
Seconds = Callable[[str, Settings, str], float]  # (workload, settings, trace) -> one trial's estimate


@dataclass(frozen=True)
class Experiment:
    """One spec of the collection, as the budget sees it."""

    name: str  # experiment@profile
    experiment: str
    workload: str
    trials: int
    min_ok: int
    configs: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...]  # (id, factors, settings)
    claimed: frozenset[str]  # config ids some claim reads
    epoch_floor: int | None  # None: its epochs are not a lever (LLM, or fixed by the claims)
    claims: tuple[str, ...] = ()  # the ids of the claims that read it
    traced: int = 0  # profiled trials per config, on top of `trials` (never a lever)
    trace: str = "none"  # how they are profiled (a profiled trial has its own rate)


@dataclass(frozen=True)
class Choice:
    experiment: Experiment
    trials: int
    epochs: int | None  # None: unchanged
    configs: tuple[str, ...]  # the config ids kept

    def seconds(self, estimate: Seconds) -> float:
        e = self.experiment
        kept = [self._settings(s) for cid, _, s in e.configs if cid in self.configs]
        timing = self.trials * sum(estimate(e.workload, s, "none") for s in kept)
        return timing + (e.traced * sum(estimate(e.workload, s, e.trace) for s in kept) if e.traced else 0.0)

    def _settings(self, settings: dict[str, Any]) -> dict[str, Any]:
        return settings if self.epochs is None else {**settings, "epochs": self.epochs}


# (experiment, trials per config) -> the least P(supported) where the paper is right among its
# claims, None when none can be simulated
Power = Callable[["Experiment", int], "float | None"]


@dataclass(frozen=True)
class Budgeted:
    fits: bool
    choices: tuple[Choice, ...]
    seconds: float  # of the choices (the least plan where nothing fits)


def parse_duration(text: str) -> float:
    """`24h`, `1h30m`, `90m`, `2d`, `3600s` or `3600` -> seconds; InputError otherwise."""
    parts = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)d)?\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?"
                         r"\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text)
    if not text.strip() or parts is None or not any(parts.groups()):
        raise InputError(f"--budget: expected a duration such as 24h, 1h30m, 90m or 2d, got {text!r}")
    if any(parts.groups()[:3]) and text.strip()[-1].isdigit():  # "1h30": 30 what?
        raise InputError(f"--budget: a number after another unit needs its own (1h30m, not 1h30), "
                         f"got {text!r}")
    days, hours, minutes, seconds = (float(g) if g else 0.0 for g in parts.groups())
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total <= 0:
        raise InputError(f"--budget: expected a positive duration, got {text!r}")
    return total


def epoch_floor(workload: str, epochs: int | None, metrics: Iterable[str]) -> int | None:
    """How far an experiment's epochs may go down: not at all with an accuracy claim."""
    if workload != "vision" or epochs is None:
        return None
    return epochs if ACCURACY_METRICS & set(metrics) else min(epochs, MIN_EPOCHS)


def fit(experiments: list[Experiment], budget_s: float, estimate: Seconds,
        power: Power | None = None) -> Budgeted:
    """The plan that fits `budget_s` with the least given up, lever by lever."""
    choices = [Choice(e, e.trials, None, tuple(cid for cid, _, _ in e.configs)) for e in experiments]

    def total(current: list[Choice]) -> float:
        return sum(c.seconds(estimate) for c in current)

    if total(choices) <= budget_s:
        return Budgeted(True, tuple(choices), total(choices))
    def fewer_trials(current: list[Choice], estimate: Seconds) -> list[Choice] | None:
        return _fewer_trials(current, estimate) if power is None else \
            _trials_by_power(current, estimate, power)

    for step in (_fewer_configs, fewer_trials, _fewer_epochs):
        while total(choices) > budget_s and (smaller := step(choices, estimate)) is not None:
            choices = smaller
        if total(choices) <= budget_s:
            return Budgeted(True, tuple(choices), total(choices))
    return Budgeted(False, tuple(choices), total(choices))


def _fewer_configs(choices: list[Choice], estimate: Seconds) -> list[Choice] | None:
    """Drop the unclaimed configs of the experiment where they cost the most (one at a time)."""
    def unclaimed(c: Choice) -> float:
        others = tuple(cid for cid in c.configs if cid not in c.experiment.claimed)
        return replace(c, configs=others).seconds(estimate)

    have = [i for i, c in enumerate(choices) if any(cid not in c.experiment.claimed for cid in c.configs)]
    if not have:
        return None
    costliest = max(have, key=lambda i: unclaimed(choices[i]))
    c = choices[costliest]
    kept = replace(c, configs=tuple(cid for cid in c.configs if cid in c.experiment.claimed))
    return [*choices[:costliest], kept, *choices[costliest + 1:]]


def _fewer_trials(choices: list[Choice], estimate: Seconds) -> list[Choice] | None:
    """One trial less everywhere above the verdict minimum (never more than asked for)."""
    if all(c.trials <= c.experiment.min_ok for c in choices):
        return None
    return [replace(c, trials=min(c.trials, max(c.experiment.min_ok, c.trials - 1))) for c in choices]


def _trials_by_power(choices: list[Choice], estimate: Seconds, power: Power) -> list[Choice] | None:
    """One trial less in the experiment whose claims keep the most power without it (the
    costliest of equals); an experiment whose power is unknown counts as powerless (kept)."""
    above = [i for i, c in enumerate(choices) if c.trials > c.experiment.min_ok]
    if not above:
        return None

    def kept(i: int) -> tuple[float, float]:
        c = choices[i]
        found = power(c.experiment, c.trials - 1)
        return (0.0 if found is None else found, c.seconds(estimate))

    chosen = max(above, key=kept)
    c = choices[chosen]
    return [*choices[:chosen], replace(c, trials=c.trials - 1), *choices[chosen + 1:]]


def _fewer_epochs(choices: list[Choice], estimate: Seconds) -> list[Choice] | None:
    """Halve the epochs of the costliest experiment still above its floor (one at a time: halving
    every experiment at once would give up more than the budget needs)."""
    def epochs(c: Choice) -> int | None:
        return c.epochs if c.epochs is not None else _fixed_epochs(c.experiment)

    above = [i for i, c in enumerate(choices) if c.experiment.epoch_floor is not None
             and (e := epochs(c)) is not None and e > c.experiment.epoch_floor]
    if not above:
        return None
    costliest = max(above, key=lambda i: choices[i].seconds(estimate))
    c = choices[costliest]
    smaller = replace(c, epochs=max(int(c.experiment.epoch_floor or 0), int(epochs(c) or 0) // 2))
    return [*choices[:costliest], smaller, *choices[costliest + 1:]]


def _fixed_epochs(experiment: Experiment) -> int | None:
    return _one_epoch_count(experiment.configs)


def _one_epoch_count(configs: Iterable[tuple[str, dict[str, Any], dict[str, Any]]]) -> int | None:
    """The epochs every config shares, or None (they differ, or the workload has none)."""
    found = {s.get("epochs") for _, _, s in configs}
    return int(next(iter(found))) if len(found) == 1 and None not in found else None


def experiment_of(spec: Any, claim_list: Iterable[Any], traced: int = 0, trace: str = "none") -> Experiment:
    """A loaded spec (multicard.spec.Spec) and the claims that may read it, as the budget sees it
    (a loader_only run: none, the report keeps it out of every claim)."""
    from multicard import claims as claimsmod
    from multicard import spec as specmod
    from multicard.summarize import is_loader_only

    configs = tuple(specmod.configs(spec))
    mine = [] if is_loader_only(spec) else [
        c for c in claim_list if any(claimsmod.reads(c, spec.name, s) for _, _, s in configs)]
    read = [factors for _, factors, s in configs if any(claimsmod.reads(c, spec.name, s) for c in mine)]
    if not mine and not is_loader_only(spec):
        read = [factors for _, factors, _ in configs]  # no claim of ours: all of it is its question
    # a kept config's baseline stays too: its speedup column compares against it
    wanted = read + [b for f in read if (b := specmod.baseline_config(spec, f)) is not None]
    claimed = frozenset(cid for cid, factors, _ in configs if factors in wanted)
    metrics = {m for c in mine for m in _metrics(c)}
    floor = epoch_floor(spec.workload, _one_epoch_count(configs), metrics)
    return Experiment(f"{spec.name}@{spec.profile}", spec.name, spec.workload, spec.trials, spec.min_ok,
                      configs, claimed, floor, tuple(c.id for c in mine), traced, trace)


def _metrics(claim: Any) -> set[str]:
    return {claim.metric, *(m for part in claim.parts for m in _metrics(part))}


def given_up(choice: Choice, by_claims: bool = False) -> list[str]:
    """What this experiment's choice gave up, in words (empty: nothing); `by_claims`: what its
    claims gave up (not the configs that none of them reads)."""
    e, lost = choice.experiment, []
    if len(choice.configs) < len(e.configs) and not by_claims:
        lost.append(f"{len(e.configs) - len(choice.configs)} of {len(e.configs)} configs that no claim "
                    "reads dropped")
    if choice.trials < e.trials:
        lost.append(f"trials per config {e.trials} -> {choice.trials} (verdict minimum {e.min_ok}): "
                    "wider intervals")
    if choice.epochs is not None and choice.epochs != _fixed_epochs(e):
        lost.append(f"epochs {_fixed_epochs(e)} -> {choice.epochs}")
    return lost


@dataclass(frozen=True)
class Entry:
    """One experiment's part of a saved budget plan."""

    duration: str
    trials: int
    epochs: int | None  # None: unchanged
    configs: tuple[dict[str, Any], ...] | None  # factor values kept; None: all
    given_up: tuple[str, ...]


def plan_document(chosen: Budgeted, duration: str) -> dict[str, Any]:
    """A plan that fits, as saved by `plan --save-budget` and read by `run --budget-plan`."""
    experiments = {}
    for c in chosen.choices:
        every = len(c.configs) == len(c.experiment.configs)
        experiments[c.experiment.name] = {
            "trials": c.trials, "given_up": given_up(c),
            "epochs": None if c.epochs == _fixed_epochs(c.experiment) else c.epochs,
            "configs": None if every else [f for cid, f, _ in c.experiment.configs if cid in c.configs]}
    return {"duration": duration, "fits": chosen.fits, "seconds": round(chosen.seconds, 1),
            "experiments": experiments}


def save_plan(document: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(document, indent=1) + "\n")


def load_entry(path: Path, name: str) -> Entry:
    """`name`'s (experiment@profile) part of the budget plan in `path`; InputError otherwise."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        part = document["experiments"][name]
        configs = part["configs"]
        return Entry(str(document["duration"]), int(part["trials"]),
                     None if part["epochs"] is None else int(part["epochs"]),
                     None if configs is None else tuple(dict(c) for c in configs),
                     tuple(str(g) for g in part["given_up"]))
    except FileNotFoundError:
        raise InputError(f"{path}: no such budget plan (multicard plan --budget D --save-budget FILE "
                         "writes one)") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read the budget plan ({exc.strerror})") from None
    except KeyError as exc:
        where = f"no entry for {name}" if exc.args == (name,) else f"missing {exc}"
        raise InputError(f"{path}: not a budget plan for this run ({where})") from None
    except (ValueError, TypeError, AttributeError) as exc:
        raise InputError(f"{path}: not a budget plan ({exc})") from None


def budgeted_spec(path: Path, profile: str, settings: Mapping[str, Any], plan_file: Path) -> Any:
    """The spec at `path`@`profile` as the budget plan in `plan_file` chose it: its trials, its
    epochs (fixed like `--set epochs=N`) and the configs kept."""
    from multicard import spec as specmod

    loaded = specmod.load(path, profile, settings)
    entry = load_entry(plan_file, f"{loaded.name}@{loaded.profile}")
    if entry.epochs is not None:
        loaded = specmod.load(path, profile, {**settings, "epochs": entry.epochs})
    loaded = specmod.with_trials(loaded, entry.trials)
    # epochs that became fixed leave the factors the plan named the configs by
    kept = None if entry.configs is None else tuple(
        {k: v for k, v in c.items() if k in loaded.grid} for c in entry.configs)
    return specmod.with_budget(loaded, specmod.Budget(entry.duration, kept, entry.given_up))
