"""What the preflight makes of what the nodes left (the step itself runs in
tests/integration/test_multinode.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from multicard.run import cluster, preflight


def node_left(step: Path, node: int, returncode: int = 0, **said: Any) -> None:
    where = cluster.node_dir(step, node)
    where.mkdir(parents=True)
    (where / cluster.NODE_JSON).write_text(json.dumps({"node": node, "host": f"n{node}",
                                                       "returncode": returncode}))
    seen = {"node": node, "host": f"n{node}", "multicard": "1.0", "gpus": ["H100"] * 4,
            "paths": {"/data": True}, "all_reduce": 36.0, "expected": 36.0} | said
    (step / f"preflight-node{node}.json").write_text(json.dumps(seen))


def test_nodes_that_agree_pass(tmp_path: Path) -> None:
    node_left(tmp_path, 0)
    node_left(tmp_path, 1)
    assert preflight.problems(tmp_path, 2, 4, 0, False, "", {}, version="1.0") == []


def test_each_way_a_node_can_differ_is_named(tmp_path: Path) -> None:
    node_left(tmp_path, 0)
    node_left(tmp_path, 1, gpus=["H200"] * 2, paths={"/data": False}, multicard="0.9", all_reduce=30.0)
    found = preflight.problems(tmp_path, 2, 4, 0, False, "", {}, version="1.0")
    assert found == [
        "node 1 (n1) does not see /data: bind it into the image at the same path",
        "node 1 (n1) runs multicard 0.9, the planner 1.0: install the same on both",
        "node 1 (n1): all_reduce gave 30.0, expected 36.0",
        "node 1 (n1) sees 2 GPU(s), the trials need 4",
        "the nodes' GPUs differ: H100, H200"]


def test_a_node_that_failed_or_never_started_comes_first(tmp_path: Path) -> None:
    said = "x\nmulticard.run.node_step: error: bad endpoint\n"
    node_left(tmp_path, 0, returncode=2)
    found = preflight.problems(tmp_path, 3, 0, 1, False, "", {0: said}, version="1.0")
    assert found[:3] == ["node 1 never started its part", "node 2 never started its part",
                         "node 0 (n0): its part ended with status 2: multicard.run.node_step: error: "
                         "bad endpoint"]
    assert "node 2 wrote no preflight-node2.json" in found
    srun = "srun: error: Unable to create step\n"
    assert preflight.problems(tmp_path / "none", 2, 0, 1, False, srun, {}) == [
        "no node started its part: the launcher exited with status 1: srun: error: Unable to create step"]
