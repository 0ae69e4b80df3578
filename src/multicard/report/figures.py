"""Figures (PNG) of one experiment: the primary metric per config, the time breakdown, time
and energy side by side, and the bottleneck ladder."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pandas as pd

from multicard.report.formatting import label
from multicard.spec import Spec


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_primary(spec: Spec, table: pd.DataFrame, trials: pd.DataFrame, target: Path) -> bool:
    """Primary metric vs the figure's x factor: one line per series, one panel per facet value,
    95% CI bars and one dot per trial."""
    if not spec.figure:
        return False
    plt = pyplot()
    facet = spec.figure.get("facet")
    panels = list(table.groupby(facet, sort=False)) if facet else [(None, table)]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, (value, panel) in zip(axes[0], panels, strict=True):
        _draw_panel(ax, spec, panel, trials)
        if facet:
            ax.set_title(f"{facet} = {value}", fontsize=9)
    fig.suptitle(spec.title, fontsize=9)
    _save(fig, target)
    return True


def _draw_panel(ax: Any, spec: Spec, table: pd.DataFrame, trials: pd.DataFrame) -> None:
    x_key, series_key, p = spec.figure["x"], spec.figure.get("series"), spec.primary
    groups = list(table.groupby(series_key, sort=False)) if series_key else [(None, table)]
    xs = sorted(spec.grid[x_key])
    # Series are dodged sideways so that error bars at the same x stay readable.
    width = 0.5 * min((b - a for a, b in itertools.pairwise(xs)), default=1)
    for i, (name, group) in enumerate(groups):
        shift = width * ((i + 0.5) / len(groups) - 0.5)
        group = group.sort_values(x_key)
        mean = group[f"{p}.mean"]
        err = [(mean - group[f"{p}.ci_lo"]).fillna(0), (group[f"{p}.ci_hi"] - mean).fillna(0)]
        line = ax.errorbar(group[x_key] + shift, mean, yerr=err, marker="o", capsize=3,
                           label=str(name) if name is not None else None)
        raw = trials[trials["config_id"].isin(group["config_id"])]
        ax.scatter(raw[x_key] + shift, raw[p], s=10, alpha=0.4, color=line.lines[0].get_color())
    ax.set_xticks(xs)
    ax.set_xlabel(x_key)
    ax.set_ylabel(label(p) + " (mean, 95% CI; dots: trials)")
    if series_key:
        ax.legend(title=series_key, fontsize=8)


def plot_breakdown(spec: Spec, table: pd.DataFrame, target: Path) -> bool:
    """Per config, mean training time split into waiting for the loader, waiting in the copy and
    everything else."""
    if not spec.breakdown:
        return False
    plt = pyplot()
    labels = [" ".join(f"{row[k]}" for k in spec.grid) for _, row in table.iterrows()]
    compute, wait = table["breakdown.compute_s"].fillna(0), table["breakdown.data_wait_s"].fillna(0)
    copy = table["breakdown.h2d_wait_s"].fillna(0)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(labels)), 4.2))
    ax.bar(labels, compute, label="compute (and the rest)")
    ax.bar(labels, copy, bottom=compute, label="blocked in the host-to-device copy")
    ax.bar(labels, wait, bottom=compute + copy, label="waiting for the loader (next())")
    ax.set_ylabel("train time (s), mean over trials")
    ax.set_xlabel(" / ".join(spec.grid))
    ax.tick_params(axis="x", labelrotation=90, labelsize=7)
    ax.set_title(f"{spec.name}: compute vs waiting for data", fontsize=9)
    ax.legend(fontsize=8)
    _save(fig, target)
    return True


ENERGY_PER_UNIT = ("energy_per_sample_j", "energy_per_token_j")


def plot_time_and_energy(spec: Spec, table: pd.DataFrame, target: Path) -> bool:
    """Per config, the primary metric and GPU energy per image (vision) or per token (LLM) side
    by side (mean, 95% CI); an energy panel with nothing measured says so instead of drawing
    zeros."""
    metric = next((m for m in ENERGY_PER_UNIT if m in spec.metrics), None)
    if metric is None:
        return False
    plt = pyplot()
    labels = [" ".join(f"{row[k]}" for k in spec.grid) for _, row in table.iterrows()]
    fig, axes = plt.subplots(1, 2, figsize=(max(8.0, 0.9 * len(labels)), 4.2))
    for ax, key in zip(axes, (spec.primary, metric), strict=True):
        mean = table[f"{key}.mean"]
        if mean.isna().all():
            ax.text(0.5, 0.5, f"{label(key)}: not measured", ha="center", va="center",
                    transform=ax.transAxes)
            ax.set_axis_off()
            continue
        err = [(mean - table[f"{key}.ci_lo"]).fillna(0), (table[f"{key}.ci_hi"] - mean).fillna(0)]
        ax.bar(labels, mean, yerr=err, capsize=3)
        ax.set_ylabel(label(key) + " (mean, 95% CI)")
        ax.tick_params(axis="x", labelrotation=90, labelsize=7)
    fig.suptitle(f"{spec.name}: time and energy", fontsize=9)
    _save(fig, target)
    return True


def plot_ladder(spec: Spec, table: pd.DataFrame, ladder: pd.DataFrame, target: Path) -> bool:
    """Per config with a synthetic-loader twin, images/s of the whole trial (p_whole), of the
    training loop with the real loader (p_train) and with the synthetic one (the ceiling),
    stacked: each step up is what start-up, evaluation or loading costs; the loader alone
    (when a loader_only run was given) as a mark."""
    if "bound" not in table or ladder.empty:
        return False
    plt = pyplot()
    labels = [" ".join(f"{row[k]}" for k in spec.grid) for _, row in ladder.iterrows()]
    whole, train, ceiling = ladder["p_whole"], ladder["p_train"], ladder["ceiling"]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(labels)), 4.2))
    ax.bar(labels, whole, label="whole trial (start-up, evaluation included)")
    ax.bar(labels, (train - whole).clip(lower=0), bottom=whole, label="training loop, real loader")
    ax.bar(labels, (ceiling - train).clip(lower=0), bottom=whole + (train - whole).clip(lower=0),
           label="up to the synthetic loader's ceiling")
    alone = ladder["loader_only"] if "loader_only" in ladder else pd.Series(dtype=float)
    if alone.notna().any():  # not a part of training: a mark beside the stack
        ax.scatter(labels, alone, marker="_", s=400, color="black", zorder=3,
                   label="loader alone, no model (a loader_only run)")
    ax.set_ylabel("images/s (mean over trials)")
    ax.tick_params(axis="x", labelrotation=90, labelsize=7)
    ax.set_title(f"{spec.name}: the bottleneck ladder", fontsize=9)
    ax.legend(fontsize=8)
    _save(fig, target)
    return True


def _save(fig: Any, target: Path) -> None:
    """Lay the figure out, write it, and free it (pyplot keeps every open figure)."""
    fig.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=120)
    pyplot().close(fig)
