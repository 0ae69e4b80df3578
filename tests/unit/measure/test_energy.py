from __future__ import annotations

import time
from pathlib import Path

import pytest

from multicard.measure import energy
from multicard.measure.energy import Energy, Reading

# an NVML counter (mJ) read at the start and the end of a 12.5 s timed region at ~300 W
NVML_START, NVML_END = Reading(100.0, 9_876_543_210), Reading(112.5, 9_880_293_210)


def test_a_counter_window_is_the_difference_in_joules() -> None:
    found = energy.window_energy(NVML_START, NVML_END, 1e-3, None)
    assert found.reason is None
    assert found == Energy(pytest.approx(3750.0), "counter")
    assert energy.mean_power(found.joules, 12.5) == pytest.approx(300.0)


def test_a_wrapped_counter_adds_its_range() -> None:
    # RAPL's energy_uj wraps at max_energy_range_uj (262143328850 uJ on many Intel parts)
    wraps = 262_143_328_850
    start, end = Reading(0.0, wraps - 1_000_000), Reading(2.0, 4_000_000)
    assert energy.counter_delta(start.value, end.value, wraps) == 5_000_000
    assert energy.window_energy(start, end, 1e-6, wraps, min_window_s=energy.RAPL_MIN_WINDOW_S).joules \
        == pytest.approx(5.0)
    assert energy.counter_delta(10, 5, None) is None  # back, range unknown: not a number
    # a counter of known range that wrapped inside a 5 s window: 1500 mJ, not a negative number
    nvml_wrap = energy.window_energy(Reading(0.0, 2**64 - 1000), Reading(5.0, 500), 1e-3, 2**64)
    assert nvml_wrap == Energy(pytest.approx(1.5), "counter")


def test_a_window_under_5_s_has_no_energy_and_says_why_and_5_s_is_the_counters_delta() -> None:
    # 250 W in mJ: the counter moved 1225 J in 4.9 s and 1250 J in 5.0 s
    start = Reading(100.0, 1_000_000)
    short = energy.window_energy(start, Reading(104.9, 2_225_000), 1e-3, None)
    assert short == Energy(None, None, "a 4.900 s window is shorter than the 5 s the energy counter needs")
    enough = energy.window_energy(start, Reading(105.0, 2_250_000), 1e-3, None)
    assert enough == Energy(pytest.approx(1250.0), "counter")
    assert energy.mean_power(enough.joules, 5.0) == pytest.approx(250.0)


def test_a_counter_that_went_back_is_no_reading() -> None:
    # a driver reload in the window restarts NVML's counter: no range to add, so no number
    found = energy.window_energy(Reading(0.0, 5000), Reading(3600.0, 10), 1e-3, None)
    assert found == Energy(None, None, "the counter went back and its range is unknown")


def test_a_sum_over_gpus_is_none_when_one_is_missing() -> None:
    ok = Energy(10.0, "counter")
    assert energy.total([("GPU 0", ok), ("GPU 1", Energy(2.0, "counter"))]) == Energy(12.0, "counter")
    missing = energy.total([("GPU 0", ok), ("GPU 1", Energy(None, None, "NVML: not supported"))])
    assert missing == Energy(None, None, "GPU 1: NVML: not supported")
    assert energy.total([]).reason == "no device to measure"


def test_per_sample_and_power_are_none_not_zero() -> None:
    assert energy.per_unit(None, 100) is None and energy.per_unit(5.0, 0) is None
    assert energy.per_unit(5.0, 100) == pytest.approx(0.05)
    assert energy.mean_power(None, 3.0) is None and energy.mean_power(3.0, 0.0) is None


def powercap(root: Path, zones: dict[str, tuple[str, int, int]]) -> Path:
    """A powercap tree as Linux lays it out: intel-rapl:N/{name,energy_uj,max_energy_range_uj}."""
    for zone, (name, value, wraps) in zones.items():
        (root / zone).mkdir(parents=True)
        (root / zone / "name").write_text(name + "\n")
        (root / zone / "energy_uj").write_text(f"{value}\n")
        (root / zone / "max_energy_range_uj").write_text(f"{wraps}\n")
    return root


def test_rapl_reads_the_packages_not_their_sub_domains(tmp_path: Path) -> None:
    root = powercap(tmp_path, {"intel-rapl:0": ("package-0", 5_000_000, 2**32),
                               "intel-rapl:0:0": ("core", 1_000_000, 2**32),
                               "intel-rapl:1": ("package-1", 7_000_000, 2**32)})
    domains, why = energy.rapl_packages(root)
    assert why is None and [d.name for d in domains] == ["package-0", "package-1"]
    values, why = energy.read_rapl(domains)
    assert values == [5_000_000, 7_000_000] and why is None
    start = [Reading(0.0, v) for v in values]
    end = [Reading(2.0, 2**32 - 1_000_000), Reading(2.0, 9_000_000)]  # package-0 did not wrap
    found = energy.cpu_window_energy(domains, start, end)
    assert found.joules == pytest.approx((2**32 - 6_000_000) * 1e-6 + 2.0)


def test_no_rapl_is_a_reason(tmp_path: Path) -> None:
    domains, why = energy.rapl_packages(tmp_path / "absent")
    assert domains == [] and "does not exist" in str(why)
    domains, why = energy.rapl_packages(tmp_path)
    assert domains == [] and "no RAPL package domain" in str(why)


def test_this_machine_says_why_when_it_has_no_rapl() -> None:
    domains, why = energy.rapl_packages()
    assert bool(domains) != bool(why)  # either domains to read or the reason there are none


def test_a_cpu_run_measures_no_gpu_energy_and_says_why() -> None:
    with energy.GpuEnergyMeter(None) as meter:
        pass
    assert meter.energy() == Energy(None, None, "CPU run: no GPU")


def test_the_cpu_meter_reads_a_powercap_tree(tmp_path: Path) -> None:
    root = powercap(tmp_path, {"intel-rapl:0": ("package-0", 1_000_000, 2**32)})
    with energy.CpuEnergyMeter(root) as meter:
        (root / "intel-rapl:0" / "energy_uj").write_text("3500000\n")  # 2.5 J later
        time.sleep(energy.RAPL_MIN_WINDOW_S)  # RAPL updates about every millisecond
    assert meter.energy().joules == pytest.approx(2.5)
    with energy.CpuEnergyMeter(tmp_path / "none") as absent:
        pass
    assert absent.energy().joules is None and "does not exist" in str(absent.energy().reason)


def test_a_trial_sums_its_gpus_and_its_nodes_packages() -> None:
    ranks = [{"rank": 0, **energy.rank_record(Energy(300.0, "counter"), Energy(50.0, "counter"))},
             {"rank": 1, **energy.rank_record(Energy(310.0, "counter"), None)}]  # same node
    metrics, reasons = energy.trial_metrics(ranks, samples=6000, seconds=2.0)
    assert metrics == pytest.approx({"energy_j": 610.0, "energy_per_sample_j": 610.0 / 6000,
                                     "mean_power_w": 305.0, "cpu_energy_j": 50.0,
                                     "node_energy_per_sample_j": 660.0 / 6000})  # GPUs + packages
    assert reasons == {}


def test_a_cpu_trial_records_every_energy_as_null_with_its_reason() -> None:
    ranks = [{"rank": r, **energy.rank_record(Energy(None, None, "CPU run: no GPU"),
                                              Energy(None, None, "no RAPL package domain") if r == 0
                                              else None)} for r in range(2)]
    metrics, reasons = energy.trial_metrics(ranks, samples=100, seconds=1.0)
    assert set(metrics.values()) == {None}
    no_gpu = "rank 0: CPU run: no GPU"
    assert reasons == {"energy_j": no_gpu, "energy_per_sample_j": no_gpu, "mean_power_w": no_gpu,
                       "cpu_energy_j": "rank 0: no RAPL package domain",
                       "node_energy_per_sample_j": f"the GPUs: {no_gpu}"}


def test_a_window_of_a_sampled_counter_is_interpolated() -> None:
    series = [(100.0 + t, 300_000 * t) for t in range(10)]  # 300 W in mJ, sampled every second
    assert energy.counter_at(series, 101.5) == pytest.approx(450_000)
    assert energy.energy_between(series, 100.5, 106.5).joules == pytest.approx(1800.0)
    short = energy.energy_between(series, 100.5, 102.5)  # 2 s: the counter reads it low
    assert short == Energy(None, None, "a 2.000 s window is shorter than the 5 s the energy counter needs")
    assert "not sampled over the whole window" in str(energy.energy_between(series, 99.0, 105.0).reason)


def test_psys_is_not_a_package(tmp_path: Path) -> None:
    root = powercap(tmp_path, {"intel-rapl:0": ("package-0", 1, 2**32), "intel-rapl:1": ("psys", 1, 2**32)})
    assert [d.name for d in energy.rapl_packages(root)[0]] == ["package-0"]


def test_a_null_energy_metric_never_has_the_reason_none() -> None:
    ranks = [{"rank": 0, **energy.rank_record(Energy(50.0, "counter"), None)}]
    metrics, reasons = energy.trial_metrics(ranks, samples=0, seconds=0.0)
    assert metrics["energy_j"] == 50.0 and metrics["energy_per_sample_j"] is None
    assert reasons == {"energy_per_sample_j": "no sample was trained", "mean_power_w": "a zero-length window",
                       "cpu_energy_j": "no device to measure",
                       "node_energy_per_sample_j": "the CPU packages: no device to measure"}


def test_the_cpu_meter_follows_a_counter_that_wraps_more_than_once(tmp_path: Path) -> None:
    root = powercap(tmp_path, {"intel-rapl:0": ("package-0", 9_000, 10_000)})
    counter = root / "intel-rapl:0" / "energy_uj"
    # the meter's own thread never fires in this test (a busy machine could make it miss a read):
    # its reads are made here, one per counter value, and the last one by the end of the block
    with energy.CpuEnergyMeter(root, period_s=3600.0) as meter:
        for value in (2_000, 9_500):  # 3000 (a wrap), 7500 microjoules
            counter.write_text(f"{value}\n")
            assert meter._step()
        counter.write_text("1000\n")  # 1500 (a wrap)
    assert meter.energy().joules == pytest.approx(0.012)


def test_how_a_trials_energy_was_read_is_kept_and_counted() -> None:
    from multicard.judge import summarize

    counter = {**energy.rank_record(Energy(100.0, "counter"), Energy(5.0, "counter"))}
    gpu_only = {**energy.rank_record(Energy(90.0, "counter"), None)}
    assert energy.trial_sources([counter, gpu_only]) == {"energy_j": "NVML counter",
                                                         "cpu_energy_j": "RAPL counter"}
    cpu_run = energy.rank_record(Energy(None, None, "CPU run: no GPU"), Energy(None, None, "no powercap"))
    assert energy.trial_sources([cpu_run]) == {}
    records = [{"status": "ok", "measured_how": {"energy_j": "NVML counter"}},
               {"status": "ok", "measured_how": {"energy_j": "NVML counter"}},
               {"status": "ok", "measured_how": {}}, {"status": "oom"}]
    assert summarize.energy_sources(records) == {"NVML counter": 2}


def nvml_stand_in(counter: object = lambda handle: 0) -> object:
    """pynvml's calls the GPU meter makes: init, a handle by UUID, the energy counter (mJ)."""
    from types import SimpleNamespace

    return SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetHandleByUUID=lambda uuid: uuid,
                           nvmlDeviceGetTotalEnergyConsumption=counter)


class Clock:
    """Monotonic seconds a test sets: the meters read it, nothing sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def stand_in_counter(monkeypatch: pytest.MonkeyPatch, clock: Clock, watts: float = 250.0,
                     fails_after: int = 10**9) -> None:
    """pynvml with a counter that moves `watts` per second of `clock` (failing after
    `fails_after` reads)."""
    import sys

    reads = {"n": 0}

    def counter(handle: object) -> int:
        reads["n"] += 1
        if reads["n"] > fails_after:
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        return 7_000_000 + int(watts * 1000 * clock.now)

    monkeypatch.setitem(sys.modules, "pynvml", nvml_stand_in(counter))


def metered(clock: Clock, seconds: float) -> Energy:
    with energy.GpuEnergyMeter("GPU-a", clock=clock) as meter:
        clock.now += seconds
    return meter.energy()


def test_the_gpu_meter_reads_the_counter_over_5_s_and_nothing_under(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    stand_in_counter(monkeypatch, clock)
    assert metered(clock, 5.0) == Energy(pytest.approx(1250.0), "counter")
    short = metered(clock, 4.9)
    assert short == Energy(None, None, "a 4.900 s window is shorter than the 5 s the energy counter needs")


def test_a_short_window_is_null_with_the_same_reason_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    # a vision trial (its ranks' meters) and an LLM trial (the runner's sampled series) say alike
    clock = Clock()
    stand_in_counter(monkeypatch, clock)
    ranks = [{"rank": 0, **energy.rank_record(metered(clock, 4.9), None)}]
    metrics, reasons = energy.trial_metrics(ranks, samples=1000, seconds=4.9)
    assert metrics["energy_j"] is None and metrics["energy_per_sample_j"] is None
    assert metrics["mean_power_w"] is None  # never 0
    why = "a 4.900 s window is shorter than the 5 s the energy counter needs"
    assert {reasons[k] for k in ("energy_j", "energy_per_sample_j", "mean_power_w")} == {f"rank 0: {why}"}
    series = [(100.0 + t, 250_000 * t) for t in range(10)]
    assert energy.energy_between(series, 100.0, 104.9).reason == why


def test_a_window_started_after_the_barrier_drops_what_came_before(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    stand_in_counter(monkeypatch, clock)
    with energy.GpuEnergyMeter("GPU-a", clock=clock) as meter:
        clock.now += 30.0  # a long barrier: not the timed region
        meter.mark_start()
        clock.now += 6.0
    assert meter.energy() == Energy(pytest.approx(1500.0), "counter")  # 6 s at 250 W


def test_a_failed_closing_read_is_null_with_why(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    stand_in_counter(monkeypatch, clock, fails_after=1)  # the exit read fails
    found = metered(clock, 10.0)
    assert found == Energy(None, None, "NVML's energy counter: NVML_ERROR_UNKNOWN")
