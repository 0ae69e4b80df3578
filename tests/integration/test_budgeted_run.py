"""`plan --budget D --save-budget FILE`, then `run --budget-plan FILE`: a real CPU run that keeps
what its claim reads, at the verdict minimum, and says what it gave up in spec.toml and REPORT.md."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from multicard.run import store
from tests.helpers import ROOT, TINY_FIXED, write_spec

pytestmark = pytest.mark.slow

CLAIM = '''
[[claim]]
id = "T1"
text = "Two ranks train faster than one in fp32"
paper = "none"
kind = "direction"
experiment = "tiny"
metric = "train_time_s"
compare = { gpus = 2 }
against = { gpus = 1 }
where = { precision = "fp32" }
side = "above"
tolerance = 0.05
tolerance_reason = "a difference under 5 % is not one a user would act on"
'''


def multicard(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "multicard", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT)


@pytest.mark.long
def test_a_budgeted_run_keeps_its_claims_configs_at_the_verdict_minimum(tmp_path: Path) -> None:
    path = write_spec(tmp_path, fixed=TINY_FIXED, grid={"precision": ["fp32", "bf16"], "gpus": [1, 2]},
                      trials={"count": 5, "min_ok": 3, "timeout_s": 300})
    (tmp_path / "claims.toml").write_text(CLAIM)
    planned = json.loads(multicard("plan", path, "--json").stdout)
    per_fp32_trial = [e["estimate_s"] for e in planned if e["config"]["precision"] == "fp32"]
    # room for the two fp32 configs at 3 trials, not at 5, and never for bf16
    room = sum(per_fp32_trial) / 5 * 3.5
    collection = tmp_path / "collection"  # as `nox -s reproduce -- --budget D` lays it out
    plan_file = collection / "budget.json"
    saved = multicard("plan", path, "--budget", f"{room:.0f}s", "--save-budget", plan_file)
    assert saved.returncode == 0, saved.stderr
    assert "2 of 4 configs that no claim reads dropped" in saved.stdout
    # the claim gave up trials (the configs dropped are none it reads)
    assert "T1: tiny@paper: trials per config 5 -> 3 (verdict minimum 3): wider intervals" in saved.stdout
    too_small = multicard("plan", path, "--budget", "1s", "--save-budget", tmp_path / "none.json")
    assert too_small.returncode == 1 and "no plan fits" in too_small.stdout
    assert not (tmp_path / "none.json").exists()

    run = collection / "tiny"
    done = multicard("run", path, "--budget-plan", plan_file, "--out", run)
    assert done.returncode == 0, done.stderr
    records = store.read(run / "trials.jsonl")
    assert len(records) == 6 and {r["config"]["precision"] for r in records} == {"fp32"}
    budget = tomllib.loads((run / "spec.toml").read_text())["budget"]
    assert budget["configs"] == [{"precision": "fp32", "gpus": 1}, {"precision": "fp32", "gpus": 2}]
    assert "trials per config 5 -> 3 (verdict minimum 3): wider intervals" in budget["given_up"]
    again = multicard("run", path, "--budget-plan", plan_file, "--out", run)  # a resume: nothing left
    assert again.returncode == 0, again.stderr
    assert len(store.read(run / "trials.jsonl")) == 6
    assert multicard("report", collection).returncode == 0
    report = (collection / "REPORT.md").read_text()
    assert "Planned to fit a budget of" in report and "2 of 4 configs that no claim reads dropped" in report
    assert "## Budget" in report and "| tiny@paper" in report
