"""The step profile on this CPU: real steps, the host's numbers, and DDP's bookkeeping counted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SMALL = ["--device", "cpu", "--sizes", "32", "--precisions", "fp32", "--batch-size", "8", "--steps", "2",
         "--ddp-at", "32:fp32", "--", "--train-subset", "256", "--warmup-steps", "1"]


def profile(tmp_path: Path, flags: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "multicard.workloads.step_profile", "--out",
                           str(tmp_path / "profile.json"), *flags],
                          capture_output=True, text=True, timeout=600)


def test_one_rank_ddp_adds_host_work_that_lean_and_no_wrapper_take_away(tmp_path: Path) -> None:
    done = profile(tmp_path, SMALL)
    assert done.returncode == 0, done.stderr
    rows = {r["single_rank_ddp"]: r for r in json.loads((tmp_path / "profile.json").read_text())["rows"]}
    assert set(rows) == {"lean", "default", "none"}
    for row in rows.values():
        assert row["step_s"] > 0 and row["rank_cpu_s_per_step"] > 0
        assert row["gpu_busy_fraction"] is None and row["bound"] is None
        assert row["why"] == "CPU run: there are no GPU kernels"
    # the same step, counted operator by operator: the buffer broadcast and the bucket copies show
    ops = {w: rows[w]["probe_aten_ops_per_step"] for w in rows}
    assert ops["none"] < ops["lean"] < ops["default"], ops
    assert len(done.stdout.splitlines()) == 3  # one line per point


def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    done = profile(tmp_path, ["--device", "cpu", "--sizes", "x"])
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "--sizes/--ddp-at" in done.stderr and not (tmp_path / "profile.json").exists()
