"""Real CPU ranks under numactl: the binding applies and the evidence shows where pages and CPUs are."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from multicard.measure import numa
from multicard.plan import spec
from multicard.run import runner, store
from tests.helpers import DATA, write_spec

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl is not installed")]


def test_local_policy_records_pages_and_cpus_of_every_rank_and_worker(tmp_path: Path) -> None:
    fixed = {"device": "cpu", "image_size": 32, "epochs": 1, "max_steps": 6, "batch_size": 16,
             "num_workers": 1, "warmup_steps": 0, "train_subset": 256, "test_subset": 32,
             "numa_evidence": True, "gpus": 2}
    path = write_spec(tmp_path, fixed=fixed, grid={"numa_policy": ["local"]})
    outcome = runner.run(spec.load(path), tmp_path / "run", data_dir=DATA, echo=lambda _: None)
    assert outcome.ok == 1
    [record] = store.read(tmp_path / "run" / "trials.jsonl")
    launch = json.loads((tmp_path / "run" / record["artifacts"][0]).read_text())
    assert "multicard.run.numa_bind" in launch["argv"] and "local" in launch["argv"]
    evidence = sorted((tmp_path / "run").glob("raw/*/numa/*.numa_maps"))
    roles = sorted({p.name.split("-")[0] + "-" + p.name.split("-")[1] for p in evidence})
    assert roles == ["rank0-rank", "rank0-worker", "rank1-rank", "rank1-worker"]
    topology = numa.live(with_links=False)
    home = numa.home_node(topology, "cpu", 0)
    home_cpus = topology.node(home).cpus  # type: ignore[union-attr]
    for maps in evidence:
        pages = numa.pages_per_node(maps.read_text())
        assert pages and home in pages
        status = maps.with_suffix(".status").read_text()
        assert set(numa.allowed_cpus(status)) <= set(home_cpus)
    m = record["metrics"]
    assert m["cpus_on_gpu_node_fraction"] == 1.0
    assert 0 < m["local_page_fraction"] <= 1
    result = json.loads(next((tmp_path / "run").glob("raw/*/result.json")).read_text())
    assert all(r["numa_workers_inherit_cpus"] for r in result["ranks"])
    assert all(r["numa_workers_seen"] == 1 for r in result["ranks"])
    # each rank's threads: its share of the CPUs it is bound to (the node's, over the 2 ranks on it)
    assert all(r["omp_num_threads"] == str(max(1, len(home_cpus) // 2)) for r in result["ranks"])


def test_torchrun_policies_are_recorded_as_skipped_on_a_cpu_run_with_the_reason(tmp_path: Path) -> None:
    # the numa_binding smoke profile's torchrun policies, as the runner records them here
    smoke = spec.load(Path(__file__).parents[2] / "experiments" / "numa_binding.toml", "smoke")
    assert {"torchrun_node", "torchrun_socket", "torchrun_exclusive"} <= set(smoke.grid["numa_policy"])
    fixed = {"device": "cpu", "image_size": 32, "epochs": 1, "max_steps": 2, "batch_size": 16,
             "num_workers": 0, "warmup_steps": 0, "train_subset": 64, "test_subset": 32, "gpus": 2}
    path = write_spec(tmp_path, fixed=fixed, grid={"numa_policy": ["torchrun_node", "torchrun_exclusive"]})
    outcome = runner.run(spec.load(path), tmp_path / "run", data_dir=DATA, echo=lambda _: None)
    assert (outcome.skipped, outcome.failed) == (2, 0)
    for record in store.read(tmp_path / "run" / "trials.jsonl"):
        assert record["status"] == "skipped" and record["error"]["type"] == "TorchrunBindingNeedsGpu"
        assert "a CPU run has none" in record["error"]["message"]


def test_a_trial_with_counters_runs_and_says_why_this_machine_counted_nothing(tmp_path: Path) -> None:
    from multicard.measure import counters

    events, why = counters.usable_events()
    if events is not None:
        pytest.skip("this machine's CPU offers the counters")
    fixed = {"device": "cpu", "image_size": 32, "epochs": 1, "max_steps": 2, "batch_size": 16,
             "num_workers": 0, "warmup_steps": 0, "train_subset": 64, "test_subset": 32, "gpus": 2,
             "numa_counters": True}
    path = write_spec(tmp_path, fixed=fixed, grid={"numa_policy": ["local"]})
    outcome = runner.run(spec.load(path), tmp_path / "run", data_dir=DATA, echo=lambda _: None)
    assert outcome.ok == 1
    [record] = store.read(tmp_path / "run" / "trials.jsonl")
    launch = json.loads((tmp_path / "run" / record["artifacts"][0]).read_text())
    # inside the rank's binding: numactl's binder, then the counters' wrapper, then the rank
    argv = launch["argv"]
    assert argv.index("multicard.run.numa_bind") < argv.index("multicard.measure.counters") < argv.index(
        "multicard.workloads.vision")
    for metric in counters.METRICS:
        assert record["metrics"][metric] is None and record["unmeasured"][metric] == f"rank 0: {why}"
