"""GPU utilisation sampled through NVML while a rank trains (nvidia-ml-py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from multicard import devices, nvml, resources

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


def rank_device_bytes(gpu: devices.GpuIdentity) -> tuple[int | None, str | None]:
    """What NVML charges this process on `gpu` now: CUDA context, the caching allocator's
    reserve, DALI's and NCCL's pools (torch's allocator counters see only its own tensors)."""
    import os

    try:
        pynvml = nvml.bindings()

        pynvml.nvmlInit()
    except Exception as exc:  # no driver or library
        return None, f"NVML unavailable: {exc}"
    try:
        return own_device_bytes(_nvml_processes(pynvml, devices.nvml_handle(pynvml, gpu)), os.getpid())
    except pynvml.NVMLError as exc:
        return None, f"NVML: {exc}"
    finally:
        pynvml.nvmlShutdown()


def processes_on_gpus() -> tuple[dict[str, Processes] | None, str | None]:
    """NVML's compute processes of every GPU of the machine (UUID -> (pid, bytes)), or None
    and why not."""
    try:
        pynvml = nvml.bindings()

        pynvml.nvmlInit()
    except Exception as exc:  # no driver or library
        return None, f"NVML unavailable: {exc}"
    try:
        found = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            found[uuid.decode() if isinstance(uuid, bytes) else str(uuid)] = _nvml_processes(pynvml, handle)
        return found, None
    except pynvml.NVMLError as exc:
        return None, f"NVML: {exc}"
    finally:
        pynvml.nvmlShutdown()


# what TrialMemorySampler measures from outside a trial
SAMPLED_METRICS = ("peak_process_mem_bytes", "peak_device_mem_bytes", "stray_contexts",
                   "launch_cpu_s", "launch_cpu_cores_mean")
PROCESSES_FILE = "gpu_processes.json"  # per (process, GPU) the most device memory seen


class TrialMemorySampler:
    """Peak memory of a running trial, sampled from outside every `period_s`.

    `peak_process_mem_bytes`: the summed resident set of the trial's launcher and every process
    below it (/proc). `peak_device_mem_bytes`: device memory of the trial on the trial's GPUs (the
    first `gpus` that CUDA shows it), counted as `trial_device_bytes` says; includes what the
    framework does not see (CUDA contexts, NCCL buffers). `peak_device_mem_source` says how.
    `stray_contexts`: how many (process, GPU) pairs of the trial held memory where a rank does
    not train (resources.strays_seen_from_outside; every GPU's process list is looked at each
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
        # of the trial, e.g. the logged steps of an LLM recipe (multicard.energy.energy_between)
        self.energy_series: list[tuple[float, int]] = []
        self.energy_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._nvml: Any = _nvml_or_none() if gpus else None
        self._handles: list[Any] = []
        self._every: dict[str, Any] = {}  # UUID -> handle of every GPU of the machine
        self.held: resources.Held = {}
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
                    resources.note_held(self.held, uuid, _nvml_processes(self._nvml, handle), set(tree))
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
        from multicard import artifact

        artifact.write_text_atomic(path, json.dumps({
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
        from multicard import artifact

        artifact.write_text_atomic(path, json.dumps({
            "trial_gpus": sorted(self.trial_uuids),
            "processes": resources.by_process(self.held),
            "reason": None if self.peaks else self.unmeasured().get("peak_device_mem_bytes")}, indent=0))

    def metrics(self) -> dict[str, int | str | None]:
        source = "per-process" if "per-process" in self.peaks else \
            "device-delta" if self.peaks else None
        return {"peak_process_mem_bytes": self.peak_rss or None,
                "peak_device_mem_bytes": self.peaks[source] if source else None,
                "peak_device_mem_source": source,
                # seen from the process lists of every GPU only where per-process numbers exist
                "stray_contexts": len(resources.strays_seen_from_outside(self.held, self.trial_uuids))
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


def _nvml_or_none() -> Any:
    try:
        pynvml = nvml.bindings()

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no driver
        return None


def process_tree(root: int) -> dict[int, int]:
    """pid -> RSS bytes of `root` and every process below it (/proc, one pass).

    A trial's ranks are not in its process group: torchrun starts every rank in a session of its
    own, so the tree of parent links is what finds them (and their DataLoader workers)."""
    import os
    from pathlib import Path

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
