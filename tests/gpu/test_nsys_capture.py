"""Nsight Systems around every rank of a real GPU trial (skipped where nsys is not installed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from multicard.plan import spec
from multicard.profiling import nsys
from multicard.run import runner, store
from tests.helpers import DATA, write_spec

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(nsys.find_nsys() is None, reason="nsys is not installed")]


def test_nsys_trace_per_rank_with_the_papers_metrics(tmp_path: Path) -> None:
    fixed = {"device": "cuda", "image_size": 64, "epochs": 2, "max_steps": 10, "batch_size": 32,
             "num_workers": 2, "pin_memory": True, "train_subset": 2048, "test_subset": 256}
    path = write_spec(tmp_path, fixed=fixed, grid={"precision": ["fp32"]},
                      trials={"count": 1, "trace": "nsys", "trace_count": 1, "timeout_s": 900})
    outcome = runner.run(spec.load(path), tmp_path / "run", data_dir=DATA, echo=lambda _: None)
    assert outcome.ok == 2  # the timing trial and the traced one
    traced = [r for r in store.read(tmp_path / "run" / "trials.jsonl") if r["trace"] == "nsys"]
    [(name, summary)] = traced[0]["trace_metrics"].items()
    assert name.endswith("rank0.sqlite.gz")
    assert (tmp_path / "run" / name).with_name("rank0.nsys-rep").exists()
    assert summary["kernel_count"] > 0 and summary["cuda_launch_kernel_count"] > 0
    assert summary["memcpy_htod_pinned_count"] > 0
    assert set(summary["epoch_pauses_ns"]) == {"0", "1"}  # JSON keys
    # the GPU timeline of the one rank on its one device, its parts adding up to the span; the
    # runtime API records every launch, so host wait and idle are told apart
    [timeline] = summary["gpu_timelines"]
    assert summary["gpu_busy_ns"] > 0 and summary["gpu_launch_matched"] > 0.5
    parts = ("gpu_busy_ns", "gpu_copy_ns", "gpu_host_wait_ns", "gpu_idle_ns")
    assert sum(summary[p] for p in parts) == summary["gpu_span_ns"] == timeline["gpu_span_ns"]
    # the fewest trace domains the breakdown reads, and what tracing cost in this config
    from multicard.judge import summarize
    from multicard.publish import document

    assert "--trace=cuda,nvtx" in nsys.NSYS_PROFILE
    loaded = spec.load(tmp_path / "run" / "spec.toml")
    [cost] = summarize.tracing_cost(loaded, store.read(tmp_path / "run" / "trials.jsonl")).values()
    assert cost > 0.5  # traced / untraced time: said per config in the Nsight table
    document.write_report([tmp_path / "run"], tmp_path / "run")
    assert "traced / untraced" in (tmp_path / "run" / "tables" / "tiny_nsight.md").read_text()
