from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import multicard
from multicard.plan import launch, params


def test_single_node_uses_standalone_rendezvous() -> None:
    argv = launch.torchrun_argv("pkg.mod", ["--x", "1"], nproc_per_node=2)
    assert argv == [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node=2", "-m", "pkg.mod", "--x", "1"]


def test_multi_node_uses_static_ranks_at_the_endpoint() -> None:
    rdzv = launch.Rendezvous("node1:29500", "run-trial-a0")
    argv = launch.torchrun_argv("m", [], nproc_per_node=4, nnodes=2, rdzv=rdzv)
    assert "--standalone" not in argv
    assert argv[3:10] == ["--nnodes=2", "--node-rank={node_rank}", "--rdzv-backend=static",
                          "--rdzv-endpoint=node1:29500", "--rdzv-id=run-trial-a0",
                          f"--rdzv-conf=timeout={launch.RDZV_TIMEOUT_S}", "--max-restarts=0"]
    with pytest.raises(ValueError, match="rendezvous"):
        launch.torchrun_argv("m", [], nproc_per_node=4, nnodes=2)


@pytest.mark.parametrize("sep", ["-", "_"])  # torchrun's spelling, and tune run's
def test_torchrun_reads_the_rendezvous_flags_as_meant(sep: str) -> None:
    from torch.distributed.run import config_from_args, get_args_parser

    flags = launch.rendezvous_flags(3, launch.Rendezvous("node1:29411", "r-t0-a1", 1200), sep)
    filled = [f.replace(launch.NODE_RANK_SLOT, "2") for f in flags]
    args = get_args_parser().parse_args([*filled, "--nproc-per-node=2", "train.py"])
    config, _, _ = config_from_args(args)
    assert (config.min_nodes, config.max_nodes, config.rdzv_backend) == (3, 3, "static")
    assert (config.rdzv_endpoint, config.run_id, config.max_restarts) == ("node1:29411", "r-t0-a1", 0)
    assert config.rdzv_configs["rank"] == 2 and int(config.rdzv_configs["timeout"]) == 1200


def test_vision_argv_passes_every_setting(tmp_path: Path) -> None:
    settings = params.resolve("vision", {"gpus": 3, "precision": "fp16"})
    argv, env = launch.vision_argv(settings, tmp_path / "t", tmp_path / "data", "torch")
    assert env == {} and "--nproc-per-node=3" in argv and "--no-python" not in argv
    tail = argv[argv.index("multicard.workloads.vision") + 1:]
    assert tail[:6] == ["--out", str(tmp_path / "t"), "--data-dir", str(tmp_path / "data"),
                        "--trace", "torch"]
    assert tail[6:] == params.to_flags(settings)


def test_one_rank_on_one_node_starts_without_torchruns_agent(tmp_path: Path) -> None:
    settings = params.resolve("vision", {"gpus": 1, "precision": "fp16"})
    argv, env = launch.vision_argv(settings, tmp_path / "t", tmp_path / "data", "none")
    assert argv[:3] == [sys.executable, "-m", "multicard.workloads.vision"]
    assert argv[3:] == ["--out", str(tmp_path / "t"), "--data-dir", str(tmp_path / "data"),
                        "--trace", "none", *params.to_flags(settings)]
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")} == \
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    assert env["MASTER_ADDR"] == "127.0.0.1" and 0 < int(env["MASTER_PORT"]) < 65536


@pytest.mark.parametrize(("ranks", "nnodes", "wrapper", "binding"), [
    (2, 1, [], None), (1, 2, [], None), (1, 1, ["nsys", "profile"], None), (1, 1, [], "node")])
def test_the_agent_stays_where_it_does_something(ranks: int, nnodes: int, wrapper: list[str],
                                                 binding: str | None) -> None:
    assert not launch.agentless(ranks, nnodes, wrapper, binding)
    assert launch.agentless(1, 1, [], None)


def test_nsys_wraps_every_rank_through_no_python(tmp_path: Path) -> None:
    from multicard.profiling import nsys

    settings = params.resolve("vision", {"gpus": 2})
    wrapper = nsys.wrapper("/opt/nsys/bin/nsys", tmp_path)
    argv, _ = launch.vision_argv(settings, tmp_path, tmp_path, "nsys", wrapper)
    at = argv.index("--no-python")
    assert argv[at + 1:at + 2 + len(nsys.NSYS_PROFILE)] == ["/opt/nsys/bin/nsys", *nsys.NSYS_PROFILE]
    assert argv[at + 2 + len(nsys.NSYS_PROFILE)] == f"--output={tmp_path}/rank%q{{RANK}}"
    assert argv[at + 3 + len(nsys.NSYS_PROFILE):at + 6 + len(nsys.NSYS_PROFILE)] == [
        sys.executable, "-m", "multicard.workloads.vision"]
    assert "--capture-range=cudaProfilerApi" in argv and "--export=sqlite" in argv


def test_trial_env_drops_tf32_override_and_shares_cores() -> None:
    base = {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1", "PATH": "/bin", "PYTHONPATH": "/a"}
    env = launch.trial_env(base, ranks_per_node=2, cpu_count=8)
    assert "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE" not in env
    assert env["OMP_NUM_THREADS"] == "4" and env["PYTHONUNBUFFERED"] == "1"
    package_root = str(Path(multicard.__file__).resolve().parents[1])
    assert env["PYTHONPATH"].split(os.pathsep) == [package_root, "/a"]
    assert launch.trial_env({"OMP_NUM_THREADS": "7"}, 2, 8)["OMP_NUM_THREADS"] == "7"
    assert launch.trial_env({}, 4, 2)["OMP_NUM_THREADS"] == "1"


def test_cpu_trials_spin_briefly_at_barriers_unless_told_otherwise() -> None:
    assert launch.cpu_trial_env("cpu", {"PATH": "/bin"}) == {"GOMP_SPINCOUNT": "1000"}
    assert launch.cpu_trial_env("cpu", {"OMP_WAIT_POLICY": "ACTIVE"}) == {}  # the caller's wins
    assert launch.cpu_trial_env("cpu", {"GOMP_SPINCOUNT": "0"}) == {}
    assert launch.cpu_trial_env("cuda", {}) == {}  # GPU trials as the paper ran them


def test_tf32_overrides_are_cleared_and_their_values_kept_for_the_record() -> None:
    base = {"PATH": "/bin", "NVIDIA_TF32_OVERRIDE": "0", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}
    env = launch.trial_env(base, ranks_per_node=1, cpu_count=2)
    assert "NVIDIA_TF32_OVERRIDE" not in env and "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE" not in env
    assert launch.cleared_env(base) == {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1",
                                        "NVIDIA_TF32_OVERRIDE": "0"}
    assert launch.cleared_env({"PATH": "/bin"}) == {}


def test_torchruns_agent_is_found_among_a_ranks_ancestors() -> None:
    python = "/opt/venv/bin/python3"
    nsys = (4100, ["/opt/nvidia/nsys/bin/nsys", "profile", "--trace=cuda", python, "-m", "x"])
    agent = (4000, [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"])
    runner = (3000, [python, "-m", "multicard", "run", "spec.toml"])
    assert launch.find_agent([agent, runner]) == 4000
    assert launch.find_agent([nsys, agent, runner]) == 4000  # a wrapper in between
    assert launch.find_agent([(4200, ["/usr/bin/torchrun", "--nproc-per-node=4"])]) == 4200
    assert launch.find_agent([(4300, [python, "/opt/venv/bin/torchrun", "-m", "x"])]) == 4300
    assert launch.find_agent([(4400, [python, "-u", "-X", "dev", "-m", "torch.distributed.run"])]) == 4400
    assert launch.find_agent([runner, (1, ["/sbin/init"])]) is None
    # a program that merely mentions torchrun among its arguments is not the agent
    assert launch.find_agent([(4500, [python, "tool.py", "--launcher", "torchrun"]),
                              (4600, ["/bin/sh", "-c", "torchrun x"])]) is None


@pytest.mark.slow
def test_a_rank_behind_a_wrapper_dies_with_the_agent(tmp_path: Path) -> None:
    # agent (named torchrun) -> wrapper -> rank; the rank arms die_with_agent, then the agent is
    # killed with SIGKILL and the wrapper lives on: the rank must go within seconds
    import signal
    import subprocess
    import time

    rank = tmp_path / "rank.py"
    rank.write_text("import time\nfrom multicard.plan import launch\n"
                    "print(launch.die_with_agent(), flush=True)\ntime.sleep(60)\n")
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text("import subprocess, sys, time\n"
                       f"p = subprocess.Popen([sys.executable, {str(rank)!r}])\n"
                       "print(p.pid, flush=True)\ntime.sleep(60)\n")
    agent = tmp_path / "torchrun"
    agent.write_text(f"import subprocess, sys\nsubprocess.run([sys.executable, {str(wrapper)!r}])\n")
    env = {**os.environ, "PYTHONPATH": str(Path(multicard.__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, str(agent)], stdout=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        rank_pid = int(proc.stdout.readline())  # type: ignore[union-attr]
        assert proc.stdout.readline().strip() == "agent watcher"  # type: ignore[union-attr]
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{rank_pid}").exists() and _state(rank_pid) != "Z" \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not Path(f"/proc/{rank_pid}").exists() or _state(rank_pid) == "Z"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_threads_follow_the_cpus_the_allocation_gives_not_the_node() -> None:
    import subprocess
    import sys

    # Slurm's cgroup and taskset narrow the CPUs a trial may use; os.cpu_count() would still say
    # the whole node and oversubscribe every core
    done = subprocess.run(["taskset", "-c", "0", sys.executable, "-c",
                           "from multicard.plan import launch; print(launch.allocated_cpus())"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "1"


def test_a_rank_is_orphaned_when_re_parented_to_init_or_a_node_step() -> None:
    node_step = (7, [sys.executable, "-m", "multicard.run.node_step", "--nnodes", "2"])
    torchrun = (8, [sys.executable, "-m", "torch.distributed.run", "--nnodes=2"])
    assert launch.orphaned([]) and launch.orphaned([node_step])
    assert not launch.orphaned([(9, ["nsys", "profile"]), torchrun, node_step])


@pytest.mark.parametrize(("policy", "binding", "binder"), [
    ("none", None, False), ("local", None, True), ("interleave", None, True),
    # torchrun's own binding: the binder in front only sets the rank's threads for its binding
    ("torchrun_node", "--numa-binding=node", True), ("torchrun_socket", "--numa-binding=socket", True),
    ("torchrun_exclusive", "--numa-binding=exclusive", True)])
def test_each_numa_policy_binds_through_numactl_or_torchrun(
        tmp_path: Path, policy: str, binding: str | None, binder: bool) -> None:
    settings = params.resolve("vision", {"gpus": 2, "device": "cuda", "numa_policy": policy})
    wrapper = launch.rank_wrapper(policy, "cuda")
    argv, _ = launch.vision_argv(settings, tmp_path, tmp_path, "none", wrapper)
    flags = argv[:argv.index("--nproc-per-node=2") + 2]  # torchrun's own, before the rank's
    assert [f for f in flags if f.startswith("--numa-binding")] == ([binding] if binding else [])
    assert ("multicard.run.numa_bind" in argv) is binder
    if binder:  # the binder in front of every rank, through --no-python
        at = argv.index("--no-python")
        assert argv[at + 1:at + 6] == [sys.executable, "-m", "multicard.run.numa_bind", policy, "cuda"]


def test_the_installed_torchs_binding_modes_are_read_from_its_source(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.machinery
    import importlib.metadata
    import importlib.util

    modes, why = launch.torchrun_binding_modes()  # the torch installed here, unfaked
    torch_root = Path(next(iter(importlib.util.find_spec("torch").submodule_search_locations)))
    if (torch_root / "numa" / "binding.py").exists():  # torch 2.14 (dev venv); not NGC 24.11's 2.6
        assert why is None and {"node", "socket", "exclusive"} <= modes
    else:
        assert modes == frozenset() and "has no torchrun --numa-binding" in str(why)

    def fake_torch(binding: str | None, run: str) -> None:
        root = tmp_path / str(len(list(tmp_path.iterdir()))) / "torch"
        (root / "distributed").mkdir(parents=True, exist_ok=True)
        (root / "distributed" / "run.py").write_text(run)
        if binding is not None:
            (root / "numa").mkdir(exist_ok=True)
            (root / "numa" / "binding.py").write_text(binding)
        found = importlib.machinery.ModuleSpec("torch", None, is_package=True)
        found.submodule_search_locations = [str(root)]
        monkeypatch.setattr(importlib.util, "find_spec", lambda name: found)
        monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.99.0")

    fake_torch("class AffinityMode(str, Enum):\n    NODE = 'node'\n    SOCKET = 'socket'\n",
               "parser.add_argument('--numa-binding')")
    assert launch.torchrun_binding_modes() == (frozenset({"node", "socket"}), None)
    fake_torch(None, "no such flag")  # NGC 24.11's torch 2.6: neither the module nor the flag
    assert launch.torchrun_binding_modes() == (frozenset(), "the installed torch 2.99.0 has no torchrun "
                                               "--numa-binding")
