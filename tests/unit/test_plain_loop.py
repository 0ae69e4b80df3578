"""benchmarks/plain_loop.py's parts on CPU: the steps a window asks for, spread over epochs as the
harness's loader would take them, timm's model as a second opinion that cannot sink the rest, and
the model wrapped as a one-rank harness trial wraps it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT, load_script

plain_loop = load_script(ROOT / "benchmarks" / "plain_loop.py", "plain_loop")


def settings(tmp_path: Path, *flags: str) -> argparse.Namespace:
    _, found = plain_loop.parse(["--out", str(tmp_path / "loop.json"), "--", "--device", "cpu",
                                 "--image-size", "32", "--batch-size", "16", "--train-subset", "64",
                                 "--warmup-steps", "1", "--epochs", "2", "--data-dir",
                                 str(ROOT / "data"), *flags])
    return found


def test_a_window_longer_than_two_epochs_takes_more_epochs_not_more_steps_per_epoch(
        tmp_path: Path) -> None:
    found = settings(tmp_path)
    # 64 images at 16: 4 full batches an epoch; 30 s of steps are far more than 8
    epochs, steps = plain_loop.steps_for(30.0, 2, found, torch.device("cpu"))
    assert steps <= 4 and epochs > 2 and epochs * steps >= 8


def test_timm_failing_is_said_and_the_other_loops_still_count(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(name: str, *args: object) -> dict[str, object]:
        raise RuntimeError("no kernel image is available")

    monkeypatch.setattr(plain_loop, "run_loop", broken)
    found = plain_loop.run_timed("timm", settings(tmp_path), torch.device("cpu"))
    assert found["images_s"] is None and found["loop_s"] >= 0
    assert found["why"] == "timm failed: RuntimeError: no kernel image is available"
    with pytest.raises(RuntimeError):  # the reference itself failing fails the process
        plain_loop.run_timed("ddp", settings(tmp_path), torch.device("cpu"))


def test_the_ddp_loop_wraps_the_model_as_a_one_rank_harness_trial_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, int, int | None]] = []

    def wrap(model: torch.nn.Module, single_rank: str, world: int, device_id: int | None) -> torch.nn.Module:
        seen.append((single_rank, world, device_id))
        return model  # no process group here: the wrapping asked for is what is tested

    monkeypatch.setattr(plain_loop.vision, "wrap", wrap)
    found = plain_loop.run_loop("ddp", settings(tmp_path, "--single-rank-ddp", "default", "--epochs", "1",
                                                "--max-steps", "1"), torch.device("cpu"))
    assert seen == [("default", 1, None)] and found["steps"] == 1
    plain_loop.run_loop("bare", settings(tmp_path, "--epochs", "1", "--max-steps", "1"), torch.device("cpu"))
    assert len(seen) == 1  # the bare loop is never wrapped
