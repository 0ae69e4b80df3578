from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from multicard.judge import ladder, summarize
from multicard.plan import spec
from multicard.publish.tables import display_table
from tests.helpers import TINY_FIXED, write_spec


@pytest.mark.parametrize(("ci", "expected"), [
    ((0.97, 1.02), "compute-bound"), ((0.95, 0.99), "compute-bound"), ((0.55, 0.70), "data-bound"),
    ((0.82, 0.90), "mixed"), ((0.90, 0.99), "unclear"), ((0.70, 0.85), "unclear"),
    ((float("nan"), float("nan")), "unclear")])
def test_the_label_follows_the_whole_interval(ci: tuple[float, float], expected: str) -> None:
    assert ladder.label(*ci) == expected


def test_a_loader_at_half_the_ceiling_is_data_bound() -> None:
    synthetic = [1000.0, 1010.0, 990.0, 1005.0, 995.0]
    real = [500.0, 510.0, 495.0, 505.0, 490.0]
    bound = ladder.classify(real, synthetic)
    assert bound.label == "data-bound" and bound.ratio == pytest.approx(0.5, abs=0.01)
    assert bound.ci_lo < 0.5 < bound.ci_hi and (bound.n_real, bound.n_synthetic) == (5, 5)


def test_one_trial_each_is_unclear_not_a_verdict() -> None:
    assert ladder.classify([500.0], [1000.0]).label == "unclear"


def test_the_label_is_rarely_wrong_when_the_loader_costs_nothing() -> None:
    # 5 trials each, 3 % noise, equal true throughput: "data-bound" or "mixed" would be false
    rng = np.random.default_rng(0)
    wrong = sum(ladder.classify(1000 * rng.lognormal(0, 0.03, 5), 1000 * rng.lognormal(0, 0.03, 5)).label
                in ("data-bound", "mixed") for _ in range(2000))
    assert wrong / 2000 < 0.03


def test_a_loader_table_says_which_configs_are_data_bound(tmp_path: Path) -> None:
    fixed = {**TINY_FIXED, "scenario": "b"}
    s = spec.load(write_spec(tmp_path, fixed=fixed, grid={"loader": ["torch", "dali", "synthetic"]}))
    ids = {c["loader"]: cid for cid, c, _ in spec.configs(s)}
    rates = {"torch": [500, 505, 495], "dali": [970, 990, 1000], "synthetic": [1000, 1010, 990]}
    trials = pd.DataFrame([{"loader": loader, "config_id": ids[loader], "trial": t,
                            **dict.fromkeys(s.metrics, float("nan")), "throughput_samples_s": float(v)}
                           for loader, values in rates.items() for t, v in enumerate(values)])
    empty = pd.DataFrame(columns=["config_id", "status", "error_type"])
    table = summarize.config_table(s, trials, empty)
    assert table.set_index("loader")["bound"].to_dict() == {
        "torch": "data-bound", "dali": "compute-bound", "synthetic": "ceiling"}
    shown = display_table(s, table)["bound: real / synthetic img/s [95% CI]"].tolist()
    assert shown[0].startswith("data-bound (0.5 [") and shown[2] == "ceiling"


def test_the_ladder_figure_stacks_whole_train_and_ceiling(tmp_path: Path) -> None:
    from multicard.publish.figures import plot_ladder

    fixed = {**TINY_FIXED, "scenario": "b"}
    s = spec.load(write_spec(tmp_path, fixed=fixed, grid={"loader": ["torch", "synthetic"]}))
    ids = {c["loader"]: cid for cid, c, _ in spec.configs(s)}
    trials = pd.DataFrame([{"loader": loader, "config_id": ids[loader], "trial": 0,
                            **dict.fromkeys(s.metrics, float("nan")), "throughput_samples_s": rate,
                            summarize.WHOLE: rate / 2} for loader, rate in (("torch", 500.0),
                                                                            ("synthetic", 1000.0))])
    ladder_rows = summarize.ladder_table(s, trials)
    assert ladder_rows[["loader", "p_whole", "p_train", "ceiling"]].values.tolist() == [
        ["torch", 250.0, 500.0, 1000.0]]
    table = summarize.config_table(s, trials, pd.DataFrame(columns=["config_id", "status", "error_type"]))
    assert plot_ladder(s, table, ladder_rows, tmp_path / "ladder.png")
    assert (tmp_path / "ladder.png").stat().st_size > 1000


def test_the_loader_alone_rung_joins_on_the_loading_settings(tmp_path: Path) -> None:
    fixed = {**TINY_FIXED, "scenario": "b"}
    for name in ("train", "alone", "other"):
        (tmp_path / name).mkdir()
    train = spec.load(write_spec(tmp_path / "train", fixed=fixed,
                                 grid={"loader": ["torch", "synthetic"], "precision": ["fp32", "fp16"]}))
    alone = spec.load(write_spec(tmp_path / "alone", fixed={**fixed, "mode": "loader_only", "epochs": 1},
                                 grid={"loader": ["torch"]}))
    other = spec.load(write_spec(tmp_path / "other", fixed={**fixed, "mode": "loader_only",
                                                             "batch_size": 99}, grid={"loader": ["torch"]}))

    def trials(s: spec.Spec, rate: dict[str, float]) -> pd.DataFrame:
        return pd.DataFrame([{**c, "config_id": cid, "trial": t, **dict.fromkeys(s.metrics, float("nan")),
                              "throughput_samples_s": rate[c["loader"]] + t, summarize.WHOLE: 1.0}
                             for cid, c, _ in spec.configs(s) for t in (0, 1)])

    rates = summarize.loader_only_rates(alone, trials(alone, {"torch": 800.0}))
    assert list(rates.values()) == [800.5]  # mean of its trials
    assert summarize.loader_only_rates(train, trials(train, {"torch": 1.0, "synthetic": 2.0})) == {}
    both = rates | summarize.loader_only_rates(other, trials(other, {"torch": 5.0}))
    ladder_rows = summarize.ladder_table(train, trials(train, {"torch": 500.0, "synthetic": 900.0}), both)
    # one rung for each precision: the precision does not load anything; batch 99 is another loader
    assert ladder_rows[["precision", "p_train", "ceiling", "loader_only"]].values.tolist() == [
        ["fp32", 500.5, 900.5, 800.5], ["fp16", 500.5, 900.5, 800.5]]
    assert summarize.ladder_table(train, trials(train, {"torch": 1.0, "synthetic": 2.0}))[
        "loader_only"].isna().all()
    # channels_last batches (layout) and fp16 batches cast on the host are other loaders: no
    # rung from the NCHW float32 loader-alone run
    (tmp_path / "nhwc").mkdir()
    nhwc = spec.load(write_spec(tmp_path / "nhwc", fixed={**fixed, "cast": "host"},
                                grid={"loader": ["torch", "synthetic"], "layout": ["nchw", "nhwc"],
                                      "precision": ["fp32", "fp16"]}))
    rungs = summarize.ladder_table(nhwc, trials(nhwc, {"torch": 500.0, "synthetic": 900.0}), both)
    assert rungs.set_index(["layout", "precision"])["loader_only"].dropna().to_dict() == {
        ("nchw", "fp32"): 800.5}


def test_p_whole_is_the_images_over_the_whole_launch() -> None:
    record = {"metrics": {"throughput_samples_s": 100.0, "train_time_s": 6.0}, "wall_s": 20.0}
    assert summarize.whole_throughput(record) == pytest.approx(30.0)
    assert np.isnan(summarize.whole_throughput({"metrics": {}, "wall_s": 1.0}))


def test_a_dali_claim_says_whether_its_configs_were_data_bound(tmp_path: Path) -> None:
    from multicard.judge import claims
    from multicard.publish import document
    from multicard.run import store
    from tests.helpers import EXPERIMENTS

    s = spec.load(EXPERIMENTS / "figure6_loaders.toml")
    run = tmp_path / "run"
    run.mkdir()
    (run / "spec.toml").write_text(spec.to_toml(s))
    rates = {"torch": 500.0, "dali": 980.0, "synthetic": 1000.0}
    for cid, config, _ in spec.configs(s):
        if config["gpus"] != 3 or config["image_size"] != 300:
            continue
        for trial in range(5):
            rate = rates[config["loader"]] * (1 + 0.01 * trial)
            store.append(run / "trials.jsonl", {
                "schema": 1, "experiment": s.name, "config_id": cid, "config": config, "trial": trial,
                "status": "ok", "wall_s": 60.0, "error": None, "artifacts": [],
                "metrics": {"train_time_s": 600_000 / rate, "throughput_samples_s": rate}})
    c12 = [c for c in claims.load(EXPERIMENTS / "claims.toml") if c.id == "C12"]
    document.write_report([run], run, c12)
    row = (run / "tables" / "claims.csv").read_text().splitlines()[1]
    assert "loader=dali: compute-bound; loader=torch: data-bound" in row


def test_a_loader_only_run_gives_the_ladder_its_rung_and_never_a_claim(tmp_path: Path) -> None:
    from multicard.judge import claims
    from multicard.publish import document
    from multicard.run import store
    from tests.helpers import EXPERIMENTS

    def run_of(profile: str, name: str, rates: dict[str, float], trials: int) -> Path:
        s = spec.load(EXPERIMENTS / "figure6_loaders.toml", profile)
        run = tmp_path / name
        run.mkdir()
        (run / "spec.toml").write_text(spec.to_toml(s))
        for cid, config, _ in spec.configs(s):
            if config["gpus"] != 3 or config["image_size"] != 300:
                continue
            for trial in range(trials):
                rate = rates[config["loader"]] * (1 + 0.01 * trial)
                store.append(run / "trials.jsonl", {
                    "schema": 1, "experiment": s.name, "config_id": cid, "config": config,
                    "trial": trial, "status": "ok", "wall_s": 60.0, "error": None, "artifacts": [],
                    "metrics": {"train_time_s": 600_000 / rate, "throughput_samples_s": rate}})
        return run

    train = run_of("paper", "train", {"torch": 500.0, "dali": 980.0, "synthetic": 1000.0}, trials=5)
    # without a model the DataLoader would look 10x faster than DALI (and with more trials, the
    # group a claim would prefer): a claim must not see it
    alone = run_of("loader_only", "alone", {"torch": 9000.0, "dali": 900.0}, trials=6)
    c12 = [c for c in claims.load(EXPERIMENTS / "claims.toml") if c.id == "C12"]
    document.write_report([train], tmp_path / "one", c12)
    document.write_report([train, alone], tmp_path / "both", c12)
    verdict = {d: (tmp_path / d / "tables" / "claims.csv").read_text() for d in ("one", "both")}
    assert verdict["one"] == verdict["both"]
    ladder_rows = pd.read_csv(tmp_path / "both" / "tables" / "figure6_loaders_ladder.csv")
    assert ladder_rows.set_index("loader")["loader_only"].to_dict() == pytest.approx(
        {"torch": 9225.0, "dali": 922.5})  # the mean of 6 trials 1 % apart
    assert pd.read_csv(tmp_path / "one" / "tables" / "figure6_loaders_ladder.csv")["loader_only"].isna().all()
    text = (tmp_path / "both" / "REPORT.md").read_text()
    assert ("## Figure 6: DataLoader vs DALI vs no-loading bound (Scenario B, DDP-DS): the loader alone, "
            "no model") in text


def test_a_traced_trial_averages_its_ranks_and_a_part_one_rank_could_not_tell_stays_null(
        tmp_path: Path) -> None:
    from multicard.profiling import parse

    s = spec.load(write_spec(tmp_path, fixed=TINY_FIXED, grid={"precision": ["fp32"]}))
    [(cid, config, _)] = spec.configs(s)
    ranks = [{**parse.empty_summary("nsys-sqlite"), "kernel_count": n, "gpu_span_ns": 100,
              "gpu_busy_ns": 60, "gpu_host_wait_ns": host, "gpu_timelines": []}
             for n, host in ((10, 30), (20, None))]
    record = {"experiment": s.name, "status": "ok", "trace": "nsys", "config_id": cid, "config": config,
              "trial": 0, "trace_metrics": {f"r{i}.sqlite": r for i, r in enumerate(ranks)}}
    [row] = summarize.trace_trials(s, [record]).to_dict("records")
    assert row["kernel_count"] == 15 and row["gpu_busy_ns"] == 60
    assert np.isnan(row["gpu_host_wait_ns"])  # not 30: rank 1 could not tell its host wait
