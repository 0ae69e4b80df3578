"""Test helpers: repository paths and a tiny CPU vision spec."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import tomli_w

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"
EXPERIMENTS = ROOT / "experiments"

# Small enough that a 2-rank gloo trial takes a few seconds on 2 cores.
TINY_FIXED = {
    "device": "cpu", "image_size": 32, "epochs": 2, "max_steps": 3, "batch_size": 8,
    "num_workers": 0, "warmup_steps": 1, "train_subset": 256, "test_subset": 64,
}


def load_script(path: Path, name: str) -> ModuleType:
    """A script that is not in a package (noxfile.py, benchmarks/*.py) as a module."""
    loader = importlib.util.spec_from_file_location(name, path)
    assert loader is not None and loader.loader is not None
    module = importlib.util.module_from_spec(loader)
    sys.modules[name] = module  # a dataclass in it looks its module up while it is defined
    loader.loader.exec_module(module)
    return module


def write_spec(directory: Path, name: str = "tiny", fixed: dict | None = None,
               grid: dict | None = None, trials: dict | None = None,
               experiment_workload: str = "vision", **sections: dict) -> Path:
    """A valid spec file `<directory>/<name>.toml` (sections override the defaults)."""
    doc = {
        "experiment": {"name": name, "title": f"{name} test experiment",
                       "workload": experiment_workload},
        "fixed": TINY_FIXED if fixed is None else fixed,
        "grid": grid or {"precision": ["fp32", "bf16"]},
        "trials": trials or {"count": 1, "timeout_s": 300},
        **sections,
    }
    path = directory / f"{name}.toml"
    path.write_text(tomli_w.dumps(doc))
    return path



@contextmanager
def tmpfs(target: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at `target` with `options` (e.g. "ro,size=1m"): a real read-only or small
    file system, which root cannot write past as it can past permission bits. Skips the test
    where mounting is not permitted."""
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs ({options}) here: {done.stderr.decode().strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def trial_timeout(default_s: float) -> float:
    """A test trial's timeout: `default_s`, or less where $MULTICARD_TEST_DEADLINE (tools/gpu_tests.py)
    leaves less, so that the session still ends by itself and prints its failures."""
    import time

    from tests.conftest import deadline

    ends = deadline()
    return default_s if ends is None else max(30.0, min(default_s, ends - time.time() + 30.0))


def gpu_run(directory: Path, experiment: str, times: dict[tuple[Any, ...], list[float]],
            metric: str, also: dict[str, float] | None = None) -> Path:
    """A run of a shipped experiment's paper profile (device cuda) with hand-made records;
    `also`: more metrics, the same in every trial."""
    from multicard.plan import spec
    from multicard.run import store

    s = spec.load(EXPERIMENTS / f"{experiment}.toml")
    directory.mkdir(parents=True)
    (directory / "spec.toml").write_text(spec.to_toml(s))
    ids = {tuple(c.values()): (cid, c) for cid, c, _ in spec.configs(s)}
    for key, values in times.items():
        cid, config = ids[key]
        for trial, t in enumerate(values):
            store.append(directory / "trials.jsonl", {
                "schema": 1, "experiment": s.name, "config_id": cid, "config": config,
                "trial": trial, "status": "ok", "started": "2026-01-01T00:00:00+00:00",
                "wall_s": 3600.0, "metrics": {metric: t, **(also or {})}, "error": None, "artifacts": []})
    return directory
