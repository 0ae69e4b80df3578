"""Put a prepared tree in the page cache, or take it out, before a trial (no root needed).

`cold` asks the kernel to drop the tree's cached pages with posix_fadvise(POSIX_FADV_DONTNEED),
file by file. Unlike writing to /proc/sys/vm/drop_caches it needs no root and touches no other
file on the machine; pages that another process holds dirty or mapped may stay. `warm` reads every
file once, so the trial reads from memory. `as_is` does neither (what a plain run does).
"""

from __future__ import annotations

import os
from pathlib import Path

MODES = ("as_is", "warm", "cold")


def _files(tree: Path) -> list[Path]:
    return [p for p in tree.rglob("*") if p.is_file()]


def evict(tree: Path) -> int:
    """Drop the cached pages of every file under `tree`; returns the number of files."""
    files = _files(tree)
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return len(files)


def warm(tree: Path) -> int:
    """Read every file under `tree` once; returns the number of bytes read."""
    total = 0
    for path in _files(tree):
        with path.open("rb") as f:
            while block := f.read(1 << 20):
                total += len(block)
    return total


def apply(mode: str, tree: Path) -> None:
    if mode == "cold":
        evict(tree)
    elif mode == "warm":
        warm(tree)
