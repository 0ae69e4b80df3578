"""What a rank's processes use, read from outside its training loop: CPU seconds and the CPUs
it may run on (/proc, sched_getaffinity), and device memory per process per GPU (NVML's
running-process lists).

A process that holds memory on a GPU it does not train on is a stray CUDA context: pin_memory's
pinning thread on GPU 0 (pytorch issues 58626 and 21081) is the known case. It costs memory on
that GPU and skews every per-GPU memory comparison, so the report flags it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class StrayContext:
    pid: int
    gpu: str  # UUID of the GPU the memory is on
    bytes: int | None  # NVML reports None where the driver does not say (no per-process accounting)
    trains_on: str  # UUID of the GPU the process's rank trains on


def stray_contexts(trains_on: Mapping[int, str],
                   held: Mapping[str, Sequence[tuple[int, int | None]]]) -> list[StrayContext]:
    """Every (process of the trial, GPU) where the process holds memory on a GPU other than its
    rank's. `trains_on`: pid -> its rank's GPU (a rank and its workers); `held`: GPU -> (pid,
    bytes) from NVML's running-process list of that GPU. Processes of others are left out."""
    found = []
    for gpu, processes in sorted(held.items()):
        for pid, used in processes:
            own = trains_on.get(pid)
            if own is not None and own != gpu:
                found.append(StrayContext(pid, gpu, used, own))
    return found


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


Held = dict[tuple[int, str], int | None]  # (pid, GPU UUID) -> the most bytes seen


def note_held(held: Held, gpu: str, processes: Sequence[tuple[int, int | None]], mine: set[int]) -> None:
    """Fold one look at a GPU's process list into `held`, keeping only `mine`."""
    for pid, used in processes:
        if pid in mine:
            before = held.get((pid, gpu))
            held[(pid, gpu)] = max(before or 0, used) if used is not None else before


def strays_seen_from_outside(held: Held, trial_gpus: set[str]) -> list[StrayContext]:
    """Stray contexts where which rank trains on which of the trial's GPUs is not known (the
    runner, looking from outside): memory on a GPU that is not the trial's, and, for a process
    on several of the trial's GPUs, every one but the GPU it holds the most on (a rank trains on
    one; pin_memory's context elsewhere is small beside the model)."""
    found = [StrayContext(pid, gpu, used, "the trial's GPUs") for (pid, gpu), used in sorted(held.items())
             if gpu not in trial_gpus]
    on_trial: dict[int, list[tuple[str, int | None]]] = {}
    for (pid, gpu), used in sorted(held.items()):
        if gpu in trial_gpus:
            on_trial.setdefault(pid, []).append((gpu, used))
    for pid, gpus in on_trial.items():
        own = max(gpus, key=lambda g: g[1] or 0)[0]
        found += [StrayContext(pid, gpu, used, own) for gpu, used in gpus if gpu != own]
    return sorted(found, key=lambda f: (f.pid, f.gpu))


def by_process(held: Held) -> list[dict[str, Any]]:
    return [{"pid": pid, "gpu": gpu, "bytes": used} for (pid, gpu), used in sorted(held.items())]


class GpuProcesses:
    """Device memory of a rank's processes on every GPU (NVML's running-process lists), looked
    at while the workers live and again after training: a stray context of a worker that ends
    with its epoch is only seen while it lives."""

    def __init__(self, trains_on: str | None) -> None:
        self.trains_on = trains_on
        self.held: Held = {}
        self.reason: str | None = "CPU run: no GPU" if trains_on is None else "not looked at"
        if trains_on is not None and trains_on.startswith("MIG-"):
            self.reason = "a MIG instance: NVML's process lists are per physical GPU"

    def look(self) -> None:
        if self.trains_on is None or self.trains_on.startswith("MIG-"):
            return
        from multicard import telemetry

        held, why = telemetry.processes_on_gpus()
        if held is None:
            self.reason = why
            return
        mine = {os.getpid(), *telemetry.process_tree(os.getpid())}
        for gpu, processes in held.items():
            note_held(self.held, gpu, processes, mine)
        self.reason = None if self.held else ("NVML lists none of this rank's processes (a container's "
                                              "PID namespace hides the host PIDs NVML reports)")

    def fold(self, processes: Sequence[tuple[int, str, int | None]] | None, why: str | None) -> None:
        """Add what an observer saw from outside mid-epoch (multicard.observe: the rank's and its
        workers' (pid, GPU, bytes)), or keep why it saw nothing where this rank saw nothing either."""
        if self.trains_on is None or self.trains_on.startswith("MIG-"):
            return
        if processes is None:
            if not self.held and why:
                self.reason = why
            return
        for pid, gpu, used in processes:
            note_held(self.held, gpu, [(pid, used)], {pid})
        if self.held:
            self.reason = None

    def record(self) -> dict[str, Any]:
        if self.reason is not None:
            return {"gpu_memory_by_process": None, "stray_contexts": None,
                    "stray_contexts_reason": self.reason}
        by_gpu: dict[str, list[tuple[int, int | None]]] = {}
        for (pid, gpu), used in sorted(self.held.items()):
            by_gpu.setdefault(gpu, []).append((pid, used))
        found = stray_contexts(dict.fromkeys({pid for pid, _ in self.held}, str(self.trains_on)), by_gpu)
        return {"gpu_memory_by_process": by_process(self.held),
                "stray_contexts": [vars(f) for f in found], "stray_contexts_reason": None}


class RankUsage:
    """CPU seconds of a rank (its own threads: DALI's, pin_memory's), of DALI's threads alone and
    of its loader workers over the `with` block, and the CPUs each may run on (`affinity`, seen
    mid-epoch from outside: multicard.observe). A worker that ended in the block
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
        from multicard import telemetry

        try:
            live = 0.0
            for pid in set(telemetry.process_tree(self.pid)) - {self.pid}:
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
