"""Energy of a timed region, from the counters the hardware keeps: pure arithmetic here, the
reading of NVML and Linux powercap (RAPL) at the end.

- GPU: NVML's total-energy counter (millijoules since the driver loaded, Volta and newer). It
  updates every 20-100 ms, so a window under MIN_COUNTER_WINDOW_S is not read from it: such a
  window falls back to power samples integrated over it (trapezoids), and says so.
- CPU: the package domains of /sys/class/powercap (intel-rapl:N, on AMD too), microjoules, each
  counter wrapping at its max_energy_range_uj.

What cannot be measured is None with a reason, never 0. Energies are node level for the devices
named (GPUs of the trial, CPU packages), not the wall socket.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MIN_COUNTER_WINDOW_S = 1.0  # NVML's energy counter; RAPL's updates about every millisecond
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
    source: str | None  # "counter" or "integrated power"
    reason: str | None = None


def counter_delta(start: int, end: int, wraps_at: int | None) -> int | None:
    """How far a cumulative counter moved; a counter that wrapped once (end < start) moved
    wraps_at - start + end. None when it went back and its range is unknown."""
    if end >= start:
        return end - start
    if wraps_at is None or wraps_at <= start:
        return None
    return wraps_at - start + end


def integrate_power(samples: Sequence[tuple[float, float]]) -> float:
    """Joules from (seconds, watts) samples in time order, by trapezoids."""
    from scipy.integrate import trapezoid  # numpy's name differs between 1.26 (NGC) and 2.x

    return float(trapezoid([w for _, w in samples], [t for t, _ in samples]))


def window_energy(start: Reading, end: Reading, joules_per_unit: float, wraps_at: int | None,
                  power_samples: Sequence[tuple[float, float]] = (),
                  min_window_s: float = MIN_COUNTER_WINDOW_S) -> Energy:
    """One device's energy between two counter reads, or from its power samples when the window
    is shorter than the counter resolves (or the counter went back without a known range)."""
    seconds = end.t_s - start.t_s
    delta = counter_delta(start.value, end.value, wraps_at)
    if seconds >= min_window_s and delta is not None:
        return Energy(delta * joules_per_unit, "counter")
    why = (f"a {seconds:.3f} s window is shorter than the counter resolves ({min_window_s:g} s)"
           if seconds < min_window_s else "the counter went back and its range is unknown")
    if len(power_samples) >= 2:
        return Energy(integrate_power(power_samples), "integrated power", why)
    return Energy(None, None, f"{why}, and fewer than 2 power samples were taken")


def total(parts: Sequence[tuple[str, Energy]]) -> Energy:
    """The sum over devices (named), None naming the first that is missing: a partial sum
    would read as a smaller energy."""
    if not parts:
        return Energy(None, None, "no device to measure")
    for name, part in parts:
        if part.joules is None:
            return Energy(None, None, f"{name}: {part.reason}")
    sources = sorted({str(part.source) for _, part in parts})
    reasons = sorted({str(part.reason) for _, part in parts if part.reason})
    return Energy(sum(float(part.joules or 0.0) for _, part in parts), " + ".join(sources),
                  "; ".join(reasons) or None)


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
