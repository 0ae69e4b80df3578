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


def test_a_window_shorter_than_the_counter_resolves_integrates_power() -> None:
    start, end = Reading(0.0, 1000), Reading(0.4, 1000)  # the counter has not moved yet
    samples = [(0.0, 200.0), (0.2, 300.0), (0.4, 300.0)]  # 0.2 * 250 + 0.2 * 300
    found = energy.window_energy(start, end, 1e-3, None, samples)
    assert found.joules == pytest.approx(110.0) and found.source == "integrated power"
    assert "0.400 s window is shorter than the counter resolves (5 s)" in str(found.reason)
    unmeasured = energy.window_energy(start, end, 1e-3, None, samples[:1])
    assert unmeasured.joules is None and "fewer than 2 power samples" in str(unmeasured.reason)


def test_a_sum_over_gpus_is_none_when_one_is_missing() -> None:
    ok = Energy(10.0, "counter")
    short = Energy(2.0, "integrated power", "a 0.5 s window ...")
    assert energy.total([("GPU 0", ok), ("GPU 1", short)]) == Energy(
        12.0, "counter + integrated power", "a 0.5 s window ...")
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
    assert short.joules is None and "shorter than the counter resolves (5 s)" in str(short.reason)
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


def test_short_window_power_is_held_out_to_the_window_edges() -> None:
    # samples start a period late and end a period early: 0.5 s at 200 W is 100 J, not 40
    found = energy.window_energy(Reading(0.0, 5), Reading(0.5, 5), 1e-3, None, [(0.1, 200.0), (0.3, 200.0)])
    assert found.joules == pytest.approx(100.0) and found.source == "integrated power"


def test_how_a_trials_energy_was_read_is_kept_and_counted() -> None:
    from multicard.judge import summarize

    counter = {**energy.rank_record(Energy(100.0, "counter"), Energy(5.0, "counter"))}
    short = {**energy.rank_record(Energy(1.0, "integrated power"), None)}
    assert energy.trial_sources([counter, counter]) == {"energy_j": "NVML counter",
                                                        "cpu_energy_j": "RAPL counter"}
    assert energy.trial_sources([counter, short]) == {"energy_j": "NVML counter + integrated power",
                                                      "cpu_energy_j": "RAPL counter"}
    cpu_run = energy.rank_record(Energy(None, None, "CPU run: no GPU"), Energy(None, None, "no powercap"))
    assert energy.trial_sources([cpu_run]) == {}
    records = [{"status": "ok", "measured_how": {"energy_j": "NVML counter"}},
               {"status": "ok", "measured_how": {"energy_j": "NVML counter"}},
               {"status": "ok", "measured_how": {}}, {"status": "oom"}]
    assert summarize.energy_sources(records) == {"NVML counter": 2}


def test_power_samples_with_a_gap_do_not_stand_in_for_a_counter_that_went_back() -> None:
    # the meter stops sampling power 2 s into a window when the counter works; if the counter
    # then goes back (a driver reload), samples at the start and the end must not be stretched
    start, end = Reading(0.0, 5000), Reading(3600.0, 10)
    samples = [(0.0, 250.0), (0.05, 250.0), (2.0, 250.0), (3600.0, 260.0)]
    found = energy.window_energy(start, end, 1e-3, None, samples)
    assert found.joules is None and "leave a 3598.0 s gap" in str(found.reason)
    assert "the counter went back" in str(found.reason)


def nvml_stand_in(counter: object = lambda handle: 0, instant_mw: int | None = 250_000,
                  plain_mw: int = 250_000, architecture: int = 9) -> object:
    """pynvml's calls the meters make: the instantaneous power field where `instant_mw` is
    given (else NOT_SUPPORTED, 3), a plain power reading, the architecture (9: Hopper)."""
    from types import SimpleNamespace

    def fields(handle: object, ids: list[int]) -> list[object]:
        assert ids == [186]
        supported = instant_mw is not None
        return [SimpleNamespace(nvmlReturn=0 if supported else 3,
                                value=SimpleNamespace(uiVal=instant_mw or 0))]

    return SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetHandleByUUID=lambda uuid: uuid,
        nvmlDeviceGetTotalEnergyConsumption=counter, nvmlDeviceGetPowerUsage=lambda handle: plain_mw,
        NVML_FI_DEV_POWER_INSTANT=186, nvmlDeviceGetFieldValues=fields,
        nvmlDeviceGetArchitecture=lambda handle: architecture)


def test_short_windows_read_instantaneous_power_never_a_1_second_average() -> None:
    reader, why = energy.instant_power_reader(nvml_stand_in(instant_mw=300_000, plain_mw=250_000), "h")
    assert why is None and reader is not None and reader() == 300.0  # the field, not the average
    volta = nvml_stand_in(instant_mw=None, plain_mw=250_000, architecture=5)
    reader, why = energy.instant_power_reader(volta, "h")
    assert why is None and reader is not None and reader() == 250.0  # instantaneous before Ampere
    hopper = nvml_stand_in(instant_mw=None, architecture=9)
    reader, why = energy.instant_power_reader(hopper, "h")
    assert reader is None and "the plain reading is a 1-second average on this GPU" in str(why)


def test_a_short_window_without_instantaneous_power_is_null_with_why(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    reads = iter(range(0, 10**9, 1000))
    monkeypatch.setitem(sys.modules, "pynvml", nvml_stand_in(lambda handle: next(reads), instant_mw=None))
    with energy.GpuEnergyMeter("GPU-a", period_s=0.01) as meter:
        time.sleep(0.2)  # under the counter's 5 s
    found = meter.energy()
    assert found.joules is None and "shorter than the counter resolves (5 s)" in str(found.reason)
    assert "1-second average" in str(found.reason)


def stand_in_nvml(monkeypatch: pytest.MonkeyPatch, counter_fails_after: int = 10**9) -> None:
    """pynvml as GpuEnergyMeter calls it: a counter moving 1000 mJ per read (failing after
    `counter_fails_after` reads), power 250 W."""
    import sys

    reads = {"n": 0}

    def counter(handle: object) -> int:
        reads["n"] += 1
        if reads["n"] > counter_fails_after:
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        return 1000 * reads["n"]

    monkeypatch.setitem(sys.modules, "pynvml", nvml_stand_in(counter))
    monkeypatch.setattr(energy, "MIN_COUNTER_WINDOW_S", 0.05)  # the sampler stops after 0.1 s


def test_the_gpu_meter_samples_power_only_as_long_as_a_short_window_needs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in_nvml(monkeypatch)
    with energy.GpuEnergyMeter("GPU-a", period_s=0.01) as meter:
        time.sleep(1.2)  # longer than the counter's 1 s (the default window_energy resolves)
    # about 0.1 s of samples at 100 Hz, one at entry and one at exit: not 120
    assert 3 <= len(meter.power) <= 20
    assert meter.energy() == Energy(pytest.approx(1.0), "counter")  # 1000 mJ between the reads


def test_a_window_started_after_the_barrier_samples_again_and_drops_what_came_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in_nvml(monkeypatch)
    monkeypatch.setattr(energy, "MIN_COUNTER_WINDOW_S", 0.3)  # the sampler sleeps after 0.6 s
    with energy.GpuEnergyMeter("GPU-a", period_s=0.01) as meter:
        time.sleep(0.7)  # a long barrier: the sampler has gone to sleep
        meter.mark_start()
        time.sleep(0.2)  # a short timed region: the counter cannot resolve it
    assert all(t >= meter._window[0] for t, _ in meter.power) and len(meter.power) >= 10
    found = meter.energy()
    assert found.source == "integrated power" and found.joules == pytest.approx(250.0 * 0.2, rel=0.25)


def test_a_failed_closing_read_never_stretches_a_few_power_samples_over_the_window(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in_nvml(monkeypatch, counter_fails_after=1)  # the exit read fails
    with energy.GpuEnergyMeter("GPU-a", period_s=0.01) as meter:
        time.sleep(1.2)
    found = meter.energy()
    assert found.joules is None
    assert "NVML's energy counter: NVML_ERROR_UNKNOWN" in str(found.reason) and "gap" in str(found.reason)
