from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multicard import resources
from multicard.resources import StrayContext

# /proc/<pid>/stat of a DataLoader worker: a command with a space and parentheses
STAT = ("4242 (pt_data_worker (1)) S 4200 4200 4100 0 -1 4194304 12000 0 0 0 "
        "730 125 0 0 20 0 1 0 555555 1000000000 20000 18446744073709551615")


def test_cpu_seconds_read_past_a_command_with_parentheses() -> None:
    assert resources.stat_cpu_seconds(STAT, ticks=100) == pytest.approx(8.55)


def test_this_process_has_cpu_time_and_an_affinity() -> None:
    seconds, why = resources.cpu_seconds([os.getpid()])
    assert why is None and seconds is not None and seconds > 0
    assert resources.affinity(os.getpid()) == sorted(os.sched_getaffinity(0))
    missing, why = resources.cpu_seconds([2**22 + 1])  # above pid_max's default
    assert missing is None and "/proc/" in str(why)


def test_a_rank_holding_memory_on_another_gpu_is_a_stray_context() -> None:
    # two ranks on GPU-a and GPU-b; rank 1 (pid 20) and its pinning thread hold 500 MiB on GPU-a
    trains_on = {10: "GPU-a", 11: "GPU-a", 20: "GPU-b", 21: "GPU-b"}
    held = {"GPU-a": [(10, 8 << 30), (20, 500 << 20), (999, 1 << 30)],  # 999: someone else's
            "GPU-b": [(20, 8 << 30), (21, None)]}
    assert resources.stray_contexts(trains_on, held) == [StrayContext(20, "GPU-a", 500 << 20, "GPU-b")]
    assert resources.stray_contexts(trains_on, {"GPU-a": [(10, 1)], "GPU-b": [(20, 1)]}) == []


def test_reaped_children_have_their_own_fields() -> None:
    assert resources.stat_cpu_seconds(STAT, ticks=100, reaped=True) == 0.0  # cutime, cstime: 0 0


def test_a_rank_counts_its_workers_even_the_ended_ones() -> None:
    burn = [sys.executable, "-c",
            "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"]
    with resources.RankUsage() as usage:
        live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        subprocess.run(burn, check=True)  # a worker that ends (and is reaped) inside the block
        usage.affinity = resources.affinities(os.getpid(), [live.pid])  # as the observer sees it
    live.kill()
    live.wait()
    found = usage.record(seconds=1.0)
    # /proc counts whole clock ticks, and the reading is a difference of float sums: 30 ticks
    # may read 0.29999999999999716, so one tick of slack
    assert found["workers_cpu_s"] >= 0.3 - 1 / resources.CLOCK_TICKS and found["rank_cpu_s"] >= 0
    assert found["cpu_cores_mean"] == pytest.approx(found["rank_cpu_s"] + found["workers_cpu_s"])
    assert found["affinity"]["rank"] == sorted(os.sched_getaffinity(0))
    assert found["affinity"]["workers"][str(live.pid)] == sorted(os.sched_getaffinity(0))


def test_named_threads_are_read_from_proc_and_their_time_adds_up() -> None:
    import threading

    done = threading.Event()

    def burn() -> None:
        t = time.thread_time()
        while time.thread_time() - t < 0.2:
            pass
        done.wait(10)

    worker = threading.Thread(target=burn)
    worker.start()
    try:
        time.sleep(0.3)
        native = worker.native_id
        Path(f"/proc/self/task/{native}/comm").write_text("[DALI][TP0]Exec")
        found = resources.named_threads_cpu(os.getpid(), resources.DALI_THREAD_PREFIX)
    finally:
        done.set()
        worker.join()
    assert list(found) == [native] and found[native] >= 0.15
    assert resources.threads_seconds({native: 0.1, 99: 5.0}, {native: 0.4, 100: 0.2}) == pytest.approx(0.5)


def test_memory_per_process_per_gpu_and_strays_seen_while_they_lived(monkeypatch: pytest.MonkeyPatch) -> None:
    from multicard import telemetry

    me = os.getpid()
    looks = iter([({"GPU-a": [(me, 4 << 30)], "GPU-0": [(me, 300 << 20), (1, 9)]}, None),
                  ({"GPU-a": [(me, 6 << 30)], "GPU-0": []}, None)])  # the stray one ended
    monkeypatch.setattr(telemetry, "processes_on_gpus", lambda: next(looks))
    seen = resources.GpuProcesses("GPU-a")
    seen.look()
    seen.look()
    found = seen.record()
    assert found["gpu_memory_by_process"] == [{"pid": me, "gpu": "GPU-0", "bytes": 300 << 20},
                                              {"pid": me, "gpu": "GPU-a", "bytes": 6 << 30}]
    assert found["stray_contexts"] == [{"pid": me, "gpu": "GPU-0", "bytes": 300 << 20, "trains_on": "GPU-a"}]
    assert resources.GpuProcesses(None).record()["stray_contexts_reason"] == "CPU run: no GPU"
    mig = resources.GpuProcesses("MIG-5c1c")
    mig.look()
    assert mig.record()["stray_contexts"] is None
    assert mig.record()["stray_contexts_reason"] == (
        "a MIG instance: NVML's process lists are per physical GPU")


def test_from_outside_a_process_on_two_trial_gpus_strays_on_the_smaller() -> None:
    # a 2-GPU trial: rank 20 trains on GPU-b and its pinning thread holds 300 MiB on GPU-a; a
    # worker (30) of rank 10 holds memory on GPU-z, which is not the trial's
    held = {(10, "GPU-a"): 8 << 30, (20, "GPU-a"): 300 << 20, (20, "GPU-b"): 8 << 30,
            (30, "GPU-z"): 100 << 20}
    assert resources.strays_seen_from_outside(held, {"GPU-a", "GPU-b"}) == [
        StrayContext(20, "GPU-a", 300 << 20, "GPU-b"),
        StrayContext(30, "GPU-z", 100 << 20, "the trial's GPUs")]
    assert resources.strays_seen_from_outside({(10, "GPU-a"): 1, (20, "GPU-b"): 1}, {"GPU-a", "GPU-b"}) == []
