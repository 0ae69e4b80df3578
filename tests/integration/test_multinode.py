"""Several nodes per trial on one machine: one planner (`multicard run --nnodes 2`) starts every
trial as one step of a stand-in srun (tests/fixtures/wrappers/fake_srun.py) that runs each
"node"'s part on 127.0.0.1, real torchrun and gloo ranks included."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from multicard.run import cluster, runner, store
from tests.helpers import ROOT, TINY_FIXED, write_spec

pytestmark = pytest.mark.slow

FAKE_SRUN = ROOT / "tests" / "fixtures" / "wrappers" / "fake_srun.py"
ONE_CONFIG = {"fixed": {**TINY_FIXED, "gpus": 1}, "grid": {"precision": ["fp32"]}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fake_slurm(tmp_path: Path, **scenario: str) -> dict[str, str]:
    """PATH with `srun` = the stand-in; FAKE_SRUN_<KEY> for what the test wants to happen."""
    bin_dir, state = tmp_path / "bin", tmp_path / "srun-state"
    bin_dir.mkdir(exist_ok=True)
    state.mkdir(exist_ok=True)
    shim = bin_dir / "srun"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_SRUN}" "$@"\n')
    shim.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_SRUN_STATE": str(state),
            "SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "2",
            "OMP_NUM_THREADS": "1",  # two "nodes" share this machine's cores
            **{f"FAKE_SRUN_{key.upper()}": value for key, value in scenario.items()}}


def training_spec(tmp_path: Path, count: int) -> Path:
    """Trials long enough to be hit mid-training: the NUMA probe writes its snapshot
    (numa/rank<R>-rank-*) mid-epoch 0, and three more epochs of 20 steps each remain then."""
    longer = {**ONE_CONFIG["fixed"], "epochs": 4, "max_steps": 20, "train_subset": 512,
              "numa_evidence": True}
    return write_spec(tmp_path, fixed=longer, grid=ONE_CONFIG["grid"],
                      trials={"count": count, "timeout_s": 300})


def planner(spec: Path, out: Path, env: dict[str, str], endpoint: str,
            timeout_s: float = 600, *more: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "multicard", "run", str(spec), "--nnodes", "2",
            "--rdzv-endpoint", endpoint, "--out", str(out), *more]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)


def steps(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "srun-state" / "steps.jsonl").read_text().splitlines()]


def node_json(trial_dir: Path, node: int) -> dict[str, Any]:
    return json.loads((trial_dir / "nodes" / f"node{node}" / "node.json").read_text())


def argv_value(argv: list[str], flag: str) -> str:
    return next(word.split("=", 1)[1] for word in argv if word.startswith(flag + "="))


@pytest.mark.e2e  # the fast tier's multi-node trial under the stand-in srun
def test_two_consecutive_trials_meet_on_the_same_port(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, **ONE_CONFIG, trials={"count": 2, "timeout_s": 300})
    out, endpoint = tmp_path / "run", f"127.0.0.1:{free_port()}"
    done = planner(spec, out, fake_slurm(tmp_path), endpoint)
    assert done.returncode == 0, done.stdout + done.stderr
    records = store.read(out / "trials.jsonl")
    assert [(r["trial"], r["status"]) for r in records] == [(0, "ok"), (1, "ok")], records
    assert not (out / "nodes").exists()  # one planner, one trials.jsonl
    check, first, second = steps(tmp_path)  # the preflight, then one step per trial
    assert first["argv"][:7] == ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--relative=0",
                                 "--kill-on-bad-exit=1", "--label", "--mpi=none"]
    # the nodes get Slurm's variables and the listed ones only; CPU trials ask for no GPUs
    exported = argv_value(first["argv"], "--export").split(",")
    assert "OMP_NUM_THREADS" in exported and "FAKE_SRUN_STATE" not in exported
    assert not any(word.startswith("--gpus-per-node") for word in first["argv"])
    preflight = json.loads((out / "preflight.json").read_text())
    assert preflight["ok"] and [n["all_reduce"] for n in preflight["nodes"]] == [3.0, 3.0]
    assert check["ended"] <= first["started"]
    assert argv_value(first["argv"], "--rdzv-endpoint") == argv_value(second["argv"], "--rdzv-endpoint") \
        == endpoint
    assert argv_value(first["argv"], "--rdzv-id") != argv_value(second["argv"], "--rdzv-id")
    assert second["started"] >= first["ended"]  # the next step starts when every node is done
    for record in records:
        assert [n["returncode"] for n in record["nodes"]] == [0, 0]
        trial_dir = out / "raw" / Path(record["artifacts"][0]).parts[1]
        result = json.loads((trial_dir / "result.json").read_text())
        assert result["world_size"] == 2 and [r["node"] for r in result["ranks"]] == [0, 1]
        assert "--node-rank=1" in node_json(trial_dir, 1)["argv"]
        # 2 ranks x 3 steps x 8 images x 2 epochs
        assert record["metrics"]["throughput_samples_s"] * record["metrics"]["train_time_s"] == \
            pytest.approx(96)


@pytest.mark.long
def test_a_run_whose_node_1_died_mid_trial_resumes(tmp_path: Path) -> None:
    # The node dies on a sign of training, not after a delay: a fast machine finishes a short
    # trial within any fixed delay. The NUMA probe writes its snapshot mid-epoch 0; three more
    # epochs of 20 steps each remain when it appears.
    spec = training_spec(tmp_path, 2)
    out, endpoint = tmp_path / "run", f"127.0.0.1:{free_port()}"
    # step 2 (the second trial, after the preflight and the first): node 1 dies as soon as its
    # rank (rank 1) is seen training
    dying = fake_slurm(tmp_path, kill="2:1:0:numa/rank1-rank-*")
    done = planner(spec, out, dying, endpoint)
    assert done.returncode == 0, done.stdout + done.stderr
    first = store.read(out / "trials.jsonl")
    assert [(r["trial"], r["status"]) for r in first] == [(0, "ok"), (1, "failed")]
    lost = first[1]
    assert lost["error"]["type"] == "NodeLost" and "node 1 (" in lost["error"]["message"], lost["error"]
    assert lost["error"]["node"] == 1 and lost["error"]["collateral"] == [0]
    assert "returncode" not in lost["nodes"][1] and lost["nodes"][0].get("returncode") != 0
    assert lost["wall_s"] < 120  # the step ended with the node, no rendezvous waited out

    done = planner(spec, out, fake_slurm(tmp_path), endpoint)  # the job submitted again
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 trials planned, 1 already ok, 1 to run" in done.stdout
    records = store.read(out / "trials.jsonl")
    assert [(r["trial"], r["attempt"], r["status"]) for r in records] == \
        [(0, 0, "ok"), (1, 0, "failed"), (1, 1, "ok")]
    assert len(store.finished(records)) == 2
    assert not (out / "nodes").exists()


@pytest.mark.long
def test_a_node_that_starts_90_s_late_is_waited_for(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, **ONE_CONFIG, trials={"count": 1, "timeout_s": 400})
    out = tmp_path / "run"
    # late in the trial's step (1), not in the preflight's (0)
    done = planner(spec, out, fake_slurm(tmp_path, late="1:90:1"), f"127.0.0.1:{free_port()}")
    assert done.returncode == 0, done.stdout + done.stderr
    [record] = store.read(out / "trials.jsonl")
    assert record["status"] == "ok", record["error"]
    trial_dir = next((out / "raw").iterdir())
    late = node_json(trial_dir, 1)["started_unix"] - node_json(trial_dir, 0)["started_unix"]
    assert late > 88 and record["wall_s"] >= 90  # each part's own start-up adds a little jitter


@pytest.mark.long
def test_rank_0_is_on_node_0_when_node_1_starts_first(tmp_path: Path) -> None:
    # c10d would number the nodes by the order their agents sort in (host, then pid on one
    # host): node 1's agent, started first, would hold rank 0, and with it torchtune's logs.
    # Static ranks put rank 0 on node 0 whatever the order.
    spec = write_spec(tmp_path, **ONE_CONFIG, trials={"count": 1, "timeout_s": 300})
    out = tmp_path / "run"
    done = planner(spec, out, fake_slurm(tmp_path, late="0:8"), f"127.0.0.1:{free_port()}")
    assert done.returncode == 0, done.stdout + done.stderr
    [record] = store.read(out / "trials.jsonl")
    assert record["status"] == "ok", record["error"]
    trial_dir = next((out / "raw").iterdir())
    assert node_json(trial_dir, 1)["pid"] < node_json(trial_dir, 0)["pid"]
    result = json.loads((trial_dir / "result.json").read_text())
    assert [(r["rank"], r["node"]) for r in result["ranks"]] == [(0, 0), (1, 1)]


@pytest.mark.long
def test_a_planner_told_to_stop_mid_step_records_it_and_leaves_nothing_running(tmp_path: Path) -> None:
    # stopped on a sign of training (the NUMA probe's mid-epoch snapshot), not after a delay
    spec = training_spec(tmp_path, 1)
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "multicard", "run", str(spec), "--nnodes", "2", "--rdzv-endpoint",
            f"127.0.0.1:{free_port()}", "--out", str(out)]
    proc = subprocess.Popen(argv, cwd=ROOT, env=fake_slurm(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not list(out.glob("raw/*/numa/rank1-rank-*")):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)  # scancel, or the template's trap
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, output
    [record] = store.read(out / "trials.jsonl")
    assert record["status"] == "interrupted"
    trial_dir = next((out / "raw").iterdir())
    time.sleep(1)
    left = [entry.name for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and str(trial_dir).encode() in _cmdline(entry.name)]
    assert left == [], [_cmdline(pid) for pid in left]


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_an_llm_trial_across_nodes_on_cpu_is_recorded_as_skipped(tmp_path: Path) -> None:
    # torchtune 0.6.1's distributed recipes start NCCL: the trial cannot run on CPU, and says so
    fixed = {"device": "cpu", "model": "tiny", "data": "synthetic", "dtype": "fp32", "seq_len": 64,
             "max_steps": 3, "warmup_steps": 1, "gpus": 1}
    spec = write_spec(tmp_path, name="llm2", experiment_workload="llm", fixed=fixed,
                      grid={"method": ["lora"]}, trials={"count": 1, "timeout_s": 300})
    out = tmp_path / "run"
    env = fake_slurm(tmp_path) | {"MULTICARD_CACHE_DIR": str(tmp_path / "cache")}
    done = planner(spec, out, env, f"127.0.0.1:{free_port()}")
    assert done.returncode == 0, done.stdout + done.stderr
    [record] = store.read(out / "trials.jsonl")
    assert record["status"] == "skipped" and record["error"]["type"] == "NeedsGPUs", record["error"]
    assert "lora_finetune_distributed" in record["error"]["message"]


def test_several_nodes_need_an_endpoint(tmp_path: Path) -> None:
    path = write_spec(tmp_path)
    result = subprocess.run([sys.executable, "-m", "multicard", "run", str(path), "--nnodes", "2",
                             "--out", str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1


def test_a_launcher_that_never_starts_stops_the_run_before_any_trial(tmp_path: Path) -> None:
    # a wrong bind path, or no apptainer on the compute nodes, fails every node the same way
    spec = write_spec(tmp_path, **ONE_CONFIG, trials={"count": 20, "timeout_s": 300})
    out = tmp_path / "run"
    done = planner(spec, out, fake_slurm(tmp_path), f"127.0.0.1:{free_port()}", 120,
                   "--launcher", "false", "--node-rank-env", "X")
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("multicard: error: preflight: no node started its part: the launcher "
                           "exited with status 1") and "no trial was started" in line, line
    assert store.read(out / "trials.jsonl") == []
    assert json.loads((out / "preflight.json").read_text())["ok"] is False


def test_each_step_asks_for_the_job_s_cpus_and_one_srun_refuses_stops_the_run_at_once(
        tmp_path: Path) -> None:
    # every step's srun line asks for the job's CPUs per node (--cpus-per-task): here all this
    # machine has, which each "node" then gets; a job that says it holds more than there are is
    # refused by srun at the preflight, one line, no trial
    spec = write_spec(tmp_path, **ONE_CONFIG, trials={"count": 1, "timeout_s": 300})
    own, out = len(os.sched_getaffinity(0)), tmp_path / "run"
    env = {**fake_slurm(tmp_path), "SLURM_JOB_CPUS_PER_NODE": f"{own}(x2)"}
    done = planner(spec, out, env, f"127.0.0.1:{free_port()}", 240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(f"--cpus-per-task={own}" in step["argv"] for step in steps(tmp_path))
    preflight = json.loads((out / "preflight.json").read_text())
    assert [n["cpus"] for n in preflight["nodes"]] == [own, own]
    more, elsewhere = tmp_path / "more", tmp_path / "second"
    elsewhere.mkdir()
    env = {**fake_slurm(elsewhere), "SLURM_JOB_CPUS_PER_NODE": f"{own + 2}(x2)"}
    done = planner(spec, more, env, f"127.0.0.1:{free_port()}", 240)
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "preflight: no node started its part" in line and "More processors requested" in line, line
    assert store.read(more / "trials.jsonl") == []


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="binding fewer CPUs needs 2")
def test_a_step_bound_to_fewer_cpus_than_the_job_holds_stops_the_run_at_the_preflight(
        tmp_path: Path) -> None:
    # the job holds all this machine's CPUs on each node, but srun binds each task to one (as
    # Slurm >= 23.11 did for a step with --exact and no --cpus-per-task): every rank and loader
    # worker of a node would share one CPU; the preflight names the nodes, no trial starts
    spec = write_spec(tmp_path, **ONE_CONFIG, trials={"count": 1, "timeout_s": 300})
    own, out = len(os.sched_getaffinity(0)), tmp_path / "run"
    env = {**fake_slurm(tmp_path, cpus="1"), "SLURM_JOB_CPUS_PER_NODE": f"{own}(x2)"}
    done = planner(spec, out, env, f"127.0.0.1:{free_port()}", 240)
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "node 0 (" in line, line
    assert f"the step is bound to 1 CPU(s) of the {own} the job holds there" in line, line
    assert store.read(out / "trials.jsonl") == []


def test_trials_that_stop_starting_mid_run_stop_it(tmp_path: Path) -> None:
    # the preflight (step 0) passes; from step 1 on srun cannot create a step any more
    spec = write_spec(tmp_path, **ONE_CONFIG, trials={"count": 5, "timeout_s": 300})
    out = tmp_path / "run"
    done = planner(spec, out, fake_slurm(tmp_path, fail_from="1"), f"127.0.0.1:{free_port()}")
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "3 multi-node trials in a row where a node never started its part" in line, line
    assert "Unable to create step" in line, line
    records = store.read(out / "trials.jsonl")
    assert [(r["trial"], r["status"], r["error"]["type"]) for r in records] == \
        [(t, "failed", "NotStarted") for t in range(3)]
    assert all(r["nodes"] == [{"node": 0, "started": False}, {"node": 1, "started": False}]
               for r in records)


def test_a_step_srun_cannot_create_is_a_trial_not_started_not_a_wait(tmp_path: Path) -> None:
    # step 1 (the first trial) cannot be created for 100000 s (a hung node still holds its
    # resources): srun, told --immediate, gives up at once; the trial is failed, never started,
    # rerun on resume; the next trial runs
    spec = write_spec(tmp_path, **ONE_CONFIG, trials={"count": 2, "timeout_s": 300})
    out = tmp_path / "run"
    done = planner(spec, out, fake_slurm(tmp_path, create_s="100000:1"), f"127.0.0.1:{free_port()}", 300)
    assert done.returncode == 0, done.stdout + done.stderr
    first, second = store.read(out / "trials.jsonl")
    assert (first["status"], first["error"]["type"]) == ("failed", "NotStarted"), first["error"]
    # it did not wait for the step: srun gave up at once, not after --immediate's 300 s
    assert "Requested nodes are busy" in first["error"]["message"]
    assert first["wall_s"] < cluster.STEP_CREATE_WAIT_S
    assert second["status"] == "ok"
    assert all("--immediate=300" in step["argv"] for step in steps(tmp_path))


def test_a_node_that_breaks_mid_run_stops_it_after_three_fast_failures(tmp_path: Path) -> None:
    # the preflight (step 0) passes; from step 1 on node 1 dies as soon as its part has started
    # (a node whose image or driver broke): each trial fails within a few seconds, the planner
    # stops after three (two configs: the nodes', not one config's), naming node 1
    spec = write_spec(tmp_path, fixed=ONE_CONFIG["fixed"], grid={"precision": ["fp32", "fp64"]},
                      trials={"count": 3, "timeout_s": 300})
    out = tmp_path / "run"
    env = fake_slurm(tmp_path, kill="1+:1:0:nodes/node1/node.json")
    done = planner(spec, out, env, f"127.0.0.1:{free_port()}")
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "3 multi-node trials in a row where a node never started its part or the step failed " \
           "within 10 s" in line and "node 1" in line, line
    records = store.read(out / "trials.jsonl")
    assert len(records) == 3 and len({r["config_id"] for r in records}) == 2
    assert all(r["status"] == "failed" and r["error"]["node"] == 1 and r["wall_s"] < runner.FAST_FAIL_S
               for r in records), [r["error"] for r in records]


@pytest.mark.long
def test_a_hung_node_is_named_and_its_trial_failed_and_run_again(tmp_path: Path) -> None:
    # node 1 stops (SIGSTOP: nothing it runs makes progress or ends) once its rank trains; node
    # 0's ranks wait on it until the trial's timeout. Formerly a censored timeout, never run
    # again and naming no node; now node 1's heartbeat, 60 s and more behind node 0's, names it
    longer = {**ONE_CONFIG["fixed"], "epochs": 4, "max_steps": 20, "train_subset": 512,
              "numa_evidence": True}
    spec = write_spec(tmp_path, fixed=longer, grid=ONE_CONFIG["grid"],
                      trials={"count": 1, "timeout_s": cluster.HUNG_AFTER_S + 60})
    out, endpoint = tmp_path / "run", f"127.0.0.1:{free_port()}"
    done = planner(spec, out, fake_slurm(tmp_path, stop="1:1:0:numa/rank1-rank-*"), endpoint)
    assert done.returncode == 0, done.stdout + done.stderr
    [hung] = store.read(out / "trials.jsonl")
    assert hung["status"] == "failed" and hung["error"]["type"] == "NodeHung", hung["error"]
    assert hung["error"]["node"] == 1 and hung["error"]["collateral"] == [0]
    assert "node 1 (" in hung["error"]["message"] and "hung node" in hung["error"]["message"]
    done = planner(spec, out, fake_slurm(tmp_path), endpoint)  # resumed: the trial runs again
    assert done.returncode == 0, done.stdout + done.stderr
    assert [(r["attempt"], r["status"]) for r in store.read(out / "trials.jsonl")] == \
        [(0, "failed"), (1, "ok")]


@pytest.mark.long
def test_an_oom_on_node_1_is_recorded_as_node_1s_oom(tmp_path: Path) -> None:
    # the cgroup OOM killer of node 1 kills its rank mid-training (step 1: the first trial);
    # --kill-on-bad-exit then ends node 0's part, which is collateral, not the cause
    spec = training_spec(tmp_path, 1)
    out = tmp_path / "run"
    done = planner(spec, out, fake_slurm(tmp_path, oom="1:1:0:numa/rank1-rank-*"),
                   f"127.0.0.1:{free_port()}")
    assert done.returncode == 0, done.stdout + done.stderr
    [record] = store.read(out / "trials.jsonl")
    assert record["status"] == "oom", record["error"]
    assert record["error"]["node"] == 1 and "node 1 (" in record["error"]["message"], record["error"]
    assert "ran out of memory" in record["error"]["message"]
    assert record["error"]["collateral"] == [0]  # ended after node 1, by itself or by srun


@pytest.mark.long
def test_the_nodes_run_their_own_python_inside_the_step_wrapper(tmp_path: Path) -> None:
    # The wrapper stands for `apptainer exec IMAGE`: it gives the node's part the image's PATH
    # (here this environment's bin/ first), and the step exports no PATH or PYTHONPATH of the
    # planner's; the node's part runs `python3` from there and fills in its own interpreter.
    wrapper = tmp_path / "image"
    wrapper.write_text(f'#!/bin/sh\nexport PATH="{Path(sys.executable).parent}:/usr/bin:/bin"\nexec "$@"\n')
    wrapper.chmod(0o755)
    spec = write_spec(tmp_path, **ONE_CONFIG, trials={"count": 1, "timeout_s": 300})
    out = tmp_path / "run"
    done = planner(spec, out, fake_slurm(tmp_path), f"127.0.0.1:{free_port()}", 600,
                   "--step-wrapper", str(wrapper))
    assert done.returncode == 0, done.stdout + done.stderr
    [record] = store.read(out / "trials.jsonl")
    assert record["status"] == "ok", record["error"]
    trial_step = steps(tmp_path)[1]["argv"]
    exported = argv_value(trial_step, "--export").split(",")
    assert "PATH" not in exported and "PYTHONPATH" not in exported
    assert trial_step[trial_step.index(str(wrapper)) + 1:][:3] == ["python3", "-m", "multicard.run.node_step"]
    assert sys.executable not in trial_step and cluster.PYTHON_SLOT in trial_step
    trial_dir = next((out / "raw").iterdir())
    node = node_json(trial_dir, 1)
    assert node["python"] == str(Path(sys.executable).parent / "python3")
    assert node["argv"][0] == node["python"]
