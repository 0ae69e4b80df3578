"""Figures (PNG) of one experiment: the primary metric per config (with the speed-up over the
baseline beside the paper's values), the time breakdown, time and energy side by side, and the
bottleneck ladder.

Every title says what kind of run drew it (formatting.run_nature: a CPU smoke with n = 1 is not
a result); an axis whose values span more than SPAN_FOR_LOG is logarithmic, so that a small bar
is not flattened under a large one; a series with no ok trial stays in the legend, marked.
"""

from __future__ import annotations

import itertools
import math
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from multicard.judge import claims, summarize
from multicard.plan.spec import Spec, level_rank
from multicard.publish.formatting import config_tick, label, run_nature

SPAN_FOR_LOG = 10.0
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
TITLE_CHARS_PER_INCH = 13  # what a 9-point title fits across an inch of figure
PAPER_READINGS = {"speedup_x": "ratio", "gain_pct": "gain_pct", "time_reduction_pct": "time_reduction_pct"}


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_title(spec: Spec, what: str | None = None) -> str:
    from multicard.judge.summarize import is_loader_only

    title = spec.title + (": the loader alone, no model" if is_loader_only(spec) else "")
    return f"{title}{' - ' + what if what else ''} ({run_nature(spec)})"


def plot_primary(spec: Spec, table: pd.DataFrame, trials: pd.DataFrame, target: Path) -> bool:
    """Primary metric vs the figure's x factor: one colour per series, one marker per level of
    the factors the figure does not name, one panel per facet value, 95 % CI bars and one dot
    per trial; below, the speed-up over the baseline with the paper's values where it has some."""
    if not spec.figure:
        return False
    plt = pyplot()
    facet = spec.figure.get("facet")
    panels = sorted(table.groupby(facet, sort=False), key=lambda kv: level_rank(spec, facet, kv[0])) \
        if facet else [(None, table)]
    speedups = bool(spec.baseline) and "speedup" in table and table["speedup"].notna().any()
    rows = 2 if speedups else 1
    width = max(5.6 * len(panels), 6.4)
    fig, axes = plt.subplots(rows, len(panels), figsize=(width, 4.2 * rows), squeeze=False,
                             layout="constrained")
    for column, (value, panel) in enumerate(panels):
        _draw_panel(axes[0][column], spec, panel, trials, spec.primary)
        if speedups:
            _draw_speedups(axes[1][column], spec, panel)
        if facet:
            axes[0][column].set_title(f"{facet} = {value}", fontsize=9)
    _title(fig, figure_title(spec), width)
    _save(fig, target)
    return True


def _series(spec: Spec, table: pd.DataFrame) -> list[tuple[str, pd.DataFrame, int, int]]:
    """(legend label, rows, colour index, marker index) per line: the series factor sets the
    colour, the factors the figure leaves unnamed set the marker (warm and cold page cache are
    two lines, not one zigzag)."""
    named = {spec.figure["x"], spec.figure.get("series"), spec.figure.get("facet")}
    rest = [k for k in spec.grid if k not in named]
    series = spec.figure.get("series")
    keys = [k for k in (series, *rest) if k]
    if not keys:
        return [("", table, 0, 0)]
    def order(key: str, value: Any) -> int:
        return level_rank(spec, key, value)

    colours = {v: i for i, v in enumerate(sorted(table[series].unique(), key=lambda v: order(series, v)))} \
        if series else {}
    combos = sorted({tuple(r) for r in table[rest].to_numpy()},
                    key=lambda c: [order(k, v) for k, v in zip(rest, c, strict=True)])
    marks = {v: i for i, v in enumerate(combos)}
    lines = []
    grouped = sorted(table.groupby(keys, sort=False),
                     key=lambda kv: [order(k, v) for k, v in zip(keys, _tuple(kv[0]), strict=True)])
    for values, group in grouped:
        values = _tuple(values)
        found = dict(zip(keys, values, strict=True))
        lines.append((", ".join(f"{k}={v}" for k, v in found.items()), group,
                      colours.get(found.get(series), 0) if series else 0,
                      marks.get(tuple(found[k] for k in rest), 0) if rest else 0))
    return lines


def _tuple(values: Any) -> tuple[Any, ...]:
    return values if isinstance(values, tuple) else (values,)


def _draw_panel(ax: Any, spec: Spec, table: pd.DataFrame, trials: pd.DataFrame, metric: str) -> None:
    x_key = spec.figure["x"]
    xs = sorted(spec.grid.get(x_key, [spec.fixed.get(x_key)]))
    lines = _series(spec, table)
    # series are dodged sideways so that error bars at the same x stay readable
    width = 0.5 * min((b - a for a, b in itertools.pairwise(xs)), default=1)
    for i, (name, group, colour, marker) in enumerate(lines):
        shift = width * ((i + 0.5) / len(lines) - 0.5)
        group = group.sort_values(x_key)
        mean = group[f"{metric}.mean"]
        if mean.isna().all():  # in the legend, marked, so a missing line is not a silent one
            ax.plot([], [], marker=MARKERS[marker], linestyle="none", color=f"C{colour}",
                    label=f"{name} (no ok trial)")
            continue
        err = [(mean - group[f"{metric}.ci_lo"]).fillna(0), (group[f"{metric}.ci_hi"] - mean).fillna(0)]
        ax.errorbar(group[x_key] + shift, mean, yerr=err, marker=MARKERS[marker], capsize=3,
                    color=f"C{colour}", label=name or None)
        raw = trials[trials["config_id"].isin(group["config_id"])]
        ax.scatter(raw[x_key] + shift, raw[metric], s=10, alpha=0.4, color=f"C{colour}")
    ax.set_xticks(xs, [config_tick(x_key, x) for x in xs])
    ax.set_ylabel(textwrap.fill(_axis_label(spec, metric) + " (mean, 95% CI; dots: trials)", 48), fontsize=8)
    _log_if_wide(ax, table[f"{metric}.mean"])
    if any(name for name, *_ in lines):
        ax.legend(fontsize=7)


def _draw_speedups(ax: Any, spec: Spec, table: pd.DataFrame) -> None:
    """Speed-up over the baseline per config (95 % CI), the paper's value or span beside it as
    a hollow mark or a bar."""
    shown = table[~table["baseline"].astype(bool)].reset_index(drop=True)
    ticks = _ticks(spec, shown)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    mean = shown["speedup"]
    err = [(mean - shown["speedup.lo"]).fillna(0), (shown["speedup.hi"] - mean).fillna(0)]
    ax.errorbar(range(len(shown)), mean, yerr=err, fmt="o", capsize=3, color="C0", label="ours")
    for i in [i for i, v in enumerate(mean) if pd.isna(v)]:  # skipped or failed: said, not blank
        ax.text(i, 0.05, "no ok trial", transform=ax.get_xaxis_transform(), rotation=90,
                ha="center", va="bottom", fontsize=7, color="grey")
    labelled = False
    for i, paper in enumerate(shown["paper"]):
        for low, high in _paper_speedups(paper):
            ax.plot([i + 0.15, i + 0.15], [low, high], color="C3", linewidth=4 if high > low else 0,
                    marker="" if high > low else "D", fillstyle="none",
                    label=None if labelled else "the paper")
            labelled = True
    ax.set_xticks(range(len(shown)), ticks, rotation=90, fontsize=7)
    base = ", ".join(f"{k}={v}" for k, v in spec.baseline.items())
    ax.set_ylabel(f"speed-up vs {base} (x, 95% CI)", fontsize=8)
    ax.legend(fontsize=7)


def _paper_speedups(paper: dict[str, Any]) -> Iterable[tuple[float, float]]:
    """The paper's speed-up values of a config as (low, high) ratios, whatever it gave them as."""
    for key, quantity in PAPER_READINGS.items():
        if key in paper:
            low, high = paper[key] if isinstance(paper[key], tuple) else (paper[key], paper[key])
            yield math.exp(claims.as_log_ratio(quantity, low)), math.exp(claims.as_log_ratio(quantity, high))


def _axis_label(spec: Spec, metric: str) -> str:
    from multicard.judge.summarize import is_loader_only

    if is_loader_only(spec) and metric == "train_time_s":
        return "loader time, batches onto the device, no model (s)"
    return label(metric)


def _log_if_wide(ax: Any, values: pd.Series) -> None:
    positive = values[values > 0].dropna()
    if len(positive) and positive.max() / positive.min() > SPAN_FOR_LOG:
        ax.set_yscale("log")


def _title(fig: Any, text: str, width_in: float) -> None:
    fig.suptitle(textwrap.fill(text, max(30, int(width_in * TITLE_CHARS_PER_INCH))), fontsize=9)


def _ticks(spec: Spec, table: pd.DataFrame) -> list[str]:
    """One tick per row: `loader=torch, 1 GPU` (the factors the table has)."""
    return [", ".join(config_tick(k, r[k]) for k in spec.grid if k in table) for _, r in table.iterrows()]


def plot_breakdown(spec: Spec, table: pd.DataFrame, target: Path) -> bool:
    """Per config, mean training time split into waiting for the loader, waiting in the copy and
    everything else."""
    if not spec.breakdown:
        return False
    plt = pyplot()
    ticks = _ticks(spec, table)
    compute, wait = table["breakdown.compute_s"].fillna(0), table["breakdown.data_wait_s"].fillna(0)
    copy = table["breakdown.h2d_wait_s"].fillna(0)
    width = max(6.4, 0.45 * len(ticks))
    fig, ax = plt.subplots(figsize=(width, 4.6), layout="constrained")
    ax.bar(ticks, compute, label="compute (and the rest)")
    ax.bar(ticks, copy, bottom=compute, label="blocked in the host-to-device copy")
    ax.bar(ticks, wait, bottom=compute + copy, label="waiting for the loader (next())")
    ax.set_ylabel("train time (s), mean over trials")
    ax.tick_params(axis="x", labelrotation=90, labelsize=7)
    ax.legend(fontsize=8)
    _title(fig, figure_title(spec, "compute vs waiting for data"), width)
    _save(fig, target)
    return True


ENERGY_PER_UNIT = ("energy_per_sample_j", "energy_per_token_j")


def plot_time_and_energy(spec: Spec, table: pd.DataFrame, target: Path) -> bool:
    """Per config, the primary metric and GPU energy per image (vision) or per token (LLM) side
    by side (mean, 95% CI); an energy panel with nothing measured says so instead of drawing
    zeros, and a config whose energy fewer than 3 trials measured has no bar (summarize.withheld)."""
    metric = next((m for m in ENERGY_PER_UNIT if m in spec.metrics), None)
    if metric is None:
        return False
    plt = pyplot()
    ticks = _ticks(spec, table)
    width = max(8.0, 0.9 * len(ticks))
    fig, axes = plt.subplots(1, 2, figsize=(width, 4.6), layout="constrained")
    for ax, key in zip(axes, (spec.primary, metric), strict=True):
        mean = table[f"{key}.mean"]
        if mean.isna().all():
            withheld = table.get(f"{key}.withheld", pd.Series(dtype=object)).notna().any()
            ax.text(0.5, 0.5, f"{label(key)}: " + (f"fewer than {summarize.MIN_ENERGY_TRIALS} trials "
                                                   "measured it" if withheld else "not measured"),
                    ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        err = [(mean - table[f"{key}.ci_lo"]).fillna(0), (table[f"{key}.ci_hi"] - mean).fillna(0)]
        ax.bar(ticks, mean, yerr=err, capsize=3)
        ax.set_ylabel(_axis_label(spec, key) + " (mean, 95% CI)", fontsize=8)
        ax.tick_params(axis="x", labelrotation=90, labelsize=7)
        _log_if_wide(ax, mean)
    _title(fig, figure_title(spec, "time and energy"), width)
    _save(fig, target)
    return True


def plot_ladder(spec: Spec, table: pd.DataFrame, ladder: pd.DataFrame, target: Path) -> bool:
    """Per config with a synthetic-loader twin, images/s of the whole trial (p_whole), of the
    training loop with the real loader (p_train) and with the synthetic one (the ceiling), side
    by side on a log axis where they span more than 10x (stacked, the small rung vanished under
    the loader-alone mark); the loader alone (when a loader_only run was given) beside them."""
    if "bound" not in table or ladder.empty:
        return False
    plt = pyplot()
    ticks = _ticks(spec, ladder)
    rungs = {"whole trial (start-up, evaluation included)": ladder["p_whole"],
             "training loop, real loader": ladder["p_train"],
             "training loop, synthetic loader (the ceiling)": ladder["ceiling"]}
    alone = ladder["loader_only"] if "loader_only" in ladder else pd.Series(dtype=float)
    if alone.notna().any():
        rungs["loader alone, no model (a loader_only run)"] = alone
    width = max(6.4, 0.9 * len(ticks))
    fig, ax = plt.subplots(figsize=(width, 4.8), layout="constrained")
    bar = 0.8 / len(rungs)
    for i, (name, values) in enumerate(rungs.items()):
        ax.bar([x + (i - (len(rungs) - 1) / 2) * bar for x in range(len(ticks))], values, bar, label=name)
    ax.set_xticks(range(len(ticks)), ticks, rotation=90, fontsize=7)
    ax.set_ylabel("images/s (mean over trials)")
    _log_if_wide(ax, pd.concat(list(rungs.values())))
    ax.legend(fontsize=7)
    _title(fig, figure_title(spec, "the bottleneck ladder"), width)
    _save(fig, target)
    return True


def _save(fig: Any, target: Path) -> None:
    """Write the figure (its layout is constrained: titles and labels fit) and free it (pyplot
    keeps every open figure)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=120)
    pyplot().close(fig)
