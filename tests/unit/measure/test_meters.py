"""A trial's meters as one object: a CPU rank's (RankMeters) and the runner's around a launch
(LaunchMeters), each metric a value or null with its reason."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multicard.measure import energy, observe, telemetry
from multicard.measure.meters import LaunchMeters, RankMeters


def busy(seconds: float) -> None:
    """CPU work in this process (not a sleep): the rank's meters must see CPU time."""
    stop = time.process_time() + seconds
    while time.process_time() < stop:
        pass


def test_a_cpu_ranks_meters_give_each_metric_or_why_not(tmp_path: Path) -> None:
    said: list[str] = []
    with RankMeters(tmp_path, rank=0, local_rank=0, device="cpu", uuid=None,
                    numa_evidence=False) as meters:
        meters.start(lambda: said.append("barrier"))
        busy(0.2)
        meters.snapshot()  # no runner watches: nothing is asked
        meters.finish()
    record = meters.record(train_time=0.2)
    assert said == ["barrier"]
    assert record["rank_cpu_s"] >= 0.15 and record["cpu_reason"] is None  # busy(0.2) burnt 0.2 s
    assert record["gpu_util_mean"] is None
    assert record["gpu_energy_j"] is None and record["gpu_energy_reason"]
    assert record["measures_cpu"] is True  # local rank 0 reads the node's CPU packages
    assert record["cpu_energy_j"] is not None or record["cpu_energy_reason"]
    assert record["stray_contexts"] is None and record["stray_contexts_reason"] == "CPU run: no GPU"
    assert record["observed_reason"] == "no observer watched this rank (started without multicard's runner)"
    assert "local_page_fraction" not in record  # no placement probe without numa_evidence


def test_only_a_nodes_first_rank_reads_the_cpu_packages_and_the_probe_reports(tmp_path: Path) -> None:
    with RankMeters(tmp_path, rank=3, local_rank=1, device="cpu", uuid=None,
                    numa_evidence=True) as meters:
        meters.start(lambda: None)
    record = meters.record(train_time=0.1)
    assert record["measures_cpu"] is False and record["cpu_energy_j"] is None
    assert record["numa_workers_seen"] == 0 and "local_page_fraction" in record


def test_the_runner_answers_a_snapshot_off_the_ranks_clock(tmp_path: Path) -> None:
    with observe.Observer(tmp_path), RankMeters(tmp_path, rank=0, local_rank=0, device="cpu",
                                                uuid=None, numa_evidence=False) as meters:
        meters.start(lambda: None)
        meters.snapshot()
        meters.finish()
        record = meters.record(train_time=0.1)
    assert record["observed_reason"] is None
    assert record["affinity"]["rank"]  # the CPUs this process may run on, seen from outside


def test_an_error_in_the_timed_region_ends_every_window(tmp_path: Path) -> None:
    meters = RankMeters(tmp_path, rank=0, local_rank=0, device="cpu", uuid=None, numa_evidence=False)
    with pytest.raises(RuntimeError), meters:
        meters.start(lambda: None)
        raise RuntimeError("a rank failed mid-epoch")
    assert meters.record(train_time=1.0)["rank_cpu_s"] is not None  # the window was closed


def test_a_launch_measured_from_outside_records_its_tree_and_files(tmp_path: Path) -> None:
    meters = LaunchMeters([], sample=True)
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time() + 0.3\n"
                              "while time.process_time() < t: pass\ntime.sleep(0.6)"])
    with meters:
        meters.start(child.pid)
        meters.snapshot()  # nothing to ask: it samples on its own
        child.wait()
    metrics, unmeasured = meters.record(tmp_path)
    assert metrics["launch_cpu_s"] >= 0.25
    assert metrics["peak_process_mem_bytes"] > 0
    assert metrics["peak_device_mem_bytes"] is None
    assert unmeasured["peak_device_mem_bytes"] == "CPU run: no GPU"
    series = json.loads((tmp_path / energy.SERIES_FILE).read_text())
    assert series["series"] == [] and series["reason"] == "CPU run: no GPU"
    assert (tmp_path / telemetry.PROCESSES_FILE).is_file()


def test_a_launch_stopped_before_it_started_ends_cleanly(tmp_path: Path) -> None:
    with pytest.raises(TimeoutError), LaunchMeters([], sample=True) as meters:
        raise TimeoutError("the launcher never started")  # no sampling thread to join
    meters.finish()  # a second finish changes nothing
    assert meters.record(tmp_path)[0]["peak_process_mem_bytes"] is None


def test_a_launch_that_measures_itself_gets_nothing_from_outside(tmp_path: Path) -> None:
    with LaunchMeters([], sample=False) as meters:
        meters.start(1)
    assert meters.record(tmp_path) == ({}, {})
    assert list(tmp_path.iterdir()) == []
