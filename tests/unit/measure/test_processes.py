"""A process tree as /proc shows it: its members, their CPU seconds and the CPUs they may run on."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multicard.measure import processes

# /proc/<pid>/stat of a DataLoader worker: a command with a space and parentheses
STAT = ("4242 (pt_data_worker (1)) S 4200 4200 4100 0 -1 4194304 12000 0 0 0 "
        "730 125 0 0 20 0 1 0 555555 1000000000 20000 18446744073709551615")


def test_cpu_seconds_read_past_a_command_with_parentheses() -> None:
    assert processes.stat_cpu_seconds(STAT, ticks=100) == pytest.approx(8.55)


def test_this_process_has_cpu_time_and_an_affinity() -> None:
    seconds, why = processes.cpu_seconds([os.getpid()])
    assert why is None and seconds is not None and seconds > 0
    assert processes.affinity(os.getpid()) == sorted(os.sched_getaffinity(0))
    missing, why = processes.cpu_seconds([2**22 + 1])  # above pid_max's default
    assert missing is None and "/proc/" in str(why)


def test_reaped_children_have_their_own_fields() -> None:
    assert processes.stat_cpu_seconds(STAT, ticks=100, reaped=True) == 0.0  # cutime, cstime: 0 0


def test_a_rank_counts_its_workers_even_the_ended_ones() -> None:
    burn = [sys.executable, "-c",
            "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"]
    with processes.RankUsage() as usage:
        live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        subprocess.run(burn, check=True)  # a worker that ends (and is reaped) inside the block
        usage.affinity = processes.affinities(os.getpid(), [live.pid])  # as the observer sees it
    live.kill()
    live.wait()
    found = usage.record(seconds=1.0)
    # /proc counts whole clock ticks, and the reading is a difference of float sums: 30 ticks
    # may read 0.29999999999999716, so one tick of slack
    assert found["workers_cpu_s"] >= 0.3 - 1 / processes.CLOCK_TICKS and found["rank_cpu_s"] >= 0
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
        found = processes.named_threads_cpu(os.getpid(), processes.DALI_THREAD_PREFIX)
    finally:
        done.set()
        worker.join()
    assert list(found) == [native] and found[native] >= 0.15
    assert processes.threads_seconds({native: 0.1, 99: 5.0}, {native: 0.4, 100: 0.2}) == pytest.approx(0.5)


def test_a_trials_processes_are_its_launchers_tree_not_its_process_group() -> None:
    # torchrun starts each rank in a session of its own: only parent links find them
    parents = {10: 1, 11: 10, 12: 11, 13: 11, 14: 12, 20: 1, 21: 20}
    assert processes.descendants(10, parents) == {10, 11, 12, 13, 14}
    assert processes.descendants(21, parents) == {21}


def test_a_real_child_in_its_own_session_is_in_the_tree() -> None:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             start_new_session=True)
    try:
        tree = processes.process_tree(os.getpid())
        assert os.getpid() in tree and child.pid in tree and tree[child.pid] > 0
        assert os.getpgid(child.pid) != os.getpgrp()
    finally:
        child.kill()
        child.wait()
