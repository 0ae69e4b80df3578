"""The verdict rules judged by what they say in worlds we can state: seeded draws through
claims.judge itself (multicard.power), at 2 % CV and 5 trials per config, the paper profile's."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from multicard import claims, power
from tests.helpers import EXPERIMENTS

CLAIMS = claims.load(EXPERIMENTS / "claims.toml")
BY_ID = {c.id: c for c in CLAIMS}
RUNS, TRIALS, CV, SEED = 100, 5, 0.02, 7
# the claims with a number of the paper's: a span, a margin, the values of Table 5. C6's trend
# is qualitative in the paper (its ends, 30 % at 1 GPU and 16 % at 4, are inferred): shown by
# `claims power`, not held to these rules.
QUANTITATIVE = ("C1", "C2", "C3", "C5", "C14", "C15")


def shares(claim: claims.Claim, world: power.World, runs: int = RUNS) -> dict[str, float]:
    found = power.characteristic(claim, world, power.outcome_facts(CLAIMS, claim), "paper",
                                 EXPERIMENTS, TRIALS, CV, runs, SEED)
    return found.shares


def cases(role: str) -> list[tuple[str, power.World]]:
    return [(cid, w) for cid in QUANTITATIVE for w in power.worlds(BY_ID[cid]) if w.role == role]


def case_id(case: tuple[str, power.World]) -> str:
    return f"{case[0]}: {case[1].name}"


@pytest.mark.parametrize("case", cases("paper"), ids=case_id)
def test_where_the_paper_is_right_at_its_values_and_span_ends_it_reads_supported(
        case: tuple[str, power.World]) -> None:
    cid, world = case
    assert shares(BY_ID[cid], world).get("supported", 0) >= 0.8


@pytest.mark.parametrize("case", cases("none"), ids=case_id)
def test_where_there_is_no_effect_it_reads_contradicted_and_almost_never_supported(
        case: tuple[str, power.World]) -> None:
    cid, world = case
    found = shares(BY_ID[cid], world)
    assert found.get("supported", 0) <= 0.025 and found.get("contradicted", 0) >= 0.8


@pytest.mark.parametrize("case", cases("half"), ids=case_id)
def test_half_the_papers_effect_is_not_reproducing_it(case: tuple[str, power.World]) -> None:
    cid, world = case
    assert shares(BY_ID[cid], world).get("supported", 0) <= 0.05


def test_a_claims_half_world_keeps_its_other_parts_where_the_paper_puts_them() -> None:
    [half] = [w for w in power.worlds(BY_ID["C15"]) if w.role == "half"]
    range_part, memory_part = half.parts
    assert range_part.effect(0, 1) == pytest.approx(math.log(1.3) / 2)  # half the span's low end
    assert memory_part.effect(0, 1) == pytest.approx(2 * math.log(1.05))  # the paper-right world
    [alone] = [w for w in power.worlds(BY_ID["C15"].parts[0]) if w.role == "half"]
    assert shares(BY_ID["C15"].parts[0], alone).get("supported", 0) <= 0.05


def test_every_span_claim_has_both_ends_end_to_end_no_effect_and_half_the_effect() -> None:
    for claim in (BY_ID["C1"], BY_ID["C2"], BY_ID["C5"], BY_ID["C15"].parts[0]):
        roles = [w.role for w in power.worlds(claim)]
        assert roles == ["paper", "paper", "paper", "none", "half"], claim.id
    assert [w.role for w in power.worlds(BY_ID["C15"])] == ["paper", "none", "half"]


def test_a_tolerance_wide_enough_to_pass_everything_fails_the_half_effect_world() -> None:
    loose = replace(BY_ID["C5"], tolerance=0.9, tolerance_reason="too loose")
    [half] = [w for w in power.worlds(loose) if w.role == "half"]
    assert shares(loose, half, runs=40).get("supported", 0) > 0.5


def numa_world(name: str) -> power.World:
    return next(w for w in power.worlds(BY_ID["C10"].parts[1]) if w.name == name)


@pytest.mark.parametrize(("name", "rule"), [
    ("binding removes a 15 % penalty", lambda s: s.get("supported", 0) >= 0.8),
    # a real 5 % penalty removed: at the edge of 5 trials' power, but never read as "no"
    ("binding removes a 5 % penalty", lambda s: s.get("contradicted", 0) <= 0.025
     and s.get("supported", 0) >= 0.4),
    ("binding leaves 5 % of a 15 % penalty", lambda s: s.get("supported", 0) <= 0.05),
    ("a 15 % penalty binding does not change", lambda s: s.get("contradicted", 0) >= 0.8),
    ("no penalty", lambda s: s.get("supported", 0) <= 0.025 and s.get("contradicted", 0) <= 0.025),
])
def test_the_numa_part_tests_what_it_says(name: str, rule: object) -> None:
    found = shares(BY_ID["C10"].parts[1], numa_world(name), runs=60)
    assert rule(found), found  # type: ignore[operator]


@pytest.mark.parametrize("cid", ["C13", "C17"])
def test_qat_out_of_memory_on_1_to_3_gpus_is_the_papers_world_not_missing_data(cid: str) -> None:
    [paper] = [w for w in power.worlds(BY_ID[cid]) if w.role == "paper"]
    assert shares(BY_ID[cid], paper, runs=60).get("supported", 0) >= 0.8


def test_the_drawn_world_holds_the_effect_it_states() -> None:
    import numpy as np

    claim = BY_ID["C5"]
    [end_to_end] = [w for w in power.worlds(claim) if w.name.endswith("end to end")]
    data = power.draw_results(claim, end_to_end, [], "paper", EXPERIMENTS, 200, 0.02,
                              np.random.default_rng(0))
    [run] = data["table3_pin_memory"]
    by_config = run.trials.groupby(["gpus", "pin_memory"])["train_time_s"]
    means = by_config.mean()
    reductions = {g: 100 * (1 - means[(g, True)] / means[(g, False)]) for g in (1, 2, 3, 4)}
    assert reductions[1] == pytest.approx(30, abs=1) and reductions[4] == pytest.approx(16, abs=1)
    assert (by_config.std() / means).tolist() == pytest.approx([0.02] * 8, abs=0.004)


def test_claims_power_prints_each_world_and_refuses_an_unknown_claim(
        capsys: pytest.CaptureFixture[str]) -> None:
    from multicard import cli

    assert cli.main(["claims", "power", "--claim", "C1", "C4", "--runs", "10", "--no-needed"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| C1 ")]
    assert len(rows) == 5 and "paper right: its span's low end" in rows[0]
    assert "| C4 " in out and "reads trace metrics: not simulated" in out
    assert cli.main(["claims", "power", "--claim", "C99", "--runs", "10"]) == 2
    assert "no claim C99" in capsys.readouterr().err
    assert cli.main(["claims", "power", "--claim", "C1", "--runs", "10", "--profile", "kick",
                     "--json", "--no-needed"]) == 0
    [entry] = __import__("json").loads(capsys.readouterr().out)
    assert entry["trials"] == 5 and len(entry["worlds"]) == 5  # the kick profile: 1 GPU, 5 trials


def test_the_measured_cv_is_the_median_over_configs_of_their_own_spread() -> None:
    import pandas as pd

    from multicard import spec

    s = spec.load(EXPERIMENTS / "table2_precision.toml")
    frame = pd.DataFrame({"config_id": ["a"] * 3 + ["b"] * 3 + ["c"],
                          "train_time_s": [9.0, 10.0, 11.0, 19.0, 20.0, 21.0, 5.0]})
    cv, configs = power.measured_cv([(s, frame)])
    assert configs == 2 and cv == pytest.approx((0.1 + 0.05) / 2)  # "c" has one trial: no spread
    assert power.measured_cv([(s, frame.iloc[6:])]) == (None, 0)


def test_claims_power_calibrated_on_no_run_is_bad_input(tmp_path: pytest.TempPathFactory,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from multicard import cli

    assert cli.main(["claims", "power", "--claim", "C1", "--calibrate", str(tmp_path)]) == 2
    assert "multicard: error:" in capsys.readouterr().err


def test_claims_power_takes_a_cv_or_a_calibration_not_both(tmp_path: pytest.TempPathFactory,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from multicard import cli

    assert cli.main(["claims", "power", "--claim", "C1", "--cv", "0.05", "--calibrate", str(tmp_path)]) == 2
    assert "not both" in capsys.readouterr().err


def test_a_claim_on_settings_a_profile_fixes_is_drawn_as_the_judge_reads_it() -> None:
    # eval_500 fixes image_size = 500 and gpus = 2, the very settings C11 names
    claim = BY_ID["C11"]
    [paper] = [w for w in power.worlds(claim) if w.role == "paper"]
    found = power.characteristic(claim, paper, power.outcome_facts(CLAIMS, claim), "eval_500",
                                 EXPERIMENTS, TRIALS, CV, 20, SEED)
    assert found.shares.get("supported", 0.0) == 1.0
