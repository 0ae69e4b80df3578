"""CUDA_VISIBLE_DEVICES -> NVML GPU, the way CUDA reads it; bf16 support by compute capability."""

from __future__ import annotations

import pytest

from multicard.measure import devices
from multicard.measure.devices import GpuIdentity

# NVML's order need not be PCI order: index 0 sits on the highest bus here
NODE = [GpuIdentity(0, "GPU-d3c1aa00-0000", "0000:c3:00.0", "NVIDIA H100 80GB HBM3", (9, 0)),
        GpuIdentity(1, "GPU-1b2baa11-1111", "0000:1b:00.0", "NVIDIA H100 80GB HBM3", (9, 0)),
        GpuIdentity(2, "GPU-43feaa22-2222", "0000:43:00.0", "NVIDIA H100 80GB HBM3", (9, 0))]


def indices(visible: str | None, order: str | None = "PCI_BUS_ID") -> list[int]:
    return [g.index for g in devices.visible(NODE, visible, order)]


@pytest.mark.parametrize(
    ("visible", "expected"),
    [(None, [1, 2, 0]),  # PCI bus order: 1b, 43, c3
     ("0", [1]), ("2,0", [0, 1]), (" 1 , 0 ", [2, 1]),
     ("1gpu,2ampere", [2, 0]), ("+1", [2]),  # ordinals read like strtoul
     ("GPU-43fe", [2]), ("GPU-d3c1aa00-0000,GPU-1b2b", [0, 1]),
     ("GPU-43fe,1", [2]),  # a UUID list ends at the first entry that is not a UUID
     ("0,GPU-43fe", [1]),  # an ordinal list ends at the first entry that is not an ordinal
     ("gpu-1B2B", []),  # the GPU- prefix is case-sensitive, as in CUDA
     ("", []), ("-1", []), ("0,-1,2", [1]), ("0,5,1", [1]),
     ("0,0,1", []), ("GPU-43fe,GPU-43fe", []),  # a repeated device empties the whole list
     ("GPU-", [])],  # matches every UUID: ambiguous, nothing
)
def test_visible_devices_in_cuda_index_order(visible: str | None, expected: list[int]) -> None:
    assert indices(visible) == expected


def test_a_ranks_gpu_is_cuda_device_local_rank() -> None:
    assert devices.of_local_rank(NODE, 1, "2,0").index == 1  # type: ignore[union-attr]
    assert devices.of_local_rank(NODE, 2, "2,0") is None


def test_mig_instances_are_refused() -> None:
    with pytest.raises(devices.DeviceMappingError, match="MIG instances"):
        indices("MIG-GPU-d3c1aa00-0000/1/0")
    with pytest.raises(devices.DeviceMappingError, match="MIG instances"):
        indices("MIG-4b2f7e1c-9a3d-5e88-b2a1-3c1d0f9e8a77")


def test_indices_without_pci_order_are_refused_only_where_they_are_ambiguous() -> None:
    assert indices("1", None) == [2]  # identical GPUs: any order names the same kind of GPU
    mixed = [*NODE[:2], GpuIdentity(2, "GPU-43fe", "0000:43:00.0", "NVIDIA L40S", (8, 9))]
    with pytest.raises(devices.DeviceMappingError, match="CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        devices.visible(mixed, "1", None)
    assert [g.index for g in devices.visible(mixed, "GPU-43fe", None)] == [2]  # UUIDs are exact


def test_bf16_needs_ampere() -> None:
    assert devices.bf16_unsupported(NODE) is None
    old = [GpuIdentity(0, "GPU-x", "0000:1b:00.0", "Tesla T4", (7, 5))]
    assert devices.bf16_unsupported(old) == ("bf16 needs compute capability >= 8.0 (Ampere); "
                                             "GPU 0 (Tesla T4) is 7.5")
    assert devices.bf16_unsupported([GpuIdentity(0, None, None)]) is None  # unknown: not refused


def test_nvml_bus_ids_become_sysfs_addresses() -> None:
    assert devices.sysfs_pci_address("00000000:1B:00.0") == "0000:1b:00.0"
