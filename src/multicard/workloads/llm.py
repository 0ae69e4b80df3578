"""LLM fine-tuning trials: torchtune's stock recipes, configured from the command line.

One trial is one `tune run [--nproc_per_node N] <recipe> --config <stock config> key=value...`:
the stock recipe and config, with overrides for the model, weights, tokenizer, data, steps and
logging. No recipe code is copied. With N = 1 the single-device recipe is used where torchtune
0.6.1 has one (QAT has none: `qat_distributed` runs with one process on a GPU).

- lora: lora_finetune_distributed / lora_finetune_single_device, llama3/8B_lora(_single_device)
- qlora: the same recipes, model qlora_llama3_8b; llama3/8B_lora / llama3/8B_qlora_single_device
- dpo: lora_dpo_distributed / lora_dpo_single_device, llama3_1/8B_lora_dpo(_single_device), with
  the Llama 3 model and the Meta-format checkpointer
- qat: qat_distributed, llama3/8B_qat_full
- full: full_finetune_distributed / full_finetune_single_device, llama3/8B_full(_single_device)

The metric logger is torchtune's DiskLogger with a wall-clock stamp per step
(`TimedDiskLogger`), so step times come out of the same log as tokens/s and peak memory.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multicard.data import llm as assets
from multicard.measure import energy
from multicard.plan import launch
from multicard.plan.params import Value

GIB = 1024**3


@dataclass(frozen=True)
class Method:
    distributed: str
    config: str
    single: str | None
    single_config: str | None
    lora: bool
    preference: bool = False
    quantize_base: bool = False


METHODS: dict[str, Method] = {
    "lora": Method("lora_finetune_distributed", "llama3/8B_lora", "lora_finetune_single_device",
                   "llama3/8B_lora_single_device", lora=True),
    "qlora": Method("lora_finetune_distributed", "llama3/8B_lora", "lora_finetune_single_device",
                    "llama3/8B_qlora_single_device", lora=True, quantize_base=True),
    "dpo": Method("lora_dpo_distributed", "llama3_1/8B_lora_dpo", "lora_dpo_single_device",
                  "llama3_1/8B_lora_dpo_single_device", lora=True, preference=True),
    "qat": Method("qat_distributed", "llama3/8B_qat_full", None, None, lora=False),
    "full": Method("full_finetune_distributed", "llama3/8B_full", "full_finetune_single_device",
                   "llama3/8B_full_single_device", lora=False),
}
DATASET_BUILDERS = {"gec": "torchtune.datasets.grammar_dataset",
                    "samsum": "torchtune.datasets.samsum_dataset"}


@dataclass(frozen=True)
class Assets:
    """Where a trial finds its inputs (resolved by the runner before the trial)."""

    checkpoint_dir: Path
    tokenizer: Path
    special_tokens: Path | None
    data_dir: Path


def recipe(settings: Mapping[str, Value]) -> tuple[str, str, int]:
    """(recipe, stock config, processes) for a config."""
    method = METHODS[str(settings["method"])]
    ranks = int(settings["gpus"])
    # one process on one node: the single-device recipe; across nodes only a distributed one runs
    if ranks == 1 and int(settings["nnodes"]) == 1 and method.single and method.single_config:
        return method.single, method.single_config, 1
    return method.distributed, method.config, ranks


def model_overrides(settings: Mapping[str, Value]) -> list[str]:
    method = METHODS[str(settings["method"])]
    model = str(settings["model"])
    builder, kwargs = assets.MODELS[model]
    if model == "llama3_8b":
        component = ("torchtune.models.llama3.qlora_llama3_8b" if method.quantize_base else
                     "torchtune.models.llama3.lora_llama3_8b" if method.lora else builder)
    else:  # the generic builders take the architecture as arguments
        component = "torchtune.models.llama3.lora_llama3" if method.lora else builder
    out = [f"model._component_={component}", *(f"model.{k}={v}" for k, v in kwargs.items())]
    if method.lora:
        out += [f"model.lora_rank={settings['lora_rank']}", f"model.lora_alpha={settings['lora_alpha']}"]
        if method.quantize_base and model != "llama3_8b":
            out.append("model.quantize_base=True")
    return out


def data_overrides(settings: Mapping[str, Value], data_dir: Path) -> list[str]:
    method = METHODS[str(settings["method"])]
    kind = str(settings["dataset"])
    if method.preference:  # pairs cannot be packed; max_seq_len truncates them instead
        return ["dataset._component_=torchtune.datasets.preference_dataset", "dataset.source=json",
                f"dataset.data_files={data_dir / f'{kind}_preference.json'}", "dataset.split=train"]
    return [f"dataset._component_={DATASET_BUILDERS[kind]}", "dataset.source=json",
            f"dataset.data_files={data_dir / f'{kind}.json'}", "dataset.split=train",
            f"dataset.packed={bool(settings['packed'])}"]


def overrides(settings: Mapping[str, Value], trial_dir: Path, found: Assets, trace: str) -> list[str]:
    """Every `key=value` the trial passes on top of the stock config."""
    method = METHODS[str(settings["method"])]
    cuda = settings["device"] == "cuda"
    out = [
        f"output_dir={trial_dir / 'out'}",
        "checkpointer._component_=torchtune.training.FullModelMetaCheckpointer",
        f"checkpointer.checkpoint_dir={found.checkpoint_dir}",
        "checkpointer.checkpoint_files=[consolidated.00.pth]",
        f"checkpointer.output_dir={trial_dir / 'out' / 'checkpoints'}",
        "checkpointer.model_type=LLAMA3",
        f"tokenizer.path={found.tokenizer}",
        f"tokenizer.max_seq_len={settings['seq_len']}",
        *model_overrides(settings),
        *data_overrides(settings, found.data_dir),
        f"batch_size={settings['batch_size']}",
        f"gradient_accumulation_steps={settings['gradient_accumulation_steps']}",
        "epochs=1", f"max_steps_per_epoch={settings['max_steps']}", f"seed={settings['seed']}",
        "metric_logger._component_=multicard.workloads.llm_logger.TimedDiskLogger",
        f"metric_logger.log_dir={trial_dir / 'logs'}", "log_every_n_steps=1",
        f"log_peak_memory_stats={cuda}", f"device={settings['device']}", f"dtype={settings['dtype']}",
        "compile=False", "resume_from_checkpoint=False",
    ]
    if found.special_tokens:
        out.append(f"tokenizer.special_tokens_path={found.special_tokens}")
    if method.lora:
        out.append("save_adapter_weights_only=True")  # no merged 16 GB copy per trial
    if str(settings["method"]) == "full" and recipe(settings)[0] == "full_finetune_single_device":
        # the stock single-device config uses bitsandbytes' PagedAdamW8bit; keep torch's AdamW
        out += ["optimizer._component_=torch.optim.AdamW", "optimizer_in_bwd=False"]
    if str(settings["method"]) == "qat" and settings["model"] != "llama3_8b":
        out.append("quantizer.groupsize=32")  # the toy model's 256-wide layers
    if trace == "torch":
        out += ["profiler.enabled=True", f"profiler.output_dir={trial_dir / 'profiling'}",
                f"profiler.cuda={cuda}", "profiler.wait_steps=2", "profiler.warmup_steps=1",
                "profiler.active_steps=3", "profiler.num_cycles=1"]
    return out


def argv(settings: Mapping[str, Value], trial_dir: Path, found: Assets, trace: str,
         rdzv: launch.Rendezvous | None = None) -> list[str]:
    name, config, ranks = recipe(settings)
    launcher = [sys.executable, "-m", "torchtune._cli.tune", "run"]
    if int(settings["nnodes"]) > 1:  # tune run passes these to torchrun
        if rdzv is None:
            raise ValueError("several nodes need a rendezvous (HOST:PORT and an id)")
        launcher += launch.rendezvous_flags(int(settings["nnodes"]), rdzv, "_")
    if ranks > 1 or name.endswith("distributed"):
        launcher.append(f"--nproc_per_node={ranks}")
    return [*launcher, name, "--config", config, *overrides(settings, trial_dir, found, trace)]


# --- results ---------------------------------------------------------------------------------

_STEP = re.compile(r"^Step (\d+) \| (.*)$")


def parse_metric_log(text: str) -> list[dict[str, float]]:
    """torchtune's DiskLogger lines `Step N | key:value key:value ...` -> one dict per step."""
    steps = []
    for line in text.splitlines():
        match = _STEP.match(line.strip())
        if not match:
            continue
        row: dict[str, float] = {"step": float(match.group(1))}
        for field in match.group(2).split():
            key, _, value = field.partition(":")
            try:
                row[key] = float(value)
            except ValueError:
                continue
        steps.append(row)
    return steps


def metrics(steps: list[dict[str, float]], warmup: int) -> dict[str, Any]:
    """docs/design.md LLM metrics from the logged steps, the first `warmup` steps left out.

    Step time is the gap between consecutive wall-clock stamps (one log line per step). Peak
    memory is the largest over all steps (warm-up included: that is the job's real peak).
    """
    measured = [s for s in steps if s["step"] > warmup]
    stamps = [s["wall_time"] for s in steps if "wall_time" in s]
    gaps = [b - a for a, b in itertools.pairwise(stamps)][max(0, warmup - 1):]
    tokens = [s["tokens_per_second_per_gpu"] for s in measured if "tokens_per_second_per_gpu" in s]

    def peak(key: str) -> int | None:
        values = [s[key] for s in steps if key in s]
        return int(max(values) * GIB) if values else None

    return {
        "steps": len(steps),
        "step_time_median_s": statistics.median(gaps) if gaps else None,
        "tokens_per_s_per_gpu": statistics.median(tokens) if tokens else None,
        "peak_mem_active_bytes": peak("peak_memory_active"),
        "peak_mem_reserved_bytes": peak("peak_memory_reserved"),
        "final_loss": measured[-1]["loss"] if measured and "loss" in measured[-1] else None,
    }


def collect(trial_dir: Path, settings: Mapping[str, Value]) -> dict[str, Any] | None:
    """The trial's result from its metric log (None when the recipe logged nothing)."""
    logs = sorted((trial_dir / "logs").glob("log_*.txt"))
    steps = [s for log in logs for s in parse_metric_log(log.read_text(errors="replace"))]
    if not steps:
        return None
    measured = metrics(steps, int(settings["warmup_steps"]))
    per_token, token_why = time_per_token(measured, settings)
    measured["time_per_token_s"] = per_token
    joules, why = step_energy(trial_dir, steps, int(settings["warmup_steps"]),
                              int(settings["gpus"]) * int(settings["nnodes"]))
    measured |= joules
    how = {"energy_j": "NVML counter, sampled by the runner"} if measured.get("energy_j") is not None else {}
    return {"metrics": measured, "unmeasured": unmeasured(measured, settings) | why | token_why,
            "measured_how": how,
            "steps_logged": len(steps), "logs": [p.name for p in logs],
            "random_weights": settings["weights"] == "random"}


def time_per_token(measured: Mapping[str, Any], settings: Mapping[str, Value]
                   ) -> tuple[float | None, dict[str, str]]:
    """Seconds per input token on one GPU: the positions of the sequences the trained model
    reads in a step, padding included, whatever the method. The recipes' own tokens/s cannot be
    compared across methods: the SFT recipes count label tokens (prompt and padding left out),
    the DPO recipes every position of the chosen and rejected sequences. A packed SFT step reads
    batch x seq_len x accumulation positions; a DPO step's positions are what its recipe counts
    (1 / its tokens/s); an unpacked SFT step's padded length is logged nowhere."""
    method = METHODS[str(settings["method"])]
    if method.preference:
        tokens = measured.get("tokens_per_s_per_gpu")
        if tokens:
            return 1.0 / tokens, {}
        return None, {"time_per_token_s": "the DPO recipe logged no tokens/s"}
    if not settings["packed"]:
        return None, {"time_per_token_s": "an unpacked SFT step's padded length is not logged "
                                          "(torchtune counts label tokens only): set packed = true"}
    step = measured.get("step_time_median_s")
    if step is None:
        return None, {"time_per_token_s": "too few logged steps after the warm-up steps"}
    positions = int(settings["batch_size"]) * int(settings["seq_len"]) * int(
        settings["gradient_accumulation_steps"])
    return step / positions, {}


def step_energy(trial_dir: Path, steps: list[dict[str, float]], warmup: int, world: int
                ) -> tuple[dict[str, float | None], dict[str, str]]:
    """GPU energy over the measured steps (from the end of the last warm-up step to the last
    step's stamp: the LLM trial's timed region) from the counter series the runner sampled, per
    token processed in it (tokens_per_second_per_gpu x step time x ranks), and the mean power."""
    keys = ("energy_j", "energy_per_token_j", "mean_power_w")
    try:
        sampled = json.loads((trial_dir / energy.SERIES_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return dict.fromkeys(keys), dict.fromkeys(keys, "no energy series was sampled")
    stamps = [s["wall_time"] for s in steps if "wall_time" in s]
    measured = [s for s in steps if s["step"] > warmup and "wall_time" in s]
    if not sampled["series"] or len(stamps) < 2 or not measured:
        why = sampled["reason"] or "too few logged steps after the warm-up steps"
        return dict.fromkeys(keys), dict.fromkeys(keys, why)
    start = stamps[max(0, warmup - 1)] if warmup else stamps[0]
    gaps = [b - a for a, b in itertools.pairwise(stamps)][max(0, warmup - 1):]
    tokens = sum(s.get("tokens_per_second_per_gpu", 0.0) * gap * world
                 for s, gap in zip(measured[-len(gaps):], gaps, strict=False))
    found = energy.energy_between([tuple(x) for x in sampled["series"]], start, stamps[-1])
    values = {"energy_j": found.joules, "energy_per_token_j": energy.per_unit(found.joules, tokens),
              "mean_power_w": energy.mean_power(found.joules, stamps[-1] - start)}
    why = found.reason or "the log counts no tokens in the measured steps"
    return values, {k: str(why) for k, v in values.items() if v is None}


def unmeasured(measured: Mapping[str, Any], settings: Mapping[str, Value]) -> dict[str, str]:
    """Why each null metric of the recipe's log is null."""
    reasons = {}
    for key in ("peak_mem_active_bytes", "peak_mem_reserved_bytes"):
        if measured.get(key) is None:
            reasons[key] = ("torchtune logs no device memory on CPU" if settings["device"] == "cpu"
                            else "the recipe's log has no peak memory fields")
    for key in ("step_time_median_s", "tokens_per_s_per_gpu", "final_loss"):
        if measured.get(key) is None:
            reasons[key] = "too few logged steps after the warm-up steps"
    return reasons
