"""A trial's meters behind one object, with one life for both kinds: a context manager around the
measured region, `start` (where it starts), `snapshot` (mid-run, where a look from outside is
wanted), `finish` (where it ends; leaving the block finishes too) and `record` (the metrics, each
null with its reason where it could not be measured).

- `RankMeters`: inside one vision rank, over its timed epochs: GPU utilisation, the GPU's energy,
  the node's CPU energy (the first rank of a node), CPU seconds of the rank, its threads and its
  loader workers, device memory per process per GPU, DRAM counters and the NUMA placement probe.
- `LaunchMeters`: from the runner, around a launch it waits for (an LLM recipe, whose ranks are
  torchtune's and so measured from outside): peak memory of the launch's process tree and of its
  GPUs, the GPUs' energy series (an LLM trial's energy per token is read off it between logged
  steps), stray contexts, and the CPU seconds of the whole launch.

A rank's record keeps its reasons beside its values (vision combines the ranks'); a launch's
record is (metrics, reasons).

Nothing here imports torch: a rank passes its barrier in.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from multicard.measure import counters, devices, energy, numa, observe, processes, telemetry
from multicard.measure.timing import start_together


class RankMeters:
    """Every meter of one rank's timed epochs. Use it as a context manager around the timed
    region, so that an error ends every window (and a sampler's thread) too."""

    def __init__(self, out: Path, rank: int, local_rank: int, device: str, uuid: str | None,
                 numa_evidence: bool) -> None:
        self.out, self.rank = out, rank
        self.util = telemetry.GpuUtilSampler(uuid)
        # each rank its GPU's energy; the first rank of a node its CPU packages' (node level)
        self.gpu_energy = energy.GpuEnergyMeter(uuid)
        self.cpu_energy = energy.CpuEnergyMeter() if local_rank == 0 else None
        self.usage = processes.RankUsage()  # CPU seconds of the rank and its workers, their affinity
        self.gpu_processes = telemetry.GpuProcesses(uuid)  # memory per process per GPU, strays
        self.probe = numa.PlacementProbe(out / "numa", f"rank{rank}", device, local_rank, uuid) \
            if numa_evidence else None
        self._windows = ExitStack()
        self._asked = False  # whether the runner was asked to look at this rank (observe)

    def __enter__(self) -> RankMeters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()

    def start(self, barrier: Callable[[], None]) -> float:
        """Enter every meter, meet the other ranks, start every window; returns the clock's start.
        The GPU's meters last, so their windows start after, and end before, the others' reads."""
        cpu = [self.cpu_energy] if self.cpu_energy else []
        return start_together([self.usage, counters.Window(), *cpu, self.util, self.gpu_energy],
                              barrier, self._windows)

    def snapshot(self) -> None:
        """Mid-epoch, with the workers alive: ask the runner to look at this rank from outside
        (one small file here; the scans run off the rank's clock)."""
        self._asked = observe.ask(self.out, self.rank, self.probe.out_dir if self.probe else None,
                                  f"rank{self.rank}")

    def finish(self) -> None:
        """End every window here, where the timed region ends (closing twice is harmless)."""
        self._windows.close()

    def record(self, train_time: float) -> dict[str, Any]:
        """The rank's metrics. First a last look at the GPUs' process lists and the runner's
        answer to `snapshot` (both off the clock)."""
        self.gpu_processes.look()
        seen = observe.answer(self.out, self.rank, self._asked)
        self.usage.affinity = seen.affinity
        self.gpu_processes.fold(seen.gpu_processes, seen.gpu_processes_reason or seen.reason)
        return {
            "gpu_util_mean": self.util.mean(),
            **energy.rank_record(self.gpu_energy.energy(),
                                 self.cpu_energy.energy() if self.cpu_energy else None),
            **self.usage.record(train_time),
            **self.gpu_processes.record(),
            "observed_s": seen.took_s,  # how long each look from outside took (off the clock)
            "observed_reason": seen.reason,
            **(self.probe.finish(seen.numa) if self.probe else {}),
        }


class LaunchMeters:
    """What the runner measures around a launch it waits for. Build it before the launch: that
    is when the memory others hold on the trial's GPUs is read. `sample`: False measures nothing
    (the workload measures itself, or its ranks are no children of the runner). Use it as a
    context manager around the wait, so that a timeout or a stop request ends the sampling too."""

    METRICS = ("peak_process_mem_bytes", "peak_device_mem_bytes", "stray_contexts",
               "launch_cpu_s", "launch_cpu_cores_mean")

    def __init__(self, gpus: list[devices.GpuIdentity], sample: bool) -> None:
        self.sampler = telemetry.TrialMemorySampler(gpus) if sample else None
        # CPU of every process of the launch that was waited for, start-up and loading included
        self._cpu_start, self._wall_start = children_cpu_seconds(), time.monotonic()
        self._cpu_s = self._wall_s = 0.0
        self._sampling = ExitStack()
        self._finished = False

    def __enter__(self) -> LaunchMeters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()

    def start(self, root_pid: int) -> None:
        """Sample the launch's process tree from `root_pid` on, in a thread, until `finish`."""
        if self.sampler:
            self._sampling.enter_context(self.sampler.watch(root_pid))

    def snapshot(self) -> None:
        """Nothing to ask: the sampler looks at the launch every period on its own."""

    def finish(self) -> None:
        """The launch has been waited for: sampling, its CPU seconds and wall time end here
        (finishing twice is harmless)."""
        if self._finished:
            return
        self._finished = True
        self._sampling.close()
        self._cpu_s = children_cpu_seconds() - self._cpu_start
        self._wall_s = time.monotonic() - self._wall_start

    def record(self, trial_dir: Path) -> tuple[dict[str, Any], dict[str, str]]:
        """(metrics, why each null one is null); the raw energy series and GPU process list
        are written beside the trial's other files."""
        if self.sampler is None:
            return {}, {}
        self.sampler.write_energy(trial_dir / energy.SERIES_FILE)
        self.sampler.write_processes(trial_dir / telemetry.PROCESSES_FILE)
        cpu = {"launch_cpu_s": self._cpu_s,
               "launch_cpu_cores_mean": self._cpu_s / self._wall_s if self._wall_s > 0 else None}
        return {**self.sampler.metrics(), **cpu}, self.sampler.unmeasured()


def children_cpu_seconds() -> float:
    """User + system CPU seconds of every child this process has waited for (and of theirs):
    torchrun waits for its ranks, a rank for its workers, so a launch's whole tree."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
