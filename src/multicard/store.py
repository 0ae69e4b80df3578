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

from filelock import FileLock

SCHEMA = 1
# interrupted: the runner was told to stop mid-trial (SIGTERM, SIGHUP, Ctrl-C); not a failure of
# the config, and a resume runs the trial again
STATUSES = ("ok", "failed", "timeout", "oom", "skipped", "interrupted")
TRIALS_FILE = "trials.jsonl"
LOCK_SUFFIX = ".lock"


class TornLineWarning(UserWarning):
    """A line of trials.jsonl that is not a complete JSON object (a crash mid-write)."""


def lock_for(path: Path) -> FileLock:
    return FileLock(str(path) + LOCK_SUFFIX)


def append(path: Path, record: dict[str, Any]) -> None:
    """Append one record as a line; durable (fsync) before returning."""
    if record.get("status") not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, got {record.get('status')!r}")
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    with lock_for(path):
        new_file = not path.exists()
        with path.open("ab") as f:
            size = f.tell()
            try:
                if size > 0 and _last_byte(path) != b"\n":
                    f.write(b"\n")  # terminate a torn line instead of gluing this record onto it
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            except OSError:  # a full disk mid-line: take the partial line back
                with contextlib.suppress(OSError):
                    f.truncate(size)
                raise
        if new_file:
            _fsync_dir(path.parent)


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
    for number in skipped:
        warnings.warn(f"{path}:{number}: skipped an incomplete record (a crash mid-write)",
                      TornLineWarning, stacklevel=3)


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
    return {(r["config_id"], r["trial"], r.get("trace", "none")) for r in records
            if r.get("status") == "ok"}
