"""Fitting a plan into a budget: constructed experiments with a known cost per trial."""

from __future__ import annotations

import pytest

from multicard import budget, claims, spec
from multicard.budget import Experiment
from multicard.errors import InputError
from tests.helpers import EXPERIMENTS


def experiment(name: str, configs: int, trials: int = 5, min_ok: int = 3, epochs: int = 20,
               floor: int | None = 2, claimed: int | None = None) -> Experiment:
    made = tuple((f"{name}{i}", {"i": i}, {"epochs": epochs}) for i in range(configs))
    return Experiment(name, name, "vision", trials, min_ok, made,
                      frozenset(cid for cid, _, _ in made[:configs if claimed is None else claimed]), floor)


def per_epoch(workload: str, settings: dict) -> float:
    return 10.0 * settings["epochs"]  # a trial: 10 s per epoch


def test_a_plan_that_fits_gives_up_nothing() -> None:
    found = budget.fit([experiment("a", 2)], 2 * 5 * 200.0, per_epoch)
    assert found.fits and found.seconds == 2000.0
    assert budget.given_up(found.choices[0]) == []


def test_unclaimed_configs_go_first_then_trials_then_epochs() -> None:
    plan = [experiment("a", 4, claimed=2)]  # 4 configs x 5 trials x 200 s = 4000 s
    dropped = budget.fit(plan, 2000.0, per_epoch)
    assert dropped.fits and dropped.choices[0].configs == ("a0", "a1") and dropped.choices[0].trials == 5
    fewer = budget.fit(plan, 1500.0, per_epoch)  # 2 configs x 3 trials x 200 s = 1200 s
    assert fewer.choices[0].trials == 3 and fewer.choices[0].epochs is None
    shorter = budget.fit(plan, 700.0, per_epoch)  # epochs 20 -> 10: 2 x 3 x 100 s = 600 s
    assert shorter.fits and (shorter.choices[0].trials, shorter.choices[0].epochs) == (3, 10)
    assert budget.given_up(shorter.choices[0]) == [
        "2 of 4 configs that no claim reads dropped",
        "trials per config 5 -> 3 (verdict minimum 3): wider intervals", "epochs 20 -> 10"]


def test_never_below_the_verdict_minimum_nor_the_epochs_a_claim_needs() -> None:
    accuracy = experiment("acc", 2, floor=20)  # an accuracy claim keeps its 20 epochs
    found = budget.fit([accuracy], 1.0, per_epoch)
    assert not found.fits
    assert (found.choices[0].trials, found.choices[0].epochs) == (3, None)
    assert found.seconds == 2 * 3 * 200.0  # the least plan, said when nothing fits
    other = budget.fit([experiment("b", 2)], 1.0, per_epoch)
    assert (other.choices[0].trials, other.choices[0].epochs) == (3, 2) and not other.fits


def test_profiled_trials_count_but_are_never_cut() -> None:
    traced = Experiment("t", "t", "vision", 5, 3, (("t0", {}, {"epochs": 20}),), frozenset({"t0"}), 2,
                        traced=3)
    assert budget.fit([traced], 1e9, per_epoch).seconds == 8 * 200.0
    assert budget.fit([traced], 1400.0, per_epoch).choices[0].trials == 4  # (4 + 3) x 200 s


@pytest.mark.parametrize(("text", "seconds"), [("24h", 86400), ("1h30m", 5400), ("90m", 5400),
                                               ("2d", 172800), ("3600s", 3600), ("45", 45)])
def test_durations(text: str, seconds: float) -> None:
    assert budget.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "0h", "-3h", "24 hours"])
def test_a_duration_that_is_not_one_is_bad_input(text: str) -> None:
    with pytest.raises(InputError, match="--budget"):
        budget.parse_duration(text)


def test_the_paper_specs_know_which_configs_their_claims_read() -> None:
    claim_list = claims.load(EXPERIMENTS / "claims.toml")
    table2 = budget.experiment_of(spec.load(EXPERIMENTS / "table2_precision.toml"), claim_list)
    assert table2.epoch_floor == 20 and "C3" in table2.claims  # C3 is about accuracy
    assert len(table2.claimed) < len(table2.configs)  # tf32 and bf16 are no claim's arms
    alone = budget.experiment_of(spec.load(EXPERIMENTS / "figure6_loaders.toml", "loader_only"), claim_list)
    assert alone.claimed == frozenset() and alone.claims == ()
    numa = budget.experiment_of(spec.load(EXPERIMENTS / "numa_binding.toml"), claim_list)
    assert numa.claimed == frozenset(cid for cid, _, _ in numa.configs)  # the NUMA verdict reads all
    assert numa.epoch_floor == 2
