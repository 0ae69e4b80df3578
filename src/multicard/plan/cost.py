"""A simple per-config cost model: estimated seconds of one vision trial.

    trial_s = launch_s + warmup + epochs * (steps * step_s + epoch_pause_s) + eval_s
    step_s  = step_overhead_s + batch * (image_size / 224)^2 / (throughput_224 / ranks_sharing)
    eval_s  = test images per rank * (image_size / 224)^2 / (3 * throughput_224 / ranks_sharing)

MobileNetV2's FLOPs grow with the pixel count, hence the (size/224)^2 factor. Forward-only
evaluation costs about a third of a training step. `throughput_224` is training images/s per rank
at 224x224. The CPU numbers were measured on the 2-core development machine (batch 16 at 32x32,
scaled); CPU ranks on one node share its cores. The CUDA numbers are estimates for one H100 and
are marked as such wherever they are shown; replace them once a run has measured them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from multicard.data.mnist import MNIST_TEST, MNIST_TRAIN
from multicard.plan.params import Value

REFERENCE_SIZE = 224
THROUGHPUT_224: dict[str, dict[str, float]] = {
    "cpu": {"fp64": 1.9, "fp32": 6.0, "tf32": 6.0, "fp16": 0.58, "bf16": 5.3},
    "cuda": {"fp64": 700.0, "fp32": 1100.0, "tf32": 1800.0, "fp16": 2600.0, "bf16": 2600.0},
}
STEP_OVERHEAD_S = {"cpu": 0.04, "cuda": 0.005}
EPOCH_PAUSE_S = {"cpu": 0.5, "cuda": 1.0}
LAUNCH_S = {"cpu": 6.0, "cuda": 25.0}  # cpu: measured by benchmarks/harness_overhead.py


def vision_images(settings: Mapping[str, Value]) -> float:
    """Images a vision trial trains on (or loads) in its timed epochs, over all ranks."""
    ranks = int(settings["gpus"]) * int(settings["nnodes"])
    train_n = int(settings["train_subset"]) or MNIST_TRAIN
    per_epoch = train_n if not int(settings["max_steps"]) else \
        min(train_n, int(settings["max_steps"]) * int(settings["batch_size"]) * ranks)
    return int(settings["epochs"]) * per_epoch


def _rank_rate(settings: Mapping[str, Value]) -> float:
    """Training images/s of one rank at this precision and size's pixel count (224 px based)."""
    device = str(settings["device"])
    sharing = int(settings["gpus"]) if device == "cpu" else 1
    pixels = (int(settings["image_size"]) / REFERENCE_SIZE) ** 2
    return THROUGHPUT_224[device][str(settings["precision"])] / sharing / pixels


def vision_step_seconds(settings: Mapping[str, Value]) -> float:
    """One training step of one rank: the per-step overhead and the batch at the rank's rate."""
    return STEP_OVERHEAD_S[str(settings["device"])] + int(settings["batch_size"]) / _rank_rate(settings)


def full_batches(train_subset: int, batch_size: int, ranks: int) -> int:
    """Full batches per rank in one epoch of the training set (or its subset): where an epoch
    of `max_steps` steps ends at most."""
    return (train_subset or MNIST_TRAIN) // (batch_size * ranks)


def steps_over_epochs(total: int, epochs: int, per_epoch: int) -> tuple[int, int]:
    """(epochs, max_steps) for at least `total` steps: `epochs` at the least, more where one
    epoch cannot hold its share of them (`per_epoch`: full_batches)."""
    epochs = max(epochs, math.ceil(total / max(1, per_epoch)))
    return epochs, math.ceil(total / epochs)


def vision_trial_seconds(settings: Mapping[str, Value]) -> float:
    device = str(settings["device"])
    ranks = int(settings["gpus"]) * int(settings["nnodes"])
    batch = int(settings["batch_size"])
    train_n = int(settings["train_subset"]) or MNIST_TRAIN
    steps = math.ceil(train_n / (batch * ranks))
    if int(settings["max_steps"]):  # each epoch draws max_steps x batch x ranks images
        steps = min(steps, int(settings["max_steps"]))
    if settings["mode"] == "loader_only":  # no model: only the per-step overhead is modelled
        return LAUNCH_S[device] + int(settings["epochs"]) * steps * STEP_OVERHEAD_S[device]
    step_s = vision_step_seconds(settings)
    test_per_rank = (int(settings["test_subset"]) or MNIST_TEST) / ranks
    eval_s = test_per_rank / (3 * _rank_rate(settings))
    epochs = int(settings["epochs"])
    warmup = int(settings["warmup_steps"]) * step_s
    return LAUNCH_S[device] + warmup + epochs * (steps * step_s + EPOCH_PAUSE_S[device]) + eval_s


# LLM: training tokens/s per GPU, estimated for Llama3-8B in bf16 on one H100 (LoRA from public
# torchtune benchmarks, the others scaled by their extra work); the tiny CPU model as measured here.
LLM_TOKENS_PER_S = {
    ("cuda", "llama3_8b"): {"lora": 3000.0, "qlora": 2200.0, "dpo": 1500.0, "full": 2000.0, "qat": 1200.0},
    ("cpu", "tiny"): {"lora": 900.0, "qlora": 600.0, "dpo": 500.0, "full": 800.0, "qat": 400.0},
}
LLM_START_S = {("cuda", "llama3_8b"): 120.0, ("cpu", "tiny"): 8.0}  # imports, 16 GB load, packing


def llm_trial_seconds(settings: Mapping[str, Value]) -> float:
    key = (str(settings["device"]), str(settings["model"]))
    rates = LLM_TOKENS_PER_S.get(key, LLM_TOKENS_PER_S[("cuda", "llama3_8b")])
    tokens = int(settings["batch_size"]) * int(settings["seq_len"]) * int(
        settings["gradient_accumulation_steps"])
    return LLM_START_S.get(key, 120.0) + int(settings["max_steps"]) * tokens / rates[str(settings["method"])]


def device_seconds(wall_s: float, settings: Mapping[str, Value]) -> float:
    """What a launch of `wall_s` occupies: every process of every node (GPUs on cuda, ranks on cpu)."""
    return wall_s * int(settings.get("gpus", 1)) * int(settings.get("nnodes", 1))


def device_unit(device: str) -> str:
    return "GPU-hours" if device == "cuda" else "rank-hours (CPU)"


def trial_seconds(workload: str, settings: Mapping[str, Value]) -> float:
    return TRIAL_COST[workload](settings)


TRIAL_COST = {"vision": vision_trial_seconds, "llm": llm_trial_seconds}
