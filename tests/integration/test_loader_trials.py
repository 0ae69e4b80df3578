"""Scenario B trials through the runner: DALI on CPU, loader-only mode, a killed DataLoader worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multicard.data import scenario_b
from multicard.plan import spec
from multicard.run import runner, store
from tests.helpers import DATA, ROOT, write_spec
from tests.integration.test_resume import trial_processes

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder with the MNIST originals and a small prepared 32px JPEG tree."""
    root = tmp_path_factory.mktemp("data")
    (root / "mnist").symlink_to(DATA / "mnist", target_is_directory=True)
    scenario_b.prepare(scenario_b.Request(DATA / "mnist", scenario_b.tree_path(root, 32, "jpeg"),
                                          32, "jpeg", 512), workers=2, echo=lambda _: None,
                       progress=False)
    return root


def b_fixed(**extra: object) -> dict:
    return {"device": "cpu", "scenario": "b", "image_size": 32, "epochs": 2, "batch_size": 16,
            "num_workers": 1, "dali_threads": 1, "warmup_steps": 1, "train_subset": 256,
            "test_subset": 64, **extra}


@pytest.mark.e2e  # the fast tier's DALI CPU loader trial
def test_dali_and_synthetic_trials_on_two_ranks(tmp_path: Path, data_root: Path) -> None:
    path = write_spec(tmp_path, fixed=b_fixed(gpus=2), grid={"loader": ["dali", "synthetic"]})
    outcome = runner.run(spec.load(path), tmp_path / "run", data_dir=data_root, echo=lambda _: None)
    assert (outcome.ok, outcome.failed) == (2, 0)
    for record in store.read(tmp_path / "run" / "trials.jsonl"):
        m = record["metrics"]
        # 256 images, 2 ranks, 16 per batch: 8 steps per rank and epoch, 2 epochs
        assert m["throughput_samples_s"] * m["train_time_s"] == pytest.approx(512)
        assert 0 <= m["test_accuracy"] <= 1
        # DALI's threads (in the rank) are counted apart, a part of the rank's time (here a few
        # ms of decoding: /proc counts in 10 ms ticks, so it may read 0); the synthetic loader
        # has none
        if record["config"]["loader"] == "dali":
            assert m["dali_threads_cpu_s"] is not None and 0 <= m["dali_threads_cpu_s"] <= m["rank_cpu_s"]
        else:
            assert m["dali_threads_cpu_s"] is None
            assert record["unmeasured"]["dali_threads_cpu_s"] == "no DALI thread in this rank"
    assert "32px-jpeg" in (tmp_path / "run" / "datasets.json").read_text()


def test_loader_only_mode_trains_nothing(tmp_path: Path, data_root: Path) -> None:
    path = write_spec(tmp_path, fixed=b_fixed(mode="loader_only"), grid={"loader": ["torch"]})
    runner.run(spec.load(path), tmp_path / "run", data_dir=data_root, echo=lambda _: None)
    [record] = store.read(tmp_path / "run" / "trials.jsonl")
    m = record["metrics"]
    assert record["status"] == "ok" and m["test_accuracy"] is None
    assert m["throughput_samples_s"] > 0 and m["train_loss"] == 0
    assert m["workers_cpu_s"] > 0  # the loader's one worker decoded every image
    result = json.loads((tmp_path / "run" / f"raw/{record['config_id']}-t0-a0/result.json").read_text())
    [rank] = result["ranks"]
    # the worker, alive mid-epoch, and the CPUs it may run on
    assert list(rank["affinity"]["workers"].values()) == [sorted(os.sched_getaffinity(0))]


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _worker_of(marker: str) -> int | None:
    """A DataLoader worker: the third generation of processes that name the run directory
    (runner -> rank -> worker: a one-rank trial starts without torchrun's agent)."""
    pids = set(trial_processes(marker))
    for pid in pids:
        try:
            chain = [pid, _parent(pid)]
            chain.append(_parent(chain[-1]))
        except (OSError, ValueError, IndexError):
            continue
        if all(p in pids for p in chain):
            return pid
    return None


def test_a_killed_worker_is_a_failed_trial_with_its_cause(tmp_path: Path) -> None:
    fixed = {"device": "cpu", "image_size": 32, "epochs": 40, "batch_size": 16, "num_workers": 1,
             "persistent_workers": True, "warmup_steps": 0, "train_subset": 2048,
             "test_subset": 32}
    path = write_spec(tmp_path, fixed=fixed, grid={"gpus": [1]})
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "multicard", "run", str(path), "--out", str(out)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, worker = time.monotonic() + 120, None
    while worker is None and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
        worker = _worker_of(str(out))
    assert worker is not None, "no DataLoader worker appeared"
    time.sleep(2)  # let training get going
    os.kill(worker, signal.SIGKILL)
    assert proc.wait(timeout=120) == 0  # the sweep itself does not crash
    [record] = store.read(out / "trials.jsonl")
    assert record["status"] == "failed"
    assert record["error"]["type"] == "DataLoaderWorkerKilled"
    assert f"pid {worker}" in record["error"]["message"]
