"""GPU utilisation sampled through NVML while a rank trains (nvidia-ml-py)."""

from __future__ import annotations

import threading
from types import TracebackType


class GpuUtilSampler:
    """Samples `nvmlDeviceGetUtilizationRates(...).gpu` every `period_s` in a daemon thread.

    NVML counts the share of time in which at least one kernel ran, so it shows idle gaps (data
    stalls, pre-epoch pauses), not how full the SMs were.
    """

    def __init__(self, uuid: str, period_s: float = 0.1) -> None:
        self.uuid = uuid
        self.period_s = period_s
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuUtilSampler:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(self.uuid)
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
