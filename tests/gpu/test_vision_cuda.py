"""The vision workload on a real GPU: nccl, CUDA-event timings, pinned copies, NVML utilisation."""

from __future__ import annotations

from pathlib import Path

import pytest

from multicard import runner, spec, store
from tests.helpers import DATA, write_spec

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_one_gpu_trial_measures_copies_utilisation_and_keeps_tf32_off(tmp_path: Path) -> None:
    fixed = {"device": "cuda", "image_size": 64, "epochs": 2, "max_steps": 20, "batch_size": 32,
             "num_workers": 2, "pin_memory": True, "train_subset": 4096, "test_subset": 512}
    path = write_spec(tmp_path, fixed=fixed, grid={"precision": ["fp32", "fp16"]})
    outcome = runner.run(spec.load(path), tmp_path / "run", data_dir=DATA, echo=lambda _: None)
    assert outcome.ok == 2
    for record in store.read(tmp_path / "run" / "trials.jsonl"):
        m = record["metrics"]
        assert m["h2d_time_s"] > 0
        assert 0 < m["gpu_util_mean"] <= 1
        assert m["peak_mem_bytes"] > 0
        assert sum(m["epoch_time_s"]) == pytest.approx(m["train_time_s"], rel=0.05, abs=0.05)
