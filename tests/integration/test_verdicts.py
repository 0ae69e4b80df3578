"""Verdicts on real CPU runs: `--trials auto` stops by its rule, and a config that fails for a
harness reason makes its claim `invalid` in REPORT.md, with n, the interval method and warnings."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from multicard.data import scenario_b
from multicard.judge import adaptive
from multicard.plan import spec
from multicard.run import store
from tests.helpers import DATA, ROOT, TINY_FIXED, write_spec

pytestmark = pytest.mark.slow


def multicard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "multicard", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)


@pytest.mark.long
def test_trials_auto_stops_by_its_rule_says_why_and_resumes_to_the_same_answer(tmp_path: Path) -> None:
    path = write_spec(tmp_path, grid={"precision": ["fp32", "bf16"]},
                      trials={"count": 1, "half_width": 0.9, "timeout_s": 300},
                      baseline={"precision": "fp32"},
                      profiles={"smoke": {"trials": {"min_ok": 3}}})
    out = tmp_path / "run"
    done = multicard("run", str(path), "--profile", "smoke", "--trials", "auto:2..8", "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    decision = json.loads((out / "auto.json").read_text())
    rounds = decision["rounds"]
    records = store.read(out / "trials.jsonl")
    # 2 pilot rounds, then at least the verdict minimum of 3 (a +-90 % aim asks for no more)
    assert (decision["stopped"], decision["pilot_rounds"]) == (True, 2) and 5 <= rounds <= 8
    assert len(records) == 2 * rounds  # no trial of a round after the stop
    # the runner took the rule's own decision on the records it had at each round start: how
    # noisy this machine's CPU times are sets the round it stops at, never the rule
    resolved = spec.load(out / "spec.toml")
    assert resolved.auto is not None
    aimed = adaptive.aims(resolved, [])  # no claim reads this experiment: baseline ratios
    for done_rounds in range(2, rounds + 1):
        so_far = [r for r in records if r["trial"] < done_rounds]
        rule = adaptive.decide(resolved, resolved.auto, so_far, done_rounds, set(), aimed)
        assert rule.stop == (done_rounds == rounds), (done_rounds, rule.reason)
    assert f"auto: stop: {rule.reason}" in done.stdout and decision["reason"] == rule.reason
    again = multicard("run", str(path), "--profile", "smoke", "--trials", "auto:2..8", "--out", str(out))
    assert again.returncode == 0 and len(store.read(out / "trials.jsonl")) == 2 * rounds
    assert multicard("report", str(out)).returncode == 0
    report = (out / "REPORT.md").read_text()
    assert "Trials: auto (Stein's two-stage rule), 2 pilot rounds set the count" in report
    # the pilot's rounds are in no statistic: each config is judged on the rounds after it
    assert re.search(rf"\| fp32 +\| +{rounds - 2} \|", report), report
    assert f"{2 * (rounds - 2)} of 16 planned trials ok and judged, beside 4 ok pilot trials" in report


@pytest.mark.long
def test_a_harness_failure_makes_its_claim_invalid_and_the_report_shows_n_and_method(
        tmp_path: Path) -> None:
    # a Scenario B tree of 64 images: the config that asks it for 256 fails (a harness error, not
    # a resource limit); the Scenario A config beside it runs
    data = tmp_path / "data"
    data.mkdir()
    (data / "mnist").symlink_to(DATA / "mnist", target_is_directory=True)
    scenario_b.prepare(scenario_b.Request(DATA / "mnist", scenario_b.tree_path(data, 32, "jpeg"), 32,
                                          "jpeg", 64), workers=1, echo=lambda _: None, progress=False)
    fixed = {k: v for k, v in TINY_FIXED.items() if k != "train_subset"} | {"train_subset": 256}
    path = write_spec(tmp_path, fixed=fixed, grid={"scenario": ["a", "b"]},
                      trials={"count": 3, "timeout_s": 300})
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "multicard", "run", str(path), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "MULTICARD_DATA_DIR": str(data)})
    statuses = {r["config"]["scenario"]: r["status"] for r in store.read(out / "trials.jsonl")}
    assert statuses == {"a": "ok", "b": "failed"}, done.stderr[-2000:]
    claims = tmp_path / "claims.toml"
    claims.write_text(tomli_w.dumps({"claim": [
        {"id": "T1", "text": "Scenario B cannot run here", "paper": "-", "kind": "outcome",
         "experiment": "tiny", "compare": {"scenario": "b"}, "outcome": "fails", "device": "any"},
    ]}))
    assert multicard("report", str(out), "--claims", str(claims)).returncode == 0
    text = (out / "REPORT.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| T1 "))
    assert "**invalid**" in row and "3 attempts" in row
    assert "Welch's t on log values" in text and "a verdict needs 5 ok trials per arm" in text  # paper
    table = (out / "tables" / "tiny.md").read_text().splitlines()
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert "n" in header and header[-1] == "warnings"
