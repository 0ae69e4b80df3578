"""What each GPU was set to and doing, through NVML: what a reviewer needs to compare two runs.

Per GPU: the power limit and the one enforced, SM and memory clocks (now and the application
clocks), why the clocks are held down (throttle reasons, as names), persistence mode, compute
mode, MIG mode, ECC and the PCIe link (generation and width, now and at most), and NVML's
cumulative counters of how long a constraint (power, heat, board limit, reliability, sync boost)
held the clocks below what was asked. Read into env.json when a run starts and into
`gpu-state-end.json` when it ends. The reasons are a moment's: at the end the GPU is idle, so a
throttle during the trials does not show in them; the counters' difference does
(`held_down_s`): the seconds each constraint held the clocks down between the two reads. A value
NVML cannot give is None, with why, never a made-up default.

And each trial GPU's idle power, read once before a run's first trial (env.json's
`gpu_idle_power`): NVML's energy counter over IDLE_WINDOW_S, by the same rule as a trial's energy
(energy.window_energy), so that a reader can take the idle draw out of a trial's energy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from multicard.measure import devices, energy, nvml

END_FILE = "gpu-state-end.json"
IDLE_KEY = "gpu_idle_power"  # env.json's key
# the shortest window NVML's counter resolves (energy.MIN_COUNTER_WINDOW_S): a run waits this
# once, for all its GPUs together, before its first trial
IDLE_WINDOW_S = energy.MIN_COUNTER_WINDOW_S
IDLE_HOW = "NVML's total-energy counter, read before and after the window, before the run's first trial"

# the throttle (clock event) reasons NVML reports as bits, by the names nvidia-smi prints
THROTTLE_REASONS = {
    "nvmlClocksThrottleReasonGpuIdle": "gpu_idle",
    "nvmlClocksThrottleReasonApplicationsClocksSetting": "applications_clocks_setting",
    "nvmlClocksThrottleReasonSwPowerCap": "sw_power_cap",
    "nvmlClocksThrottleReasonHwSlowdown": "hw_slowdown",
    "nvmlClocksThrottleReasonSyncBoost": "sync_boost",
    "nvmlClocksThrottleReasonSwThermalSlowdown": "sw_thermal_slowdown",
    "nvmlClocksThrottleReasonHwThermalSlowdown": "hw_thermal_slowdown",
    "nvmlClocksThrottleReasonHwPowerBrakeSlowdown": "hw_power_brake_slowdown",
    "nvmlClocksThrottleReasonDisplayClockSetting": "display_clock_setting",
}
# NVML's violation counters (nvmlDeviceGetViolationStatus: cumulative nanoseconds), by policy
HELD_DOWN_BY = {
    "NVML_PERF_POLICY_POWER": "power",
    "NVML_PERF_POLICY_THERMAL": "thermal",
    "NVML_PERF_POLICY_BOARD_LIMIT": "board_limit",
    "NVML_PERF_POLICY_RELIABILITY": "reliability",
    "NVML_PERF_POLICY_SYNC_BOOST": "sync_boost",
}
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}


def throttle_names(nvml: Any, mask: int) -> list[str]:
    """The reasons set in NVML's bit mask, by name; [] for none."""
    return sorted(name for constant, name in THROTTLE_REASONS.items()
                  if (bit := getattr(nvml, constant, None)) is not None and mask & int(bit))


def read(nvml: Any, handle: Any) -> dict[str, Any]:
    """One GPU's settings and state; each field None where NVML cannot read it, the reasons in
    `unread`."""
    unread: dict[str, str] = {}

    def get(name: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as exc:  # NVML_ERROR_NOT_SUPPORTED on a GPU or driver without it
            unread[name] = str(exc) or type(exc).__name__
            return None

    sm, mem = nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM
    milliwatts = {"power_limit_w": get("power_limit_w",
                                       lambda: nvml.nvmlDeviceGetPowerManagementLimit(handle)),
                  "enforced_power_limit_w": get("enforced_power_limit_w",
                                                lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))}
    mask = get("throttle_reasons", lambda: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
    compute = get("compute_mode", lambda: nvml.nvmlDeviceGetComputeMode(handle))
    mig = get("mig_mode", lambda: nvml.nvmlDeviceGetMigMode(handle))
    ecc = get("ecc_mode", lambda: nvml.nvmlDeviceGetEccMode(handle))
    return {
        **{k: None if v is None else v / 1000.0 for k, v in milliwatts.items()},
        "sm_clock_mhz": get("sm_clock_mhz", lambda: nvml.nvmlDeviceGetClockInfo(handle, sm)),
        "memory_clock_mhz": get("memory_clock_mhz", lambda: nvml.nvmlDeviceGetClockInfo(handle, mem)),
        "application_sm_clock_mhz": get("application_sm_clock_mhz",
                                        lambda: nvml.nvmlDeviceGetApplicationsClock(handle, sm)),
        "application_memory_clock_mhz": get("application_memory_clock_mhz",
                                            lambda: nvml.nvmlDeviceGetApplicationsClock(handle, mem)),
        "throttle_reasons": None if mask is None else throttle_names(nvml, int(mask)),
        "persistence_mode": get("persistence_mode", lambda: bool(nvml.nvmlDeviceGetPersistenceMode(handle))),
        "compute_mode": None if compute is None else COMPUTE_MODES.get(int(compute), str(compute)),
        "mig_mode": None if mig is None else bool(mig[0]),  # (current, pending)
        "ecc_enabled": None if ecc is None else bool(ecc[0]),
        "pcie_generation": get("pcie_generation", lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
        "pcie_width": get("pcie_width", lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)),
        "pcie_max_generation": get("pcie_max_generation",
                                   lambda: nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
        "pcie_max_width": get("pcie_max_width", lambda: nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)),
        "held_down_ns": {name: get(f"held_down_ns.{name}", lambda policy=policy: int(
            nvml.nvmlDeviceGetViolationStatus(handle, policy).violationTime))
            for constant, name in HELD_DOWN_BY.items()
            if (policy := getattr(nvml, constant, None)) is not None},
        "unread": unread,
    }


def held_down_s(start: dict[str, Any], end: dict[str, Any]) -> dict[str, float | None]:
    """Seconds each constraint held the clocks down between two reads of one GPU (the
    counters' difference); None for a counter either read lacks, or that went back (a driver
    reload in between, as across a resumed run, restarts it at 0)."""
    before, after = start.get("held_down_ns") or {}, end.get("held_down_ns") or {}
    return {name: None if before.get(name) is None or after.get(name) is None or after[name] < before[name]
            else (after[name] - before[name]) / 1e9 for name in HELD_DOWN_BY.values()}


def with_held_down(at_end: list[dict[str, Any]], at_start: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The GPUs read at the end, each with `held_down_s` since its read at the start (matched by
    UUID; no entry for a GPU the start did not read)."""
    started = {g.get("uuid"): g.get("state") or {} for g in at_start}
    return [{**gpu, "held_down_s": held_down_s(started[gpu["uuid"]], gpu["state"])}
            if gpu.get("uuid") in started else gpu for gpu in at_end]


def every_gpu() -> tuple[list[dict[str, Any]], str | None]:
    """[{uuid, index, state}] of every GPU NVML sees, or [] and why (no driver: a CPU machine)."""
    try:
        pynvml = nvml.bindings()

        pynvml.nvmlInit()
    except Exception as exc:
        return [], f"NVML unavailable: {exc}"
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            found.append({"index": index, "uuid": uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                          "state": read(pynvml, handle)})
        return found, None
    finally:
        pynvml.nvmlShutdown()


# --- idle power: what a trial GPU draws with nothing running on it ------------------------------

@dataclass(frozen=True)
class Look:
    """One GPU at one end of the idle window: its counter (or why not) and the PIDs NVML lists
    on it (None where it cannot list them)."""

    reading: energy.Reading | None
    why: str | None
    pids: list[int] | None


def look(nvml: Any, handle: Any, clock: Callable[[], float]) -> Look:
    try:
        pids: list[int] | None = sorted(int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle))
    except Exception:  # NVML_ERROR_NOT_SUPPORTED (an old driver)
        pids = None
    try:
        millijoules = int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        return Look(energy.Reading(clock(), millijoules), None, pids)
    except Exception as exc:  # before Volta, a MIG instance: NVML_ERROR_NOT_SUPPORTED
        return Look(None, f"NVML's energy counter: {exc}", pids)


def idle_entry(index: int, uuid: str | None, first: Look, last: Look) -> dict[str, Any]:
    """One GPU's idle power from the two ends of its window: watts = joules / seconds, or None
    with why where the window is short of the counter's 5 s (energy.window_energy), a read
    failed, or a compute process was on the GPU at either end (it was not idle). `processes`:
    the PIDs seen; None where NVML cannot list them (the reading is then kept, unchecked)."""
    seen = None if first.pids is None or last.pids is None else sorted({*first.pids, *last.pids})
    seconds = last.reading.t_s - first.reading.t_s if first.reading and last.reading else None
    if first.reading is None or last.reading is None:
        found = energy.Energy(None, None, first.why or last.why)
    else:
        found = energy.window_energy(first.reading, last.reading, 1e-3, None)
    why = f"not idle: process(es) {', '.join(map(str, seen))} on the GPU" if seen else found.reason
    return {"index": index, "uuid": uuid, "window_s": seconds, "processes": seen,
            "watts": None if why else energy.mean_power(found.joules, seconds or 0.0), "reason": why}


def read_idle_power(nvml: Any, gpus: Sequence[tuple[int, str | None, Any]],
                    window_s: float = IDLE_WINDOW_S, clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> list[dict[str, Any]]:
    """Each GPU's (index, uuid, NVML handle) idle power (idle_entry), all in one window: every
    GPU looked at, `window_s` waited, every GPU looked at again."""
    first = [look(nvml, handle, clock) for _, _, handle in gpus]
    sleep(window_s)
    last = [look(nvml, handle, clock) for _, _, handle in gpus]
    return [idle_entry(index, uuid, a, b) for (index, uuid, _), a, b in zip(gpus, first, last, strict=True)]


def idle_power(gpus: Sequence[devices.GpuIdentity], window_s: float = IDLE_WINDOW_S) -> dict[str, Any]:
    """env.json's `gpu_idle_power`: how it was read and each trial GPU's reading
    (read_idle_power); no GPU and why (a CPU plan, no NVML) where there is none to read."""
    record: dict[str, Any] = {"how": IDLE_HOW, "window_s": window_s,
                              "captured": datetime.now(UTC).isoformat(timespec="seconds"),
                              "gpus": [], "reason": None}
    if not gpus:
        return {**record, "reason": "no CUDA trial in the plan: no GPU to read"}
    try:
        pynvml = nvml.bindings()

        pynvml.nvmlInit()
    except Exception as exc:
        return {**record, "reason": f"NVML unavailable: {exc}"}
    try:
        handles = [(gpu.index, gpu.uuid, devices.nvml_handle(pynvml, gpu)) for gpu in gpus]
        return {**record, "gpus": read_idle_power(pynvml, handles, window_s)}
    except Exception as exc:  # a GPU gone between the plan and now
        return {**record, "reason": f"NVML: {exc}"}
    finally:
        pynvml.nvmlShutdown()
