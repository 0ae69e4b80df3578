"""Locks on shared file systems: a file system without flock is refused, another job's live
lease is refused, a stale one is taken over, and a wait for a lock ends."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
from pathlib import Path

import pytest

from multicard.errors import InputError
from multicard.plan import spec
from multicard.run import locks, runner
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
    """squeue as Slurm answers: the state of a running job, nothing for one that ended, and
    "Invalid job id specified" (exit 1) for one the controller has forgotten."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(f"""#!/bin/sh
case "$3" in
    {running}) echo RUNNING ;;
    39) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;;
    38) echo "slurm_load_jobs error: Unable to contact slurm controller" >&2; exit 1 ;;
esac
""")
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
    for ended in ("40", "39"):  # done, or forgotten by the controller
        (out / locks.OWNER_FILE).write_text(json.dumps(lease | {"slurm_job": ended}))
        with locks.run_lock(out):
            held = json.loads((out / locks.OWNER_FILE).read_text())
            assert held["slurm_job"] == "42" and held["pid"] == os.getpid()
        assert not (out / locks.OWNER_FILE).exists()  # released: no lease left behind
    monkeypatch.setenv("SLURM_JOB_ID", "41")  # the same job, requeued: its own lease
    (out / locks.OWNER_FILE).write_text(json.dumps(lease))
    with locks.run_lock(out):
        pass


def test_a_lease_nothing_here_can_check_is_refused_with_the_way_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    out.mkdir()
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    # a controller that does not answer is no proof the job ended
    fake_squeue(tmp_path, monkeypatch, running="41")
    (out / locks.OWNER_FILE).write_text(json.dumps({"slurm_job": "38", "host": "node3", "pid": 7}))
    with pytest.raises(InputError, match=f"if it has ended, remove {out / locks.OWNER_FILE}"), \
            locks.run_lock(out):
        pass
    # no squeue at all (a planner inside an image)
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    assert locks.slurm_job_state("41") == "unknown"
    with pytest.raises(InputError, match="nothing here can tell whether it still runs"), locks.run_lock(out):
        pass
    # a lease of this host is stale: its holder would hold the flock this process got
    (out / locks.OWNER_FILE).write_text(json.dumps({"slurm_job": "38", "host": locks.owner()["host"]}))
    with locks.run_lock(out):
        pass


def test_two_jobs_taking_one_lease_at_once_never_both_hold_it(tmp_path: Path) -> None:
    # two hosts whose flock does not reach each other, both past the lease check
    lease = tmp_path / locks.OWNER_FILE
    first = {"slurm_job": "51", "host": "node1", "pid": 1}
    second = {"slurm_job": "52", "host": "node2", "pid": 2}
    locks._take_lease(lease, first, None)  # no lease when either read it
    with pytest.raises(InputError, match="another job took this directory's lease just now"):
        locks._take_lease(lease, second, None)  # formerly: it removed the first's lease and took it
    assert json.loads(lease.read_text()) == first
    # both judged the same stale lease (its job had ended); the first takes it over ...
    stale = {"slurm_job": "40", "host": "node3", "pid": 3}
    lease.write_text(json.dumps(stale))
    locks._take_lease(lease, first, stale)
    # ... and the second, moving what is now the first's lease, puts it back and refuses
    with pytest.raises(InputError, match="another job took this directory's lease just now"):
        locks._take_lease(lease, second, stale)
    assert json.loads(lease.read_text()) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == [locks.OWNER_FILE]  # nothing left over


def test_a_wait_for_a_lock_ends_with_one_line(tmp_path: Path) -> None:
    lock_file = tmp_path / ".prepare.lock"
    holder = os.open(lock_file, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another run preparing inputs
    said: list[str] = []
    try:
        with pytest.raises(InputError, match=r"waited 0.5 s for another run preparing"), \
                locks.waiting_lock(lock_file, "another run preparing inputs", 0.5, said.append):
            pass
    finally:
        os.close(holder)
    assert said == ["waiting for another run preparing inputs (up to 0.5 s)"]
    with locks.waiting_lock(lock_file, "another run preparing inputs", 0.5, said.append):
        pass  # free again


def test_an_append_waits_for_the_records_lock_a_bounded_time(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from multicard.run import store

    monkeypatch.setattr(store, "APPEND_LOCK_WAIT_S", 0.3)
    trials = tmp_path / "trials.jsonl"
    holder = os.open(f"{trials}{store.LOCK_SUFFIX}", os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # a process that hangs holding it
    try:
        with pytest.raises(InputError, match=r"held for 0.3 s by another process; the record was not"):
            store.append(trials, {"status": "ok", "trial": 0})
    finally:
        os.close(holder)
    assert not trials.exists()
    store.append(trials, {"status": "ok", "trial": 0})
    assert store.read(trials) == [{"status": "ok", "trial": 0}]


def test_a_lease_that_cannot_be_read_is_named_never_removed_unread(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / locks.OWNER_FILE).write_text("")  # a job between its O_EXCL create and its write
    with pytest.raises(InputError, match="a lease that cannot be read"), locks.run_lock(out):
        pass
    assert (out / locks.OWNER_FILE).exists()
