"""benchmarks/harness_ab.py on CPU with tiny settings: every block's raw numbers kept, the pairs in
A-B-B-A order, the ratios and the lines it prints. Nothing here asserts this machine's speed."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow
SCRIPT = ROOT / "benchmarks" / "harness_ab.py"
R = r"\d+\.\d{4}"  # a ratio as printed; an interval of 2 pairs on 2 busy cores may reach past 10
LINE = re.compile(rf"harness / plain loop at \d+ px, batch \d+, fp32: {R} \[{R}, {R}\] "
                  rf"\(2 pairs; goal \+-2 %: (met|not met)\); A/A control: {R} \[{R}, {R}\]")


def test_a_tiny_cpu_run_keeps_every_block_and_pairs_them_abba(tmp_path: Path) -> None:
    out = tmp_path / "harness_ab.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(out),
                           "--pairs", "2", "--control-pairs", "2", "--bare-pairs", "2"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(out.read_text())
    assert (found["device"], found["block_s"], found["pairs"], found["control_pairs"]) == ("cpu", 0.5, 2, 2)
    assert found["goal_half_width"] == 0.02 and found["confidence"] == 0.95 and found["gpu"] is None
    assert [p["name"] for p in found["points"]] == ["host-bound", "judged"]
    for point in found["points"]:
        check_point(point)
    host, judged = found["points"]
    assert [(b["run"], b["arm"]) for b in host["blocks"] if b["run"] == "bare"] == [
        ("bare", "plain"), ("bare", "bare"), ("bare", "bare"), ("bare", "plain")]
    assert "bare" in host["results"] and "bare" not in judged["results"]
    assert not any(b["run"] == "bare" for b in judged["blocks"])
    # what it prints is what it wrote: a line per point, and DDP's bookkeeping at the first
    assert done.stdout.splitlines() == found["lines"] and len(found["lines"]) == 3
    assert LINE.fullmatch(found["lines"][0]) and LINE.fullmatch(found["lines"][2])
    assert found["lines"][1].startswith("plain loop / bare loop at 32 px, batch 8, fp32 (DDP's host "
                                        "bookkeeping): ")


def check_point(point: dict) -> None:
    steps, batch = point["steps"], point["settings"]["batch_size"]
    assert steps == point["epochs"] * point["steps_per_epoch"] > 0
    assert point["settings"]["loader"] == "synthetic" and point["settings"]["device"] == "cpu"
    assert point["probe"]["steps"] == 5 and point["probe"]["seconds"] > 0
    assert [b["arm"] for b in point["settle"]] == ["harness", "plain"]
    main = [b for b in point["blocks"] if b["run"] == "main"]
    control = [b for b in point["blocks"] if b["run"] == "control"]
    assert [(b["slot"], b["arm"]) for b in main] == [("A", "harness"), ("B", "plain"), ("B", "plain"),
                                                   ("A", "harness")]
    assert [b["slot"] for b in control] == ["A", "B", "B", "A"]
    assert {b["arm"] for b in control} == {"harness"}
    for block in point["blocks"] + point["settle"]:
        assert block["seconds"] > 0 and block["steps"] == steps and block["images"] == steps * batch
        if block["arm"] == "harness":  # its own clock inside the call that starts and ends its meters
            assert block["call_s"] >= block["seconds"] and block["step_clock_s"] > 0
    results = point["results"]
    assert results["main"]["pairs"] == results["control"]["pairs"] == 2
    for name in results:
        r = results[name]
        assert r["of"] == "images/s" and r["ratio"] > 0
        assert math.isfinite(r["ci_lo"]) and math.isfinite(r["ci_hi"])
        assert 0 < r["ci_lo"] <= r["ratio"] <= r["ci_hi"]
        assert r["half_width"] == pytest.approx(max(r["ci_hi"] / r["ratio"] - 1, 1 - r["ci_lo"] / r["ratio"]))
    # the A/A control's pairs, recomputed from the raw blocks: what the file says is what they give
    speeds = [b["images"] / b["seconds"] for b in control]
    pairs = [math.log(speeds[0] / speeds[1]), math.log(speeds[3] / speeds[2])]
    assert results["control"]["ratio"] == pytest.approx(math.exp(sum(pairs) / 2), rel=1e-9)
