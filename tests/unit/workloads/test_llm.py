"""LLM trials: command lines and overrides, the metric-log parser, assets, skip reasons."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multicard.data import llm as assets
from multicard.measure import devices, energy, numa
from multicard.plan import params
from multicard.workloads import llm, registry

ASSETS = llm.Assets(Path("/w/ckpt"), Path("/w/tok/tokenizer.model"), Path("/w/tok/special.json"),
                    Path("/w/data"))
ONE_NODE = numa.Topology(nodes=[numa.Node(0, [0, 1], 1000)])


def settings(**values: object) -> dict:
    return params.resolve("llm", values)  # type: ignore[arg-type]


def command(**values: object) -> list[str]:
    return llm.argv(settings(**values), Path("/t"), ASSETS, "none")


def test_single_device_recipes_for_one_process() -> None:
    argv = command(method="lora", gpus=1)
    assert argv[3:7] == ["run", "lora_finetune_single_device", "--config", "llama3/8B_lora_single_device"]
    assert "--nproc_per_node=1" not in argv


def test_distributed_recipes_for_several_processes_and_for_qat() -> None:
    argv = command(method="lora", gpus=4)
    assert argv[3:8] == ["run", "--nproc_per_node=4", "lora_finetune_distributed", "--config",
                         "llama3/8B_lora"]
    qat = command(method="qat", gpus=1)  # no single-device QAT recipe: one process, distributed
    assert qat[4:8] == ["--nproc_per_node=1", "qat_distributed", "--config", "llama3/8B_qat_full"]


def test_qlora_and_dpo_use_the_llama3_8b_models_and_meta_checkpoints() -> None:
    qlora = command(method="qlora", gpus=2)
    assert "model._component_=torchtune.models.llama3.qlora_llama3_8b" in qlora
    assert qlora[5:8] == ["lora_finetune_distributed", "--config", "llama3/8B_lora"]
    dpo = command(method="dpo", gpus=2, dataset="samsum")
    assert dpo[5:8] == ["lora_dpo_distributed", "--config", "llama3_1/8B_lora_dpo"]
    assert "model._component_=torchtune.models.llama3.lora_llama3_8b" in dpo
    assert "checkpointer._component_=torchtune.training.FullModelMetaCheckpointer" in dpo
    assert "dataset._component_=torchtune.datasets.preference_dataset" in dpo
    assert "dataset.data_files=/w/data/samsum_preference.json" in dpo
    assert not any(a.startswith("dataset.packed") for a in dpo)  # pairs are not packed


def test_common_overrides() -> None:
    argv = command(method="lora", seq_len=512, max_steps=7, seed=3, batch_size=4)
    expected = ["checkpointer.checkpoint_dir=/w/ckpt", "checkpointer.checkpoint_files=[consolidated.00.pth]",
                "tokenizer.path=/w/tok/tokenizer.model", "tokenizer.special_tokens_path=/w/tok/special.json",
                "tokenizer.max_seq_len=512", "dataset._component_=torchtune.datasets.grammar_dataset",
                "dataset.source=json", "dataset.data_files=/w/data/gec.json", "dataset.packed=True",
                "batch_size=4", "epochs=1", "max_steps_per_epoch=7", "seed=3", "log_every_n_steps=1",
                "metric_logger._component_=multicard.workloads.llm_logger.TimedDiskLogger",
                "metric_logger.log_dir=/t/logs", "save_adapter_weights_only=True", "device=cuda",
                "dtype=bf16", "log_peak_memory_stats=True"]
    assert all(e in argv for e in expected), [e for e in expected if e not in argv]


def test_tiny_model_and_method_specific_overrides() -> None:
    tiny_lora = command(method="qlora", model="tiny", gpus=1, device="cpu")
    assert "model._component_=torchtune.models.llama3.lora_llama3" in tiny_lora
    assert "model.embed_dim=256" in tiny_lora and "model.quantize_base=True" in tiny_lora
    full = command(method="full", model="tiny", gpus=1, device="cpu")
    assert "model._component_=torchtune.models.llama3.llama3" in full
    assert "optimizer._component_=torch.optim.AdamW" in full and "optimizer_in_bwd=False" in full
    assert not any(a.startswith("model.lora") for a in full)
    assert "quantizer.groupsize=32" in command(method="qat", model="tiny", gpus=2)
    traced = llm.argv(settings(), Path("/t"), ASSETS, "torch")
    assert "profiler.enabled=True" in traced and "profiler.output_dir=/t/profiling" in traced


def test_pin_memory_adds_the_start_up_hook() -> None:
    _, env = registry.llm_command(settings(pin_memory=True), Path("/t"), Path("/d"), registry.TrialLaunch())
    assert env["MULTICARD_PIN_MEMORY"] == "1"
    hook = Path(env["PYTHONPATH"].split(":")[0])
    assert (hook / "sitecustomize.py").is_file()
    assert registry.llm_command(settings(), Path("/t"), Path("/d"), registry.TrialLaunch())[1] == {}


def test_skip_reasons() -> None:
    cpu = settings(device="cpu", model="tiny")
    no_gpu = registry.Machine([], ONE_NODE, numactl=False)
    assert registry.llm_unrunnable(cpu, "none", no_gpu) is None
    assert registry.llm_unrunnable({**cpu, "method": "qat"}, "none", no_gpu)[0] == "NoSingleDeviceRecipe"  # type: ignore[index]
    assert registry.llm_unrunnable({**cpu, "gpus": 2}, "none", no_gpu)[0] == "NeedsGPUs"  # type: ignore[index]
    assert registry.llm_unrunnable(cpu, "nsys", no_gpu)[0] == "TraceNotSupported"  # type: ignore[index]
    v100 = registry.Machine([devices.GpuIdentity(0, "GPU-a", "0000:1b:00.0", "Tesla V100", (7, 0))],
                            ONE_NODE, numactl=False)
    assert registry.llm_unrunnable(settings(gpus=4), "none", v100)[0] == "NotEnoughGPUs"  # type: ignore[index]
    # the stock configs train in bf16, which a V100 cannot
    assert registry.llm_unrunnable(settings(), "none", v100) == (
        "BF16NotSupported", "bf16 needs compute capability >= 8.0 (Ampere); GPU 0 (Tesla V100) is 7.0")


MEMORY = "peak_memory_active:{a} peak_memory_alloc:{a} peak_memory_reserved:{r}"
LOG = "".join(
    f"Step {i} | loss:{loss} lr:3e-06 tokens_per_second_per_gpu:{tps} "
    + MEMORY.format(a=active, r=reserved) + f" wall_time:{wall}\n"
    for i, loss, tps, active, reserved, wall in [
        (1, 6.4, 100.0, 1.5, 2.0, 1000.0), (2, 6.3, 200.0, 1.5, 2.5, 1003.0),
        (3, 6.2, 400.0, 1.25, 2.0, 1004.0), (4, 6.1, 500.0, 1.0, 2.0, 1006.0)])


def test_metric_log_by_hand() -> None:
    steps = llm.parse_metric_log(LOG + "some other line\n")
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    result = llm.metrics(steps, warmup=2)
    # gaps after the warm-up: 1004-1003 = 1, 1006-1004 = 2 -> median 1.5; tokens/s of steps 3, 4
    assert result["step_time_median_s"] == 1.5
    assert result["tokens_per_s_per_gpu"] == 450.0
    assert result["peak_mem_active_bytes"] == int(1.5 * 2**30)
    assert result["peak_mem_reserved_bytes"] == int(2.5 * 2**30)
    assert (result["steps"], result["final_loss"]) == (4, 6.1)


def test_time_per_token_counts_every_position_the_model_reads_whatever_the_method() -> None:
    # packed SFT: 2 x 128 positions per step; DPO: its recipe counts chosen + rejected positions
    packed = settings(method="lora", batch_size=2, seq_len=128)
    assert llm.time_per_token({"step_time_median_s": 0.512}, packed) == (0.002, {})
    dpo = settings(method="dpo")
    assert llm.time_per_token({"tokens_per_s_per_gpu": 400.0, "step_time_median_s": 9.0}, dpo) == (0.0025, {})
    # the recipes' tokens/s differ in what they count: an unpacked SFT step is not comparable
    value, why = llm.time_per_token({"step_time_median_s": 0.5, "tokens_per_s_per_gpu": 1e3},
                                    settings(method="qlora", packed=False))
    assert value is None and "packed = true" in why["time_per_token_s"]
    assert "--config" in command(packed=False) and "dataset.packed=False" in command(packed=False)


def test_generated_tokenizer_round_trips_through_llama3_tokenizer(tmp_path: Path) -> None:
    from torchtune.models.llama3 import llama3_tokenizer

    model, special = assets.write_tokenizer(tmp_path)
    tokenizer = llama3_tokenizer(str(model), special_tokens_path=str(special))
    ids = tokenizer.encode("hello world")
    assert ids[0] == 256 and ids[-1] == 257 and max(ids) < 512
    assert tokenizer.decode(ids) == "hello world"


def test_synthetic_data_and_preference_pairs(tmp_path: Path) -> None:
    assets.generate_synthetic(tmp_path, count=8, seed=1)
    meta = json.loads((tmp_path / "dataset.json").read_text())
    assert meta["synthetic"] is True and "SYNTHETIC" in meta["note"]
    gec = json.loads((tmp_path / "gec.json").read_text())
    assert len(gec) == 8 and set(gec[0]) == {"input", "output"} and gec[0]["input"] != gec[0]["output"]
    pairs = json.loads((tmp_path / "gec_preference.json").read_text())
    assert pairs[0]["chosen"][1]["content"] == gec[0]["output"]
    assert pairs[0]["rejected"][1]["content"] == gec[0]["input"]
    assert pairs[0]["chosen"][0] == pairs[0]["rejected"][0]  # the same prompt
    assert assets.synthetic_records("samsum", 3, 1) == assets.synthetic_records("samsum", 3, 1)


def test_fetch_reads_through_the_datasets_library(tmp_path: Path) -> None:
    source = tmp_path / "src.json"
    source.write_text(json.dumps([{"input": f"bad {i}", "output": f"good {i}"} for i in range(5)]))
    samsum = tmp_path / "samsum.json"
    samsum.write_text(json.dumps([{"id": str(i), "dialogue": "A: hi", "summary": "greeting"}
                                  for i in range(5)]))
    out = assets.fetch(tmp_path / "real", rows=3, sources={"gec": str(source), "samsum": str(samsum)})
    assert len(json.loads((out / "gec.json").read_text())) == 3
    meta = json.loads((out / "dataset.json").read_text())
    assert meta["synthetic"] is False and len(meta["sha256"]) == 4
    with pytest.raises(Exception, match="has 5 records, 9 requested"):
        assets.fetch(tmp_path / "more", rows=9, sources={"gec": str(source), "samsum": str(samsum)})


def test_random_weights_load_through_the_recipes_checkpointer(tmp_path: Path) -> None:
    from torchtune.models.llama3 import llama3
    from torchtune.training import FullModelMetaCheckpointer

    directory = assets.random_checkpoint(tmp_path / "w", "tiny", seed=0)
    checkpointer = FullModelMetaCheckpointer(
        checkpoint_dir=str(directory), checkpoint_files=["consolidated.00.pth"],
        model_type="LLAMA3", output_dir=str(tmp_path / "out"))
    state = checkpointer.load_checkpoint()["model"]
    model = llama3(**assets.MODELS["tiny"][1])
    model.load_state_dict(state)  # strict: every key and shape of the architecture
    assert json.loads((directory / "weights.json").read_text())["init"] == "random"


def test_energy_per_token_comes_from_the_counter_over_the_measured_steps(tmp_path: Path) -> None:
    # 4 steps logged at wall times 10, 12, 14, 16 (each stamp ends its step); warm-up 1: steps
    # 2-4, from 10 to 16, 3 steps of 2 s at 1000 tokens/s/GPU on 2 GPUs = 12,000 tokens; at 250 W
    # in all, 1500 J
    steps = [{"step": float(i + 1), "wall_time": 10.0 + 2 * i, "tokens_per_second_per_gpu": 1000.0}
             for i in range(4)]
    series = [[t, int(250_000 * t)] for t in (9.0, 11.0, 13.0, 15.0, 17.0)]  # mJ, 250 W
    (tmp_path / energy.SERIES_FILE).write_text(json.dumps({"series": series, "reason": None}))
    values, why = llm.step_energy(tmp_path, steps, warmup=1, world=2)
    assert values["energy_j"] == pytest.approx(1500.0) and why == {}
    assert values["energy_per_token_j"] == pytest.approx(1500.0 / 12_000)
    assert values["mean_power_w"] == pytest.approx(250.0)
    (tmp_path / energy.SERIES_FILE).write_text(json.dumps({"series": [], "reason": "CPU run: no GPU"}))
    values, why = llm.step_energy(tmp_path, steps, warmup=1, world=2)
    assert values == {"energy_j": None, "energy_per_token_j": None, "mean_power_w": None}
    assert why == dict.fromkeys(values, "CPU run: no GPU")


def test_llm_steps_measured_over_less_than_5_s_have_no_energy_and_say_why_as_vision_does(
        tmp_path: Path) -> None:
    # warm-up 1: the measured steps run from 10.0 to 14.9 s, under the counter's 5 s
    steps = [{"step": float(i + 1), "wall_time": t, "tokens_per_second_per_gpu": 1000.0}
             for i, t in enumerate((10.0, 12.0, 14.9))]
    series = [[t, int(250_000 * t)] for t in (9.0, 11.0, 13.0, 15.0)]
    (tmp_path / energy.SERIES_FILE).write_text(json.dumps({"series": series, "reason": None}))
    values, why = llm.step_energy(tmp_path, steps, warmup=1, world=2)
    assert values == {"energy_j": None, "energy_per_token_j": None, "mean_power_w": None}  # never 0
    assert why == dict.fromkeys(values, energy.short_window(4.9))
    assert energy.short_window(4.9) == "a 4.900 s window is shorter than the 5 s the energy counter needs"
