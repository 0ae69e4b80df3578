"""Tables of one experiment (markdown, CSV, LaTeX) from summarize's frames; formatting only."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
from tabulate import tabulate

from multicard import integrity
from multicard.plan.spec import Spec
from multicard.publish.formatting import (
    TRACE_COLUMNS,
    UNITS,
    fmt_num,
    fmt_pct,
    format_metric,
    label,
    mean_sd_ci,
    paper_values,
    with_ci,
    withheld_text,
)


def display_table(spec: Spec, table: pd.DataFrame) -> pd.DataFrame:
    """The human table: one column per factor, n, mean ± sd [95% CI] per metric, speedups, paper."""
    out = pd.DataFrame({factor: table[factor] for factor in spec.grid})
    out["n"] = table[f"{spec.primary}.n"].astype(int)
    for metric in spec.metrics:
        out[f"{label(metric)} mean ± sd [95% CI]"] = [
            mean_sd_ci(r, metric, int(r[f"{spec.primary}.n"])) for _, r in table.iterrows()]
    p = spec.primary
    out[f"{label(p)} median [min, max]"] = [
        "–" if math.isnan(r[f"{p}.median"]) else
        f"{format_metric(p, r[f'{p}.median'])} "
        f"[{format_metric(p, r[f'{p}.min'])}, {format_metric(p, r[f'{p}.max'])}]"
        for _, r in table.iterrows()]
    if spec.baseline:
        base = ", ".join(f"{k}={v}" for k, v in spec.baseline.items())
        columns = {f"speedup vs {base} (x) [95% CI]": ("speedup", lambda v: f"{v:.3g}"),
                   "time reduction (%)": ("time_reduction", fmt_pct),
                   "gain (%)": ("gain", fmt_pct)}
        for title, (key, formatter) in columns.items():
            out[title] = [
                "baseline" if r["baseline"] else
                with_ci(r[key], r[f"{key}.lo"], r[f"{key}.hi"], formatter)
                + (" (Fieller)" if r.get("speedup.method") == "fieller" else "")
                for _, r in table.iterrows()]
    out = with_operating_point(out, table)
    if "bound" in table:
        out["bound: real / synthetic img/s [95% CI]"] = [bound_text(r) for _, r in table.iterrows()]
    out["paper"] = [paper_values(v) for v in table["paper"]]
    out["failed (cause)"] = [f"{n} ({', '.join(c)})" if n else "0"
                             for n, c in zip(table["failed"], table["failure_causes"], strict=True)]
    out["warnings"] = ["; ".join(warning_texts(spec, r)) or "–" for _, r in table.iterrows()]
    return out


def headline_table(spec: Spec, table: pd.DataFrame) -> pd.DataFrame:
    """The table a reader reads first: the factor levels, n, the primary metric and the speed-up
    over the baseline with their 95 % CIs (3 figures), the paper's value and what failed; every
    other statistic is in display_table (the CSV and the collapsed table)."""
    three = lambda v: f"{v:.3g}"  # noqa: E731
    out = pd.DataFrame({factor: table[factor] for factor in spec.grid})
    out["n"] = table[f"{spec.primary}.n"].astype(int)
    p = spec.primary
    out[f"{label(p)} [95% CI]"] = [
        withheld_text(r, p) or ("not measured" if r[f"{p}.n"] else "–") if math.isnan(r[f"{p}.mean"])
        else with_ci(r[f"{p}.mean"], r[f"{p}.ci_lo"], r[f"{p}.ci_hi"], lambda v: format_metric(p, v))
        for _, r in table.iterrows()]
    if spec.baseline:  # the section's line above the table names the baseline
        out["speed-up [95% CI]"] = [
            "baseline" if r["baseline"] else with_ci(r["speedup"], r["speedup.lo"], r["speedup.hi"], three)
            for _, r in table.iterrows()]
    out = with_operating_point(out, table)
    out["paper"] = [paper_values(v) or "–" for v in table["paper"]]
    out["not ok"] = [f"{n} ({', '.join(c)})" if n else "0"
                     for n, c in zip(table["failed"], table["failure_causes"], strict=True)]
    return out


def with_operating_point(out: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """The column of each config's GPU-bound / host-bound label, where any trial has one (GPU
    vision trials with a step probe): a ratio read on host-bound configs measures the host."""
    labels = table.get("operating_point")
    if labels is None or labels.isna().all():
        return out
    return out.assign(**{"operating point": labels.fillna("–").tolist()})


def bound_text(row: pd.Series) -> str:
    """"data-bound (0.52 [0.49, 0.55])"; the synthetic loader's own row is the ceiling."""
    if row["bound"] == "ceiling":
        return "ceiling"
    return f"{row['bound']} ({with_ci(row['bound.ratio'], row['bound.lo'], row['bound.hi'], fmt_num)})"


def warning_texts(spec: Spec, row: pd.Series) -> list[str]:
    """A config's instability warnings, in words (the numbers come from summarize/stats)."""
    words = {"iqr": lambda: f"unstable: IQR/median {row['stability.iqr']:.0%} > 10 %",
             "max": lambda: f"slowest trial {row['stability.max']:.2f}x the median (> 1.25x)",
             "first": lambda: f"first trial {row['stability.first'] - 1:.0%} slower than the rest "
                              "(a warm-up effect across trials?)"}
    texts = [words[flag]() for flag in row.get("warnings", []) or []]
    outliers = row.get(f"{spec.primary}.outliers", 0)
    if outliers and not math.isnan(outliers):
        texts.append(f"{int(outliers)} outlier(s) (modified z-score > 3.5, kept)")
    return texts


def display_trace_table(spec: Spec, table: pd.DataFrame) -> pd.DataFrame:
    """Per config, per rank, mean over traced trials."""
    out = table[[*spec.grid, "trace", "n"]].copy()
    # what tracing cost: the traced trials' time over the untraced ones' (the same config)
    cost = table["traced / untraced"] if "traced / untraced" in table else [math.nan] * len(table)
    out["traced / untraced"] = ["–" if math.isnan(c) else f"{c:.3g}x" for c in cost]
    # a CPU trial has no device: its copies and kernels were not measured, they were not zero
    on_cpu = [str(d) == "cpu" for d in (table["device"] if "device" in table
                                         else [spec.fixed.get("device")] * len(table))]
    for title, (key, unit) in TRACE_COLUMNS.items():
        values = table[key] if key in table else [math.nan] * len(table)  # a trace summarized before the key
        out[title] = ["not measured (CPU)" if cpu else "not measured" if v is None or math.isnan(v)
                      else UNITS[unit](v) for v, cpu in zip(values, on_cpu, strict=True)]
    return out


def display_pause_table(spec: Spec, table: pd.DataFrame) -> pd.DataFrame:
    """Configs as rows, epochs as columns: the pause before each epoch's first step (ms)."""
    wide = table.pivot_table(index=[*spec.grid, "config_id"], columns="epoch", values="pause_ns",
                             sort=False)
    counts = table.groupby([*spec.grid, "config_id"], sort=False)["n"].max()
    out = wide.reset_index().drop(columns="config_id")
    out.insert(len(spec.grid), "n", counts.to_numpy())
    return out.rename(columns={e: f"epoch {e} (ms)" for e in wide.columns}).apply(
        lambda col: col.map(lambda v: f"{v / 1e6:.4g}") if str(col.name).startswith("epoch") else col)


def render_markdown(display: pd.DataFrame) -> str:
    return tabulate(display, headers="keys", tablefmt="github", showindex=False) + "\n"


def render_latex(display: pd.DataFrame) -> str:
    return tabulate(display, headers="keys", tablefmt="latex_booktabs", showindex=False) + "\n"


def render_csv(table: pd.DataFrame) -> str:
    flat = table.copy()
    flat["paper"] = [json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in p.items()})
                     for p in flat["paper"]]
    flat["failure_causes"] = [";".join(c) for c in flat["failure_causes"]]
    return flat.to_csv(index=False)


def write_tables(stem: Path, display: pd.DataFrame, csv: str, tex: bool = False) -> str:
    """<stem>.md (and .tex) from the display table, <stem>.csv from the numbers; returns the md."""
    markdown = render_markdown(display)
    integrity.write_text_atomic(stem.with_suffix(".md"), markdown)
    integrity.write_text_atomic(stem.with_suffix(".csv"), csv)
    if tex:
        integrity.write_text_atomic(stem.with_suffix(".tex"), render_latex(display))
    return markdown


def display_effects(spec: Spec, table: pd.DataFrame) -> pd.DataFrame:
    shown = [k for k in spec.grid if k in table]
    out = table[shown].copy()
    out["compared"] = [f"{r['factor']}={r[r['factor']]} vs {r['versus']}" for _, r in table.iterrows()]
    out["metric"] = [label(m) for m in table["metric"]]
    out["ratio [95% CI]"] = [with_ci(r["ratio"], r["ci_lo"], r["ci_hi"], lambda v: f"{v:.3g}")
                             for _, r in table.iterrows()]
    out["CI vs 1"] = table["ci"]
    out["n"] = [f"{a}/{b}" for a, b in zip(table["n_base"], table["n"], strict=True)]
    return out


def _needed_text(entry: Any) -> str:
    if not entry.searched:
        return "–"
    return str(entry.needed) if entry.needed is not None else "> 30"


def display_power(found: list[Any]) -> pd.DataFrame:
    """`multicard claims power`: one row per claim, world and CV (power.ClaimPower rows): the share
    of runs that read each verdict, and the trials per config 80 % supported needs."""
    rows = []
    for entry in found:
        base = {"claim": entry.claim.id, "CV": f"{entry.cv:.0%}"}
        if entry.skipped:
            rows.append({**base, "world": entry.skipped, "trials": "–"})
            continue
        first_paper = next((r for r in entry.rows if r.role == "paper"), None)
        for row in entry.rows:
            other = 1 - sum(row.shares.get(v, 0.0) for v in ("supported", "contradicted", "inconclusive"))
            rows.append({**base, "world": row.world, "holds": row.role, "trials": row.trials,
                         "supported": f"{row.shares.get('supported', 0.0):.2f}",
                         "contradicted": f"{row.shares.get('contradicted', 0.0):.2f}",
                         "inconclusive": f"{row.shares.get('inconclusive', 0.0):.2f}",
                         "other": f"{other:.2f}",
                         "trials for 80 %": _needed_text(entry) if row is first_paper else ""})
    columns = ["claim", "CV", "world", "holds", "trials", "supported", "contradicted", "inconclusive",
               "other", "trials for 80 %"]
    return pd.DataFrame(rows, columns=columns).fillna("")
