"""Numeric precision policies: name -> (parameter dtype, autocast dtype, loss scaler, TF32).

The policies are plain data (dtype names, not torch objects) so that the spec validator can list
them without importing torch. `apply_tf32` and `torch_dtype` are called inside the rank process.

- fp64: model and inputs in double; no autocast.
- fp32: IEEE float32; TF32 off for both cuBLAS matmuls and cuDNN convolutions. NGC images turn
  TF32 on by default (and may export TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1), so it is set off
  explicitly and the launcher drops that variable.
- tf32: float32 storage, TF32 tensor-core math allowed.
- fp16: float32 weights, autocast to float16, GradScaler: the paper's "mixed precision".
- bf16: float32 weights, autocast to bfloat16, no scaler (bf16 has float32's exponent range).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class PrecisionPolicy:
    param_dtype: str
    autocast_dtype: str | None
    grad_scaler: bool
    allow_tf32: bool


PRECISIONS: dict[str, PrecisionPolicy] = {
    "fp64": PrecisionPolicy("float64", None, grad_scaler=False, allow_tf32=False),
    "fp32": PrecisionPolicy("float32", None, grad_scaler=False, allow_tf32=False),
    "tf32": PrecisionPolicy("float32", None, grad_scaler=False, allow_tf32=True),
    "fp16": PrecisionPolicy("float32", "float16", grad_scaler=True, allow_tf32=False),
    "bf16": PrecisionPolicy("float32", "bfloat16", grad_scaler=False, allow_tf32=False),
}


def input_dtype(policy: PrecisionPolicy) -> str:
    """The dtype the model's first layer computes in: autocast's, else the parameters'. With
    `cast = "host"` the loader makes batches of this dtype before the copy."""
    return policy.autocast_dtype or policy.param_dtype


def torch_dtype(name: str) -> torch.dtype:
    import torch

    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype), name
    return dtype


def apply_tf32(policy: PrecisionPolicy) -> dict[str, bool]:
    """Set both TF32 switches explicitly and return them as read back.

    Only the legacy `allow_tf32` attributes are used: torch >= 2.9 refuses to mix them with the
    newer `fp32_precision` API, and the NGC 24.11 image (torch 2.6) has only the legacy one.
    """
    import torch

    torch.backends.cuda.matmul.allow_tf32 = policy.allow_tf32
    torch.backends.cudnn.allow_tf32 = policy.allow_tf32
    return {
        "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
    }


# Relative error of an fp32 matmul/convolution against float64, by what the math ran in: about
# 1e-6 in IEEE float32, about 1e-3 in TF32 (10-bit mantissa). The threshold sits between.
TF32_ERROR_THRESHOLD = 1e-4


def measure_tf32(device: torch.device) -> dict[str, float | bool] | None:
    """Whether cuBLAS and cuDNN really computed in TF32, from the error of one fp32 matmul and
    one convolution against float64. The flags read back only say what was asked: an
    environment variable such as NVIDIA_TF32_OVERRIDE acts inside the libraries. None on CPU."""
    import torch

    if device.type != "cuda":
        return None
    generator = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(512, 512, device=device, generator=generator) for _ in range(2))
    x = torch.randn(8, 64, 32, 32, device=device, generator=generator)
    w = torch.randn(64, 64, 3, 3, device=device, generator=generator)
    matmul = _relative_error(a @ b, a.double() @ b.double())
    conv = _relative_error(torch.nn.functional.conv2d(x, w, padding=1),
                           torch.nn.functional.conv2d(x.double(), w.double(), padding=1))
    return {"matmul_rel_error": matmul, "matmul_tf32": matmul > TF32_ERROR_THRESHOLD,
            "conv_rel_error": conv, "conv_tf32": conv > TF32_ERROR_THRESHOLD}


def _relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return float((value.double() - reference).abs().max() / reference.abs().max())
