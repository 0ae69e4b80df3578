from __future__ import annotations

import pytest

from multicard.plan import params
from multicard.plan.precision import PRECISIONS


def test_vision_precisions_are_the_policies() -> None:
    assert params.VISION["precision"].choices == tuple(PRECISIONS)
    assert set(PRECISIONS) == {"fp64", "fp32", "tf32", "fp16", "bf16"}


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [("epochs", 3, 3), ("epochs", 0, None), ("epochs", True, None), ("epochs", 2.0, None),
     ("lr", 1, 1.0), ("lr", -0.1, None), ("pin_memory", True, True), ("pin_memory", 1, None),
     ("device", "cpu", "cpu"), ("device", "tpu", None), ("image_size", 2048, None)],
)
def test_check_value(name: str, value: object, expected: object) -> None:
    assert params.check_value(params.VISION[name], value) == expected


def test_flags_round_trip_through_the_parser() -> None:
    values = params.resolve("vision", {"pin_memory": True, "lr": 0.5, "precision": "bf16"})
    flags = params.to_flags(values)
    assert flags[:2] == ["--device", "cuda"]
    assert "--pin-memory" in flags and flags[flags.index("--pin-memory") + 1] == "true"
    parsed = {name: params.parse_flag_value(params.VISION[name], flags[2 * i + 1])
              for i, name in enumerate(values)}
    assert parsed == values


def test_flag_parser_rejects_bad_text() -> None:
    with pytest.raises(ValueError, match="true or false"):
        params.parse_flag_value(params.VISION["pin_memory"], "yes")
    with pytest.raises(ValueError, match=">= 1"):
        params.parse_flag_value(params.VISION["gpus"], "0")
