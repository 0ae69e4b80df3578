"""Run directories as the report reads them: found, loaded, torn lines counted."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multicard import gpu_state, store
from multicard import spec as specmod
from multicard.errors import InputError
from multicard.spec import Spec


@dataclass(frozen=True)
class RunData:
    path: Path
    spec: Spec
    env: dict[str, Any]
    records: list[dict[str, Any]]
    planned: int
    torn_lines: list[int] = field(default_factory=list)  # lines of trials.jsonl that were skipped
    gpus_at_end: list[dict[str, Any]] = field(default_factory=list)  # gpu_state.END_FILE


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
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    records, torn = store.read_with_skipped(path / store.TRIALS_FILE)
    store.warn_skipped(path / store.TRIALS_FILE, torn)
    timing = [p for p in specmod.plan(spec) if p.trace == "none"]
    end = path / gpu_state.END_FILE
    gpus_at_end = json.loads(end.read_text()).get("gpus", []) if end.is_file() else []
    return RunData(path, spec, env, records, planned=len(timing), torn_lines=torn, gpus_at_end=gpus_at_end)
