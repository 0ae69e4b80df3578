"""The reviewer-facing session lists of noxfile.py against the experiments and the cost model."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from multicard.plan import cost, spec
from tests.helpers import EXPERIMENTS, ROOT, load_script

NOXFILE = load_script(ROOT / "noxfile.py", "noxfile")


def test_reproduce_runs_every_experiment_and_every_numa_profile_once() -> None:
    experiments = {p.stem for p in EXPERIMENTS.glob("*.toml")
                   if p.name not in ("claims.toml", "energy_questions.toml")}
    assert {e for e, _ in NOXFILE.PAPER_RUNS} == experiments
    assert len(set(NOXFILE.PAPER_RUNS)) == len(NOXFILE.PAPER_RUNS)
    numa = tomllib.loads((EXPERIMENTS / "numa_binding.toml").read_text())["profiles"]
    assert {p for e, p in NOXFILE.PAPER_RUNS if e == "numa_binding"} == {"paper"} | (
        set(numa) - {"smoke", "eval"})  # eval is the evaluation's, below


def test_evaluate_fits_16_hours_on_4_gpus_and_can_decide_c5_to_c19() -> None:
    # 15 h: each experiment at the trials its claims need for 80 % power at 5 % noise
    from multicard.judge import claims

    specs = [spec.load(EXPERIMENTS / f"{e}.toml", p) for e, p in NOXFILE.EVAL_RUNS]
    assert len(set(NOXFILE.EVAL_RUNS)) == len(NOXFILE.EVAL_RUNS)
    seconds = sum(cost.trial_seconds(s.workload, t.params) for s in specs for t in spec.plan(s))
    assert all(s.fixed["device"] == "cuda" and max(t.params["gpus"] for t in spec.plan(s)) <= 4
               for s in specs)
    assert 8 * 3600 <= seconds <= 16 * 3600
    claim_list = claims.load(claims.default_file())
    decided = {c.id for c in claim_list if c.id.startswith("C")
               and all(claims.decided_by(c, specs))}
    assert {f"C{i}" for i in range(5, 20)} <= decided, sorted(decided)


def test_kick_the_tires_fits_50_minutes_on_one_gpu_by_the_cost_model() -> None:
    seconds = 0.0
    for experiment, profile in NOXFILE.KICK_RUNS:
        s = spec.load(EXPERIMENTS / f"{experiment}.toml", profile)
        planned = spec.plan(s)
        assert s.fixed["device"] == "cuda" and {p.params["gpus"] for p in planned} == {1}
        assert s.trials >= s.min_ok == 5  # every config can reach a verdict
        seconds += sum(cost.trial_seconds(s.workload, p.params) for p in planned)
    assert seconds < 49 * 60  # a minute left for preparing Scenario B and the report


def reproduce(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nox", "-s", "reproduce", "--", "--dry-run", *args],
                          capture_output=True, text=True, cwd=ROOT)


@pytest.mark.long
@pytest.mark.slow
def test_reproduce_with_a_budget_fits_or_says_no_plan_fits(tmp_path: Path) -> None:
    refused = reproduce("--budget", "1h", "--out", str(tmp_path / "new"))
    assert refused.returncode != 0 and "budget 1h 00m: no plan fits" in refused.stdout + refused.stderr
    assert not (tmp_path / "new").exists()  # a dry run starts nothing
    started = tmp_path / "started"
    started.mkdir()
    (started / NOXFILE.BUDGET_PLAN).write_text(json.dumps({"duration": "24h", "experiments": {}}))
    other = reproduce("--budget", "48h", "--out", str(started))
    assert other.returncode != 0
    assert "was planned for --budget 24h, not 48h" in other.stdout + other.stderr
    same = reproduce("--budget", "1d", "--out", str(started))  # the same duration, spelled otherwise
    assert same.returncode == 0 and "resuming with the plan in" in same.stdout + same.stderr
    unbudgeted = tmp_path / "unbudgeted"
    (unbudgeted / "table2_precision").mkdir(parents=True)
    (unbudgeted / "table2_precision" / "spec.toml").write_text("")
    late = reproduce("--budget", "24h", "--out", str(unbudgeted))
    assert late.returncode != 0 and "started without --budget" in late.stdout + late.stderr


@pytest.mark.long
@pytest.mark.slow
def test_the_whole_paper_fits_in_24_hours_and_says_what_each_claim_keeps(tmp_path: Path) -> None:
    fitted = reproduce("--budget", "24h", "--out", str(tmp_path / "new"))
    out = fitted.stdout + fitted.stderr
    assert fitted.returncode == 0 and "budget 24h 00m: fits in" in out, out[-2000:]
    # the artifact's own questions go before the claims' trials go under their minimum, and each
    # claim whose trials went down says its power where the paper is right, before and after
    assert "numa_binding@controls: 3 trial(s) x 0 configs" in out
    assert "verdict minimum 5 -> 3" in out
    assert "C5: " in out and "[P(supported) where the paper is right: " in out
    assert "power at CV 2.0% (" in out  # the noise it was computed at, said once
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("long", [False, True])
@pytest.mark.parametrize("slow", [False, True])
@pytest.mark.parametrize("e2e", [False, True])
def test_the_three_test_tiers_take_every_test_once(slow: bool, e2e: bool, long: bool) -> None:
    # a marker expression reads as Python's boolean syntax: each kind of test is in one tier
    marks = {"slow": slow, "e2e": e2e, "long": long}
    tiers = (NOXFILE.FAST_TIER, NOXFILE.SLOW_TIER, NOXFILE.LONG_TIER)
    chosen = [eval(tier, {}, marks) for tier in tiers]
    assert chosen.count(True) == 1
    assert chosen[0] == (not slow or e2e)  # the fast tier: unit tests and the end-to-end ones
    assert chosen[2] == (slow and long and not e2e)


def _marks(nodes: list[ast.expr]) -> set[str]:
    """The names of `pytest.mark.X` among decorators or a `pytestmark` value (a list or one)."""
    found = set()
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and ast.unparse(sub.value) == "pytest.mark":
                found.add(sub.attr)
    return found


def test_every_long_test_is_a_slow_one() -> None:
    # a `long` mark alone would put the test in the fast tier, which CI runs first
    unslowed = []
    for path in (ROOT / "tests").rglob("test_*.py"):
        tree = ast.parse(path.read_text())
        module = _marks([n.value for n in tree.body if isinstance(n, ast.Assign)
                         and any(ast.unparse(t) == "pytestmark" for t in n.targets)])
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                marks = module | _marks(node.decorator_list)
                if "long" in marks and "slow" not in marks:
                    unslowed.append(f"{path.relative_to(ROOT)}::{node.name}")
    assert unslowed == []
    assert "long" in _marks([ast.parse("@pytest.mark.long\ndef f(): pass").body[0].decorator_list[0]])


def test_the_image_runs_every_end_to_end_test() -> None:
    assert all((ROOT / path).exists() for path in NOXFILE.IMAGE_TESTS)
    marked = [path.relative_to(ROOT) for path in (ROOT / "tests").rglob("test_*.py")
              if re.search(r"^(@pytest\.mark\.e2e|pytestmark = .*pytest\.mark\.e2e)", path.read_text(), re.M)]
    assert marked and all(any(path.is_relative_to(image) for image in NOXFILE.IMAGE_TESTS)
                          for path in marked)


def test_reproduce_can_decide_every_part_of_every_claim() -> None:
    from multicard.judge import claims

    specs = [spec.load(EXPERIMENTS / f"{e}.toml", p) for e, p in NOXFILE.PAPER_RUNS]
    undecided = [c.id for c in claims.load(claims.default_file()) if not all(claims.decided_by(c, specs))]
    assert undecided == []
