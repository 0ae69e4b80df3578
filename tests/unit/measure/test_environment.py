from __future__ import annotations

import json
from pathlib import Path

from multicard.measure import environment


def test_env_capture_has_the_fields_reviewers_need(tmp_path: Path) -> None:
    env = environment.capture_env(tmp_path)
    json.dumps(env)  # serialisable
    assert env["python"].count(".") == 2
    assert env["cpu"]["logical_cpus"] >= 1
    assert env["topology"]["nodes"] and env["topology"]["nodes"][0]["cpus"]
    assert env["storage"]["fstype"]
    assert isinstance(env["gpus"], list)
    assert "multicard" in env["packages"]


def test_env_records_the_network_nccl_uses_and_the_slurm_allocation(monkeypatch) -> None:
    for key, value in {"NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_HCA": "mlx5_0", "SLURM_JOB_NUM_NODES": "2",
                       "SLURM_GPUS_PER_NODE": "4", "SLURM_CPUS_PER_TASK": "32"}.items():
        monkeypatch.setenv(key, value)
    recorded = environment.capture_env()["env"]
    assert (recorded["NCCL_SOCKET_IFNAME"], recorded["NCCL_IB_HCA"]) == ("ib0", "mlx5_0")
    assert (recorded["SLURM_JOB_NUM_NODES"], recorded["SLURM_GPUS_PER_NODE"],
            recorded["SLURM_CPUS_PER_TASK"]) == ("2", "4", "32")


def test_env_json_says_which_nvml_bindings_ran_and_whether_torchaos_ops_loaded() -> None:
    found = environment.torchao_ops()
    assert set(found) == {"loaded", "why"}
    assert (found["loaded"] is True) == (found["why"] is None)  # a failure always says why
    env = environment.capture_env()
    assert env["torchao_ops"] == found and env["nvml_bindings"].startswith("nvidia-ml-py ")
    assert {"image_created", "base_digest"} <= set(env["container"])
