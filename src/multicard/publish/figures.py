"""Figures (PNG) of one experiment: the primary metric per config (with the speed-up over the
baseline beside the paper's values), the time breakdown, time and energy side by side, and the
bottleneck ladder.

Every title says what kind of run drew it (formatting.run_nature: a CPU smoke with n = 1 is not
a result); an axis whose values span more than SPAN_FOR_LOG is logarithmic, so that a small bar
is not flattened under a large one; a series with no ok trial stays in the legend, marked.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from multicard.judge import claims
from multicard.plan.spec import Spec, level_rank
from multicard.publish.formatting import config_tick, display_scale, label, run_nature

SPAN_FOR_LOG = 10.0
# a page 1280 px wide shows a figure at full size: DPI x MAX_WIDTH_IN <= 1280
DPI = 120
MAX_WIDTH_IN = 1280 / DPI
MAX_COLUMNS = 2
PANEL_W_IN, PANEL_H_IN = 5.2, 3.4
DODGE = 0.6  # of a tick's slot, shared by the series drawn in it
Y_MARGIN = 0.06
ROW_IN = 0.22  # a horizontal bar per config: a line of 7-point text and its gap
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
    """The primary figure (primary_figure), written to `target`; False where the spec has none."""
    fig = primary_figure(spec, table, trials)
    if fig is None:
        return False
    _save(fig, target)
    return True


def primary_figure(spec: Spec, table: pd.DataFrame, trials: pd.DataFrame) -> Any:
    """Primary metric vs the figure's x factor: one colour per series, one marker per level of
    the factors the figure does not name, one panel per facet value (at most MAX_COLUMNS side by
    side, so that a page 1280 px wide shows it at full size), 95 % CI bars and one dot per trial;
    under each, the speed-up over the baseline with the paper's values where it has some. The
    panels share their y axis (a facet's line is comparable with another's at a glance) and one
    legend below them all."""
    if not spec.figure:
        return None
    plt = pyplot()
    facet = spec.figure.get("facet")
    panels = sorted(table.groupby(facet, sort=False), key=lambda kv: level_rank(spec, facet, kv[0])) \
        if facet else [(None, table)]
    speedups = bool(spec.baseline) and "speedup" in table and table["speedup"].notna().any()
    per_panel = 2 if speedups else 1
    columns = min(len(panels), MAX_COLUMNS)
    blocks = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(blocks * per_panel, columns, figsize=(PANEL_W_IN * columns,
                             PANEL_H_IN * blocks * per_panel), squeeze=False, layout="constrained")
    log = _is_wide(table[f"{spec.primary}.mean"])
    tops, bottoms, drawn = [], [], {}
    for i, (value, panel) in enumerate(panels):
        block, column = divmod(i, columns)
        top = axes[block * per_panel][column]
        lines = _draw_panel(top, spec, panel, trials, spec.primary, log)
        for name, (handle, has_data) in lines.items():
            drawn.setdefault(name, [handle, []])[1].append((f"{facet}={value}" if facet else None, has_data))
        if any(has_data for _, has_data in lines.values()):  # an empty one keeps 0-1: not shared
            tops.append(top)
        if speedups:
            _draw_speedups(axes[block * per_panel + 1][column], spec, panel, facet)
            if panel["speedup"].notna().any():
                bottoms.append(axes[block * per_panel + 1][column])
        if facet:
            top.set_title(f"{facet} = {value}", fontsize=9)
    for i in range(len(panels), blocks * columns):  # the last row's empty places
        for row in range(per_panel):
            axes[(blocks - 1) * per_panel + row][i % columns].set_axis_off()
    for row in (tops, bottoms):
        if len(row) > 1:
            _share_y(row)
    _legend(fig, drawn, columns)
    _title(fig, figure_title(spec), PANEL_W_IN * columns)
    return fig


def _legend(fig: Any, drawn: dict[str, list[Any]], columns: int) -> None:
    """One legend under the panels; a series with no ok trial in some panel says which (in all
    of them: "no ok trial"), so that a missing line is never a silent one."""
    handles, labels = [], []
    for name, (handle, seen) in drawn.items():
        if not name:
            continue
        empty = [where for where, has_data in seen if not has_data]
        note = "" if not empty else " (no ok trial)" if len(empty) == len(seen) \
            else f" (no ok trial: {', '.join(str(e) for e in empty)})"
        handles.append(handle)
        labels.append(name + note)
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(columns, len(handles)), fontsize=7)


def _share_y(axes: list[Any]) -> None:
    """One y range over the panels: their union, with a margin (on a log axis, in log space) so
    that no mark sits on a panel's edge."""
    lows, highs = zip(*(ax.get_ylim() for ax in axes), strict=True)
    log = axes[0].get_yscale() == "log"
    low, high = (math.log(min(lows)), math.log(max(highs))) if log else (min(lows), max(highs))
    pad = Y_MARGIN * (high - low)
    low, high = low - pad, high + pad
    for ax in axes:
        ax.set_ylim(*((math.exp(low), math.exp(high)) if log else (low, high)))


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
        # a factor with one level in the grid tells no line from another: left out of the name
        named_by = {k: v for k, v in found.items() if len(spec.grid.get(k, [])) > 1} or found
        lines.append((", ".join(f"{k}={v}" for k, v in named_by.items()), group,
                      colours.get(found.get(series), 0) if series else 0,
                      marks.get(tuple(found[k] for k in rest), 0) if rest else 0))
    return lines


def _tuple(values: Any) -> tuple[Any, ...]:
    return values if isinstance(values, tuple) else (values,)


def _draw_panel(ax: Any, spec: Spec, table: pd.DataFrame, trials: pd.DataFrame, metric: str,
                log: bool) -> dict[str, tuple[Any, bool]]:
    """Draw the lines; {legend label: (handle, whether it had an ok trial)}. The x axis is
    categorical (one slot per level, in the grid's order) and the series are dodged inside
    their slot, so every mark stays over its own tick."""
    x_key = spec.figure["x"]
    xs = sorted(spec.grid.get(x_key, [spec.fixed.get(x_key)]), key=lambda v: level_rank(spec, x_key, v))
    slot = {x: i for i, x in enumerate(xs)}
    lines = _series(spec, table)
    scale = display_scale(metric)
    drawn = {}
    for i, (name, group, colour, marker) in enumerate(lines):
        shift = DODGE * ((i + 0.5) / len(lines) - 0.5)
        group = group.sort_values(x_key, key=lambda v: v.map(slot))
        mean, err = _mean_and_error(group, metric)
        style = {"marker": MARKERS[marker], "color": f"C{colour}"}
        if mean.isna().all():
            [handle] = ax.plot([], [], linestyle="none", **style)
            drawn[name] = (handle, False)
            continue
        handle = ax.errorbar(group[x_key].map(slot) + shift, mean, yerr=err, capsize=3, **style)
        raw = trials[trials["config_id"].isin(group["config_id"])]
        ax.scatter(raw[x_key].map(slot) + shift, raw[metric] * scale, s=10, alpha=0.4, color=f"C{colour}")
        drawn[name] = (handle, True)
    if not any(has_data for _, has_data in drawn.values()):  # a facet that is all failures
        ax.text(0.5, 0.5, "no ok trial", transform=ax.transAxes, ha="center", va="center", color="grey")
    ax.set_xticks(range(len(xs)), [config_tick(x_key, x) for x in xs])
    ax.set_xlim(-0.5, len(xs) - 0.5)
    ax.set_ylabel(textwrap.fill(_axis_label(spec, metric) + " (mean, 95% CI; dots: trials)", 40), fontsize=8)
    if log:
        _log_axis(ax)
    return drawn


def _draw_speedups(ax: Any, spec: Spec, table: pd.DataFrame, facet: str | None) -> None:
    """Speed-up over the baseline per config (95 % CI), the paper's value or span beside it as
    a hollow mark or a bar; the ticks name what differs between the configs shown."""
    shown = table[~table["baseline"].astype(bool)].reset_index(drop=True)
    ticks = _ticks(spec, shown, leave_out=facet)
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
    ax.set_xticks(range(len(shown)), ticks, rotation=30, ha="right", fontsize=7)
    ax.set_xlim(-0.5, len(shown) - 0.5)
    base = ", ".join(f"{k}={v}" for k, v in spec.baseline.items())
    ax.set_ylabel(textwrap.fill(f"speed-up vs {base} (x, 95% CI)", 40), fontsize=8)
    ax.legend(fontsize=7)


def _paper_speedups(paper: dict[str, Any]) -> Iterable[tuple[float, float]]:
    """The paper's speed-up values of a config as (low, high) ratios, whatever it gave them as."""
    for key, quantity in PAPER_READINGS.items():
        if key in paper:
            low, high = paper[key] if isinstance(paper[key], tuple) else (paper[key], paper[key])
            yield math.exp(claims.as_log_ratio(quantity, low)), math.exp(claims.as_log_ratio(quantity, high))


def _mean_and_error(table: pd.DataFrame, metric: str) -> tuple[pd.Series, list[pd.Series]]:
    """The rows' means and their distances to the 95 % CI ends (0 where there is none), in the
    unit the metric's label names."""
    scale = display_scale(metric)
    mean = table[f"{metric}.mean"] * scale
    return mean, [(mean - table[f"{metric}.ci_lo"] * scale).fillna(0),
                  (table[f"{metric}.ci_hi"] * scale - mean).fillna(0)]


def _axis_label(spec: Spec, metric: str) -> str:
    from multicard.judge.summarize import is_loader_only

    if is_loader_only(spec) and metric == "train_time_s":
        return "loader time, batches onto the device, no model (s)"
    return label(metric)


def _is_wide(values: pd.Series) -> bool:
    positive = values[values > 0].dropna()
    return bool(len(positive)) and positive.max() / positive.min() > SPAN_FOR_LOG


def _log_if_wide(ax: Any, values: pd.Series, axis: str = "y") -> None:
    if _is_wide(values):
        _log_axis(ax, axis)


def _log_axis(ax: Any, axis: str = "y") -> None:
    """A log axis labelled in plain numbers (20, not 2 x 10^1), minor ticks at 2 and 5 only."""
    from matplotlib.ticker import FuncFormatter

    getattr(ax, f"set_{axis}scale")("log")
    which = getattr(ax, f"{axis}axis")
    which.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    which.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))


def _title(fig: Any, text: str, width_in: float) -> None:
    fig.suptitle(textwrap.fill(text, max(30, int(width_in * TITLE_CHARS_PER_INCH))), fontsize=9)


def _ticks(spec: Spec, table: pd.DataFrame, leave_out: str | None = None) -> list[str]:
    """One tick per row: `loader=torch, 1 GPU`, of the grid's factors that differ between the
    rows (all of them where there is one row); `leave_out` is said elsewhere (a panel's title)."""
    keys = [k for k in spec.grid if k in table and k != leave_out]
    varying = [k for k in keys if table[k].nunique() > 1] or keys
    return [", ".join(config_tick(k, r[k]) for k in varying) for _, r in table.iterrows()]


def plot_breakdown(spec: Spec, table: pd.DataFrame, target: Path) -> bool:
    """Per config (one horizontal bar each: its name reads level), mean training time split into
    waiting for the loader, waiting in the copy and everything else."""
    if not spec.breakdown:
        return False
    plt = pyplot()
    ticks = _ticks(spec, table)
    compute, wait = table["breakdown.compute_s"].fillna(0), table["breakdown.data_wait_s"].fillna(0)
    copy = table["breakdown.h2d_wait_s"].fillna(0)
    fig, ax = plt.subplots(figsize=(MAX_WIDTH_IN * 0.75, _rows_height(len(ticks))), layout="constrained")
    rows = range(len(ticks))
    ax.barh(rows, compute, label="compute (and the rest)")
    ax.barh(rows, copy, left=compute, label="blocked in the host-to-device copy")
    ax.barh(rows, wait, left=compute + copy, label="waiting for the loader (next())")
    _say_missing(ax, table["breakdown.compute_s"], lambda i: "no breakdown (no ok trial measured it)")
    _config_axis(ax, ticks)
    ax.set_xlabel("train time (s), mean over trials")
    fig.legend(loc="outside lower center", ncols=3, fontsize=7)
    _title(fig, figure_title(spec, "compute vs waiting for data"), MAX_WIDTH_IN * 0.75)
    _save(fig, target)
    return True


def _say_missing(ax: Any, values: pd.Series, why: Callable[[int], str]) -> None:
    """Where a config's horizontal bar would be, why it has none: said, not a blank gap."""
    for i in [i for i, v in enumerate(values) if pd.isna(v)]:
        ax.text(0.01, i, why(i), transform=ax.get_yaxis_transform(), va="center", fontsize=7, color="grey")


def _rows_height(rows: int) -> float:
    """Inches for a figure of horizontal bars: a line of text per config, and room for the
    title and legend."""
    return 1.8 + ROW_IN * rows


def _config_axis(ax: Any, ticks: list[str]) -> None:
    """Configs down the y axis, the first on top, their names horizontal."""
    ax.set_yticks(range(len(ticks)), ticks, fontsize=7)
    ax.set_ylim(len(ticks) - 0.5, -0.5)


ENERGY_PER_UNIT = ("energy_per_sample_j", "energy_per_token_j")


def energy_metric(spec: Spec) -> str | None:
    """The per-unit energy metric the experiment reports, if any."""
    return next((m for m in ENERGY_PER_UNIT if m in spec.metrics), None)


def plot_time_and_energy(spec: Spec, table: pd.DataFrame, target: Path) -> bool:
    """Per config (a horizontal bar each), the primary metric and GPU energy per image (vision)
    or per token (LLM) side by side (mean, 95% CI), in the units their labels name. Not drawn
    where no config has an energy number (half a figure saying "not measured" shows nothing the
    primary figure does not: the report says why in words); a config without a number says why
    where its bar would be (summarize.withheld: fewer than 3 trials measured it)."""
    metric = energy_metric(spec)
    if metric is None or table[f"{metric}.mean"].isna().all():
        return False
    plt = pyplot()
    ticks = _ticks(spec, table)
    fig, axes = plt.subplots(1, 2, figsize=(MAX_WIDTH_IN, _rows_height(len(ticks))), sharey=True,
                             layout="constrained")
    for ax, key in zip(axes, (spec.primary, metric), strict=True):
        mean, err = _mean_and_error(table, key)
        ax.barh(range(len(ticks)), mean.fillna(0), xerr=err, capsize=3)
        _say_missing(ax, mean, lambda i, key=key: _why_no_number(table, key, i, spec.primary))
        ax.set_xlabel(_axis_label(spec, key) + " (mean, 95% CI)", fontsize=8)
        _log_if_wide(ax, mean, "x")
    _config_axis(axes[0], ticks)
    _title(fig, figure_title(spec, "time and energy"), MAX_WIDTH_IN)
    _save(fig, target)
    return True


def _why_no_number(table: pd.DataFrame, key: str, row: int, primary: str) -> str:
    """Why a config has no `key` to draw: withheld (n < 3), not measured by its ok trials, or
    no ok trial at all."""
    if why := _withheld(table, key, row):
        return why
    ok = table[f"{primary}.n"].iloc[row] if f"{primary}.n" in table else 0
    return "not measured" if ok and key != primary else "no ok trial"


def _withheld(table: pd.DataFrame, key: str, row: int) -> str | None:
    """Why the row's `key` has no number (summarize.withheld), if the table says."""
    column = f"{key}.withheld"
    return str(table[column].iloc[row]) if column in table and pd.notna(table[column].iloc[row]) else None


def plot_ladder(spec: Spec, table: pd.DataFrame, ladder: pd.DataFrame, target: Path) -> bool:
    """Per config with a synthetic-loader twin, images/s of the whole trial (p_whole), of the
    training loop with the real loader (p_train) and with the synthetic one (the ceiling), side
    by side on a log axis where they span more than 10x (stacked, the small rung vanished under
    the loader-alone mark); the loader alone (when a loader_only run was given) beside them. A
    real loader above its ceiling is starred and said under the figure, with the interval that
    tells noise from a finding."""
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
    width = min(MAX_WIDTH_IN, max(6.4, 0.9 * len(ticks)))
    fig, ax = plt.subplots(figsize=(width, 4.8), layout="constrained")
    bar = 0.8 / len(rungs)
    for i, (name, values) in enumerate(rungs.items()):
        ax.bar([x + (i - (len(rungs) - 1) / 2) * bar for x in range(len(ticks))], values, bar, label=name)
    above = _above_ceiling(table, ladder, ticks)
    for i, _ in above:
        ax.annotate("*", (i - (len(rungs) - 1) / 2 * bar + bar, ladder["p_train"].iloc[i]),
                    ha="center", va="bottom", fontsize=12, color="C1")
    ax.set_xticks(range(len(ticks)), ticks, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("images/s (mean over trials)")
    _log_if_wide(ax, pd.concat(list(rungs.values())))
    ax.legend(fontsize=7)
    if above:
        fig.supxlabel(textwrap.fill("* real loader above its ceiling: " + "; ".join(s for _, s in above),
                                    int(width * TITLE_CHARS_PER_INCH * 1.2)), fontsize=7)
    _title(fig, figure_title(spec, "the bottleneck ladder"), width)
    _save(fig, target)
    return True


def _above_ceiling(table: pd.DataFrame, ladder: pd.DataFrame, ticks: list[str]) -> list[tuple[int, str]]:
    """(row, what to say) for each config whose training loop ran faster with the real loader
    than with its synthetic twin: by how much and whether its interval of real / synthetic
    (summarize.bound) leaves 1 (the twin is no ceiling on this machine) or not (noise)."""
    bounds = table.set_index("config_id")
    found = []
    for i, row in ladder.reset_index(drop=True).iterrows():
        if not row["p_train"] > row["ceiling"]:
            continue
        lo, hi = (bounds.at[row["config_id"], k] if k in bounds else float("nan")
                  for k in ("bound.lo", "bound.hi"))
        how = f"{ticks[int(i)]} by {row['p_train'] / row['ceiling'] - 1:.0%}"
        if pd.isna(lo) or pd.isna(hi):
            found.append((int(i), f"{how} (fewer than 2 trials a side: no interval, so noise "
                                  "cannot be told apart)"))
        elif lo > 1:
            found.append((int(i), f"{how} (95% CI {lo:.2f}-{hi:.2f}x: the synthetic loader is no "
                                  "ceiling on this machine)"))
        else:
            found.append((int(i), f"{how} (95% CI {lo:.2f}-{hi:.2f}x holds 1: within noise)"))
    return found


def _save(fig: Any, target: Path) -> None:
    """Write the figure (its layout is constrained: titles and labels fit) and free it (pyplot
    keeps every open figure)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=DPI)
    pyplot().close(fig)
