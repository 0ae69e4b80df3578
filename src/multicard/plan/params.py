"""The settings an experiment may give a workload: name, type, domain, default and meaning.

One table per workload. `spec` validates TOML against it, the workload builds its argparse from
it, and `launch` turns values into flags, so a setting is declared exactly once. The paper does not
give batch size, optimizer, learning rate or worker counts (docs/paper.md section 8); the defaults
below are ours and are documented in docs/experiments.md ("Settings the paper does not give").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from multicard.errors import InputError
from multicard.measure.numa import POLICIES
from multicard.plan.precision import PRECISIONS

Value = bool | int | float | str


@dataclass(frozen=True)
class Param:
    """One setting. `choices` limits strings; `minimum`/`maximum` bound numbers (inclusive)."""

    kind: type
    default: Value
    help: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    # a setting added after runs were recorded: what those runs did. A run's spec.toml without
    # it resolves to this value (not the default), and a config with this value hashes without
    # it, so every earlier run keeps its config ids (spec.config_id).
    before: Value | None = None

    def describe(self) -> str:
        """What a valid value looks like, for error messages."""
        if self.choices:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        bounds = []
        if self.minimum is not None:
            bounds.append(f">= {self.minimum:g}")
        if self.maximum is not None:
            bounds.append(f"<= {self.maximum:g}")
        name = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
        return " ".join([name[self.kind], *bounds])


def check_value(param: Param, value: Any) -> Value | None:
    """Return `value` converted to the param's type, or None when it is not valid."""
    if param.kind is bool:
        return value if isinstance(value, bool) else None
    if isinstance(value, bool):  # bool is an int subclass; `true` is never a valid number
        return None
    if param.kind is float and isinstance(value, int | float):
        value = float(value)
        if not math.isfinite(value):  # NaN passes every comparison; inf is no setting
            return None
    elif not isinstance(value, param.kind):
        return None
    if param.choices is not None and value not in param.choices:
        return None
    if param.minimum is not None and value < param.minimum:
        return None
    if param.maximum is not None and value > param.maximum:
        return None
    return value


VISION: dict[str, Param] = {
    "device": Param(str, "cuda", "cuda (nccl) or cpu (gloo ranks)", choices=("cuda", "cpu")),
    "gpus": Param(int, 1, "ranks per node: GPUs on cuda, gloo processes on cpu", minimum=1,
                  maximum=64),
    "nnodes": Param(int, 1, "nodes (torchrun --nnodes); >1 needs --rdzv-endpoint", minimum=1,
                    maximum=4096),
    "precision": Param(str, "fp32", "numeric policy, see precision.py", choices=tuple(PRECISIONS)),
    "cast": Param(str, "device", "where a batch takes the precision's input dtype: device (float32 "
                  "is copied, then cast) or host (the loader casts before the copy, as a user who "
                  "calls .half() on the batch would: HtoD bytes follow the precision)",
                  choices=("device", "host")),
    "image_size": Param(int, 224, "images are NxN (Scenario A: upsampled on the fly; B: files)",
                        minimum=28, maximum=1024),
    "scenario": Param(str, "a", "a: upsampling in the Dataset; b: prepared files (data prepare)",
                      choices=("a", "b")),
    "data_format": Param(str, "jpeg", "Scenario B file format", choices=("jpeg", "png", "npy")),
    "loader": Param(str, "torch", "torch (DataLoader), dali or synthetic (the no-loading bound)",
                    choices=("torch", "dali", "synthetic")),
    "layout": Param(str, "nchw", "memory format of batches and model; nhwc = channels_last",
                    choices=("nchw", "nhwc")),
    "normalize": Param(str, "cpu", "torch loader: normalise in CPU workers (the paper) or on the "
                       "device after the copy (Scenario B)", choices=("cpu", "device")),
    "mode": Param(str, "train", "train, or loader_only: iterate batches onto the device, no model",
                  choices=("train", "loader_only")),
    "epochs": Param(int, 20, "training epochs (the paper: 20)", minimum=1, maximum=10_000),
    "batch_size": Param(int, 64, "samples per rank per step", minimum=1, maximum=65_536),
    "optimizer": Param(str, "sgd", "sgd (momentum) or adamw", choices=("sgd", "adamw")),
    "lr": Param(float, 0.02, "learning rate, constant, not scaled by world size", minimum=0.0),
    "momentum": Param(float, 0.9, "SGD momentum", minimum=0.0, maximum=1.0),
    "weight_decay": Param(float, 4e-5, "weight decay (MobileNetV2 paper value)", minimum=0.0),
    "num_workers": Param(int, 4, "DataLoader worker processes per rank", minimum=0, maximum=512),
    "pin_memory": Param(bool, False, "DataLoader pin_memory (PyTorch default: false)"),
    "prefetch_factor": Param(int, 2, "DataLoader batches prefetched per worker (default 2)", minimum=1,
                             maximum=1024),
    "persistent_workers": Param(bool, False, "keep DataLoader workers between epochs (default: false)"),
    "dali_threads": Param(int, 4, "DALI pipeline CPU threads per rank", minimum=1, maximum=512),
    "dali_affinity": Param(bool, False, "DALI pins its threads to the CPUs nearest the GPU "
                           "(Pipeline set_affinity; DALI's default: false)"),
    "numa_policy": Param(str, "none", "per-rank binding: none, local, remote, interleave (numactl, "
                         "numa.py), or torchrun's own --numa-binding: torchrun_node, torchrun_socket, "
                         "torchrun_exclusive",
                         choices=POLICIES),
    "numa_evidence": Param(bool, False, "record numa_maps and CPU lists of every rank and worker "
                           "mid-epoch (placement metrics)"),
    "numa_counters": Param(bool, False, "count far and near DRAM traffic of every rank and its "
                           "workers with perf stat, where perf and the CPU offer it (counters.py)"),
    "page_cache": Param(str, "as_is", "Scenario B files before each trial: as_is, warm (read "
                        "once) or cold (evicted, no root needed)", choices=("as_is", "warm", "cold")),
    "cudnn_benchmark": Param(bool, False, "torch.backends.cudnn.benchmark (default: false)"),
    "warmup_steps": Param(int, 5, "untimed steps before training; state restored after", minimum=0,
                          maximum=100_000),
    # default: a grid over GPU counts compares 1 with 4 GPUs under the same DDP (the paper's
    # DDP-DS); the one-GPU profiles (kick, first_evidence) set lean
    "single_rank_ddp": Param(str, "default", "how a one-rank trial wraps the model: default (DDP "
                             "with PyTorch's defaults, as the paper's DDP-DS), lean (DDP without "
                             "the per-forward buffer broadcast, gradients as bucket views) or none "
                             "(no DDP); several ranks always use DDP with PyTorch's defaults",
                             choices=("lean", "default", "none"), before="default"),
    "probe_steps": Param(int, 5, "steps profiled after the trial (nothing timed left) to read the GPU's "
                         "kernel time per step: the trial's GPU-bound or host-bound label; 0 = none",
                         minimum=0, maximum=1000, before=0),
    "max_steps": Param(int, 0, "steps per epoch: each epoch draws a fixed, seeded random "
                       "max_steps x batch x ranks images; 0 = the whole dataset", minimum=0,
                       maximum=10_000_000),
    "train_subset": Param(int, 0, "first N training images; 0 = all 60,000", minimum=0,
                          maximum=60_000),
    "test_subset": Param(int, 0, "first N test images; 0 = all 10,000", minimum=0, maximum=10_000),
    "seed": Param(int, 0, "base seed; trial t uses seed + t", minimum=0, maximum=2**31 - 1),
}

LLM: dict[str, Param] = {
    "device": Param(str, "cuda", "cuda, or cpu (single-device recipes only)", choices=("cuda", "cpu")),
    "gpus": Param(int, 1, "processes per node (tune run --nproc_per_node)", minimum=1, maximum=64),
    "nnodes": Param(int, 1, "nodes (tune run --nnodes); >1 needs --rdzv-endpoint", minimum=1,
                    maximum=4096),
    "method": Param(str, "lora", "lora, qlora, dpo, qat or full (the reference)",
                    choices=("lora", "qlora", "dpo", "qat", "full")),
    "dataset": Param(str, "gec", "gec (grammar_dataset) or samsum (samsum_dataset)",
                     choices=("gec", "samsum")),
    "model": Param(str, "llama3_8b", "llama3_8b, or tiny (2 layers, for CPU runs)",
                   choices=("llama3_8b", "tiny")),
    "weights": Param(str, "random", "random (the architecture, seeded) or a Meta-format checkpoint "
                     "directory (consolidated.00.pth)"),
    "tokenizer": Param(str, "generated", "generated (byte-level, tests) or a Llama 3 tokenizer.model"),
    "data": Param(str, "real", "real (data/llm/real, from `multicard data fetch-llm`), synthetic, "
                  "or a directory of <dataset>.json files"),
    "seq_len": Param(int, 1024, "tokens per sample, packed or truncated (tokenizer.max_seq_len)", minimum=16,
                     maximum=131_072),
    "batch_size": Param(int, 2, "samples per process per step (the stock LoRA configs: 2)", minimum=1,
                        maximum=4096),
    "packed": Param(bool, True, "pack SFT samples into seq_len-token sequences (dataset.packed): "
                    "every step then holds the same tokens; false: a step is batch_size samples, "
                    "as in torchtune's stock configs (DPO pairs are never packed)"),
    "gradient_accumulation_steps": Param(int, 1, "micro-batches per optimizer step", minimum=1,
                                         maximum=4096),
    "max_steps": Param(int, 50, "optimizer steps per trial (max_steps_per_epoch, 1 epoch)", minimum=1,
                       maximum=1_000_000),
    "warmup_steps": Param(int, 5, "first logged steps left out of the statistics", minimum=0,
                          maximum=1_000_000),
    "lora_rank": Param(int, 8, "LoRA rank (the stock configs: 8)", minimum=1, maximum=4096),
    "lora_alpha": Param(int, 16, "LoRA alpha (the stock configs: 16)", minimum=1, maximum=65_536),
    "dtype": Param(str, "bf16", "bf16 (the stock configs) or fp32", choices=("bf16", "fp32")),
    "pin_memory": Param(bool, False, "pin the recipe's DataLoader batches (Table 5)"),
    "seed": Param(int, 0, "training seed; trial t uses seed + t", minimum=0, maximum=2**31 - 1),
}

WORKLOAD_PARAMS: dict[str, dict[str, Param]] = {"vision": VISION, "llm": LLM}


def vision_conflicts(settings: Mapping[str, Value]) -> list[str]:
    """Combinations of valid values that cannot run together, as messages naming the keys."""
    problems = []
    if settings["loader"] == "dali" and settings["scenario"] != "b":
        problems.append("loader = 'dali' reads files: it needs scenario = 'b'")
    if settings["loader"] == "dali" and settings["data_format"] == "npy":
        problems.append("loader = 'dali' decodes images: data_format must be 'jpeg' or 'png'")
    if settings["normalize"] == "device" and settings["scenario"] != "b":
        problems.append("normalize = 'device' needs scenario = 'b' (Scenario A resizes in float)")
    if settings["persistent_workers"] and settings["num_workers"] == 0:
        problems.append("persistent_workers = true needs num_workers > 0")
    if settings["cast"] == "host" and settings["loader"] == "dali":
        problems.append("cast = 'host' casts the DataLoader's host batches; DALI makes its batches "
                        "on the device: use cast = 'device'")
    if settings["cast"] == "host" and settings["normalize"] == "device":
        problems.append("cast = 'host' needs normalize = 'cpu' (device normalisation copies uint8)")
    if settings["page_cache"] != "as_is" and settings["scenario"] != "b":
        problems.append("page_cache = 'warm'/'cold' acts on files: it needs scenario = 'b'")
    return problems


def llm_conflicts(settings: Mapping[str, Value]) -> list[str]:
    problems = []
    if settings["warmup_steps"] >= settings["max_steps"]:  # type: ignore[operator]
        problems.append("warmup_steps must be smaller than max_steps (nothing would be measured)")
    if settings["model"] == "tiny" and settings["tokenizer"] != "generated":
        problems.append("model = 'tiny' has 512 token ids: it needs tokenizer = 'generated'")
    return problems


WORKLOAD_CONFLICTS = {"vision": vision_conflicts, "llm": llm_conflicts}

VISION_METRICS: tuple[str, ...] = (
    "train_time_s",
    "epoch_time_s",
    "steady_epoch_s",
    "step_time_median_s",
    "throughput_samples_s",
    "data_wait_fraction",
    "data_wait_s",
    "h2d_wait_fraction",
    "h2d_wait_s",
    "first_batch_latency_s",
    "h2d_time_s",
    "test_accuracy",
    "peak_mem_bytes",
    "nvml_process_mem_bytes",
    "gpu_util_mean",
    "train_loss",
    "local_page_fraction",
    "cpus_on_gpu_node_fraction",
    # perf stat around every rank (multicard.measure.counters), the whole launch of the rank
    "far_dram_count",
    "near_dram_count",
    "far_dram_fraction",
    # energy over the timed epochs (measure.energy) and what the CPU did (measure.processes)
    "energy_j",
    "energy_per_sample_j",
    "mean_power_w",
    "cpu_energy_j",
    "node_energy_per_sample_j",
    "rank_cpu_s",
    "workers_cpu_s",
    "dali_threads_cpu_s",
    "rank_cores_mean",
    "workers_cores_mean",
    "dali_threads_cores_mean",
    "cpu_cores_mean",
    "stray_contexts",
    # the step probe after the trial (profiling.step_probe) and the operating point it gives
    "probe_kernels_per_step",
    "probe_kernel_s_per_step",
    "probe_busy_s_per_step",
    "probe_aten_ops_per_step",
    "probe_launches_per_step",
    "probe_wall_s_per_step",
    "gpu_busy_fraction",
)

LLM_METRICS: tuple[str, ...] = (
    "step_time_median_s",
    "tokens_per_s_per_gpu",
    # seconds per input token on one GPU, padding included: one definition for every method
    "time_per_token_s",
    "peak_mem_active_bytes",
    "peak_mem_reserved_bytes",
    "steps",
    "final_loss",
    "peak_device_mem_bytes",
    "peak_process_mem_bytes",
    # GPU energy over the measured steps, sampled by the runner (multicard.measure.energy)
    "energy_j",
    "energy_per_token_j",
    "mean_power_w",
    # seen by the runner from outside: every GPU's process list, the launch's CPU time
    "stray_contexts",
    "launch_cpu_s",
    "launch_cpu_cores_mean",
)

WORKLOAD_METRICS: dict[str, tuple[str, ...]] = {"vision": VISION_METRICS, "llm": LLM_METRICS}
# metrics that are proportions, between 0 and 1: their intervals stay there (stats.proportion_mean_ci)
PROPORTION_METRICS = frozenset({"test_accuracy", "data_wait_fraction", "h2d_wait_fraction",
                                "local_page_fraction", "cpus_on_gpu_node_fraction", "far_dram_fraction",
                                "gpu_util_mean"})  # not gpu_busy_fraction: measured, it can pass 1
# the metric that speedups are computed on when a spec does not name one
WORKLOAD_PRIMARY = {"vision": "train_time_s", "llm": "step_time_median_s"}


def resolve(workload: str, values: Mapping[str, Value], recorded: bool = False) -> dict[str, Value]:
    """Defaults overlaid with `values`, in the table's order (values are assumed checked).
    `recorded`: the values are a run's resolved settings, where a missing setting is one added
    since, and takes what the run did (`Param.before`)."""
    table = WORKLOAD_PARAMS[workload]
    unknown = set(values) - set(table)
    if unknown:
        raise InputError(f"unknown setting(s) for workload {workload!r}: {sorted(unknown)}")
    return {name: values.get(name, param.before if recorded and param.before is not None
                             else param.default) for name, param in table.items()}


def to_flags(values: Mapping[str, Value]) -> list[str]:
    """`{"image_size": 32, "pin_memory": True}` -> `["--image-size", "32", "--pin-memory", "true"]`."""
    flags: list[str] = []
    for name, value in values.items():
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        flags += ["--" + name.replace("_", "-"), text]
    return flags


def parse_flag_value(param: Param, text: str) -> Value:
    """Inverse of `to_flags` for one value; raises ValueError (argparse turns it into exit 2)."""
    if param.kind is bool:
        if text not in ("true", "false"):
            raise ValueError(f"expected true or false, got {text!r}")
        return text == "true"
    value = check_value(param, param.kind(text))
    if value is None:
        raise ValueError(f"expected {param.describe()}, got {text!r}")
    return value
