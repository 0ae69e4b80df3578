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

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def stat_cpu_seconds(stat_text: str, ticks: int = CLOCK_TICKS) -> float:
    """utime + stime of one /proc/<pid>/stat line, in seconds. The fields after the command's
    closing parenthesis (which may itself hold spaces and parentheses): utime is the 12th."""
    fields = stat_text.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks


def cpu_seconds(pids: Sequence[int]) -> tuple[float | None, str | None]:
    """The CPU time so far of the processes (a rank and its loader workers), or None and why."""
    total = 0.0
    for pid in pids:
        try:
            total += stat_cpu_seconds(Path(f"/proc/{pid}/stat").read_text())
        except (OSError, IndexError, ValueError) as exc:
            return None, f"/proc/{pid}/stat: {exc}"
    return total, None


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
