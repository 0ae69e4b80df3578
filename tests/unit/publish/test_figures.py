"""What a reader sees in the figures: readable at 1280 px, every mark over its own tick, facets
on one scale, missing series and inverted ladders said, no half-empty energy figure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection

from multicard.judge import summarize
from multicard.plan import spec
from multicard.publish import figures, formatting
from tests.helpers import TINY_FIXED, write_spec

Times = dict[tuple[str, str, int], list[float]]


def nhwc_like(tmp_path: Path, times: Times) -> tuple[spec.Spec, pd.DataFrame, pd.DataFrame]:
    """A loader x layout x gpus grid drawn as Figure 9 is (x gpus, series layout, facet loader),
    its trials' train times from `times` (a config left out has no ok trial)."""
    path = write_spec(tmp_path, fixed={**TINY_FIXED, "scenario": "b"},
                      grid={"loader": ["torch", "dali", "synthetic"], "layout": ["nchw", "nhwc"],
                            "gpus": [1, 2, 4]},
                      baseline={"layout": "nchw"},
                      report={"primary": "train_time_s", "figure": {"x": "gpus", "series": "layout",
                                                                    "facet": "loader"}})
    s = spec.load(path)
    rows = [{**config, "config_id": cid, "trial": t, **dict.fromkeys(s.metrics, float("nan")),
             "train_time_s": v}
            for cid, config, _ in spec.configs(s)
            for t, v in enumerate(times.get((config["loader"], config["layout"], config["gpus"]), []))]
    trials = pd.DataFrame(rows)
    failed = pd.DataFrame(columns=["config_id", "status", "error_type"])
    return s, summarize.config_table(s, trials, failed), trials


def every_time(scale: float) -> Times:
    return {(loader, layout, gpus): [scale * k * gpus * (1.1 if layout == "nhwc" else 1.0) + d
                                     for d in (0.0, 0.1, 0.2)]
            for k, loader in enumerate(("torch", "dali", "synthetic"), start=1)
            for layout in ("nchw", "nhwc") for gpus in (1, 2, 4)}


def test_three_facets_fit_1280_px_on_one_y_scale_with_every_mark_over_its_tick(tmp_path: Path) -> None:
    s, table, trials = nhwc_like(tmp_path, every_time(1.0))
    fig = figures.primary_figure(s, table, trials)
    try:
        assert fig.get_figwidth() * figures.DPI <= 1280
        tops = [ax for ax in fig.axes if ax.get_title().startswith("loader = ")]
        assert [ax.get_title() for ax in tops] == ["loader = torch", "loader = dali", "loader = synthetic"]
        assert len({round(ax.get_position().x0, 3) for ax in tops}) == figures.MAX_COLUMNS
        assert len({ax.get_ylim() for ax in tops}) == 1  # one scale over the facets
        low, high = tops[0].get_ylim()
        for ax in tops:
            ticks = ax.get_xticks()
            assert [t.get_text() for t in ax.get_xticklabels()] == ["1 GPU", "2 GPUs", "4 GPUs"]
            assert ax.get_xlim() == (-0.5, 2.5)
            dots = [c for c in ax.collections if isinstance(c, PathCollection)]
            assert len(dots) == 2  # the trial dots of each series: each within its tick's slot
            for points in dots:
                xy = points.get_offsets()
                assert len(xy) and all(np.min(np.abs(ticks - x)) <= figures.DODGE / 2 for x in xy[:, 0])
                assert all(low < y < high for y in xy[:, 1])  # none on the panel's edge
    finally:
        figures.pyplot().close(fig)


def test_a_series_with_no_ok_trial_in_one_facet_says_where(tmp_path: Path) -> None:
    times = {k: v for k, v in every_time(1.0).items() if not (k[0] == "dali" and k[1] == "nhwc")}
    times = {k: v for k, v in times.items() if k[1] != "nhwc" or k[0] != "synthetic"}
    s, table, trials = nhwc_like(tmp_path, times)
    fig = figures.primary_figure(s, table, trials)
    try:
        [legend] = fig.legends
        labels = [t.get_text() for t in legend.get_texts()]
        assert labels == ["layout=nchw", "layout=nhwc (no ok trial: loader=dali, loader=synthetic)"]
    finally:
        figures.pyplot().close(fig)


def test_the_speed_up_ticks_name_only_what_differs(tmp_path: Path) -> None:
    s, table, trials = nhwc_like(tmp_path, every_time(1.0))
    fig = figures.primary_figure(s, table, trials)
    try:
        below = [ax for ax in fig.axes if ax.get_ylabel().startswith("speed-up")]
        assert [t.get_text() for t in below[0].get_xticklabels()] == ["1 GPU", "2 GPUs", "4 GPUs"]
    finally:
        figures.pyplot().close(fig)


def test_a_wide_span_gets_a_log_axis_in_plain_numbers(tmp_path: Path) -> None:
    times = every_time(1.0) | {("synthetic", layout, g): [400.0 * g, 401.0 * g]
                               for layout in ("nchw", "nhwc") for g in (1, 2, 4)}
    s, table, trials = nhwc_like(tmp_path, times)
    fig = figures.primary_figure(s, table, trials)
    try:
        top = fig.axes[0]
        assert top.get_yscale() == "log"
        fig.canvas.draw()
        shown = [t.get_text() for t in top.get_yticklabels() if t.get_text()]
        assert shown and all("10^" not in t and "times" not in t for t in shown), shown
    finally:
        figures.pyplot().close(fig)


def ladder_rows(p_train: float, ceiling: float) -> tuple[pd.DataFrame, list[str]]:
    ladder = pd.DataFrame([{"config_id": "c1", "p_whole": 10.0, "p_train": p_train, "ceiling": ceiling,
                            "loader_only": float("nan")}])
    return ladder, ["loader=dali, 1 GPU"]


@pytest.mark.parametrize(("lo", "hi", "said"), [
    (float("nan"), float("nan"), "fewer than 2 trials a side: no interval, so noise cannot be told apart"),
    (0.95, 1.30, "95% CI 0.95-1.30x holds 1: within noise"),
    (1.05, 1.20, "95% CI 1.05-1.20x: the synthetic loader is no ceiling on this machine")])
def test_a_real_loader_above_its_ceiling_is_said_with_its_interval(lo: float, hi: float, said: str) -> None:
    ladder, ticks = ladder_rows(112.0, 100.0)
    table = pd.DataFrame([{"config_id": "c1", "bound.lo": lo, "bound.hi": hi}])
    [(row, text)] = figures._above_ceiling(table, ladder, ticks)
    assert row == 0 and text == f"loader=dali, 1 GPU by 12% ({said})"
    below, _ = ladder_rows(90.0, 100.0)
    assert figures._above_ceiling(table, below, ticks) == []


@pytest.mark.parametrize("metric", sorted(formatting.METRIC_LABELS))
def test_an_axis_reads_in_the_unit_its_label_names_as_the_tables_do(metric: str) -> None:
    # energy is recorded in J and labelled mJ, fractions labelled %, bytes labelled GiB: a figure
    # draws value x display_scale, the number a table prints
    value = 0.123456 * 2**30 if metric.endswith("_bytes") else 0.123456
    assert float(formatting.format_metric(metric, value)) == pytest.approx(
        value * formatting.display_scale(metric), rel=0.01)
    table = pd.DataFrame([{f"{metric}.mean": value, f"{metric}.ci_lo": value / 2, f"{metric}.ci_hi": value}])
    mean, (below, above) = figures._mean_and_error(table, metric)
    scale = formatting.display_scale(metric)
    assert mean[0] == pytest.approx(value * scale) and below[0] == pytest.approx(value * scale / 2)
    assert above[0] == 0


def test_a_facet_with_no_ok_trial_says_so_and_leaves_the_others_scale_alone(tmp_path: Path) -> None:
    times = {k: v for k, v in every_time(10.0).items() if k[0] != "dali"}  # DALI skipped on CPU
    s, table, trials = nhwc_like(tmp_path, times)
    fig = figures.primary_figure(s, table, trials)
    try:
        tops = {ax.get_title(): ax for ax in fig.axes if ax.get_title().startswith("loader = ")}
        assert [t.get_text() for t in tops["loader = dali"].texts] == ["no ok trial"]
        shared = tops["loader = torch"].get_ylim()
        assert shared == tops["loader = synthetic"].get_ylim() and shared[0] > 5  # not pulled to 0-1
    finally:
        figures.pyplot().close(fig)


def test_a_bar_without_a_number_says_why() -> None:
    table = pd.DataFrame([
        {"train_time_s.n": 5, "energy_per_sample_j.withheld": None},  # ok trials, no energy read
        {"train_time_s.n": 5, "energy_per_sample_j.withheld": "n < 3 (n = 2)"},
        {"train_time_s.n": 0, "energy_per_sample_j.withheld": None}])
    assert [figures._why_no_number(table, "energy_per_sample_j", i, "train_time_s") for i in range(3)] == [
        "not measured", "n < 3 (n = 2)", "no ok trial"]
    assert figures._why_no_number(table, "train_time_s", 2, "train_time_s") == "no ok trial"
