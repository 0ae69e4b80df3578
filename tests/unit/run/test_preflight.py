"""What the preflight makes of what the nodes left (the step itself runs in
tests/integration/test_multinode.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

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


def test_a_node_whose_step_is_bound_to_fewer_cpus_than_the_job_holds_is_named(tmp_path: Path) -> None:
    node_left(tmp_path, 0, cpus=64)
    node_left(tmp_path, 1, cpus=1)  # a step with --exact and no --cpus-per-task on Slurm 23.11
    found = preflight.problems(tmp_path, 2, 4, 0, False, "", {}, version="1.0", cpus_per_node=64)
    assert found == ["node 1 (n1): the step is bound to 1 CPU(s) of the 64 the job holds there "
                     "(srun --cpus-per-task)"]
    assert preflight.problems(tmp_path, 2, 4, 0, False, "", {}, version="1.0") == []  # no job CPUs


def test_a_node_whose_image_was_built_from_another_commit_is_named(tmp_path: Path) -> None:
    # every commit is multicard 0.1.0: the version alone cannot tell a stale image
    node_left(tmp_path, 0, commit="a" * 40)
    node_left(tmp_path, 1, commit="b" * 40)
    node_left(tmp_path, 2, commit=None)  # an image built without GIT_SHA: nothing to compare
    found = preflight.problems(tmp_path, 3, 4, 0, False, "", {}, version="1.0", commit="a" * 40)
    assert found == ["node 1 (n1) runs multicard of commit bbbbbbbbbbbb, the planner of aaaaaaaaaaaa: "
                     "rebuild the image from this checkout"]


def test_the_source_commit_is_a_multicard_checkout_s_and_an_image_s_unknown_is_none(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from multicard.measure import environment

    assert environment.source_commit() == environment._git()["sha"]  # this checkout
    monkeypatch.setattr(environment, "_git", lambda source=None: {"sha": "unknown", "dirty": None})
    monkeypatch.setenv("MULTICARD_GIT_SHA", "unknown")  # an image built without GIT_SHA
    assert environment.source_commit() is None
    monkeypatch.setenv("MULTICARD_GIT_SHA", "c" * 40)
    assert environment.source_commit() == "c" * 40


def test_a_node_whose_clock_is_off_the_planner_s_is_named(tmp_path: Path) -> None:
    # the step ran from 1000 to 1010 on the planner's clock; node 1 read 1095 while in it
    node_left(tmp_path, 0, clock_unix=1004.0)
    node_left(tmp_path, 1, clock_unix=1095.0)
    found = preflight.problems(tmp_path, 2, 4, 0, False, "", {}, version="1.0", step_unix=(1000.0, 1010.0))
    assert found == ["node 1 (n1): its clock is at least 85 s off the planner's (over 20 s): naming a "
                     "hung node and the node that failed first compares the nodes' clocks; "
                     "synchronize them (NTP, chrony)"]
    # within the span and its margin, or no reading (an older image): nothing said
    (tmp_path / "later").mkdir()
    node_left(tmp_path / "later", 0, clock_unix=1025.0)
    node_left(tmp_path / "later", 1)
    assert preflight.problems(tmp_path / "later", 2, 4, 0, False, "", {}, version="1.0",
                              step_unix=(1000.0, 1010.0)) == []
