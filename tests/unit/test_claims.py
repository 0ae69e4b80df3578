"""Claims and their verdicts on constructed results: every kind, every verdict."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from multicard import claims, spec
from multicard.errors import InputError
from tests.helpers import EXPERIMENTS

CLAIMS = claims.load(EXPERIMENTS / "claims.toml")
BY_ID = {c.id: c for c in CLAIMS}


def results(experiment: str, rows: list[dict[str, Any]], profile: str = "paper",
            records: list[dict[str, Any]] | None = None,
            traces: pd.DataFrame | None = None) -> dict[str, list[claims.Results]]:
    """{experiment: [Results]} from trial rows (factor values + metric values)."""
    s = spec.load(EXPERIMENTS / f"{experiment}.toml", profile)
    frame = pd.DataFrame(rows)
    frame["config_id"] = ["-".join(str(r[k]) for k in s.grid if k in r) for r in rows]
    return {experiment: [claims.Results(s, frame, pd.DataFrame() if traces is None else traces,
                                        records or [])]}


def trials(factors: dict[str, Any], metric: str, values: list[float]) -> list[dict[str, Any]]:
    return [{**factors, "trial": t, metric: v} for t, v in enumerate(values)]


def table2(fp32_times: list[float]) -> dict[str, list[claims.Results]]:
    rows = trials({"precision": "fp64", "gpus": 1}, "train_time_s", [16.0, 16.1, 15.9])
    rows += trials({"precision": "fp32", "gpus": 1}, "train_time_s", fp32_times)
    return results("table2_precision", rows)


def verdict(claim_id: str, data: dict[str, list[claims.Results]]) -> claims.Verdict:
    return claims.judge(BY_ID[claim_id], data)


# --- the shipped file --------------------------------------------------------------------------

def test_shipped_claims_are_c1_to_c19_and_name_real_experiments_and_settings() -> None:
    assert [c.id for c in CLAIMS] == [f"C{i}" for i in range(1, 20)]
    for claim in CLAIMS:
        for part in claim.parts or (claim,):
            doc = tomllib.loads((EXPERIMENTS / f"{part.experiment}.toml").read_text())
            known = set(doc["grid"]) | set(doc["fixed"])
            for selector in (part.compare, part.against, part.where):
                assert set(selector) <= known, (claim.id, selector)
                for key, wanted in selector.items():
                    levels = doc["grid"].get(key, [doc["fixed"].get(key)])
                    assert set(wanted if isinstance(wanted, list) else [wanted]) <= set(levels), \
                        (claim.id, key, wanted)


@pytest.mark.parametrize(("entry", "message"), [
    ({"kind": "speedup"}, "kind: expected one of"),
    ({"kind": "direction", "experiment": "x", "metric": "train_time_s",
      "compare": {"precison": "fp32"}}, r"compare: unknown setting\(s\) \['precison'\]"),
    ({"kind": "direction", "experiment": "x", "metric": "train_tme_s"}, "unknown metric"),
    ({"kind": "range", "experiment": "x", "metric": "train_time_s"}, "needs range"),
    ({"kind": "direction", "metric": "train_time_s"}, "needs experiment"),
    ({"kind": "direction", "experiment": "x", "metric": "train_time_s", "sde": "above"},
     "unexpected keyword"),
])
def test_bad_claims_are_refused_with_the_claim_named(tmp_path: Path, entry: dict[str, Any],
                                                     message: str) -> None:
    import tomli_w

    path = tmp_path / "claims.toml"
    path.write_text(tomli_w.dumps({"claim": [{"id": "C99", "text": "t", "paper": "p", **entry}]}))
    with pytest.raises(InputError, match=rf"claims.toml: claim C99: .*{message}"):
        claims.load(path)


# --- range -------------------------------------------------------------------------------------

def test_range_supported_when_the_estimate_lies_in_the_papers_range() -> None:
    v = verdict("C1", table2([10.0, 10.05, 9.95]))  # gain 60 %
    assert v.verdict == "supported"
    [e] = v.evidence
    assert (e.label, e.unit) == ("gpus=1", "%") and e.value == pytest.approx(60, abs=0.5)
    assert e.ci_lo < e.value < e.ci_hi


def test_range_contradicted_when_the_whole_ci_lies_outside() -> None:
    v = verdict("C1", table2([15.0, 15.1, 14.9]))  # gain 6.7 %
    assert v.verdict == "contradicted"


def test_range_inconclusive_when_the_ci_straddles_an_end() -> None:
    v = verdict("C1", table2([9.0, 9.8, 9.2]))  # gain 71 %, CI about 63-78 %: across the end 68
    assert v.verdict == "inconclusive"


# --- direction, across groups -------------------------------------------------------------------

def llm(step_times: dict[tuple[str, int], list[float]], metric: str = "step_time_median_s"
        ) -> dict[str, list[claims.Results]]:
    rows = [row for (method, gpus), values in step_times.items()
            for row in trials({"method": method, "dataset": "gec", "gpus": gpus}, metric, values)]
    return results("table4_llm_methods", rows)


@pytest.mark.parametrize(("four_gpu", "expected"), [
    ([1.2, 1.21, 1.19], "supported"),     # per-step time grows with GPUs, as the paper says
    ([0.8, 0.81, 0.79], "contradicted"),  # it shrinks
    ([0.9, 1.3, 1.0], "inconclusive"),    # the CI contains 1
])
def test_direction(four_gpu: list[float], expected: str) -> None:
    data = llm({("lora", 1): [1.0, 1.01, 0.99], ("lora", 4): four_gpu})
    assert verdict("C13", data).verdict == expected


def test_groups_that_disagree_make_the_claim_inconclusive() -> None:
    data = llm({("lora", 1): [1.0, 1.01, 0.99], ("lora", 4): [1.2, 1.21, 1.19],
                ("dpo", 1): [1.0, 1.01, 0.99], ("dpo", 4): [0.8, 0.81, 0.79]})
    v = verdict("C13", data)
    assert v.verdict == "inconclusive"
    assert v.why == "2 comparison(s): 1 supported, 1 contradicted"
    assert [e.label for e in v.evidence] == ["method=lora, dataset=gec", "method=dpo, dataset=gec"]


# --- negligible ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("pinned", "expected"), [
    ([1.001, 1.0, 0.999], "supported"),   # within +-5 %
    ([1.3, 1.31, 1.29], "contradicted"),  # 30 % slower: the whole CI outside the band
    ([1.0, 1.2, 0.95], "inconclusive"),   # the CI leaves the band but contains 1
])
def test_negligible(pinned: list[float], expected: str) -> None:
    rows = trials({"pin_memory": False, "gpus": 1}, "step_time_median_s", [1.0, 1.01, 0.99])
    rows += trials({"pin_memory": True, "gpus": 1}, "step_time_median_s", pinned)
    assert verdict("C14", results("table5_llm_pin_memory", rows)).verdict == expected


# --- outcome ------------------------------------------------------------------------------------

def record(config: dict[str, Any], status: str, experiment: str = "figure6_loaders") -> dict[str, Any]:
    return {"experiment": experiment, "config": config, "config_id": str(config), "trial": 0,
            "status": status, "metrics": {}, "error": None}


TORCH_500 = {"loader": "torch", "image_size": 500, "gpus": 2}
DALI_500 = {"loader": "dali", "image_size": 500, "gpus": 2}


@pytest.mark.parametrize(("torch_status", "dali_status", "expected"), [
    ("oom", "ok", "supported"),            # the paper's result
    ("ok", "ok", "contradicted"),          # the DataLoader ran
    ("skipped", "skipped", "not run"),     # a node with one GPU
    ("skipped", "ok", "inconclusive"),     # half of the claim tested, and it held
])
def test_outcome(torch_status: str, dali_status: str, expected: str) -> None:
    data = results("figure6_loaders", [], records=[record(TORCH_500, torch_status),
                                                   record(DALI_500, dali_status)])
    assert verdict("C11", data).verdict == expected


# --- shrinks ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("pinned_4", "expected"), [
    ([8.5, 8.55, 8.45], "supported"),     # gain 30 % at 1 GPU, 18 % at 4
    ([7.0, 7.05, 6.95], "contradicted"),  # grows to 43 %
    ([7.3, 8.0, 7.6], "inconclusive"),    # the two CIs overlap
])
def test_shrinks(pinned_4: list[float], expected: str) -> None:
    rows = trials({"pin_memory": False, "gpus": 1}, "train_time_s", [13.0, 13.1, 12.9])
    rows += trials({"pin_memory": True, "gpus": 1}, "train_time_s", [10.0, 10.05, 9.95])
    rows += trials({"pin_memory": False, "gpus": 4}, "train_time_s", [10.0, 10.05, 9.95])
    rows += trials({"pin_memory": True, "gpus": 4}, "train_time_s", pinned_4)
    v = verdict("C6", results("table3_pin_memory", rows))
    assert v.verdict == expected
    assert [e.label for e in v.evidence] == ["gpus=1", "gpus=4"]
    assert v.evidence[0].value == pytest.approx(1.3, abs=0.01) and v.evidence[0].unit == "x"


# --- dominates (trace metrics) ------------------------------------------------------------------

def traces(launch_ns: float, copy_ns: float) -> pd.DataFrame:
    return pd.DataFrame([{"method": "lora", "dataset": "gec", "gpus": 1, "config_id": "lora-1",
                          "trial": t, "trace": "nsys", "cuda_launch_kernel_ns": launch_ns + t,
                          "cuda_stream_synchronize_ns": 0.0, "cuda_event_synchronize_ns": 0.0,
                          "memcpy_htod_ns": copy_ns + t} for t in range(3)])


@pytest.mark.parametrize(("launch", "copy", "expected"), [
    (9e8, 1e8, "supported"), (1e8, 9e8, "contradicted")])
def test_dominates(launch: float, copy: float, expected: str) -> None:
    data = results("table4_llm_methods", [], traces=traces(launch, copy))
    assert verdict("C18", data).verdict == expected


def test_dominates_without_traced_trials_is_not_run() -> None:
    v = verdict("C18", results("table4_llm_methods", trials({"method": "lora", "gpus": 1},
                                                             "step_time_median_s", [1.0])))
    assert (v.verdict, v.why) == ("not run", "no traced trials of table4_llm_methods "
                                             "(--trace torch|nsys)")


# --- numa ---------------------------------------------------------------------------------------

def numa_rows(torch_local: list[float]) -> list[dict[str, Any]]:
    rows = []
    for (loader, policy), values in {("torch", "none"): [10.0, 10.2, 9.8],
                                     ("dali", "none"): [8.0, 8.1, 7.9],
                                     ("dali", "local"): [8.0, 8.1, 7.9],
                                     ("torch", "local"): torch_local}.items():
        for gpus in (3, 4):
            rows += trials({"loader": loader, "layout": "nchw", "numa_policy": policy,
                            "gpus": gpus}, "train_time_s", values)
    for row in rows:
        row["first_batch_latency_s"] = row["train_time_s"] / 10
    return rows


@pytest.mark.parametrize(("torch_local", "expected"), [
    ([8.0, 8.1, 7.9], "supported"), ([10.1, 9.9, 10.0], "contradicted"),
    ([9.0, 9.1, 8.9], "inconclusive")])
def test_numa_part_follows_the_numa_test(torch_local: list[float], expected: str) -> None:
    numa_claim = BY_ID["C10"].parts[1]
    v = claims.judge(numa_claim, results("numa_binding", numa_rows(torch_local)))
    assert v.verdict == expected


# --- all, not run -------------------------------------------------------------------------------

def test_all_is_contradicted_when_any_part_is_and_not_run_when_every_part_is() -> None:
    rows = trials({"method": "lora", "dataset": "gec", "gpus": 1}, "step_time_median_s",
                  [1.0, 1.01, 0.99])
    rows += trials({"method": "dpo", "dataset": "gec", "gpus": 1}, "step_time_median_s",
                   [1.5, 1.51, 1.49])  # LoRA 33 % faster: in the paper's 30-40 %
    for row in rows:
        row["peak_mem_reserved_bytes"] = 9e9 if row["method"] == "lora" else 8e9  # but LoRA uses more
    v = verdict("C15", results("table4_llm_methods", rows))
    assert v.verdict == "contradicted"
    assert v.why.startswith("part 1: supported") and "part 2: contradicted" in v.why
    assert verdict("C15", {}).verdict == "not run"


def test_cpu_runs_do_not_judge_gpu_claims() -> None:
    rows = trials({"precision": "fp64", "gpus": 1}, "train_time_s", [16.0, 16.1, 15.9])
    rows += trials({"precision": "fp32", "gpus": 1}, "train_time_s", [10.0, 10.05, 9.95])
    v = verdict("C1", results("table2_precision", rows, profile="smoke"))
    assert (v.verdict, v.why) == ("not run", "only cpu trials of table2_precision; the claim is "
                                             "about cuda; their numbers are shown, not judged")
    assert v.evidence[0].label == "gpus=1" and v.evidence[0].value == pytest.approx(60, abs=0.5)
    assert verdict("C1", {}).why == "no run of table2_precision in this report"


def test_evaluate_returns_one_verdict_per_claim_in_order() -> None:
    verdicts = claims.evaluate(CLAIMS, table2([10.0, 10.05, 9.95]))
    assert [v.claim.id for v in verdicts] == [c.id for c in CLAIMS]
    assert {v.verdict for v in verdicts} <= set(claims.VERDICTS)


def test_the_claims_file_is_found_from_the_environment_the_cwd_or_the_checkout(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("MULTICARD_CLAIMS", raising=False)
    monkeypatch.chdir(tmp_path)
    assert claims.default_file() == EXPERIMENTS / "claims.toml"  # the source checkout's
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "claims.toml").write_text("")
    assert claims.default_file() == tmp_path / "experiments" / "claims.toml"
    monkeypatch.setenv("MULTICARD_CLAIMS", "/elsewhere/claims.toml")
    assert claims.default_file() == Path("/elsewhere/claims.toml")
