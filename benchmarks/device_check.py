"""One-shot device check: does the harness measure what it says on this machine's GPU?

    PYTHONPATH=src python3 benchmarks/device_check.py --dry-run     # the plan and its estimate
    PYTHONPATH=src python3 benchmarks/device_check.py               # one GPU, under 8 minutes
    PYTHONPATH=src python3 benchmarks/device_check.py --device cpu  # the same on CPU, tiny sizes
    nox -s device-check -- [ARGS]                                   # the same through nox

It exits 0 when every part ran and every check held, 1 otherwise, 2 on bad input. It needs only
Python, torch, torchvision and multicard's light dependencies (pandas, tabulate,
matplotlib, filelock, nvidia-ml-py, tomli-w): no nox, DALI, torchtune or network. It writes
`artifact/runs/<N>x<gpu-model>-device-check-<UTC>/` (`cpu-device-check-<UTC>` on CPU): one run
directory per part below, `env.json`, REPORT.md, `tables/`, `device_check.json` and SHA256SUMS.

Parts (1 GPU, Scenario A at 100 px, 2 epochs of 50 steps, trials interleaved within a part), in
the order they run, after the reference loops below:
- layout x loader: nchw / nhwc x torch / synthetic at fp16, 2 trials each;
- precision: fp64 / fp32 / tf32 / fp16 / bf16, 3 trials each, TF32 flags read back and TF32
  measured (the error of an fp32 matmul and convolution against float64);
- pin_memory: off / on at fp16, 2 trials each;
- nsys: one traced fp32 trial, captured and parsed, where `nsys` is on PATH;
- nccl: one 2-rank trial, where two GPUs are visible.
A part that would end past `--budget-s` (8 minutes; the time per trial measured so far once a
part has run, the cost model before) is skipped and named. After every part the run is reported
and checksummed, so a run cut short is still verifiable. The checks: CUDA-event step times
against the host's clock over the same spans (within 5 %), every precision's TF32 as set, and the
harness against a plain loop: the same MobileNetV2 fp16 channels_last training step with no
harness, no DDP and no loader (and, where `timm` imports, timm's mobilenetv2_100 in the step
timm's `benchmark.py` times), printed as `multicard / plain loop` and `multicard / timm` images/s.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # a bare checkout: no install needed
    sys.path.insert(0, str(ROOT / "src"))

from multicard import artifact, cost, report, runner, store, telemetry  # noqa: E402
from multicard import spec as specmod  # noqa: E402
from multicard.errors import InputError  # noqa: E402
from multicard.precision import PRECISIONS  # noqa: E402
from multicard.profiling import nsys  # noqa: E402
from multicard.stopping import GATE, Interrupted, stop_on_signals  # noqa: E402

TARGET_S = 8 * 60
STEP_CLOCK_TOLERANCE = 0.05
SIZES: dict[str, dict[str, Any]] = {
    "cuda": {"device": "cuda", "image_size": 100, "epochs": 2, "max_steps": 50, "batch_size": 64,
             "num_workers": 4, "test_subset": 2000, "cast": "host"},
    "cpu": {"device": "cpu", "image_size": 32, "epochs": 2, "max_steps": 4, "batch_size": 16,
            "num_workers": 1, "warmup_steps": 1, "train_subset": 1024, "test_subset": 64,
            "cast": "host"},
}
# The harness comparison runs in fp16 on GPUs; CPUs have no fast fp16, so bf16 there.
COMPARED_PRECISION = {"cuda": "fp16", "cpu": "bf16"}
PLAIN_LOOP_STEPS = {"cuda": (20, 100), "cpu": (2, 8)}  # (warm-up, timed)
PLAIN_LOOP_ESTIMATE_S = {"cuda": 40.0, "cpu": 30.0}


def parts(device: str, gpus: int, with_nsys: bool, trials: int | None = None) -> dict[str, dict[str, Any]]:
    """name -> experiment document (the spec format of experiments/*.toml); `trials` overrides
    every part's trial count (3 per precision, 2 per config elsewhere)."""
    fast = COMPARED_PRECISION[device]
    found = {  # in the order they run: the harness comparison first
        "layout_loader": ({"precision": fast}, {"layout": ["nchw", "nhwc"],
                                                "loader": ["torch", "synthetic"]},
                          {"layout": "nchw", "loader": "torch"}, {"count": trials or 2}),
        "precision": ({}, {"precision": ["fp64", "fp32", "tf32", "fp16", "bf16"]},
                      {"precision": "fp64"}, {"count": trials or 3}),
        "pin_memory": ({"precision": fast}, {"pin_memory": [False, True]}, {"pin_memory": False},
                       {"count": trials or 2}),
    }
    if with_nsys:
        found["nsys"] = ({}, {"precision": ["fp32"]}, {}, {"count": 1, "trace": "nsys"})
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


def specs(documents: dict[str, dict[str, Any]], where: Path) -> dict[str, specmod.Spec]:
    return {name: specmod.from_document(doc, where / f"device_check_{name}.toml")
            for name, doc in documents.items()}


def estimate_s(plan: dict[str, specmod.Spec], device: str) -> dict[str, float]:
    seconds = {name: sum(cost.trial_seconds("vision", p.params) for p in specmod.plan(s))
               for name, s in plan.items()}
    seconds["plain loop (+ timm)"] = PLAIN_LOOP_ESTIMATE_S[device]
    return seconds


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


def trial_checks(run_dir: Path, part: str) -> list[dict[str, Any]]:
    rows = []
    for record in store.read(run_dir / store.TRIALS_FILE):
        row = {"part": part, **record["config"], "trial": record["trial"],
               "trace": record.get("trace", "none"), "status": record["status"]}
        if record["status"] == "ok":
            result = json.loads((run_dir / f"raw/{trial_dir_name(record)}/result.json").read_text())
            row["step_clock_vs_wall"] = step_clock_agreement(result)
            row["tf32_as_set"] = tf32_as_set(str(record["config"].get(
                "precision", result.get("precision", ""))), result) if part == "precision" else None
            row["energy_per_sample_j"] = record["metrics"].get("energy_per_sample_j")
            row["energy_reason"] = record.get("unmeasured", {}).get("energy_per_sample_j")
            if record.get("trace_metrics"):
                row["trace_kernels"] = sum(int(s.get("kernel_count", 0))
                                           for s in record["trace_metrics"].values())
        rows.append(row)
    return rows


def trial_dir_name(record: dict[str, Any]) -> str:
    trace = record.get("trace", "none")
    return (f"{record['config_id']}-t{record['trial']}" + (f"-{trace}" if trace != "none" else "")
            + f"-a{record['attempt']}")


def mean_throughput(run_dir: Path, config: dict[str, Any]) -> float | None:
    values = [r["metrics"]["throughput_samples_s"] for r in store.read(run_dir / store.TRIALS_FILE)
              if r["status"] == "ok" and r.get("trace", "none") == "none"
              and all(r["config"].get(k) == v for k, v in config.items())]
    return statistics.fmean(values) if values else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator and denominator else None


# --- the reference loops -----------------------------------------------------------------------

def reference_step_images_per_s(make_model: Callable[[], Any], device: str, precision: str,
                                image_size: int, batch: int, warmup: int, steps: int) -> float:
    """Images/s of a bare training step: one resident channels_last batch, SGD with momentum,
    autocast (+ GradScaler for fp16), no DDP, no loader, no clocks but the two around the loop."""
    import torch
    import torch.nn.functional as F

    dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    model = make_model().to(dev).to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9, weight_decay=4e-5)
    scaler = torch.amp.GradScaler(dev.type, enabled=precision == "fp16")
    images = torch.randn(batch, 3, image_size, image_size, device=dev, dtype=dtype)
    images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (batch,), device=dev)

    def step() -> None:
        with torch.autocast(dev.type, dtype=dtype):
            loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    for _ in range(warmup):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)  # sync point: the loop's queued GPU work is in the time
    return steps * batch / (time.perf_counter() - start)


def reference_loops(device: str, settings: dict[str, Any]) -> dict[str, Any]:
    import torchvision

    warmup, steps = PLAIN_LOOP_STEPS[device]
    precision = COMPARED_PRECISION[device]
    size, batch = int(settings["image_size"]), int(settings["batch_size"])
    found: dict[str, Any] = {"precision": precision, "image_size": size, "batch_size": batch,
                             "steps": steps, "warmup_steps": warmup}
    found["plain_loop_images_s"] = reference_step_images_per_s(
        lambda: torchvision.models.mobilenet_v2(num_classes=10), device, precision, size, batch,
        warmup, steps)
    try:
        import timm
    except ImportError as exc:
        found["timm_images_s"], found["timm_unavailable"] = None, f"timm does not import: {exc}"
        return found
    found["timm_version"] = timm.__version__
    found["timm_images_s"] = reference_step_images_per_s(
        lambda: timm.create_model("mobilenetv2_100", num_classes=10), device, precision, size,
        batch, warmup, steps)
    return found


# --- the run ------------------------------------------------------------------------------------

def run_name(device: str, gpus: list[Any]) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    if device == "cpu" or not gpus:
        return f"cpu-device-check-{stamp}"
    model = re.sub(r"[^a-z0-9]+", "-", (gpus[0].name or "gpu").lower()).strip("-")
    return f"{len(gpus)}x{model}-device-check-{stamp}"


def print_plan(plan: dict[str, specmod.Spec], seconds: dict[str, float], echo: Callable[[str], None]) -> None:
    for name, s in plan.items():
        echo(f"{name}: {len(specmod.plan(s))} trials, estimated {runner.format_duration(seconds[name])}")
    echo(f"plain loop (+ timm): estimated {runner.format_duration(seconds['plain loop (+ timm)'])}")
    total = sum(seconds.values())
    verdict = "within" if total <= TARGET_S else "OVER"
    echo(f"total: estimated {runner.format_duration(total)} ({verdict} the "
         f"{runner.format_duration(TARGET_S)} target; estimates from multicard.cost)")


def summarize_checks(rows: list[dict[str, Any]], loops: dict[str, Any],
                     multicard_images_s: float | None) -> dict[str, Any]:
    agreement = [r["step_clock_vs_wall"] for r in rows if "step_clock_vs_wall" in r]
    tf32 = [r["tf32_as_set"] for r in rows if r.get("tf32_as_set") is not None]
    return {
        "trials": len(rows), "ok": sum(r["status"] == "ok" for r in rows),
        "not_ok": [r for r in rows if r["status"] not in ("ok", "skipped")],
        "step_clock_vs_wall_max": max(agreement) if agreement else None,
        "step_clock_within_tolerance": bool(agreement) and max(agreement) <= STEP_CLOCK_TOLERANCE,
        "tf32_flags_as_set": all(tf32) if tf32 else None,  # None: no precision trial ran
        "multicard_images_s": multicard_images_s,
        **loops,
        "multicard / plain loop": ratio(multicard_images_s, loops.get("plain_loop_images_s")),
        "multicard / timm": ratio(multicard_images_s, loops.get("timm_images_s")),
        "energy_per_sample_j": energy_by_precision(rows),
    }


def energy_by_precision(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean GPU energy per image of each precision's ok trials, or why there is none."""
    found: dict[str, Any] = {}
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


def write_checks(out: Path, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    import pandas as pd
    from tabulate import tabulate

    (out / "device_check.json").write_text(json.dumps({"summary": summary, "trials": rows}, indent=1))
    frame = pd.DataFrame(rows)
    (out / "tables" / "device_check.csv").write_text(frame.to_csv(index=False))
    table = tabulate(frame, headers="keys", tablefmt="github", showindex=False, floatfmt=".4g")
    (out / "tables" / "device_check.md").write_text(table + "\n")
    lines = ["", "## Device check", "",
             f"- step clock (CUDA events; host clock on CPU) vs wall clock: largest deviation "
             f"{_pct(summary['step_clock_vs_wall_max'])} (tolerance {STEP_CLOCK_TOLERANCE:.0%})",
             f"- TF32 flags read back as set in every precision trial: {summary['tf32_flags_as_set']}",
             f"- multicard (1 rank, synthetic loader, {summary['precision']}, nhwc): "
             f"{_num(summary['multicard_images_s'])} images/s; plain loop "
             f"{_num(summary['plain_loop_images_s'])}; timm {_num(summary.get('timm_images_s'))}",
             f"- multicard / plain loop: {_num(summary['multicard / plain loop'])}; multicard / timm: "
             f"{_num(summary['multicard / timm'])}",
             f"- GPU energy per image by precision: {energy_text(summary['energy_per_sample_j'])}", "",
             "Per trial: `tables/device_check.md`; all numbers: `device_check.json`.", ""]
    with (out / "REPORT.md").open("a", encoding="utf-8") as f:
        f.write("\n".join(lines))


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f} %"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


NEEDED = ("torch", "torchvision", "pandas", "tabulate", "matplotlib", "scipy", "filelock",
          "pynvml", "tomli_w")


def missing_modules() -> list[str]:
    import importlib.util

    return [name for name in NEEDED if importlib.util.find_spec(name) is None]


def part_seconds(s: specmod.Spec, per_trial_s: float | None) -> float:
    """A part's expected time: measured seconds per trial once a part has run, else the model."""
    planned = specmod.plan(s)
    if per_trial_s is None:
        return sum(cost.trial_seconds("vision", p.params) for p in planned)
    return per_trial_s * len(planned)


def measured_per_trial_s(out: Path, done: list[str]) -> float | None:
    walls = [r["wall_s"] for name in done for r in store.read(out / name / store.TRIALS_FILE)
             if r["status"] != "skipped"]
    return statistics.fmean(walls) if walls else None


def finish(out: Path, done: list[str], rows: list[dict[str, Any]], loops: dict[str, Any],
           skipped: dict[str, str]) -> dict[str, Any]:
    """Report what has run so far, the checks, and SHA256SUMS: a run cut short stays verifiable."""
    multicard_images_s = mean_throughput(out / "layout_loader", {"layout": "nhwc", "loader": "synthetic"}) \
        if "layout_loader" in done else None
    summary = {**summarize_checks(rows, loops, multicard_images_s), "parts_run": done,
               "parts_skipped": skipped}
    if done:
        report.write_report([out / name for name in done], out, claim_list=None)
    (out / "tables").mkdir(exist_ok=True)
    write_checks(out, rows, summary)
    artifact.write_checksums(out)
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
        print(f"device_check: stopped by {stop}; the parts that finished are reported", file=sys.stderr)
        return stop.exit_status


def check(argv: list[str] | None, clock: Callable[[], float] = time.monotonic) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and its estimate")
    parser.add_argument("--out", type=Path, help="run directory (default under artifact/runs/)")
    parser.add_argument("--trials", type=int, choices=range(1, 11), metavar="N",
                        help="trials per config in every part (default: 3 per precision, 2 elsewhere)")
    parser.add_argument("--budget-s", type=float, default=TARGET_S,
                        help="a part that would end past this many seconds is skipped and named "
                             f"(default {TARGET_S})")
    args = parser.parse_args(argv)
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
    with_nsys = args.device == "cuda" and nsys.find_nsys() is not None
    plan = specs(parts(args.device, len(gpus), with_nsys, args.trials), out)
    print_plan(plan, estimate_s(plan, args.device), print)
    if args.dry_run:
        print("--dry-run: nothing started")
        return 0
    started = clock()
    out.mkdir(parents=True, exist_ok=True)
    (out / "env.json").write_text(json.dumps(artifact.capture_env(ROOT / "data"), indent=1))
    # the reference loops first: the ratios this check exists for survive a run cut short
    loops = reference_loops(args.device, SIZES[args.device])
    done: list[str] = []
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    for name, s in plan.items():
        need = part_seconds(s, measured_per_trial_s(out, done))
        left = args.budget_s - (clock() - started)
        if need > left:
            skipped[name] = (f"needs about {runner.format_duration(need)}, "
                             f"{runner.format_duration(max(0.0, left))} of the budget left")
            print(f"{name}: skipped ({skipped[name]})")
            continue
        runner.run(s, out / name, data_dir=ROOT / "data", echo=print)
        done.append(name)
        rows += trial_checks(out / name, name)
        with GATE.hold():  # after every part, whole: a cut-short run is verifiable
            finish(out, done, rows, loops, skipped)
        GATE.check()
    summary = finish(out, done, rows, loops, skipped)
    print(f"multicard / plain loop: {_num(summary['multicard / plain loop'])} "
          f"({_num(summary['multicard_images_s'])} vs {_num(loops['plain_loop_images_s'])} images/s)")
    print(f"multicard / timm: {_num(summary['multicard / timm'])}"
          + (f" ({loops['timm_unavailable']})" if loops.get("timm_unavailable") else ""))
    print(f"GPU energy per image by precision: {energy_text(summary['energy_per_sample_j'])}")
    print(f"step clock vs wall clock: largest deviation {_pct(summary['step_clock_vs_wall_max'])}; "
          f"TF32 as set: {summary['tf32_flags_as_set']}")
    print(f"device check: {summary['ok']}/{summary['trials']} trials ok, parts skipped: "
          f"{', '.join(skipped) or 'none'}, in {runner.format_duration(clock() - started)}; {out}")
    # passed only when every part ran and every check held
    passed = summary["step_clock_within_tolerance"] and summary["tf32_flags_as_set"] is True \
        and not summary["not_ok"] and not skipped
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
