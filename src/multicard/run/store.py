"""trials.jsonl: one JSON object per trial attempt, appended and fsync'd under a file lock.

The file is the run's source of truth; everything else is derived from it. Appends never rewrite
earlier lines. A line torn by a crash is kept on disk, terminated so that the next record starts
on a line of its own, and skipped with a warning by the reader.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from multicard.errors import InputError
from multicard.integrity import LOCK_SUFFIX
from multicard.plan.spec import Shard

SCHEMA = 1
# interrupted: the runner was told to stop mid-trial (SIGTERM, SIGHUP, Ctrl-C); not a failure of
# the config, and a resume runs the trial again
STATUSES = ("ok", "failed", "timeout", "oom", "skipped", "interrupted")
TRIALS_FILE = "trials.jsonl"
# a run of one part of a plan (`run --shard I/N`): {"index": I, "count": N}
SHARD_FILE = "shard.json"


class TornLineWarning(UserWarning):
    """A line of trials.jsonl that is not a complete JSON object (a crash mid-write)."""


# an append holds the lock for one write and fsync: a lock held this long has a holder that hangs
APPEND_LOCK_WAIT_S = 120.0


def lock_for(path: Path) -> FileLock:
    return FileLock(str(path) + LOCK_SUFFIX, timeout=APPEND_LOCK_WAIT_S)


def append(path: Path, record: dict[str, Any]) -> None:
    """Append one record as a line; durable (fsync) before returning."""
    if record.get("status") not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, got {record.get('status')!r}")
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    try:
        with lock_for(path):
            _append_line(path, line)
    except Timeout:
        raise InputError(f"{path}{LOCK_SUFFIX}: held for {APPEND_LOCK_WAIT_S:g} s by another process; "
                         "the record was not written (`fuser -v` on its host shows the holder)") from None


def _append_line(path: Path, line: bytes) -> None:
    new_file = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        try:
            if size > 0 and _last_byte(path) != b"\n":
                line = b"\n" + line  # terminate a torn line instead of gluing this onto it
            _write_all(fd, line)
            os.fsync(fd)
        except OSError:  # a full disk mid-line: take the partial line back
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)
    if new_file:
        _fsync_dir(path.parent)


def _write_all(fd: int, data: bytes) -> None:
    """os.write without a buffer: nothing is left to flush (and fail) after an error."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _last_byte(path: Path) -> bytes:
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read(path: Path) -> list[dict[str, Any]]:
    """Every complete record; torn or undecodable lines are skipped with a TornLineWarning."""
    records, skipped = read_with_skipped(path)
    warn_skipped(path, skipped)
    return records


def warn_skipped(path: Path, skipped: list[int]) -> None:
    """One warning per file, whatever the number of torn lines."""
    if not skipped:
        return
    lines = ", ".join(map(str, skipped[:5])) + (f" and {len(skipped) - 5} more" if len(skipped) > 5 else "")
    what = "an incomplete record" if len(skipped) == 1 else f"{len(skipped)} incomplete records"
    warnings.warn(f"{path}:{lines}: skipped {what} (a crash mid-write)", TornLineWarning, stacklevel=3)


def read_with_skipped(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """(every complete record, the line numbers of the lines that are not one)."""
    if not path.exists():
        return [], []
    records, skipped = [], []
    for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            record = None
        if isinstance(record, dict):
            records.append(record)
        else:
            skipped.append(number)
    return records, skipped


def finished(records: Iterable[dict[str, Any]]) -> set[tuple[str, int, str]]:
    """(config_id, trial, trace mode) of every trial that has an ok record."""
    return _keys(records, "ok")


def censored(records: Iterable[dict[str, Any]]) -> set[tuple[str, int, str]]:
    """(config_id, trial, trace mode) of every trial that ran past its timeout. A resume keeps
    it as it is: running it again until a faster attempt lands would drop the slow one."""
    return _keys(records, "timeout")


def _keys(records: Iterable[dict[str, Any]], status: str) -> set[tuple[str, int, str]]:
    return {(r["config_id"], r["trial"], r.get("trace", "none")) for r in records
            if r.get("status") == status}


def read_shard(run_dir: Path) -> Shard | None:
    """The part of the plan a run directory holds (shard.json), or None: the whole plan."""
    try:
        found = json.loads((run_dir / SHARD_FILE).read_text())
        return Shard(int(found["index"]), int(found["count"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{run_dir / SHARD_FILE}: expected {{\"index\": I, \"count\": N}} ({exc})") from None
