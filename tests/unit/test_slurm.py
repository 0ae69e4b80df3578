"""The Slurm templates, run by bash with stand-ins for apptainer and scontrol on PATH: what the
job does when Slurm warns it of the time limit, and that it resumes into the same run."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT

# apptainer: `run` (the nox session) and `exec ... multicard run` (the planner) wait, and say
# when they are told to stop; other `exec`s stand for `multicard report`/`verify`. Each call is
# one line of $CALLS, its words quoted as bash would need them.
FAKE_APPTAINER = """#!/bin/bash
line=$(printf '%q ' "$@")
echo "${line% }" >> "$CALLS"
if [ "$1" = run ] || [[ " $* " == *" multicard run "* ]]; then
    echo "SRUN_CPUS_PER_TASK=${SRUN_CPUS_PER_TASK-unset}" >> "$CALLS"
    trap 'echo "session stopped by TERM" >> "$CALLS"; kill "$!"; exit 143' TERM
    sleep "${FAKE_SESSION_S:-30}" & wait
fi
"""
FAKE_SCONTROL = """#!/bin/bash
if [ "$1 $2" = "show hostnames" ]; then printf 'node7\\nnode8\\n'; seq -f 'node%g' 9 30000; exit; fi
echo "scontrol $*" >> "$CALLS"
"""


def fake_tools(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("apptainer", FAKE_APPTAINER), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls"),
            "SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "node[7-8]",
            "SLURM_CPUS_ON_NODE": "64"}


def wait_for(path: Path, text: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in {path}")


def test_the_time_limit_warning_stops_the_session_writes_the_report_and_requeues(tmp_path: Path) -> None:
    env = fake_tools(tmp_path) | {"MULTICARD_REQUEUE": "1"}
    job = subprocess.Popen(["bash", str(ROOT / "slurm" / "singlenode.sbatch"), "table2", "--trials", "3"],
                           cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    calls = tmp_path / "calls"
    wait_for(calls, "run --nv")
    job.send_signal(signal.SIGUSR1)  # what `--signal=B:USR1@600` sends the batch shell
    out, _ = job.communicate(timeout=20)
    lines = [line for line in calls.read_text().splitlines() if not line.startswith("SRUN_")]
    run = "/opt/multicard/artifact/runs/table2"
    assert lines[0].endswith(f"multicard.sif -s table2 -- --out {run} --trials 3")
    assert lines[1:] == ["session stopped by TERM", f"exec --no-home --bind {tmp_path}/artifact:"
                         f"/opt/multicard/artifact multicard.sif multicard report {run}",
                         "scontrol requeue 4242"]
    assert job.returncode == 143 and "the time limit is near" in out


def test_a_second_submission_resumes_the_same_run(tmp_path: Path) -> None:
    env = fake_tools(tmp_path)
    (tmp_path / "bin" / "apptainer").write_text('#!/bin/bash\necho "$*" >> "$CALLS"\n')
    for _ in range(2):
        subprocess.run(["bash", str(ROOT / "slurm" / "singlenode.sbatch"), "table3"], cwd=tmp_path,
                       env=env, check=True, capture_output=True, timeout=20)
    first, second = (tmp_path / "calls").read_text().splitlines()
    assert first == second and "--out /opt/multicard/artifact/runs/table3" in first


def running_job(tmp_path: Path, argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], Path]:
    """A template started under bash, once its session (or planner) runs; on a job that never
    gets there, what it printed."""
    job = subprocess.Popen(["bash", *argv], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    calls = tmp_path / "calls"
    try:
        wait_for(calls, "SRUN_CPUS_PER_TASK")
    except AssertionError:
        job.kill()
        raise AssertionError(job.communicate()) from None
    return job, calls


MULTINODE = ROOT / "slurm" / "multinode.sbatch"
SPEC = "experiments/table2_precision.toml"


def test_the_multinode_job_plans_once_and_steps_into_the_image_on_every_node(tmp_path: Path) -> None:
    env = fake_tools(tmp_path) | {"FAKE_SESSION_S": "0"}
    done = subprocess.run(["bash", str(MULTINODE), SPEC, "--profile", "paper"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    planner, cpus, report, verify = (tmp_path / "calls").read_text().splitlines()
    run = "/opt/multicard/artifact/runs/table2_precision-2nodes"
    argv = shlex.split(planner)
    assert argv[argv.index("--nnodes") + 1] == "2"
    host, port = argv[argv.index("--rdzv-endpoint") + 1].split(":")
    assert host == "node7" and int(port) < 32768  # the first node; outside the ephemeral range
    assert shlex.split(argv[argv.index("--step-wrapper") + 1]) == [
        "apptainer", "exec", "--nv", "--no-home", "--bind",
        f"{tmp_path}/artifact:/opt/multicard/artifact", "multicard.sif"]
    assert argv[argv.index("--out") + 1] == run and argv[-2:] == ["--profile", "paper"]
    assert cpus == "SRUN_CPUS_PER_TASK=64"  # a step gets the node's CPUs, not one
    assert report.endswith(f"multicard report {run}") and verify.endswith(f"multicard verify {run}")


def test_the_multinode_job_stops_reports_and_requeues_at_the_time_limit(tmp_path: Path) -> None:
    env = fake_tools(tmp_path) | {"MULTICARD_REQUEUE": "1", "MULTICARD_RUN": "mine"}
    job, calls = running_job(tmp_path, [str(MULTINODE), SPEC], env)
    job.send_signal(signal.SIGUSR1)
    out, _ = job.communicate(timeout=20)
    lines = calls.read_text().splitlines()
    assert "--out /opt/multicard/artifact/runs/mine" in lines[0]
    assert lines[2] == "session stopped by TERM"
    assert lines[3].endswith("multicard report /opt/multicard/artifact/runs/mine")
    assert lines[4:] == ["scontrol requeue 4242"]
    assert job.returncode == 143 and "the time limit is near" in out


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_the_templates_pass_shellcheck() -> None:
    for name in ("singlenode.sbatch", "multinode.sbatch"):
        done = subprocess.run(["shellcheck", str(ROOT / "slurm" / name)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("template", ["singlenode.sbatch", "multinode.sbatch"])
def test_a_cancelled_job_reports_once_and_is_not_requeued(tmp_path: Path, template: str) -> None:
    env = fake_tools(tmp_path) | {"MULTICARD_REQUEUE": "1"}
    job, calls = running_job(tmp_path, [str(ROOT / "slurm" / template), "table2"], env)
    job.send_signal(signal.SIGTERM)  # what scancel sends the batch shell
    out, _ = job.communicate(timeout=20)
    lines = calls.read_text().splitlines()
    assert sum("multicard report" in line for line in lines) == 1
    assert not any(line.startswith("scontrol") for line in lines)
    assert job.returncode == 143 and "told to stop (SIGTERM)" in out
