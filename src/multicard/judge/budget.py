"""Fit a collection of experiments into a time budget, giving up as little of each claim as it can.

Levers, in the order they are pulled (each only as far as the budget needs):
1. configs no claim reads (no claim's arms or parts match them) are dropped, the experiment where
   they cost the most first (an experiment that no claim reads at all keeps its configs: its
   question is its own; a loader_only run's configs are never claimed);
2. trials per config go down, never below the verdict minimum (`[trials].min_ok`: fewer ok
   trials and no verdict could use them): given the claims' power (`power`: the least P(supported)
   where the paper is right among an experiment's claims at n trials, power.paper_support), one
   trial at a time where it costs the least power per second saved, so the trials stay where
   power is lowest and cheapest to keep; without it, all experiments one step at a time;
3. epochs go down (halved each step, the costliest experiment first), never below what the
   claims need: an experiment with an accuracy claim keeps its epochs (the paper's 20: accuracy
   is the claim), any other keeps at least MIN_EPOCHS (a pause before a later epoch needs one);
   then, the same way, an LLM trial's steps, never below LLM_MIN_STEPS (the median step time and
   the peak memory its claims read settle well before);
4. experiments no claim can decide (the artifact's own questions: the NUMA controls, DALI's
   thread affinity) are dropped whole, the costliest first;
5. with the claims' power known, trials go below the verdict minimum, and the minimum with them,
   down to TRIALS_FLOOR (the fewest at which the intervals' coverage is tested), again one trial
   at a time where the least power is lost per second: the plan says each claim's power there.
If every lever at its floor still does not fit, no plan fits, and the least plan is said.
Fitting is pure: the estimates come in as a function; the CLI prints. A plan that fits is saved
(`plan --save-budget FILE`) and applied run by run (`run --budget-plan FILE`): the run's
spec.toml then says, in its `[budget]` table, what it kept and gave up.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from multicard.errors import InputError
from multicard.integrity import write_text_atomic

MIN_EPOCHS = 2
# the fewest trials per config a budget may leave, the verdict minimum going down with them: the
# fewest at which the 95 % intervals' coverage is tested (tests/unit/judge/test_stats.py, n = 3-10)
TRIALS_FLOOR = 3
# the timed steps an LLM trial keeps at least: the evaluation profile's 20 after its warm-up
LLM_MIN_STEPS = 20
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
    step_floor: int | None = None  # how far an LLM trial's max_steps may go; None: not a lever


@dataclass(frozen=True)
class Choice:
    experiment: Experiment
    trials: int
    epochs: int | None  # None: unchanged
    configs: tuple[str, ...]  # the config ids kept
    steps: int | None = None  # an LLM trial's max_steps; None: unchanged

    def seconds(self, estimate: Seconds) -> float:
        e = self.experiment
        kept = [self._settings(s) for cid, _, s in e.configs if cid in self.configs]
        timing = self.trials * self.timing_trial_seconds(estimate)
        return timing + (e.traced * sum(estimate(e.workload, s, e.trace) for s in kept) if e.traced else 0.0)

    def timing_trial_seconds(self, estimate: Seconds) -> float:
        """One more (or one less) trial per kept config: what a trial cut saves."""
        e = self.experiment
        return sum(estimate(e.workload, self._settings(s), "none") for cid, _, s in e.configs
                   if cid in self.configs)

    def _settings(self, settings: dict[str, Any]) -> dict[str, Any]:
        shorter = settings if self.epochs is None else {**settings, "epochs": self.epochs}
        return shorter if self.steps is None else {**shorter, "max_steps": self.steps}


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

    def to_minimum(current: list[Choice], estimate: Seconds) -> list[Choice] | None:
        return _fewer_trials(current, estimate) if power is None else \
            _trials_by_power(current, estimate, power, lambda e: e.min_ok)

    def below_minimum(current: list[Choice], estimate: Seconds) -> list[Choice] | None:
        return None if power is None else _trials_by_power(
            current, estimate, power, lambda e: min(e.min_ok, TRIALS_FLOOR) if e.claims else e.min_ok)

    for step in (_fewer_configs, to_minimum, _fewer_epochs, _fewer_steps, _own_questions, below_minimum):
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


def _trials_by_power(choices: list[Choice], estimate: Seconds, power: Power,
                     floor: Callable[[Experiment], int]) -> list[Choice] | None:
    """One trial less where it costs the least power for the time it saves (the power its
    claims lose, their least P(supported) where the paper is right, per second: so a costly
    experiment whose claims keep their power gives its trials up before a cheap one whose claims
    need them), never below `floor`; an experiment whose power is unknown gives them up last."""
    above = [i for i, c in enumerate(choices) if c.trials > floor(c.experiment)]
    if not above:
        return None

    def loss_per_second(i: int) -> tuple[float, float]:
        c = choices[i]
        now, after = power(c.experiment, c.trials), power(c.experiment, c.trials - 1)
        saved = c.timing_trial_seconds(estimate)
        if now is None or after is None or saved <= 0:
            return (math.inf, -saved)
        return (max(0.0, now - after) / saved, -saved)

    chosen = min(above, key=loss_per_second)
    c = choices[chosen]
    return [*choices[:chosen], replace(c, trials=c.trials - 1), *choices[chosen + 1:]]


def _own_questions(choices: list[Choice], estimate: Seconds) -> list[Choice] | None:
    """Drop the costliest experiment that no claim reads (a question of the artifact's own)."""
    own = [i for i, c in enumerate(choices) if not c.experiment.claims and c.configs]
    if not own:
        return None
    costliest = max(own, key=lambda i: choices[i].seconds(estimate))
    return [*choices[:costliest], replace(choices[costliest], configs=()), *choices[costliest + 1:]]


def verdict_minimum(choice: Choice) -> int:
    """The ok trials per arm a verdict needs in this choice: the experiment's, or its trials
    where the budget cut them below it (never below TRIALS_FLOOR)."""
    e = choice.experiment
    return e.min_ok if choice.trials >= e.min_ok else max(TRIALS_FLOOR, choice.trials)


def _fewer_epochs(choices: list[Choice], estimate: Seconds) -> list[Choice] | None:
    """Halve the epochs of the costliest experiment still above its floor (one at a time: halving
    every experiment at once would give up more than the budget needs)."""
    return _halved(choices, estimate, "epochs", lambda e: e.epoch_floor)


def _fewer_steps(choices: list[Choice], estimate: Seconds) -> list[Choice] | None:
    """Halve the max_steps of the costliest LLM experiment still above its floor."""
    return _halved(choices, estimate, "steps", lambda e: e.step_floor)


# a Choice's length fields and the setting each one sets
LENGTHS = {"epochs": "epochs", "steps": "max_steps"}


def _halved(choices: list[Choice], estimate: Seconds, field: str,
            floor: Callable[[Experiment], int | None]) -> list[Choice] | None:
    def length(c: Choice) -> int | None:
        chosen = getattr(c, field)
        return chosen if chosen is not None else _one_value(c.experiment.configs, LENGTHS[field])

    above = [i for i, c in enumerate(choices) if (f := floor(c.experiment)) is not None
             and (n := length(c)) is not None and n > f]
    if not above:
        return None
    costliest = max(above, key=lambda i: choices[i].seconds(estimate))
    c = choices[costliest]
    smaller = replace(c, **{field: max(int(floor(c.experiment) or 0), int(length(c) or 0) // 2)})
    return [*choices[:costliest], smaller, *choices[costliest + 1:]]


def _fixed_epochs(experiment: Experiment) -> int | None:
    return _one_value(experiment.configs, "epochs")


def _one_value(configs: Iterable[tuple[str, dict[str, Any], dict[str, Any]]], key: str) -> int | None:
    """The value of `key` (epochs, max_steps) every config shares, or None (they differ, or the
    workload has none)."""
    found = {s.get(key) for _, _, s in configs}
    return int(next(iter(found))) if len(found) == 1 and None not in found else None


def experiment_of(spec: Any, claim_list: Iterable[Any], traced: int = 0, trace: str = "none") -> Experiment:
    """A loaded spec (multicard.plan.spec.Spec) and the claims that may read it, as the budget sees it
    (a loader_only run: none, the report keeps it out of every claim)."""
    from multicard.judge import claims as claimsmod
    from multicard.judge.summarize import is_loader_only
    from multicard.plan import spec as specmod

    configs = tuple(specmod.configs(spec))
    # the claims whose configs it holds, with all they compare (some part): a profile with one
    # loader reads the NUMA test's configs but can never answer it
    mine = [] if is_loader_only(spec) else [
        c for c in claim_list if any(claimsmod.reads(c, spec.name, s) for _, _, s in configs)
        and any(claimsmod.holds_arms(part, spec) for part in c.parts or (c,))]
    read = [factors for _, factors, s in configs if any(claimsmod.reads(c, spec.name, s) for c in mine)]
    if not mine and not is_loader_only(spec):
        read = [factors for _, factors, _ in configs]  # no claim of ours: all of it is its question
    # a kept config's baseline stays too: its speedup column compares against it
    wanted = read + [b for f in read if (b := specmod.baseline_config(spec, f)) is not None]
    claimed = frozenset(cid for cid, factors, _ in configs if factors in wanted)
    metrics = {m for c in mine for m in _metrics(c)}
    floor = epoch_floor(spec.workload, _one_value(configs, "epochs"), metrics)
    steps = _one_value(configs, "max_steps") if spec.workload == "llm" else None
    return Experiment(f"{spec.name}@{spec.profile}", spec.name, spec.workload, spec.trials, spec.min_ok,
                      configs, claimed, floor, tuple(c.id for c in mine), traced, trace,
                      None if not steps else min(steps, LLM_MIN_STEPS))


def _metrics(claim: Any) -> set[str]:
    return {claim.metric, *(m for part in claim.parts for m in _metrics(part))}


def given_up(choice: Choice, by_claims: bool = False) -> list[str]:
    """What this experiment's choice gave up, in words (empty: nothing); `by_claims`: what its
    claims gave up (not the configs that none of them reads)."""
    e, lost = choice.experiment, []
    if not choice.configs and e.configs and not e.claims:
        return [f"dropped whole: no claim reads it (a question of the artifact's own, {len(e.configs)} "
                "configs)"]
    if len(choice.configs) < len(e.configs) and not by_claims:
        lost.append(f"{len(e.configs) - len(choice.configs)} of {len(e.configs)} configs that no claim "
                    "reads dropped")
    minimum = verdict_minimum(choice)
    if choice.trials < e.trials:
        lowered = f"verdict minimum {e.min_ok} -> {minimum}" if minimum < e.min_ok \
            else f"verdict minimum {e.min_ok}"
        lost.append(f"trials per config {e.trials} -> {choice.trials} ({lowered}): wider intervals")
    if choice.epochs is not None and choice.epochs != _fixed_epochs(e):
        lost.append(f"epochs {_fixed_epochs(e)} -> {choice.epochs}: the first epoch's one-off costs "
                    "weigh more in train_time_s (steady_epoch_s, the later epochs' mean, leaves them out)")
    if choice.steps is not None and choice.steps != _one_value(e.configs, "max_steps"):
        lost.append(f"steps {_one_value(e.configs, 'max_steps')} -> {choice.steps}")
    return lost


@dataclass(frozen=True)
class Entry:
    """One experiment's part of a saved budget plan."""

    duration: str
    trials: int
    epochs: int | None  # None: unchanged
    configs: tuple[dict[str, Any], ...] | None  # factor values kept; None: all
    given_up: tuple[str, ...]
    min_ok: int | None = None  # the verdict minimum where the budget lowered it; None: the spec's
    steps: int | None = None  # an LLM trial's max_steps where the budget cut them; None: unchanged


def plan_document(chosen: Budgeted, duration: str) -> dict[str, Any]:
    """A plan that fits, as saved by `plan --save-budget` and read by `run --budget-plan`."""
    experiments = {}
    for c in chosen.choices:
        every = len(c.configs) == len(c.experiment.configs)
        experiments[c.experiment.name] = {
            "trials": c.trials, "given_up": given_up(c),
            "epochs": None if c.epochs == _fixed_epochs(c.experiment) else c.epochs,
            "min_ok": None if verdict_minimum(c) == c.experiment.min_ok else verdict_minimum(c),
            "steps": None if c.steps == _one_value(c.experiment.configs, "max_steps") else c.steps,
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
        lowered, steps = part.get("min_ok"), part.get("steps")
        return Entry(str(document["duration"]), int(part["trials"]),
                     None if part["epochs"] is None else int(part["epochs"]),
                     None if configs is None else tuple(dict(c) for c in configs),
                     tuple(str(g) for g in part["given_up"]),
                     None if lowered is None else int(lowered), None if steps is None else int(steps))
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
    epochs and LLM steps (fixed like `--set epochs=N`), its verdict minimum where it lowered it,
    and the configs kept."""
    from multicard.plan import spec as specmod

    loaded = specmod.load(path, profile, settings)
    entry = load_entry(plan_file, f"{loaded.name}@{loaded.profile}")
    shorter = ({"epochs": entry.epochs} if entry.epochs is not None else {}) | (
        {"max_steps": entry.steps} if entry.steps is not None else {})
    if shorter:
        loaded = specmod.load(path, profile, {**settings, **shorter})
    loaded = specmod.with_trials(loaded, entry.trials)
    if entry.min_ok is not None:  # the budget cut the trials below the verdict minimum
        loaded = replace(loaded, min_ok=max(TRIALS_FLOOR, min(loaded.min_ok, entry.min_ok)))
    # epochs that became fixed leave the factors the plan named the configs by
    kept = None if entry.configs is None else tuple(
        {k: v for k, v in c.items() if k in loaded.grid} for c in entry.configs)
    return specmod.with_budget(loaded, specmod.Budget(entry.duration, kept, entry.given_up))
