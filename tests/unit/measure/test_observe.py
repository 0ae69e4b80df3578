"""A rank looked at from outside: the request, the observer's answer, and what each look took."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from multicard.measure import observe, telemetry


def test_a_rank_asks_and_the_observer_answers_from_outside_with_how_long_it_took(tmp_path: Path) -> None:
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with observe.Observer(tmp_path) as watcher:
            assert observe.ask(tmp_path, 0, tmp_path / "numa", "rank0")
            watcher.answer_pending()  # what its thread does every POLL_S
            seen = observe.answer(tmp_path, 0, asked=True, timeout_s=5)
    finally:
        worker.kill()
        worker.wait()
    assert seen.reason is None
    assert seen.affinity["rank"] == sorted(os.sched_getaffinity(0))
    assert seen.affinity["workers"][str(worker.pid)] == sorted(os.sched_getaffinity(0))
    assert set(seen.took_s) == {"process_tree_and_affinity", "gpu_processes", "numa_maps"}
    assert all(t >= 0 for t in seen.took_s.values())
    # a CPU machine: no NVML, said so; numa_maps where the kernel has them
    assert seen.gpu_processes is None and "NVML" in str(seen.gpu_processes_reason)
    if Path(f"/proc/{os.getpid()}/numa_maps").exists():
        assert [p["role"] for p in seen.numa or []][:1] == ["rank"]
        assert all(isinstance(node, int) for p in seen.numa or [] for node in p["pages"])
    assert not observe.marker(tmp_path, socket.gethostname()).exists()  # no one watches after


def test_without_an_observer_the_rank_does_not_ask_and_says_why(tmp_path: Path) -> None:
    assert not observe.ask(tmp_path, 0, None, "rank0")
    assert not observe.request_path(tmp_path, 0).exists()
    seen = observe.answer(tmp_path, 0, asked=False)
    assert seen.affinity == {} and "no observer watched this rank" in str(seen.reason)


def test_another_nodes_request_is_left_to_that_nodes_observer(tmp_path: Path) -> None:
    request = {"pid": 1, "host": "elsewhere", "label": "rank3"}
    observe.request_path(tmp_path, 3).write_text(json.dumps(request))
    watcher = observe.Observer(tmp_path)
    watcher.answer_pending()
    assert not observe.answer_path(tmp_path, 3).exists()
    assert "did not answer within 0.1 s" in str(observe.answer(tmp_path, 3, True, timeout_s=0.1).reason)


def test_what_the_observer_saw_on_gpus_folds_into_the_ranks_own_look() -> None:
    looked = telemetry.GpuProcesses("GPU-a")
    looked.fold([(10, "GPU-a", 2 << 30), (11, "GPU-b", 300 << 20)], None)  # a worker's stray context
    found = looked.record()
    assert found["stray_contexts"] == [{"pid": 11, "gpu": "GPU-b", "bytes": 300 << 20, "trains_on": "GPU-a"}]
    nothing = telemetry.GpuProcesses("GPU-a")
    nothing.fold(None, "NVML unavailable: no driver")
    assert nothing.record()["stray_contexts_reason"] == "NVML unavailable: no driver"
    cpu = telemetry.GpuProcesses(None)
    cpu.fold([(10, "GPU-a", 1)], None)
    assert cpu.record()["stray_contexts_reason"] == "CPU run: no GPU"
