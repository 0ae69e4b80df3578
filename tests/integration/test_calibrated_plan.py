"""`plan --calibrate` on a finished CPU run: the re-planned run's estimate against its own wall time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from multicard import runner, spec, store
from tests.helpers import DATA, ROOT, TINY_FIXED, write_spec

pytestmark = pytest.mark.slow


def plan(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "multicard", "plan", *args], capture_output=True,
                          text=True, cwd=ROOT, check=True)
    return done.stdout


def test_a_measured_plan_is_within_a_quarter_of_the_runs_own_wall_time(tmp_path: Path) -> None:
    path = write_spec(tmp_path, fixed={**TINY_FIXED, "epochs": 2},
                      grid={"precision": ["fp32", "bf16"], "gpus": [1, 2]}, trials={"count": 2})
    outcome = runner.run(spec.load(path), tmp_path / "run", data_dir=DATA, echo=lambda _: None)
    assert outcome.ok == 8
    records = store.read(tmp_path / "run" / "trials.jsonl")
    # the run's own wall time: its first trial's start to its last one's end (the runner's time
    # between trials included)
    wall = max(r["started_unix"] + r["wall_s"] for r in records) - min(r["started_unix"] for r in records)
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
    assert abs(estimated - wall) / wall < 0.25, (estimated, wall)
    assert len(json.loads(saved.read_text())["rates"]) == 4  # one per config
    # the saved file plans the same as the run it came from
    assert plan(str(path), "--calibrate", str(saved)).splitlines()[-1] == table.splitlines()[-1]
