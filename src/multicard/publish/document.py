"""REPORT.md: every section (environment, claims, experiments, failures, compute,
verification) assembled from the tables and figures; writes SHA256SUMS last."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
from tabulate import tabulate

import multicard
from multicard import integrity
from multicard.judge import claims, operating_point, power, stats, summarize
from multicard.measure import gpu_state
from multicard.plan import cost
from multicard.plan.spec import Spec
from multicard.publish import html
from multicard.publish.figures import (
    energy_metric,
    plot_breakdown,
    plot_ladder,
    plot_primary,
    plot_time_and_energy,
)
from multicard.publish.formatting import idle_power_line, idle_power_text, label, run_nature
from multicard.publish.runs import RunData, discover_runs, load_run, merge_shards, step_profiles
from multicard.publish.tables import (
    display_effects,
    display_pause_table,
    display_table,
    display_trace_table,
    headline_table,
    render_csv,
    render_markdown,
    warning_texts,
    write_tables,
)


def write_report(dirs: list[Path], out: Path, claim_list: list[claims.Claim] | None = None,
                 echo: Callable[[str], None] | None = None,
                 questions: list[claims.Claim] | None = None) -> Path:
    """Tables, figures and REPORT.md for every run under `dirs` (several runs merge into one
    report: their claims are judged together), then SHA256SUMS over `out`."""
    loaded = [load_run(p) for d in dirs for p in discover_runs(d)]
    runs = merge_shards(loaded)  # the parts of a sharded plan judged as one run
    for derived in ("tables", "figures"):
        shutil.rmtree(out / derived, ignore_errors=True)
    (out / "tables").mkdir(parents=True, exist_ok=True)
    # the NUMA section's test with the tolerance the claims judge C10 by
    numa_tolerance = next((p.tolerance for c in claim_list or [] for p in (c.parts or (c,))
                           if p.kind == "numa" and p.tolerance is not None), summarize.PENALTY_TOLERANCE)
    sections = [_environment_section(loaded, out), _reading_section(runs), _budget_section(dirs),
                _claims_section(runs, claim_list, out), _operating_point_section(dirs, out),
                _energy_section(runs, questions, out)]
    # the ladder's loader-only rung comes from the collection's loader_only runs
    loader_only: summarize.LoaderRates = {}
    for run in runs:
        loader_only |= summarize.loader_only_rates(run.spec, summarize.trial_table(run.spec, run.records))
    used: set[str] = set()
    for run in runs:
        name = _unique(run.spec.name, used)
        sections.append(_experiment_section(run, name, out, echo, loader_only, numa_tolerance))
    sections += [_failures_section(runs, out), _compute_section(runs, out), _verify_section(out)]
    header = (f"# multicard report\n\nGenerated {datetime.now(UTC).isoformat(timespec='seconds')} "
              f"by multicard {multicard.__version__}.\n")
    integrity.write_text_atomic(out / "REPORT.md", "\n".join([header, *(s for s in sections if s)]))
    html.write(out, "multicard report")
    return integrity.write_checksums(out)


def _run_names(run: RunData, out: Path) -> str:
    """`DIR`, or the parts of a sharded plan merged into this run."""
    if len(run.parts) > 1:
        return f"in {len(run.parts)} parts ({', '.join(f'`{_rel(p, out)}`' for p in run.parts)})"
    return f"`{_rel(run.path, out)}`"


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
    rows = [{"machine": i, **{k: v for k, v in m.items() if k != "runs"}, "runs": len(m["runs"])}
            for i, m in enumerate(machines.values(), start=1)]
    table = tabulate(pd.DataFrame(rows), headers="keys", tablefmt="github", showindex=False) + "\n\n" \
        + "\n".join(f"- machine {i}: {', '.join(m['runs'])}"
                    for i, m in enumerate(machines.values(), start=1))
    seen: dict[str, list[str]] = {}
    for run in runs:
        seen.setdefault(topology_tables(run.env), []).append(f"`{_rel(run.path, out)}`")
    topologies = "".join(f"\nTopology of {_names(names)} (NUMA nodes, GPUs):\n\n{text}"
                         for text, names in seen.items())
    return ("## Environment\n\nFull details: `env.json` in each run directory.\n\n" + table + "\n"
            + topologies + _gpu_state_section(runs, out))


def _gpu_state_section(runs: list[RunData], out: Path) -> str:
    """Each run's GPUs as set and as they were when it started and ended (env.json,
    gpu-state-end.json): limits, clocks, throttle reasons, how long a limit held the clocks
    down in between, modes, ECC, PCIe, NCCL, idle power; each run's idle power once more, in
    the open, beside the folded table."""
    rows = []
    for run in runs:
        at_end = {g.get("uuid"): g for g in run.gpus_at_end}
        idle = _idle_record(run.env)
        nccl = (run.env.get("torch") or {}).get("nccl")
        rows += [{"run": f"`{_rel(run.path, out)}`",
                  **_gpu_row(gpu, at_end.get(gpu.get("uuid"), {}), _idle_of(idle, gpu.get("uuid"))),
                  "NCCL": nccl} for gpu in run.env.get("gpus") or []]
    idle_lines = "\n".join(f"- `{_rel(run.path, out)}`: {idle_power_line(_idle_record(run.env))}"
                           for run in runs)
    text = ("\nIdle power of each GPU the trials could see, read before the run's first trial with "
            "no process on it (NVML's energy counter over 5 s; env.json `gpu_idle_power`). GPU "
            "energy and power in this report include it:\n\n" + idle_lines + "\n")
    if not rows:
        return text
    body = tabulate(pd.DataFrame(rows), headers="keys", tablefmt="github", showindex=False)
    summary = f"GPU settings and state, start and end of each run ({len(rows)} GPU rows)"
    return text + "\n" + _collapsed(summary, body)


def _idle_record(env: dict[str, Any]) -> dict[str, Any] | None:
    """env.json's idle power record (gpu_state.idle_power); None where the run has none."""
    found = env.get(gpu_state.IDLE_KEY)
    return found if isinstance(found, dict) else None


def _idle_of(record: dict[str, Any] | None, uuid: str | None) -> dict[str, Any] | None:
    """One GPU's entry of the idle record; a GPU it did not read, with why."""
    if record is None:
        return None
    found = next((g for g in record.get("gpus") or [] if g.get("uuid") == uuid), None)
    return found or {"watts": None, "reason": record.get("reason") or "not a GPU the trials could see"}


def _gpu_row(gpu: dict[str, Any], at_end: dict[str, Any],
             idle: dict[str, Any] | None = None) -> dict[str, Any]:
    start, end = gpu.get("state") or {}, at_end.get("state") or {}
    pcie = (f"{start.get('pcie_generation')} x {start.get('pcie_width')} "
            f"({start.get('pcie_max_generation')} x {start.get('pcie_max_width')})")
    return {"GPU": gpu.get("index"), "idle power": idle_power_text(idle),
            "power limit / enforced (W)": _pair(start, "power_limit_w", "enforced_power_limit_w"),
            "SM clock / application (MHz)": _pair(start, "sm_clock_mhz", "application_sm_clock_mhz"),
            "memory clock / application (MHz)": _pair(start, "memory_clock_mhz",
                                                      "application_memory_clock_mhz"),
            "throttle reasons: start -> end": f"{_reasons(start)} -> {_reasons(end)}",
            "clocks held down in between (s)": _held_down(at_end.get("held_down_s")),
            "persistence": start.get("persistence_mode"), "compute mode": start.get("compute_mode"),
            "MIG": start.get("mig_mode"), "ECC": start.get("ecc_enabled"), "PCIe gen x width (max)": pcie}


def _pair(state: dict[str, Any], first: str, second: str) -> str:
    return f"{_value(state.get(first))} / {_value(state.get(second))}"


def _value(value: Any) -> str:
    return "n/a" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _reasons(state: dict[str, Any]) -> str:
    """Throttle reasons in words: "none", their names, or "n/a" where not read."""
    found = state.get("throttle_reasons")
    return "n/a" if found is None else ", ".join(found) or "none"


def _held_down(seconds: dict[str, float | None] | None) -> str:
    """The limits that held the clocks down, with their seconds: "none", or "n/a" unread."""
    read = {name: s for name, s in (seconds or {}).items() if s is not None}
    if not read:
        return "n/a"
    return ", ".join(f"{name} {s:.3g}" for name, s in read.items() if s > 0) or "none"


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
    "sample (a t interval clipped at 0 where values are 0), and for a proportion (accuracy, a "
    "fraction) a logit-scale interval that stays inside (0, 1); of a speedup, the ratio of "
    "geometric means with Welch's t on log values, or of means with Fieller's where values are "
    "0; the percentile bootstrap is in the "
    "CSV beside it as a cross-check only (it covers about 80 % at n = 3). A claim is decided only "
    "from at least its experiment's minimum of ok trials per arm (each section names it). The "
    "intervals describe trial-to-trial noise on this machine; they say nothing about another "
    "machine.")


def _reading_section(runs: list[RunData]) -> str:
    """What every section's numbers are, said once."""
    vision = any(r.spec.workload == "vision" for r in runs)
    notes = [INTERVALS_NOTE, *([VISION_TIMING_NOTE] if vision else [])]
    return "## How to read the numbers\n\n" + "\n\n".join(notes) + "\n"


def _config_label(spec: Spec, row: pd.Series) -> str:
    return " ".join(f"{k}={row[k]}" for k in spec.grid)


def _pilot_text(pilot: int) -> str:
    return f" and judged, beside {pilot} ok pilot trials that set the count" if pilot else ""


def _auto_note(run_dir: Path) -> list[str]:
    """How `--trials auto` decided to stop (auto.json, written by the runner)."""
    path = run_dir / "auto.json"
    if not path.exists():
        return []
    found = json.loads(path.read_text())
    return ["", f"Trials: auto (Stein's two-stage rule), {found['pilot_rounds']} pilot rounds "
            f"set the count and are left out of every statistic; at most {found['max_rounds']} "
            f"rounds in all, each comparison's interval aimed at +-{found['half_width']:.1%}: "
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


def _experiment_section(run: RunData, name: str, out: Path, echo: Callable[[str], None] | None = None,
                        loader_only: summarize.LoaderRates | None = None,
                        numa_tolerance: float = summarize.PENALTY_TOLERANCE) -> str:
    spec = run.spec
    trials = summarize.trial_table(spec, run.records)
    failed = summarize.failures(spec, run.records)
    table = summarize.config_table(spec, trials, failed)
    display = display_table(spec, table)
    tables = out / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    markdown = write_tables(tables / name, display, render_csv(table), tex=True)
    trials.to_csv(tables / f"{name}_trials.csv", index=False)
    figures = _figures(spec, table, trials, summarize.ladder_table(spec, trials, loader_only), name, out)
    fixed = "\n".join(f"- `{k}` = {v}" for k, v in spec.fixed.items())
    lines = [
        f"## {spec.title}" + (": the loader alone, no model" if summarize.is_loader_only(spec) else "")
        + f" ({run_nature(spec)})",
        "",
        f"Experiment `{spec.name}` ({spec.paper or 'extension'}), profile `{spec.profile}`, "
        f"run {_run_names(run, out)}: {len(trials)} of {run.planned} planned trials ok"
        f"{_pilot_text(summarize.pilot_count(spec, run.records))}, {_not_ok_text(failed)}; "
        f"a verdict needs {spec.min_ok} ok trials per arm"
        + (f"; speed-ups are over {', '.join(f'{k}={v}' for k, v in spec.baseline.items())}"
           if spec.baseline else "") + ".",
        "",
        *_budget_lines(spec),
        render_markdown(headline_table(spec, table)),
        f"Raw per-trial values: `tables/{name}_trials.csv`; all statistics: `tables/{name}.csv`.",
        "",
        *_energy_lines(spec, run, name),
        _collapsed(f"every statistic ({len(display.columns)} columns)", markdown),
        _collapsed(f"fixed settings ({len(spec.fixed)})", fixed),
    ]
    lines += _auto_note(run.path)
    warned = [f"- {_config_label(spec, r)}: {'; '.join(texts)}" for _, r in table.iterrows()
              if (texts := warning_texts(spec, r))]
    if warned:
        lines += ["", f"Warnings ({label(spec.primary)}):", "", *warned]
        for line in warned if echo else []:
            echo(f"warning: {spec.name}: {line.removeprefix('- ')}")
    lines += _stray_lines(spec, summarize.stray_trials(spec, run.records), echo)
    lines += _trace_sections(spec, run.records, name, tables)
    if "numa_policy" in spec.grid:
        lines += ["", numa_section(spec, trials, numa_tolerance, run.records)]
    if any(r.get("random_weights") for r in run.records if r.get("experiment") == spec.name):
        lines += ["", "Weights: **random** (the model's architecture, seeded): times and memory "
                  "are valid, losses are meaningless."]
    lines += figures
    if len(failed):
        lines += ["", "Failures:", ""]
        lines += [f"- `{r.config_id}` trial {r.trial}: **{r.status}** {r.error_type or ''}: "
                  f"{_first_line(r.message)}" for r in failed.itertuples()]
    return "\n".join(lines) + "\n"


def _energy_lines(spec: Spec, run: RunData, name: str) -> list[str]:
    """Where a section's tables show energy: the rule behind its cells, and the idle power a
    reader takes out of it (the report computes nothing of its own)."""
    shown = [label(m) for m in spec.metrics if m in summarize.ENERGY_METRICS]
    if not shown:
        return []
    least = summarize.MIN_ENERGY_TRIALS
    window, unit, rate = ("its measured steps", "token", "tokens/s (all GPUs)") if spec.workload == "llm" \
        else ("its train time", "image", "images/s")
    return [f"Energy ({', '.join(shown)}): shown for a config only where at least {least} ok "
            f"trials measured it, with its 95 % interval; fewer read \"n < {least}\" "
            f"(`tables/{name}.csv`: empty, the reason in the metric's `.withheld` column). It "
            "includes the GPUs' idle draw, read before the first trial: "
            f"{idle_power_line(_idle_record(run.env))}. A trial's energy above idle is its energy "
            f"less the idle power of its GPUs (summed) times {window}; per {unit}, less that idle "
            f"power divided by its {rate}.", ""]


def _figures(spec: Spec, table: pd.DataFrame, trials: pd.DataFrame, ladder: pd.DataFrame, name: str,
             out: Path) -> list[str]:
    """Draw the experiment's figures under out/figures (the ladder's table beside the others);
    the report's lines that show them. A figure with nothing to show is neither drawn nor shown."""
    figures, lines = out / "figures", []
    if plot_primary(spec, table, trials, figures / f"{name}.png"):
        lines += ["", f"![{spec.title}](figures/{name}.png)"]
    if plot_breakdown(spec, table, figures / f"{name}_breakdown.png"):
        lines += ["", f"![compute vs copy wait vs data wait](figures/{name}_breakdown.png)"]
    unit = "token" if spec.workload == "llm" else "image"
    if plot_time_and_energy(spec, table, figures / f"{name}_energy.png"):
        lines += ["", f"![time and GPU energy per {unit}](figures/{name}_energy.png)"]
    elif energy_metric(spec):
        lines += ["", f"No time-and-energy figure: no config has GPU energy per {unit} (the "
                  "table's energy columns say why)."]
    if plot_ladder(spec, table, ladder, figures / f"{name}_ladder.png"):
        ladder.to_csv(out / "tables" / f"{name}_ladder.csv", index=False)
        alone = ("; the loader alone from the loader_only run" if ladder["loader_only"].notna().any()
                 else "; no loader_only run in this report, so no loader-alone rung")
        lines += ["", f"The bottleneck ladder (images/s per config: whole trial, training loop, "
                  f"synthetic ceiling{alone}): `tables/{name}_ladder.csv`.", "",
                  f"![the bottleneck ladder](figures/{name}_ladder.png)"]
    return lines


def _budget_section(dirs: list[Path]) -> str:
    """The budget plan a collection ran under (`budget.json`), every experiment of it: one whose
    every config was dropped has no run and would otherwise go unsaid."""
    from multicard.judge.budget import PLAN_FILE

    parts = []
    for d in dirs:
        try:
            plan = json.loads((d / PLAN_FILE).read_text(encoding="utf-8"))
            rows = [_budget_row(name, part) for name, part in plan["experiments"].items()]
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            parts.append(f"`{d.name}/{PLAN_FILE}` is not a budget plan ({exc}); each run's spec.toml "
                         "still says what it kept.")
            continue
        table = tabulate(rows, headers=["experiment", "trials per config", "configs kept", "epochs",
                                        "given up"], tablefmt="github")
        parts.append(f"`{d.name}` was planned to fit `--budget {plan.get('duration')}` (`{PLAN_FILE}`): "
                     f"a smaller run than the paper's, and what each experiment gave up:\n\n{table}")
    return "## Budget\n\n" + "\n\n".join(parts) + "\n" if parts else ""


def _budget_row(name: str, part: dict[str, Any]) -> list[Any]:
    configs = part["configs"]
    kept = "all" if configs is None else ("none: not run" if not configs else str(len(configs)))
    lost = "; ".join(part["given_up"]) or "nothing"
    return [name, part["trials"], kept, part["epochs"] or "unchanged", lost]


def _budget_lines(spec: Spec) -> list[str]:
    """What a time budget made this run give up (a smaller run than the spec's, said as such)."""
    if spec.budget is None:
        return []
    lost = "; ".join(spec.budget.given_up) or "nothing"
    return [f"Planned to fit a budget of {spec.budget.duration} (`--budget`): gave up {lost}.", ""]


def _stray_lines(spec: Spec, strays: pd.DataFrame, echo: Callable[[str], None] | None) -> list[str]:
    """A warning per trial whose ranks held memory on a GPU they do not train on."""
    if strays.empty:
        return []
    lines = [f"- {_config_label(spec, r)} trial {r['trial']}: {r['stray_contexts']} (process, GPU) "
             f"pair(s) (`{r['details']}`)" for _, r in strays.iterrows()]
    for line in lines if echo else []:
        echo(f"warning: {spec.name}: stray CUDA context: {line.removeprefix('- ')}")
    return ["", "**Warning: stray CUDA contexts.** A rank or its loader workers held memory on a GPU "
            "the rank does not train on (pin_memory's thread on GPU 0 is the known case, pytorch "
            "issues 58626 and 21081): per-GPU memory of these trials is not comparable.", "", *lines]


def _trace_sections(spec: Spec, records: list[dict[str, Any]], name: str, tables: Path) -> list[str]:
    """The Nsight metrics and the pre-epoch pauses of the traced trials, when there are any."""
    lines: list[str] = []
    traces = summarize.trace_table(spec, records)
    if not traces.empty:
        lines += ["", "Profiled trials (extra, untimed): the paper's Nsight metrics per rank, mean "
                  "over traced trials; raw traces under `raw/*-<trace>-*/`.", "",
                  _collapsed(f"the Nsight metrics ({len(traces)} rows): `tables/{name}_nsight.csv`",
                             write_tables(tables / f"{name}_nsight", display_trace_table(spec, traces),
                                          traces.to_csv(index=False)))]
    pauses = summarize.pause_table(spec, records)
    if not pauses.empty:
        lines += ["", "Pause before the first step of each epoch, from the trace timeline (the "
                  "longest over ranks, mean over traced trials; only the epochs a trace covers):",
                  "", write_tables(tables / f"{name}_pauses", display_pause_table(spec, pauses),
                                    pauses.to_csv(index=False))]
    return lines


def _not_ok_text(failed: pd.DataFrame) -> str:
    """"1 failed attempt(s)", or with skips apart: a skipped config (a policy this machine cannot
    run) did not fail."""
    skipped = int((failed["status"] == "skipped").sum()) if len(failed) else 0
    text = f"{len(failed) - skipped} failed attempt(s)"
    return text + (f", {skipped} skipped (not runnable here, the reason in each record)" if skipped else "")


def _page_cache_note(spec: Spec) -> str:
    """Which page cache the NUMA test read (a warm one sits where whoever read it first ran)."""
    state = spec.fixed.get("page_cache")
    if state == "cold":
        return ("Every trial read a cold page cache: its files' pages land where its own ranks "
                "read them, not where the runner or another policy's trial did.")
    if "page_cache" in spec.grid:
        return ("The page cache is a factor of this run, warm against cold: the runner warms it "
                "unbound, so a warm arm's pages sit on the runner's node whatever the policy: read "
                "the policies' placement on the cold arm.")
    return (f"The page cache was {state!r}: its pages sit where whoever read them first ran, so "
            "a policy may be judged on another's placement.")


def numa_section(spec: Spec, trials: pd.DataFrame, tolerance: float = summarize.PENALTY_TOLERANCE,
                 records: list[dict[str, Any]] | None = None) -> str:
    """The verdict on the paper's NUMA hypothesis (C10), with the ratios behind each answer."""
    lines = [f"### NUMA hypothesis ({spec.name})", "",
             "Ratios are of geometric means, gmean(time under the reference) / gmean(time under "
             "the compared level), with "
             "a 95% CI (Welch's t on log times): above 1 means the compared level is faster (or "
             "pauses less), below 1 slower (docs/experiments.md, \"NUMA\"). Question 1 is a test "
             "of the penalty T_torch/T_dali at 3-4 GPUs: there without binding (one interval pooled "
             f"over the groups of the other factors, above 1), within {tolerance:.0%} of 1 under "
             "`local` in every group (claims.toml's [tolerance.numa]); `no` where a group's lies "
             "wholly above, read at the level the groups share. " + _page_cache_note(spec), ""]
    for number, finding in enumerate(summarize.numa_findings(spec, trials, tolerance, records), start=1):
        lines += [f"{number}. {finding.question} **{finding.answer}**"
                  + (f" ({finding.why})" if finding.why else ""), ""]
        if not finding.evidence.empty:
            lines += [render_markdown(display_effects(spec, finding.evidence)), ""]
    return "\n".join(lines)


def _claims_section(runs: list[RunData], claim_list: list[claims.Claim] | None, out: Path) -> str:
    if claim_list is None:
        return "## Claims of the paper\n\nNo claims file (experiments/claims.toml) was given.\n"
    table, counts = _verdicts(runs, claim_list)
    display = table.assign(verdict=[f"**{v}**" for v in table["verdict"]])
    full = write_tables(out / "tables" / "claims", display, table.to_csv(index=False))
    return ("## Claims of the paper\n\n"
            f"{len(table)} claims: {counts}. Verdicts follow the 95% confidence intervals only "
            "(docs/claims.md). A ratio is gmean(metric of the reference arm) / gmean(metric "
            "of the arm the claim is about) (geometric means, as Welch's t on logs estimates), "
            "e.g. C1: time(FP64) / time(FP32), so above "
            "1 means the claim's arm has the smaller value (is faster, uses less memory); "
            "`experiments/claims.toml` names both arms of each claim.\n\n"
            + render_markdown(_narrow_claims(table)) + "\n\n" + "\n".join(_claim_reasons(table))
            + "\n\n" + _collapsed("every column: `tables/claims.csv`", full))


NARROW_CLAIMS = {"claim": "claim", "verdict": "verdict", "Holm-adjusted": "Holm", "paper": "paper",
                 "first group": "ours, first group [95% CI]",
                 "power if the paper is right": "power if right"}


def _narrow_claims(table: pd.DataFrame) -> pd.DataFrame:
    """The claims table a page can hold: one short line per claim, the reasons below it. Beside
    `not run` no number stands (a CPU smoke run's gains are not the claim's): only that there
    is one, unjudged, in tables/claims.csv and the experiment's own table."""
    first = [("not judged (other hardware or too few trials): tables/claims.csv" if v == "not run"
              and e != "–" else e) for v, e in zip(table["verdict"], table["first group"], strict=True)]
    narrow = table.assign(verdict=[f"**{v}**" for v in table["verdict"]], **{"first group": first},
                          paper=[_shortened(t, 32) for t in table["paper"]])
    return narrow[list(NARROW_CLAIMS)].rename(columns=NARROW_CLAIMS)


def _shortened(text: str, most: int) -> str:
    return text if len(text) <= most else text[:most - 1].rstrip() + "…"


def _claim_reasons(table: pd.DataFrame) -> list[str]:
    lines = []
    for row in table.to_dict("records"):
        bound = f" Data-bound? {row['data-bound?']}." if row["data-bound?"] != "–" else ""
        lines.append(f"- **{row['claim']}** {row['the paper says']} ({row['experiment']}; the "
                     f"paper: {row['paper']}). Reproduced if {row['reproduced if']}. Ours: "
                     f"{row['ours [95% CI]']}. {row['why']}.{bound}")
    return lines


def _collapsed(summary: str, body: str) -> str:
    """A section a reader opens when wanted (HTML <details>; GitHub and REPORT.html fold it)."""
    return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>\n"


# the step profile's columns as REPORT.md shows them: (title, key, scale to the unit shown)
STEP_PROFILE_COLUMNS = (("precision", "precision", None), ("px", "image_size", None),
                        ("batch", "batch_size", None), ("one-rank DDP", "single_rank_ddp", None),
                        ("step (ms)", "step_s", 1e3), ("rank CPU (ms/step)", "rank_cpu_s_per_step", 1e3),
                        ("kernels/step", "probe_kernels_per_step", None),
                        ("kernel time (ms/step)", "probe_kernel_s_per_step", 1e3),
                        ("GPU busy (ms/step)", "probe_busy_s_per_step", 1e3),
                        ("ATen ops/step", "probe_aten_ops_per_step", None),
                        ("GPU computing (%)", "gpu_busy_fraction", 1e2), ("bound", "bound", None))


def _operating_point_section(dirs: list[Path], out: Path) -> str:
    """first-evidence's step profile: where the GPU, and where the host, sets a step's pace."""
    parts = []
    for path, profile in step_profiles(dirs):
        rows = [[_profile_cell(row.get(key), scale) for _, key, scale in STEP_PROFILE_COLUMNS]
                for row in profile.get("rows", [])]
        table = tabulate(rows, headers=[title for title, _, _ in STEP_PROFILE_COLUMNS], tablefmt="github")
        parts.append(f"`{_rel(path, out)}` (device {profile.get('device')}, torch {profile.get('torch')}):"
                     f"\n\n{table}\n")
    if not parts:
        return ""
    return ("## Operating point\n\nThe step profile: each point's timed steps, then as many under "
            "torch.profiler. GPU computing is the compute kernels' busy time over the step's wall "
            f"time; `GPU-bound` from {operating_point.GPU_BOUND_AT:.0%}, `host-bound` below "
            "(judge/operating_point.py); \"–\" where not measured (on CPU: no kernels).\n\n"
            + "\n".join(parts))


def _profile_cell(value: Any, scale: float | None) -> str:
    if value is None:
        return "–"
    if scale is not None:
        return f"{value * scale:.3g}"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _energy_section(runs: list[RunData], questions: list[claims.Claim] | None, out: Path) -> str:
    """The artifact's own questions (experiments/energy_questions.toml), answered by the claims'
    rules: does each of the paper's levers save energy per image (the GPUs', and the CPU
    packages' too where a lever moves work between the CPU and the GPU)?"""
    if questions is None:
        return ""
    table, counts = _verdicts(runs, questions)
    narrow = render_markdown(_narrow_claims(table).rename(columns={"claim": "question"})) + "\n" \
        + "\n".join(_claim_reasons(table))
    table = table.drop(columns=["first group"]).rename(
        columns={"claim": "question", "the paper says": "question asked"})
    display = table.assign(verdict=[f"**{v}**" for v in table["verdict"]])
    sources = summarize.energy_sources(r for run in runs for r in run.records)
    read = ("; ".join(f"{how}: {n} trial(s)" for how, n in sorted(sources.items())) if sources
            else "no trial measured GPU energy (each record's `unmeasured` says why)")
    return ("## Energy\n\n"
            "Questions of this artifact, not claims of the paper (which measures time only): does "
            f"each lever save energy per training image? {len(table)} questions: {counts}. "
            "Energy is every trial GPU's over the timed epochs, from NVML's energy counter only, "
            "over windows of at least 5 s (a shorter window has no energy: null, with its reason), "
            f"node level for the GPUs, not the wall socket; read here as {read}; two arms read "
            "differently are not compared. It includes the GPUs' idle draw (each GPU's idle power "
            "is under Environment). A lever that moves work between the CPU and "
            "the GPU (pinned copies, GPU decoding) is judged on the GPUs' and the CPU packages' "
            "energy together (RAPL), its verdict marked \"GPU energy only\" where RAPL could not be "
            "read. A ratio above "
            "1 means the lever's arm uses less energy per image. Same intervals and verdict rules "
            "as the claims.\n\n" + narrow + "\n\n"
            + _collapsed("every column: `tables/energy_questions.csv`",
                         write_tables(out / "tables" / "energy_questions", display,
                                      table.to_csv(index=False))))


def _verdicts(runs: list[RunData], claim_list: list[claims.Claim]) -> tuple[pd.DataFrame, str]:
    results: dict[str, list[claims.Results]] = {}
    # a loader_only run trains nothing: its configs share names with training's, never its claims
    for run in (r for r in runs if not summarize.is_loader_only(r.spec)):
        results.setdefault(run.spec.name, []).append(claims.results_of(run.spec, run.records))
    verdicts = claims.evaluate(claim_list, results)
    adjusted = claims.holm(verdicts, results)
    trial_tables = [(r.spec, r.trials) for found in results.values() for r in found]
    cv, configs = power.measured_cv(trial_tables)
    support = [None if cv is None or v.verdict == "not run" else
               power.paper_right_support(claim_list, v.claim, trial_tables, _claims_folder(), cv,
                                             POWER_DRAWS)
               for v in verdicts]
    table = pd.DataFrame([{
        "claim": v.claim.id, "the paper says": _question(v),
        "paper": v.claim.paper,
        "verdict": v.verdict, "Holm-adjusted": holm, "reproduced if": criterion_text(v.claim),
        "ours [95% CI]": evidence_text(v.evidence), "why": v.why,
        "first group": evidence_text(v.evidence, shown=1),
        "power if the paper is right": power_text(found),
        "experiment": ", ".join(_claim_experiments(v.claim)),
        "data-bound?": _bounds(v.claim, runs),
    } for v, holm, found in zip(verdicts, adjusted, support, strict=True)])
    counts = ", ".join(f"{(table['verdict'] == k).sum()} {k}" for k in claims.VERDICTS)
    family = claims.judged(verdicts)
    changed = sum(a != v.verdict for v, a in zip(verdicts, adjusted, strict=True))
    return table, (counts + ". " + family_text(family, *stats.family_error(family), changed)
                   + ". " + power_note(cv, configs))


def _claims_folder() -> Path:
    return claims.default_file().parent


def power_text(found: power.RunPower | None) -> str:
    if found is None:
        return "–"
    if not found.underpowered:
        return f"{found.support:.2f} (n={found.n})"
    needed = f"{found.needed}" if found.needed is not None else f"> {power.TRIAL_LADDER[-1]}"
    return (f"{found.support:.2f} (n={found.n}): underpowered, {needed} trials per config for "
            f"{found.target:.0%}")


def power_note(cv: float | None, configs: int) -> str:
    """What the power column is, at which noise."""
    if cv is None:
        return "Power: no config has 2 ok trials, so no noise was measured and none is shown"
    return (f"Power: the share of {POWER_DRAWS} seeded draws that read supported where the paper "
            f"is right, through the same judge, at each claim's median ok trials per config (n) "
            f"and this report's measured trial-to-trial variation, CV {cv:.1%} (the median over "
            f"{configs} config(s) of sd / mean); under 0.80 a claim is underpowered at this "
            "noise, and the trials per config it would need are named; `multicard claims power` "
            "gives every world; trace-metric claims (C4, C18) are not simulated")


POWER_DRAWS = 50


def family_text(judgements: int, independent: float, bound: float, changed: int) -> str:
    """What a table's verdicts risk together, and what the Holm column does about it."""
    if judgements == 0:
        return "No verdict here is a judgement (all not run or invalid): none can be wrong"
    return (f"Of {judgements} judgements, each raw verdict is wrong at most 2.5 % of the time (the "
            f"truth at its band's end), so at least one of them is wrong up to {independent:.0%} of "
            f"the time if they are independent ({bound:.0%} at most, Bonferroni, whatever their "
            "dependence). The Holm-adjusted column keeps that chance at the 2.5 % of one verdict: "
            "Holm's step-down re-judges each decisive verdict with wider intervals; "
            f"{changed} verdict(s) do not stand there ({claims.HOLM_UNDECIDED})")


def _bounds(claim: claims.Claim, runs: list[RunData]) -> str:
    """Whether the configs a claim compares were data-bound (the `bound` of their loader
    table rows, against the synthetic loader), where its experiment has the synthetic twin."""
    if claim.parts:
        return "; ".join(b for part in claim.parts if (b := _bounds(part, runs)) != "–") or "–"
    found = []
    for run in (r for r in runs if r.spec.name == claim.experiment):
        trials = summarize.trial_table(run.spec, run.records)
        table = summarize.config_table(run.spec, trials, summarize.failures(run.spec, run.records))
        if "bound" not in table:
            continue
        for arm in (a for a in (claim.compare, claim.against) if a):  # an outcome has one arm
            rows = table[[all(_in(r.get(k), v) for k, v in {**arm, **claim.where}.items())
                          for r in table.to_dict("records")]]
            rows = rows[rows[f"{run.spec.primary}.n"] > 0]  # configs with ok trials only
            labels = sorted({str(b) for b in rows["bound"].dropna()})
            where = "".join(f" at {k}={v}" for k, v in claim.where.items())
            found.append(f"{', '.join(f'{k}={v}' for k, v in arm.items())}: "
                         f"{'/'.join(labels) or 'no ok trial' + where}")
    return "; ".join(found) or "–"


def _in(value: Any, wanted: Any) -> bool:
    return value in wanted if isinstance(wanted, list) else value == wanted


def evidence_text(evidence: tuple[claims.Evidence, ...], shown: int = 6) -> str:
    """`gpus=1: 60% gain [58.8, 61.2]; ...`, the first `shown` groups and how many more there are."""
    def one(e: claims.Evidence) -> str:
        if e.statuses:
            return f"{e.label}: {'/'.join(e.statuses)} ({e.n[0]} attempts)"
        ci = "" if math.isnan(e.ci_lo) else f" [{e.ci_lo:.3g}, {e.ci_hi:.3g}]"
        reading = f" {e.reading.split(' (')[0]}" if e.unit == "%" and e.reading else ""
        paper = "" if math.isnan(e.paper) else \
            f"; paper {e.paper:.3g}{e.unit}{' (inferred)' if e.paper_inferred else ''}"
        return f"{e.label}: {e.value:.3g}{e.unit}{reading}{ci} (n {e.n[0]}/{e.n[1]}{paper})"

    text = "; ".join(one(e) for e in evidence[:shown]) or "–"
    return text + (f" (+{len(evidence) - shown} more)" if len(evidence) > shown else "")


def criterion_text(claim: claims.Claim) -> str:
    """What the claim's verdict asks of the interval, in the claim's own units."""
    if claim.parts:
        return "; ".join(f"({i + 1}) {criterion_text(p)}" for i, p in enumerate(claim.parts))
    tol = claim.tolerance
    if claim.kind == "range":
        assert claim.range is not None
        low, high = (claims.from_log_ratio(claim.quantity, x) for x in claims.span_band(claim))
        unit = "x" if claim.quantity == "ratio" else f" % {claims.READINGS[claim.quantity].split(' (')[0]}"
        paper = f"{claim.range[0]:g}-{claim.range[1]:g}"
        return f"{low:.3g}-{high:.3g}{unit} (the paper's {paper} ± {tol:.0%} of its effect)"
    if claim.kind == "direction":
        side = "above" if claim.side == "above" else "below"
        return f"ratio {side} 1, reaching {tol:.0%} that way; contradicted wholly short of it"
    if claim.kind == "negligible" and claim.quantity != "ratio":
        low, high = (claims.from_log_ratio(claim.quantity, math.log1p(x)) for x in (-(tol or 0), tol or 0))
        reading = claims.READINGS[claim.quantity].split(" (")[0]
        return f"{low:.3g} to {high:.3g} % {reading} (ratio within 1 ± {tol:.0%})"
    if claim.kind == "negligible":
        return f"ratio within 1 ± {tol:.0%}"
    if claim.kind == "not_worse":
        return f"loss at most {100 * (tol or 0):g} point(s)"
    if claim.kind == "shrinks":
        return (f"log ratio falls from the fewest to the most {claim.along}, reaching {tol:.0%}; "
                f"contradicted wholly short of it")
    if claim.kind == "numa":
        return f"penalty T_torch/T_dali above 1 unbound, within {tol:.0%} of 1 under local"
    if claim.kind == "outcome":
        return "the configs fail for a resource" if claim.outcome == "fails" else "the configs run"
    if claim.kind == "dominates":
        return (f"{' + '.join(claim.numerator)} / {' + '.join(claim.denominator)} above 1; "
                "contradicted wholly below")
    return "–"


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
    messages = "\n".join(f"- {r['experiment']}, {r['cause']}: {_first_line(r['message'])[:300]}"
                         for r in table.to_dict("records"))
    return ("## Failures and skips\n\nEvery attempt that failed (error, timeout, oom) and every "
            "config this machine could not run (`skipped`, with the reason), by cause; the "
            "per-trial list is in each section above, the stderr of a failed attempt in "
            "`raw/<config>-t<trial>-a<attempt>/stderr.log`.\n\n"
            + render_markdown(table.drop(columns=["message", "run"])) + "\n" + messages + "\n" + torn)


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
    # relative to where the reader stands: the absolute path is gone once the run is packed
    return (
        "## How to verify these files\n\n"
        "Every file under this directory is listed in `SHA256SUMS` (coreutils format):\n\n"
        "```\n"
        "sha256sum -c SHA256SUMS    # in this directory\n"
        f"multicard verify {out.name}    # from the one above; also names missing or unlisted files\n"
        "```\n\n"
        f"To deposit it in an archive: `multicard pack {out.name}` writes a deterministic "
        f"`{out.name}.tar.gz` beside it, which `multicard verify {out.name}.tar.gz` checks "
        "without extracting.\n"
    )


def _question(v: claims.Verdict) -> str:
    """The claim's text and what its verdict read: the fallback's label where any run was judged
    on it, else the metric's own."""
    label = v.read_as or v.claim.metric_label
    return v.claim.text + (f" ({label})" if label else "")
