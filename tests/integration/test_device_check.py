"""benchmarks/device_check.py end to end on CPU: every part, the checks, a verifiable run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from multicard import artifact
from tests.helpers import ROOT, load_script

pytestmark = pytest.mark.slow
SCRIPT = ROOT / "benchmarks" / "device_check.py"


def test_dry_run_prints_the_plan_and_its_estimate() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("layout_loader: 8 trials, estimated ")
    assert lines[1].startswith("precision: 15 trials") and lines[2].startswith("pin_memory: 4 trials")
    assert any(line.startswith("total: estimated ") for line in lines)
    assert lines[-1] == "--dry-run: nothing started"


def test_parts_that_would_overrun_the_budget_are_skipped_and_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "short"
    first_part = out / "layout_loader" / "trials.jsonl"

    # time as the check sees it: none passes until the first part has records, then the budget
    # is all spent but one second, however fast or slow this machine ran the part
    def clock() -> float:
        return 999.0 if first_part.exists() else 0.0

    device_check = load_script(SCRIPT, "device_check")
    status = device_check.main(["--device", "cpu", "--trials", "1", "--budget-s", "1000", "--out", str(out)],
                               clock=clock)
    summary = json.loads((out / "device_check.json").read_text())["summary"]
    assert summary["parts_run"] == ["layout_loader"]
    assert set(summary["parts_skipped"]) == {"precision", "pin_memory"}
    assert summary["parts_skipped"]["precision"].endswith(", 1s of the budget left")
    assert summary["plain_loop_images_s"] > 0 and summary["multicard / plain loop"] > 0
    assert artifact.verify(out).ok
    assert status == 1  # not every part ran: the check is not passed
    assert "parts skipped: precision, pin_memory" in capsys.readouterr().out


def test_the_check_runs_on_cpu_into_a_verifiable_run(tmp_path: Path) -> None:
    out = tmp_path / "cpu-device-check"
    # a budget this test does not test (the one above does): every part runs even on a busy
    # 2-core machine, where the CPU trials take twice as long as the estimates
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--trials", "1",
                           "--budget-s", "1200", "--out", str(out)], capture_output=True, text=True,
                          cwd=ROOT, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "multicard / plain loop: " in done.stdout and "multicard / timm: " in done.stdout
    assert {p.name for p in out.iterdir() if p.is_dir()} >= {"precision", "layout_loader",
                                                              "pin_memory", "tables"}
    summary = json.loads((out / "device_check.json").read_text())["summary"]
    assert summary["trials"] == summary["ok"] == 11
    assert summary["tf32_flags_as_set"] is True and summary["step_clock_within_tolerance"] is True
    assert summary["multicard / plain loop"] > 0
    # on CPU there is no GPU energy: every precision says so, none is 0
    assert summary["energy_per_sample_j"] == dict.fromkeys(
        ("fp64", "fp32", "tf32", "fp16", "bf16"), "not measured: rank 0: CPU run: no GPU")
    assert "GPU energy per image by precision: fp64 not measured: rank 0: CPU run: no GPU" in done.stdout
    assert "## Device check" in (out / "REPORT.md").read_text()
    assert artifact.verify(out).ok
