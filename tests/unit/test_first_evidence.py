"""`multicard first-evidence`: its plan, calibrated from the committed H200 device check, fits the
9 minutes; what it would start."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from multicard import first_evidence
from multicard.errors import InputError
from multicard.plan import spec
from multicard.publish.runs import calibration
from tests.helpers import EXPERIMENTS

# two parts of the committed H200 device check (tests/fixtures/README.md)
H200 = Path(__file__).resolve().parents[1] / "fixtures" / "h200_runs"


def args(**changed: object) -> argparse.Namespace:
    return argparse.Namespace(**{"out": None, "dry_run": True, "budget_s": None, "calibrate": [H200],
                                 "experiments": EXPERIMENTS, **changed})


def test_the_plan_is_carried_from_the_h200_rates_and_fits_nine_minutes() -> None:
    s = spec.load(EXPERIMENTS / "table2_precision.toml", first_evidence.PROFILE)
    parts = first_evidence.plan(s, calibration([H200]))
    assert [p.name for p in parts] == ["operating point", "trials (15)", "report and verify"]
    trials = parts[1]
    assert "scaled (" in trials.how and "guessed" not in trials.how  # every trial from measured rates
    assert sum(p.seconds for p in parts) <= first_evidence.BUDGET_S
    # the conservative carry: no cheaper than the same trials at the H200's own 100 px and batch 64
    small = spec.load(EXPERIMENTS / "table2_precision.toml", first_evidence.PROFILE,
                      {"image_size": 100, "batch_size": 64})
    assert trials.seconds > first_evidence.plan(small, calibration([H200]))[1].seconds


def test_a_dry_run_prints_the_plan_and_fails_where_it_does_not_fit(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert first_evidence.main(args()) == 0
    out = capsys.readouterr().out
    assert "(within the 9m 00s target)" in out and "--dry-run: nothing started" in out
    assert first_evidence.main(args(budget_s=120.0)) == 1
    assert "OVER the 2m 00s target" in capsys.readouterr().out
    with pytest.raises(InputError, match="not found"):
        first_evidence.main(args(experiments=Path("/nowhere")))
    with pytest.raises(InputError, match="--budget-s"):
        first_evidence.main(args(budget_s=0.0))


def test_the_step_profile_runs_the_trials_settings_at_its_own_points(tmp_path: Path) -> None:
    s = spec.load(EXPERIMENTS / "table2_precision.toml", first_evidence.PROFILE)
    argv = first_evidence.profile_argv(s, tmp_path / "p.json")
    assert argv[:3] == [sys.executable, "-m", "multicard.workloads.step_profile"]
    flags = dict(zip(argv[3:argv.index("--"):2], argv[4:argv.index("--"):2], strict=True))
    assert flags == {"--out": str(tmp_path / "p.json"), "--device": "cuda", "--batch-size": "128",
                     "--sizes": "100,224,300", "--precisions": "fp64,fp32,fp16", "--steps": "10",
                     "--ddp": "lean,default,none", "--ddp-at": "224:fp32"}
    rest = argv[argv.index("--") + 1:]
    assert rest[rest.index("--cast") + 1] == "host" and "--precision" not in rest
    # the plan's points are the ones step_profile makes of those flags
    points = first_evidence.profile_points(s)
    assert len(points) == 9 + 2 and {p["single_rank_ddp"] for p in points} == {"lean", "default", "none"}


def test_without_a_gpu_or_a_module_it_stops_before_writing_anything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    monkeypatch.setattr(first_evidence.telemetry, "visible_gpus", lambda: [])
    with pytest.raises(InputError, match="no GPU visible"):
        first_evidence.main(args(dry_run=False, out=out))
    assert not out.exists()
    with pytest.raises(InputError, match="missing Python modules: scipy, tomli_w"):
        first_evidence.check_machine([object()], ["scipy", "tomli_w"])
    first_evidence.check_machine([object()], [])  # a GPU and every module: it goes on
    assert first_evidence.missing_modules() == []  # the development environment has them all
