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
    assert status in (0, 1), summary  # 1 only where a check failed: said in the summary
    assert summary["windows_long_enough"] is True and summary["shortest_window_s"] >= 10.0
    assert summary["multicard / plain loop"]["n"] == [2, 2]
    assert summary["plain loop / bare loop"]["ratio"] > 0
    assert summary["harness_costs_too_much"] is not None  # judged on a GPU
    assert device_check.main(["--parts", "harness", "--trials", "2", "--out", str(out)]) == status
