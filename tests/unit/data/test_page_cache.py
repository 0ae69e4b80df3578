from __future__ import annotations

import os
from pathlib import Path

from multicard.data import page_cache


def test_warm_reads_every_byte_and_cold_touches_every_file(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.jpg").write_bytes(b"1" * 5000)
    (tmp_path / "y.txt").write_bytes(b"2" * 10)
    assert page_cache.warm(tmp_path) == 5010
    advised: list[int] = []
    real = os.posix_fadvise

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        advised.append(advice)
        real(fd, offset, length, advice)  # and really evict

    monkeypatch.setattr(os, "posix_fadvise", record)
    assert page_cache.evict(tmp_path) == 2
    assert advised == [os.POSIX_FADV_DONTNEED] * 2
    assert (tmp_path / "a" / "x.jpg").read_bytes() == b"1" * 5000  # data untouched


def test_cold_reaches_the_disk_only_on_a_local_file_system() -> None:
    assert page_cache.cold_reaches_disk("ext4")[0] is True
    assert page_cache.cold_reaches_disk("xfs")[0] is True
    for network in ("nfs4", "lustre", "gpfs", "fuse.sshfs"):
        disk, why = page_cache.cold_reaches_disk(network)
        assert disk is False and "client cache only" in why
    assert page_cache.cold_reaches_disk(None) == (None, "the tree's file system is unknown")
