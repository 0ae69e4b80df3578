from __future__ import annotations

import pytest
import torch

from multicard.plan import precision


@pytest.fixture(autouse=True)
def restore_tf32_flags():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.parametrize("name", ["fp64", "fp32", "fp16", "bf16"])
def test_non_tf32_policies_turn_tf32_off_explicitly(name: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = True  # what an NGC image starts with
    torch.backends.cudnn.allow_tf32 = True
    flags = precision.apply_tf32(precision.PRECISIONS[name])
    assert flags == {"cuda_matmul_allow_tf32": False, "cudnn_allow_tf32": False}
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert torch.backends.cudnn.allow_tf32 is False


def test_tf32_policy_turns_both_switches_on() -> None:
    flags = precision.apply_tf32(precision.PRECISIONS["tf32"])
    assert flags == {"cuda_matmul_allow_tf32": True, "cudnn_allow_tf32": True}


def test_policies_dtypes() -> None:
    p = precision.PRECISIONS
    assert precision.torch_dtype(p["fp64"].param_dtype) is torch.float64
    assert p["fp64"].autocast_dtype is None and not p["fp64"].grad_scaler
    assert precision.torch_dtype(p["fp16"].autocast_dtype) is torch.float16 and p["fp16"].grad_scaler
    assert precision.torch_dtype(p["bf16"].autocast_dtype) is torch.bfloat16 and not p["bf16"].grad_scaler
    assert all(precision.torch_dtype(p[n].param_dtype) is torch.float32
               for n in ("fp32", "tf32", "fp16", "bf16"))
