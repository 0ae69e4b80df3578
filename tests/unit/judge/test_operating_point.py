from __future__ import annotations

from multicard.judge import operating_point as op


def test_the_label_turns_at_the_threshold() -> None:
    assert op.label(op.GPU_BOUND_AT) == "GPU-bound"
    assert op.label(0.95) == "GPU-bound"
    assert op.label(op.GPU_BOUND_AT - 0.01) == "host-bound"
    assert op.label(0.15) == "host-bound"
    assert op.label(None) is None


def test_a_trials_bound_says_its_share_or_why_there_is_none() -> None:
    found = op.trial_bound("vision", {"gpu_busy_fraction": 0.42}, {})
    assert found == {"label": "host-bound", "gpu_busy_fraction": 0.42, "threshold": 0.8, "reason": None}
    cpu = op.trial_bound("vision", {"gpu_busy_fraction": None},
                         {"gpu_busy_fraction": "CPU run: there are no GPU kernels"})
    assert cpu["label"] is None and cpu["reason"] == "CPU run: there are no GPU kernels"
    assert op.trial_bound("llm", {"step_time_median_s": 1.0}, {})["reason"].startswith("LLM trials")


def test_a_configs_label_is_its_ok_trials_and_mixed_where_they_differ() -> None:
    def record(label: str | None, status: str = "ok") -> dict:
        return {"status": status, "bound": {"label": label}}

    assert op.config_label([record("GPU-bound"), record("GPU-bound")]) == "GPU-bound"
    assert op.config_label([record("GPU-bound"), record("host-bound")]) == "mixed"
    assert op.config_label([record("GPU-bound"), record("host-bound", "failed")]) == "GPU-bound"
    assert op.config_label([record(None), {"status": "ok", "bound": None}]) is None
