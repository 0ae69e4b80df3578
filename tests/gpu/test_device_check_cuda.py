"""The device check's comparison on a real GPU: the harness against plain loops in their own
processes, windows of at least 10 s, and a second call that has nothing left to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT, load_script

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")]


def test_the_harness_against_plain_loops_on_a_gpu(tmp_path: Path) -> None:
    device_check = load_script(ROOT / "benchmarks" / "device_check.py", "device_check")
    out = tmp_path / "check"
    status = device_check.main(["--parts", "harness", "--trials", "2", "--out", str(out)])
    summary = json.loads((out / "device_check.json").read_text())["summary"]
    assert status == 0, summary  # every check held: a failed one is a finding to look at
    assert summary["windows_long_enough"] is True and summary["shortest_window_s"] >= 10.0
    assert summary["multicard / plain loop"]["n"] == [2, 2]
    assert summary["plain loop / bare loop"]["ratio"] > 0
    assert summary["harness_costs_too_much"] is False  # judged on a GPU
    assert summary["clocks_held_down_s"] is not None  # NVML's violation counters read
    first = json.loads((out / "plain_loop" / "round-0.json").read_text())
    assert first["probe_s"] is not None and first["max_steps"] <= 60_000 // 64
    assert device_check.main(["--parts", "harness", "--trials", "2", "--out", str(out)]) == status
