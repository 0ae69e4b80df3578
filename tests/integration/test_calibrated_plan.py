"""`plan --calibrate` on a finished CPU run: the re-planned run's estimate against its own wall time."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multicard.plan import spec
from multicard.run import runner, store
from tests.helpers import DATA, ROOT, TINY_FIXED, write_spec

pytestmark = pytest.mark.slow


def plan(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "multicard", "plan", *args], capture_output=True,
                          text=True, cwd=ROOT, check=True)
    return done.stdout


@pytest.mark.long
def test_a_measured_plan_is_within_a_quarter_of_the_runs_own_wall_time(tmp_path: Path) -> None:
    path = write_spec(tmp_path, fixed={**TINY_FIXED, "epochs": 2},
                      grid={"precision": ["fp32", "bf16"], "gpus": [1, 2]}, trials={"count": 2})
    began = time.monotonic()
    outcome = runner.run(spec.load(path), tmp_path / "run", data_dir=DATA, echo=lambda _: None)
    whole = time.monotonic() - began  # the run's own wall time, its one-off start included
    assert outcome.ok == 8
    records = store.read(tmp_path / "run" / "trials.jsonl")
    # its trials: the first one's start to the last one's end (the runner's time between them in)
    trials = max(r["started_unix"] + r["wall_s"] for r in records) - min(r["started_unix"] for r in records)
    guessed = plan(str(path), "--summary")
    assert "guessed" in guessed and "measured" not in guessed
    saved = tmp_path / "calibration.json"
    table = plan(str(path), "--calibrate", str(tmp_path / "run"), "--save-calibration", str(saved))
    assert "8 of 8 trial estimates measured" in table
    rows = [line for line in table.splitlines() if line.strip()[:1].isdigit()]
    # a rate per config (precision x rank count), from its 2 trials
    assert len(rows) == 8 and all("measured (" in row and ", 2 trial(s))" in row for row in rows)
    estimates = json.loads(plan(str(path), "--calibrate", str(tmp_path / "run"), "--json"))
    assert {e["estimate"] for e in estimates} == {"measured"}
    estimated = sum(e["estimate_s"] for e in estimates)
    assert abs(estimated - trials) / trials < 0.25, (estimated, trials)
    rates = json.loads(saved.read_text())["rates"]
    assert len(rates) == 5  # one per config and the run's one-off start
    start = rates["vision|run start"]["startup_s"]
    assert abs(estimated + start - whole) / whole < 0.25, (estimated, start, whole)
    assert f"its one-off start {start:.0f} s, measured, included" in table
    # the saved file plans the same as the run it came from
    def cost_line(text: str) -> str:  # the spec's line of trials and estimate
        return next(line for line in text.splitlines() if " trial(s) x " in line)

    assert cost_line(plan(str(path), "--calibrate", str(saved))) == cost_line(table)
    assert "estimated" in cost_line(table)
