from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from multicard.plan import launch
from multicard.plan.spec import PlannedTrial
from multicard.run import runner
from multicard.workloads import registry

RESULT = {"metrics": {"train_time_s": 1.0}}


def test_ok_needs_exit_zero_and_a_result() -> None:
    assert runner.classify(0, False, "", RESULT, 60) == ("ok", None)
    status, error = runner.classify(0, False, "", None, 60)
    assert status == "failed" and error["message"] == "exit status 0 but no result.json was written"


def test_timeout_wins_over_everything() -> None:
    status, error = runner.classify(-9, True, "RuntimeError: boom", None, 90)
    assert status == "timeout" and error["message"] == "killed after 90 s"


def test_out_of_memory_is_its_own_status() -> None:
    tail = ("[rank1]: Traceback (most recent call last):\n"
            "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")
    status, error = runner.classify(1, False, tail, None, 60)
    assert status == "oom"
    assert error["type"] == "OutOfMemoryError"
    assert error["message"].startswith("CUDA out of memory")


def test_failure_names_the_root_exception_not_torchruns_summary() -> None:
    tail = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
            "Traceback (most recent call last):\n"
            "multicard.errors.InputError: data/mnist/x.gz: missing MNIST file\n")
    status, error = runner.classify(1, False, tail, None, 60)
    assert (status, error["type"]) == ("failed", "InputError")
    assert error["message"] == "data/mnist/x.gz: missing MNIST file"
    assert error["stderr_tail"] == tail


def test_failure_without_a_traceback_reports_the_signal() -> None:
    status, error = runner.classify(-11, False, "", None, 60)
    assert (status, error["type"], error["message"]) == ("failed", "ExitCode", "killed by signal 11")


def test_attempt_directories_are_never_reused(tmp_path: Path) -> None:
    planned = PlannedTrial(0, "abc", {}, {}, 1)
    first, a0 = runner._trial_dir(tmp_path, planned)
    second, a1 = runner._trial_dir(tmp_path, planned)
    assert (a0, a1) == (0, 1)
    assert first.name == "abc-t1-a0" and second.name == "abc-t1-a1"


def test_durations_read_like_a_person_would_write_them() -> None:
    assert runner.format_duration(5.4) == "5s"
    assert runner.format_duration(125) == "2m 05s"
    assert runner.format_duration(3 * 3600 + 62) == "3h 01m"


def test_cuda_plan_on_a_machine_without_gpus_is_bad_input(tmp_path: Path) -> None:
    import pytest

    from multicard.errors import InputError
    from multicard.measure import telemetry
    from multicard.plan import spec
    from tests.helpers import write_spec

    if telemetry.visible_gpu_count():
        pytest.skip("this machine has a GPU")
    path = write_spec(tmp_path, fixed={"device": "cuda"})
    with pytest.raises(InputError, match="no GPU is visible"):
        runner.run(spec.load(path), tmp_path / "run", echo=lambda _: None)
    assert not (tmp_path / "run" / "trials.jsonl").exists()


def test_configs_needing_more_gpus_than_visible_are_skipped(tmp_path: Path, monkeypatch) -> None:
    from multicard.measure import devices, telemetry
    from multicard.plan import spec
    from multicard.run import store
    from tests.helpers import write_spec

    one_gpu = [devices.GpuIdentity(0, "GPU-a", "0000:1b:00.0", "NVIDIA H100", (9, 0))]
    monkeypatch.setattr(telemetry, "visible_gpus", lambda: one_gpu)  # a 1-GPU node
    path = write_spec(tmp_path, fixed={"device": "cuda"}, grid={"gpus": [2, 4]})
    outcome = runner.run(spec.load(path), tmp_path / "run", echo=lambda _: None)
    assert (outcome.ran, outcome.ok, outcome.failed, outcome.skipped) == (2, 0, 0, 2)
    records = store.read(tmp_path / "run" / "trials.jsonl")
    assert [r["status"] for r in records] == ["skipped", "skipped"]
    assert {r["error"]["message"] for r in records} == {"needs 2 GPUs per node, 1 visible",
                                                        "needs 4 GPUs per node, 1 visible"}
    assert not (tmp_path / "run" / "raw").exists()  # nothing was launched
    # the visible GPU's idle power was asked for before any trial; a stand-in UUID has no NVML
    # device (and this machine may have no NVML at all): none, and why
    idle = json.loads((tmp_path / "run" / "env.json").read_text())["gpu_idle_power"]
    assert idle["gpus"] == [] and idle["reason"].startswith("NVML")


def test_a_new_run_reads_its_gpus_idle_power_once_before_any_trial(tmp_path: Path, monkeypatch) -> None:
    from multicard.measure import devices, gpu_state
    from multicard.plan import spec
    from tests.helpers import write_spec

    asked: list[list[devices.GpuIdentity]] = []
    reading = {"how": "stand-in", "window_s": 5.0,
               "gpus": [{"index": 0, "uuid": "GPU-a", "watts": 61.5, "window_s": 5.0, "processes": [],
                         "reason": None}]}
    monkeypatch.setattr(gpu_state, "idle_power", lambda gpus: asked.append(gpus) or reading)
    gpus = [devices.GpuIdentity(0, "GPU-a", "0000:1b:00.0")]
    s, out = spec.load(write_spec(tmp_path)), tmp_path / "run"
    out.mkdir()
    runner._prepare(s, out, tmp_path, gpus)
    runner._prepare(s, out, tmp_path, gpus)  # a resume: its trials may have run, the GPU is not idle
    assert asked == [gpus]
    assert json.loads((out / "env.json").read_text())["gpu_idle_power"] == reading
    [resumed] = out.glob("env-resume-*.json")
    assert "gpu_idle_power" not in json.loads(resumed.read_text())


def test_dataloader_worker_deaths_are_named() -> None:
    # the messages PyTorch's DataLoader raises (torch/utils/data/dataloader.py, signal_handling)
    killed = "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed. \n"
    status, error = runner.classify(1, False, killed, None, 60)
    assert (status, error["type"]) == ("failed", "DataLoaderWorkerKilled")
    assert error["message"] == "DataLoader worker (pid 4242) is killed by signal: Killed."
    exited = "RuntimeError: DataLoader worker (pid(s) 11, 12) exited unexpectedly\n"
    assert runner.classify(1, False, exited, None, 60)[1]["type"] == "DataLoaderWorkerKilled"


def test_a_worker_death_is_named_even_when_a_socket_error_is_raised_first() -> None:
    # a worker killed mid-transfer resets the socket its batch came through before the
    # DataLoader's own check reports the death
    tail = ("ConnectionResetError: [Errno 104] Connection reset by peer\n"
            "During handling of the above exception, another exception occurred:\n"
            "RuntimeError: DataLoader worker (pid 9677) is killed by signal: Killed.\n")
    status, error = runner.classify(1, False, tail, None, 60)
    assert (status, error["type"]) == ("failed", "DataLoaderWorkerKilled")
    assert error["message"] == "DataLoader worker (pid 9677) is killed by signal: Killed."


def test_shared_memory_exhaustion_is_named() -> None:
    bus = ("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient "
           "shared memory (shm).\nRuntimeError: DataLoader worker (pid 9) is killed by signal: Bus "
           "error. It is possible that dataloader's workers are out of shared memory.\n")
    assert runner.classify(1, False, bus, None, 60)[1]["type"] == "SharedMemoryExhausted"
    full = "RuntimeError: unable to write to file </torch_123_456_0>: No space left on device (28)\n"
    status, error = runner.classify(1, False, full, None, 60)
    assert (status, error["type"]) == ("failed", "SharedMemoryExhausted")


def test_a_rank_killed_by_a_signal_is_named_from_torchruns_summary() -> None:
    tail = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
            "  exitcode  : -9 (pid: 11027)  (SIGKILL)\n"
            "  traceback : Signal 9 (SIGKILL) received by PID 11027\n")
    status, error = runner.classify(1, False, tail, None, 60)
    assert (status, error["type"]) == ("failed", "RankKilled")
    assert error["message"] == "Signal 9 (SIGKILL) received by PID 11027"


def gpus(count: int, capability: tuple[int, int] = (9, 0)) -> list:
    from multicard.measure import devices

    return [devices.GpuIdentity(i, f"GPU-{i}", f"0000:{16 + i:02x}:00.0", "NVIDIA GPU", capability)
            for i in range(count)]


def test_unrunnable_configs_name_their_reason() -> None:
    from multicard.measure import numa
    from multicard.workloads import registry

    one_node = numa.Topology(nodes=[numa.Node(0, [0, 1], 16000)])
    cpu_only = registry.Machine([], one_node, numactl=True)
    cpu = {"gpus": 2, "device": "cpu", "loader": "torch", "numa_policy": "none", "precision": "fp32"}
    assert registry.vision_unrunnable(cpu, "none", cpu_only) is None
    assert registry.vision_unrunnable({**cpu, "device": "cuda"}, "none",
                                      registry.Machine(gpus(4), one_node, True)) is None
    assert registry.vision_unrunnable({**cpu, "device": "cuda"}, "none",
                                      registry.Machine(gpus(1), one_node, True)) == (
        "NotEnoughGPUs", "needs 2 GPUs per node, 1 visible")
    assert registry.vision_unrunnable({**cpu, "numa_policy": "local"}, "none", cpu_only) is None
    kind, reason = registry.vision_unrunnable({**cpu, "numa_policy": "remote"}, "none", cpu_only)
    assert (kind, reason) == ("NumaPolicyNotApplicable",
                              "remote needs a second NUMA node with CPUs; this machine (within its "
                              "allocation) has one")
    kind, reason = registry.vision_unrunnable({**cpu, "numa_policy": "interleave"}, "none", cpu_only)
    assert reason == ("interleave needs two or more NUMA nodes with CPUs and memory; this machine "
                      "(within its allocation) has 1")
    # whether numactl is installed is part of the machine handed in, not looked up here
    no_numactl = registry.Machine([], one_node, numactl=False)
    assert registry.vision_unrunnable({**cpu, "numa_policy": "local"}, "none", no_numactl) == (
        "NumactlNotInstalled", "numa_policy = 'local' needs numactl on PATH")


def test_torchrun_binding_is_skipped_where_it_cannot_bind(monkeypatch: pytest.MonkeyPatch) -> None:
    from multicard.measure import numa
    from multicard.plan import launch
    from multicard.workloads import registry

    placed = [numa.Gpu(g.index, 0, [0, 1], g.uuid, g.pci_bus_id) for g in gpus(2)]
    one_node = numa.Topology(nodes=[numa.Node(0, [0, 1], 16000)], gpus=placed)
    cuda = {"gpus": 2, "device": "cuda", "loader": "torch", "numa_policy": "torchrun_node",
            "precision": "fp32"}
    node = registry.Machine(gpus(2), one_node, numactl=True)
    every_mode = (frozenset(numa.TORCHRUN_POLICIES.values()), None)  # whatever torch is installed
    monkeypatch.setattr(launch, "torchrun_binding_modes", lambda: every_mode)
    assert registry.vision_unrunnable(cuda, "none", node) is None
    no_gpu = registry.Machine([], one_node, True)
    assert registry.vision_unrunnable({**cuda, "device": "cpu"}, "none", no_gpu) == (
        "TorchrunBindingNeedsGpu", "numa_policy = 'torchrun_node': torchrun binds each worker near its "
        "accelerator, and a CPU run has none")
    assert registry.vision_unrunnable(cuda, "none", registry.Machine(gpus(2), one_node, False)) == (
        "NumactlNotInstalled", "numa_policy = 'torchrun_node': torchrun's binding runs numactl")
    monkeypatch.setattr(launch, "torchrun_binding_modes", lambda: (frozenset({"node", "socket"}), None))
    assert registry.vision_unrunnable({**cuda, "numa_policy": "torchrun_exclusive"}, "none", node) == (
        "TorchrunBindingNotAvailable", "numa_policy = 'torchrun_exclusive': this torch's --numa-binding "
        "offers node, socket, not exclusive")
    # sysfs's -1 for a GPU's node: torchrun would bind its rank to node 0, so the policy is skipped
    unplaced = numa.Topology(nodes=one_node.nodes, gpus=[placed[0], replace(placed[1], numa_node=None)])
    monkeypatch.setattr(launch, "torchrun_binding_modes", lambda: every_mode)
    assert registry.vision_unrunnable(cuda, "none", registry.Machine(gpus(2), unplaced, True)) == (
        "GpuNumaNodeUnknown", "numa_policy = 'torchrun_node': the NUMA node of the trial's GPU 1 is "
        "unknown (sysfs says -1, or NVML does not list it), which torchrun would take for node 0")
    monkeypatch.setattr(launch, "torchrun_binding_modes",
                        lambda: (frozenset(), "the installed torch 2.6.0 has no torchrun --numa-binding"))
    assert registry.vision_unrunnable(cuda, "none", node) == (
        "TorchrunBindingNotAvailable",
        "numa_policy = 'torchrun_node': the installed torch 2.6.0 has no torchrun --numa-binding")


def test_bf16_on_gpus_without_bf16_is_skipped_with_the_reason() -> None:
    from multicard.measure import numa
    from multicard.workloads import registry

    one_node = numa.Topology(nodes=[numa.Node(0, [0, 1], 16000)])
    config = {"gpus": 2, "device": "cuda", "loader": "torch", "numa_policy": "none",
              "precision": "bf16"}
    turing = registry.Machine(gpus(2, (7, 5)), one_node, numactl=True)
    assert registry.vision_unrunnable(config, "none", turing) == (
        "BF16NotSupported", "bf16 needs compute capability >= 8.0 (Ampere); GPU 0 (NVIDIA GPU) is 7.5")
    assert registry.vision_unrunnable({**config, "precision": "fp16"}, "none", turing) is None
    ampere = registry.Machine(gpus(2, (8, 0)), one_node, True)
    assert registry.vision_unrunnable(config, "none", ampere) is None


def test_numa_skips_map_each_rank_through_cuda_visible_devices() -> None:
    from multicard.measure import numa
    from multicard.workloads import registry

    two = numa.Topology(
        nodes=[numa.Node(0, [0, 1], 16000), numa.Node(1, [2, 3], 16000)],
        gpus=[numa.Gpu(0, 0, [0, 1], "GPU-0", "0000:10:00.0"), numa.Gpu(1, None, [], "GPU-1",
                                                                         "0000:11:00.0")])
    config = {"gpus": 1, "device": "cuda", "loader": "torch", "numa_policy": "local",
              "precision": "fp32"}
    visible = gpus(2)
    # CUDA device 0 is NVML GPU 1 here, whose NUMA node is unknown: skipped, not bound wrongly
    assert registry.vision_unrunnable(config, "none", registry.Machine(visible, two, True, "1"))[0] == \
        "NumaPolicyNotApplicable"
    assert registry.vision_unrunnable(config, "none", registry.Machine(visible, two, True, "0")) is None


def test_a_cause_the_rank_named_itself_wins_over_the_stderr_order(tmp_path: Path) -> None:
    import json

    # the socket reset reached stderr first and the DataLoader's own line never came: the rank
    # still knew from its worker's exit status what happened
    tail = "ConnectionResetError: [Errno 104] Connection reset by peer\n"
    (tmp_path / "failure-rank0.json").write_text(json.dumps(
        {"type": "DataLoaderWorkerKilled", "message": "DataLoader worker (pid 9677) is killed by "
         "signal: Killed", "workers": [[9677, -9]]}))
    status, error = runner.classify(1, False, tail, None, 60, runner.rank_failure(tmp_path))
    assert (status, error["type"]) == ("failed", "DataLoaderWorkerKilled")
    assert error["message"] == "DataLoader worker (pid 9677) is killed by signal: Killed"
    assert error["stderr_tail"] == tail
    (tmp_path / "failure-rank0.json").write_text("{torn")
    assert runner.rank_failure(tmp_path) is None  # unreadable: the stderr rules apply


def test_an_image_that_cannot_run_a_workload_refuses_its_runs_with_the_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from multicard.errors import InputError
    from multicard.plan import spec
    from tests.helpers import EXPERIMENTS

    why = "the paper-exact image has torch 2.2.2 and no torchtune"
    monkeypatch.setenv("MULTICARD_NO_LLM", why)
    llm = spec.load(EXPERIMENTS / "table4_llm_methods.toml", "smoke")
    with pytest.raises(InputError, match=why):
        runner.run(llm, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before anything is written
    monkeypatch.delenv("MULTICARD_NO_LLM")
    assert registry.refused_here("llm") is None and registry.refused_here("vision") is None


def multi_node_trial(trial: Path, node_stderr: str) -> list[dict]:
    """A two-node trial whose node 1 failed with `node_stderr`; srun's own line in the trial's."""
    from multicard.run import cluster

    (trial / "stderr.log").parent.mkdir(parents=True, exist_ok=True)
    (trial / "stderr.log").write_text("srun: error: node8: task 1: Exited with exit code 1\n")
    for node, code in ((0, 0), (1, 1)):
        where = cluster.node_dir(trial, node)
        where.mkdir(parents=True)
        (where / "node.json").write_text(f'{{"node": {node}, "host": "node{7 + node}", '
                                         f'"returncode": {code}}}')
    (cluster.node_dir(trial, 1) / "stderr.log").write_text(node_stderr)
    return cluster.node_reports(trial, 2)


def test_a_node_out_of_memory_is_oom_and_the_launcher_lines_are_kept(tmp_path: Path) -> None:
    padding = "a line of a rank's warnings\n" * 200  # more than a tail holds
    reports = multi_node_trial(tmp_path, padding + "torch.OutOfMemoryError: CUDA out of memory.\n")
    status, error = runner._classify_nodes(tmp_path, reports, 1, False, None, 60.0)
    assert status == "oom" and error is not None and error["type"] == "OutOfMemoryError"
    tail = error["stderr_tail"]
    assert "srun: error: node8: task 1" in tail and tail.endswith("CUDA out of memory.\n")
    assert error["node"] == 1 and error["message"].endswith("(node 1 (node8) ran out of memory)")


def test_a_step_that_started_no_node_is_not_started(tmp_path: Path) -> None:
    from multicard.run import cluster

    (tmp_path / "stderr.log").write_text("srun: error: Unable to create step for job 7: Job/step "
                                         "already completing or completed\n")
    status, error = runner._classify_nodes(tmp_path, cluster.node_reports(tmp_path, 2), 1, False,
                                           None, 60.0)
    assert status == "failed" and error is not None and error["type"] == runner.NOT_STARTED
    assert error["message"] == ("no node started its part: the launcher exited with status 1: srun: "
                                "error: Unable to create step for job 7: Job/step already completing "
                                "or completed")
    assert "node" not in error


def test_a_trial_interrupted_past_its_estimate_needs_at_least_that_long() -> None:
    planned = PlannedTrial(order=0, config_id="c", config={}, params={}, trial=2)
    records = [{"config_id": "c", "trial": 2, "status": "interrupted", "wall_s": 3000.0},
               {"config_id": "c", "trial": 1, "status": "interrupted", "wall_s": 9000.0},
               {"config_id": "c", "trial": 2, "trace": "nsys", "wall_s": 8000.0}]
    # an interrupted attempt's wall time is a lower bound: a tenth more is needed
    assert runner.time_needed(60.0, planned, records) == pytest.approx(3300.0)
    assert runner.time_needed(60.0, planned, []) == 60.0
    failed = [{"config_id": "c", "trial": 2, "status": "failed", "wall_s": 100.0}]
    assert runner.time_needed(60.0, planned, failed) == 100.0


def test_a_gpu_trial_sees_only_its_own_gpus() -> None:
    # 2 of the node's 8: torchrun's --numa-binding divides a node's CPUs among the GPUs it sees
    assert launch.own_gpus("cuda", 2, None) == {"CUDA_VISIBLE_DEVICES": "0,1"}
    # what Slurm gave: its first entries as written, which CUDA reads as it read the caller's
    assert launch.own_gpus("cuda", 1, "3,5") == {"CUDA_VISIBLE_DEVICES": "3"}
    assert launch.own_gpus("cuda", 2, "GPU-9a,GPU-7b,GPU-1c") == {"CUDA_VISIBLE_DEVICES": "GPU-9a,GPU-7b"}
    assert launch.own_gpus("cpu", 2, None) == {}
    assert launch.own_gpus("cuda", 4, "0,1") == {}  # fewer than asked: refused before (_needs_gpus)
    from multicard.measure import devices

    assert devices.visible(gpus(8), "0,1") == devices.visible(gpus(8), None)[:2]


def test_a_cpu_trials_openmp_threads_spin_briefly_unless_the_caller_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from multicard.plan import spec
    from tests.helpers import write_spec

    loaded = spec.load(write_spec(tmp_path, grid={"precision": ["fp32"]}))
    planned = spec.plan(loaded)[0]
    trial_dir = tmp_path / "run" / "raw" / "t"
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    _, env = runner.trial_command(loaded, planned, tmp_path / "run", tmp_path / "data", trial_dir, 0,
                                  dict(planned.params), None)
    assert planned.params["device"] == "cpu" and env["GOMP_SPINCOUNT"] == launch.CPU_SPINCOUNT
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    _, env = runner.trial_command(loaded, planned, tmp_path / "run", tmp_path / "data", trial_dir, 0,
                                  dict(planned.params), None)
    assert env["OMP_WAIT_POLICY"] == "ACTIVE" and "GOMP_SPINCOUNT" not in env


def test_no_trial_starts_that_would_outrun_the_deadline(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from multicard.plan import cost, spec
    from multicard.run import store
    from tests.helpers import write_spec

    path = write_spec(tmp_path, grid={"precision": ["fp32"]}, trials={"count": 2})
    said: list[str] = []
    # the clock and the estimates injected: each trial is estimated at, and takes, 1000 s; the
    # deadline is 1500 s away: the first runs, the second is left for the next job
    now = [0.0]
    monkeypatch.setattr(runner, "clock", lambda: now[0])
    monkeypatch.setattr(cost, "trial_seconds", lambda workload, params: 1000.0)

    def ran(s: spec.Spec, planned: spec.PlannedTrial, *rest: object) -> dict:
        now[0] += 1000.0
        return {**runner.skipped_record(s, planned, "-", "-"), "status": "ok", "error": None}

    monkeypatch.setattr(runner, "run_trial", ran)
    outcome = runner.run(spec.load(path), tmp_path / "run", echo=said.append, deadline_unix=1500.0)
    assert (outcome.ran, outcome.left) == (1, 1)
    left = json.loads((tmp_path / "run" / runner.LEFT_FILE).read_text())
    assert left == {"left": 1, "trials": [{"trial": left["trials"][0]["trial"], "needed_s": 1000.0}],
                    "time_left_s": 500.0, "deadline_unix": 1500.0}
    assert any(line.startswith("not started: 1 trial(s) that would outrun the deadline (8m 20s left")
               for line in said), said
    assert not (tmp_path / "run" / runner.AUTO_FILE).exists()  # paused, not ended: no final decision
    # a next job of 500 s: shorter than the trial, which can never fit one; the record says so
    now[0] = 10_000.0
    again = runner.run(spec.load(path), tmp_path / "run", echo=said.append, deadline_unix=10_500.0)
    last = store.read(tmp_path / "run" / "trials.jsonl")[-1]
    assert (last["status"], last["error"]["type"]) == ("skipped", "NeedsLongerJob")
    assert again.left == 0 and not (tmp_path / "run" / runner.LEFT_FILE).exists()


def test_a_shard_runs_its_part_of_the_plan_and_keeps_to_it(tmp_path: Path) -> None:
    from multicard.errors import InputError
    from multicard.plan import spec
    from tests.helpers import write_spec

    s = spec.load(write_spec(tmp_path, grid={"precision": ["fp32", "bf16", "fp16"]}))
    parts = [[p.order for p in spec.plan(s) if spec.parse_shard(f"{i}/2").holds(p)] for i in range(2)]
    assert sorted(parts[0] + parts[1]) == [p.order for p in spec.plan(s)]
    assert not set(parts[0]) & set(parts[1])
    said: list[str] = []
    # the deadline now: nothing starts, the part's plan is counted and shard.json written
    runner.run(s, tmp_path / "p0", echo=said.append, deadline_unix=time.time(), shard=spec.Shard(0, 2))
    assert said[0].startswith(f"tiny (paper, part 0/2 of the plan): {len(parts[0])} trials planned")
    assert json.loads((tmp_path / "p0" / "shard.json").read_text()) == {"index": 0, "count": 2}
    with pytest.raises(InputError, match="holds part 0/2 of the plan; resume it with --shard 0/2"):
        runner.run(s, tmp_path / "p0", echo=said.append, deadline_unix=time.time(), shard=spec.Shard(1, 2))
    runner.run(s, tmp_path / "whole", echo=said.append, deadline_unix=time.time())
    with pytest.raises(InputError, match="holds a run of the whole plan"):
        runner.run(s, tmp_path / "whole", echo=said.append, deadline_unix=time.time(), shard=spec.Shard(0, 2))
    for bad in ("2/2", "1", "-1/2", "a/b"):
        with pytest.raises(InputError, match="expected I/N with 0 <= I < N"):
            spec.parse_shard(bad)


def test_a_multi_node_trial_past_its_timeout_blames_no_node(tmp_path: Path) -> None:
    from multicard.run import cluster

    # the planner ended the step; srun killed every node's part: none left an exit status
    for node in (0, 1):
        cluster.node_dir(tmp_path, node).mkdir(parents=True)
        (cluster.node_dir(tmp_path, node) / "node.json").write_text(f'{{"node": {node}, "host": "n{node}"}}')
    reports = cluster.node_reports(tmp_path, 2)
    status, error = runner._classify_nodes(tmp_path, reports, None, True, None, 60.0)
    assert status == "timeout" and error is not None and error["message"] == "killed after 60 s"
    assert "node" not in error and "collateral" not in error


def multi(status: str, wall_s: float, started: bool = True, config: str = "a") -> dict[str, object]:
    return {"status": status, "wall_s": wall_s, "config_id": config,
            "error": {"message": "x"} if status != "ok" else None,
            "nodes": [{"node": 0, "started": True}, {"node": 1, "started": started}]}


def test_the_breaker_counts_broken_multi_node_steps_whatever_runs_between_them() -> None:
    tally = runner.Tally(20, lambda line: None)
    single_ok = {"status": "ok", "wall_s": 50.0, "error": None}
    # never started, an ok single-node trial, failed 0.3 s after its start: broken twice so far
    for i, record in enumerate([multi("failed", 1.0, started=False), single_ok, multi("failed", 0.3)]):
        tally.add(record, "t", i)
    with pytest.raises(runner.ClusterFailure, match="3 multi-node trials in a row where a node never "
                                                    "started its part or the step failed within 10 s"):
        tally.add(multi("failed", 0.3), "t", 3)


def test_fast_failures_of_one_config_stop_the_run_and_say_the_setting_may_be_the_cause() -> None:
    # trials are interleaved: one config's trials meet in a row only where none of another is
    # left, and they would all fail alike (4 trials failed in 0.3 s formerly ended with exit 0)
    tally = runner.Tally(20, lambda line: None)
    for i in range(2):
        tally.add(multi("failed", 0.3, config="a"), "t", i)
    with pytest.raises(runner.ClusterFailure, match=r"3 multi-node trials in a row .* within 10 s, "
                                                    r"all of config a \(its setting may be the cause\)"):
        tally.add(multi("failed", 0.3, config="a"), "t", 2)
    tally = runner.Tally(20, lambda line: None)
    for i, config in enumerate("ab"):
        tally.add(multi("failed", 0.3, config=config), "t", i)
    with pytest.raises(runner.ClusterFailure) as stopped:
        tally.add(multi("failed", 0.3, config="a"), "t", 2)
    assert "all of config" not in str(stopped.value)


def test_a_multi_node_step_that_ran_resets_the_breaker_and_a_slow_failure_does_not_count() -> None:
    tally = runner.Tally(20, lambda line: None)
    for i, record in enumerate([multi("failed", 0.3), multi("failed", 0.3), multi("ok", 40.0),
                                multi("failed", 0.3), multi("failed", 0.3), multi("failed", 300.0),
                                multi("timeout", 5.0)]):
        tally.add(record, "t", i)
    assert tally.unstarted == 0


def test_at_a_timeout_a_node_that_never_started_while_another_did_is_named() -> None:
    reports = [{"node": 0, "host": "n0", "last_beat_unix": 100.0}, {"node": 1, "started": False}]
    found = runner._timed_out_blame(reports)
    assert found == runner.cluster.Blame(1, "hung before start", (0,))
    said = runner.cluster.blame_message(found, reports)
    assert said.startswith("node 1 never started its part while the others ran"), said
    assert "heartbeat" not in said
    # every node beat alike: nobody's fault, a censored timeout
    alike = [{"node": 0, "last_beat_unix": 100.0}, {"node": 1, "last_beat_unix": 99.0}]
    assert runner._timed_out_blame(alike) == runner.cluster.Blame(None, "stopped")


def test_a_timeout_while_no_node_had_started_is_a_trial_not_started(tmp_path: Path) -> None:
    # srun was still creating the step when the trial's timeout came (--immediate longer than
    # the timeout): nothing ran, so nothing is censored; the trial is run again on resume
    reports = [{"node": 0, "started": False}, {"node": 1, "started": False}]
    assert runner._timed_out_blame(reports) == runner.cluster.Blame(None, "never started")
    status, error = runner._classify_nodes(tmp_path, reports, None, True, None, 60.0)
    assert status == "failed" and error is not None and error["type"] == runner.NOT_STARTED


def test_a_run_whose_lease_another_job_took_stops_before_its_next_trial(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from multicard.plan import spec
    from multicard.run import locks, store
    from tests.helpers import write_spec

    path = write_spec(tmp_path, grid={"precision": ["fp32"]}, trials={"count": 3})
    out = tmp_path / "run"

    def ran(s: spec.Spec, planned: spec.PlannedTrial, *rest: object) -> dict:
        # during the first trial a job on another host (flock does not reach it) moves our
        # lease and writes its own
        (out / locks.OWNER_FILE).write_text(json.dumps({"slurm_job": "99", "host": "elsewhere", "pid": 7}))
        return {**runner.skipped_record(s, planned, "-", "-"), "status": "ok", "error": None}

    monkeypatch.setattr(runner, "run_trial", ran)
    with pytest.raises(runner.RunStopped, match=r"our lease now names Slurm job 99 on elsewhere; this "
                                                r"run stops before its next trial, its 1 record\(s\) kept"):
        runner.run(spec.load(path), out, echo=lambda _: None)
    assert [r["status"] for r in store.read(out / "trials.jsonl")] == ["ok"]
    # the other job's lease is left as it is
    assert json.loads((out / locks.OWNER_FILE).read_text())["slurm_job"] == "99"


def test_the_same_node_hung_twice_in_a_row_stops_the_run() -> None:
    def hung(node: int) -> dict[str, object]:
        return {**multi("failed", 700.0), "error": {"type": "NodeHung", "node": node, "message": "x"}}

    tally = runner.Tally(20, lambda line: None)
    for i, record in enumerate([hung(1), multi("ok", 40.0), hung(1), hung(2)]):
        tally.add(record, "t", i)  # another node, or a trial that ran between: no streak
    with pytest.raises(runner.ClusterFailure, match=r"node 2 hung in 2 multi-node trials in a row .*"
                                                    r"\(drain it, or --exclude it\)"):
        tally.add(hung(2), "t", 4)
