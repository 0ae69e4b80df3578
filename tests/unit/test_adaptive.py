"""Trials until the answer is clear: the stopping rule on constructed records, and the plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from multicard import adaptive, spec
from tests.helpers import write_spec


def auto_spec(tmp_path: Path, count: str = "auto:3..8", half_width: float = 0.02) -> spec.Spec:
    path = write_spec(tmp_path, grid={"precision": ["fp32", "bf16"]},
                      trials={"count": count, "half_width": half_width, "min_ok": 3},
                      baseline={"precision": "fp32"})
    return spec.load(path)


def records(s: spec.Spec, times: dict[str, list[float]]) -> list[dict[str, Any]]:
    ids = {c["precision"]: cid for cid, c, _ in spec.configs(s)}
    return [{"experiment": s.name, "config_id": ids[p], "config": {"precision": p}, "trial": t,
             "status": "ok", "metrics": {"train_time_s": v}}
            for p, values in times.items() for t, v in enumerate(values)]


def test_auto_in_the_spec_plans_the_worst_case_and_keeps_the_rule(tmp_path: Path) -> None:
    s = auto_spec(tmp_path)
    assert s.auto == spec.Auto(3, 8, 0.02) and s.trials == 8
    assert len(spec.plan(s)) == 16
    # plain "auto" starts at the verdict minimum: 5 rounds in the paper profile
    assert spec.load(write_spec(tmp_path, name="x", trials={"count": "auto"})).auto == spec.Auto(5, 20, 0.02)
    assert "auto:3..8" in spec.to_toml(s)  # resumable: the resolved spec keeps the rule


def test_the_rule_waits_for_the_minimum_then_stops_when_every_interval_is_tight(tmp_path: Path) -> None:
    s = auto_spec(tmp_path)
    assert s.auto is not None
    tight = records(s, {"fp32": [10.0, 10.01, 9.99], "bf16": [5.0, 5.005, 4.995]})
    assert not adaptive.decide(s, s.auto, tight[:4], 2, set()).stop  # before the minimum
    decision = adaptive.decide(s, s.auto, tight, 3, set())
    assert decision.stop and decision.reason == "every interval within +-2.0% after 3 rounds"
    loose = records(s, {"fp32": [10.0, 11.0, 9.0], "bf16": [5.0, 5.5, 4.5]})
    decision = adaptive.decide(s, s.auto, loose, 3, set())
    assert not decision.stop and "2 interval(s) still wider than +-2.0%" in decision.reason
    assert adaptive.decide(s, s.auto, loose, 8, set()).reason == (
        "reached the most rounds (8) with 2 interval(s) wider than +-2.0%")
    assert adaptive.decide(s, s.auto, tight, 8, set()).reason.startswith("every interval within")


def test_configs_this_machine_cannot_run_do_not_hold_the_run_open(tmp_path: Path) -> None:
    s = auto_spec(tmp_path)
    assert s.auto is not None
    ids = {c["precision"]: cid for cid, c, _ in spec.configs(s)}
    only_fp32 = records(s, {"fp32": [10.0, 10.01, 9.99]})
    # bf16 skipped here: the baseline's own interval decides, and nothing is left out
    decision = adaptive.decide(s, s.auto, only_fp32, 3, {ids["bf16"]})
    assert decision.stop and decision.reason == "every interval within +-2.0% after 3 rounds"


@pytest.mark.parametrize(("text", "message"), [("auto:1..5", "2 <= MIN <= MAX"),
                                                 ("auto:9..4", "2 <= MIN <= MAX"),
                                                 ("auto:2..5", "below the verdict minimum"),
                                                 ("sometimes", "expected an integer, 'auto'")])
def test_bad_auto_counts_are_refused(tmp_path: Path, text: str, message: str) -> None:
    from multicard.errors import InputError

    with pytest.raises(InputError, match=message):
        auto_spec(tmp_path, count=text)


def test_the_expected_rounds_follow_the_noise() -> None:
    rule = spec.Auto(3, 20, 0.02)
    assert adaptive.expected_rounds(rule, cv=0.005) == 3
    quiet, noisy = adaptive.expected_rounds(rule, cv=0.02), adaptive.expected_rounds(rule, cv=0.03)
    assert 3 < quiet < noisy <= 20
    assert adaptive.expected_rounds(rule, cv=0.5) == 20


def failed(s: spec.Spec, precision: str, trials: int) -> list[dict[str, Any]]:
    cid = next(c for c, config, _ in spec.configs(s) if config["precision"] == precision)
    return [{"experiment": s.name, "config_id": cid, "config": {"precision": precision}, "trial": t,
             "status": "failed", "metrics": {}} for t in range(trials)]


def test_a_config_that_keeps_failing_does_not_hold_the_run_open(tmp_path: Path) -> None:
    s = auto_spec(tmp_path)
    assert s.auto is not None
    tight = records(s, {"fp32": [10.0, 10.01, 9.99]}) + failed(s, "bf16", 3)
    decision = adaptive.decide(s, s.auto, tight, 3, set())
    assert decision.stop
    assert decision.reason == ("every interval within +-2.0% after 3 rounds; "
                               "1 config(s) with no ok trial left out")
    everything_fails = failed(s, "fp32", 3) + failed(s, "bf16", 3)
    decision = adaptive.decide(s, s.auto, everything_fails, 3, set())
    assert decision.stop and decision.reason == "no config has an ok trial after 3 rounds"


def test_a_config_whose_baseline_fails_is_judged_by_its_own_mean(tmp_path: Path) -> None:
    s = auto_spec(tmp_path)
    assert s.auto is not None
    widths = adaptive.half_widths(s, records(s, {"bf16": [5.0, 5.005, 4.995]}) + failed(s, "fp32", 3))
    bf16 = next(c for c, config, _ in spec.configs(s) if config["precision"] == "bf16")
    assert widths[bf16] < 0.02  # not NaN: its own interval, as the baseline gave nothing
