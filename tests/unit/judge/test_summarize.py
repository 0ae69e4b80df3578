"""Per-config tables (multicard.judge.summarize): the rule that gates a config's energy."""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd
import pytest

from multicard.judge import stats, summarize
from multicard.plan import spec
from multicard.publish import tables
from tests.helpers import EXPERIMENTS


def test_energy_is_summarized_from_3_readings_and_withheld_below() -> None:
    assert summarize.MIN_ENERGY_TRIALS == 3
    assert summarize.energy_gate(0) == "no trial measured it"
    assert summarize.energy_gate(2) == "n < 3 (n = 2)"
    assert summarize.energy_gate(3) is None


def test_energy_per_precision_carries_its_interval_only_from_3_trials_on() -> None:
    found = summarize.energy_by_group({
        "fp64": [0.124, 0.126],  # two trials: no interval worth printing
        "fp32": [0.092, None, 0.094, 0.093],  # one trial did not measure it: 3 readings
        "fp16": [0.090, 0.091, 0.089],
        "bf16": [None, None, None]})  # e.g. windows under 5 s
    assert found["fp64"] == (None, "n < 3 (n = 2)")
    assert found["bf16"] == (None, "no trial measured it")
    fp16, why = found["fp16"]
    assert why is None and fp16 == stats.summarize([0.090, 0.091, 0.089])
    assert fp16.n == 3 and fp16.mean == pytest.approx(0.090) and fp16.ci_lo < 0.090 < fp16.ci_hi
    fp32, why = found["fp32"]
    assert why is None and fp32.n == 3 and fp32.mean == pytest.approx(0.093)


def test_a_configs_energy_from_fewer_than_3_trials_is_withheld_in_the_table() -> None:
    s = spec.load(EXPERIMENTS / "table2_precision.toml")  # energy_per_sample_j among its metrics
    ids = {tuple(c.values()): cid for cid, c, _ in spec.configs(s)}
    rows = [{"precision": p, "gpus": 1, "config_id": ids[(p, 1)], "trial": t, "train_time_s": time,
             "energy_per_sample_j": joules}
            for p, values in {"fp64": [(10.0, 0.12), (11.0, 0.13)],
                              "fp32": [(5.0, 0.090), (5.5, 0.092), (5.2, 0.091)]}.items()
            for t, (time, joules) in enumerate(values)]
    trials = pd.DataFrame(rows).reindex(columns=[*s.grid, "config_id", "trial", *s.metrics])
    failed = summarize.failures(s, [])
    table = summarize.config_table(s, trials, failed).set_index("config_id")
    two, three = table.loc[ids[("fp64", 1)]], table.loc[ids[("fp32", 1)]]
    assert two["energy_per_sample_j.n"] == 2 and two["energy_per_sample_j.withheld"] == "n < 3 (n = 2)"
    assert all(math.isnan(two[f"energy_per_sample_j.{f}"]) for f in ("mean", "std", "ci_lo", "ci_hi",
                                                                    "median", "min", "max"))
    assert two["train_time_s.mean"] == pytest.approx(10.5)  # the rule is energy's only
    expected = stats.summarize([0.090, 0.092, 0.091])
    assert pd.isna(three["energy_per_sample_j.withheld"])  # shown
    shown = [three[f"energy_per_sample_j.{f}"] for f in ("mean", "ci_lo", "ci_hi")]
    assert shown == pytest.approx([expected.mean, expected.ci_lo, expected.ci_hi])
    assert shown[1] < shown[0] < shown[2]  # an interval, not NaN
    unmeasured = table.loc[ids[("fp16", 1)]]  # no trial at all: left to say "not measured" / "–"
    assert unmeasured["energy_per_sample_j.n"] == 0 and pd.isna(unmeasured["energy_per_sample_j.withheld"])


def test_each_config_carries_its_trials_operating_point_into_the_tables() -> None:
    s = spec.load(EXPERIMENTS / "table2_precision.toml")
    ids = {c["precision"]: cid for cid, c, _ in spec.configs(s) if c["gpus"] == 1}

    def record(precision: str, trial: int, label: str | None) -> dict[str, object]:
        return {"experiment": s.name, "status": "ok", "config_id": ids[precision], "trial": trial,
                "config": {"precision": precision, "gpus": 1}, "metrics": {"train_time_s": 5.0 + trial},
                "bound": {"label": label}}
    records = [record("fp64", 0, "GPU-bound"), record("fp64", 1, "GPU-bound"),
               record("fp32", 0, "GPU-bound"), record("fp32", 1, "host-bound"),
               record("fp16", 0, None)]
    trials = summarize.trial_table(s, records)
    table = summarize.config_table(s, trials, summarize.failures(s, [])).set_index("config_id")
    assert table.loc[ids["fp64"], "operating_point"] == "GPU-bound"
    assert table.loc[ids["fp32"], "operating_point"] == "mixed"
    assert pd.isna(table.loc[ids["fp16"], "operating_point"])  # no probe (CPU): no label, no guess
    shown = tables.headline_table(s, table.reset_index()).set_index(["precision", "gpus"])
    assert [shown.loc[(p, 1), "operating point"] for p in ("fp64", "fp32", "fp16")] == [
        "GPU-bound", "mixed", "–"]
    # a CPU run has no label anywhere: no column claims one
    cpu = trials.assign(operating_point=None)
    assert "operating point" not in tables.headline_table(
        s, summarize.config_table(s, cpu, summarize.failures(s, [])))


@pytest.mark.parametrize("metric", ["gpu_util_mean"])
def test_a_gpus_busy_share_keeps_its_interval_under_100_percent(metric: str) -> None:
    # three trials at 97-100 % NVML utilisation: a log-normal interval of their mean would pass
    # 100 % (the step probe's gpu_busy_fraction is not one of these: measured, it can exceed 1)
    s = replace(spec.load(EXPERIMENTS / "table2_precision.toml"), metrics=["train_time_s", metric])
    cid = next(cid for cid, c, _ in spec.configs(s) if c["precision"] == "fp32")
    trials = pd.DataFrame({"precision": "fp32", "gpus": 1, "config_id": cid, "trial": [0, 1, 2],
                           "train_time_s": [5.0, 5.1, 5.2], metric: [0.97, 1.0, 0.99]})
    row = summarize.config_table(s, trials, summarize.failures(s, [])).set_index("config_id").loc[cid]
    assert stats.mean_ci([0.97, 1.0, 0.99])[1] > 1  # what it would read as a time's interval
    assert 0 < row[f"{metric}.ci_lo"] < row[f"{metric}.mean"] < row[f"{metric}.ci_hi"] <= 1
