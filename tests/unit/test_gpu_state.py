"""A GPU's settings and state as NVML gives them (a stand-in for pynvml), and in the report."""

from __future__ import annotations

from types import SimpleNamespace

from multicard import gpu_state


class NotSupportedError(Exception):
    def __str__(self) -> str:
        return "Not Supported"


def unsupported(*args: object) -> None:
    raise NotSupportedError


def nvml(throttle: int = 0) -> SimpleNamespace:
    """An H200 as NVML describes it: 700 W, SM 1980 MHz, memory 3201 MHz, PCIe 5 x16, ECC on,
    exclusive-process compute mode; application clocks not supported."""
    return SimpleNamespace(
        NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2,
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


def test_the_report_shows_each_gpus_state_at_the_start_and_the_end(tmp_path: object) -> None:
    from pathlib import Path

    from multicard.report import document
    from multicard.report.runs import RunData

    start = gpu_state.read(nvml(throttle=0x1), "h")
    end = gpu_state.read(nvml(throttle=0x4), "h")
    env = {"gpus": [{"index": 0, "uuid": "GPU-a", "state": start}], "torch": {"nccl": "2.27.3"}}
    run = RunData(Path("/r/run"), None, env, [], 0, gpus_at_end=[{"uuid": "GPU-a", "state": end}])  # type: ignore[arg-type]
    text = document._gpu_state_section([run], Path("/r"))
    assert "gpu_idle -> sw_power_cap" in text and "700 / 650" in text and "5 x 16 (5 x 16)" in text
    assert "2.27.3" in text and "<details>" in text
