"""A process tree as the operating system sees it (/proc, sched_getaffinity): which processes are
below a pid, their resident memory, their CPU seconds (a rank, its threads, its loader workers)
and the CPUs each may run on. Nothing here knows of GPUs (telemetry does).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def stat_cpu_seconds(stat_text: str, ticks: int = CLOCK_TICKS, reaped: bool = False) -> float:
    """utime + stime of one /proc/<pid>/stat line, in seconds (`reaped`: cutime + cstime, the
    children it has waited for). The fields after the command's closing parenthesis (which may
    itself hold spaces and parentheses): utime is the 12th."""
    fields = stat_text.rsplit(")", 1)[1].split()
    first = 13 if reaped else 11
    return (int(fields[first]) + int(fields[first + 1])) / ticks


def cpu_seconds(pids: Sequence[int]) -> tuple[float | None, str | None]:
    """The CPU time so far of the processes (a rank and its loader workers), or None and why."""
    total = 0.0
    for pid in pids:
        try:
            total += stat_cpu_seconds(Path(f"/proc/{pid}/stat").read_text())
        except (OSError, IndexError, ValueError) as exc:
            return None, f"/proc/{pid}/stat: {exc}"
    return total, None


def affinities(pid: int, workers: Sequence[int]) -> dict[str, Any]:
    """The CPUs a rank and each of its live workers may run on (pytorch#101850: they can change)."""
    return {"rank": affinity(pid), "workers": {str(w): affinity(w) for w in workers}}


def affinity(pid: int) -> list[int] | None:
    """The CPUs `pid` may run on (its cpuset, taskset, numactl), None where it cannot be read."""
    try:
        return sorted(os.sched_getaffinity(pid))
    except (AttributeError, OSError):
        return None


DALI_THREAD_PREFIX = "[DALI]"  # DALI names its threads "[DALI][TP0]Exec", "[DALI] Executor", ...


def named_threads_cpu(pid: int, prefix: str) -> dict[int, float]:
    """{tid: CPU seconds so far} of the threads of `pid` whose name starts with `prefix`."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().startswith(prefix):
                found[int(task.name)] = stat_cpu_seconds((task / "stat").read_text())
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended while the directory was read
    return found


def threads_seconds(start: Mapping[int, float], end: Mapping[int, float]) -> float:
    """CPU seconds between two readings of the threads alive at the end (a thread started in
    between counts whole; one that ended in between is not in `end`, its time is lost)."""
    return sum(seconds - start.get(tid, 0.0) for tid, seconds in end.items())


class RankUsage:
    """CPU seconds of a rank (its own threads: DALI's, pin_memory's), of DALI's threads alone and
    of its loader workers over the `with` block, and the CPUs each may run on (`affinity`, seen
    mid-epoch from outside: multicard.measure.observe). A worker that ended in the block
    (non-persistent workers end every epoch) is counted through the rank's reaped-children
    times."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.affinity: dict[str, Any] = {}
        self.reason: str | None = None
        self._start: tuple[float, float] | None = None
        self._end: tuple[float, float] | None = None
        self._dali: list[dict[int, float]] = []

    def _times(self, tries: int = 3) -> tuple[float, float] | None:
        try:
            live = 0.0
            for pid in set(process_tree(self.pid)) - {self.pid}:
                live += stat_cpu_seconds(Path(f"/proc/{pid}/stat").read_text())
            # last: a worker reaped after the listing is in the rank's reaped-children times
            own_text = Path(f"/proc/{self.pid}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError) as exc:  # a worker ended meanwhile
            if tries > 1:
                return self._times(tries - 1)
            self.reason = f"/proc: {exc}"
            return None
        except (OSError, IndexError, ValueError) as exc:
            self.reason = f"/proc: {exc}"
            return None
        return stat_cpu_seconds(own_text), live + stat_cpu_seconds(own_text, reaped=True)

    def __enter__(self) -> RankUsage:
        self._start = self._times()
        self._dali = [self._dali_threads()]
        return self

    def mark_start(self) -> None:
        """The measured window starts now (after the ranks' barrier: the timed region)."""
        self.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._end = self._times()
        self._dali.append(self._dali_threads())

    def _dali_threads(self) -> dict[int, float]:
        try:
            return named_threads_cpu(self.pid, DALI_THREAD_PREFIX)
        except OSError:  # /proc/<pid>/task unreadable: the rank's total still holds them
            return {}

    def record(self, seconds: float) -> dict[str, Any]:
        """rank_cpu_s (DALI's threads included), dali_threads_cpu_s, workers_cpu_s and the mean
        CPU use in cores over `seconds`."""
        dali = self._dali[-1] if len(self._dali) == 2 else {}
        why = ("DALI's threads ended before training did (their time is in rank_cpu_s only)"
               if self._dali and self._dali[0] else "no DALI thread in this rank")
        threads = {"dali_threads_cpu_s": threads_seconds(self._dali[0], dali) if dali else None,
                   "dali_threads_reason": None if dali else why}
        if self._start is None or self._end is None:
            return {"rank_cpu_s": None, "workers_cpu_s": None, "cpu_cores_mean": None,
                    "cpu_reason": self.reason or "not read", "affinity": self.affinity, **threads}
        rank, workers = (end - start for start, end in zip(self._start, self._end, strict=True))
        return {"rank_cpu_s": rank, "workers_cpu_s": workers,
                "cpu_cores_mean": (rank + workers) / seconds if seconds > 0 else None,
                "cpu_reason": None, "affinity": self.affinity, **threads}


def process_tree(root: int) -> dict[int, int]:
    """pid -> RSS bytes of `root` and every process below it (/proc, one pass).

    A trial's ranks are not in its process group: torchrun starts every rank in a session of its
    own, so the tree of parent links is what finds them (and their DataLoader workers)."""
    page = os.sysconf("SC_PAGE_SIZE")
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parents[int(entry.name)] = int(fields[1])  # fields after the name: state, ppid, ...
            rss[int(entry.name)] = int((entry / "statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    return {pid: rss[pid] for pid in descendants(root, parents) if pid in rss}


def descendants(root: int, parents: dict[int, int]) -> set[int]:
    """`root` and every pid whose chain of parents reaches it."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def tree_rss_bytes(root: int) -> int:
    """Summed RSS of `root` and its descendants."""
    return sum(process_tree(root).values())
