"""Fitting a plan into a budget: constructed experiments with a known cost per trial."""

from __future__ import annotations

from pathlib import Path

import pytest

from multicard.errors import InputError
from multicard.judge import budget, claims
from multicard.judge.budget import Experiment
from multicard.plan import spec
from tests.helpers import EXPERIMENTS, write_spec


def experiment(name: str, configs: int, trials: int = 5, min_ok: int = 3, epochs: int = 20,
               floor: int | None = 2, claimed: int | None = None,
               claims: tuple[str, ...] = ("C0",)) -> Experiment:
    """An experiment some claim reads (`claims`), or with claims=() one no claim reads."""
    made = tuple((f"{name}{i}", {"i": i}, {"epochs": epochs}) for i in range(configs))
    return Experiment(name, name, "vision", trials, min_ok, made,
                      frozenset(cid for cid, _, _ in made[:configs if claimed is None else claimed]), floor,
                      claims)


def per_epoch(workload: str, settings: dict, trace: str = "none") -> float:
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
        "trials per config 5 -> 3 (verdict minimum 3): wider intervals",
        "epochs 20 -> 10: the first epoch's one-off costs weigh more in train_time_s (steady_epoch_s, "
        "the later epochs' mean, leaves them out)"]


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
    profiled = Experiment("t", "t", "vision", 5, 3, (("t0", {}, {"epochs": 20}),), frozenset({"t0"}), 2,
                          traced=3, trace="nsys")

    def slower_traced(workload: str, settings: dict, trace: str) -> float:
        return per_epoch(workload, settings) * (2.0 if trace == "nsys" else 1.0)

    assert budget.fit([profiled], 1e9, slower_traced).seconds == 5 * 200.0 + 3 * 400.0


@pytest.mark.parametrize(("text", "seconds"), [("24h", 86400), ("1h30m", 5400), ("90m", 5400),
                                               ("2d", 172800), ("3600s", 3600), ("45", 45)])
def test_durations(text: str, seconds: float) -> None:
    assert budget.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "0h", "-3h", "24 hours", "1h30"])
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
    # the NUMA verdict reads both loaders under none and local at 3-4 GPUs, in both layouts
    assert len(numa.configs) == 112 and len(numa.claimed) == 16 and numa.claims == ("C10",)
    assert all(f["numa_policy"] in ("none", "local") and f["gpus"] in (3, 4)
               for cid, f, _ in numa.configs if cid in numa.claimed)
    assert numa.epoch_floor == 2
    # one loader only: it holds configs the NUMA test reads, but can never answer it
    controls = budget.experiment_of(spec.load(EXPERIMENTS / "numa_binding.toml", "controls"), claim_list)
    assert controls.claims == () and controls.claimed == frozenset(cid for cid, _, _ in controls.configs)


def test_epochs_are_halved_in_the_costliest_experiment_first() -> None:
    big, small = experiment("big", 4), experiment("small", 1)  # 4000 s and 1000 s at 3 trials x 20 epochs
    found = budget.fit([big, small], 3 * 200.0 * 5 - 1.0, per_epoch)  # 5 configs x 3 trials: 3000 s
    assert found.fits
    assert [(c.trials, c.epochs) for c in found.choices] == [(3, 10), (3, None)]  # small keeps its 20


def saved_plan(tmp_path: Path, duration: str, paths: list[tuple[Path, str]]) -> Path:
    claim_list = claims.load(EXPERIMENTS / "claims.toml")
    experiments = [budget.experiment_of(spec.load(p, profile), claim_list) for p, profile in paths]
    chosen = budget.fit(experiments, budget.parse_duration(duration), lambda w, s, t: 60.0 * s["epochs"])
    plan_file = tmp_path / "budget.json"
    budget.save_plan(budget.plan_document(chosen, duration), plan_file)
    return plan_file


def test_a_saved_plan_is_what_the_run_gets_and_its_spec_toml_keeps_it(tmp_path: Path) -> None:
    table2, figure6 = EXPERIMENTS / "table2_precision.toml", EXPERIMENTS / "figure6_loaders.toml"
    # claimed configs: table2 16 x 5 trials x 20 min = 26.7 h, figure6 10 x 5 x 20 min = 16.7 h
    plan_file = saved_plan(tmp_path, "36h", [(table2, "paper"), (figure6, "paper")])
    full = spec.load(figure6)
    chosen = budget.budgeted_spec(figure6, "paper", {}, plan_file)
    entry = budget.load_entry(plan_file, "figure6_loaders@paper")
    assert entry.epochs == 10 and chosen.fixed["epochs"] == 10 and full.fixed["epochs"] == 20
    assert len(spec.configs(chosen)) == len(entry.configs or ()) < len(spec.configs(full))
    assert chosen.trials == entry.trials and chosen.budget is not None
    assert chosen.budget.given_up == entry.given_up
    assert any(g.startswith("epochs 20 -> 10: the first epoch's one-off costs") for g in entry.given_up)
    # a run's spec.toml reads back as the same spec: a resumed run finds the same configs
    written = tmp_path / "spec.toml"
    written.write_text(spec.to_toml(chosen))
    again = spec.load(written)
    assert [c for c, _, _ in spec.configs(again)] == [c for c, _, _ in spec.configs(chosen)]
    assert again.budget == chosen.budget
    kept = budget.budgeted_spec(table2, "paper", {}, plan_file)  # C3 reads accuracy: 20 epochs
    assert kept.fixed["epochs"] == 20
    assert budget.load_entry(plan_file, "table2_precision@paper").epochs is None


def test_a_plan_without_this_run_or_not_a_plan_is_bad_input(tmp_path: Path) -> None:
    plan_file = saved_plan(tmp_path, "300h", [(EXPERIMENTS / "table2_precision.toml", "paper")])
    with pytest.raises(InputError, match="no entry for table3_pin_memory@paper"):
        budget.budgeted_spec(EXPERIMENTS / "table3_pin_memory.toml", "paper", {}, plan_file)
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="not a budget plan"):
        budget.load_entry(tmp_path / "bad.json", "x@paper")
    with pytest.raises(InputError, match="no such budget plan"):
        budget.load_entry(tmp_path / "absent.json", "x@paper")


def test_an_experiment_file_cannot_carry_a_budget(tmp_path: Path) -> None:
    path = write_spec(tmp_path, budget={"duration": "1h"})
    with pytest.raises(InputError, match=r"\[budget\]: expected no such table"):
        spec.load(path)


def test_unclaimed_configs_go_where_they_cost_the_most_and_only_as_far_as_needed() -> None:
    big, small = experiment("big", 4, claimed=2), experiment("small", 2, claimed=1)  # 4000 s, 2000 s
    found = budget.fit([big, small], 4500.0, per_epoch)  # dropping big's 2 unclaimed (2000 s) is enough
    assert found.fits and found.choices[0].configs == ("big0", "big1")
    assert found.choices[1].configs == ("small0", "small1")


def test_a_budget_never_raises_the_trials_asked_for() -> None:
    asked = experiment("a", 2, trials=2, min_ok=3)  # --trials 2, under the verdict minimum of 3
    found = budget.fit([asked], 1.0, per_epoch)
    assert found.choices[0].trials == 2 and not found.fits


def test_an_experiment_no_claim_reads_keeps_its_configs(tmp_path: Path) -> None:
    claim_list = claims.load(EXPERIMENTS / "claims.toml")
    mine = budget.experiment_of(spec.load(write_spec(tmp_path)), claim_list)
    assert mine.claims == () and mine.claimed == frozenset(cid for cid, _, _ in mine.configs)


def test_with_power_the_trials_go_where_the_claims_need_them() -> None:
    """A clear claim (a) gives its trials up before a marginal one (b), down to its minimum."""
    clear, marginal = experiment("a", 1, trials=8), experiment("b", 1, trials=8)
    support = {"a": lambda n: 0.99 if n >= 3 else 0.0, "b": lambda n: 0.5 + 0.05 * n}

    def power(e: Experiment, n: int) -> float:
        return support[e.name](n)

    # 16 trials of 200 s; 2600 s asks for 3 fewer: all from a, as b needs its power
    cut = budget.fit([clear, marginal], 2600.0, per_epoch, power)
    assert [c.trials for c in cut.choices] == [5, 8]
    # a at its verdict minimum (3): the next cuts come from b
    deeper = budget.fit([clear, marginal], 1800.0, per_epoch, power)
    assert [c.trials for c in deeper.choices] == [3, 6]
    # uniform without power: one trial less everywhere, step by step
    assert [c.trials for c in budget.fit([clear, marginal], 2600.0, per_epoch).choices] == [6, 6]


def test_an_experiment_whose_power_is_unknown_keeps_its_trials() -> None:
    known, unknown = experiment("a", 1, trials=6), experiment("b", 1, trials=6)
    cut = budget.fit([known, unknown], 2000.0, per_epoch,
                     lambda e, n: 0.9 if e.name == "a" else None)
    assert [c.trials for c in cut.choices] == [4, 6]


def test_an_experiment_no_claim_reads_is_dropped_whole_after_the_claims_own_levers() -> None:
    claimed, own = experiment("a", 1, floor=20), experiment("own", 1, floor=20, claims=())  # 1000 s each
    found = budget.fit([claimed, own], 900.0, per_epoch)  # both at 3 trials: 1200 s; a alone: 600 s
    assert found.fits and [len(c.configs) for c in found.choices] == [1, 0]
    assert [c.trials for c in found.choices] == [3, 3]  # own's trials were cut before it went
    assert budget.given_up(found.choices[1]) == [
        "dropped whole: no claim reads it (a question of the artifact's own, 1 configs)"]


def test_with_power_trials_go_below_the_verdict_minimum_last_and_take_it_along() -> None:
    """Past every other lever, a claim that keeps its power at 3 trials gives trials up first,
    and the verdict minimum goes down with them, never below TRIALS_FLOOR."""
    clear = experiment("a", 1, min_ok=5, floor=20)
    marginal = experiment("b", 1, min_ok=5, floor=20)
    support = {"a": lambda n: 0.95 + 0.001 * n, "b": lambda n: 0.1 * n}

    def power(e: Experiment, n: int) -> float:
        return support[e.name](n)

    found = budget.fit([clear, marginal], 1600.0, per_epoch, power)  # 10 trials of 200 s -> 8
    assert found.fits and [c.trials for c in found.choices] == [3, 5]
    assert [budget.verdict_minimum(c) for c in found.choices] == [3, 5]
    assert budget.given_up(found.choices[0]) == [
        "trials per config 5 -> 3 (verdict minimum 5 -> 3): wider intervals"]
    floor = budget.fit([clear, marginal], 1.0, per_epoch, power)
    assert not floor.fits and [c.trials for c in floor.choices] == [3, 3]
    assert [c.trials for c in budget.fit([clear, marginal], 1600.0, per_epoch).choices] == [5, 5]


def test_a_lowered_verdict_minimum_is_saved_and_reaches_the_run(tmp_path: Path) -> None:
    claim_list = claims.load(EXPERIMENTS / "claims.toml")
    table3 = budget.experiment_of(spec.load(EXPERIMENTS / "table3_pin_memory.toml"), claim_list)
    assert table3.min_ok == 5 and table3.trials == 5
    chosen = budget.fit([table3], 8 * 3 * 60.0, lambda w, s, t: 60.0,  # epochs cost nothing here
                        lambda e, n: 0.9)
    assert [(c.trials, budget.verdict_minimum(c)) for c in chosen.choices] == [(3, 3)]
    plan_file = tmp_path / "budget.json"
    budget.save_plan(budget.plan_document(chosen, "8h"), plan_file)
    run = budget.budgeted_spec(EXPERIMENTS / "table3_pin_memory.toml", "paper", {}, plan_file)
    assert (run.trials, run.min_ok) == (3, 3)
    assert "verdict minimum 5 -> 3" in " ".join(run.budget.given_up if run.budget else ())
