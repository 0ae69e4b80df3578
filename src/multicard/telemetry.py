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
