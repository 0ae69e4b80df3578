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
# File systems whose data lives on servers: fadvise drops this client's cached pages only, and
# the servers' caches (Lustre OSS, NFS server, GPFS NSD) may still hold the tree
NETWORK_FS = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "ceph", "9p", "fuse")


def cold_reaches_disk(fstype: str | None) -> tuple[bool | None, str]:
    """Whether `cold` means read from the disk on a file system of this type, and why (or why not)."""
    if fstype is None:
        return None, "the tree's file system is unknown"
    if fstype.split(".")[0] in NETWORK_FS:
        return False, (f"{fstype} is a network file system: cold drops this node's client cache "
                       "only, the servers' may still hold the tree (stage it to node-local disk "
                       "for a disk-cold read)")
    return True, f"{fstype}: the tree's pages are dropped from this node's page cache"


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
