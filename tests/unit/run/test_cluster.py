from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multicard.errors import InputError
from multicard.plan import launch
from multicard.run import cluster
from tests.helpers import ROOT


def test_srun_steps_run_the_image_s_python_on_every_node(tmp_path: Path) -> None:
    wrapper = ("/usr/bin/apptainer", "exec", "/x.sif")
    launcher = cluster.Launcher(("srun",), "SLURM_NODEID", wrapper, "python3")
    part = cluster.NodePart(tmp_path / "t", 4, 4, {"B": "2", "A": "1"})
    host = {"PATH": "/host/bin", "PYTHONPATH": "/host/src", "VIRTUAL_ENV": "/host/venv",
            "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "8", "HOME": "/home/u", "SECRET": "x"}
    command = [sys.executable, "-m", "torch.distributed.run", "--no-python", sys.executable, "-m", "w"]
    argv = cluster.step_argv(launcher, 3, part, command, host)
    assert argv[:12] == ["srun", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--relative=0",
                         "--kill-on-bad-exit=1", "--label", "--mpi=none",
                         "--export=HOME,NCCL_DEBUG,OMP_NUM_THREADS", "--gpus-per-node=4", "--exact",
                         "--immediate=300"]  # a step not created in 5 minutes fails, not waits
    assert argv[12:15] == ["/usr/bin/apptainer", "exec", "/x.sif"]
    assert argv[15:] == ["python3", "-m", "multicard.run.node_step", "--nnodes", "3",
                         "--node-rank-env", "SLURM_NODEID", "--dir", str(tmp_path / "t"),
                         "--ranks-per-node", "4", "--env", "A=1", "--env", "B=2", "--",
                         "{python}", "-m", "torch.distributed.run", "--no-python", "{python}", "-m", "w"]
    assert not any(sys.executable in word or "/host/" in word for word in argv)


def test_without_a_wrapper_the_nodes_run_the_planner_s_python_and_get_its_paths() -> None:
    launcher = cluster.Launcher(("srun",), "SLURM_NODEID")
    argv = cluster.step_argv(launcher, 2, cluster.NodePart(Path("t"), 1, 0, {}), ["x"],
                             {"PATH": "/p", "PYTHONPATH": "/s", "SLURM_JOB_ID": "1"})
    assert "--export=PATH,PYTHONPATH" in argv and argv[argv.index("--mpi=none") + 4] == sys.executable
    # a CPU trial takes no GPU, not even the job's default
    assert "--gres=none" in argv and not any(word.startswith("--gpus-per-node") for word in argv)
    assert "--export=NONE" in cluster.step_argv(launcher, 2, cluster.NodePart(Path("t"), 1, 0, {}),
                                                ["x"], {"SECRET": "x"})


def test_another_launcher_is_used_as_given() -> None:
    launcher = cluster.make_launcher("true -np {nnodes}", "OMPI_COMM_WORLD_RANK", "/a b c", 3, {})
    assert launcher == cluster.Launcher(("true", "-np", "{nnodes}"), "OMPI_COMM_WORLD_RANK",
                                        ("/a", "b", "c"), "python3")
    part = cluster.NodePart(Path("t"), 1, 0, {})
    assert cluster.step_argv(launcher, 3, part, ["x"], {})[:6] == ["true", "-np", "3", "/a", "b", "c"]
    with pytest.raises(InputError, match="must be an absolute path"):
        cluster.make_launcher("true", "X", "apptainer exec x.sif", 2, {})
    assert cluster.make_launcher("true", "X", None, 2, {}, "/opt/py").node_python == "/opt/py"


def test_every_node_sets_the_page_cache_it_is_given(tmp_path: Path) -> None:
    launcher = cluster.Launcher(("srun",), "SLURM_NODEID")
    part = cluster.NodePart(tmp_path, 1, 0, {}, ("cold", tmp_path / "tree"))
    argv = cluster.step_argv(launcher, 2, part, ["x"], {})
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


def oom(text: str) -> bool:
    return "out of memory" in text


def test_a_node_killed_mid_trial_is_named_not_the_nodes_it_took_down(tmp_path: Path) -> None:
    write_node(tmp_path, 0, returncode=1, ended_unix=10.0)  # its ranks lost their peer
    write_node(tmp_path, 1)  # killed: no exit status, and never told to stop
    reports = cluster.node_reports(tmp_path, 3)
    assert reports[2] == {"node": 2, "started": False}
    found = cluster.blame(reports, {}, "", oom)
    assert found == cluster.Blame(1, "lost", (0, 2))
    assert cluster.blame_message(found, reports) == (
        "node 1 (n1) ended without an exit status (its part was killed: the node died, or the "
        "launcher ended it); node 0, 2 ended after it (collateral)")


def test_the_first_node_to_fail_by_itself_is_the_cause_not_those_the_launcher_ended(tmp_path: Path) -> None:
    # node 1 failed at t=10; srun (--kill-on-bad-exit) told node 0 to stop at t=11, and node 2
    # was killed after KillWait without an exit status: both collateral
    write_node(tmp_path, 0, returncode=143, ended_unix=12.0, stop_unix=11.0)
    write_node(tmp_path, 1, returncode=1, ended_unix=10.0)
    write_node(tmp_path, 2, stop_unix=11.0)
    reports = cluster.node_reports(tmp_path, 3)
    assert cluster.blame(reports, {}, "", oom) == cluster.Blame(1, "failed", (0, 2))
    # two that failed by themselves: the earlier one
    write_node(tmp_path, 3, returncode=1, ended_unix=9.5)
    assert cluster.blame(cluster.node_reports(tmp_path, 4), {}, "", oom).node == 3


def test_an_oom_anywhere_is_the_cause_whatever_ended_first(tmp_path: Path) -> None:
    write_node(tmp_path, 0, returncode=1, ended_unix=10.0)  # its peer went away: it failed first
    write_node(tmp_path, 1, returncode=1, ended_unix=11.0)
    reports = cluster.node_reports(tmp_path, 2)
    srun_said = "srun: error: n1: task 1: Out Of Memory\n"
    assert cluster.blame(reports, {}, srun_said, oom) == cluster.Blame(1, "oom", (0,))
    assert cluster.blame(reports, {1: "RuntimeError: CUDA out of memory"}, "", oom).node == 1
    assert cluster.srun_oom_nodes("srun: error: nid7: tasks 1-3,5: Out Of Memory") == {1, 2, 3, 5}


def test_a_step_no_node_started_or_the_planner_stopped_blames_no_node(tmp_path: Path) -> None:
    assert cluster.blame(cluster.node_reports(tmp_path, 2), {}, "", oom) == \
        cluster.Blame(None, "never started")
    write_node(tmp_path, 0, returncode=143, ended_unix=5.0, stop_unix=4.0)
    write_node(tmp_path, 1, returncode=143, ended_unix=5.0, stop_unix=4.0)
    assert cluster.blame(cluster.node_reports(tmp_path, 2), {}, "", oom) == \
        cluster.Blame(None, "stopped", (0, 1))


def node_step(tmp_path: Path, command: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "multicard.run.node_step", "--nnodes", "2", "--node-rank-env",
            "MY_NODE", "--dir", str(tmp_path), "--ranks-per-node", "2", "--env", "EXTRA=yes",
            "--", *command]
    return subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **env}, text=True)


def test_a_node_step_fills_its_rank_and_records_its_part(tmp_path: Path) -> None:
    show = ("import os, sys; print(sys.argv[1], os.environ['EXTRA'], os.environ['OMP_NUM_THREADS'],"
            " os.environ['CUDA_DEVICE_ORDER'], os.environ['MULTICARD_NODE']); sys.exit(3)")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | {"MY_NODE": "1"}
    # the planner's argv names its Python by a slot: the node's part runs its own
    proc = node_step(tmp_path, [cluster.PYTHON_SLOT, "-c", show, f"--node-rank={launch.NODE_RANK_SLOT}"], env)
    assert proc.wait(timeout=60) == 3
    part = cluster.node_dir(tmp_path, 1)
    threads = max(1, launch.allocated_cpus() // 2)
    assert (part / "stdout.log").read_text().split() == ["--node-rank=1", "yes", str(threads),
                                                         "PCI_BUS_ID", "1"]
    report = json.loads((part / cluster.NODE_JSON).read_text())
    assert report["node"] == 1 and report["returncode"] == 3 and report["argv"][-1] == "--node-rank=1"
    assert report["argv"][0] == sys.executable and report["ranks_per_node"] == 2
    assert report["cpus_allowed"] == launch.allocated_cpus() and report["wall_s"] >= 0
    assert report["ended_unix"] >= report["started_unix"] and "stop_unix" not in report


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
    report = json.loads((cluster.node_dir(tmp_path, 0) / cluster.NODE_JSON).read_text())
    # told to stop by the launcher before it ended: collateral of another node's failure
    assert report["returncode"] == 7 and report["stop_signal"] == "SIGTERM"
    assert report["started_unix"] <= report["stop_unix"] <= report["ended_unix"]


def test_node_0_refuses_an_endpoint_that_is_not_its_own(tmp_path: Path) -> None:
    # 192.0.2.1 is TEST-NET-1: never an address of this host
    elsewhere = [cluster.PYTHON_SLOT, "-m", "torch.distributed.run", "--rdzv-endpoint=192.0.2.1:29400"]
    proc = node_step(tmp_path, elsewhere, {"MY_NODE": "0"})
    assert proc.wait(timeout=60) == 2
    report = json.loads((cluster.node_dir(tmp_path, 0) / cluster.NODE_JSON).read_text())
    assert report["returncode"] == 2 and "is not an address of node 0" in report["error"]
    assert cluster.endpoint_problem(["--rdzv_endpoint=127.0.0.1:1"]) is None  # tune run's spelling
    assert cluster.endpoint_problem(["--rdzv-endpoint=localhost:1"]) is None
    assert "does not resolve" in str(cluster.endpoint_problem(["--rdzv-endpoint=no-such-host.invalid:1"]))


# NCCL 2.x INFO lines as a node's log has them (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET):
# hand-written in NCCL's format (no GPU cluster here); the busId form of the rank is older NCCL's
NCCL_LOG = """\
node8:81:95 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.1.0.8<0>
node8:81:95 [0] NCCL INFO Using network IB
node8:81:95 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
node8:81:95 [0] NCCL INFO Channel 01/0 : 1[1b000] -> 2[3d000] via P2P/IPC
node8:81:95 [0] NCCL INFO Channel 00/0 : 3[3] -> 4[0] [send] via NET/IB/0/GDRDMA
node8:81:95 [0] NCCL INFO Channel 00/0 : 7[3] -> 0[0] [receive] via NET/IB/1/GDRDMA
"""


def test_the_nccl_transports_a_node_used_are_read_from_its_log() -> None:
    assert cluster.nccl_transports(NCCL_LOG) == {"network": ["IB"],
                                                 "transports": ["NET/IB", "P2P/CUMEM", "P2P/IPC"]}
    sockets = ("h:1:2 [0] NCCL INFO Using network Socket\n"
               "h:1:2 [0] NCCL INFO Channel 00/0 : 1[1] -> 0[0] [send] via NET/Socket/0\n")
    assert cluster.nccl_transports(sockets) == {"network": ["Socket"], "transports": ["NET/Socket"]}
    assert cluster.nccl_transports("a gloo trial's log\n") is None


def test_a_step_s_argv_reads_as_launcher_node_part_and_torchrun() -> None:
    argv = ["srun", "--nodes=2", "/usr/bin/apptainer", "exec", "/x.sif", "python3", "-m",
            "multicard.run.node_step", "--dir", "/t", "--", "{python}", "-m", "torch.distributed.run",
            "-m", "w"]
    assert cluster.step_parts(argv) == [["srun", "--nodes=2", "/usr/bin/apptainer", "exec", "/x.sif"],
                                        ["python3", "-m", "multicard.run.node_step", "--dir", "/t"],
                                        ["{python}", "-m", "torch.distributed.run", "-m", "w"]]


def test_a_dry_run_prints_each_trial_s_lines_on_a_login_node_and_writes_nothing(tmp_path: Path) -> None:
    from tests.helpers import write_spec

    path = write_spec(tmp_path, grid={"precision": ["fp32", "bf16"]})
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}  # no allocation
    done = subprocess.run([sys.executable, "-m", "multicard", "run", str(path), "--dry-run", "--nnodes", "2",
                           "--rdzv-endpoint", "node7:24242", "--out", str(tmp_path / "run"),
                           "--step-wrapper", "/usr/bin/apptainer exec /x.sif"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "2 trial(s) would start; nothing was started or written"
    assert [line.split()[0] for line in lines[1:4]] == ["srun", "python3", "'{python}'"]
    assert "--rdzv-endpoint=node7:24242" in lines[3] and not (tmp_path / "run").exists()


def test_a_node_stages_the_tree_to_its_own_disk_and_its_ranks_read_the_copy(tmp_path: Path) -> None:
    from multicard.data import scenario_b
    from tests.unit.data.test_scenario_b import fake_tree

    tree = fake_tree(tmp_path / "shared" / "scenario_b" / "32px-jpeg", b"abc  train/3/00007.jpg\n")
    show = "import os; print(os.environ['MULTICARD_CACHE_DIR'])"
    argv = [sys.executable, "-m", "multicard.run.node_step", "--nnodes", "2", "--node-rank-env", "MY_NODE",
            "--dir", str(tmp_path / "t"), "--ranks-per-node", "1", "--page-cache", "cold",
            "--page-cache-tree", str(tree), "--stage-dir", str(tmp_path / "local"), "--",
            cluster.PYTHON_SLOT, "-c", show]
    done = subprocess.run(argv, cwd=ROOT, env={**os.environ, "MY_NODE": "1"}, timeout=60)
    assert done.returncode == 0
    part = cluster.node_dir(tmp_path / "t", 1)
    assert (part / "stdout.log").read_text().strip() == str(tmp_path / "local")
    cache = json.loads((part / cluster.NODE_JSON).read_text())["page_cache"]
    assert cache["staged"]["to"] == str(tmp_path / "local" / "scenario_b" / "32px-jpeg")
    assert cache["storage"]["path"] == cache["staged"]["to"] and cache["disk_cold"] in (True, False)
    assert (tmp_path / "local" / "scenario_b" / "32px-jpeg" / scenario_b.MANIFEST).is_file()
    launcher = cluster.Launcher(("srun",), "SLURM_NODEID")
    staged = cluster.NodePart(tmp_path, 1, 0, {}, ("cold", tree), tmp_path / "local")
    assert "--stage-dir" in cluster.step_argv(launcher, 2, staged, ["x"], {})


def test_multicard_s_own_files_reach_the_nodes_as_their_own_and_host_paths_do_not() -> None:
    # the LLM pin_memory hook is a folder of the package: each node's is its own copy's
    hook = f"{cluster.PACKAGE_DIR}/hooks/pin_memory"
    wrapper = ("/usr/bin/apptainer", "exec", "/x.sif")
    launcher = cluster.Launcher(("srun",), "SLURM_NODEID", wrapper, "python3")
    part = cluster.NodePart(Path("t"), 1, 0, {"PYTHONPATH": f"{hook}:/home/u/mc/src", "A": "1"})
    argv = cluster.step_argv(launcher, 2, part, [sys.executable, f"{cluster.PACKAGE_DIR}/x.yaml"], {})
    assert "PYTHONPATH={multicard}/hooks/pin_memory" in argv and "A=1" in argv
    assert argv[-2:] == ["{python}", "{multicard}/x.yaml"]
    assert cluster.fill_slots("{multicard}/hooks:{python} --node-rank={node_rank}", 1, "/py", "/img/mc") == \
        "/img/mc/hooks:/py --node-rank=1"
    # without a wrapper the nodes run the planner's Python: its PYTHONPATH stays
    own = cluster.step_argv(cluster.Launcher(("srun",), "SLURM_NODEID"), 2, part, ["x"], {})
    assert "PYTHONPATH={multicard}/hooks/pin_memory:/home/u/mc/src" in own


@pytest.mark.parametrize(("env", "cpus"), [
    ({"SLURM_JOB_CPUS_PER_NODE": "64(x2),32"}, 32), ({"SLURM_JOB_CPUS_PER_NODE": "128(x4)"}, 128),
    ({"SLURM_CPUS_ON_NODE": "16"}, 16), ({}, None), ({"SLURM_JOB_CPUS_PER_NODE": "junk"}, None)])
def test_the_job_s_cpus_per_node_are_its_fewest_on_any_node(env: dict[str, str], cpus: int | None) -> None:
    assert cluster.job_cpus_per_node(env) == cpus


def test_a_step_asks_for_the_job_s_cpus_on_its_srun_line(tmp_path: Path) -> None:
    # Slurm 23.11 on reads neither SRUN_CPUS_PER_TASK nor the job's --cpus-per-task for a step:
    # with --exact and nothing on the line, each node's part (every rank) gets one CPU
    launcher = cluster.Launcher(("srun",), "SLURM_NODEID", ("/usr/bin/apptainer", "exec", "/x.sif"),
                                "python3")
    part = cluster.NodePart(tmp_path / "t", 4, 4, {})
    argv = cluster.step_argv(launcher, 2, part, ["x"], {"SLURM_JOB_CPUS_PER_NODE": "96(x2)"})
    assert argv[9:13] == ["--gpus-per-node=4", "--exact", "--cpus-per-task=96", "--immediate=300"]


OWN_CPUS = len(os.sched_getaffinity(0))


@pytest.mark.parametrize(("flags", "bound"), [(["--exact"], 1), ([f"--cpus-per-task={OWN_CPUS}"], OWN_CPUS),
                                              ([], OWN_CPUS)])
def test_the_stand_in_srun_binds_cpus_as_slurm_does(tmp_path: Path, flags: list[str], bound: int) -> None:
    srun = ROOT / "tests" / "fixtures" / "wrappers" / "fake_srun.py"
    done = subprocess.run([sys.executable, str(srun), "--nodes=1", "--ntasks=1", *flags, sys.executable,
                           "-c", "import os; print(len(os.sched_getaffinity(0)))"],
                          env={**os.environ, "FAKE_SRUN_STATE": str(tmp_path)}, capture_output=True,
                          text=True, timeout=60, check=True)
    assert int(done.stdout) == bound
    more = subprocess.run([sys.executable, str(srun), "--nodes=1", "--ntasks=1",
                           f"--cpus-per-task={OWN_CPUS + 1}", "true"], capture_output=True, text=True,
                          env={**os.environ, "FAKE_SRUN_STATE": str(tmp_path)}, timeout=60)
    assert more.returncode == 1 and "More processors requested than permitted" in more.stderr


def test_the_stand_in_srun_gives_up_creating_a_step_past_immediate(tmp_path: Path) -> None:
    srun = ROOT / "tests" / "fixtures" / "wrappers" / "fake_srun.py"
    env = {**os.environ, "FAKE_SRUN_STATE": str(tmp_path), "FAKE_SRUN_CREATE_S": "100000"}
    # it answers at once: a model that sat out the 300 s would run past this timeout
    done = subprocess.run([sys.executable, str(srun), "--nodes=1", "--ntasks=1", "--immediate=300",
                           "true"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Requested nodes are busy" in done.stderr


def test_a_node_whose_heartbeat_fell_behind_before_a_timeout_is_hung(tmp_path: Path) -> None:
    write_node(tmp_path, 0)
    write_node(tmp_path, 1)  # stopped: no exit status, its heartbeat 100 s behind node 0's
    write_node(tmp_path, 2, returncode=0, ended_unix=5.0)  # ended early: not a hang
    for node, last in ((0, 1000.0), (1, 900.0), (2, 5.0)):
        (cluster.node_dir(tmp_path, node) / cluster.HEARTBEAT_FILE).write_text(f"{last}\n")
    reports = cluster.node_reports(tmp_path, 3)
    assert cluster.hung_nodes(reports) == [1]
    said = cluster.blame_message(cluster.Blame(1, "hung", (0, 2)), reports)
    assert said.startswith("node 1 (n1) stopped making progress") and "collateral" in said
    # beats within HUNG_AFTER_S of each other, or a single beat: a slow trial, nobody's fault
    (cluster.node_dir(tmp_path, 1) / cluster.HEARTBEAT_FILE).write_text("990.0\n")
    assert cluster.hung_nodes(cluster.node_reports(tmp_path, 3)) == []
    (cluster.node_dir(tmp_path, 1) / cluster.HEARTBEAT_FILE).unlink()
    (cluster.node_dir(tmp_path, 2) / cluster.HEARTBEAT_FILE).unlink()
    assert cluster.hung_nodes(cluster.node_reports(tmp_path, 3)) == []


def test_a_node_part_beats_until_told_to_stop(tmp_path: Path) -> None:
    import threading

    stop = threading.Event()
    stop.set()  # one beat, then it returns
    cluster.beat(tmp_path, stop, every_s=0.0)
    assert float((tmp_path / cluster.HEARTBEAT_FILE).read_text()) > 0


def test_a_part_killed_while_it_still_beat_after_another_failed_is_collateral(tmp_path: Path) -> None:
    # node 1 failed by itself at t=10; srun's kill reached node 0 before its part could write
    # that it was told to stop (no stop_unix, no exit status): it still beat at t=10.5, so it
    # was alive after node 1 failed, and is collateral, not lost
    write_node(tmp_path, 0)
    write_node(tmp_path, 1, returncode=1, ended_unix=10.0)
    (cluster.node_dir(tmp_path, 0) / cluster.HEARTBEAT_FILE).write_text("10.5\n")
    assert cluster.blame(cluster.node_reports(tmp_path, 2), {}, "", oom) == cluster.Blame(1, "failed", (0,))
    # its last beat before node 1 failed (even just before): it may have died first, and node 1
    # failed for want of it (a peer's connection reset comes within seconds)
    (cluster.node_dir(tmp_path, 0) / cluster.HEARTBEAT_FILE).write_text("9.0\n")
    assert cluster.blame(cluster.node_reports(tmp_path, 2), {}, "", oom) == cluster.Blame(0, "lost", (1,))
