"""Experiment specs: load and validate TOML, merge a profile, expand the grid into trial plans.

A spec file is data (docs/design.md "Experiment spec"). Every problem is an `InputError` whose message
names the file, the key and what was expected, on one line. Config ids are a hash of the experiment
name, the workload and every resolved setting, so they are stable across runs and machines and
change exactly when what a trial does changes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import tomli_w

from multicard.errors import InputError
from multicard.plan import params
from multicard.plan.params import Value

SECTIONS = {"experiment", "fixed", "grid", "baseline", "trials", "report", "profiles", "reference",
            "budget"}
BUDGET_KEYS = {"duration", "configs", "given_up"}
EXPERIMENT_KEYS = {"name", "title", "workload", "paper", "description", "profile"}
TRIALS_KEYS = {"count", "seed", "timeout_s", "trace", "trace_trials", "trace_fallback", "trace_count",
               "min_ok", "half_width"}
TRACE_MODES = ("none", "torch", "nsys")
TRACE_TRIALS = ("extra", "first")
REPORT_KEYS = {"primary", "metrics", "figure", "breakdown"}
PROFILE_KEYS = {"fixed", "grid", "trials", "baseline", "report"}
SPEEDUP_KEYS = ("speedup_x", "time_reduction_pct", "gain_pct")
DEFAULT_TIMEOUT_S = 7200.0
# Bounds that no real sweep reaches, checked before anything is planned or allocated: a count of
# 10**9 would otherwise build a plan of that many objects before failing.
MAX_TRIALS = 1000
MAX_PLANNED = 100_000  # configs x trials of one spec
MAX_TIMEOUT_S = 30 * 86400.0
# The validity rule of every verdict: ok trials per arm before anything is decided; the paper
# profile asks for 5 (MLPerf's floor for a result), every other profile for 3.
MIN_OK = {"paper": 5}
MIN_OK_DEFAULT = 3
AUTO_MAX_DEFAULT = 20  # `count = "auto"` stops by this many rounds at the latest, pilot included
AUTO_PILOT_DEFAULT = 3  # `count = "auto"`: rounds whose variances set the count (2 per arm at least)
HALF_WIDTH_DEFAULT = 0.02  # `auto` aims at comparison intervals within +-2 %
TRACE_COUNT_DEFAULT = 3  # traced trials per config: the same minimum as any verdict


@dataclass(frozen=True)
class Auto:
    """`[trials].count = "auto[:PILOT..MAX]"`: Stein's two-stage rule (adaptive.py). PILOT rounds
    whose variances set how many rounds follow (at least `min_judged`, the verdict minimum), so
    that each comparison's interval has a relative half-width of about `half_width`; at most MAX
    rounds in all. The pilot rounds set the count and are left out of every statistic."""

    pilot_rounds: int
    max_rounds: int
    half_width: float
    min_judged: int


@dataclass(frozen=True)
class Reference:
    """The paper's value(s) for the configs that `match` selects; a range is (lo, hi)."""

    match: dict[str, Value]
    values: dict[str, float | tuple[float, float]]
    source: str
    note: str = ""
    outcome: str | None = None  # "runs" | "fails": a binary result the paper reports
    inferred: bool = False  # the cell, or which config it belongs to, is inferred, not given

    def applies_to(self, config: Mapping[str, Value]) -> bool:
        return all(config.get(k) == v for k, v in self.match.items())


@dataclass(frozen=True)
class Budget:
    """What a time budget (`multicard plan --budget`) kept of this run and gave up."""

    duration: str  # as given, e.g. "24h"
    configs: tuple[dict[str, Value], ...] | None  # factor values of the configs kept; None: all
    given_up: tuple[str, ...]  # in words; empty: nothing


@dataclass(frozen=True)
class Spec:
    path: Path
    name: str
    title: str
    workload: str
    paper: str
    description: str
    profile: str
    fixed: dict[str, Value]
    grid: dict[str, list[Value]]
    baseline: dict[str, Value]
    trials: int
    order_seed: int
    timeout_s: float
    trace: str  # "none" | "torch" | "nsys"
    trace_trials: str  # "extra": traced trials after the timing ones; "first": the first are traced
    trace_fallback: bool  # without nsys, trace with the torch profiler instead of refusing
    primary: str
    metrics: list[str]
    figure: dict[str, str]
    breakdown: bool = False  # a stacked bar per config: data wait, copy wait, the rest
    references: list[Reference] = field(default_factory=list)
    min_ok: int = MIN_OK_DEFAULT  # ok trials per arm that a verdict needs
    trace_count: int = TRACE_COUNT_DEFAULT  # traced trials per config
    auto: Auto | None = None  # trials until the answer is clear; `trials` is then the most
    half_width: float = HALF_WIDTH_DEFAULT  # the target of `auto` ([trials].half_width)
    budget: Budget | None = None  # set on a run planned to fit a time budget


@dataclass(frozen=True)
class PlannedTrial:
    order: int
    config_id: str
    config: dict[str, Value]
    params: dict[str, Value]
    trial: int
    trace: str = "none"

    @property
    def key(self) -> tuple[str, int, str]:
        return self.config_id, self.trial, self.trace


class _Checker:
    """Builds one-line error messages that name the file and the key."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key: str, expected: str, got: Any = None, *, show_got: bool = True) -> NoReturn:
        suffix = f", got {got!r}" if show_got else ""
        raise InputError(f"{self.path}: {key}: expected {expected}{suffix}")

    def table(self, key: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(key, "a table", value)
        return value

    def keys(self, key: str, table: Mapping[str, Any], allowed: set[str] | dict[str, Any]) -> None:
        for name in table:
            if name not in allowed:
                self.fail(f"{key}.{name}", "one of " + ", ".join(sorted(allowed)), show_got=False)

    def text(self, key: str, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            self.fail(key, "a non-empty string", value)
        return value

    def setting(self, workload: str, key: str, name: str, value: Any) -> Value:
        table = params.WORKLOAD_PARAMS[workload]
        if name not in table:
            self.fail(key, f"a setting of workload {workload!r}", name)
        checked = params.check_value(table[name], value)
        if checked is None:
            self.fail(key, table[name].describe(), value)
        return checked


def load(path: str | Path, profile: str = "paper", settings: Mapping[str, Any] | None = None) -> Spec:
    """Read `path`, merge `profile` on top, fix `settings` (command-line --set), validate."""
    path = Path(path)
    if path.exists() and not path.is_dir() and not path.is_file():
        raise InputError(f"{path}: not a regular file (a FIFO or device is never read)")
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such spec file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: a directory, not a spec file (experiments/<name>.toml)") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not valid TOML: {exc}") from None
    if settings and isinstance(doc.get("profiles", {}), dict) and (
            profile == "paper" or profile in doc.get("profiles", {})):
        overlay = doc.setdefault("profiles", {}).setdefault(profile, {})
        overlay["fixed"] = {**overlay.get("fixed", {}), **settings}  # leaves the grid, like a profile
        if isinstance(overlay.get("grid"), dict):  # the profile's own grid too: --set always fixes
            overlay["grid"] = {k: v for k, v in overlay["grid"].items() if k not in settings}
    chosen = from_document(doc, path, profile)
    check_every_profile(doc, path, profile)
    return chosen


def check_every_profile(doc: dict[str, Any], path: Path, chosen: str) -> None:
    """A profile that is not selected is validated too: a typo in one must not wait for the day
    someone runs it."""
    profiles = doc.get("profiles", {})
    for other in ["paper", *profiles] if isinstance(profiles, dict) else []:
        if other == chosen:
            continue
        try:
            from_document(doc, path, other)
        except InputError as exc:
            raise InputError(f"{exc} (in profile {other!r})") from None


def from_document(doc: dict[str, Any], path: Path, profile: str = "paper") -> Spec:
    check = _Checker(path)
    check.keys("top level", doc, SECTIONS)
    exp = check.table("[experiment]", doc.get("experiment"))
    check.keys("[experiment]", exp, EXPERIMENT_KEYS)
    name = check.text("[experiment].name", exp.get("name"))
    resolved = "profile" in exp  # a spec.toml written by `to_toml`: profile already merged
    if not resolved and name != path.stem:
        check.fail("[experiment].name", f"the file stem {path.stem!r}", name)
    workload = exp.get("workload")
    if workload not in params.WORKLOAD_PARAMS:
        check.fail("[experiment].workload", "one of " + ", ".join(params.WORKLOAD_PARAMS), workload)
    if resolved:
        profile = check.text("[experiment].profile", exp["profile"])
    else:
        doc = _merge_profile(check, doc, profile)
    fixed, grid = _fixed_and_grid(check, doc, workload, resolved)
    trials = check.table("[trials]", doc.get("trials", {}))
    check.keys("[trials]", trials, TRIALS_KEYS)
    spec = Spec(
        path=path,
        name=name,
        title=check.text("[experiment].title", exp.get("title")),
        workload=workload,
        paper=str(exp.get("paper", "")),
        description=str(exp.get("description", "")),
        profile=profile,
        fixed=fixed,
        grid=grid,
        baseline=_baseline(check, doc, grid, workload),
        **_counts(check, trials, profile),
        order_seed=_int(check, "[trials].seed", trials.get("seed", 0), minimum=0),
        timeout_s=_timeout(check, trials.get("timeout_s", DEFAULT_TIMEOUT_S)),
        trace=_choice(check, "[trials].trace", trials.get("trace", "none"), TRACE_MODES),
        trace_trials=_choice(check, "[trials].trace_trials", trials.get("trace_trials", "extra"),
                             TRACE_TRIALS),
        trace_fallback=_boolean(check, "[trials].trace_fallback", trials.get("trace_fallback", False)),
        **_report(check, doc, grid, workload),
        references=_references(check, doc, workload),
    )
    if "budget" in doc:
        if not resolved:
            check.fail("[budget]", "no such table in an experiment file (a run's spec.toml gets one "
                       "from `multicard run --budget-plan`)", show_got=False)
        spec = with_budget(spec, _budget(check, doc["budget"]))
    _check_conflicts(check, spec)
    check_plan_size(spec, spec.trials, path)
    return spec


def with_trials(spec: Spec, trials: int | str | None) -> Spec:
    """`spec` with the command line's --trials: a count, or `auto[:PILOT..MAX]`."""
    import dataclasses

    if trials is None:
        return spec
    if isinstance(trials, int):
        return dataclasses.replace(spec, trials=trials, auto=None)
    auto = parse_auto(trials, spec.min_ok, spec.half_width, "--trials")
    return dataclasses.replace(spec, trials=auto.max_rounds, auto=auto)


def with_budget(spec: Spec, budget: Budget) -> Spec:
    """`spec` keeping only the budget's configs (trials and epochs are set by the caller)."""
    import dataclasses

    if budget.configs is not None:
        grid_points = [factors for _, factors, _ in configs(spec)]
        unknown = [c for c in budget.configs if c not in grid_points]
        if unknown:
            raise InputError(f"{spec.path}: [budget].configs: {unknown[0]} is not a config of "
                             f"{spec.name}@{spec.profile}")
    return dataclasses.replace(spec, budget=budget)


def _budget(check: _Checker, value: Any) -> Budget:
    table = check.table("[budget]", value)
    check.keys("[budget]", table, BUDGET_KEYS)
    kept = table.get("configs")
    if kept is not None and (not isinstance(kept, list) or not all(isinstance(c, dict) for c in kept)):
        check.fail("[budget].configs", "a list of tables of factor values", kept)
    given_up = table.get("given_up", [])
    if not isinstance(given_up, list) or not all(isinstance(g, str) for g in given_up):
        check.fail("[budget].given_up", "a list of strings", given_up)
    return Budget(check.text("[budget].duration", table.get("duration")),
                  None if kept is None else tuple(kept), tuple(given_up))


def _counts(check: _Checker, trials: Mapping[str, Any], profile: str) -> dict[str, Any]:
    """[trials] count, min_ok, trace_count and the `auto` rule."""
    min_ok = _int(check, "[trials].min_ok", trials.get("min_ok", MIN_OK.get(profile, MIN_OK_DEFAULT)),
                  minimum=3, maximum=MAX_TRIALS)
    trace_count = _int(check, "[trials].trace_count", trials.get("trace_count", TRACE_COUNT_DEFAULT),
                       minimum=1, maximum=MAX_TRIALS)
    count = trials.get("count", 5)
    half_width = trials.get("half_width", HALF_WIDTH_DEFAULT)
    if isinstance(half_width, bool) or not isinstance(half_width, int | float) \
            or not 0 < half_width < 1:
        check.fail("[trials].half_width", "a relative half-width between 0 and 1 (0.02 = 2 %)",
                   half_width)
    common = {"min_ok": min_ok, "trace_count": trace_count, "half_width": float(half_width)}
    if isinstance(count, str):
        auto = parse_auto(count, min_ok, float(half_width), f"{check.path}: [trials].count")
        return {"trials": auto.max_rounds, "auto": auto, **common}
    return {"trials": _int(check, "[trials].count", count, minimum=1, maximum=MAX_TRIALS),
            "auto": None, **common}


def parse_auto(text: str, min_ok: int, half_width: float, where: str) -> Auto:
    """`auto`, `auto:3..30`: PILOT rounds (default 3) set the count, at most MAX rounds in all
    (default 20), of which at least the verdict minimum follow the pilot."""
    match = re.fullmatch(r"auto(?::(\d+)\.\.(\d+))?", text.strip())
    if not match:
        raise InputError(f"{where}: expected an integer, 'auto' or 'auto:PILOT..MAX', got {text!r}")
    pilot = int(match.group(1)) if match.group(1) else AUTO_PILOT_DEFAULT
    high = int(match.group(2)) if match.group(2) else max(AUTO_MAX_DEFAULT, pilot + min_ok)
    if not 2 <= pilot <= high <= MAX_TRIALS:
        raise InputError(f"{where}: expected 2 <= PILOT <= MAX <= {MAX_TRIALS} in "
                         f"auto:PILOT..MAX, got {text!r}")
    if high - pilot < min_ok:
        raise InputError(f"{where}: auto:{pilot}..{high} leaves {high - pilot} rounds after the "
                         f"pilot, below the verdict minimum of this profile ([trials].min_ok = "
                         f"{min_ok}): the pilot's rounds are not judged")
    return Auto(pilot, high, half_width, min_ok)


def first_timing(spec: Spec) -> int:
    """The first timing trial index (traced trials come first with trace_trials = "first")."""
    if spec.trace != "none" and spec.trace_trials == "first":
        return min(spec.trace_count, spec.trials)
    return 0


def pilot_trials(spec: Spec) -> range:
    """The trial indices of `auto`'s pilot rounds: they set the count and no statistic reads
    them (their variances chose how many rounds follow: judging them too would bias the
    intervals' coverage, as stopping on a small variance does)."""
    if spec.auto is None:
        return range(0)
    start = first_timing(spec)
    return range(start, start + spec.auto.pilot_rounds)


def check_plan_size(spec: Spec, trials: int, where: Path | str) -> None:
    """Refuse a plan of more than MAX_PLANNED trials before building it."""
    size = math.prod(len(v) for v in spec.grid.values()) * (
        trials + (spec.trace_count if spec.trace != "none" else 0))
    if size > MAX_PLANNED:
        raise InputError(f"{where}: the plan would hold {size} trials (configs x trials); at most "
                         f"{MAX_PLANNED} in one run")


def _int(check: _Checker, key: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    if (not isinstance(value, int) or isinstance(value, bool) or value < minimum
            or (maximum is not None and value > maximum)):
        bounds = f">= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
        check.fail(key, f"an integer {bounds}", value)
    return value


def _choice(check: _Checker, key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        check.fail(key, "one of " + ", ".join(repr(c) for c in choices), value)
    return str(value)


def _boolean(check: _Checker, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        check.fail(key, "true or false", value)
    return value


def _timeout(check: _Checker, value: Any) -> float:
    if (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
            or not 0 < value <= MAX_TIMEOUT_S):
        check.fail("[trials].timeout_s", f"a finite number of seconds > 0 and <= {MAX_TIMEOUT_S:g}",
                   value)
    return float(value)


def _merge_profile(check: _Checker, doc: dict[str, Any], profile: str) -> dict[str, Any]:
    """Overlay `[profiles.<profile>]`. `paper` is the base document itself (plus any overlay).

    A key that the profile fixes leaves the grid (and the base's [baseline], which it can no
    longer name), and a key that it varies leaves `fixed`, so a profile can turn a factor into a
    constant and back.
    """
    profiles = check.table("[profiles]", doc.get("profiles", {}))
    for pname, body in profiles.items():
        check.keys(f"[profiles.{pname}]", check.table(f"[profiles.{pname}]", body), PROFILE_KEYS)
    if profile not in profiles and profile != "paper":
        available = ", ".join(["paper", *sorted(p for p in profiles if p != "paper")])
        raise InputError(f"{check.path}: [profiles]: no profile {profile!r} (available: {available})")
    merged = {k: v for k, v in doc.items() if k != "profiles"}
    overlay = profiles.get(profile, {})
    fixed = dict(check.table("[fixed]", doc.get("fixed", {})))
    grid = dict(check.table("[grid]", doc.get("grid", {})))
    _reject_overlap(check, fixed, grid)
    for key, value in check.table(f"[profiles.{profile}].fixed", overlay.get("fixed", {})).items():
        grid.pop(key, None)
        fixed[key] = value
    for key, value in check.table(f"[profiles.{profile}].grid", overlay.get("grid", {})).items():
        fixed.pop(key, None)
        grid[key] = value
    merged["fixed"], merged["grid"] = fixed, grid
    for section in ("trials", "baseline", "report"):
        base = check.table(f"[{section}]", doc.get(section, {}))
        extra = check.table(f"[profiles.{profile}].{section}", overlay.get(section, {}))
        merged[section] = {**base, **extra}
    fixed_here = set(overlay.get("fixed", {}))
    merged["baseline"] = {k: v for k, v in merged["baseline"].items()
                          if k not in fixed_here or k in overlay.get("baseline", {})}
    return merged


def _reject_overlap(check: _Checker, fixed: Mapping[str, Any], grid: Mapping[str, Any]) -> None:
    for key in fixed:
        if key in grid:
            check.fail(f"[fixed].{key}", "a key that is not also in [grid]", show_got=False)


def _fixed_and_grid(
    check: _Checker, doc: dict[str, Any], workload: str, recorded: bool = False
) -> tuple[dict[str, Value], dict[str, list[Value]]]:
    raw_fixed = check.table("[fixed]", doc.get("fixed", {}))
    raw_grid = check.table("[grid]", doc.get("grid", {}))
    _reject_overlap(check, raw_fixed, raw_grid)
    fixed = {k: check.setting(workload, f"[fixed].{k}", k, v) for k, v in raw_fixed.items()}
    grid: dict[str, list[Value]] = {}
    for key, values in raw_grid.items():
        if not isinstance(values, list) or not values:
            check.fail(f"[grid].{key}", "a non-empty list", values)
        checked = [check.setting(workload, f"[grid].{key}", key, v) for v in values]
        if len(set(checked)) != len(checked):
            check.fail(f"[grid].{key}", "a list without repeated values", values)
        grid[key] = checked
    if not grid:
        check.fail("[grid]", "at least one factor with a non-empty list of values", raw_grid)
    defaults = params.resolve(workload, fixed, recorded)
    return {k: v for k, v in defaults.items() if k not in grid}, grid


def _baseline(
    check: _Checker, doc: dict[str, Any], grid: dict[str, list[Value]], workload: str
) -> dict[str, Value]:
    baseline: dict[str, Value] = {}
    for key, value in check.table("[baseline]", doc.get("baseline", {})).items():
        if key not in grid:
            check.fail(f"[baseline].{key}", "a factor of [grid]", key)
        value = check.setting(workload, f"[baseline].{key}", key, value)
        if value not in grid[key]:
            check.fail(f"[baseline].{key}", f"one of the grid values {grid[key]}", value)
        baseline[key] = value
    return baseline


def _report(
    check: _Checker, doc: dict[str, Any], grid: dict[str, list[Value]], workload: str
) -> dict[str, Any]:
    report = check.table("[report]", doc.get("report", {}))
    check.keys("[report]", report, REPORT_KEYS)
    known = params.WORKLOAD_METRICS[workload]
    primary = report.get("primary", params.WORKLOAD_PRIMARY[workload])
    if primary not in known:
        check.fail("[report].primary", "a metric name of the workload", primary)
    metrics = report.get("metrics", [primary])
    if not isinstance(metrics, list) or not metrics or any(m not in known for m in metrics):
        check.fail("[report].metrics", "a non-empty list of metric names: " + ", ".join(known), metrics)
    figure = check.table("[report].figure", report.get("figure", {}))
    check.keys("[report].figure", figure, {"x", "series", "facet"})
    for role, factor in figure.items():
        if factor not in params.WORKLOAD_PARAMS[workload]:
            check.fail(f"[report].figure.{role}", f"a setting of workload {workload!r}", factor)
    # A role whose factor a profile has fixed is not drawn; without its x there is no figure.
    figure = {role: factor for role, factor in figure.items() if factor in grid}
    if "x" not in figure:
        figure = {}
    breakdown = report.get("breakdown", False)
    if not isinstance(breakdown, bool):
        check.fail("[report].breakdown", "true or false", breakdown)
    if breakdown and not {"train_time_s", "data_wait_fraction", "h2d_wait_fraction"} <= set(metrics):
        check.fail("[report].breakdown", "metrics that include train_time_s, data_wait_fraction "
                   "and h2d_wait_fraction", show_got=False)
    return {"primary": primary, "metrics": list(metrics), "figure": figure, "breakdown": breakdown}


def _references(check: _Checker, doc: dict[str, Any], workload: str) -> list[Reference]:
    entries = doc.get("reference", [])
    if not isinstance(entries, list):
        check.fail("[[reference]]", "an array of tables", entries)
    known = set(params.WORKLOAD_METRICS[workload]) | set(SPEEDUP_KEYS)
    refs = []
    for i, entry in enumerate(entries):
        key = f"[[reference]] #{i + 1}"
        entry = check.table(key, entry)
        check.keys(key, entry, known | {"match", "source", "note", "outcome", "inferred"})
        match = check.table(f"{key}.match", entry.get("match", {}))
        match = {k: check.setting(workload, f"{key}.match.{k}", k, v) for k, v in match.items()}
        values = {k: _ref_value(check, f"{key}.{k}", v) for k, v in entry.items() if k in known}
        outcome = entry.get("outcome")
        if outcome not in (None, "runs", "fails"):
            check.fail(f"{key}.outcome", "'runs' or 'fails'", outcome)
        if not values and outcome is None:
            check.fail(key, "at least one metric value or an outcome", show_got=False)
        source = check.text(f"{key}.source", entry.get("source"))
        inferred = entry.get("inferred", False)
        if not isinstance(inferred, bool):
            check.fail(f"{key}.inferred", "true or false", inferred)
        refs.append(Reference(match, values, source, str(entry.get("note", "")), outcome, inferred))
    return refs


def _ref_value(check: _Checker, key: str, value: Any) -> float | tuple[float, float]:
    def number(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    if number(value):
        return float(value)
    if isinstance(value, list) and len(value) == 2 and all(map(number, value)) and value[0] <= value[1]:
        return (float(value[0]), float(value[1]))
    check.fail(key, "a number or a range [lo, hi]", value)


def config_id(spec: Spec, settings: Mapping[str, Value]) -> str:
    """Stable 12-hex id of one config: experiment, workload and every resolved setting, but a
    setting added since runs were recorded where it has the value they ran with (params.Param.before)."""
    table = params.WORKLOAD_PARAMS[spec.workload]
    hashed = {k: v for k, v in settings.items() if k not in table or table[k].before is None
              or v != table[k].before}
    payload = json.dumps(
        {"experiment": spec.name, "workload": spec.workload, "params": hashed},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def configs(spec: Spec) -> list[tuple[str, dict[str, Value], dict[str, Value]]]:
    """(config_id, factor values, all settings) for every grid point, in grid order."""
    keys = list(spec.grid)
    out = []
    for combo in itertools.product(*(spec.grid[k] for k in keys)):
        config = dict(zip(keys, combo, strict=True))
        if spec.budget is not None and spec.budget.configs is not None and config not in spec.budget.configs:
            continue  # a time budget dropped it: no claim reads it
        settings = {k: config[k] if k in config else spec.fixed[k]
                    for k in params.WORKLOAD_PARAMS[spec.workload]}
        out.append((config_id(spec, settings), config, settings))
    return out


def _check_conflicts(check: _Checker, spec: Spec) -> None:
    for _, config, settings in configs(spec):
        for problem in params.WORKLOAD_CONFLICTS[spec.workload](settings):
            where = ", ".join(f"{k}={v}" for k, v in config.items())
            check.fail(f"config ({where})", f"a runnable combination: {problem}", show_got=False)


def plan(spec: Spec, trials: int | None = None, trace: str | None = None) -> list[PlannedTrial]:
    """Every (config, trial) in execution order.

    Trials are interleaved: round t holds trial t of every config, shuffled with a seed derived
    from `[trials].seed` and t, so slow drift (thermals, noisy neighbours) hits all configs alike.
    Profiling perturbs timing, so traced trials are kept apart: with `trace_trials = "extra"`
    `trace_count` (3) more rounds of traced trials follow the timing rounds; with "first", the
    first `trace_count` trials of every config are traced. Either way the record says so and the
    timing statistics leave traced trials out.
    """
    count = spec.trials if trials is None else trials
    mode = spec.trace if trace is None else trace
    check_plan_size(spec, count, spec.path)
    grid_points = configs(spec)
    rounds = [(t, "none") for t in range(count)]
    if mode != "none":
        traced = [(t, mode) for t in range(spec.trace_count)]
        rounds = ([*traced[:count], *rounds[len(traced):]] if spec.trace_trials == "first"
                  else [*rounds, *traced])
    planned: list[PlannedTrial] = []
    for t, trace_mode in rounds:
        order = list(grid_points)
        random.Random(f"{spec.order_seed}:{t}:{trace_mode}").shuffle(order)
        for cid, config, settings in order:
            planned.append(PlannedTrial(len(planned), cid, config, settings, t, trace_mode))
    return planned


@dataclass(frozen=True)
class Shard:
    """Part `index` of `count` of a plan: every count-th planned trial from `index` on, so each
    part keeps the plan's interleaving of configs and rounds (a Slurm array runs the parts on
    several nodes at once; `multicard report` merges them)."""

    index: int
    count: int

    def holds(self, planned: PlannedTrial) -> bool:
        return planned.order % self.count == self.index


def parse_shard(text: str) -> Shard:
    """`I/N` with 0 <= I < N; bad input otherwise."""
    found = re.fullmatch(r"([0-9]{1,6})/([0-9]{1,6})", text.strip())
    if not found or not int(found.group(1)) < int(found.group(2)):
        raise InputError(f"--shard: expected I/N with 0 <= I < N (e.g. 0/4), got {text!r}")
    return Shard(int(found.group(1)), int(found.group(2)))


def level_rank(spec: Spec, key: str, value: Any) -> int:
    """Where `value` stands among the spec's own levels of `key` (fp64 before fp32, 1 GPU before
    2): tables, figures and verdicts list groups in this order; a level the grid lacks goes last."""
    levels = spec.grid.get(key, [])
    return levels.index(value) if value in levels else len(levels)


def baseline_config(spec: Spec, config: Mapping[str, Value]) -> dict[str, Value] | None:
    """The config that `config` is compared against, or None when the spec has no baseline."""
    if not spec.baseline:
        return None
    return {**config, **spec.baseline}


def to_toml(spec: Spec) -> str:
    """The resolved spec (profile merged, defaults filled in), as written to DIR/spec.toml."""
    return tomli_w.dumps(to_document(spec))


def to_document(spec: Spec) -> dict[str, Any]:
    """The resolved spec as a document that from_document reads back to the same spec."""
    experiment = {"name": spec.name, "title": spec.title, "workload": spec.workload}
    experiment |= {"paper": spec.paper, "description": spec.description, "profile": spec.profile}
    doc: dict[str, Any] = {
        "experiment": experiment,
        "fixed": spec.fixed,
        "grid": spec.grid,
        "baseline": spec.baseline,
        "trials": {"count": (f"auto:{spec.auto.pilot_rounds}..{spec.auto.max_rounds}" if spec.auto
                             else spec.trials),
                   "seed": spec.order_seed, "timeout_s": spec.timeout_s,
                   "trace": spec.trace, "trace_trials": spec.trace_trials,
                   "trace_fallback": spec.trace_fallback, "trace_count": spec.trace_count,
                   "min_ok": spec.min_ok,
                   "half_width": spec.half_width},
        "report": {"primary": spec.primary, "metrics": spec.metrics, "figure": spec.figure,
                   "breakdown": spec.breakdown},
        "reference": [
            {"match": r.match, **{k: list(v) if isinstance(v, tuple) else v for k, v in r.values.items()},
             "source": r.source, "note": r.note, **({"outcome": r.outcome} if r.outcome else {}),
             **({"inferred": True} if r.inferred else {})}
            for r in spec.references
        ],
    }
    if spec.budget is not None:
        doc["budget"] = {"duration": spec.budget.duration, "given_up": list(spec.budget.given_up),
                         **({"configs": list(spec.budget.configs)} if spec.budget.configs is not None
                            else {})}
    return doc
