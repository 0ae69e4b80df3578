"""The device check's comparison on a real GPU: benchmarks/harness_ab.py's A-B-B-A blocks of the
harness and a plain loop in one process, both operating points, judged at the host-bound one, and
a second call that has nothing left to do."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT, load_script

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")]


def test_the_harness_against_a_plain_loop_on_a_gpu(tmp_path: Path) -> None:
    device_check = load_script(ROOT / "benchmarks" / "device_check.py", "device_check")
    out = tmp_path / "check"
    status = device_check.main(["--parts", "harness", "--out", str(out)])
    summary = json.loads((out / "device_check.json").read_text())["summary"]
    assert status == 0, summary  # every check held: a failed one is a finding to look at
    found = json.loads((out / "harness" / device_check.HARNESS_FILE).read_text())
    assert [p["name"] for p in found["points"]] == ["host-bound", "judged"] and found["gpu"]
    for point in found["points"]:
        for run in ("main", "control"):
            ratio = point["results"][run]
            assert ratio["ci_lo"] is not None and math.isfinite(ratio["ci_hi"])
    assert summary["harness / plain loop"]["pairs"] == 10
    assert summary["plain loop / bare loop"]["ratio"] > 0
    assert summary["harness_costs_too_much"] is False  # judged on a GPU
    assert summary["clocks_held_down_s"] is not None  # NVML's violation counters read
    assert device_check.main(["--parts", "harness", "--out", str(out)]) == status
    assert json.loads((out / "harness" / device_check.HARNESS_FILE).read_text())["pid"] == found["pid"]
