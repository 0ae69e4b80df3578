"""A GPU's settings and state as NVML gives them (a stand-in for pynvml), and in the report."""

from __future__ import annotations

from types import SimpleNamespace

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
