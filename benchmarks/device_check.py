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
directory per part below, `plain_loop/`, `env.json`, `device_check.json`, `tables/`, SHA256SUMS
after every part, and REPORT.md with figures once every part has run.

Parts, 1 GPU, Scenario A at 100 px, in the order they run:
- harness: the harness against a plain loop, like for like: 3 rounds, each one plain-loop process
  (benchmarks/plain_loop.py: the same step, warm-up and steps, in a one-rank DDP and bare) and a
  harness trial (fp16, nhwc, the synthetic loader's resident batch), which goes first alternating
  round by round; the first round's plain loop goes first and sets the steps: a probe of its bare
  loop, so every timed window is at least WINDOW_S, and timm's model once where timm imports;
- precision: fp64 / fp32 / tf32 / fp16 / bf16, 1 trial each (2 epochs of 50 steps, the DataLoader),
  TF32 flags read back and TF32 measured (an fp32 matmul and convolution against float64);
- pin_memory: off / on at fp16, 1 trial each;
- nsys: the precision part's fp32 trial once more, traced, captured and parsed, where `nsys` is on
  PATH: what tracing costs (traced / untraced time);
- nccl: one 2-rank trial, where two GPUs are visible (the dry run plans for one GPU, nsys on PATH).
A part that would end past `--budget-s` (8 minutes) is left for the next call and named, not
failed; its estimate learns from the trials already run (the planner's calibration: measured
rates per setting, and the guessed cost model scaled by what the run has measured of it).
The checks: CUDA-event step times against the host's clock over the same spans (within 5 %),
every precision's TF32 as set, the harness not slower than the plain loop by more than
PLAIN_LOOP_TOLERANCE (its interval wholly below), every timed window of the comparison at least
WINDOW_S.
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
from multicard.judge import stats  # noqa: E402
from multicard.measure import environment, gpu_state, telemetry  # noqa: E402
from multicard.plan import calibrate, cost, launch, params  # noqa: E402
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
# Each timed window of the comparison lasts at least this long: a GPU's clocks settle, and
# NVML's energy counter resolves it (energy.MIN_COUNTER_WINDOW_S). A CPU run checks the path only.
WINDOW_S = {"cuda": 10.0, "cpu": 2.0}
# the bare loop's steps fill WINDOW_S with this to spare: its probe is short, a GPU's clocks move
# between the probe and the loop, and on CPU the cores' other load comes and goes (a probe taken
# under load, then loops without it, have run 1.7 s windows for 2 s with 15 % to spare)
WINDOW_MARGIN = {"cuda": 1.15, "cpu": 1.5}
PROBE_STEPS = 20  # timed steps of the plain loop's probe, after the warm-up
ROUNDS = 3  # harness trials and plain-loop processes of the comparison, interleaved
# a plain-loop process's start (imports, CUDA, a one-rank group, the models): guessed
PLAIN_LOOP_START_S = {"cuda": 15.0, "cpu": 5.0}
PLAIN_LOOP = ROOT / "benchmarks" / "plain_loop.py"
SIZES: dict[str, dict[str, Any]] = {
    "cuda": {"device": "cuda", "image_size": 100, "epochs": 2, "max_steps": 50, "batch_size": 64,
             "num_workers": 4, "test_subset": 2000, "cast": "host"},
    "cpu": {"device": "cpu", "image_size": 32, "epochs": 2, "max_steps": 4, "batch_size": 16,
            "num_workers": 1, "warmup_steps": 1, "train_subset": 1024, "test_subset": 64,
            "cast": "host"},
}
# The harness comparison runs in fp16 on GPUs; CPUs have no fast fp16, so bf16 there.
COMPARED_PRECISION = {"cuda": "fp16", "cpu": "bf16"}


def window_steps(device: str) -> tuple[int, int]:
    """(epochs, max_steps) of the comparison by the cost model: their steps take WINDOW_MARGIN x
    WINDOW_S, each epoch within the training set's full batches (as the first plain loop sets
    them on the machine)."""
    settings = params.resolve("vision", {**SIZES[device], "precision": COMPARED_PRECISION[device],
                                         "layout": "nhwc", "loader": "synthetic"})
    total = math.ceil(WINDOW_MARGIN[device] * WINDOW_S[device] / cost.vision_step_seconds(settings))
    per_epoch = cost.full_batches(int(settings["train_subset"]), int(settings["batch_size"]), 1)
    return cost.steps_over_epochs(total, int(settings["epochs"]), per_epoch)


def parts(device: str, gpus: int, with_nsys: bool, trials: int | None = None) -> dict[str, dict[str, Any]]:
    """name -> experiment document (the spec format of experiments/*.toml); `trials` overrides
    every part's trial count (the comparison's rounds: ROUNDS; one per config elsewhere)."""
    fast = COMPARED_PRECISION[device]
    epochs, steps = window_steps(device)
    found = {  # in the order they run: the comparison first, the reason this check exists
        "harness": ({"layout": "nhwc", "loader": "synthetic", "epochs": epochs, "max_steps": steps},
                    {"precision": [fast]}, {}, {"count": trials or ROUNDS}),
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
    return {name: _document(name, device, *part) for name, part in found.items()}


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


def chosen(documents: dict[str, dict[str, Any]], names: str | None) -> dict[str, dict[str, Any]]:
    """The parts `--parts` names (all where it names none); InputError for a part there is not."""
    if names is None:
        return documents
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in documents]
    if unknown or not wanted:
        raise InputError(f"--parts: expected some of {', '.join(documents)} (the parts this machine "
                         f"can run), got {names!r}")
    return {name: doc for name, doc in documents.items() if name in wanted}


def specs(documents: dict[str, dict[str, Any]], where: Path) -> dict[str, specmod.Spec]:
    return {name: specmod.from_document(doc, where / f"device_check_{name}.toml")
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


def plain_rounds_left(out: Path, rounds: int) -> list[int]:
    return [t for t in range(rounds) if not (out / "plain_loop" / f"round-{t}.json").is_file()]


def round_loops(t: int) -> tuple[str, ...]:
    """Round t's plain loops: DDP and bare, their order alternating, and timm's model in the
    first round where timm imports (a second opinion: once is enough)."""
    import importlib.util

    order = ("ddp", "bare") if t % 2 == 0 else ("bare", "ddp")
    return (*order, "timm") if t == 0 and importlib.util.find_spec("timm") is not None else order


@dataclass
class Learned:
    """What the trials run so far say of the rest: the planner's measured rates per setting
    (calibrate.fit), the guessed cost model scaled by what it measured of it, and a later
    round's plain-loop process."""

    rates: dict[str, calibrate.Rate] = field(default_factory=dict)
    scale: float = 1.0  # measured wall / the cost model's guess, over the trials run
    plain_later_s: float | None = None
    trials: int = 0

    def trial_s(self, p: specmod.PlannedTrial) -> float:
        found = calibrate.estimate("vision", p.params, self.rates, p.trace)
        return found.seconds if found.how == "measured" else self.scale * found.seconds


def plain_later_s(rounds: dict[int, dict[str, Any]]) -> float | None:
    """A later round's plain-loop process: the mean of those run, else the first round's less
    its probe and timm loop (None before any ran)."""
    later = [r["process_wall_s"] for t, r in rounds.items() if t > 0]
    if later:
        return statistics.fmean(later)
    if (first := rounds.get(0)) is None:
        return None
    timm = (first["loops"].get("timm") or {}).get("loop_s") or 0.0
    return first["process_wall_s"] - (first.get("probe_s") or 0.0) - timm


def plain_rounds(out: Path) -> dict[int, dict[str, Any]]:
    """round -> what its plain-loop process wrote, for the rounds that ran."""
    found = sorted((out / "plain_loop").glob("round-*.json")) if (out / "plain_loop").is_dir() else []
    return {int(path.stem.removeprefix("round-")): json.loads(path.read_text()) for path in found}


def learn(out: Path, plan: dict[str, specmod.Spec]) -> Learned:
    rates: dict[str, calibrate.Rate] = {}
    guessed = measured = 0.0
    trials = 0
    for name, s in plan.items():
        by_config = {cid: settings for cid, _, settings in specmod.configs(s)}
        done = [(by_config[r["config_id"]], r) for r in records_of(out, name)
                if r.get("config_id") in by_config and r.get("status") == "ok"]
        rates |= calibrate.fit("vision", [(name, done)])
        for settings, record in done:
            guessed += cost.trial_seconds("vision", settings)
            measured += float(record.get("wall_s") or 0.0)
            trials += 1
    return Learned(rates, measured / guessed if guessed and measured else 1.0,
                   plain_later_s(plain_rounds(out)), trials)


def plain_loop_guess_s(s: specmod.Spec, device: str, t: int) -> float:
    """Round t's plain-loop process by the cost model: its start, the first round's probe, and
    each loop's warm-up and steps."""
    settings = specmod.plan(s)[0].params
    warmup = int(settings["warmup_steps"])
    loop = warmup + int(settings["epochs"]) * int(settings["max_steps"])
    probe = warmup + PROBE_STEPS if t == 0 else 0
    steps = probe + len(round_loops(t)) * loop
    return PLAIN_LOOP_START_S[device] + steps * cost.vision_step_seconds(settings)


def part_seconds(name: str, s: specmod.Spec, out: Path, learned: Learned, device: str) -> float:
    """What is left of a part, by what the run has learned (the model's guess before)."""
    seconds = sum(learned.trial_s(p) for p in pending(s, records_of(out, name)))
    if name == "harness":
        seconds += sum(learned.plain_later_s if t > 0 and learned.plain_later_s is not None
                       else learned.scale * plain_loop_guess_s(s, device, t)
                       for t in plain_rounds_left(out, s.trials))
    return seconds


def print_plan(plan: dict[str, specmod.Spec], out: Path, learned: Learned, device: str,
               echo: Callable[[str], None]) -> float:
    total = 0.0
    for name, s in plan.items():
        seconds = part_seconds(name, s, out, learned, device)
        left = len(pending(s, records_of(out, name)))
        rounds = len(plain_rounds_left(out, s.trials))
        extra = f" + {rounds} plain-loop process(es)" if name == "harness" else ""
        echo(f"{name}: {left} of {len(specmod.plan(s))} trials left{extra}, estimated "
             f"{runner.format_duration(seconds)}")
        total += seconds
    verdict = "within" if total <= TARGET_S else "OVER"
    how = (f"learned from {learned.trials} trial(s) run" if learned.trials
           else "the cost model's guesses, multicard.plan.cost")
    echo(f"total: estimated {runner.format_duration(total)} ({verdict} the "
         f"{runner.format_duration(TARGET_S)} target; {how})")
    return total


# --- the comparison: harness trials and plain-loop processes, interleaved -----------------------

def run_comparison(s: specmod.Spec, out: Path, device: str, echo: Callable[[str], None]) -> None:
    """Round by round, a plain-loop process and the harness's next trial (a resume of the part),
    which goes first alternating (a drift in the GPU's clocks then weighs on both alike), each
    skipped where a call before ran it. The first round's plain loop goes first: it sets the
    steps that fill WINDOW_S on this machine (the cost model only guesses them), and every
    harness trial and later loop takes them."""
    name = "harness"
    for t in range(s.trials):
        for turn in ("plain", "harness") if t % 2 == 0 else ("harness", "plain"):
            measured = comparison_spec(s, out)
            if turn == "plain" and t in plain_rounds_left(out, s.trials):
                run_plain_round(measured, out, t, device, echo)
            elif turn == "harness" and any(p.trial == t for p in pending(measured, records_of(out, name))):
                runner.run(measured, out / name, trials=t + 1, data_dir=ROOT / "data", echo=echo)
        GATE.check()


def run_plain_round(s: specmod.Spec, out: Path, t: int, device: str, echo: Callable[[str], None]) -> None:
    """Round t's plain-loop process. The first sets the steps, unless a harness trial ran before
    it (a resume: the trials keep theirs). A failure is kept (failed-<t>.json, its log) and
    fails the check; the rounds after it still run, and a later call runs it again."""
    window = WINDOW_MARGIN[device] * WINDOW_S[device] if t == 0 and not records_of(out, "harness") else None
    why = run_plain_loop(s, out / "plain_loop" / f"round-{t}.json", round_loops(t), window)
    if why is not None:
        integrity.write_text_atomic(out / "plain_loop" / f"failed-{t}.json",
                                    json.dumps({"round": t, "why": why}, indent=1))
        echo(f"plain loop, round {t}: {why}")


def plain_loop_failures(out: Path, rounds: int) -> list[dict[str, Any]]:
    """The rounds whose plain loop failed and has not run since."""
    left = plain_rounds_left(out, rounds)
    return [json.loads(path.read_text()) for t in left
            if (path := out / "plain_loop" / f"failed-{t}.json").is_file()]


def as_run(plan: dict[str, specmod.Spec], out: Path) -> dict[str, specmod.Spec]:
    """The plan with the harness part's steps as its first plain loop picked them (where it ran):
    its records are of that spec."""
    return {name: comparison_spec(s, out) if name == "harness" else s for name, s in plan.items()}


def comparison_spec(s: specmod.Spec, out: Path) -> specmod.Spec:
    """The harness part with the epochs and steps the first plain loop picked (as planned
    before it ran)."""
    first = out / "plain_loop" / "round-0.json"
    if not first.is_file():
        return s
    picked = json.loads(first.read_text())
    fixed = {**s.fixed, "epochs": int(picked["epochs"]), "max_steps": int(picked["max_steps"])}
    return specmod.from_document(specmod.to_document(s) | {"fixed": fixed}, s.path)


def run_plain_loop(s: specmod.Spec, path: Path, loops: tuple[str, ...], window_s: float | None) -> str | None:
    """One plain-loop process writing `path`; None, or why it failed (its output kept beside)."""
    settings = specmod.plan(s)[0].params
    argv = [sys.executable, str(PLAIN_LOOP), "--out", str(path), "--order", ",".join(loops),
            "--probe-steps", str(PROBE_STEPS),
            *(["--window-s", str(window_s)] if window_s is not None else []), "--",
            *params.to_flags({k: v for k, v in settings.items() if k in params.VISION}),
            "--data-dir", str(ROOT / "data")]
    device = str(settings["device"])
    # the environment of a one-rank harness trial: the same threads, spin count, dropped TF32
    # overrides and GPU
    env = launch.trial_env({**os.environ, **launch.cpu_trial_env(device, os.environ)}, 1,
                           launch.allocated_cpus())
    env |= launch.own_gpus(device, 1, os.environ.get("CUDA_VISIBLE_DEVICES"))
    path.parent.mkdir(parents=True, exist_ok=True)
    logs = len(list(path.parent.glob(f"{path.stem}*.log")))  # a retry's log beside the first's
    log = path.parent / f"{path.stem}{f'-{logs}' if logs else ''}.log"
    try:  # a hung loop (an NCCL or CUDA init that never returns) must not take the whole slot
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=s.timeout_s)
    except subprocess.TimeoutExpired as exc:
        integrity.write_text_atomic(log, _text(exc.stdout) + _text(exc.stderr))
        return f"timed out after {s.timeout_s:g} s (the spec's trial timeout); see {log.name}"
    integrity.write_text_atomic(log, done.stdout + done.stderr)
    if done.returncode == 0:
        return None
    return (f"failed (exit {done.returncode}); see {log.name}: "
            f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")


def _text(output: str | bytes | None) -> str:
    """What a timed-out process had written (bytes even with text=True, or None)."""
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def plain_loop_results(out: Path) -> dict[str, list[float]]:
    """images/s of each loop over the rounds run, and the DDP and bare loops' windows (timm's
    model is a second opinion, not the comparison)."""
    found: dict[str, list[float]] = {}
    for _, written in sorted(plain_rounds(out).items()):
        for name, loop in written["loops"].items():
            if loop.get("images_s"):
                found.setdefault(f"{name}_images_s", []).append(float(loop["images_s"]))
                if name != "timm":
                    found.setdefault("windows_s", []).append(float(loop["window_s"]))
    return found


def comparison(out: Path, device: str) -> dict[str, Any]:
    """The harness against the plain loops: ratios of their mean images/s, with Welch's interval
    on log values where each has two rounds or more, and the shortest timed window."""
    harness = [r["metrics"]["throughput_samples_s"] for r in records_of(out, "harness")
               if r["status"] == "ok" and r["metrics"].get("throughput_samples_s")]
    windows = [r["metrics"]["train_time_s"] for r in records_of(out, "harness") if r["status"] == "ok"]
    loops = plain_loop_results(out)
    found: dict[str, Any] = {"rounds": len(harness), "multicard_images_s": _mean(harness),
                             **{k: _mean(v) for k, v in loops.items() if k != "windows_s"}}
    # like for like: the harness against the one-rank DDP loop, that loop against the same loop
    # without DDP, and (both without DDP) torchvision's MobileNetV2 against timm's
    measured = {"multicard": harness, **loops}
    for name, top, over in (("multicard / plain loop", "multicard", "ddp_images_s"),
                            ("plain loop / bare loop", "ddp_images_s", "bare_images_s"),
                            ("bare loop / timm", "bare_images_s", "timm_images_s")):
        found[name] = _ratio(measured.get(top, []), measured.get(over, []))
    shortest = min([*windows, *loops.get("windows_s", [])], default=None)
    found["shortest_window_s"] = shortest
    # judged on GPUs only: on CPU the cores' other load moves the loops' speed between the probe
    # and the windows (a CI machine ran 1.85 s windows planned at 3 s), and the CPU check checks
    # the path, not the clocks' settling or NVML's counter
    found["windows_long_enough"] = None if shortest is None or device != "cuda" \
        else shortest >= WINDOW_S[device]
    return found


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _ratio(top: list[float], bottom: list[float]) -> dict[str, Any] | None:
    """mean(top) / mean(bottom) as a ratio of geometric means with its 95 % interval."""
    if not top or not bottom:
        return None
    r = stats.ratio_of_means(top, bottom, cross_check=False)
    return {"ratio": r.value, "ci_lo": r.ci_lo, "ci_hi": r.ci_hi, "n": [len(top), len(bottom)]}


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
    ratio = compared.get("multicard / plain loop")
    return {
        "trials": len(rows), "ok": sum(r["status"] == "ok" for r in rows),
        "not_ok": [r for r in rows if r["status"] not in ("ok", "skipped")],
        "step_clock_vs_wall_max": max(agreement) if agreement else None,
        "step_clock_within_tolerance": bool(agreement) and max(agreement) <= STEP_CLOCK_TOLERANCE,
        "tf32_flags_as_set": all(tf32) if tf32 else None,  # None: no trial ran
        **compared,
        # on CPU the harness's own processes (torchrun's agent, the runner) share the cores with
        # the step, so a busy machine slows it apart from the loop: shown, judged on GPUs only
        "harness_costs_too_much": harness_costs_too_much(ratio) if device == "cuda" else None,
        "nsys_traced_over_untraced": tracing_cost(rows),
        "energy_per_sample_j": energy_by_precision(rows),
        "energy_read_by": sorted({r["energy_read_by"] for r in rows
                                  if r["part"] == "precision" and r.get("energy_read_by")}),
    }


def harness_costs_too_much(ratio: dict[str, Any] | None) -> bool | None:
    """Whether the harness is slower than the plain loop by more than PLAIN_LOOP_TOLERANCE: its
    interval (of the rounds' images/s) wholly below 1 - tolerance, a one-sided test at 2.5 %, so
    a busy machine's noise reads as no evidence, not as a failure; the point alone with one
    round. None before the comparison ran."""
    if ratio is None:
        return None
    upper = ratio["ratio"] if math.isnan(ratio["ci_hi"]) else ratio["ci_hi"]
    return upper < 1 - PLAIN_LOOP_TOLERANCE


def energy_by_precision(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean GPU energy per image of each precision's ok trials in the precision part (one
    setting apart from the precision: the other parts differ in more), or why there is none."""
    found: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row["part"] != "precision" or row["status"] != "ok":
            continue
        found.setdefault(row["precision"], []).append(row)
    # in the precisions' own order (fp64 first), not the shuffled order the trials ran in
    ordered = sorted(found.items(), key=lambda item: list(PRECISIONS).index(item[0]))
    return {name: statistics.fmean(values) if (values := [r["energy_per_sample_j"] for r in trials
                                                          if r["energy_per_sample_j"] is not None])
            else f"not measured: {trials[0]['energy_reason']}" for name, trials in ordered}


def energy_text(by_precision: dict[str, Any]) -> str:
    return "; ".join(f"{name} {value * 1e3:.4g} mJ" if isinstance(value, float) else f"{name} {value}"
                     for name, value in by_precision.items()) or "no precision trial ran"


def ratio_text(found: dict[str, Any] | None) -> str:
    if found is None:
        return "n/a"
    ci = "" if math.isnan(found["ci_lo"]) else f" [{found['ci_lo']:.3g}, {found['ci_hi']:.3g}]"
    return f"{found['ratio']:.3g}{ci} (n {found['n'][0]}/{found['n'][1]})"


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """What the check found, one line each (printed, and appended to REPORT.md)."""
    return [
        f"multicard / plain loop: {ratio_text(summary['multicard / plain loop'])} "
        f"({_num(summary['multicard_images_s'])} vs {_num(summary.get('ddp_images_s'))} images/s; "
        f"costs more than {PLAIN_LOOP_TOLERANCE:.0%}: "
        f"{_cost_verdict(summary['harness_costs_too_much'])})",
        f"plain loop / bare loop (DDP's own cost): {ratio_text(summary['plain loop / bare loop'])}",
        f"bare loop / timm (torchvision's model against timm's, both without DDP): "
        f"{ratio_text(summary['bare loop / timm'])}",
        f"shortest timed window: {_num(summary['shortest_window_s'])} s (long enough: "
        f"{_window_verdict(summary['windows_long_enough'], summary['shortest_window_s'])})",
        f"step clock vs wall clock: largest deviation {_pct(summary['step_clock_vs_wall_max'])} "
        f"(tolerance {STEP_CLOCK_TOLERANCE:.0%}); TF32 as set: {summary['tf32_flags_as_set']}",
        f"nsys traced / untraced training time (fp32): {_num(summary['nsys_traced_over_untraced'])}",
        f"GPU energy per image by precision (the precision part; read by "
        f"{', '.join(summary['energy_read_by']) or 'nothing'}): "
        f"{energy_text(summary['energy_per_sample_j'])}"
        + ("; read two ways, so not comparable with each other"
           if len(summary["energy_read_by"]) > 1 else ""),
        "plain-loop rounds failed: "
        f"{', '.join(str(f['round']) for f in summary['plain_loop_failed']) or 'none'}",
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


def _window_verdict(value: bool | None, shortest: float | None) -> str:
    if shortest is None:
        return "n/a"
    return "not judged on CPU" if value is None else str(value)


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


def checkpoint(out: Path, plan: dict[str, specmod.Spec], device: str, skipped: dict[str, str],
               final: bool) -> dict[str, Any]:
    """The checks of every part run so far and SHA256SUMS, so a run cut short stays verifiable;
    `final`: REPORT.md with its figures too (once, at the end: they are the slow part)."""
    ran = [name for name in plan if (out / name / store.TRIALS_FILE).is_file()]
    rows = [row for name in ran for row in trial_checks(out / name, name)]
    rounds = plan["harness"].trials if "harness" in plan else 0
    summary = {**summarize_checks(rows, comparison(out, device), device), "parts_run": ran,
               "parts_left": skipped, "plain_loop_failed": plain_loop_failures(out, rounds),
               "clocks_held_down_s": clocks_held_down([out / name for name in ran])}
    write_checks(out, rows, summary)
    if final and ran:
        document.write_report([out / name for name in ran], out, claim_list=None)
        with (out / "REPORT.md").open("a", encoding="utf-8") as f:
            f.write("\n".join(["", "## Device check", "", *(f"- {line}" for line in summary_lines(summary)),
                               "", "Per trial: `tables/device_check.md`; all numbers: `device_check.json`.",
                               ""]))
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
                        help=f"trials per config in harness, precision and pin_memory (default: "
                             f"{ROUNDS} rounds of the comparison, 1 elsewhere; nsys and nccl run 1)")
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
        plan = as_run(specs(chosen(parts(args.device, max(1, len(gpus)), True, args.trials), args.parts),
                            out), out)
        print_plan(plan, out, learn(out, plan), args.device, print)
        print("--dry-run: nothing started (nsys runs only where it is on PATH, nccl only where two "
              "GPUs are visible)")
        return 0
    with_nsys = args.device == "cuda" and nsys.find_nsys() is not None
    plan = as_run(specs(chosen(parts(args.device, len(gpus), with_nsys, args.trials), args.parts), out), out)
    print_plan(plan, out, learn(out, plan), args.device, print)
    if args.dry_run:
        print("--dry-run: nothing started")
        return 0
    started = clock()
    record_environment(out, gpus)
    skipped: dict[str, str] = {}
    for name in list(plan):
        plan = as_run(plan, out)
        s = plan[name]
        need = part_seconds(name, s, out, learn(out, plan), args.device)
        left = args.budget_s - (clock() - started)
        if need > left:
            skipped[name] = (f"needs about {runner.format_duration(need)}, "
                             f"{runner.format_duration(max(0.0, left))} of the budget left")
            print(f"{name}: left for the next call ({skipped[name]})")
            continue
        if name == "harness":
            run_comparison(s, out, args.device, print)
        else:
            runner.run(s, out / name, data_dir=ROOT / "data", echo=print)
        with GATE.hold():  # after every part, whole: a cut-short run is verifiable
            checkpoint(out, plan, args.device, skipped, final=False)
        GATE.check()
    summary = checkpoint(out, as_run(plan, out), args.device, skipped, final=not skipped)
    for line in summary_lines(summary):
        print(line)
    return finish_status(summary, skipped, out, clock() - started)


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
    failed = summary["not_ok"] or summary.get("plain_loop_failed") \
        or summary["step_clock_within_tolerance"] is False \
        or summary["tf32_flags_as_set"] is False or summary["harness_costs_too_much"] is True \
        or summary["windows_long_enough"] is False
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
