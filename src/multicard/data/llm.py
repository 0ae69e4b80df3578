"""Assets of the LLM experiments: tokenizer, datasets and model weights, all local files.

- Tokenizer: the real Llama 3 `tokenizer.model` when given; otherwise a generated one: a tiktoken
  BPE of the 256 byte values (no merges) plus the special tokens Llama3Tokenizer needs, ids
  256-268. Packing to a fixed sequence length makes tokens per step independent of it.
- Datasets, read by torchtune's own builders with `source="json"`: GEC (`grammar_dataset`,
  fields input/output) and SAMSum (`samsum_dataset`, id/dialogue/summary). DPO needs preference
  pairs and the paper does not name its dataset; it runs "on the same templates" as LoRA, so the
  pairs are built from the same records: chosen = the reference answer (corrected sentence,
  reference summary), rejected = the unedited input (the erroneous sentence, the dialogue's first
  line). `generate_synthetic` writes small synthetic versions (labelled so in dataset.json);
  `fetch` downloads the real datasets on a networked machine.
- Weights: a local Meta-format checkpoint (`consolidated.00.pth`, as `tune download` leaves it),
  or `random`: the exact architecture, randomly initialised with a seed and saved in the same
  format. Random weights give valid time and memory and a meaningless loss.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from multicard import integrity
from multicard.errors import InputError

SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                  "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                  "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                  "<|python_tag|>", "<|image|>", "<|video|>")
# Architectures: torchtune builder and keyword arguments. `tiny` is the Llama 3 architecture at
# toy size; its linear layers are multiples of the NF4 block (64 x 256) so QLoRA can quantise them.
MODELS: dict[str, tuple[str, dict[str, int]]] = {
    "llama3_8b": ("torchtune.models.llama3.llama3_8b", {}),
    "tiny": ("torchtune.models.llama3.llama3", {
        "vocab_size": 512, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 256,
        "max_seq_len": 512, "intermediate_dim": 512}),
}
DATASETS = ("gec", "samsum")
REAL_SOURCES = {"gec": "liweili/c4_200m", "samsum": "Samsung/samsum"}
_WORDS = ("the", "cat", "sat", "on", "a", "mat", "while", "we", "read", "an", "old", "book",
          "about", "small", "red", "boats", "and", "green", "hills", "near", "river", "town",
          "where", "people", "walk", "every", "day", "to", "see", "friends")


def write_tokenizer(directory: Path) -> tuple[Path, Path]:
    """A byte-level tiktoken file and the special-tokens JSON that Llama3Tokenizer reads."""
    directory.mkdir(parents=True, exist_ok=True)
    model, special = directory / "tokenizer.model", directory / "special_tokens.json"
    integrity.write_text_atomic(model, "".join(f"{base64.b64encode(bytes([i])).decode()} {i}\n"
                                               for i in range(256)))
    integrity.write_text_atomic(special, json.dumps({"added_tokens": [
        {"id": 256 + i, "content": name} for i, name in enumerate(SPECIAL_TOKENS)]}))
    return model, special


# --- datasets --------------------------------------------------------------------------------

def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 16))).capitalize() + "."


def _corrupt(sentence: str, rng: random.Random) -> str:
    words = sentence.rstrip(".").split()
    i = rng.randrange(len(words) - 1)
    words[i], words[i + 1] = words[i + 1], words[i]
    return " ".join(words).lower()


def synthetic_records(kind: str, count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(f"{kind}:{seed}")
    if kind == "gec":
        rows = []
        for _ in range(count):
            sentence = _sentence(rng)
            rows.append({"input": _corrupt(sentence, rng), "output": sentence})
        return rows
    rows = []
    for i in range(count):
        lines = [f"{rng.choice(['Ann', 'Bob', 'Eve'])}: {_sentence(rng)}" for _ in range(rng.randint(3, 6))]
        rows.append({"id": f"synthetic-{i}", "dialogue": "\n".join(lines), "summary": _sentence(rng)})
    return rows


def preference_pairs(kind: str, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """DPO pairs on the same template: chosen = the reference answer, rejected = the unedited input."""
    pairs = []
    for r in records:
        if kind == "gec":
            prompt = f"Correct this to standard English: {r['input']}\n---\nCorrected: "
            good, bad = r["output"], r["input"]
        else:
            prompt = f"Summarize this dialogue:\n{r['dialogue']}\n---\nSummary:\n"
            good, bad = r["summary"], r["dialogue"].split("\n", 1)[0]
        user = {"role": "user", "content": prompt}
        pairs.append({"chosen": [user, {"role": "assistant", "content": good}],
                      "rejected": [user, {"role": "assistant", "content": bad}]})
    return pairs


def _write_json(path: Path, rows: list[dict[str, Any]]) -> str:
    data = json.dumps(rows, indent=0).encode()
    integrity.write_bytes_atomic(path, data)
    return hashlib.sha256(data).hexdigest()


def write_datasets(directory: Path, records: dict[str, list[dict[str, Any]]],
                   description: dict[str, Any]) -> Path:
    """<kind>.json and <kind>_preference.json for every kind, plus dataset.json with checksums."""
    directory.mkdir(parents=True, exist_ok=True)
    sums = {}
    for kind, rows in records.items():
        sums[f"{kind}.json"] = _write_json(directory / f"{kind}.json", rows)
        sums[f"{kind}_preference.json"] = _write_json(directory / f"{kind}_preference.json",
                                                      preference_pairs(kind, rows))
    integrity.write_text_atomic(directory / "dataset.json",
                                json.dumps({**description, "sha256": sums}, indent=1))
    return directory


def generate_synthetic(directory: Path, count: int = 512, seed: int = 0) -> Path:
    if (directory / "dataset.json").exists():
        return directory
    records = {kind: synthetic_records(kind, count, seed) for kind in DATASETS}
    return write_datasets(directory, records, {
        "synthetic": True, "records": count, "seed": seed,
        "note": "SYNTHETIC: generated word salad for tests and smoke runs, not GEC or SAMSum"})


def fetch(directory: Path, rows: int, sources: dict[str, str] | None = None,
          load: Callable[..., Any] | None = None) -> Path:
    """Download the first `rows` records of the real GEC and SAMSum datasets into local JSON.

    `sources` maps kind -> a Hugging Face dataset id (default REAL_SOURCES) or a local file that
    `datasets` can read; torchtune's own column names are kept (c4_200m: input/output).
    """
    if load is None:
        from datasets import load_dataset as load
    records = {}
    for kind in DATASETS:
        source = (sources or REAL_SOURCES)[kind]
        local = Path(source).suffix in (".json", ".jsonl")
        stream = load("json", data_files=source, split="train", streaming=True) if local else \
            load(source, split="train", streaming=True)
        records[kind] = [dict(row) for _, row in zip(range(rows), stream, strict=False)]
        if len(records[kind]) < rows:
            raise InputError(f"{source}: has {len(records[kind])} records, {rows} requested")
    return write_datasets(directory, records, {"synthetic": False, "records": rows,
                                               "sources": sources or REAL_SOURCES})


# --- weights ---------------------------------------------------------------------------------

def random_checkpoint(directory: Path, model: str, seed: int) -> Path:
    """`consolidated.00.pth` of `model` randomly initialised with `seed`, in Meta's format (what
    FullModelMetaCheckpointer reads, as for a downloaded Llama 3 checkpoint)."""
    target = directory / "consolidated.00.pth"
    if target.exists():
        return directory
    import torch
    from torchtune.config._utils import _get_component_from_path
    from torchtune.models import convert_weights

    builder, kwargs = MODELS[model]
    torch.manual_seed(seed)
    with torch.device("cpu"):
        module = _get_component_from_path(builder)(**kwargs).to(torch.bfloat16)
    state = convert_weights.tune_to_meta(module.state_dict())
    directory.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=directory, prefix=".consolidated.00.pth.", suffix=".tmp")
    os.close(handle)
    partial = Path(name)  # a name of its own: two writers never share a partial file
    try:
        torch.save(state, partial)
        partial.replace(target)  # complete files only: an interrupted save leaves no checkpoint
    finally:
        partial.unlink(missing_ok=True)
    integrity.write_text_atomic(directory / "weights.json", json.dumps(
        {"model": model, "builder": builder, "kwargs": kwargs, "init": "random", "seed": seed,
         "note": "random weights: valid time and memory, meaningless loss"}, indent=1))
    return directory
