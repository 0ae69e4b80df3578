"""Tracers in the rank: a real PyTorch-profiler trace recorded here on the CPU, then parsed."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from multicard.profiling import parse
from multicard.profiling.capture import TRACERS, TraceConfig


def run_loop(tracer, steps: int, epochs: int, pause_s: float) -> None:  # type: ignore[no-untyped-def]
    weights = torch.randn(64, 64)
    tracer.start()
    for epoch in range(epochs):
        with tracer.range(f"epoch_start {epoch}"):
            pass
        if epoch:
            time.sleep(pause_s)  # what a DataLoader restarting its workers looks like
        for _ in range(steps):
            with tracer.range("data_wait"):
                x = torch.randn(32, 64)
            with tracer.range("step"), tracer.range("forward"):
                (x @ weights).sum()
            tracer.step()
    tracer.stop()


def test_torch_tracer_records_the_first_epoch_boundary_and_its_pause(tmp_path: Path) -> None:
    tracer = TRACERS["torch"](TraceConfig(tmp_path, rank=3, steps_per_epoch=5, epochs=3, cuda=False))
    run_loop(tracer, steps=5, epochs=3, pause_s=0.05)
    trace = tmp_path / "trace-rank3.json.gz"
    assert trace.read_bytes()[:2] == b"\x1f\x8b"
    summary = parse.summarize(trace)
    assert summary["format"] == "kineto-json"
    # 6 active steps straddle the boundary into epoch 1; epoch 2 is outside the window
    assert set(summary["epoch_pauses_ns"]) == {1}
    assert 50e6 <= summary["epoch_pauses_ns"][1] < 1e9
    assert summary["kernel_count"] == 0 and summary["memcpy_htod_count"] == 0  # a CPU trace


def test_one_epoch_runs_trace_the_start_of_training(tmp_path: Path) -> None:
    tracer = TRACERS["torch"](TraceConfig(tmp_path, rank=0, steps_per_epoch=8, epochs=1, cuda=False))
    run_loop(tracer, steps=8, epochs=1, pause_s=0)
    assert set(parse.summarize(tmp_path / "trace-rank0.json.gz")["epoch_pauses_ns"]) == {0}


def test_the_null_tracer_records_nothing(tmp_path: Path) -> None:
    tracer = TRACERS["none"](TraceConfig(tmp_path, rank=0, steps_per_epoch=2, epochs=2, cuda=False))
    assert tracer.range("a") is tracer.range("b")  # one shared null context, no per-step cost
    run_loop(tracer, steps=2, epochs=2, pause_s=0)
    assert list(tmp_path.iterdir()) == []
