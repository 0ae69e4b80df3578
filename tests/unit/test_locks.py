"""Locks on shared file systems: a file system without flock is refused, another job's live
lease is refused, a stale one is taken over, and a wait for a lock ends."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
import time
from pathlib import Path

import pytest

from multicard import locks, runner, spec
from multicard.errors import InputError
from tests.helpers import write_spec


def no_flock(fd: int, operation: int) -> None:
    # what Lustre mounted noflock answers (the only kind of file system without flock we can
    # name here: this machine's have it)
    raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))


def test_a_run_directory_without_flock_is_refused_in_one_line(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_spec(tmp_path)
    monkeypatch.setattr(locks.fcntl, "flock", no_flock)
    with pytest.raises(InputError) as refused:
        runner.run(spec.load(path), tmp_path / "run", echo=lambda _: None)
    message = str(refused.value)
    assert "does not support flock (Function not implemented" in message and "mount -o flock" in message
    assert "\n" not in message
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".run.lock"]  # nothing else written


def fake_squeue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, running: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(f'#!/bin/sh\n[ "$3" = "{running}" ] && echo RUNNING\nexit 0\n')
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_another_live_job_s_lease_is_refused_and_a_stale_one_taken_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # flock held on another host does not show here (Lustre localflock, NFSv3 nolock): the
    # lease does, and the scheduler says whether its job still runs
    fake_squeue(tmp_path, monkeypatch, running="41")
    out = tmp_path / "run"
    out.mkdir()
    lease = {"slurm_job": "41", "host": "node3", "pid": 7, "since_unix": 1.0}
    (out / locks.OWNER_FILE).write_text(json.dumps(lease))
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    with pytest.raises(InputError, match="Slurm job 41 on node3 is using this directory"), \
            locks.run_lock(out):
        pass
    (out / locks.OWNER_FILE).write_text(json.dumps(lease | {"slurm_job": "40"}))  # job 40 ended
    with locks.run_lock(out):
        held = json.loads((out / locks.OWNER_FILE).read_text())
        assert held["slurm_job"] == "42" and held["pid"] == os.getpid()
    assert not (out / locks.OWNER_FILE).exists()  # released: no lease left behind
    monkeypatch.setenv("SLURM_JOB_ID", "41")  # the same job, requeued: its own lease
    (out / locks.OWNER_FILE).write_text(json.dumps(lease))
    with locks.run_lock(out):
        pass


def test_without_squeue_a_lease_cannot_be_checked_and_flock_decides(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    assert locks.slurm_job_alive("41") is False


def test_a_wait_for_a_lock_ends_with_one_line(tmp_path: Path) -> None:
    lock_file = tmp_path / ".prepare.lock"
    holder = os.open(lock_file, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another run preparing inputs
    said: list[str] = []
    t0 = time.monotonic()
    try:
        with pytest.raises(InputError, match=r"waited 0.5 s for another run preparing"), \
                locks.waiting_lock(lock_file, "another run preparing inputs", 0.5, said.append):
            pass
    finally:
        os.close(holder)
    assert time.monotonic() - t0 < 30
    assert said == ["waiting for another run preparing inputs (up to 0.5 s)"]
    with locks.waiting_lock(lock_file, "another run preparing inputs", 0.5, said.append):
        pass  # free again
