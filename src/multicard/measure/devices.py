"""Which physical GPU each local rank drives: CUDA_VISIBLE_DEVICES -> NVML device, by identity.

CUDA numbers the GPUs a process may use 0..n-1 in the order of CUDA_VISIBLE_DEVICES. Its entries
are indices into CUDA's enumeration (PCI bus order under CUDA_DEVICE_ORDER=PCI_BUS_ID, which the
launcher sets) or UUIDs (`GPU-...`, a unique prefix is enough); `visible()` reads it exactly as
CUDA does. Slurm and shared nodes set it ("2,3"), so local
rank r is NVML device r only by accident: every per-GPU lookup (NUMA node, utilisation, energy,
memory) goes through `visible()` and then through the GPU's UUID or PCI bus id, never through r.

MIG instances (`MIG-...`) are refused: a slice has no NUMA placement of its own and NVML's
per-GPU counters would count the whole GPU.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from multicard.errors import InputError
from multicard.measure import nvml

BF16_MIN_CAPABILITY = (8, 0)  # Ampere: the first GPUs with bfloat16 tensor cores


@dataclass(frozen=True)
class GpuIdentity:
    index: int  # NVML's (and nvidia-smi's) index
    uuid: str | None  # "GPU-8c0d..."
    pci_bus_id: str | None  # sysfs form, lower case: "0000:1b:00.0"
    name: str | None = None
    compute_capability: tuple[int, int] | None = None


class DeviceMappingError(InputError):
    """CUDA_VISIBLE_DEVICES names something the GPUs cannot be mapped from (MIG, mixed order)."""


def pci_order(gpus: Sequence[GpuIdentity]) -> list[GpuIdentity]:
    """The GPUs in CUDA's PCI_BUS_ID enumeration order (NVML's index where the bus is unknown)."""
    return sorted(gpus, key=lambda g: (g.pci_bus_id or "", g.index))


def visible(gpus: Sequence[GpuIdentity], cuda_visible_devices: str | None,
            device_order: str | None = "PCI_BUS_ID") -> list[GpuIdentity]:
    """The GPUs CUDA shows this process, in CUDA index order (CUDA device i = result[i]).

    Read as CUDA reads it (and as torch.cuda's own parser mirrors it): a list that starts with
    `GPU-` is a list of UUIDs (unique prefixes allowed) and ends at the first entry that is not
    one or matches no GPU; otherwise each entry is an ordinal read like strtoul ("1gpu" is 1),
    and the list ends at the first that is negative, unparsable or out of range. A repeated entry
    empties the whole list. A MIG list (`MIG-...`) is refused."""
    ordered = pci_order(gpus)
    if cuda_visible_devices is None:
        return ordered
    entries = cuda_visible_devices.split(",")
    if cuda_visible_devices.strip().upper().startswith("MIG-"):
        raise DeviceMappingError(
            f"CUDA_VISIBLE_DEVICES names MIG instances ({entries[0].strip()}): multicard measures "
            "whole GPUs (NUMA node, NVML utilisation, energy and memory are per GPU); give GPU "
            "indices or GPU-... UUIDs")
    by_uuid = cuda_visible_devices.startswith("GPU-")
    chosen: list[GpuIdentity] = []
    for entry in entries:
        gpu = _by_uuid(entry, ordered) if by_uuid else _by_ordinal(entry, ordered, device_order)
        if gpu is None:
            break
        if gpu in chosen:  # CUDA: a repeated device makes the whole list empty
            return []
        chosen.append(gpu)
    return chosen


def _by_uuid(entry: str, ordered: list[GpuIdentity]) -> GpuIdentity | None:
    if not entry.startswith("GPU-"):
        return None
    matches = [g for g in ordered if g.uuid and g.uuid.lower().startswith(entry.lower())]
    return matches[0] if len(matches) == 1 else None


def _strtoul(text: str) -> int:
    """The leading integer of `text` as C's strtoul reads it ("1gpu" -> 1); -1 when there is none
    or it is negative."""
    match = re.match(r"[+-]?\d+", text)
    return int(match.group(0)) if match else -1


def _by_ordinal(entry: str, ordered: list[GpuIdentity], device_order: str | None) -> GpuIdentity | None:
    index = _strtoul(entry.strip())
    if index < 0 or index >= len(ordered):
        return None
    if (device_order or "FASTEST_FIRST") != "PCI_BUS_ID" and len({g.name for g in ordered}) > 1:
        raise DeviceMappingError(
            f"CUDA_DEVICE_ORDER={device_order or 'FASTEST_FIRST (unset)'} with GPUs of different "
            f"models: which GPU CUDA index {index} is cannot be known; set "
            "CUDA_DEVICE_ORDER=PCI_BUS_ID")
    return ordered[index]


def of_local_rank(gpus: Sequence[GpuIdentity], local_rank: int,
                  cuda_visible_devices: str | None, device_order: str | None = "PCI_BUS_ID"
                  ) -> GpuIdentity | None:
    """The GPU that `torch.device("cuda", local_rank)` is, or None when CUDA shows fewer."""
    shown = visible(gpus, cuda_visible_devices, device_order)
    return shown[local_rank] if local_rank < len(shown) else None


def bf16_unsupported(gpus: Sequence[GpuIdentity]) -> str | None:
    """Why bf16 cannot run on these GPUs (compute capability below 8.0), or None."""
    old = [g for g in gpus if g.compute_capability and g.compute_capability < BF16_MIN_CAPABILITY]
    if not old:
        return None
    g = old[0]
    major, minor = g.compute_capability or (0, 0)
    return (f"bf16 needs compute capability >= 8.0 (Ampere); GPU {g.index} ({g.name}) "
            f"is {major}.{minor}")


def sysfs_pci_address(nvml_bus_id: str) -> str:
    """NVML's "00000000:1B:00.0" -> sysfs's "0000:1b:00.0"."""
    domain, rest = nvml_bus_id.split(":", 1)
    return f"{domain[-4:]}:{rest}".lower()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_gpus() -> list[GpuIdentity]:
    """Every GPU the driver knows, with its identity; [] without a driver or NVML."""
    try:
        pynvml = nvml.bindings()

        pynvml.nvmlInit()
    except Exception:  # no driver, no library: no GPUs
        return []
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            bus = sysfs_pci_address(_text(pynvml.nvmlDeviceGetPciInfo(handle).busId))
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                capability: tuple[int, int] | None = (int(major), int(minor))
            except pynvml.NVMLError:
                capability = None
            found.append(GpuIdentity(index, _text(pynvml.nvmlDeviceGetUUID(handle)), bus,
                                     _text(pynvml.nvmlDeviceGetName(handle)), capability))
        return found
    finally:
        pynvml.nvmlShutdown()


def from_environment(count: int | None = None) -> list[GpuIdentity]:
    """The GPUs this process's CUDA shows (the first `count` of them: a trial's GPUs)."""
    import os

    # a trial's environment defaults CUDA_DEVICE_ORDER to PCI_BUS_ID (launch.trial_env)
    shown = visible(nvml_gpus(), os.environ.get("CUDA_VISIBLE_DEVICES"),
                    os.environ.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID"))
    return shown if count is None else shown[:count]


def nvml_handle(pynvml: Any, gpu: GpuIdentity) -> Any:
    """The NVML handle of `gpu` by UUID (by PCI bus id where the UUID is unknown)."""
    if gpu.uuid:
        return pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
    return pynvml.nvmlDeviceGetHandleByPciBusId(gpu.pci_bus_id)
