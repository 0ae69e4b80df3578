"""Locks that mean something on a cluster's shared file systems.

flock is what makes one run directory one writer's: the kernel drops a dead holder's lock, so a
crashed or requeued job never blocks the next. Where a file system has no flock (Lustre mounted
`noflock`, some NFS exports) filelock would fall back to a marker file that no other host can
tell is stale; and where flock is only local to a host (Lustre `localflock`, NFSv3 `nolock`) two
jobs on two hosts could both hold it. So:

- `check_flock` refuses, in one line, a directory whose file system answers flock with "not
  supported";
- the run lock carries a lease: the holder's Slurm job, host and pid in OWNER_FILE; a job that
  finds another job's lease, and the scheduler says that job still runs, refuses (flock here did
  not reach across hosts); a lease whose job has ended is stale and taken over;
- every wait for a lock has a timeout and says what it waited for.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from multicard import artifact
from multicard.errors import InputError

# what a file system without flock answers (Lustre noflock: ENOSYS; NFS without lockd: ENOLCK)
NO_FLOCK = (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL)
OWNER_FILE = ".run.owner.json"
# squeue's states of a job that still holds its nodes
ALIVE_STATES = ("RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "CONFIGURING", "RESIZING", "SIGNALING")


def check_flock(lock_file: Path) -> None:
    """Bad input when `lock_file`'s file system does not support flock (one line, what to do)."""
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError as exc:
        if exc.errno in NO_FLOCK:
            raise InputError(f"{lock_file.parent}: this file system does not support flock "
                             f"({os.strerror(exc.errno or 0)}; Lustre mounted noflock, or NFS "
                             "without locking): two jobs could both write here; use a directory "
                             "on a file system with flock (Lustre: mount -o flock)") from None
        if exc.errno not in (errno.EAGAIN, errno.EACCES):  # held by another: flock works
            raise
    finally:
        os.close(fd)


def slurm_job_alive(job_id: str) -> bool:
    """Whether Slurm says the job still runs; False where squeue is missing or cannot tell."""
    squeue = shutil.which("squeue")
    if squeue is None:
        return False
    try:
        found = subprocess.run([squeue, "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                               text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(state.strip() in ALIVE_STATES for state in found.stdout.splitlines())


def owner() -> dict[str, Any]:
    return {"slurm_job": os.environ.get("SLURM_JOB_ID"), "host": socket.gethostname(),
            "pid": os.getpid(), "since_unix": round(time.time(), 3)}


def other_live_owner(lease: Path, me: dict[str, Any],
                     alive: Callable[[str], bool] = slurm_job_alive) -> dict[str, Any] | None:
    """The lease's holder, when it is another Slurm job that the scheduler says still runs."""
    try:
        held = json.loads(lease.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    job = held.get("slurm_job") if isinstance(held, dict) else None
    if not job or job == me["slurm_job"] or not alive(str(job)):
        return None
    return held


@contextlib.contextmanager
def run_lock(out: Path) -> Iterator[None]:
    """One writer per run directory, across hosts: flock (refusing a file system without it)
    and a lease that a job on another host would see."""
    lock_file = out / ".run.lock"
    check_flock(lock_file)
    lock = FileLock(str(lock_file), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise InputError(f"{out}: another multicard run is using this directory") from None
    lease, me = out / OWNER_FILE, owner()
    try:
        if held := other_live_owner(lease, me):
            raise InputError(f"{out}: Slurm job {held['slurm_job']} on {held['host']} is using this "
                             "directory (its flock does not reach this host: localflock or NFS "
                             "nolock); wait for it or use another --out")
        artifact.write_text_atomic(lease, json.dumps(me))
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                lease.unlink()
    finally:
        lock.release()


@contextlib.contextmanager
def waiting_lock(lock_file: Path, what: str, timeout_s: float, echo: Callable[[str], None]) -> Iterator[None]:
    """A lock others may hold for a while (preparing inputs): say so while waiting, give up after
    `timeout_s` with one line naming the lock file."""
    lock = FileLock(str(lock_file))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        echo(f"waiting for {what} (up to {timeout_s:g} s)")
        try:
            lock.acquire(timeout=timeout_s)
        except Timeout:
            raise InputError(f"{lock_file}: waited {timeout_s:g} s for {what}, which still holds "
                             "this lock (`fuser -v` on its host shows the process)") from None
    try:
        yield
    finally:
        lock.release()
