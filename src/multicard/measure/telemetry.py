"""The GPUs' view of a trial, through NVML (nvidia-ml-py): utilisation sampled while a rank
trains, device memory per process per GPU, and the trial's memory and energy sampled from outside.

A process that holds memory on a GPU it does not train on is a stray CUDA context: pin_memory's
pinning thread on GPU 0 (pytorch issues 58626 and 21081) is the known case. It costs memory on
that GPU and skews every per-GPU memory comparison, so the report flags it.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from multicard import integrity
from multicard.measure import devices, nvml
from multicard.measure.processes import process_tree

# NVML's utilisation is the share of its last sample period (1/6 s to 1 s by product) in which a
# kernel ran: a sample in the first second of a window still averages time from before it.
NVML_UTIL_LAG_S = 1.0


class GpuUtilSampler:
    """Samples `nvmlDeviceGetUtilizationRates(...).gpu` every `period_s` in a daemon thread.

    NVML counts the share of time in which at least one kernel ran, so it shows idle gaps (data
    stalls, pre-epoch pauses), not how full the SMs were. The mean counts the samples taken
    `lag_s` or more after the window's start (all since the start, in a window shorter than
    that). `uuid=None` (a CPU run) samples nothing.
    """

    def __init__(self, uuid: str | None, period_s: float = 0.1, lag_s: float = NVML_UTIL_LAG_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.uuid = uuid
        self.period_s = period_s
        self.lag_s = lag_s
        self.clock = clock
        self.samples: list[tuple[float, int]] = []  # (clock, percent): appended by the thread only
        self.start = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuUtilSampler:
        if self.uuid is None:
            return self
        try:
            pynvml = nvml.bindings()

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByUUID(self.uuid)
        except Exception:  # no NVML, or a device it cannot name (MIG): report no utilisation
            return self
        self._thread = threading.Thread(target=self._sample, args=(pynvml, handle), daemon=True)
        self._thread.start()
        return self

    def _sample(self, pynvml: object, handle: object) -> None:
        while not self._stop.wait(self.period_s):
            percent = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu  # type: ignore[attr-defined]
            self.samples.append((self.clock(), percent))

    def mark_start(self) -> None:
        """The measured window starts now (after the ranks' barrier): the samples before it,
        the wait at the barrier among them, do not count."""
        self.start = self.clock()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def mean(self) -> float | None:
        """Mean utilisation as a fraction in [0, 1], or None with no samples in the window."""
        window = [percent for t, percent in self.samples if t >= self.start]
        settled = [percent for t, percent in self.samples if t >= self.start + self.lag_s]
        counted = settled or window
        return sum(counted) / len(counted) / 100.0 if counted else None


def visible_gpus() -> list[devices.GpuIdentity]:
    """The GPUs a trial's CUDA will see (CUDA_VISIBLE_DEVICES applied); [] without a driver."""
    return devices.from_environment()


def visible_gpu_count() -> int:
    return len(visible_gpus())


Processes = list[tuple[int, int | None]]  # (pid, device bytes NVML charges it; None: not reported)


def trial_device_bytes(processes: Processes, trial_pids: set[int], used_now: int,
                       used_before: int) -> tuple[int, str]:
    """Device memory of one trial at one instant, and how it was counted.

    `per-process`: what NVML charges the trial's own processes, so other users of the same GPUs
    are not counted. Where NVML names none of them, or gives no per-process numbers (inside a
    container NVML reports host PIDs, which the container's PID namespace does not show), the
    growth of the GPUs' used memory over what was in use before the launch: `device-delta`.
    """
    mine = [used for pid, used in processes if pid in trial_pids]
    if mine and all(used is not None for used in mine):
        return sum(used for used in mine if used is not None), "per-process"
    return max(0, used_now - used_before), "device-delta"


def own_device_bytes(processes: Processes, pid: int) -> tuple[int | None, str | None]:
    """(bytes NVML charges process `pid`, None) or (None, why it cannot be read)."""
    mine = [used for p, used in processes if p == pid]
    if not mine:
        return None, ("NVML lists no process with this PID on the GPU (a container's PID namespace "
                      "hides the host PIDs that NVML reports)")
    if any(used is None for used in mine):
        return None, "NVML does not report per-process memory on this system"
    return sum(used for used in mine if used is not None), None


def _nvml_processes(pynvml: Any, handle: Any) -> Processes:
    return [(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]


def _nvml_started() -> tuple[Any, str | None]:
    """NVML's bindings, initialised: (pynvml, None), or (None, why not)."""
    try:
        pynvml = nvml.bindings()

        pynvml.nvmlInit()
    except Exception as exc:  # no driver or library
        return None, f"NVML unavailable: {exc}"
    return pynvml, None


@contextlib.contextmanager
def _nvml_session() -> Iterator[tuple[Any, str | None]]:
    """NVML initialised for the block and shut down after it: (pynvml, None), or (None, why not)."""
    pynvml, why = _nvml_started()
    try:
        yield pynvml, why
    finally:
        if pynvml is not None:
            pynvml.nvmlShutdown()


def rank_device_bytes(gpu: devices.GpuIdentity) -> tuple[int | None, str | None]:
    """What NVML charges this process on `gpu` now: CUDA context, the caching allocator's
    reserve, DALI's and NCCL's pools (torch's allocator counters see only its own tensors)."""
    with _nvml_session() as (pynvml, why):
        if pynvml is None:
            return None, why
        try:
            return own_device_bytes(_nvml_processes(pynvml, devices.nvml_handle(pynvml, gpu)), os.getpid())
        except pynvml.NVMLError as exc:
            return None, f"NVML: {exc}"


def processes_on_gpus() -> tuple[dict[str, Processes] | None, str | None]:
    """NVML's compute processes of every GPU of the machine (UUID -> (pid, bytes)), or None
    and why not."""
    with _nvml_session() as (pynvml, why):
        if pynvml is None:
            return None, why
        try:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            return {_uuid(pynvml, h): _nvml_processes(pynvml, h) for h in handles}, None
        except pynvml.NVMLError as exc:
            return None, f"NVML: {exc}"


PROCESSES_FILE = "gpu_processes.json"  # per (process, GPU) the most device memory seen


class TrialMemorySampler:
    """Peak memory of a running trial, sampled from outside every `period_s`.

    `peak_process_mem_bytes`: the summed resident set of the trial's launcher and every process
    below it (/proc). `peak_device_mem_bytes`: device memory of the trial on the trial's GPUs (the
    first `gpus` that CUDA shows it), counted as `trial_device_bytes` says; includes what the
    framework does not see (CUDA contexts, NCCL buffers). `peak_device_mem_source` says how.
    `stray_contexts`: how many (process, GPU) pairs of the trial held memory where a rank does
    not train (strays_seen_from_outside; every GPU's process list is looked at each
    period; PROCESSES_FILE keeps them).
    Build it before the launch: that is when the GPUs' memory in use by others is read.
    """

    def __init__(self, gpus: list[devices.GpuIdentity], period_s: float = 0.25) -> None:
        self.gpus, self.period_s = gpus, period_s
        self.root = 0
        self.peak_rss = 0
        self.peaks: dict[str, int] = {}
        self.device_error: str | None = None  # why device memory stopped being sampled
        # (wall seconds, the trial GPUs' summed energy counters in mJ): energy over any window
        # of the trial, e.g. the logged steps of an LLM recipe (multicard.measure.energy.energy_between)
        self.energy_series: list[tuple[float, int]] = []
        self.energy_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._nvml: Any = _nvml_started()[0] if gpus else None
        self._handles: list[Any] = []
        self._every: dict[str, Any] = {}  # UUID -> handle of every GPU of the machine
        self.held: Held = {}
        self.trial_uuids: set[str] = set()
        self.used_before = 0
        if self._nvml:
            try:
                self._handles = [devices.nvml_handle(self._nvml, g) for g in gpus]
            except self._nvml.NVMLError as exc:
                self.device_error = self.energy_error = f"NVML: {exc}"
        if self._handles:
            # memory and process lists apart from the energy counter: one failing (e.g.
            # NOT_SUPPORTED inside a sandbox) must not stop the other
            try:
                self._every = {_uuid(self._nvml, h): h for h in (
                    self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self._nvml.nvmlDeviceGetCount()))}
                self.trial_uuids = {_uuid(self._nvml, h) for h in self._handles}
                self.used_before = self._sample()[1]
            except self._nvml.NVMLError as exc:
                self.device_error = f"NVML: {exc}"

    def watch(self, root_pid: int) -> TrialMemorySampler:
        self.root = root_pid
        return self

    def __enter__(self) -> TrialMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._nvml:
            self._nvml.nvmlShutdown()

    def _sample(self) -> tuple[Processes, int]:
        processes: Processes = []
        used = 0
        for handle in self._handles:
            used += int(self._nvml.nvmlDeviceGetMemoryInfo(handle).used)
            processes += _nvml_processes(self._nvml, handle)
        return processes, used

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            tree = process_tree(self.root)
            self.peak_rss = max(self.peak_rss, sum(tree.values()))
            if not self._handles:
                continue
            self._sample_energy()  # apart from memory: one failing must not stop the other
            if self.device_error:
                continue
            try:
                processes, used = self._sample()
            except self._nvml.NVMLError as exc:
                self.device_error = f"NVML: {exc}"
                continue
            value, source = trial_device_bytes(processes, set(tree), used, self.used_before)
            self.peaks[source] = max(self.peaks.get(source, 0), value)
            try:
                for uuid, handle in self._every.items():
                    note_held(self.held, uuid, _nvml_processes(self._nvml, handle), set(tree))
            except self._nvml.NVMLError as exc:
                self.device_error = f"NVML: {exc}"

    def _sample_energy(self) -> None:
        if self.energy_error:
            return
        try:
            total = sum(int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self._handles)
        except self._nvml.NVMLError as exc:  # before Volta: not supported
            self.energy_error = f"NVML's energy counter: {exc}"
            return
        self.energy_series.append((time.time(), total))

    def write_energy(self, path: Path) -> None:
        """The raw energy series beside the trial's other files (what an LLM trial's energy per
        token is computed from), with why it is empty where it is."""
        integrity.write_text_atomic(path, json.dumps({
            "unit": "mJ, summed over the trial's GPUs", "clock": "wall seconds (time.time)",
            "period_s": self.period_s, "series": self.energy_series,
            "reason": None if self.energy_series else self.energy_unmeasured()}, indent=0))

    def energy_unmeasured(self) -> str:
        """Why the energy series is empty."""
        if not self.gpus:
            return "CPU run: no GPU"
        if not self._nvml:
            return "NVML unavailable (no driver or library)"
        return self.energy_error or self.device_error or "no sample was taken (the trial ended first)"

    def write_processes(self, path: Path) -> None:
        integrity.write_text_atomic(path, json.dumps({
            "trial_gpus": sorted(self.trial_uuids),
            "processes": by_process(self.held),
            "reason": None if self.peaks else self.unmeasured().get("peak_device_mem_bytes")}, indent=0))

    def metrics(self) -> dict[str, int | str | None]:
        source = "per-process" if "per-process" in self.peaks else \
            "device-delta" if self.peaks else None
        return {"peak_process_mem_bytes": self.peak_rss or None,
                "peak_device_mem_bytes": self.peaks[source] if source else None,
                "peak_device_mem_source": source,
                # seen from the process lists of every GPU only where per-process numbers exist
                "stray_contexts": len(strays_seen_from_outside(self.held, self.trial_uuids))
                if "per-process" in self.peaks else None}

    def unmeasured(self) -> dict[str, str]:
        """Why a sampled metric is null."""
        reasons = {}
        if not self.peaks:
            if not self.gpus:
                why = "CPU run: no GPU"
            elif not self._nvml:
                why = "NVML unavailable (no driver or library)"
            else:
                why = self.device_error or "no sample was taken (the trial ended first)"
            reasons["peak_device_mem_bytes"] = why
        if "per-process" not in self.peaks:
            reasons["stray_contexts"] = reasons.get("peak_device_mem_bytes") or (
                "NVML lists none of the trial's processes (a container's PID namespace hides the "
                "host PIDs NVML reports)")
        if not self.peak_rss:
            reasons["peak_process_mem_bytes"] = "no sample was taken (the trial ended first)"
        return reasons


def _uuid(pynvml: Any, handle: Any) -> str:
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    return uuid.decode() if isinstance(uuid, bytes) else str(uuid)


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
        held, why = processes_on_gpus()
        if held is None:
            self.reason = why
            return
        mine = {os.getpid(), *process_tree(os.getpid())}
        for gpu, processes in held.items():
            note_held(self.held, gpu, processes, mine)
        self.reason = None if self.held else ("NVML lists none of this rank's processes (a container's "
                                              "PID namespace hides the host PIDs NVML reports)")

    def fold(self, processes: Sequence[tuple[int, str, int | None]] | None, why: str | None) -> None:
        """Add what an observer saw from outside mid-epoch (multicard.measure.observe: the rank's and its
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
