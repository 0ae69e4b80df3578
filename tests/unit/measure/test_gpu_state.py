"""A GPU's settings and state as NVML gives them (a stand-in for pynvml), and in the report."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from multicard.measure import gpu_state


class NotSupportedError(Exception):
    def __str__(self) -> str:
        return "Not Supported"


def unsupported(*args: object) -> None:
    raise NotSupportedError


def nvml(throttle: int = 0, power_held_ns: int = 0) -> SimpleNamespace:
    """An H200 as NVML describes it: 700 W, SM 1980 MHz, memory 3201 MHz, PCIe 5 x16, ECC on,
    exclusive-process compute mode; application clocks not supported; the power counter at
    `power_held_ns`, the thermal one at 0 and the reliability one not supported."""
    held = {0: power_held_ns, 1: 0}

    def violation(handle: object, policy: int) -> SimpleNamespace:
        if policy not in held:
            raise NotSupportedError
        return SimpleNamespace(referenceTime=0, violationTime=held[policy])

    return SimpleNamespace(
        NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2,
        NVML_PERF_POLICY_POWER=0, NVML_PERF_POLICY_THERMAL=1, NVML_PERF_POLICY_RELIABILITY=5,
        nvmlDeviceGetViolationStatus=violation,
        nvmlClocksThrottleReasonGpuIdle=0x1, nvmlClocksThrottleReasonSwPowerCap=0x4,
        nvmlClocksThrottleReasonHwThermalSlowdown=0x40,
        nvmlDeviceGetPowerManagementLimit=lambda h: 700_000,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 650_000,
        nvmlDeviceGetClockInfo=lambda h, clock: {1: 1980, 2: 3201}[clock],
        nvmlDeviceGetApplicationsClock=unsupported,
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: throttle,
        nvmlDeviceGetPersistenceMode=lambda h: 1, nvmlDeviceGetComputeMode=lambda h: 3,
        nvmlDeviceGetMigMode=lambda h: (0, 0), nvmlDeviceGetEccMode=lambda h: (1, 1),
        nvmlDeviceGetCurrPcieLinkGeneration=lambda h: 5, nvmlDeviceGetCurrPcieLinkWidth=lambda h: 16,
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: 5, nvmlDeviceGetMaxPcieLinkWidth=lambda h: 16)


def test_every_field_read_and_what_could_not_be_said_why() -> None:
    found = gpu_state.read(nvml(throttle=0x4 | 0x40), "h")
    assert found["power_limit_w"] == 700.0 and found["enforced_power_limit_w"] == 650.0
    assert (found["sm_clock_mhz"], found["memory_clock_mhz"]) == (1980, 3201)
    assert found["application_sm_clock_mhz"] is None  # never a made-up default
    assert found["unread"]["application_sm_clock_mhz"] == "Not Supported"
    assert found["throttle_reasons"] == ["hw_thermal_slowdown", "sw_power_cap"]
    assert found["persistence_mode"] is True and found["compute_mode"] == "exclusive_process"
    assert found["mig_mode"] is False and found["ecc_enabled"] is True
    assert (found["pcie_generation"], found["pcie_width"]) == (5, 16)
    assert gpu_state.read(nvml(), "h")["throttle_reasons"] == []
    assert found["held_down_ns"] == {"power": 0, "thermal": 0, "reliability": None}
    assert found["unread"]["held_down_ns.reliability"] == "Not Supported"


def test_a_throttle_during_the_trials_shows_though_the_gpu_is_idle_at_the_end() -> None:
    start = gpu_state.read(nvml(power_held_ns=5_000_000_000), "h")
    end = gpu_state.read(nvml(throttle=0x1, power_held_ns=7_500_000_000), "h")  # idle at the end
    assert end["throttle_reasons"] == ["gpu_idle"]
    assert gpu_state.held_down_s(start, end) == {"power": 2.5, "thermal": 0.0, "board_limit": None,
                                                 "reliability": None, "sync_boost": None}
    at_end = gpu_state.with_held_down([{"uuid": "GPU-a", "state": end}, {"uuid": "GPU-new", "state": end}],
                                      [{"uuid": "GPU-a", "state": start}])
    assert at_end[0]["held_down_s"]["power"] == 2.5 and "held_down_s" not in at_end[1]
    # a counter that went back (a driver reload in between restarts it) is no reading, not a
    # negative time
    reloaded = gpu_state.read(nvml(power_held_ns=1_000_000_000), "h")
    assert gpu_state.held_down_s(start, reloaded)["power"] is None


def test_the_report_shows_each_gpus_state_at_the_start_and_the_end(tmp_path: object) -> None:
    from pathlib import Path

    from multicard.publish import document
    from multicard.publish.runs import RunData

    start = gpu_state.read(nvml(throttle=0x1), "h")
    end = gpu_state.read(nvml(throttle=0x4, power_held_ns=1_250_000_000), "h")
    env = {"gpus": [{"index": 0, "uuid": "GPU-a", "state": start}], "torch": {"nccl": "2.27.3"}}
    at_end = gpu_state.with_held_down([{"uuid": "GPU-a", "state": end}], env["gpus"])
    run = RunData(Path("/r/run"), None, env, [], 0, gpus_at_end=at_end)  # type: ignore[arg-type]
    text = document._gpu_state_section([run], Path("/r"))
    assert "gpu_idle -> sw_power_cap" in text and "700 / 650" in text and "5 x 16 (5 x 16)" in text
    assert "clocks held down in between (s)" in text and " power 1.25 " in text
    assert "2.27.3" in text and "<details>" in text


class Clock:
    """Monotonic seconds that move only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def idle_nvml(clock: Clock, watts: dict[str, float], pids: dict[str, list[int]] | None = None,
              no_counter: frozenset[str] = frozenset()) -> SimpleNamespace:
    """NVML's view of idle GPUs (handles are their UUIDs): each counter (mJ) moving its `watts`
    per second of `clock`, the compute processes in `pids`, no counter on `no_counter`."""
    def counter(handle: str) -> int:
        if handle in no_counter:
            raise NotSupportedError
        return 10_000_000 + int(watts[handle] * 1000 * clock.now)

    def processes(handle: str) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=p, usedGpuMemory=None) for p in (pids or {}).get(handle, [])]

    return SimpleNamespace(nvmlDeviceGetTotalEnergyConsumption=counter,
                           nvmlDeviceGetComputeRunningProcesses=processes)


def test_idle_power_is_a_counter_delta_over_one_5_s_window_for_every_gpu() -> None:
    clock = Clock()
    found = gpu_state.read_idle_power(idle_nvml(clock, {"GPU-a": 61.5, "GPU-b": 74.0}),
                                      [(0, "GPU-a", "GPU-a"), (1, "GPU-b", "GPU-b")],
                                      5.0, clock, clock.sleep)
    assert clock.now == 5.0  # one window for both GPUs, not one each
    assert found == [
        {"index": 0, "uuid": "GPU-a", "window_s": 5.0, "processes": [], "watts": pytest.approx(61.5),
         "reason": None},
        {"index": 1, "uuid": "GPU-b", "window_s": 5.0, "processes": [], "watts": pytest.approx(74.0),
         "reason": None}]


def test_idle_power_under_5_s_busy_or_without_a_counter_is_null_with_why() -> None:
    clock = Clock()
    nvml_view = idle_nvml(clock, {"GPU-a": 61.5, "GPU-b": 74.0, "GPU-c": 70.0}, pids={"GPU-b": [4242]},
                          no_counter=frozenset({"GPU-c"}))
    gpus = [(0, "GPU-a", "GPU-a"), (1, "GPU-b", "GPU-b"), (2, "GPU-c", "GPU-c")]
    short, busy, uncounted = gpu_state.read_idle_power(nvml_view, gpus, 4.9, clock, clock.sleep)
    assert short["watts"] is None and short["window_s"] == pytest.approx(4.9)
    assert short["reason"] == "a 4.900 s window is shorter than the 5 s the energy counter needs"
    assert busy["watts"] is None and busy["processes"] == [4242]
    assert busy["reason"] == "not idle: process(es) 4242 on the GPU"
    assert uncounted["watts"] is None and uncounted["reason"] == "NVML's energy counter: Not Supported"


def test_a_run_without_a_gpu_or_nvml_records_no_idle_power_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from multicard.measure import devices, nvml

    cpu = gpu_state.idle_power([])
    assert cpu["gpus"] == [] and cpu["reason"] == "no CUDA trial in the plan: no GPU to read"
    assert cpu["window_s"] == 5.0 and "NVML's total-energy counter" in cpu["how"]

    def no_driver() -> object:
        raise ImportError("libnvidia-ml.so.1: cannot open shared object file")

    monkeypatch.setattr(nvml, "bindings", no_driver)
    gpu = devices.GpuIdentity(0, "GPU-a", "0000:1b:00.0")
    found = gpu_state.idle_power([gpu])
    assert found["gpus"] == [] and found["reason"] == (
        "NVML unavailable: libnvidia-ml.so.1: cannot open shared object file")


def test_idle_power_reads_the_trial_gpus_by_uuid_and_shuts_nvml_down(monkeypatch: pytest.MonkeyPatch) -> None:
    import re
    import sys

    from multicard.measure import devices

    calls: list[str] = []
    stand_in = idle_nvml(Clock(), {"GPU-b": 74.0})
    stand_in.nvmlInit = lambda: calls.append("init")
    stand_in.nvmlShutdown = lambda: calls.append("shutdown")
    stand_in.nvmlDeviceGetHandleByUUID = lambda uuid: uuid
    monkeypatch.setitem(sys.modules, "pynvml", stand_in)
    # a zero window: nothing sleeps here, and the counter's 5 s rule says why there is no number
    found = gpu_state.idle_power([devices.GpuIdentity(3, "GPU-b", None)], window_s=0.0)
    [entry] = found["gpus"]
    assert (entry["index"], entry["uuid"], entry["watts"]) == (3, "GPU-b", None)
    assert re.fullmatch(r"a \d+\.\d{3} s window is shorter than the 5 s the energy counter needs",
                        entry["reason"]) and found["reason"] is None
    assert calls == ["init", "shutdown"]


def test_the_report_shows_each_gpus_idle_power_beside_its_settings(tmp_path: object) -> None:
    from pathlib import Path

    from multicard.publish import document
    from multicard.publish.runs import RunData

    clock = Clock()
    idle = {"how": gpu_state.IDLE_HOW, "window_s": 5.0, "reason": None,
            "gpus": gpu_state.read_idle_power(idle_nvml(clock, {"GPU-a": 61.25}), [(0, "GPU-a", "GPU-a")],
                                              5.0, clock, clock.sleep)}
    state = gpu_state.read(nvml(), "h")
    env = {"gpus": [{"index": 0, "uuid": "GPU-a", "state": state},
                    {"index": 1, "uuid": "GPU-z", "state": state}],  # a GPU the trials could not see
           gpu_state.IDLE_KEY: idle}
    cpu = {gpu_state.IDLE_KEY: gpu_state.idle_power([])}
    runs = [RunData(Path("/r/gpu"), None, env, [], 0),  # type: ignore[arg-type]
            RunData(Path("/r/cpu"), None, cpu, [], 0),  # type: ignore[arg-type]
            RunData(Path("/r/old"), None, {}, [], 0)]  # type: ignore[arg-type]
    text = document._gpu_state_section(runs, Path("/r"))
    assert "- `gpu`: GPU 0 61.25 W (5 s)\n" in text  # in the open, not only in the folded table
    assert "- `cpu`: not read: no CUDA trial in the plan: no GPU to read\n" in text
    assert "- `old`: not recorded (env.json has no `gpu_idle_power`" in text
    header, _, first, second = [line for line in text.splitlines() if line.startswith("|")][:4]
    column = [c.strip() for c in header.split("|")].index("idle power")
    assert [c.strip() for c in first.split("|")][column] == "61.25 W (5 s)"
    assert [c.strip() for c in second.split("|")][column] == "n/a: not a GPU the trials could see"
