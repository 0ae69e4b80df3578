"""NVML's instantaneous power on a real GPU: what a window shorter than the counter resolves reads."""

from __future__ import annotations

import pytest
import torch

from multicard.measure import energy, nvml

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")]


def test_a_gpu_gives_instantaneous_power_or_says_why_not() -> None:
    pynvml = nvml.bindings()  # nvidia-ml-py's, where NGC's pynvml 11.4.1 shadows it
    assert hasattr(pynvml, "NVML_FI_DEV_POWER_INSTANT")
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        reader, why = energy.instant_power_reader(pynvml, handle)
        if reader is None:  # an older driver on Ampere or newer: said, never a 1 s average
            assert "1-second average" in str(why)
        else:
            assert 1.0 < reader() < 2000.0  # one board's watts
    finally:
        pynvml.nvmlShutdown()
