"""Two "nodes" on 127.0.0.1: two runners, one torchrun each, meeting at a c10d rendezvous."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from multicard import store
from tests.helpers import ROOT, TINY_FIXED, write_spec

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_one_vision_trial_across_two_nodes(tmp_path: Path) -> None:
    path = write_spec(tmp_path, fixed={**TINY_FIXED, "gpus": 1}, grid={"precision": ["fp32"]})
    out = tmp_path / "run"
    endpoint = f"127.0.0.1:{free_port()}"

    def node(rank: int) -> subprocess.Popen[str]:
        argv = [sys.executable, "-m", "multicard", "run", str(path), "--nnodes", "2",
                "--rdzv-endpoint", endpoint, "--node-rank", str(rank), "--out", str(out)]
        return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

    nodes = [node(0), node(1)]
    outputs = [p.communicate(timeout=300)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outputs
    [record] = store.read(out / "trials.jsonl")
    assert record["status"] == "ok", record["error"]
    assert record["config_id"] == store.read(out / "nodes" / "node1" / "trials.jsonl")[0]["config_id"]
    result = json.loads(next(out.glob("raw/*/result.json")).read_text())
    assert result["world_size"] == 2
    assert len({r["pid"] for r in result["ranks"]}) == 2
    launch = json.loads(next(out.glob("raw/*/launch.json")).read_text())
    assert "--nnodes=2" in launch["argv"] and f"--rdzv-endpoint={endpoint}" in launch["argv"]
    # 2 ranks x 3 steps x 8 images x 2 epochs
    assert record["metrics"]["throughput_samples_s"] * record["metrics"]["train_time_s"] == \
        pytest.approx(96)


def test_several_nodes_need_an_endpoint_and_a_shared_out(tmp_path: Path) -> None:
    path = write_spec(tmp_path)
    for extra in (["--out", str(tmp_path / "o")], []):
        result = subprocess.run([sys.executable, "-m", "multicard", "run", str(path), "--nnodes", "2",
                                 *extra], cwd=ROOT, capture_output=True, text=True)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
