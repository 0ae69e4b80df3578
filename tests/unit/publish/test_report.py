from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from multicard.errors import InputError
from multicard.plan import spec
from multicard.publish import document, runs
from multicard.run import store
from tests.helpers import EXPERIMENTS, gpu_run

# train_time_s per (precision, gpus) -> two trials; fp64 is the baseline
TIMES = {("fp64", 1): [10.0, 12.0], ("fp32", 1): [5.0, 6.0], ("fp16", 2): [4.0, 4.0]}


def constructed_run(directory: Path) -> Path:
    """A run directory with hand-made records: no training, known numbers."""
    s = spec.load(EXPERIMENTS / "table2_precision.toml", "smoke")
    directory.mkdir(parents=True)
    (directory / "spec.toml").write_text(spec.to_toml(s))
    (directory / "env.json").write_text(json.dumps({"host": "h", "cpu": {"model": "cpu"}}))
    ids = {tuple(c.values()): cid for cid, c, _ in spec.configs(s)}
    for (prec, gpus), times in TIMES.items():
        for trial, t in enumerate(times):
            store.append(directory / "trials.jsonl", {
                "schema": 1, "experiment": s.name, "config_id": ids[(prec, gpus)],
                "config": {"precision": prec, "gpus": gpus}, "trial": trial, "status": "ok",
                "started": "2026-01-01T00:00:00+00:00", "wall_s": t + 5,
                "metrics": {"train_time_s": t, "test_accuracy": 0.5, "epoch_time_s": [t]},
                "error": None, "artifacts": []})
    store.append(directory / "trials.jsonl", {
        "schema": 1, "experiment": s.name, "config_id": ids[("bf16", 2)],
        "config": {"precision": "bf16", "gpus": 2}, "trial": 0, "status": "oom",
        "started": "2026-01-01T00:00:00+00:00", "wall_s": 3.0, "metrics": {},
        "error": {"type": "OutOfMemoryError", "message": "CUDA out of memory", "stderr_tail": ""},
        "artifacts": []})
    return directory


@pytest.fixture
def reported(tmp_path: Path) -> Path:
    run = constructed_run(tmp_path / "run")
    document.write_report([run], run)
    return run


def rows(markdown: str) -> dict[tuple[str, str], list[str]]:
    lines = [line for line in markdown.splitlines() if line.startswith("|")][2:]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return {(c[0], c[1]): c for c in cells}


def test_markdown_table_shows_n_mean_sd_ci_and_speedups(reported: Path) -> None:
    md = (reported / "tables" / "table2_precision.md").read_text()
    header = md.splitlines()[0]
    assert "train time (s) mean ± sd [95% CI]" in header
    assert "speedup vs precision=fp64 (x) [95% CI]" in header and "gain (%)" in header
    table = rows(md)
    fp64, fp32 = table[("fp64", "1")], table[("fp32", "1")]
    assert fp64[2] == "2"
    # mean 11, sd sqrt(2) = 1.414, t(0.975,1) * sd / sqrt(2) = 12.71
    assert fp64[3] == "11 ± 1.414 [3.435, 35.51]"
    assert "baseline" in fp64
    # 11 / 5.5 = 2; Welch on log times, df 2: exp(ln 2 -+ 4.3027 * 0.12892) = [1.148, 3.483];
    # reduction 1 - 1/x, gain x - 1 map the interval end to end
    assert "2 [1.15, 3.48]" in fp32
    assert "50.00 [12.93, 71.29]" in fp32
    assert "100.00 [14.85, 248.28]" in fp32
    assert "gain 54–68 %" in fp32


def test_failures_and_paper_values_are_shown(reported: Path) -> None:
    table = rows((reported / "tables" / "table2_precision.md").read_text())
    assert table[("bf16", "2")][-2] == "1 (oom)"  # the "failed (cause)" column
    assert table[("bf16", "2")][-1] == "–"  # "warnings": none for a config without trials
    assert table[("bf16", "2")][2] == "0"
    assert "test acc. (%) 97.94" in " ".join(table[("fp16", "2")])
    text = (reported / "REPORT.md").read_text()
    assert "**oom** OutOfMemoryError: CUDA out of memory" in text
    assert "6 of 10 planned trials ok, 1 failed attempt(s)" in text


def test_csv_keeps_raw_numbers_and_tex_is_a_booktabs_table(reported: Path) -> None:
    import pandas as pd

    table = pd.read_csv(reported / "tables" / "table2_precision.csv")
    fp32 = table[(table.precision == "fp32") & (table.gpus == 1)].iloc[0]
    assert fp32["train_time_s.mean"] == 5.5 and fp32["train_time_s.n"] == 2
    assert fp32["speedup"] == pytest.approx(2.0)
    trials = pd.read_csv(reported / "tables" / "table2_precision_trials.csv")
    assert sorted(trials["train_time_s"]) == sorted(t for ts in TIMES.values() for t in ts)
    tex = (reported / "tables" / "table2_precision.tex").read_text()
    assert "\\toprule" in tex and "\\bottomrule" in tex


def test_report_writes_figure_and_checksums_that_verify(reported: Path) -> None:
    from multicard import integrity

    assert (reported / "figures" / "table2_precision.png").read_bytes()[:4] == b"\x89PNG"
    assert integrity.verify(reported).ok


def test_a_collection_of_runs_is_reported_at_its_top(tmp_path: Path) -> None:
    constructed_run(tmp_path / "all" / "one")
    constructed_run(tmp_path / "all" / "two")
    document.write_report([tmp_path / "all"], tmp_path / "all")
    tables = sorted(p.name for p in (tmp_path / "all" / "tables").glob("*.md"))
    assert tables == ["table2_precision-2.md", "table2_precision.md"]
    assert not (tmp_path / "all" / "one" / "tables").exists()


def test_directory_without_runs_is_bad_input(tmp_path: Path) -> None:
    from multicard.errors import InputError

    with pytest.raises(InputError, match="no run directory"):
        runs.discover_runs(tmp_path)


def test_facets_breakdown_and_binary_paper_outcomes(tmp_path: Path) -> None:
    s = spec.load(EXPERIMENTS / "figure6_loaders.toml")
    run = tmp_path / "run"
    run.mkdir()
    (run / "spec.toml").write_text(spec.to_toml(s))
    for cid, config, _ in spec.configs(s):
        if config["gpus"] != 2:
            continue
        fails = config == {"loader": "torch", "image_size": 500, "gpus": 2}
        store.append(run / "trials.jsonl", {
            "schema": 1, "experiment": s.name, "config_id": cid, "config": config, "trial": 0,
            "status": "oom" if fails else "ok", "started": "2026-01-01T00:00:00+00:00",
            "wall_s": 1.0, "metrics": {} if fails else {"train_time_s": 10.0, "data_wait_fraction": 0.25,
                                             "h2d_wait_fraction": 0.1},
            "error": {"type": "OutOfMemoryError", "message": "x", "stderr_tail": ""} if fails else None,
            "artifacts": []})
    document.write_report([run], run)
    assert (run / "figures" / "figure6_loaders.png").exists()
    assert (run / "figures" / "figure6_loaders_breakdown.png").exists()
    lines = [ln for ln in (run / "tables" / "figure6_loaders.md").read_text().splitlines()][2:]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    row = next(c for c in cells if c[:3] == ["torch", "500", "2"])
    assert row[-3] == "fails to run" and row[-2] == "1 (oom)"
    import pandas as pd

    csv = pd.read_csv(run / "tables" / "figure6_loaders.csv")
    dali = csv[(csv.loader == "dali") & (csv.image_size == 300) & (csv.gpus == 2)].iloc[0]
    assert dali["breakdown.data_wait_s"] == pytest.approx(2.5)
    assert dali["breakdown.h2d_wait_s"] == pytest.approx(1.0)  # blocked in the copy: not data wait
    assert dali["breakdown.compute_s"] == pytest.approx(6.5)
    header = (run / "tables" / "figure6_loaders.md").read_text().splitlines()[0]
    assert "data wait, loader next() (%)" in header and "copy wait, host in H2D copy (%)" in header


def test_two_gpu_runs_merge_into_one_report_whose_claims_read_both(tmp_path: Path) -> None:
    from multicard import integrity
    from multicard.judge import claims

    table2 = gpu_run(tmp_path / "t2", "table2_precision",
                     {("fp64", 2): [16.0, 16.1, 15.9, 16.05, 15.95],
                      ("fp32", 2): [10.0, 10.05, 9.95, 10.02, 9.98]}, "train_time_s")
    table5 = gpu_run(tmp_path / "t5", "table5_llm_pin_memory",
                     {(False, 1): [1.0, 1.01, 0.99, 1.005, 0.995],
                      (True, 1): [1.001, 1.0, 0.999, 1.002, 0.998]}, "step_time_median_s")
    out = tmp_path / "merged"
    document.write_report([table2, table5], out, claims.load(EXPERIMENTS / "claims.toml"))
    text = (out / "REPORT.md").read_text()
    assert "## Table 2" in text and "## Table 5" in text
    verdicts = {row[0]: row[3] for row in rows((out / "tables" / "claims.md").read_text()).values()}
    assert verdicts["C1"] == "**supported**"   # from the Table 2 run
    assert verdicts["C14"] == "**supported**"  # from the Table 5 run
    assert verdicts["C15"] == "**not run**"
    assert ("19 claims: 2 supported, 0 contradicted, 0 consistent (imprecise), 0 mixed, "
            "0 inconclusive, 0 invalid, 17 not run") in text
    holm = {row[0]: row[4] for row in rows((out / "tables" / "claims.md").read_text()).values()}
    assert holm["C1"] == holm["C14"] == "supported"  # clear enough for a family of two
    assert ("Of 2 judgements, each raw verdict is wrong at most 2.5 % of the time (the truth at its "
            "band's end), so at least one of them is wrong up to 5% of the time") in text
    assert "0 verdict(s) do not stand there (inconclusive (Holm))" in text
    # power where the paper is right, drawn at the runs' own noise (CV 0.4 % here) and n
    header = (out / "tables" / "claims.md").read_text().splitlines()[0]
    column = [c.strip() for c in header.strip("|").split("|")].index("power if the paper is right")
    power = {row[0]: row[column] for row in rows((out / "tables" / "claims.md").read_text()).values()}
    assert power["C1"] == power["C14"] == "1.00 (n=5)" and power["C15"] == "–"
    assert "this report's measured trial-to-trial variation, CV 0.4% (the median over 4" in text
    # compute spent: 10 + 10 trials of 1 h; table 2 at 2 GPUs, table 5 at 1
    assert "20.000 GPU-hours" in text and "10.000 GPU-hours" in text
    assert integrity.verify(out).ok
    assert not (table2 / "REPORT.md").exists()  # the runs themselves stay untouched


def test_failures_are_summarised_by_cause(reported: Path) -> None:
    text = (reported / "REPORT.md").read_text()
    section = text.split("## Failures and skips")[1].split("##")[0]
    assert "| oom " in section and "CUDA out of memory" in section
    # walls (time + 5 s): fp64 15+17 and fp32 10+11 at 1 rank, fp16 9+9 and the 3 s oom at 2
    assert "0.026 rank-hours (CPU)" in text


def test_evidence_text_shows_ratios_percentages_statuses_and_how_many_more() -> None:
    from multicard.judge.claims import Evidence

    evidence = (Evidence("gpus=1", 60.04, 58.81, 61.2, "%", n=(5, 5)),
                Evidence("gpus=2", 1.234, 1.1, 1.4, n=(5, 4)),
                Evidence("{'loader': 'torch'}", statuses=("oom",), n=(3, 0)), Evidence("gpus=4", 2.0))
    assert document.evidence_text(evidence, shown=3) == (
        "gpus=1: 60% [58.8, 61.2] (n 5/5); gpus=2: 1.23x [1.1, 1.4] (n 5/4); "
        "{'loader': 'torch'}: oom (3 attempts) (+1 more)")
    assert document.evidence_text(()) == "–"


def test_runs_on_one_machine_show_its_environment_and_topology_once(tmp_path: Path) -> None:
    env = {"host": "node1", "cpu": {"model": "EPYC 9334", "logical_cpus": 128},
           "topology": {"nodes": [{"node": 0, "cpus": [0, 1], "memory_mb": 1000}], "gpus": [],
                        "links": {}}, "gpus": [], "torch": {"version": "2.6"}, "git": {"sha": "abc"}}
    first = gpu_run(tmp_path / "a", "table2_precision", {("fp64", 1): [16.0, 16.1, 15.9]},
                    "train_time_s")
    second = gpu_run(tmp_path / "b", "table5_llm_pin_memory", {(False, 1): [1.0, 1.01, 0.99]},
                     "step_time_median_s")
    for run in (first, second):
        (run / "env.json").write_text(json.dumps(env))
    document.write_report([first, second], tmp_path / "out")
    text = (tmp_path / "out" / "REPORT.md").read_text()
    section = text.split("## Environment")[1].split("## Claims")[0]
    [row] = [line for line in section.splitlines() if "| node1 " in line]
    assert row.rstrip(" |").endswith("2")  # one row for the machine, with both runs
    assert f"- machine 1: `{first}`, `{second}`" in section
    assert section.count("Topology of") == 1


def test_unstable_configs_are_warned_in_the_table_the_report_and_the_console(tmp_path: Path) -> None:
    run = gpu_run(tmp_path / "run", "table2_precision",
                  {("fp64", 1): [20.0, 16.0, 16.1, 15.9, 16.05],  # the first trial is slow
                   ("fp32", 1): [10.0, 13.0, 8.5, 10.0, 11.5]},   # wide and with a slow trial
                  "train_time_s")
    printed: list[str] = []
    document.write_report([run], run, echo=printed.append)
    table = rows((run / "tables" / "table2_precision.md").read_text())
    assert table[("fp64", "1")][-1].startswith("slowest trial 1.25x") is False  # 20/16.05 = 1.246
    assert "first trial 25% slower than the rest" in table[("fp64", "1")][-1]
    assert "unstable: IQR/median 15% > 10 %" in table[("fp32", "1")][-1]
    assert "slowest trial 1.30x the median" in table[("fp32", "1")][-1]
    text = (run / "REPORT.md").read_text()
    assert "Warnings (train time (s)):" in text and "- precision=fp32 gpus=1: unstable" in text
    assert any(p.startswith("warning: table2_precision: precision=fp64 gpus=1: first trial") for p in printed)


def test_the_energy_questions_are_answered_apart_from_the_paper_claims(tmp_path: Path) -> None:
    from multicard.judge import claims

    run = constructed_run(tmp_path / "run")  # CPU-like records: no energy measured
    questions = claims.load(EXPERIMENTS / claims.QUESTIONS_FILE)
    document.write_report([run], run, claims.load(EXPERIMENTS / "claims.toml"), questions=questions)
    text = (run / "REPORT.md").read_text()
    energy = text[text.index("## Energy"):]
    assert text.index("## Claims of the paper") < text.index("## Energy")
    assert "Questions of this artifact, not claims of the paper" in energy
    rows = (run / "tables" / "energy_questions.csv").read_text().splitlines()
    assert rows[0].startswith("question,question asked,paper,verdict")
    e1 = next(line for line in rows if line.startswith("E1,"))
    assert "not measured in the paper" in e1 and ",supported," not in e1  # no energy: no verdict
    assert [line.split(",")[0] for line in rows[1:]] == ["E1", "E2", "E3", "E4"]


def test_a_metric_the_trials_could_not_measure_reads_not_measured(reported: Path) -> None:
    table = (reported / "tables" / "table2_precision.md").read_text()
    energy_column = next(line for line in table.splitlines() if line.startswith("| fp64")).split("|")
    header = next(line for line in table.splitlines() if "energy per image" in line).split("|")
    column = next(i for i, h in enumerate(header) if "energy per image" in h)
    assert energy_column[column].strip() == "not measured"  # ok trials, no energy: never 0
    # no config has energy: no half-empty figure, a sentence instead
    assert not (reported / "figures" / "table2_precision_energy.png").exists()
    assert "No time-and-energy figure: no config has GPU energy per image" in (
        reported / "REPORT.md").read_text()


def test_a_trial_with_a_stray_context_is_warned_in_the_report_and_the_console(tmp_path: Path) -> None:
    run = constructed_run(tmp_path / "run")
    [first, *rest] = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]
    first["metrics"]["stray_contexts"] = 1
    first["artifacts"] = [f"raw/{first['config_id']}-t0-a0/result.json"]
    (run / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [first, *rest]))
    printed: list[str] = []
    document.write_report([run], run, echo=printed.append)
    text = (run / "REPORT.md").read_text()
    assert "**Warning: stray CUDA contexts.**" in text
    assert (f"- precision=fp64 gpus=1 trial 0: 1 (process, GPU) pair(s) "
            f"(`raw/{first['config_id']}-t0-a0/result.json, ranks[].stray_contexts`)") in text
    assert any("stray CUDA context: precision=fp64 gpus=1 trial 0" in p for p in printed)
    clean = constructed_run(tmp_path / "clean")
    document.write_report([clean], clean)
    assert "stray CUDA contexts.**" not in (clean / "REPORT.md").read_text()


def test_an_llm_experiment_gets_its_time_and_energy_per_token_figure(tmp_path: Path) -> None:
    run = gpu_run(tmp_path / "run", "table5_llm_pin_memory",
                  {(True, 1): [1.0, 1.1, 1.0], (False, 1): [1.2, 1.3, 1.2]}, "step_time_median_s",
                  {"energy_per_token_j": 0.02})
    document.write_report([run], run)
    assert (run / "figures" / "table5_llm_pin_memory_energy.png").stat().st_size > 1000
    assert "![time and GPU energy per token](figures/table5_llm_pin_memory_energy.png)" in (
        run / "REPORT.md").read_text()


def test_a_collections_budget_plan_is_said_and_a_broken_one_is_named(tmp_path: Path) -> None:
    from multicard.publish import document

    planned, broken, plain = tmp_path / "planned", tmp_path / "broken", tmp_path / "plain"
    for d in (planned, broken, plain):
        d.mkdir()
    (planned / "budget.json").write_text(json.dumps({"duration": "24h", "experiments": {
        "figure6_loaders@loader_only": {"trials": 3, "epochs": None, "configs": [],
                                        "given_up": ["16 of 16 configs that no claim reads dropped"]},
        "table2_precision@paper": {"trials": 5, "epochs": None, "configs": None, "given_up": []}}}))
    (broken / "budget.json").write_text("[1, 2]")
    section = document._budget_section([planned, broken, plain])
    assert "`planned` was planned to fit `--budget 24h`" in section
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in section.splitlines() if line.startswith("| ") and "@" in line}
    assert rows == {"figure6_loaders@loader_only": ["3", "none: not run", "unchanged",
                                                    "16 of 16 configs that no claim reads dropped"],
                    "table2_precision@paper": ["5", "all", "unchanged", "nothing"]}
    assert "`broken/budget.json` is not a budget plan" in section
    assert document._budget_section([plain]) == ""


def test_a_skipped_config_is_not_counted_as_a_failed_attempt() -> None:
    import pandas as pd

    from multicard.publish import document

    failed = pd.DataFrame({"status": ["skipped", "skipped", "failed", "timeout"]})
    assert document._not_ok_text(failed) == ("2 failed attempt(s), 2 skipped (not runnable here, "
                                             "the reason in each record)")
    assert document._not_ok_text(failed.iloc[:0]) == "0 failed attempt(s)"


def wide_table_lines(text: str, most: int = 160) -> list[str]:
    """Table rows wider than `most` characters outside the collapsed (<details>) sections."""
    wide, folded = [], False
    for line in text.splitlines():
        folded = folded or line.startswith("<details")
        if line.startswith("</details"):
            folded = False
        elif not folded and line.startswith("|") and len(line) > most:
            wide.append(line)
    return wide


def test_the_report_a_reader_meets_has_no_table_wider_than_160_characters(tmp_path: Path) -> None:
    from multicard.judge import claims

    table2 = gpu_run(tmp_path / "t2", "table2_precision",
                     {(p, g): [16.0, 16.1, 15.9, 16.05, 15.95] for p in ("fp64", "fp32", "fp16")
                      for g in (1, 2)}, "train_time_s")
    out = tmp_path / "out"
    document.write_report([table2], out, claims.load(EXPERIMENTS / "claims.toml"),
                        questions=claims.load(EXPERIMENTS / "energy_questions.toml"))
    text = (out / "REPORT.md").read_text()
    assert wide_table_lines(text) == []
    assert max(len(line) for line in (out / "tables" / "table2_precision.md").read_text().splitlines()) > 160
    assert "<summary>every statistic" in text  # ... the wide one is there, folded
    assert wide_table_lines("| " + "x" * 200) != []  # the check can fail


def test_what_tracing_cost_is_the_traced_trials_time_over_the_untraced_ones() -> None:
    from multicard.judge import summarize

    s = spec.load(EXPERIMENTS / "table2_precision.toml", "smoke")
    def record(trace: str, seconds: float) -> dict:
        return {"experiment": s.name, "config_id": "a", "status": "ok", "trace": trace,
                "metrics": {"train_time_s": seconds}}
    cost = summarize.tracing_cost(s, [record("none", 10.0), record("none", 12.0), record("nsys", 13.2)])
    assert cost == {"a": pytest.approx(1.2)}
    assert summarize.tracing_cost(s, [record("nsys", 13.2)]) == {}  # no untraced trial to compare


def test_the_numa_section_says_which_page_cache_its_policies_read() -> None:
    from multicard.publish.document import _page_cache_note

    paper = spec.load(EXPERIMENTS / "numa_binding.toml")
    assert _page_cache_note(paper).startswith("Every trial read a cold page cache")
    controls = spec.load(EXPERIMENTS / "numa_binding.toml", "controls")
    assert "read the policies' placement on the cold arm" in _page_cache_note(controls)


def test_the_parts_of_a_sharded_plan_are_reported_as_one_run(tmp_path: Path) -> None:
    from multicard.publish.runs import load_run, merge_shards

    parts = [constructed_run(tmp_path / f"table2-part{i}of2") for i in range(2)]
    for i, part in enumerate(parts):
        (part / store.SHARD_FILE).write_text(json.dumps({"index": i, "count": 2}))
    # the second part ran other trials of the same configs (a shard holds its own rounds' share)
    later = [json.loads(line) | {"trial": json.loads(line)["trial"] + 2}
             for line in (parts[1] / "trials.jsonl").read_text().splitlines()]
    (parts[1] / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in later))
    out = tmp_path / "merged"
    document.write_report(parts, out)
    text = (out / "REPORT.md").read_text()
    assert f"run in 2 parts (`{parts[0]}`, `{parts[1]}`)" in text
    assert text.count("## Table 2") == 1
    table = rows((out / "tables" / "table2_precision.md").read_text())
    assert table[("fp64", "1")][2] == "4"  # n: both parts' two trials
    # one part alone is not the plan: it stays a part, with its own share of the trials planned
    alone = merge_shards([load_run(parts[0])])
    assert len(alone) == 1 and alone[0].shard is not None and alone[0].parts == (parts[0],)
    whole = merge_shards([load_run(p) for p in parts])
    assert len(whole) == 1 and whole[0].planned == alone[0].planned + load_run(parts[1]).planned


def test_a_configs_energy_needs_3_trials_and_the_report_states_the_gpus_idle_power(tmp_path: Path) -> None:
    import math

    import pandas as pd

    from multicard.judge import stats
    from multicard.measure import gpu_state

    s = spec.load(EXPERIMENTS / "table2_precision.toml")
    run = tmp_path / "run"
    run.mkdir()
    (run / "spec.toml").write_text(spec.to_toml(s))
    idle = {"how": gpu_state.IDLE_HOW, "window_s": 5.0, "reason": None,
            "gpus": [{"index": 0, "uuid": "GPU-a", "watts": 61.25, "window_s": 5.0, "processes": [],
                      "reason": None}]}
    (run / "env.json").write_text(json.dumps({"host": "h", gpu_state.IDLE_KEY: idle}))
    ids = {tuple(c.values()): (cid, c) for cid, c, _ in spec.configs(s)}
    energies = {("fp64", 1): [0.124, 0.126], ("fp32", 1): [0.090, 0.092, 0.091]}
    for key, values in energies.items():
        cid, config = ids[key]
        for trial, joules in enumerate(values):
            store.append(run / "trials.jsonl", {
                "schema": 1, "experiment": s.name, "config_id": cid, "config": config, "trial": trial,
                "status": "ok", "started": "2026-01-01T00:00:00+00:00", "wall_s": 60.0, "error": None,
                "metrics": {"train_time_s": 30.0 + trial, "energy_per_sample_j": joules}, "artifacts": []})
    document.write_report([run], run)
    table = rows((run / "tables" / "table2_precision.md").read_text())
    header = next(line for line in (run / "tables" / "table2_precision.md").read_text().splitlines()
                  if "energy per image" in line).split("|")
    column = next(i for i, h in enumerate(header) if "energy per image" in h) - 1
    assert table[("fp64", "1")][column] == "n < 3 (n = 2)"
    found = stats.summarize([0.090, 0.092, 0.091])  # mJ below: 91 ± 1 [lo, hi]
    assert table[("fp32", "1")][column] == (f"{found.mean * 1e3:.4g} ± {found.std * 1e3:.4g} "
                                             f"[{found.ci_lo * 1e3:.4g}, {found.ci_hi * 1e3:.4g}]")
    csv = pd.read_csv(run / "tables" / "table2_precision.csv").set_index(["precision", "gpus"])
    assert csv.loc[("fp64", 1), "energy_per_sample_j.withheld"] == "n < 3 (n = 2)"
    assert csv.loc[("fp64", 1), "energy_per_sample_j.n"] == 2
    assert math.isnan(csv.loc[("fp64", 1), "energy_per_sample_j.mean"])  # null, never a number from 2
    assert csv.loc[("fp32", 1), "energy_per_sample_j.mean"] == pytest.approx(found.mean)
    text = (run / "REPORT.md").read_text()
    assert "- `.`: GPU 0 61.25 W (5 s)" in text  # beside the GPU settings, in the open
    section = text[text.index("## Table 2"):]
    assert "fewer read \"n < 3\"" in section
    assert "read before the first trial: GPU 0 61.25 W (5 s)." in section



STEP_PROFILE = Path(__file__).resolve().parents[2] / "fixtures" / "step_profile" / "cpu_step_profile.json"


def test_first_evidences_step_profile_is_a_section_of_the_report(tmp_path: Path) -> None:
    assert document._operating_point_section([tmp_path], tmp_path) == ""  # no profile, no section
    (tmp_path / "operating_point").mkdir()
    shutil.copy(STEP_PROFILE, tmp_path / "operating_point" / "step_profile.json")
    section = document._operating_point_section([tmp_path], tmp_path)
    assert section.startswith("## Operating point") and "`GPU-bound` from 80%" in section
    lines = [line for line in section.splitlines() if line.startswith("| fp32")]
    assert len(lines) == 3  # one row per point: default, lean, none
    cells = [c.strip() for c in lines[0].strip("|").split("|")]
    assert cells[:4] == ["fp32", "32", "8", "default"] and cells[9] == "6163"
    assert cells[6] == cells[7] == cells[8] == cells[10] == cells[11] == "–"  # CPU: no kernels, no label
    (tmp_path / "operating_point" / "step_profile.json").write_text("{")
    with pytest.raises(InputError, match="not a step profile"):
        document._operating_point_section([tmp_path], tmp_path)
