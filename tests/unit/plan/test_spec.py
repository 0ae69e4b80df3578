from __future__ import annotations

from pathlib import Path

import pytest

from multicard.errors import InputError
from multicard.plan import spec
from tests.helpers import EXPERIMENTS, write_spec

TABLE2 = EXPERIMENTS / "table2_precision.toml"


def test_every_shipped_experiment_loads_and_expands_in_every_profile() -> None:
    import tomllib

    for path in sorted(EXPERIMENTS.glob("*.toml")):
        if path.name in ("claims.toml", "energy_questions.toml"):  # predicates, not experiments
            continue
        profiles = ["paper", *tomllib.loads(path.read_text()).get("profiles", {})]
        for profile in profiles:
            s = spec.load(path, profile)
            assert spec.plan(s), (path, profile)


def test_table2_paper_profile_expands_grid_times_trials() -> None:
    s = spec.load(TABLE2)
    assert s.grid == {"precision": ["fp64", "fp32", "tf32", "fp16", "bf16"], "gpus": [1, 2, 3, 4]}
    assert s.fixed["epochs"] == 20 and s.fixed["device"] == "cuda"
    assert len(spec.configs(s)) == 20
    planned = spec.plan(s)
    assert len(planned) == 100
    assert [p.order for p in planned] == list(range(100))


def test_smoke_profile_overrides_fixed_grid_and_trials() -> None:
    s = spec.load(TABLE2, "smoke")
    assert s.fixed["device"] == "cpu" and s.fixed["image_size"] == 32
    assert s.grid["gpus"] == [1, 2]
    assert s.trials == 1
    assert max(s.grid["gpus"]) <= 2


def test_plan_interleaves_every_config_once_per_round() -> None:
    s = spec.load(TABLE2, "smoke")
    planned = spec.plan(s)
    n_configs = len(spec.configs(s))
    for t in range(s.trials):
        round_ = planned[t * n_configs:(t + 1) * n_configs]
        assert {p.trial for p in round_} == {t}
        assert len({p.config_id for p in round_}) == n_configs
    # seeded shuffle: not grid order, but the same order every time
    assert [p.config_id for p in planned] == [p.config_id for p in spec.plan(s)]
    assert [p.config_id for p in planned[:n_configs]] != [c[0] for c in spec.configs(s)]


def test_config_ids_are_stable_and_change_with_any_setting(tmp_path: Path) -> None:
    a = spec.load(write_spec(tmp_path))
    ids = [c[0] for c in spec.configs(a)]
    assert ids == [c[0] for c in spec.configs(spec.load(write_spec(tmp_path)))]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 12 and int(i, 16) >= 0 for i in ids)
    changed = spec.load(write_spec(tmp_path, fixed={"device": "cpu", "epochs": 3}))
    assert not set(ids) & {c[0] for c in spec.configs(changed)}


def test_profile_can_move_a_factor_between_fixed_and_grid(tmp_path: Path) -> None:
    path = write_spec(tmp_path, fixed={"device": "cpu", "image_size": 64},
                      profiles={"p": {"grid": {"image_size": [32, 48]}, "fixed": {"precision": "bf16"}}})
    s = spec.load(path, "p")
    assert s.grid == {"image_size": [32, 48]}
    assert s.fixed["precision"] == "bf16" and "image_size" not in s.fixed


def test_resolved_spec_round_trips_through_toml(tmp_path: Path) -> None:
    s = spec.load(TABLE2, "smoke")
    written = tmp_path / "spec.toml"
    written.write_text(spec.to_toml(s))
    again = spec.load(written)
    assert again.profile == "smoke"
    assert [c[0] for c in spec.configs(again)] == [c[0] for c in spec.configs(s)]
    assert again.references == s.references


@pytest.mark.parametrize(
    ("sections", "key_fragment"),
    [
        ({"fixed": {"device": "cpu", "bogus": 1}}, "[fixed].bogus"),
        ({"fixed": {"device": "cpu", "epochs": "twenty"}}, "[fixed].epochs"),
        ({"fixed": {"device": "cpu", "epochs": True}}, "[fixed].epochs"),
        ({"fixed": {"device": "cpu", "precision": "fp8"}}, "[fixed].precision"),
        ({"fixed": {"device": "cpu", "image_size": 4}}, "[fixed].image_size"),
        ({"grid": {"gpus": []}}, "[grid].gpus"),
        ({"grid": {"gpus": [1, 1]}}, "[grid].gpus"),
        ({"grid": {"gpus": 2}}, "[grid].gpus"),
        ({"trials": {"count": 0}}, "[trials].count"),
        ({"trials": {"count": 1, "retries": 3}}, "[trials].retries"),
        ({"baseline": {"precision": "fp64"}}, "[baseline].precision"),
        ({"baseline": {"gpus": 1}}, "[baseline].gpus"),
        ({"report": {"primary": "speed"}}, "[report].primary"),
        ({"reference": [{"match": {"gpus": 2}, "test_accuracy": 0.9}]}, "source"),
        ({"reference": [{"match": {}, "test_accuracy": [0.9, 0.8], "source": "x"}]}, "test_accuracy"),
        ({"colour": {"a": 1}}, "top level.colour"),
    ],
)
def test_invalid_specs_fail_with_one_line_naming_file_and_key(
    tmp_path: Path, sections: dict, key_fragment: str
) -> None:
    fixed = sections.pop("fixed", {"device": "cpu"})
    grid = sections.pop("grid", None)
    trials = sections.pop("trials", None)
    path = write_spec(tmp_path, fixed=fixed, grid=grid, trials=trials, **sections)
    with pytest.raises(InputError) as info:
        spec.load(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    assert key_fragment in message


def test_empty_grid_table_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text('[experiment]\nname="g"\ntitle="t"\nworkload="vision"\n[grid]\n')
    with pytest.raises(InputError, match=r"g\.toml: \[grid\]: expected at least one factor"):
        spec.load(path)


def test_name_must_match_file_stem_and_profile_must_exist(tmp_path: Path) -> None:
    path = write_spec(tmp_path, name="tiny")
    renamed = path.rename(tmp_path / "other.toml")
    with pytest.raises(InputError, match=r"\[experiment\]\.name: expected the file stem 'other'"):
        spec.load(renamed)
    with pytest.raises(InputError, match=r"no profile 'smoke' \(available: paper\)"):
        spec.load(write_spec(tmp_path), "smoke")


def test_unreadable_specs(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such spec file"):
        spec.load(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[experiment\nname=")
    with pytest.raises(InputError, match="not valid TOML"):
        spec.load(bad)


def test_baseline_config_and_references_match() -> None:
    s = spec.load(TABLE2)
    assert spec.baseline_config(s, {"precision": "fp16", "gpus": 2}) == {"precision": "fp64", "gpus": 2}
    fp16_2 = [r for r in s.references if r.applies_to({"precision": "fp16", "gpus": 2})]
    assert {k for r in fp16_2 for k in r.values} == {"gain_pct", "speedup_x", "test_accuracy"}
    assert fp16_2[0].values["gain_pct"] == (110.0, 152.0)


def test_set_fixes_a_factor_of_the_profiles_own_grid_too() -> None:
    # table2's smoke profile has its own grid (gpus = [1, 2]): --set gpus=1 must leave only 1
    fixed = spec.load(EXPERIMENTS / "table2_precision.toml", "smoke", {"gpus": 1})
    assert {p.params["gpus"] for p in spec.plan(fixed)} == {1}
    whole = spec.load(EXPERIMENTS / "table2_precision.toml", "smoke")
    assert len(spec.plan(fixed)) == len(spec.plan(whole)) // 2
