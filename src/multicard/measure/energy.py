"""Energy of a timed region, from the counters the hardware keeps: pure arithmetic here, the
reading of NVML and Linux powercap (RAPL) at the end.

- GPU: NVML's total-energy counter (millijoules since the driver loaded, Volta and newer), read at
  the start and the end of the window, and nothing else. It updates every 20-100 ms, which reads a
  1 s window about 4 % low, so a window under MIN_COUNTER_WINDOW_S has no GPU energy: it is None,
  with a reason naming the window's length and the 5 s the counter needs (short_window). Power
  samples integrated over a short window are not used: they would be a second way of reading
  energy, with errors of their own, that a comparison could not tell from the first.
- CPU: the package domains of /sys/class/powercap (intel-rapl:N, on AMD too), microjoules, each
  counter wrapping at its max_energy_range_uj.

What cannot be measured is None with a reason, never 0. Energies are node level for the devices
named (GPUs of the trial, CPU packages), not the wall socket.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multicard.measure import nvml

SERIES_FILE = "energy_series.json"  # a trial's GPU counters sampled from outside (telemetry)
MIN_COUNTER_WINDOW_S = 5.0  # NVML's energy counter (under 1 % low here); RAPL's updates every ms
RAPL_MIN_WINDOW_S = 0.01
POWERCAP = Path("/sys/class/powercap")


@dataclass(frozen=True)
class Reading:
    """One read of a cumulative counter: when (monotonic seconds) and its value (its units)."""

    t_s: float
    value: int


@dataclass(frozen=True)
class Energy:
    """Joules over a window and how they were found, or None and why not."""

    joules: float | None
    source: str | None  # "counter"
    reason: str | None = None


def counter_delta(start: int, end: int, wraps_at: int | None) -> int | None:
    """How far a cumulative counter moved; a counter that wrapped once (end < start) moved
    wraps_at - start + end. None when it went back and its range is unknown."""
    if end >= start:
        return end - start
    if wraps_at is None or wraps_at <= start:
        return None
    return wraps_at - start + end


def short_window(seconds: float, min_window_s: float = MIN_COUNTER_WINDOW_S) -> str:
    """Why a window has no counter energy: one line, the same wherever a window is read (a vision
    rank's meter, an LLM trial's sampled series, the idle reading)."""
    return f"a {seconds:.3f} s window is shorter than the {min_window_s:g} s the energy counter needs"


def window_energy(start: Reading, end: Reading, joules_per_unit: float, wraps_at: int | None,
                  min_window_s: float = MIN_COUNTER_WINDOW_S) -> Energy:
    """One device's energy between two counter reads; None and why for a window shorter than
    the counter resolves (`min_window_s`, NVML's by default) or a counter that went back
    without a known range."""
    seconds = end.t_s - start.t_s
    if seconds < min_window_s:
        return Energy(None, None, short_window(seconds, min_window_s))
    delta = counter_delta(start.value, end.value, wraps_at)
    if delta is None:
        return Energy(None, None, "the counter went back and its range is unknown")
    return Energy(delta * joules_per_unit, "counter")


def total(parts: Sequence[tuple[str, Energy]]) -> Energy:
    """The sum over devices (named), None naming the first that is missing: a partial sum
    would read as a smaller energy."""
    if not parts:
        return Energy(None, None, "no device to measure")
    for name, part in parts:
        if part.joules is None:
            return Energy(None, None, f"{name}: {part.reason}")
    sources = sorted({str(part.source) for _, part in parts})
    return Energy(sum(float(part.joules or 0.0) for _, part in parts), " + ".join(sources))


def per_unit(joules: float | None, count: float) -> float | None:
    """Energy per sample (or token); None when either is unknown or nothing was counted."""
    return joules / count if joules is not None and count > 0 else None


def mean_power(joules: float | None, seconds: float) -> float | None:
    return joules / seconds if joules is not None and seconds > 0 else None


# --- Linux powercap (RAPL) -------------------------------------------------------------------

@dataclass(frozen=True)
class RaplDomain:
    name: str  # "package-0"
    energy_file: Path
    wraps_at: int | None  # microjoules


def rapl_packages(root: Path = POWERCAP) -> tuple[list[RaplDomain], str | None]:
    """The package domains (top-level intel-rapl:N; their sub-domains would count twice), or
    none and why."""
    if not root.is_dir():
        return [], f"{root} does not exist (no powercap driver here: a VM, or a kernel without it)"
    found = []
    for zone in sorted(root.glob("intel-rapl:*")):
        if zone.name.count(":") != 1:
            continue
        try:
            name = (zone / "name").read_text().strip()
            limit = (zone / "max_energy_range_uj").read_text().strip()
        except OSError:
            continue
        if not name.startswith("package"):  # psys (a client CPU's platform zone) holds them all
            continue
        found.append(RaplDomain(name, zone / "energy_uj", int(limit) if limit.isdigit() else None))
    if not found:
        return [], f"no RAPL package domain under {root} (the CPU or the VM does not expose one)"
    return found, None


def read_rapl(domains: Sequence[RaplDomain]) -> tuple[list[int] | None, str | None]:
    """Every package's counter (microjoules), or None and why (since Linux 5.10 energy_uj is
    readable by root only)."""
    values = []
    for domain in domains:
        try:
            values.append(int(domain.energy_file.read_text().strip()))
        except PermissionError:
            return None, f"{domain.energy_file}: permission denied (root only since Linux 5.10)"
        except (OSError, ValueError) as exc:
            return None, f"{domain.energy_file}: {exc}"
    return values, None


def cpu_window_energy(domains: Sequence[RaplDomain], start: Sequence[Reading],
                      end: Sequence[Reading]) -> Energy:
    """CPU packages' energy between two reads of every domain."""
    parts = [(domain.name, window_energy(a, b, 1e-6, domain.wraps_at, min_window_s=RAPL_MIN_WINDOW_S))
             for domain, a, b in zip(domains, start, end, strict=True)]
    return total(parts)


# --- live meters (context managers, entered with the rank's other samplers) ------------------

class GpuEnergyMeter:
    """One GPU's energy over the `with` block: NVML's counter read on entry (again at
    `mark_start`) and on exit. `uuid=None` (a CPU run) measures nothing and says so. `clock`:
    monotonic seconds (tests pass their own)."""

    def __init__(self, uuid: str | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.uuid, self.clock = uuid, clock
        self.reason: str | None = "CPU run: no GPU" if uuid is None else None
        self._start: Reading | None = None
        self._end: Reading | None = None
        self._nvml: Any = None
        self._handle: Any = None

    def __enter__(self) -> GpuEnergyMeter:
        if self.uuid is None:
            return self
        try:
            pynvml = nvml.bindings()

            pynvml.nvmlInit()
            self._nvml, self._handle = pynvml, pynvml.nvmlDeviceGetHandleByUUID(self.uuid)
        except Exception as exc:  # no driver, no library, a MIG device
            self.reason = f"NVML unavailable: {exc}"
            return self
        self.mark_start()
        return self

    def mark_start(self) -> None:
        """The measured window starts now (after the ranks' barrier: the timed region)."""
        if self._nvml is not None:
            self._start = self._read()

    def _read(self) -> Reading | None:
        try:
            millijoules = self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
            return Reading(self.clock(), int(millijoules))
        except Exception as exc:  # before Volta: NVMLError_NotSupported
            self.reason = f"NVML's energy counter: {exc}"
            return None

    def __exit__(self, *exc: object) -> None:
        if self._start is not None and self._end is None:
            self._end = self._read()

    def energy(self) -> Energy:
        if self._start is not None and self._end is not None:
            return window_energy(self._start, self._end, 1e-3, None)
        return Energy(None, None, self.reason or "no reading was taken")


class CpuEnergyMeter:
    """The CPU packages' energy over the `with` block (RAPL, node level: one meter per node).

    A package counter wraps at max_energy_range_uj, about 262 kJ: 15-20 minutes of a busy
    server package. Two reads could not tell one wrap from two, so a thread reads every
    `period_s` (well inside a wrap) and adds up the steps, each corrected for one wrap."""

    def __init__(self, root: Path = POWERCAP, period_s: float = 30.0) -> None:
        self.domains, self.reason = rapl_packages(root)
        self.period_s = period_s
        self.joules: list[float] = [0.0] * len(self.domains)
        self._last: list[Reading] | None = None
        self._ok = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> list[Reading] | None:
        values, why = read_rapl(self.domains)
        if values is None:
            self.reason = why
            return None
        now = time.monotonic()
        return [Reading(now, v) for v in values]

    def mark_start(self) -> None:
        """The measured window starts now: what the counters moved before it is dropped."""
        if self._thread is not None and self._step():
            with self._lock:
                self.joules = [0.0] * len(self.domains)

    def _step(self) -> bool:
        """Add what each counter moved since the last read; False when a read failed."""
        with self._lock:
            now = self._read()
            if now is None or self._last is None:
                return False
            for i, (domain, a, b) in enumerate(zip(self.domains, self._last, now, strict=True)):
                moved = counter_delta(a.value, b.value, domain.wraps_at)
                if moved is None:
                    self.reason = f"{domain.name}: the counter went back and its range is unknown"
                    return False
                self.joules[i] += moved * 1e-6
            self._last = now
            return True

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            if not self._step():
                return

    def __enter__(self) -> CpuEnergyMeter:
        if self.domains:
            self._last = self._read()
            if self._last is not None:
                self._thread = threading.Thread(target=self._run, daemon=True)
                self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._ok = self._step() and self.reason is None

    def energy(self) -> Energy:
        if not self._ok:
            return Energy(None, None, self.reason or "no reading was taken")
        return total([(d.name, Energy(j, "counter")) for d, j in zip(self.domains, self.joules, strict=True)])


# --- one trial's energy metrics from its ranks ------------------------------------------------

ENERGY_METRICS = ("energy_j", "energy_per_sample_j", "mean_power_w", "cpu_energy_j",
                  "node_energy_per_sample_j")


def rank_record(gpu: Energy, cpu: Energy | None) -> dict[str, Any]:
    """What a rank reports: its GPU's energy, and its node's CPU packages' on one rank per node."""
    return {"gpu_energy_j": gpu.joules, "gpu_energy_source": gpu.source, "gpu_energy_reason": gpu.reason,
            "cpu_energy_j": cpu.joules if cpu else None, "cpu_energy_reason": cpu.reason if cpu else None,
            "measures_cpu": cpu is not None}


def trial_metrics(ranks: Sequence[dict[str, Any]], samples: float, seconds: float
                  ) -> tuple[dict[str, float | None], dict[str, str]]:
    """energy_j (every trial GPU), energy_per_sample_j, mean_power_w (over `seconds`),
    cpu_energy_j (every node's packages) and node_energy_per_sample_j (the GPUs and the CPU
    packages together: a loader decoding on the CPU spends energy there), with why each null one
    is null."""
    unrecorded = "the rank recorded no energy"
    gpu = total([(f"rank {r.get('rank', i)}", Energy(r.get("gpu_energy_j"), r.get("gpu_energy_source"),
                                              r.get("gpu_energy_reason") or unrecorded))
                 for i, r in enumerate(ranks)])
    cpu = total([(f"rank {r.get('rank', i)}", Energy(r["cpu_energy_j"], "counter",
                                                     r.get("cpu_energy_reason") or unrecorded))
                 for i, r in enumerate(ranks) if r.get("measures_cpu")])
    node = total([("the GPUs", gpu), ("the CPU packages", cpu)])
    metrics = {"energy_j": gpu.joules, "energy_per_sample_j": per_unit(gpu.joules, samples),
               "mean_power_w": mean_power(gpu.joules, seconds), "cpu_energy_j": cpu.joules,
               "node_energy_per_sample_j": per_unit(node.joules, samples)}
    why_gpu = gpu.reason if gpu.joules is None else None
    reasons = {"energy_j": why_gpu,
               "energy_per_sample_j": why_gpu or "no sample was trained",
               "mean_power_w": why_gpu or "a zero-length window",
               "cpu_energy_j": cpu.reason or "no measurement",
               "node_energy_per_sample_j": (node.reason if node.joules is None else None)
               or "no sample was trained"}
    return metrics, {k: str(v) for k, v in reasons.items() if metrics[k] is None}


def trial_sources(ranks: Sequence[dict[str, Any]]) -> dict[str, str]:
    """How each measured energy metric of a trial was read: NVML's counter, RAPL's counter."""
    gpu = total([(str(i), Energy(r.get("gpu_energy_j"), r.get("gpu_energy_source")))
                 for i, r in enumerate(ranks)])
    cpu = [r for r in ranks if r.get("measures_cpu")]
    found = {"energy_j": f"NVML {gpu.source}"} if gpu.joules is not None else {}
    if cpu and all(r.get("cpu_energy_j") is not None for r in cpu):
        found["cpu_energy_j"] = "RAPL counter"
    return found


# --- energy over a window of a sampled counter (an LLM trial, sampled from outside) ----------

def counter_at(series: Sequence[tuple[float, int]], t: float) -> float | None:
    """The cumulative counter at wall time `t`, linear between the samples around it; None
    outside the sampled span."""
    import numpy as np

    if not series or not series[0][0] <= t <= series[-1][0]:
        return None
    return float(np.interp(t, [s[0] for s in series], [s[1] for s in series]))


def energy_between(series: Sequence[tuple[float, int]], start: float, end: float,
                   joules_per_unit: float = 1e-3) -> Energy:
    """Energy of a (wall seconds, summed counter) series between two wall times."""
    if end - start < MIN_COUNTER_WINDOW_S:
        return Energy(None, None, short_window(end - start))
    a, b = counter_at(series, start), counter_at(series, end)
    if a is None or b is None:
        return Energy(None, None, "the counter was not sampled over the whole window")
    return Energy((b - a) * joules_per_unit, "counter")
