"""Locks that mean something on a cluster's shared file systems.

flock is what makes one run directory one writer's: the kernel drops a dead holder's lock, so a
crashed or requeued job never blocks the next. Where a file system has no flock (Lustre mounted
`noflock`, some NFS exports) filelock would fall back to a marker file that no other host can
tell is stale; and where flock is only local to a host (Lustre `localflock`, NFSv3 `nolock`) two
jobs on two hosts could both hold it. So:

- `check_flock` refuses, in one line, a directory whose file system answers flock with "not
  supported";
- the run lock carries a lease: the holder's Slurm job, host and pid in OWNER_FILE. A lease of
  this host (its holder would hold the flock we got) or of this job (requeued) is ours to take;
  one whose job squeue says has ended is stale and taken over; one whose job still runs, or whose
  state nothing here can tell (no squeue inside an image, a failing controller), is refused, with
  the way out (flock did not reach across hosts: Lustre localflock, NFSv3 nolock);
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

from multicard import integrity
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


def slurm_job_state(job_id: str) -> str:
    """"alive" (squeue shows it holding its nodes), "ended" (squeue answers, and not with it: done
    or unknown to the controller) or "unknown" (no squeue here, or it failed: a controller
    hiccup is no proof that a job ended)."""
    squeue = shutil.which("squeue")
    if squeue is None:
        return "unknown"
    try:
        found = subprocess.run([squeue, "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                               text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if any(state.strip() in ALIVE_STATES for state in found.stdout.splitlines()):
        return "alive"
    if found.returncode == 0 or "Invalid job id" in found.stderr:
        return "ended"
    return "unknown"


def owner() -> dict[str, Any]:
    return {"slurm_job": os.environ.get("SLURM_JOB_ID"), "host": socket.gethostname(),
            "pid": os.getpid(), "since_unix": round(time.time(), 3)}


def lease_refusal(held: dict[str, Any], me: dict[str, Any], lease: Path,
                  job_state: Callable[[str], str] = slurm_job_state) -> str | None:
    """Why another holder's lease stops this run, or None when it is ours or stale. On this host
    a holder that still ran would hold the flock we hold: it is gone. Elsewhere the scheduler
    says whether its job runs; where nothing can tell, the run is refused, with the way out."""
    job = held.get("slurm_job")
    if (job and job == me["slurm_job"]) or held.get("host") == me["host"]:
        return None
    state = job_state(str(job)) if job else "unknown"
    if state == "ended":
        return None
    who = f"Slurm job {job} on {held.get('host')}" if job else f"pid {held.get('pid')} on {held.get('host')}"
    if state == "alive":
        return f"{who} is using this directory (its flock does not reach this host: localflock or NFS nolock)"
    return (f"{who} holds this directory's lease and nothing here can tell whether it still runs (no "
            f"squeue, or it failed); if it has ended, remove {lease} and run again")


TAKEN = "another job took this directory's lease just now; wait for it or use another --out"


def _take_lease(lease: Path, me: dict[str, Any], stale: dict[str, Any] | None) -> None:
    """Write our lease with O_EXCL, after moving away the `stale` one we judged (never a lease
    we did not read): of two jobs on two hosts that take it at once, one holds it and the other
    fails here, before writing anything."""
    if stale is not None:
        _remove_stale(lease, me, stale)
    try:
        fd = os.open(lease, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise InputError(f"{lease.parent}: {TAKEN}") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(me))
    except OSError:  # a full disk: no empty lease left behind
        lease.unlink(missing_ok=True)
        raise
    if integrity.read_json_object(lease) != me:  # cannot happen with O_EXCL: said, not assumed
        raise InputError(f"{lease.parent}: {TAKEN}")


def lease_lost(lease: Path, me: dict[str, Any]) -> str | None:
    """Why `lease` no longer holds our lease `me`, or None while it does. Jobs on hosts that
    flock does not join can still, in a window of milliseconds, move a lease just taken (a
    third job judging the same stale one; _remove_stale puts it back, unless a fourth wrote one
    meanwhile): a run checks before each trial and stops rather than write beside another."""
    held = integrity.read_json_object(lease)
    if held == me:
        return None
    if held is None:
        return f"{lease}: our lease is gone or cannot be read (another job moved it)"
    return f"{lease}: our lease now names Slurm job {held.get('slurm_job')} on {held.get('host')}"


def _remove_stale(lease: Path, me: dict[str, Any], stale: dict[str, Any]) -> None:
    """rename(2) is atomic: of two jobs removing the same stale lease only one moves it. One that
    moved a newer lease (another job's, taken meanwhile) puts it back and fails."""
    moved = lease.with_name(f"{lease.name}.{me['host']}.{me['pid']}.stale")
    try:
        lease.rename(moved)
    except FileNotFoundError:  # another job moved it first: the O_EXCL create decides
        return
    if integrity.read_json_object(moved) == stale:
        moved.unlink(missing_ok=True)
        return
    with contextlib.suppress(FileExistsError):
        os.link(moved, lease)  # back where it was, unless a third job wrote one meanwhile
    moved.unlink(missing_ok=True)
    raise InputError(f"{lease.parent}: {TAKEN}")


@contextlib.contextmanager
def run_lock(out: Path) -> Iterator[Callable[[], str | None]]:
    """One writer per run directory, across hosts: flock (refusing a file system without it)
    and a lease that a job on another host sees. Yields a check the runner makes before each
    trial: why the lease is no longer ours (lease_lost), or None."""
    lock_file = out / ".run.lock"
    check_flock(lock_file)
    lock = FileLock(str(lock_file), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise InputError(f"{out}: another multicard run is using this directory") from None
    lease, me = out / OWNER_FILE, owner()
    try:
        held = integrity.read_json_object(lease)
        if held is None and lease.exists():  # never removed unread: it may be a job's, mid-write
            raise InputError(f"{lease}: a lease that cannot be read (empty or damaged); if no job "
                             "uses this directory, remove it and run again")
        if held and (why := lease_refusal(held, me, lease)):
            raise InputError(f"{out}: {why}; or use another --out")
        _take_lease(lease, me, held)
        try:
            yield lambda: lease_lost(lease, me)
        finally:
            if lease_lost(lease, me) is None:  # another job's lease stays where it is
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
