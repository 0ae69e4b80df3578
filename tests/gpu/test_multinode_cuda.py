"""Two "nodes" of one GPU each on a machine with two GPUs: the planner's srun step (the stand-in,
tests/fixtures/wrappers/fake_srun.py) with NCCL, for the vision workload and for a torchtune
distributed recipe, whose logs global rank 0 (node 0) writes."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import pytest
import torch

from multicard.run import store
from tests.helpers import write_spec
from tests.integration.test_multinode import fake_slurm, planner

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")]


def endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_vision_trial_across_two_gpu_nodes(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, fixed={"device": "cuda", "gpus": 1, "image_size": 64, "epochs": 1,
                                       "max_steps": 10, "batch_size": 32, "train_subset": 2048,
                                       "test_subset": 256}, grid={"precision": ["fp32"]})
    done = planner(spec, tmp_path / "run", fake_slurm(tmp_path, gpus_per_node="1"), endpoint())
    assert done.returncode == 0, done.stderr
    [record] = store.read(tmp_path / "run" / "trials.jsonl")
    assert record["status"] == "ok", record["error"]


@pytest.mark.skipif(importlib.util.find_spec("torchtune") is None, reason="torchtune is not installed")
def test_an_llm_trial_across_two_gpu_nodes_is_recorded_from_rank_0s_logs(tmp_path: Path) -> None:
    # node 0 starts late: its agent is the second to come, which with c10d would give node 1
    # rank 0 and torchtune's logs; static ranks keep them on node 0, in the shared trial dir
    fixed = {"device": "cuda", "model": "tiny", "data": "synthetic", "dtype": "bf16", "seq_len": 64,
             "max_steps": 5, "warmup_steps": 1, "gpus": 1}
    spec = write_spec(tmp_path, name="llm2", experiment_workload="llm", fixed=fixed,
                      grid={"method": ["lora"]}, trials={"count": 1, "timeout_s": 900})
    env = fake_slurm(tmp_path, gpus_per_node="1", late="0:10") | \
        {"MULTICARD_CACHE_DIR": str(tmp_path / "cache")}
    done = planner(spec, tmp_path / "run", env, endpoint())
    assert done.returncode == 0, done.stderr
    [record] = store.read(tmp_path / "run" / "trials.jsonl")
    assert record["status"] == "ok", record["error"]
    assert record["metrics"]["steps"] == 5 and record["metrics"]["tokens_per_s_per_gpu"] > 0
