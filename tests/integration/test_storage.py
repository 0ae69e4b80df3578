"""A full disk mid-run: one line, exit 1, every earlier record intact, no empty or torn files."""

from __future__ import annotations

import errno
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from multicard.run import store
from tests.helpers import ROOT, TINY_FIXED, tmpfs, write_spec

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "disk", "size=8m") as target:
        yield target


def fill(directory: Path) -> None:
    """Take every free block of the file system that holds `directory`."""
    with (directory / "filler").open("wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    for size in (4096, 512, 1):  # the last partial blocks
        try:
            with (directory / f"filler-{size}").open("wb") as f:
                while True:
                    f.write(b"\0" * size)
                    f.flush()
        except OSError:
            continue


def test_a_full_disk_stops_the_run_with_one_line_and_keeps_every_record(small_disk: Path,
                                                                        tmp_path: Path) -> None:
    fixed = {**TINY_FIXED, "epochs": 1, "max_steps": 2}
    path = write_spec(tmp_path, fixed=fixed, grid={"precision": ["fp32"]},
                      trials={"count": 1, "timeout_s": 300})
    out = small_disk / "run"
    argv = [sys.executable, "-m", "multicard", "run", str(path), "--out", str(out)]
    subprocess.run(argv, cwd=ROOT, check=True, capture_output=True)
    before = (out / "trials.jsonl").read_bytes()
    fill(small_disk)
    resumed = subprocess.run([*argv, "--trials", "3"], cwd=ROOT, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 1, resumed.stderr[-2000:]
    lines = [line for line in resumed.stderr.splitlines() if line.startswith("multicard:")]
    assert len(lines) == 1 and "No space left on device" in lines[0], resumed.stderr[-2000:]
    assert "1 record(s) kept in trials.jsonl" in lines[0] and "run the same command to resume" in lines[0]
    assert "Traceback" not in resumed.stderr
    assert (out / "trials.jsonl").read_bytes() == before  # intact: not torn, not truncated
    assert [r["status"] for r in store.read(out / "trials.jsonl")] == ["ok"]
    empty = [p for p in out.rglob("*") if p.is_file() and p.stat().st_size == 0
             and p.suffix == ".json"]
    assert empty == [] and not list(out.rglob(".*.tmp"))
