"""How a number is written: metric labels and formats, mean ± sd [CI], the paper's values."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pandas as pd


def fmt_num(v: float) -> str:
    return "–" if v is None or math.isnan(v) else f"{v:.4g}"


def fmt_pct(v: float) -> str:
    return "–" if v is None or math.isnan(v) else f"{100 * v:.2f}"


def fmt_gib(v: float) -> str:
    return "–" if v is None or math.isnan(v) else f"{v / 2**30:.3g}"


METRIC_LABELS: dict[str, tuple[str, Callable[[float], str]]] = {
    "train_time_s": ("train time (s)", fmt_num),
    "epoch_time_s": ("epoch time (s)", fmt_num),
    "step_time_median_s": ("median step (s)", fmt_num),
    "throughput_samples_s": ("throughput (img/s)", fmt_num),
    "data_wait_fraction": ("data wait, loader next() (%)", fmt_pct),
    "data_wait_s": ("data wait, loader next() (s)", fmt_num),
    "h2d_wait_fraction": ("copy wait, host in H2D copy (%)", fmt_pct),
    "h2d_wait_s": ("copy wait, host in H2D copy (s)", fmt_num),
    "first_batch_latency_s": ("pre-epoch pause (s)", fmt_num),
    "h2d_time_s": ("H2D copy on device (s)", fmt_num),
    "nvml_process_mem_bytes": ("rank GPU mem., NVML (GiB)", fmt_gib),
    "test_accuracy": ("test acc. (%)", fmt_pct),
    "peak_mem_bytes": ("peak mem. (GiB)", fmt_gib),
    "gpu_util_mean": ("GPU util. (%)", fmt_pct),
    "gpu_busy_fraction": ("GPU computing, of a step (%)", fmt_pct),
    "train_loss": ("train loss", fmt_num),
    "tokens_per_s_per_gpu": ("tokens/s per GPU", fmt_num),
    "time_per_token_s": ("time per input token, one GPU (s)", fmt_num),
    "peak_mem_active_bytes": ("peak active mem. (GiB)", fmt_gib),
    "peak_mem_reserved_bytes": ("peak reserved mem. (GiB)", fmt_gib),
    "peak_device_mem_bytes": ("GPU mem. used, NVML (GiB)", fmt_gib),
    "peak_process_mem_bytes": ("process RSS (GiB)", fmt_gib),
    "final_loss": ("final loss", fmt_num),
    "local_page_fraction": ("pages on home node (%)", fmt_pct),
    "cpus_on_gpu_node_fraction": ("CPUs on GPU's node (%)", fmt_pct),
    "far_dram_count": ("far DRAM fills / remote DRAM loads, whole rank (count)", fmt_num),
    "near_dram_count": ("near DRAM fills / local DRAM loads, whole rank (count)", fmt_num),
    "far_dram_fraction": ("far DRAM share, whole rank (%)", fmt_pct),
    "energy_j": ("GPU energy (J)", fmt_num),
    "energy_per_sample_j": ("GPU energy per image (mJ)", lambda v: fmt_num(v * 1e3)),
    "mean_power_w": ("GPU power, all trial GPUs (W)", fmt_num),
    "cpu_energy_j": ("CPU package energy (J)", fmt_num),
    "node_energy_per_sample_j": ("GPU + CPU package energy per image (mJ)", lambda v: fmt_num(v * 1e3)),
    "rank_cpu_s": ("rank CPU time, its threads included (s)", fmt_num),
    "dali_threads_cpu_s": ("DALI threads' CPU time (s)", fmt_num),
    "rank_cores_mean": ("rank CPU cores busy (mean)", fmt_num),
    "workers_cores_mean": ("loader workers' CPU cores busy (mean)", fmt_num),
    "dali_threads_cores_mean": ("DALI threads' CPU cores busy (mean)", fmt_num),
    "workers_cpu_s": ("loader workers' CPU time (s)", fmt_num),
    "cpu_cores_mean": ("CPU cores busy (mean)", fmt_num),
    "stray_contexts": ("stray CUDA contexts", fmt_num),
    "launch_cpu_s": ("CPU time of the whole launch (s)", fmt_num),
    "launch_cpu_cores_mean": ("CPU cores busy over the whole launch (mean)", fmt_num),
    "energy_per_token_j": ("GPU energy per token (mJ)", lambda v: fmt_num(v * 1e3)),
}


def label(metric: str) -> str:
    return METRIC_LABELS.get(metric, (metric, fmt_num))[0]


# what a recorded value (SI units, fractions, bytes) is multiplied by to read in its label's unit
UNIT_SCALES = {"(mJ)": 1e3, "(%)": 100.0, "(GiB)": 2.0**-30}


def display_scale(metric: str) -> float:
    """The factor from the recorded value to the unit its label names (a figure's axis)."""
    return next((f for unit, f in UNIT_SCALES.items() if label(metric).endswith(unit)), 1.0)


def format_metric(metric: str, value: float) -> str:
    return METRIC_LABELS.get(metric, (metric, fmt_num))[1](value)


def withheld_text(row: pd.Series, metric: str) -> str | None:
    """Why the config's statistics of `metric` are not shown (judge.summarize.withheld: energy
    that fewer than 3 ok trials measured), as the table says it; None where they are."""
    why = row.get(f"{metric}.withheld")
    return why if isinstance(why, str) else None


def mean_sd_ci(row: pd.Series, metric: str, ok_trials: int = 0) -> str:
    """"mean ± sd [95% CI]"; "not measured" where the config's ok trials hold no value (a
    metric recorded as null with its reason, e.g. energy on CPU), "–" where it has none, and
    "n < 3 (n = 2)" where energy is withheld."""
    if why := withheld_text(row, metric):
        return why
    mean, sd = row[f"{metric}.mean"], row[f"{metric}.std"]
    if math.isnan(mean):
        return "not measured" if ok_trials else "–"
    text = format_metric(metric, mean) + (f" ± {format_metric(metric, sd)}" if not math.isnan(sd) else "")
    lo, hi = row[f"{metric}.ci_lo"], row[f"{metric}.ci_hi"]
    if not math.isnan(lo):
        text += f" [{format_metric(metric, lo)}, {format_metric(metric, hi)}]"
    return text


def with_ci(value: float, lo: float, hi: float, formatter: Callable[[float], str]) -> str:
    if math.isnan(value):
        return "–"
    return formatter(value) + ("" if math.isnan(lo) else f" [{formatter(lo)}, {formatter(hi)}]")


def paper_values(values: dict[str, Any]) -> str:
    parts = []
    for key, value in values.items():
        if key == "inferred":  # said once, after the values
            continue
        if key == "outcome":
            parts.append("runs" if value == "runs" else "fails to run")
            continue
        lo, hi = value if isinstance(value, tuple) else (value, value)
        if key == "speedup_x":
            text, unit = (f"{lo:g}" if lo == hi else f"{lo:g}–{hi:g}"), "x"
        elif key in ("gain_pct", "time_reduction_pct"):
            text, unit = (f"{lo:g}" if lo == hi else f"{lo:g}–{hi:g}"), " %"
        else:
            a, b = format_metric(key, lo), format_metric(key, hi)
            parts.append(f"{label(key)} {a if lo == hi else f'{a}–{b}'}")
            continue
        name = {"speedup_x": "speed-up"}.get(key, key.removesuffix("_pct").replace("_", " "))
        parts.append(f"{name} {text}{unit}")
    return "; ".join(parts) + (" (inferred)" if parts and values.get("inferred") else "")


# The paper's Nsight metrics (docs/paper.md section 5) -> trace summary keys. "CUDA memcpy HtoD" is the
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
    # where the GPU's time went (profiling.breakdown), first to last device operation
    "GPU timeline (ms)": ("gpu_span_ns", "ms"),
    "GPU busy: kernels (ms)": ("gpu_busy_ns", "ms"),
    "GPU waits on a copy (ms)": ("gpu_copy_ns", "ms"),
    "GPU waits on the host (ms)": ("gpu_host_wait_ns", "ms"),
    "GPU idle, other (ms)": ("gpu_idle_ns", "ms"),
}


UNITS: dict[str, Callable[[float], str]] = {
    "count": lambda v: f"{v:.0f}", "mib": lambda v: f"{v / 2**20:.4g}", "ms": lambda v: f"{v / 1e6:.4g}"}


def run_nature(spec: Any) -> str:
    """What kind of run this is, in a few words for headings and figure titles: the profile, the
    device, trials per config and the settings a spec's title may not match (the images' size,
    the model), e.g. "CPU smoke, n = 1, 32 px"."""
    def setting(key: str) -> str | None:
        if key in spec.fixed:
            return str(spec.fixed[key])
        values = spec.grid.get(key)
        return "/".join(str(v) for v in values) if values else None

    device = (setting("device") or "cuda").upper().replace("CUDA", "GPU")
    parts = [f"{device} {spec.profile}" if spec.profile != "paper" else f"{device}, paper settings",
             f"n = {spec.trials}"]
    if (size := setting("image_size")) and spec.workload == "vision":
        parts.append(f"{size} px")
    if (model := setting("model")) and spec.workload == "llm":
        parts.append(f"model {model}" + (", random weights" if setting("weights") == "random" else ""))
    return ", ".join(parts)


def config_tick(key: str, value: Any) -> str:
    """One factor's level on an axis: `loader=torch`, `fp16`, `1 GPU` / `4 GPUs`, `pin_memory=True`."""
    if key == "gpus":
        return f"{value} GPU" + ("" if str(value) == "1" else "s")
    if key == "precision":
        return str(value)
    return f"{key}={value}"


def idle_power_text(entry: dict[str, Any] | None) -> str:
    """One GPU's idle power as env.json's `gpu_idle_power` holds it: "61.2 W (5.00 s)", "n/a:
    why", or "not recorded" (a run made before it was read)."""
    if entry is None:
        return "not recorded"
    if entry.get("watts") is None:
        return f"n/a: {entry.get('reason')}"
    return f"{entry['watts']:.4g} W ({entry['window_s']:.3g} s)"


def idle_power_line(record: dict[str, Any] | None) -> str:
    """A run's idle power, every GPU read: "GPU 0 61.2 W (5.00 s), GPU 1 ...", or why none."""
    if record is None:
        return "not recorded (env.json has no `gpu_idle_power`: a run made before it was read)"
    if not record.get("gpus"):
        return f"not read: {record.get('reason')}"
    return ", ".join(f"GPU {g.get('index')} {idle_power_text(g)}" for g in record["gpus"])
