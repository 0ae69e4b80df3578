"""Traced trials on CPU: extra, untimed, one gzipped Kineto trace per rank, parsed into the record."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from multicard.errors import InputError
from multicard.plan import spec
from multicard.profiling import nsys
from multicard.publish import document
from multicard.run import runner, store
from tests.helpers import DATA, ROOT, TINY_FIXED, write_spec

pytestmark = pytest.mark.slow


@pytest.mark.long
def test_torch_traced_trials_are_extra_and_parsed(tmp_path: Path) -> None:
    path = write_spec(tmp_path, grid={"gpus": [2]}, trials={"count": 1, "trace": "torch",
                                                            "timeout_s": 300})
    outcome = runner.run(spec.load(path), tmp_path / "run", data_dir=DATA, echo=lambda _: None)
    assert outcome.ok == 4  # one timing trial and [trials].trace_count = 3 traced ones
    timing, *all_traced = sorted(store.read(tmp_path / "run" / "trials.jsonl"),
                                 key=lambda r: (r["trace"] != "none", r["trial"]))
    assert timing["trace"] == "none" and [r["trace"] for r in all_traced] == ["torch"] * 3
    assert [r["trial"] for r in all_traced] == [0, 1, 2]
    assert timing["trace_metrics"] == {}
    traced = all_traced[0]
    names = sorted(traced["trace_metrics"])
    assert [n.rsplit("/", 1)[1] for n in names] == ["trace-rank0.json.gz", "trace-rank1.json.gz"]
    assert all(s["format"] == "kineto-json" for s in traced["trace_metrics"].values())
    assert all((tmp_path / "run" / n).exists() for n in names)
    # 2 epochs x 3 steps: the 6-step window holds both epochs (JSON keys are strings)
    assert all(set(s["epoch_pauses_ns"]) == {"0", "1"} for s in traced["trace_metrics"].values())
    document.write_report([tmp_path / "run"], tmp_path / "run")
    nsight = (tmp_path / "run" / "tables" / "tiny_nsight.md").read_text()
    # what tracing cost: the 3 traced trials' time over the timing trial's, a ratio per config
    assert "traced / untraced" in nsight and re.search(r"\| +\d+(\.\d+)?x +\|", nsight)
    pauses = (tmp_path / "run" / "tables" / "tiny_pauses.md").read_text()
    assert "epoch 0 (ms)" in pauses and "epoch 1 (ms)" in pauses
    main = (tmp_path / "run" / "tables" / "tiny.md").read_text().splitlines()
    assert main[2].split("|")[2].strip() == "1"  # n counts the timing trial only


def test_nsys_without_nsys_is_refused_or_falls_back(tmp_path: Path) -> None:
    if nsys.find_nsys():
        pytest.skip("nsys is installed here")
    path = write_spec(tmp_path, trials={"count": 1, "trace": "nsys"})
    with pytest.raises(InputError, match="nsys is not on PATH"):
        runner.run(spec.load(path), tmp_path / "a", echo=lambda _: None)
    fallback = write_spec(tmp_path, name="fb", grid={"precision": ["fp32"]},
                          trials={"count": 1, "trace": "nsys", "trace_fallback": True,
                                  "trace_count": 1})
    messages: list[str] = []
    runner.run(spec.load(fallback), tmp_path / "b", data_dir=DATA, echo=messages.append)
    assert any("tracing with the PyTorch profiler instead" in m for m in messages)
    assert {r["trace"] for r in store.read(tmp_path / "b" / "trials.jsonl")} == {"none", "torch"}


@pytest.mark.long
def test_a_rank_under_a_wrapper_outlives_the_thread_that_forked_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in `nsys` on PATH forks the rank from a helper thread that exits mid-training, as
    # Nsight Systems may; a parent-death signal armed against that thread would kill the rank.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    standin = bin_dir / "nsys"
    source = (ROOT / "tests" / "fixtures" / "wrappers" / "standin_nsys.py").read_text()
    standin.write_text(f"#!{sys.executable}\n{source}")
    standin.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    fixed = {**TINY_FIXED, "epochs": 4, "max_steps": 30}  # training outlasts the helper thread
    path = write_spec(tmp_path, fixed=fixed, grid={"gpus": [1], "precision": ["fp32"]},
                      trials={"count": 1, "trace": "nsys", "trace_count": 1, "timeout_s": 300})
    runner.run(spec.load(path), tmp_path / "run", data_dir=DATA, echo=lambda _: None)
    records = {r["trace"]: r for r in store.read(tmp_path / "run" / "trials.jsonl")}
    traced = records["nsys"]
    assert traced["status"] == "ok", traced["error"]
    argv = json.loads((tmp_path / "run" / traced["artifacts"][0].rsplit("/", 1)[0] /
                       "launch.json").read_text())["argv"]
    assert str(standin) in argv  # the rank really ran under the wrapper
    result = json.loads((tmp_path / "run" / f"raw/{traced['config_id']}-t0-nsys-a0/result.json")
                        .read_text())
    assert result["ranks"][0]["parent_death"] == "agent watcher"
    assert records["none"]["status"] == "ok"
