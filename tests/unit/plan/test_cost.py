from __future__ import annotations

import pytest

from multicard.plan import cost, params


def settings(**overrides: object) -> dict:
    return params.resolve("vision", overrides)  # type: ignore[arg-type]


def test_cost_grows_with_pixels_and_epochs_and_is_capped_by_max_steps() -> None:
    base = cost.vision_trial_seconds(settings())
    assert cost.vision_trial_seconds(settings(image_size=448)) > 3 * (base - cost.LAUNCH_S["cuda"])
    assert cost.vision_trial_seconds(settings(epochs=40)) > base
    assert cost.vision_trial_seconds(settings(max_steps=10)) < base


def test_cost_of_one_step_by_hand() -> None:
    s = settings(device="cpu", precision="fp32", image_size=224, batch_size=6, epochs=1,
                 max_steps=1, warmup_steps=0, test_subset=3)
    step = cost.STEP_OVERHEAD_S["cpu"] + 6 / 6.0  # 6 images at 6 img/s
    expected = cost.LAUNCH_S["cpu"] + step + cost.EPOCH_PAUSE_S["cpu"] + 3 / (3 * 6.0)
    assert cost.vision_trial_seconds(s) == pytest.approx(expected)


def test_more_gpus_shorten_a_gpu_epoch() -> None:
    assert cost.vision_trial_seconds(settings(gpus=4)) < cost.vision_trial_seconds(settings(gpus=1))
