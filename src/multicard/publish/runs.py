"""Run directories as the report reads them: found, loaded, torn lines counted."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from multicard import integrity
from multicard.errors import InputError
from multicard.measure import gpu_state
from multicard.plan import calibrate
from multicard.plan import spec as specmod
from multicard.plan.spec import Shard, Spec
from multicard.run import store


@dataclass(frozen=True)
class RunData:
    path: Path
    spec: Spec
    env: dict[str, Any]
    records: list[dict[str, Any]]
    planned: int
    torn_lines: list[int] = field(default_factory=list)  # lines of trials.jsonl that were skipped
    gpus_at_end: list[dict[str, Any]] = field(default_factory=list)  # gpu_state.END_FILE
    shard: Shard | None = None  # one part of the plan (store.SHARD_FILE); None: the whole plan
    parts: tuple[Path, ...] = ()  # merged shards: every part's directory


def is_run(path: Path) -> bool:
    return (path / "spec.toml").is_file() and (path / store.TRIALS_FILE).is_file()


def discover_runs(path: Path) -> list[Path]:
    """`path` itself if it is a run directory, else the run directories directly inside it."""
    if not path.is_dir():
        raise InputError(f"{path}: not a directory")
    if is_run(path):
        return [path]
    runs = sorted(p for p in path.iterdir() if p.is_dir() and is_run(p))
    if not runs:
        raise InputError(f"{path}: no run directory (spec.toml + trials.jsonl) here or one level down")
    return runs


def load_run(path: Path) -> RunData:
    spec = specmod.load(path / "spec.toml")
    env_path = path / "env.json"
    env = _nodes_env(path) or (json.loads(env_path.read_text()) if env_path.exists() else {})
    records, torn = store.read_with_skipped(path / store.TRIALS_FILE)
    store.warn_skipped(path / store.TRIALS_FILE, torn)
    shard = store.read_shard(path)
    timing = [p for p in specmod.plan(spec) if p.trace == "none" and (shard is None or shard.holds(p))]
    end = path / gpu_state.END_FILE
    gpus_at_end = json.loads(end.read_text()).get("gpus", []) if end.is_file() else []
    return RunData(path, spec, env, records, planned=len(timing), torn_lines=torn, gpus_at_end=gpus_at_end,
                   shard=shard, parts=(path,))


def merge_shards(runs: list[RunData]) -> list[RunData]:
    """The parts of one sharded plan (the same spec, the same count) as one run: their records
    together and the whole plan's count, so that tables and verdicts see every trial; named by
    the first part. A plan whose parts are not all here stays apart, part by part."""
    groups: dict[tuple[str, int], list[RunData]] = {}
    for run in runs:
        if key := _shard_key(run):
            groups.setdefault(key, []).append(run)
    complete = {key: group for key, group in groups.items()
                if sorted(run.shard.index for run in group if run.shard) == list(range(key[1]))}
    merged = []
    for run in runs:
        group = complete.get(_shard_key(run) or ("", 0))
        if group is None:
            merged.append(run)
        elif run is group[0]:
            merged.append(replace(run, records=[r for part in group for r in part.records],
                                  planned=sum(part.planned for part in group), shard=None,
                                  torn_lines=[n for part in group for n in part.torn_lines],
                                  parts=tuple(part.path for part in group)))
    return merged


def _shard_key(run: RunData) -> tuple[str, int] | None:
    if run.shard is None:
        return None
    return specmod.to_toml(replace(run.spec, path=Path())), run.shard.count


def _nodes_env(path: Path) -> dict[str, Any] | None:
    """A multi-node run's trials ran in the nodes' image, not on the planner's host (env.json):
    node 0's own environment from the preflight, where it passed."""
    checked = integrity.read_json_object(path / "preflight.json") or {}
    nodes = checked.get("nodes") if checked.get("ok") else None
    first = nodes[0] if isinstance(nodes, list) and nodes and isinstance(nodes[0], dict) else {}
    return first.get("env") if isinstance(first.get("env"), dict) else None


def calibration(paths: list[Path]) -> dict[str, calibrate.Rate]:
    """Rates fitted from the runs (directories, or collections of them) and calibration files
    given; a later source wins for every key it measured (a skip never replaces a rate)."""
    rates: dict[str, calibrate.Rate] = {}
    for path in paths:
        found = calibrate.load(path) if path.is_file() else fitted_rates(path)
        rates |= {key: rate for key, rate in found.items()
                  if key not in rates or not rate.skipped or rates[key].skipped}
    return rates


def fitted_rates(path: Path) -> dict[str, calibrate.Rate]:
    """The rates of the runs under `path`, the best run per key."""
    rates: dict[str, calibrate.Rate] = {}
    for run in (load_run(d) for d in discover_runs(path)):
        # by the config's factors, not its id: an id also covers settings added since the run
        settings = {json.dumps(factors, sort_keys=True): values
                    for _, factors, values in specmod.configs(run.spec)}
        trials = [(settings[key], r) for r in run.records
                  if (key := json.dumps(r.get("config"), sort_keys=True)) in settings]
        fitted = calibrate.fit(run.spec.workload, [(str(run.path), trials)])
        fitted |= calibrate.fit_run_start(run.spec.workload, str(run.path), run.env.get("captured"),
                                          run.records)
        for key, rate in fitted.items():
            if key not in rates or calibrate.better(rate, rates[key]):
                rates[key] = rate
    return rates


STEP_PROFILE = Path("operating_point") / "step_profile.json"  # first-evidence's step profile


def step_profiles(dirs: list[Path]) -> list[tuple[Path, dict[str, Any]]]:
    """The step profiles (workloads.step_profile's JSON) of the collections among `dirs`; a file
    that does not parse is bad input, named."""
    found = []
    for d in dirs:
        path = d / STEP_PROFILE
        if path.is_file():
            try:
                found.append((path, json.loads(path.read_text())))
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}: not a step profile ({exc.msg}, line {exc.lineno})") from None
    return found
