"""The NUMA verdict rules on constructed trial tables (every answer branch)."""

from __future__ import annotations

import pandas as pd
import pytest

from multicard.judge import stats, summarize
from multicard.plan import spec
from tests.helpers import EXPERIMENTS

SPEC = spec.load(EXPERIMENTS / "numa_binding.toml")


def trials(times: dict[tuple[str, str, int], list[float]]) -> pd.DataFrame:
    """{(loader, policy, gpus): train times} -> a trial table (layout nchw; pauses = time / 10)."""
    rows = []
    for (loader, policy, gpus), values in times.items():
        for t, value in enumerate(values):
            rows.append({"loader": loader, "layout": "nchw", "numa_policy": policy, "gpus": gpus,
                         "config_id": f"{loader}-{policy}-{gpus}", "trial": t,
                         "train_time_s": value, "first_batch_latency_s": value / 10})
    return pd.DataFrame(rows)


BASE = {("torch", "none", g): [10.0, 10.2, 9.8] for g in (3, 4)} | {
    ("dali", "none", g): [8.0, 8.1, 7.9] for g in (3, 4)} | {
    ("dali", "local", g): [8.0, 8.1, 7.9] for g in (3, 4)}


def answers(table: pd.DataFrame) -> list[str]:
    return [f.answer for f in summarize.numa_findings(SPEC, table)]


def test_local_removes_the_penalty() -> None:
    table = trials(BASE | {("torch", "local", g): [8.0, 8.1, 7.9] for g in (3, 4)})
    assert answers(table)[0] == "yes"


def test_local_helps_but_the_penalty_remains() -> None:
    table = trials(BASE | {("torch", "local", g): [9.0, 9.1, 8.9] for g in (3, 4)})
    finding = summarize.numa_findings(SPEC, table)[0]
    assert finding.answer == "no"  # 12.5 % left under binding: wholly above the 5 % tolerance
    assert finding.why.endswith("read at the level the 2 groups share (97.5 %): left in "
                                "layout=nchw, gpus=3 / layout=nchw, gpus=4, removed in none")


def test_a_penalty_left_within_the_tolerance_is_removed_and_one_near_it_is_undecided() -> None:
    removed = trials(BASE | {("torch", "local", g): [8.1, 8.2, 8.0] for g in (3, 4)})  # 1.25 %
    assert answers(removed)[0] == "yes"
    near = trials(BASE | {("torch", "local", g): [8.2, 8.8, 8.0] for g in (3, 4)})  # about 4 %
    finding = summarize.numa_findings(SPEC, near)[0]
    assert finding.answer == "inconclusive"
    assert finding.why.endswith("undecided: layout=nchw, gpus=3 / layout=nchw, gpus=4")
    none_to_remove = trials(BASE | {("torch", "none", g): [8.0, 8.1, 7.9] for g in (3, 4)}
                            | {("torch", "local", g): [8.0, 8.1, 7.9] for g in (3, 4)})
    assert answers(none_to_remove)[0] == "inconclusive"  # no penalty without binding to remove


def test_the_penalty_to_remove_is_one_effect_pooled_over_3_and_4_gpus() -> None:
    # a 3 % penalty without binding that neither GPU count shows alone, both together do
    slight = {("torch", "none", g): [10.3, 10.1, 10.5] for g in (3, 4)} | {
        ("dali", "none", g): [10.0, 9.8, 10.2] for g in (3, 4)} | {
        (loader, "local", g): [10.0, 10.1, 9.9] for loader in ("torch", "dali") for g in (3, 4)}
    table = trials(slight)
    alone = [stats.ratio_of_means([10.3, 10.1, 10.5], [10.0, 9.8, 10.2], cross_check=False)]
    assert alone[0].ci_lo < 1  # one GPU count alone cannot say there is a penalty
    finding = summarize.numa_findings(SPEC, table)[0]
    assert finding.answer == "yes", finding.why
    assert finding.why.startswith("penalty T_torch/T_dali without binding, over 2 group(s): 1.030x")


def test_binding_that_removes_the_penalty_at_3_gpus_and_not_at_4_is_mixed() -> None:
    table = trials(BASE | {("torch", "local", 3): [8.0, 8.1, 7.9], ("torch", "local", 4): [10.0, 10.1, 9.9]})
    finding = summarize.numa_findings(SPEC, table)[0]
    assert finding.answer == "mixed"
    assert "left in layout=nchw, gpus=4, removed in layout=nchw, gpus=3" in finding.why


def test_local_does_not_help() -> None:
    table = trials(BASE | {("torch", "local", g): [10.1, 9.9, 10.0] for g in (3, 4)})
    finding = summarize.numa_findings(SPEC, table)[0]
    assert finding.answer == "no"
    assert set(finding.evidence["ci"]) >= {"contains 1"}


def test_without_3_4_gpu_trials_the_answer_is_not_run() -> None:
    table = trials({("torch", "none", 2): [10.0, 10.1], ("torch", "local", 2): [9.0, 9.1]})
    finding = summarize.numa_findings(SPEC, table)[0]
    assert finding.answer == "not run"
    assert finding.evidence["gpus"].tolist() == [2, 2]  # the 2-GPU evidence is still shown


@pytest.mark.parametrize(("remote_times", "answer"), [([12.0, 12.2, 11.9], "yes"),
                                                      ([10.0, 10.1, 9.9], "no")])
def test_remote_creates_a_penalty_or_not(remote_times: list[float], answer: str) -> None:
    table = trials({("torch", "none", 1): [10.0, 10.2, 9.8], ("torch", "remote", 1): remote_times})
    assert answers(table)[1] == answer


def test_controls_that_matter_are_named() -> None:
    controls = spec.load(EXPERIMENTS / "numa_binding.toml", "controls")
    rows = []
    for cache, seconds in (("warm", [10.0, 10.1, 9.9]), ("cold", [14.0, 14.2, 13.8])):
        for workers, factor in ((False, 1.0), (True, 1.0)):
            for t, value in enumerate(seconds):
                rows.append({"numa_policy": "none", "page_cache": cache, "persistent_workers": workers,
                             "normalize": "cpu", "gpus": 4, "config_id": f"{cache}{workers}",
                             "trial": t, "train_time_s": value * factor,
                             "first_batch_latency_s": 1.0 + 0.01 * t})
    finding = summarize.numa_findings(controls, pd.DataFrame(rows))[2]
    assert finding.answer == "page_cache"
    assert set(finding.evidence["factor"]) == {"page_cache", "persistent_workers"}


def test_effects_ratio_and_direction() -> None:
    table = trials({("torch", "none", 3): [10.0, 10.0], ("torch", "local", 3): [5.0, 5.0]})
    effect = summarize.effects(SPEC, table, "numa_policy", "none", "train_time_s")
    row = effect.iloc[0]
    assert (row["numa_policy"], row["versus"]) == ("local", "none")
    assert row["ratio"] == pytest.approx(2.0)
    assert (row["ci_lo"], row["ci_hi"]) == pytest.approx((2.0, 2.0))
    assert row["ci"] == "above"


def test_torchrun_binding_is_compared_with_none_and_with_numactl_local() -> None:
    # the DataLoader at 1 and 4 GPUs: torchrun's node binding as fast as numactl local, both
    # faster than none; its socket binding no different from none and slower than local
    times = {("torch", "none", g): [10.0, 10.2, 9.8] for g in (1, 4)} | {
        ("torch", "local", g): [8.0, 8.1, 7.9] for g in (1, 4)} | {
        ("torch", "torchrun_node", g): [8.0, 7.9, 8.1] for g in (1, 4)} | {
        ("torch", "torchrun_socket", g): [10.1, 9.9, 10.0] for g in (1, 4)}
    finding = summarize.numa_findings(SPEC, trials(times))[3]
    assert finding.question == "numactl `local` vs torchrun's `--numa-binding` vs none?"
    assert finding.answer == ("torchrun_node: faster than none, no different from local (every CI "
                              "contains 1); torchrun_socket: no different from none (every CI "
                              "contains 1), slower than local")
    assert set(finding.evidence["versus"]) == {"none", "local"} and len(finding.evidence) == 8
    assert summarize.numa_findings(SPEC, trials(BASE))[3].answer == "not run"  # skipped everywhere
