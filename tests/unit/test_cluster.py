from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multicard import cluster, launch
from multicard.errors import InputError
from tests.helpers import ROOT


def test_srun_steps_run_one_node_part_per_node(tmp_path: Path) -> None:
    launcher = cluster.Launcher(("srun",), "SLURM_NODEID", ("apptainer", "exec", "x.sif"))
    argv = cluster.step_argv(launcher, 3, tmp_path / "t", 4, {"B": "2", "A": "1"}, ["torchrun", "x"])
    assert argv[:7] == ["srun", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--relative=0",
                        "--kill-on-bad-exit=1", "--label"]
    assert argv[7:10] == ["apptainer", "exec", "x.sif"]
    assert argv[10:] == [sys.executable, "-m", "multicard.node_step", "--nnodes", "3",
                        "--node-rank-env", "SLURM_NODEID", "--dir", str(tmp_path / "t"),
                        "--ranks-per-node", "4", "--env", "A=1", "--env", "B=2", "--", "torchrun", "x"]


def test_another_launcher_is_used_as_given() -> None:
    launcher = cluster.make_launcher("true -np {nnodes}", "OMPI_COMM_WORLD_RANK", "'a b' c", 3, {})
    assert launcher == cluster.Launcher(("true", "-np", "{nnodes}"), "OMPI_COMM_WORLD_RANK", ("a b", "c"))
    assert cluster.step_argv(launcher, 3, Path("t"), 1, {}, ["x"])[:5] == ["true", "-np", "3", "a b", "c"]


def test_every_node_sets_the_page_cache_it_is_given(tmp_path: Path) -> None:
    launcher = cluster.Launcher(("srun",), "SLURM_NODEID")
    argv = cluster.step_argv(launcher, 2, tmp_path, 1, {}, ["x"], ("cold", tmp_path / "tree"))
    assert argv[argv.index("--page-cache"):argv.index("--")] == [
        "--page-cache", "cold", "--page-cache-tree", str(tmp_path / "tree")]


def test_srun_reads_its_node_index_from_slurm_nodeid(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "srun").write_text("#!/bin/sh\n")
    (tmp_path / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    job = {"SLURM_JOB_ID": "5", "SLURM_JOB_NUM_NODES": "2"}
    assert cluster.make_launcher("srun", None, None, 2, job).node_rank_env == "SLURM_NODEID"
    with pytest.raises(InputError, match="not inside a Slurm allocation"):
        cluster.make_launcher("srun", None, None, 2, {})  # srun would queue a job per trial
    with pytest.raises(InputError, match="--nnodes 3: the Slurm job has 2 node"):
        cluster.make_launcher("srun", None, None, 3, job)


def test_a_custom_launcher_must_say_where_the_node_index_is() -> None:
    with pytest.raises(InputError, match="give --node-rank-env"):
        cluster.make_launcher("true", None, None, 2, {})


@pytest.mark.parametrize(("value", "message"), [
    (None, "is not set"), ("", "expected a node index"), ("-1", "expected a node index"),
    ("1.0", "expected a node index"), ("2", "expected 0 <= index < nnodes (2), got 2")])
def test_node_rank_is_checked(value: str | None, message: str) -> None:
    env = {} if value is None else {"SLURM_NODEID": value}
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        cluster.node_rank(env, "SLURM_NODEID", 2)
    assert cluster.node_rank({"SLURM_NODEID": "1"}, "SLURM_NODEID", 2) == 1


def test_rendezvous_ids_differ_by_run_trial_and_attempt(tmp_path: Path) -> None:
    ids = {cluster.rendezvous_id(out, "t2", key, attempt)
           for out in (tmp_path / "a", tmp_path / "b") for key in ("c-t0-none", "c-t1-none")
           for attempt in (0, 1)}
    assert len(ids) == 8
    assert cluster.rendezvous_id(tmp_path / "a", "t2", "k", 0) == \
        cluster.rendezvous_id(tmp_path / "x" / ".." / "a", "t2", "k", 0)  # the same run resumed


def write_node(trial: Path, node: int, **fields: object) -> None:
    where = cluster.node_dir(trial, node)
    where.mkdir(parents=True)
    (where / cluster.NODE_JSON).write_text(json.dumps({"node": node, "host": f"n{node}", **fields}))


def test_a_node_killed_mid_trial_is_named_not_the_nodes_it_took_down(tmp_path: Path) -> None:
    write_node(tmp_path, 0, returncode=1)  # its ranks lost their peer
    write_node(tmp_path, 1)  # killed: no exit status
    reports = cluster.node_reports(tmp_path, 3)
    assert reports[2] == {"node": 2, "started": False}
    assert cluster.lost_nodes(reports) == {"type": "NodeLost", "message": (
        "node 1 (n1) ended without an exit status (its part was killed: the node died, or the "
        "launcher ended it); node 2 never started its part")}
    assert cluster.stderr_order(reports) == [0, 1, 2]


def test_failed_nodes_are_named_for_the_message(tmp_path: Path) -> None:
    write_node(tmp_path, 0, returncode=0)
    write_node(tmp_path, 1, returncode=137)
    reports = cluster.node_reports(tmp_path, 2)
    assert cluster.lost_nodes(reports) is None  # a failure is classified from its stderr
    assert cluster.failed_nodes(reports) == "node 1 (n1): torchrun exit status 137"
    assert cluster.stderr_order(reports) == [1, 0]


def node_step(tmp_path: Path, command: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "multicard.node_step", "--nnodes", "2", "--node-rank-env",
            "MY_NODE", "--dir", str(tmp_path), "--ranks-per-node", "2", "--env", "EXTRA=yes",
            "--", *command]
    return subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **env}, text=True)


def test_a_node_step_fills_its_rank_and_records_its_part(tmp_path: Path) -> None:
    show = ("import os, sys; print(sys.argv[1], os.environ['EXTRA'], os.environ['OMP_NUM_THREADS'],"
            " os.environ['CUDA_DEVICE_ORDER'], os.environ['MULTICARD_NODE']); sys.exit(3)")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | {"MY_NODE": "1"}
    proc = node_step(tmp_path, [sys.executable, "-c", show, f"--node-rank={launch.NODE_RANK_SLOT}"], env)
    assert proc.wait(timeout=60) == 3
    part = cluster.node_dir(tmp_path, 1)
    threads = max(1, launch.allocated_cpus() // 2)
    assert (part / "stdout.log").read_text().split() == ["--node-rank=1", "yes", str(threads),
                                                         "PCI_BUS_ID", "1"]
    report = json.loads((part / cluster.NODE_JSON).read_text())
    assert report["node"] == 1 and report["returncode"] == 3 and report["argv"][-1] == "--node-rank=1"
    assert report["cpus_allowed"] == launch.allocated_cpus() and report["wall_s"] >= 0


def test_a_node_step_passes_a_stop_on_and_leaves_no_orphan(tmp_path: Path) -> None:
    # the child starts a grandchild that outlives it (as a rank can outlive a dying torchrun),
    # then waits for SIGTERM
    program = (
        "import signal, subprocess, sys, time\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],\n"
        "                     start_new_session=True)\n"
        f"open({str(tmp_path / 'grandchild')!r}, 'w').write(str(g.pid))\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
        "time.sleep(60)\n")
    proc = node_step(tmp_path, [sys.executable, "-c", program], {"MY_NODE": "0"})
    pid_file = tmp_path / "grandchild"
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 7
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{grandchild}").exists() and \
            Path(f"/proc/{grandchild}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the orphaned grandchild is still running"
        time.sleep(0.1)
    assert json.loads((cluster.node_dir(tmp_path, 0) / cluster.NODE_JSON).read_text())["returncode"] == 7
