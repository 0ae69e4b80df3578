"""GPU utilisation sampled through NVML while a rank trains (nvidia-ml-py)."""

from __future__ import annotations

import threading
from types import TracebackType


class GpuUtilSampler:
    """Samples `nvmlDeviceGetUtilizationRates(...).gpu` every `period_s` in a daemon thread.

    NVML counts the share of time in which at least one kernel ran, so it shows idle gaps (data
    stalls, pre-epoch pauses), not how full the SMs were. `uuid=None` (a CPU run) samples nothing.
    """

    def __init__(self, uuid: str | None, period_s: float = 0.1) -> None:
        self.uuid = uuid
        self.period_s = period_s
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuUtilSampler:
        if self.uuid is None:
            return self
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByUUID(self.uuid)
        except Exception:  # no NVML, or a device it cannot name (MIG): report no utilisation
            return self
        self._thread = threading.Thread(target=self._sample, args=(pynvml, handle), daemon=True)
        self._thread.start()
        return self

    def _sample(self, pynvml: object, handle: object) -> None:
        while not self._stop.wait(self.period_s):
            self.samples.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)  # type: ignore[attr-defined]

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def mean(self) -> float | None:
        """Mean utilisation as a fraction in [0, 1], or None with no samples."""
        return sum(self.samples) / len(self.samples) / 100.0 if self.samples else None


def visible_gpu_count() -> int:
    """GPUs this process may use: NVML's count, narrowed by CUDA_VISIBLE_DEVICES; 0 without a driver."""
    import os

    try:
        import pynvml

        pynvml.nvmlInit()
        count = int(pynvml.nvmlDeviceGetCount())
        pynvml.nvmlShutdown()
    except Exception:  # no driver or no library: no usable GPU
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return count
    return min(count, len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"]))


class TrialMemorySampler:
    """Peak memory of a running trial, sampled from outside every `period_s`.

    `peak_process_mem_bytes`: the summed resident set of every process in the trial's process
    group (/proc). `peak_device_mem_bytes`: GPU memory in use on the visible GPUs (NVML), which
    includes what the framework does not see (CUDA contexts, NCCL buffers).
    """

    def __init__(self, pgid: int, gpus: bool, period_s: float = 0.25) -> None:
        self.pgid, self.gpus, self.period_s = pgid, gpus, period_s
        self.peak_rss = 0
        self.peak_device: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TrialMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        handles = _nvml_visible_handles() if self.gpus else []
        while not self._stop.wait(self.period_s):
            self.peak_rss = max(self.peak_rss, group_rss_bytes(self.pgid))
            if handles:
                import pynvml

                used = sum(int(pynvml.nvmlDeviceGetMemoryInfo(h).used) for h in handles)
                self.peak_device = max(self.peak_device or 0, used)

    def metrics(self) -> dict[str, int | None]:
        return {"peak_process_mem_bytes": self.peak_rss or None,
                "peak_device_mem_bytes": self.peak_device}


def group_rss_bytes(pgid: int) -> int:
    """Summed RSS of the processes whose process group is `pgid`."""
    import os
    from pathlib import Path

    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # fields after the name: state, ppid, pgrp, ...
                total += int((entry / "statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total


def _nvml_visible_handles() -> list[object]:
    import os

    try:
        import pynvml

        pynvml.nvmlInit()
        count = int(pynvml.nvmlDeviceGetCount())
    except Exception:  # no driver
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    indices = [int(v) for v in visible.split(",") if v.strip().isdigit()] if visible else range(count)
    return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices if i < count]
