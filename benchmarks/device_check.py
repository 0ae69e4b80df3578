"""One-shot device check: does the harness measure what it says on this machine's GPU?

    PYTHONPATH=src python3 benchmarks/device_check.py --dry-run     # the plan and its estimate
    PYTHONPATH=src python3 benchmarks/device_check.py               # one GPU, under 8 minutes
    PYTHONPATH=src python3 benchmarks/device_check.py --out DIR     # again: continue where it stopped
    PYTHONPATH=src python3 benchmarks/device_check.py --device cpu  # the same on CPU, tiny sizes
    nox -s device-check -- [ARGS]                                   # the same through nox

Exit status: 0 every part ran and every check held; 1 a check or a trial failed; 2 bad input; 3
nothing failed, but parts were left for the budget (run it again with the same --out to finish).
It needs only Python, torch, torchvision and multicard's light dependencies (pandas, tabulate,
matplotlib, scipy, filelock, nvidia-ml-py, tomli-w): no nox, DALI, torchtune or network. It writes
`artifact/runs/<N>x<gpu-model>-device-check-<UTC>/` (`cpu-device-check-<UTC>` on CPU): one run
directory per trial part below, `harness/` (harness_ab.json: every block's raw seconds and steps,
its log, the GPUs' clock limits around it), `env.json`, `device_check.json`, `tables/`, SHA256SUMS
after every part, and REPORT.md with figures once every part has run.

Parts, 1 GPU, in the order they run:
- harness: the harness against a plain loop, like for like, in one process
  (benchmarks/harness_ab.py): A-B-B-A blocks of the harness's epoch path (vision.timed_epochs with
  its meters, step clock, batch timer and loader epochs) and of a plain loop of the same
  train_step on the same model and resident batch, HARNESS_RUN's pairs of them, an A/A control,
  and the plain loop against a bare model (no DDP: DDP's host bookkeeping), at the host-bound
  point (fp16, 100 px, batch 64, nhwc) and at the judged one (fp32, 224 px, batch 128); each a
  paired ratio of images/s with its 95 % interval, and whether it is within +-2 %;
- precision: fp64 / fp32 / tf32 / fp16 / bf16, 1 trial each (2 epochs of 50 steps, the DataLoader,
  Scenario A at 100 px), TF32 flags read back and TF32 measured (an fp32 matmul and convolution
  against float64);
- pin_memory: off / on at fp16, 1 trial each;
- nsys: the precision part's fp32 trial once more, traced, captured and parsed, where `nsys` is on
  PATH: what tracing costs (traced / untraced time);
- nccl: one 2-rank trial, where two GPUs are visible (the dry run plans for one GPU, nsys on PATH).
A part that would end past `--budget-s` (8 minutes) is left for the next call and named, not
failed; its estimate learns from the trials already run (the planner's calibration: measured
rates per setting, and the guessed cost model scaled by what the run has measured of it).
The checks: CUDA-event step times against the host's clock over the same spans (within 5 %),
every precision's TF32 as set, the harness not slower than the plain loop by more than
PLAIN_LOOP_TOLERANCE at the host-bound point (its interval wholly below), the comparison run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # a bare checkout: no install needed
    sys.path.insert(0, str(ROOT / "src"))

from multicard import integrity  # noqa: E402
from multicard.errors import InputError  # noqa: E402
from multicard.judge import summarize  # noqa: E402
from multicard.measure import environment, gpu_state, telemetry  # noqa: E402
from multicard.plan import calibrate, cost, launch  # noqa: E402
from multicard.plan import spec as specmod  # noqa: E402
from multicard.plan.precision import PRECISIONS  # noqa: E402
from multicard.profiling import nsys  # noqa: E402
from multicard.publish import document  # noqa: E402
from multicard.run import runner, store  # noqa: E402
from multicard.run.stopping import GATE, Interrupted, stop_on_signals  # noqa: E402

TARGET_S = 8 * 60
STEP_CLOCK_TOLERANCE = 0.05
# The harness may cost this much of a plain loop's images/s before the check fails: its loader's
# epochs, the step clock and the meters are not free, but more would be a harness problem.
PLAIN_LOOP_TOLERANCE = 0.10
HARNESS_AB = ROOT / "benchmarks" / "harness_ab.py"
HARNESS_FILE = "harness_ab.json"
# The comparison's blocks (benchmarks/harness_ab.py). On a GPU 2.5 s, not harness_ab's default
# 5 s: its 68 blocks over two points must fit the 8 minutes beside the other parts, and the
# pairs, not the blocks' length, set the interval (a pair's two blocks run within 5 s of each
# other, and A-B-B-A cancels a linear drift across them). On CPU the path only: fewer pairs.
HARNESS_RUN: dict[str, dict[str, Any]] = {
    "cuda": {"block_s": 2.5, "pairs": 10, "control_pairs": 4, "bare_pairs": 4},
    "cpu": {"block_s": 0.5, "pairs": 4, "control_pairs": 2, "bare_pairs": 2},
}
HARNESS_POINTS = 2  # harness_ab.POINTS: host-bound (with the bare pairs), then judged
# Guessed until a GPU run measures them: harness_ab's start (imports, CUDA, a group of one; the
# H200 run's plain-loop processes took 9-10 s), each point's set-up (its models, warm-up and
# probe), each block's cost beyond its steps (the meters' start and finish, two synchronizes),
# and how much longer than block_s a block runs (the harness arm's own cost, a probe of 20 steps).
HARNESS_START_S = {"cuda": 15.0, "cpu": 5.0}
POINT_SETUP_S = {"cuda": 8.0, "cpu": 6.0}
BLOCK_OVERHEAD_S = 0.1
BLOCK_MARGIN = 1.1
HARNESS_TIMEOUT_S = 600  # a hung harness_ab (an NCCL or CUDA init that never returns)
SIZES: dict[str, dict[str, Any]] = {
    "cuda": {"device": "cuda", "image_size": 100, "epochs": 2, "max_steps": 50, "batch_size": 64,
             "num_workers": 4, "test_subset": 2000, "cast": "host"},
    "cpu": {"device": "cpu", "image_size": 32, "epochs": 2, "max_steps": 4, "batch_size": 16,
            "num_workers": 1, "warmup_steps": 1, "train_subset": 1024, "test_subset": 64,
            "cast": "host"},
}
# The pin_memory part runs in fp16 on GPUs; CPUs have no fast fp16, so bf16 there.
COMPARED_PRECISION = {"cuda": "fp16", "cpu": "bf16"}


@dataclass(frozen=True)
class Harness:
    """The harness part: benchmarks/harness_ab.py, one process, no runner trials."""

    device: str
    block_s: float
    pairs: int
    control_pairs: int
    bare_pairs: int

    @classmethod
    def on(cls, device: str) -> Harness:
        return cls(device, **HARNESS_RUN[device])

    @property
    def blocks(self) -> int:
        """Every point's settling block of each arm, its pairs and control pairs; the bare pairs
        at the first point only."""
        return HARNESS_POINTS * 2 * (1 + self.pairs + self.control_pairs) + 2 * self.bare_pairs

    def guess_s(self) -> float:
        return (HARNESS_START_S[self.device] + HARNESS_POINTS * POINT_SETUP_S[self.device]
                + self.blocks * (self.block_s * BLOCK_MARGIN + BLOCK_OVERHEAD_S))

    def argv(self, path: Path) -> list[str]:
        return [sys.executable, str(HARNESS_AB), "--out", str(path), "--device", self.device,
                "--block-s", f"{self.block_s:g}", "--pairs", str(self.pairs),
                "--control-pairs", str(self.control_pairs), "--bare-pairs", str(self.bare_pairs),
                "--data-dir", str(ROOT / "data")]


def parts(device: str, gpus: int, with_nsys: bool,
          trials: int | None = None) -> dict[str, dict[str, Any] | Harness]:
    """name -> experiment document (the spec format of experiments/*.toml), or the Harness;
    `trials` overrides the trial parts' counts (one per config by default)."""
    fast = COMPARED_PRECISION[device]
    found = {  # in the order they run, after the comparison (the reason this check exists)
        "precision": ({}, {"precision": ["fp64", "fp32", "tf32", "fp16", "bf16"]},
                      {"precision": "fp64"}, {"count": trials or 1}),
        "pin_memory": ({"precision": fast}, {"pin_memory": [False, True]}, {"pin_memory": False},
                       {"count": trials or 1}),
    }
    if with_nsys:  # the precision part's fp32 config, traced: what tracing costs
        found["nsys"] = ({}, {"precision": ["fp32"]}, {}, {"count": 1, "trace": "nsys",
                                                           "trace_trials": "first"})
    if gpus >= 2:
        found["nccl"] = ({"precision": fast}, {"gpus": [2]}, {}, {"count": 1})
    return {"harness": Harness.on(device),
            **{name: _document(name, device, *part) for name, part in found.items()}}


def _document(name: str, device: str, fixed: dict[str, Any], grid: dict[str, Any],
              baseline: dict[str, Any], trials: dict[str, Any]) -> dict[str, Any]:
    doc = {"experiment": {"name": f"device_check_{name}", "workload": "vision",
                          "title": f"Device check: {name.replace('_', ' ')}"},
           "fixed": {**SIZES[device], **fixed}, "grid": grid,
           "trials": {"timeout_s": 600, **trials},
           "report": {"metrics": ["train_time_s", "throughput_samples_s", "step_time_median_s",
                                  "data_wait_fraction", "h2d_wait_fraction", "h2d_time_s",
                                  "peak_mem_bytes", "nvml_process_mem_bytes", "gpu_util_mean",
                                  "test_accuracy"]}}
    if baseline:
        doc["baseline"] = baseline
    return doc


def chosen(documents: dict[str, dict[str, Any] | Harness],
           names: str | None) -> dict[str, dict[str, Any] | Harness]:
    """The parts `--parts` names (all where it names none); InputError for a part there is not."""
    if names is None:
        return documents
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in documents]
    if unknown or not wanted:
        raise InputError(f"--parts: expected some of {', '.join(documents)} (the parts this machine "
                         f"can run), got {names!r}")
    return {name: doc for name, doc in documents.items() if name in wanted}


def specs(documents: dict[str, dict[str, Any] | Harness],
          where: Path) -> dict[str, specmod.Spec | Harness]:
    return {name: doc if isinstance(doc, Harness)
            else specmod.from_document(doc, where / f"device_check_{name}.toml")
            for name, doc in documents.items()}


# --- what has run, and what the rest will take -------------------------------------------------

def records_of(out: Path, name: str) -> list[dict[str, Any]]:
    return store.read(out / name / store.TRIALS_FILE)


def pending(s: specmod.Spec, records: list[dict[str, Any]]) -> list[specmod.PlannedTrial]:
    """The planned trials without a final record (ok, timed out, or skipped here): what a
    resume still runs."""
    final = {(r["config_id"], r["trial"], r.get("trace", "none")) for r in records
             if r.get("status") in ("ok", "timeout", "skipped")}
    return [p for p in specmod.plan(s) if p.key not in final]



@dataclass
class Learned:
    """What the trials run so far say of the rest: the planner's measured rates per setting
    (calibrate.fit), and the guessed cost model scaled by what it measured of it."""

    rates: dict[str, calibrate.Rate] = field(default_factory=dict)
    scale: float = 1.0  # measured wall / the cost model's guess, over the trials run
    trials: int = 0

    def trial_s(self, p: specmod.PlannedTrial) -> float:
        found = calibrate.estimate("vision", p.params, self.rates, p.trace)
        return found.seconds if found.how == "measured" else self.scale * found.seconds


def learn(out: Path, plan: dict[str, specmod.Spec | Harness]) -> Learned:
    rates: dict[str, calibrate.Rate] = {}
    guessed = measured = 0.0
    trials = 0
    for name, s in plan.items():
        if isinstance(s, Harness):  # no trials: its blocks last what it sizes them to
            continue
        by_config = {cid: settings for cid, _, settings in specmod.configs(s)}
        done = [(by_config[r["config_id"]], r) for r in records_of(out, name)
                if r.get("config_id") in by_config and r.get("status") == "ok"]
        rates |= calibrate.fit("vision", [(name, done)])
        for settings, record in done:
            guessed += cost.trial_seconds("vision", settings)
            measured += float(record.get("wall_s") or 0.0)
            trials += 1
    return Learned(rates, measured / guessed if guessed and measured else 1.0, trials)


def part_seconds(name: str, s: specmod.Spec | Harness, out: Path, learned: Learned) -> float:
    """What is left of a part, by what the run has learned (the model's guess before)."""
    if isinstance(s, Harness):
        return 0.0 if harness_done(out) else s.guess_s()
    return sum(learned.trial_s(p) for p in pending(s, records_of(out, name)))


def part_left(name: str, s: specmod.Spec | Harness, out: Path) -> str:
    if isinstance(s, Harness):
        if harness_done(out):
            return f"done ({name}/{HARNESS_FILE})"
        return (f"1 of 1 comparison left ({HARNESS_POINTS} points in one process, {s.blocks} "
                f"blocks of {s.block_s:g} s)")
    return f"{len(pending(s, records_of(out, name)))} of {len(specmod.plan(s))} trials left"


def print_plan(plan: dict[str, specmod.Spec | Harness], out: Path, learned: Learned,
               echo: Callable[[str], None]) -> float:
    total = 0.0
    for name, s in plan.items():
        seconds = part_seconds(name, s, out, learned)
        echo(f"{name}: {part_left(name, s, out)}, estimated {runner.format_duration(seconds)}")
        total += seconds
    verdict = "within" if total <= TARGET_S else "OVER"
    how = (f"learned from {learned.trials} trial(s) run" if learned.trials
           else "the cost model's guesses, multicard.plan.cost")
    echo(f"total: estimated {runner.format_duration(total)} ({verdict} the "
         f"{runner.format_duration(TARGET_S)} target; {how})")
    return total


# --- the comparison: benchmarks/harness_ab.py in its own process --------------------------------

def harness_done(out: Path) -> bool:
    return (out / "harness" / HARNESS_FILE).is_file()


def run_harness(h: Harness, out: Path, echo: Callable[[str], None]) -> None:
    """The comparison, with the GPUs' clock limits read before and after it (its
    gpu-state-end.json, as a run's). A failure is kept (failed.json, its log) and fails the
    check until a later call runs it."""
    part = out / "harness"
    part.mkdir(parents=True, exist_ok=True)
    before, _ = gpu_state.every_gpu()
    why = run_harness_ab(h, part / HARNESS_FILE)
    after, none_why = gpu_state.every_gpu()
    integrity.write_text_atomic(part / gpu_state.END_FILE, json.dumps(
        {"captured": datetime.now(UTC).isoformat(timespec="seconds"),
         "gpus": gpu_state.with_held_down(after, before), "why_none": none_why}, indent=1))
    if why is not None:
        integrity.write_text_atomic(part / "failed.json", json.dumps({"why": why}, indent=1))
        echo(f"harness: {why}")


def run_harness_ab(h: Harness, path: Path) -> str | None:
    """harness_ab.py writing `path`, in its own process (no CUDA context is left in this one),
    with a one-rank trial's environment (threads, OpenMP spin count, dropped TF32 overrides) and
    GPU; None, or why it failed (its output kept beside)."""
    env = launch.trial_env({**os.environ, **launch.cpu_trial_env(h.device, os.environ)}, 1,
                           launch.allocated_cpus())
    env |= launch.own_gpus(h.device, 1, os.environ.get("CUDA_VISIBLE_DEVICES"))
    logs = len(list(path.parent.glob(f"{path.stem}*.log")))  # a retry's log beside the first's
    log = path.parent / f"{path.stem}{f'-{logs}' if logs else ''}.log"
    try:  # a hung process must not take the whole slot
        done = subprocess.run(h.argv(path), env=env, capture_output=True, text=True,
                              timeout=HARNESS_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        integrity.write_text_atomic(log, _text(exc.stdout) + _text(exc.stderr))
        return f"timed out after {HARNESS_TIMEOUT_S} s; see {log.name}"
    integrity.write_text_atomic(log, done.stdout + done.stderr)
    if done.returncode == 0:
        return None
    return (f"failed (exit {done.returncode}); see {log.name}: "
            f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")


def _text(output: str | bytes | None) -> str:
    """What a timed-out process had written (bytes even with text=True, or None)."""
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def harness_failure(out: Path) -> dict[str, Any] | None:
    """Why the comparison failed, where it has not run since."""
    failed = out / "harness" / "failed.json"
    return json.loads(failed.read_text()) if failed.is_file() and not harness_done(out) else None


def harness_comparison(out: Path) -> dict[str, Any]:
    """What harness_ab.json says: every point's ratios and lines; the host-bound point's ratio
    (the one judged: the harness's host work weighs the most there) and DDP's host bookkeeping."""
    path = out / "harness" / HARNESS_FILE
    if not path.is_file():
        return {"harness_ab": None, "harness_lines": [], "harness / plain loop": None,
                "harness_point": None, "plain loop / bare loop": None, "shortest_block_s": None,
                "block_s": None}
    found = json.loads(path.read_text())
    points = {p["name"]: p for p in found["points"]}
    host = points.get("host-bound", {"results": {}})
    return {"harness_ab": {name: {"label": p["label"], **p["results"]} for name, p in points.items()},
            "harness_lines": found["lines"],
            "harness / plain loop": host["results"].get("main"), "harness_point": host.get("label"),
            "plain loop / bare loop": host["results"].get("bare"),
            "shortest_block_s": min((b["seconds"] for p in found["points"] for b in p["blocks"]),
                                    default=None),
            "block_s": found["block_s"]}


# --- the checks, on finished runs (pure: records and result.json in, numbers out) ---------------

def step_clock_agreement(result: dict[str, Any]) -> float:
    """|sum of rank 0's step times / the host clock over the same spans - 1|: the step clock
    (CUDA events on the device timeline) against the wall clock, each epoch from its first step
    to the synchronize after its last."""
    rank = result["ranks"][0]
    return abs(sum(rank["step_times_s"]) / sum(rank["step_span_host_s"]) - 1.0)


def tf32_as_set(precision: str, result: dict[str, Any]) -> bool:
    """The flags read back as set, no override variable reached the rank, and on a GPU the
    libraries' measured error says they computed in TF32 exactly when asked to."""
    flags = result["tf32_flags"]
    wanted = precision == "tf32"
    measured = flags.get("measured")
    really = measured is None or (measured["matmul_tf32"] == wanted and measured["conv_tf32"] == wanted)
    return (flags["cuda_matmul_allow_tf32"] == wanted and flags["cudnn_allow_tf32"] == wanted
            and all(v is None for v in flags.get("env", {}).values()) and really)


def final_records(records: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int]]:
    """(record, attempts) per planned trial: its ok attempt, else its latest. A trial a resume
    ran again stands for what it finally did; the attempts before stay counted."""
    final: dict[tuple[Any, ...], tuple[dict[str, Any], int]] = {}
    for record in records:
        key = (record["config_id"], record["trial"], record.get("trace", "none"))
        before, attempts = final.get(key, ({}, 0))
        final[key] = (before if before.get("status") == "ok" else record, attempts + 1)
    return list(final.values())


def trial_checks(run_dir: Path, part: str) -> list[dict[str, Any]]:
    rows = []
    for record, attempts in final_records(store.read(run_dir / store.TRIALS_FILE)):
        row = {"part": part, **record["config"], "trial": record["trial"],
               "trace": record.get("trace", "none"), "status": record["status"], "attempts": attempts}
        if record["status"] == "ok":
            result = json.loads((run_dir / f"raw/{trial_dir_name(record)}/result.json").read_text())
            precision = str(record["config"].get("precision", result.get("precision", "")))
            row["step_clock_vs_wall"] = step_clock_agreement(result)
            row["tf32_as_set"] = tf32_as_set(precision, result)
            row["train_time_s"] = record["metrics"].get("train_time_s")
            row["energy_per_sample_j"] = record["metrics"].get("energy_per_sample_j")
            row["energy_reason"] = record.get("unmeasured", {}).get("energy_per_sample_j")
            row["energy_read_by"] = (record.get("measured_how") or {}).get("energy_j")
            if record.get("trace_metrics"):
                row["trace_kernels"] = sum(int(s.get("kernel_count", 0))
                                           for s in record["trace_metrics"].values())
        rows.append(row)
    return rows


def trial_dir_name(record: dict[str, Any]) -> str:
    trace = record.get("trace", "none")
    return (f"{record['config_id']}-t{record['trial']}" + (f"-{trace}" if trace != "none" else "")
            + f"-a{record['attempt']}")


def tracing_cost(rows: list[dict[str, Any]]) -> float | None:
    """The nsys-traced fp32 trial's training time over the untraced one's (the same settings)."""
    traced = [r["train_time_s"] for r in rows if r["part"] == "nsys" and r.get("train_time_s")]
    plain = [r["train_time_s"] for r in rows if r["part"] == "precision" and r.get("precision") == "fp32"
             and r.get("train_time_s")]
    return statistics.fmean(traced) / statistics.fmean(plain) if traced and plain else None


def run_name(device: str, gpus: list[Any]) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    if device == "cpu" or not gpus:
        return f"cpu-device-check-{stamp}"
    model = re.sub(r"[^a-z0-9]+", "-", (gpus[0].name or "gpu").lower()).strip("-")
    return f"{len(gpus)}x{model}-device-check-{stamp}"


def summarize_checks(rows: list[dict[str, Any]], compared: dict[str, Any], device: str) -> dict[str, Any]:
    agreement = [r["step_clock_vs_wall"] for r in rows if "step_clock_vs_wall" in r]
    tf32 = [r["tf32_as_set"] for r in rows if r.get("tf32_as_set") is not None]
    return {
        "trials": len(rows), "ok": sum(r["status"] == "ok" for r in rows),
        "not_ok": [r for r in rows if r["status"] not in ("ok", "skipped")],
        "step_clock_vs_wall_max": max(agreement) if agreement else None,
        # None: no trial ran (the comparison's own blocks carry their step clock in harness_ab.json)
        "step_clock_within_tolerance": max(agreement) <= STEP_CLOCK_TOLERANCE if agreement else None,
        "tf32_flags_as_set": all(tf32) if tf32 else None,  # None: no trial ran
        **compared,
        # on CPU the check checks the path: tiny sizes, on cores that other work shares
        "harness_costs_too_much": harness_costs_too_much(compared.get("harness / plain loop"))
        if device == "cuda" else None,
        "nsys_traced_over_untraced": tracing_cost(rows),
        "energy_per_sample_j": energy_by_precision(rows),
        "energy_read_by": sorted({r["energy_read_by"] for r in rows
                                  if r["part"] == "precision" and r.get("energy_read_by")}),
    }


def harness_costs_too_much(ratio: dict[str, Any] | None) -> bool | None:
    """Whether the harness is slower than the plain loop by more than PLAIN_LOOP_TOLERANCE: its
    interval (of the pairs' images/s) wholly below 1 - tolerance, a one-sided test at 2.5 %, so
    noise reads as no evidence, not as a failure; the point alone without an interval (null, or
    NaN in an older summary). None before the comparison ran."""
    if ratio is None or ratio.get("ratio") is None:
        return None
    hi = ratio.get("ci_hi")
    upper = ratio["ratio"] if hi is None or math.isnan(hi) else hi
    return upper < 1 - PLAIN_LOOP_TOLERANCE


def energy_by_precision(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """GPU energy per image of each precision's ok trials in the precision part (one setting
    apart from the precision: the other parts differ in more): mean and 95 % interval from
    MIN_ENERGY_TRIALS trials on, else why not (summarize.energy_gate, or the trials' reason)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row["part"] == "precision" and row["status"] == "ok":
            found.setdefault(row["precision"], []).append(row)
    # in the precisions' own order (fp64 first), not the shuffled order the trials ran in
    ordered = sorted(found, key=list(PRECISIONS).index)
    gated = summarize.energy_by_group({name: [r["energy_per_sample_j"] for r in found[name]]
                                       for name in ordered})
    return {name: {"n": s.n, "mean": s.mean, "ci_lo": s.ci_lo, "ci_hi": s.ci_hi} if s
            else f"not measured: {found[name][0]['energy_reason']}"
            if why == summarize.energy_gate(0) else why
            for name, (s, why) in gated.items()}


def energy_text(by_precision: dict[str, Any]) -> str:
    """A summary's energies in mJ; a float is a summary written before the n >= 3 gate."""
    def text(value: Any) -> str:
        if isinstance(value, dict):
            return (f"{value['mean'] * 1e3:.4g} mJ [{value['ci_lo'] * 1e3:.4g}, "
                    f"{value['ci_hi'] * 1e3:.4g}] (n = {value['n']})")
        return f"{value * 1e3:.4g} mJ" if isinstance(value, float) else str(value)
    return "; ".join(f"{name} {text(value)}" for name, value in by_precision.items()) \
        or "no precision trial ran"


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """What the check found, one line each (printed, and appended to REPORT.md)."""
    failed = summary.get("harness_failed")
    cost_verdict = _cost_verdict(summary["harness_costs_too_much"]) \
        if summary.get("harness / plain loop") else "n/a (the comparison has not run)"
    return [
        *(summary.get("harness_lines") or ["harness / plain loop: n/a (the harness part has not run)"]),
        f"harness costs more than {PLAIN_LOOP_TOLERANCE:.0%} of the plain loop's images/s at "
        f"{summary.get('harness_point') or 'the host-bound point'}: "
        f"{cost_verdict}",
        f"shortest harness / plain-loop block: {_num(summary.get('shortest_block_s'))} s "
        f"(sized for {_num(summary.get('block_s'))} s)",
        f"step clock vs wall clock: largest deviation {_pct(summary['step_clock_vs_wall_max'])} "
        f"(tolerance {STEP_CLOCK_TOLERANCE:.0%}); TF32 as set: {summary['tf32_flags_as_set']}",
        f"nsys traced / untraced training time (fp32): {_num(summary['nsys_traced_over_untraced'])}",
        f"GPU energy per image by precision (the precision part; read by "
        f"{', '.join(summary['energy_read_by']) or 'nothing'}): "
        f"{energy_text(summary['energy_per_sample_j'])}"
        + ("; read two ways, so not comparable with each other"
           if len(summary["energy_read_by"]) > 1 else ""),
        f"harness comparison failed: {failed['why'] if failed else 'no'}",
        f"seconds a limit held the GPU clocks down during the parts (NVML's violation counters): "
        f"{held_down_text(summary['clocks_held_down_s'])}",
    ]


def write_checks(out: Path, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    import pandas as pd
    from tabulate import tabulate

    integrity.write_text_atomic(out / "device_check.json",
                                json.dumps({"summary": summary, "trials": rows}, indent=1))
    (out / "tables").mkdir(exist_ok=True)
    frame = pd.DataFrame(rows)
    integrity.write_text_atomic(out / "tables" / "device_check.csv", frame.to_csv(index=False))
    table = tabulate(frame, headers="keys", tablefmt="github", showindex=False, floatfmt=".4g")
    integrity.write_text_atomic(out / "tables" / "device_check.md", table + "\n")


def clocks_held_down(run_dirs: list[Path]) -> dict[str, float | None] | None:
    """Seconds each limit held a GPU's clocks down, summed over the parts' runs and GPUs (each
    run's gpu-state-end.json, from its start to its end); a limit is None where one part could
    not read it (a sum without that part would read low); None where no GPU's was read."""
    found: dict[str, float | None] = {}
    for run_dir in run_dirs:
        end = run_dir / gpu_state.END_FILE
        for gpu in json.loads(end.read_text()).get("gpus", []) if end.is_file() else []:
            for name, seconds in (gpu.get("held_down_s") or {}).items():
                total = found.get(name, 0.0)
                found[name] = None if seconds is None or total is None else total + seconds
    return found if any(v is not None for v in found.values()) else None


def held_down_text(seconds: dict[str, float | None] | None) -> str:
    return "not read (no GPU, or NVML without the counters)" if seconds is None else \
        ", ".join(f"{name} {'n/a' if value is None else f'{value:.3g} s'}" for name, value in seconds.items())


def _cost_verdict(value: bool | None) -> str:
    # False is no evidence of a cost, not evidence of none: a wide interval reaching above the
    # tolerance cannot fail the check
    if value is None:
        return "not judged on CPU"
    return "True (the interval lies wholly below)" if value else "not shown (the interval reaches above)"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f} %"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


NEEDED = ("torch", "torchvision", "pandas", "tabulate", "matplotlib", "scipy", "filelock",
          "pynvml", "tomli_w")


def missing_modules() -> list[str]:
    import importlib.util

    return [name for name in NEEDED if importlib.util.find_spec(name) is None]


def checkpoint(out: Path, plan: dict[str, specmod.Spec | Harness], device: str,
               skipped: dict[str, str], final: bool) -> dict[str, Any]:
    """The checks of every part run so far and SHA256SUMS, so a run cut short stays verifiable;
    `final`: REPORT.md with its figures too (once, at the end: they are the slow part)."""
    runs = [name for name, s in plan.items()
            if not isinstance(s, Harness) and (out / name / store.TRIALS_FILE).is_file()]
    ran = [name for name, s in plan.items()
           if name in runs or (isinstance(s, Harness) and harness_done(out))]
    rows = [row for name in runs for row in trial_checks(out / name, name)]
    summary = {**summarize_checks(rows, harness_comparison(out), device), "parts_run": ran,
               "parts_left": skipped, "harness_failed": harness_failure(out),
               "clocks_held_down_s": clocks_held_down([out / name for name in ran])}
    write_checks(out, rows, summary)
    if final and runs:
        document.write_report([out / name for name in runs], out, claim_list=None)
        with (out / "REPORT.md").open("a", encoding="utf-8") as f:
            f.write("\n".join(["", "## Device check", "", *(f"- {line}" for line in summary_lines(summary)),
                               "", "Per trial: `tables/device_check.md`; all numbers: `device_check.json`; "
                               f"every block of the comparison: `harness/{HARNESS_FILE}`.", ""]))
    integrity.write_checksums(out)
    return summary


def main(argv: list[str] | None = None, clock: Callable[[], float] = time.monotonic) -> int:
    """The check; bad input and stop requests end it with one line, as `multicard` does.
    `clock` (seconds) is what the budget is spent against."""
    try:
        with stop_on_signals():
            return check(argv, clock)
    except InputError as exc:
        print(f"device_check: error: {exc}", file=sys.stderr)
        return 2
    except Interrupted as stop:
        print(f"device_check: stopped by {stop}; the parts that finished are kept: run it again "
              "with the same --out to continue", file=sys.stderr)
        return stop.exit_status


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and its estimate")
    parser.add_argument("--out", type=Path, help="run directory (default under artifact/runs/); an "
                        "existing one is continued where it stopped")
    parser.add_argument("--trials", type=int, choices=range(1, 11), metavar="N",
                        help="trials per config in precision and pin_memory (default 1; nsys and "
                             "nccl run 1; the harness part's pairs are HARNESS_RUN's)")
    parser.add_argument("--parts", metavar="NAME,...",
                        help="run only these parts (harness, precision, pin_memory, nsys, nccl); "
                             "default: every part this machine can run")
    parser.add_argument("--budget-s", type=float, default=TARGET_S,
                        help="a part that would end past this many seconds of this call is left for "
                             f"the next and named (default {TARGET_S})")
    return parser.parse_args(argv)


def check(argv: list[str] | None, clock: Callable[[], float] = time.monotonic) -> int:
    args = parse_args(argv)
    if missing := missing_modules():
        print(f"device_check: missing Python modules: {', '.join(missing)} (pure-Python wheels can "
              "be carried and installed with pip --no-index)", file=sys.stderr)
        return 2
    gpus = telemetry.visible_gpus() if args.device == "cuda" else []
    if args.device == "cuda" and not gpus and not args.dry_run:
        print("device_check: no GPU is visible here (--device cpu runs the check on CPU)",
              file=sys.stderr)
        return 2
    out = args.out or ROOT / "artifact" / "runs" / run_name(args.device, gpus)
    if args.dry_run and args.device == "cuda":  # the GPUs seen here (one where none is), nsys present
        plan = specs(chosen(parts(args.device, max(1, len(gpus)), True, args.trials), args.parts), out)
        print_plan(plan, out, learn(out, plan), print)
        print("--dry-run: nothing started (nsys runs only where it is on PATH, nccl only where two "
              "GPUs are visible)")
        return 0
    with_nsys = args.device == "cuda" and nsys.find_nsys() is not None
    plan = specs(chosen(parts(args.device, len(gpus), with_nsys, args.trials), args.parts), out)
    print_plan(plan, out, learn(out, plan), print)
    if args.dry_run:
        print("--dry-run: nothing started")
        return 0
    started = clock()
    record_environment(out, gpus)
    skipped = run_parts(plan, out, args, lambda: args.budget_s - (clock() - started))
    summary = checkpoint(out, plan, args.device, skipped, final=not skipped)
    for line in summary_lines(summary):
        print(line)
    return finish_status(summary, skipped, out, clock() - started)


def run_parts(plan: dict[str, specmod.Spec | Harness], out: Path, args: argparse.Namespace,
              left_s: Callable[[], float]) -> dict[str, str]:
    """Every part in turn that fits what is left of the budget; the parts left, and why."""
    skipped: dict[str, str] = {}
    for name, s in plan.items():
        need, left = part_seconds(name, s, out, learn(out, plan)), left_s()
        if need > left:
            skipped[name] = (f"needs about {runner.format_duration(need)}, "
                             f"{runner.format_duration(max(0.0, left))} of the budget left")
            print(f"{name}: left for the next call ({skipped[name]})")
            continue
        if isinstance(s, Harness):
            if not harness_done(out):
                run_harness(s, out, print)
        else:
            runner.run(s, out / name, data_dir=ROOT / "data", echo=print)
        with GATE.hold():  # after every part, whole: a cut-short run is verifiable
            checkpoint(out, plan, args.device, skipped, final=False)
        GATE.check()
    return skipped


def record_environment(out: Path, gpus: list[Any]) -> None:
    """env.json on the first call; a later one records its own beside it, on the same GPU model
    only (a run continued on another machine would mix two machines' numbers)."""
    out.mkdir(parents=True, exist_ok=True)
    env = environment.capture_env(ROOT / "data")
    first = out / "env.json"
    if not first.exists():
        integrity.write_text_atomic(first, json.dumps(env, indent=1))
        return
    model = {g.name for g in gpus} or {"cpu"}
    started_on = {g.get("name") for g in json.loads(first.read_text()).get("gpus") or []} or {"cpu"}
    if model != started_on:
        raise InputError(f"{out}: started on {', '.join(sorted(started_on))}; this machine has "
                         f"{', '.join(sorted(model))}: continue it there, or use another --out")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    integrity.write_text_atomic(out / f"env-resume-{stamp}.json", json.dumps(env, indent=1))


def finish_status(summary: dict[str, Any], skipped: dict[str, str], out: Path, seconds: float) -> int:
    """0 every part ran and held, 1 a check or a trial failed, 3 nothing failed but parts are left."""
    failed = summary["not_ok"] or summary.get("harness_failed") \
        or summary["step_clock_within_tolerance"] is False \
        or summary["tf32_flags_as_set"] is False or summary["harness_costs_too_much"] is True
    print(f"device check: {summary['ok']}/{summary['trials']} trials ok, parts left for the next "
          f"call: {', '.join(skipped) or 'none'}, in {runner.format_duration(seconds)}; {out}")
    if failed:
        return 1
    if skipped:
        print(f"device check: nothing failed; run it again with --out {out} to run the parts left")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
