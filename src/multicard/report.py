"""Presentation: tables (md, csv, tex), figures (PNG) and REPORT.md for one or more run directories.

Nothing here computes a statistic; numbers come from `summarize` and are only formatted.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
from tabulate import tabulate

import multicard
from multicard import artifact, claims, cost, store, summarize
from multicard import spec as specmod
from multicard.errors import InputError
from multicard.spec import Spec


@dataclass(frozen=True)
class RunData:
    path: Path
    spec: Spec
    env: dict[str, Any]
    records: list[dict[str, Any]]
    planned: int
    torn_lines: list[int] = field(default_factory=list)  # lines of trials.jsonl that were skipped


# --- number formatting ----------------------------------------------------------------------

def _fmt_num(v: float) -> str:
    return "–" if v is None or math.isnan(v) else f"{v:.4g}"


def _fmt_pct(v: float) -> str:
    return "–" if v is None or math.isnan(v) else f"{100 * v:.2f}"


def _fmt_gib(v: float) -> str:
    return "–" if v is None or math.isnan(v) else f"{v / 2**30:.3g}"


METRIC_LABELS: dict[str, tuple[str, Callable[[float], str]]] = {
    "train_time_s": ("train time (s)", _fmt_num),
    "epoch_time_s": ("epoch time (s)", _fmt_num),
    "step_time_median_s": ("median step (s)", _fmt_num),
    "throughput_samples_s": ("throughput (img/s)", _fmt_num),
    "data_wait_fraction": ("data wait, loader next() (%)", _fmt_pct),
    "data_wait_s": ("data wait, loader next() (s)", _fmt_num),
    "h2d_wait_fraction": ("copy wait, host in H2D copy (%)", _fmt_pct),
    "h2d_wait_s": ("copy wait, host in H2D copy (s)", _fmt_num),
    "first_batch_latency_s": ("pre-epoch pause (s)", _fmt_num),
    "h2d_time_s": ("H2D copy on device (s)", _fmt_num),
    "nvml_process_mem_bytes": ("rank GPU mem., NVML (GiB)", _fmt_gib),
    "test_accuracy": ("test acc. (%)", _fmt_pct),
    "peak_mem_bytes": ("peak mem. (GiB)", _fmt_gib),
    "gpu_util_mean": ("GPU util. (%)", _fmt_pct),
    "train_loss": ("train loss", _fmt_num),
    "tokens_per_s_per_gpu": ("tokens/s per GPU", _fmt_num),
    "peak_mem_active_bytes": ("peak active mem. (GiB)", _fmt_gib),
    "peak_mem_reserved_bytes": ("peak reserved mem. (GiB)", _fmt_gib),
    "peak_device_mem_bytes": ("GPU mem. used, NVML (GiB)", _fmt_gib),
    "peak_process_mem_bytes": ("process RSS (GiB)", _fmt_gib),
    "final_loss": ("final loss", _fmt_num),
    "local_page_fraction": ("pages on home node (%)", _fmt_pct),
    "cpus_on_gpu_node_fraction": ("CPUs on GPU's node (%)", _fmt_pct),
}


def _label(metric: str) -> str:
    return METRIC_LABELS.get(metric, (metric, _fmt_num))[0]


def _fmt(metric: str, value: float) -> str:
    return METRIC_LABELS.get(metric, (metric, _fmt_num))[1](value)


def _mean_sd_ci(row: pd.Series, metric: str) -> str:
    mean, sd = row[f"{metric}.mean"], row[f"{metric}.std"]
    if math.isnan(mean):
        return "–"
    text = _fmt(metric, mean) + (f" ± {_fmt(metric, sd)}" if not math.isnan(sd) else "")
    lo, hi = row[f"{metric}.ci_lo"], row[f"{metric}.ci_hi"]
    if not math.isnan(lo):
        text += f" [{_fmt(metric, lo)}, {_fmt(metric, hi)}]"
    return text


def _with_ci(value: float, lo: float, hi: float, fmt: Callable[[float], str]) -> str:
    if math.isnan(value):
        return "–"
    return fmt(value) + ("" if math.isnan(lo) else f" [{fmt(lo)}, {fmt(hi)}]")


def _paper(values: dict[str, Any]) -> str:
    parts = []
    for key, value in values.items():
        if key == "outcome":
            parts.append("runs" if value == "runs" else "fails to run")
            continue
        lo, hi = value if isinstance(value, tuple) else (value, value)
        if key == "speedup_x":
            text, unit = (f"{lo:g}" if lo == hi else f"{lo:g}–{hi:g}"), "x"
        elif key in ("gain_pct", "time_reduction_pct"):
            text, unit = (f"{lo:g}" if lo == hi else f"{lo:g}–{hi:g}"), " %"
        else:
            a, b = _fmt(key, lo), _fmt(key, hi)
            parts.append(f"{_label(key)} {a if lo == hi else f'{a}–{b}'}")
            continue
        parts.append(f"{key.removesuffix('_pct').replace('_', ' ')} {text}{unit}")
    return "; ".join(parts)


# --- tables ---------------------------------------------------------------------------------

def display_table(spec: Spec, table: pd.DataFrame) -> pd.DataFrame:
    """The human table: one column per factor, n, mean ± sd [95% CI] per metric, speedups, paper."""
    out = pd.DataFrame({factor: table[factor] for factor in spec.grid})
    out["n"] = table[f"{spec.primary}.n"].astype(int)
    for metric in spec.metrics:
        out[f"{_label(metric)} mean ± sd [95% CI]"] = table.apply(_mean_sd_ci, axis=1, metric=metric)
    p = spec.primary
    out[f"{_label(p)} median [min, max]"] = [
        "–" if math.isnan(r[f"{p}.median"]) else
        f"{_fmt(p, r[f'{p}.median'])} [{_fmt(p, r[f'{p}.min'])}, {_fmt(p, r[f'{p}.max'])}]"
        for _, r in table.iterrows()]
    if spec.baseline:
        base = ", ".join(f"{k}={v}" for k, v in spec.baseline.items())
        columns = {f"speedup vs {base} (x) [95% CI]": ("speedup", lambda v: f"{v:.3g}"),
                   "time reduction (%)": ("time_reduction", _fmt_pct),
                   "gain (%)": ("gain", _fmt_pct)}
        for title, (key, fmt) in columns.items():
            out[title] = [
                "baseline" if r["baseline"] else
                _with_ci(r[key], r[f"{key}.lo"], r[f"{key}.hi"], fmt)
                + (" (Fieller)" if r.get("speedup.method") == "fieller" else "")
                for _, r in table.iterrows()]
    out["paper"] = [_paper(v) for v in table["paper"]]
    out["failed (cause)"] = [f"{n} ({', '.join(c)})" if n else "0"
                             for n, c in zip(table["failed"], table["failure_causes"], strict=True)]
    out["warnings"] = ["; ".join(warning_texts(spec, r)) or "–" for _, r in table.iterrows()]
    return out


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


# The paper's Nsight metrics (PAPER.md section 5) -> trace summary keys. "CUDA memcpy HtoD" is the
# GPU-side copy activity; NCCL kernels include ncclDevKernel_AllGather.
TRACE_COLUMNS: dict[str, tuple[str, str]] = {
    "HtoD copies (n)": ("memcpy_htod_count", "count"),
    "HtoD (MiB)": ("memcpy_htod_bytes", "mib"),
    "HtoD (ms)": ("memcpy_htod_ns", "ms"),
    "HtoD from pageable (ms)": ("memcpy_htod_pageable_ns", "ms"),
    "HtoD from pinned (ms)": ("memcpy_htod_pinned_ns", "ms"),
    "DtoH (ms)": ("memcpy_dtoh_ns", "ms"),
    "kernels (n)": ("kernel_count", "count"),
    "kernels (ms)": ("kernel_ns", "ms"),
    "NCCL kernels (ms)": ("nccl_kernel_ns", "ms"),
    "cudaLaunchKernel (n)": ("cuda_launch_kernel_count", "count"),
    "cudaLaunchKernel (ms)": ("cuda_launch_kernel_ns", "ms"),
    "cudaStreamSynchronize (ms)": ("cuda_stream_synchronize_ns", "ms"),
    "cudaEventSynchronize (ms)": ("cuda_event_synchronize_ns", "ms"),
    "cudaEventDestroy (n)": ("cuda_event_destroy_count", "count"),
    "cudaMemcpyAsync (ms)": ("cuda_memcpy_async_ns", "ms"),
}
_UNITS: dict[str, Callable[[float], str]] = {
    "count": lambda v: f"{v:.0f}", "mib": lambda v: f"{v / 2**20:.4g}", "ms": lambda v: f"{v / 1e6:.4g}"}


def display_trace_table(spec: Spec, table: pd.DataFrame) -> pd.DataFrame:
    """Per config, per rank, mean over traced trials."""
    out = table[[*spec.grid, "trace", "n"]].copy()
    for title, (key, unit) in TRACE_COLUMNS.items():
        out[title] = [_UNITS[unit](v) for v in table[key]]
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


# --- figures --------------------------------------------------------------------------------

def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_primary(spec: Spec, table: pd.DataFrame, trials: pd.DataFrame, target: Path) -> bool:
    """Primary metric vs the figure's x factor: one line per series, one panel per facet value,
    95% CI bars and one dot per trial."""
    if not spec.figure:
        return False
    plt = _pyplot()
    facet = spec.figure.get("facet")
    panels = list(table.groupby(facet, sort=False)) if facet else [(None, table)]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, (value, panel) in zip(axes[0], panels, strict=True):
        _draw_panel(ax, spec, panel, trials)
        if facet:
            ax.set_title(f"{facet} = {value}", fontsize=9)
    fig.suptitle(spec.title, fontsize=9)
    fig.tight_layout()
    _save(fig, target)
    plt.close(fig)
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
    ax.set_ylabel(_label(p) + " (mean, 95% CI; dots: trials)")
    if series_key:
        ax.legend(title=series_key, fontsize=8)


def plot_breakdown(spec: Spec, table: pd.DataFrame, target: Path) -> bool:
    """Per config, mean training time split into waiting for the loader, waiting in the copy and
    everything else."""
    if not spec.breakdown:
        return False
    plt = _pyplot()
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
    fig.tight_layout()
    _save(fig, target)
    plt.close(fig)
    return True


def _save(fig: Any, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=120)


# --- runs and REPORT.md ---------------------------------------------------------------------

def is_run(path: Path) -> bool:
    return (path / "spec.toml").is_file() and (path / store.TRIALS_FILE).is_file()


def discover_runs(path: Path) -> list[Path]:
    """`path` itself if it is a run directory, else the run directories directly inside it."""
    if not path.is_dir():
        raise InputError(f"{path}: not a directory")
    if is_run(path):
        return [path]
    runs = sorted(p for p in path.iterdir() if p.is_dir() and is_run(p))
    if not runs:
        raise InputError(f"{path}: no run directory (spec.toml + trials.jsonl) here or one level down")
    return runs


def load_run(path: Path) -> RunData:
    spec = specmod.load(path / "spec.toml")
    env_path = path / "env.json"
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    records, torn = store.read_with_skipped(path / store.TRIALS_FILE)
    store.warn_skipped(path / store.TRIALS_FILE, torn)
    timing = [p for p in specmod.plan(spec) if p.trace == "none"]
    return RunData(path, spec, env, records, planned=len(timing), torn_lines=torn)


def write_report(dirs: list[Path], out: Path, claim_list: list[claims.Claim] | None = None,
                 echo: Callable[[str], None] | None = None) -> Path:
    """Tables, figures and REPORT.md for every run under `dirs` (several runs merge into one
    report: their claims are judged together), then SHA256SUMS over `out`."""
    runs = [load_run(p) for d in dirs for p in discover_runs(d)]
    for derived in ("tables", "figures"):
        shutil.rmtree(out / derived, ignore_errors=True)
    (out / "tables").mkdir(parents=True, exist_ok=True)
    sections = [_environment_section(runs, out), _claims_section(runs, claim_list, out)]
    used: set[str] = set()
    for run in runs:
        name = _unique(run.spec.name, used)
        sections.append(_experiment_section(run, name, out, echo))
    sections += [_failures_section(runs, out), _compute_section(runs, out), _verify_section(out)]
    header = (f"# multicard report\n\nGenerated {datetime.now(UTC).isoformat(timespec='seconds')} "
              f"by multicard {multicard.__version__}.\n")
    artifact.write_text_atomic(out / "REPORT.md", "\n".join([header, *sections]))
    return artifact.write_checksums(out)


def _unique(name: str, used: set[str]) -> str:
    candidate, i = name, 2
    while candidate in used:
        candidate, i = f"{name}-{i}", i + 1
    used.add(candidate)
    return candidate


def _environment_section(runs: list[RunData], out: Path) -> str:
    """One row per machine and software stack, with the runs made on it; each topology once."""
    machines: dict[tuple[Any, ...], dict[str, Any]] = {}
    for run in runs:
        row = _machine_row(run.env)
        entry = machines.setdefault(tuple(row.values()), {"runs": [], **row})
        entry["runs"].append(f"`{_rel(run.path, out)}`")
    rows = [{**m, "runs": ", ".join(m["runs"])} for m in machines.values()]
    table = tabulate(pd.DataFrame(rows), headers="keys", tablefmt="github", showindex=False)
    seen: dict[str, list[str]] = {}
    for run in runs:
        seen.setdefault(topology_tables(run.env), []).append(f"`{_rel(run.path, out)}`")
    topologies = "".join(f"\nTopology of {_names(names)} (NUMA nodes, GPUs):\n\n{text}"
                         for text, names in seen.items())
    return ("## Environment\n\nFull details: `env.json` in each run directory.\n\n" + table + "\n"
            + topologies)


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"the {len(names)} runs above" \
        if len(names) > 3 else ", ".join(names)


def _machine_row(env: dict[str, Any]) -> dict[str, Any]:
    gpus = env.get("gpus") or []
    torch_info = env.get("torch") or {}
    return {"host": env.get("host"), "CPU": (env.get("cpu") or {}).get("model"),
            "CPUs": (env.get("cpu") or {}).get("logical_cpus"),
            "NUMA nodes": len((env.get("topology") or {}).get("nodes") or []),
            "GPUs": f"{len(gpus)}x {gpus[0]['name']}" if gpus else "none",
            "torch": torch_info.get("version"), "CUDA": torch_info.get("cuda"),
            "git": ((env.get("git") or {}).get("sha") or "")[:10]}


def _cpu_ranges(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8] -> "0-3,8"."""
    runs: list[list[int]] = []
    for cpu in cpus:
        if runs and cpu == runs[-1][-1] + 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs) or "–"


def topology_tables(env: dict[str, Any]) -> str:
    """NUMA nodes and GPUs of one run's machine, from env.json."""
    topology = env.get("topology") or {}
    nodes = pd.DataFrame([{"node": n["node"], "CPUs": _cpu_ranges(n["cpus"]),
                           "memory (MB)": n["memory_mb"]} for n in topology.get("nodes", [])])
    text = tabulate(nodes, headers="keys", tablefmt="github", showindex=False) if len(nodes) else ""
    gpus = pd.DataFrame([{"GPU": g["gpu"], "NUMA node": g["numa_node"], "CPUs": _cpu_ranges(g["cpus"])}
                         for g in topology.get("gpus", [])])
    if len(gpus):
        text += "\n\n" + tabulate(gpus, headers="keys", tablefmt="github", showindex=False)
    return text + "\n" if text else "No topology recorded.\n"


def _rel(path: Path, out: Path) -> str:
    try:
        return path.resolve().relative_to(out.resolve()).as_posix() or "."
    except ValueError:
        return str(path)


INTERVALS_NOTE = (
    "n counts ok timing trials. Intervals are 95 %: of a mean, Cox's interval for a log-normal "
    "sample (a t interval clipped at 0 where values are 0); of a speedup (a ratio of means), "
    "Welch's t on log values, or Fieller's where values are 0; the percentile bootstrap is in the "
    "CSV beside it as a cross-check only (it covers about 80 % at n = 3). A claim is decided only "
    "from at least {min_ok} ok trials per arm. The intervals describe trial-to-trial noise on "
    "this machine; they say nothing about another machine.")


def _config_label(spec: Spec, row: pd.Series) -> str:
    return " ".join(f"{k}={row[k]}" for k in spec.grid)


def _auto_note(run_dir: Path) -> list[str]:
    """How `--trials auto` decided to stop (auto.json, written by the runner)."""
    path = run_dir / "auto.json"
    if not path.exists():
        return []
    found = json.loads(path.read_text())
    return ["", f"Trials: auto, {found['min_rounds']} to {found['max_rounds']} rounds until every "
            f"interval is within +-{found['half_width']:.1%}: "
            f"{'stopped' if found['stopped'] else 'going on'} after {found['rounds']} rounds "
            f"({found['reason']})."]


VISION_TIMING_NOTE = (
    "What the times contain: an epoch runs from the loader's start through its last step (device "
    "synchronised) and the loader's shutdown; every loader makes its first batch inside the timed "
    "epoch (DALI's iterator does not prepare one at construction), so the pre-epoch pause of epoch "
    "0 holds the DataLoader's worker start-up and DALI's first pipeline run alike. \"data wait\" is "
    "the host blocked in the loader's next() alone; \"copy wait\" the host blocked in the "
    "host-to-device copy (a pageable copy waits for the queued GPU work); \"H2D copy on device\" "
    "the copies' own duration (CUDA events).")


def _experiment_section(run: RunData, name: str, out: Path,
                        echo: Callable[[str], None] | None = None) -> str:
    spec = run.spec
    trials = summarize.trial_table(spec, run.records)
    failed = summarize.failures(spec, run.records)
    table = summarize.config_table(spec, trials, failed)
    display = display_table(spec, table)
    tables = out / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    markdown = _write_tables(tables / name, display, render_csv(table), tex=True)
    trials.to_csv(tables / f"{name}_trials.csv", index=False)
    has_figure = plot_primary(spec, table, trials, out / "figures" / f"{name}.png")
    has_breakdown = plot_breakdown(spec, table, out / "figures" / f"{name}_breakdown.png")
    fixed = ", ".join(f"{k}={v}" for k, v in spec.fixed.items())
    lines = [
        f"## {spec.title}",
        "",
        f"Experiment `{spec.name}` ({spec.paper or 'extension'}), profile `{spec.profile}`, "
        f"run `{_rel(run.path, out)}`: {len(trials)} of {run.planned} planned trials ok, "
        f"{len(failed)} failed attempt(s).",
        "",
        f"Fixed settings: {fixed}.",
        "",
        markdown,
        f"Raw per-trial values: `tables/{name}_trials.csv`; all statistics: `tables/{name}.csv`.",
        "",
        INTERVALS_NOTE.format(min_ok=spec.min_ok),
    ]
    lines += _auto_note(run.path)
    warned = [f"- {_config_label(spec, r)}: {'; '.join(texts)}" for _, r in table.iterrows()
              if (texts := warning_texts(spec, r))]
    if warned:
        lines += ["", f"Warnings ({_label(spec.primary)}):", "", *warned]
        for line in warned if echo else []:
            echo(f"warning: {spec.name}: {line.removeprefix('- ')}")
    if spec.workload == "vision":
        lines += ["", VISION_TIMING_NOTE]
    lines += _trace_sections(spec, run.records, name, tables)
    if "numa_policy" in spec.grid:
        lines += ["", numa_section(spec, trials)]
    if any(r.get("random_weights") for r in run.records if r.get("experiment") == spec.name):
        lines += ["", "Weights: **random** (the model's architecture, seeded): times and memory "
                  "are valid, losses are meaningless."]
    if has_figure:
        lines += ["", f"![{spec.title}](figures/{name}.png)"]
    if has_breakdown:
        lines += ["", f"![compute vs copy wait vs data wait](figures/{name}_breakdown.png)"]
    if len(failed):
        lines += ["", "Failures:", ""]
        lines += [f"- `{r.config_id}` trial {r.trial}: **{r.status}** {r.error_type or ''}: "
                  f"{_first_line(r.message)}" for r in failed.itertuples()]
    return "\n".join(lines) + "\n"


def _trace_sections(spec: Spec, records: list[dict[str, Any]], name: str, tables: Path) -> list[str]:
    """The Nsight metrics and the pre-epoch pauses of the traced trials, when there are any."""
    lines: list[str] = []
    traces = summarize.trace_table(spec, records)
    if not traces.empty:
        lines += ["", "Profiled trials (extra, untimed): the paper's Nsight metrics per rank, mean "
                  "over traced trials; raw traces under `raw/*-<trace>-*/`.", "",
                  _write_tables(tables / f"{name}_nsight", display_trace_table(spec, traces),
                                traces.to_csv(index=False))]
    pauses = summarize.pause_table(spec, records)
    if not pauses.empty:
        lines += ["", "Pause before the first step of each epoch, from the trace timeline (the "
                  "longest over ranks, mean over traced trials; only the epochs a trace covers):",
                  "", _write_tables(tables / f"{name}_pauses", display_pause_table(spec, pauses),
                                    pauses.to_csv(index=False))]
    return lines


def _write_tables(stem: Path, display: pd.DataFrame, csv: str, tex: bool = False) -> str:
    """<stem>.md (and .tex) from the display table, <stem>.csv from the numbers; returns the md."""
    markdown = render_markdown(display)
    artifact.write_text_atomic(stem.with_suffix(".md"), markdown)
    artifact.write_text_atomic(stem.with_suffix(".csv"), csv)
    if tex:
        artifact.write_text_atomic(stem.with_suffix(".tex"), render_latex(display))
    return markdown


def numa_section(spec: Spec, trials: pd.DataFrame) -> str:
    """The verdict on the paper's NUMA hypothesis (C10), with the ratios behind each answer."""
    lines = [f"### NUMA hypothesis ({spec.name})", "",
             "Ratios are mean(time under the reference) / mean(time under the compared level), with "
             "a bootstrap 95% CI: above 1 means the compared level is faster (or pauses less), "
             "below 1 slower; an answer counts only CIs that exclude 1 (README, NUMA).", ""]
    for number, finding in enumerate(summarize.numa_findings(spec, trials), start=1):
        lines += [f"{number}. {finding.question} **{finding.answer}**", ""]
        if not finding.evidence.empty:
            lines += [render_markdown(_display_effects(spec, finding.evidence)), ""]
    return "\n".join(lines)


def _display_effects(spec: Spec, table: pd.DataFrame) -> pd.DataFrame:
    shown = [k for k in spec.grid if k in table]
    out = table[shown].copy()
    out["compared"] = [f"{r['factor']}={r[r['factor']]} vs {r['versus']}" for _, r in table.iterrows()]
    out["metric"] = [_label(m) for m in table["metric"]]
    out["ratio [95% CI]"] = [_with_ci(r["ratio"], r["ci_lo"], r["ci_hi"], lambda v: f"{v:.3g}")
                             for _, r in table.iterrows()]
    out["CI vs 1"] = table["ci"]
    out["n"] = [f"{a}/{b}" for a, b in zip(table["n_base"], table["n"], strict=True)]
    return out


def _claims_section(runs: list[RunData], claim_list: list[claims.Claim] | None, out: Path) -> str:
    if claim_list is None:
        return "## Claims of the paper\n\nNo claims file (experiments/claims.toml) was given.\n"
    results: dict[str, list[claims.Results]] = {}
    for run in runs:
        results.setdefault(run.spec.name, []).append(claims.results_of(run.spec, run.records))
    verdicts = claims.evaluate(claim_list, results)
    table = pd.DataFrame([{
        "claim": v.claim.id, "the paper says": v.claim.text, "paper": v.claim.paper,
        "verdict": v.verdict, "ours [95% CI]": evidence_text(v.evidence), "why": v.why,
        "experiment": ", ".join(_claim_experiments(v.claim)),
    } for v in verdicts])
    display = table.assign(verdict=[f"**{v}**" for v in table["verdict"]])
    counts = ", ".join(f"{(table['verdict'] == k).sum()} {k}" for k in claims.VERDICTS)
    return ("## Claims of the paper\n\n"
            f"{len(verdicts)} claims: {counts}. Verdicts follow the 95% confidence intervals only "
            "(README, \"Claims and verdicts\"). A ratio is mean(metric of the reference arm) / "
            "mean(metric of the arm the claim is about), e.g. C1: time(FP64) / time(FP32), so above "
            "1 means the claim's arm has the smaller value (is faster, uses less memory); "
            "`experiments/claims.toml` names both arms of each claim.\n\n"
            + _write_tables(out / "tables" / "claims", display, table.to_csv(index=False)))


def evidence_text(evidence: tuple[claims.Evidence, ...], shown: int = 6) -> str:
    """`gpus=1: 60% [58.8, 61.2]; ...`, the first `shown` groups and how many more there are."""
    def one(e: claims.Evidence) -> str:
        if e.statuses:
            return f"{e.label}: {'/'.join(e.statuses)} ({e.n[0]} attempts)"
        ci = "" if math.isnan(e.ci_lo) else f" [{e.ci_lo:.3g}, {e.ci_hi:.3g}]"
        return f"{e.label}: {e.value:.3g}{e.unit}{ci} (n {e.n[0]}/{e.n[1]})"

    text = "; ".join(one(e) for e in evidence[:shown]) or "–"
    return text + (f" (+{len(evidence) - shown} more)" if len(evidence) > shown else "")


def _claim_experiments(claim: claims.Claim) -> list[str]:
    names = [claim.experiment] if claim.experiment else []
    for part in claim.parts:
        names += [n for n in _claim_experiments(part) if n not in names]
    return names


def _failures_section(runs: list[RunData], out: Path) -> str:
    rows = []
    for run in runs:
        causes = summarize.failure_causes(summarize.failures(run.spec, run.records))
        rows += [{"experiment": run.spec.name, "run": _rel(run.path, out), **row}
                 for row in causes.to_dict("records")]
    torn = "".join(f"\n`{_rel(run.path, out)}/trials.jsonl`: {len(run.torn_lines)} line(s) skipped "
                   f"(line {_some(run.torn_lines)}): not a complete record, as a crash mid-write "
                   "leaves one; the attempt it described, if any, runs again on resume.\n"
                   for run in runs if run.torn_lines)
    if not rows:
        return "## Failures and skips\n\nNo attempt failed and no config was skipped.\n" + torn
    table = pd.DataFrame(rows)
    table["message"] = [_first_line(m)[:160] for m in table["message"]]
    return ("## Failures and skips\n\nEvery attempt that failed (error, timeout, oom) and every "
            "config this machine could not run (`skipped`, with the reason), by cause; the "
            "per-trial list is in each section above, the stderr of a failed attempt in "
            "`raw/<config>-t<trial>-a<attempt>/stderr.log`.\n\n"
            + render_markdown(table) + torn)


def _some(numbers: list[int], shown: int = 10) -> str:
    more = f" and {len(numbers) - shown} more" if len(numbers) > shown else ""
    return ", ".join(map(str, numbers[:shown])) + more


def _first_line(message: object) -> str:
    lines = message.splitlines() if isinstance(message, str) else []
    return lines[0] if lines else ""


def _compute_section(runs: list[RunData], out: Path) -> str:
    rows = []
    for run in runs:
        spent = summarize.compute_spent(run.spec, run.records)
        unit = cost.device_unit(spent.device)
        rows.append({"experiment": run.spec.name, "run": _rel(run.path, out), "device": spent.device,
                     "attempts": spent.attempts, "wall (h)": f"{spent.wall_hours:.3f}",
                     "spent": f"{spent.device_hours:.3f} {unit}"})
    return ("## Compute spent\n\nSum over attempts (ok or not) of wall time x processes per node x "
            "nodes; skipped configs cost nothing.\n\n" + render_markdown(pd.DataFrame(rows)))


def _verify_section(out: Path) -> str:
    return (
        "## How to verify these files\n\n"
        "Every file under this directory is listed in `SHA256SUMS` (coreutils format):\n\n"
        "```\n"
        f"cd {out.as_posix()} && sha256sum -c SHA256SUMS\n"
        f"multicard verify {out.as_posix()}    # also names files that are missing or unlisted\n"
        "```\n\n"
        f"To deposit it in an archive: `multicard pack {out.as_posix()}` writes a deterministic "
        f"`{out.name}.tar.gz` beside it, which `multicard verify` checks without extracting.\n"
    )
