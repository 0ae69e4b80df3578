"""Where a run ran (env.json): host, CPUs, memory, NUMA topology, GPUs and their state, packages,
the checkout's commit, the container, and what storage a path is on.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from multicard.measure import gpu_state, numa, nvml

PACKAGES = ("multicard", "torch", "torchvision", "numpy", "nvidia-dali-cuda120",
            "nvidia-dali-cuda130", "torchtune", "torchao", "nvidia-ml-py", "pynvml", "pandas", "scipy",
            "matplotlib", "pyarrow", "datasets", "setuptools")
ENV_VARS = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
            "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
            "NCCL_DEBUG", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "MULTICARD_IN_CONTAINER",
            "MULTICARD_IMAGE", "MULTICARD_IMAGE_DIGEST", "MULTICARD_IMAGE_CREATED", "MULTICARD_IMAGE_SOURCE",
            "MULTICARD_BASE_DIGEST", "MULTICARD_BASE_NOTE", "MULTICARD_NO_LLM",
            "NVIDIA_PYTORCH_VERSION", "DALI_VERSION",
            "NSIGHT_SYSTEMS_VERSION", "CUDA_VERSION", "SLURM_JOB_ID", "SLURM_NODELIST",
            # how NCCL reaches the other nodes
            "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_NET", "GLOO_SOCKET_IFNAME",
            # the Slurm allocation: nodes, GPUs per node, CPUs per task
            "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_NTASKS_PER_NODE", "SLURM_GPUS_PER_NODE",
            "SLURM_GPUS_ON_NODE", "SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE", "SLURM_MEM_PER_NODE",
            "SRUN_CPUS_PER_TASK")


def capture_env(data_dir: Path | None = None) -> dict[str, Any]:
    """Everything a reviewer needs to know about where a run ran (env.json)."""
    return {
        "schema": 1,
        "captured": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "os_release": _os_release(),
        "python": sys.version.split()[0],
        "cpu": _cpu(),
        "memory_bytes": _memory_bytes(),
        "topology": numa.live().to_json(),
        "gpus": _gpus(),
        "torch": _torch_info(),
        "packages": _package_versions(),
        "nvml_bindings": nvml.describe(),
        "torchao_ops": torchao_ops(),
        "git": _git(),
        "container": {"in_container": os.environ.get("MULTICARD_IN_CONTAINER") == "1",
                      "image": os.environ.get("MULTICARD_IMAGE"),
                      "image_digest": os.environ.get("MULTICARD_IMAGE_DIGEST"),
                      "image_created": os.environ.get("MULTICARD_IMAGE_CREATED"),
                      "image_source": os.environ.get("MULTICARD_IMAGE_SOURCE"),
                      # "": the image was built on a base not pinned by digest
                      "base_digest": os.environ.get("MULTICARD_BASE_DIGEST"),
                      # a base that is not NGC (the stand-in) says so here
                      "base_note": os.environ.get("MULTICARD_BASE_NOTE")},
        "env": {k: os.environ[k] for k in ENV_VARS if k in os.environ},
        "storage": storage(data_dir) if data_dir else None,
    }


def _os_release() -> str | None:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return None
    match = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', text, re.M)
    return match.group(1) if match else None


def _cpu() -> dict[str, Any]:
    model = None
    try:
        match = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        model = match.group(1).strip() if match else None
    except OSError:
        pass
    return {"model": model, "logical_cpus": os.cpu_count(),
            "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}


def _memory_bytes() -> int | None:
    try:
        match = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def _gpus() -> list[dict[str, Any]]:
    """GPUs through NVML; an empty list where there is no driver."""
    try:
        pynvml = nvml.bindings()

        pynvml.nvmlInit()
    except Exception:  # no driver, no library: a CPU machine
        return []
    driver = pynvml.nvmlSystemGetDriverVersion()
    gpus = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        gpus.append({
            "index": index,
            "name": pynvml.nvmlDeviceGetName(handle),
            "uuid": pynvml.nvmlDeviceGetUUID(handle),
            "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
            "pci_bus_id": pynvml.nvmlDeviceGetPciInfo(handle).busId,
            "driver": driver,
            # power limits, clocks, throttle reasons, modes, ECC, PCIe link: at the run's start
            "state": gpu_state.read(pynvml, handle),
        })
    pynvml.nvmlShutdown()
    return gpus


def _torch_info() -> dict[str, Any] | None:
    try:
        import torch
    except ImportError:
        return None
    cuda = torch.cuda.is_available()
    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "cuda_available": cuda,
        "device_count": torch.cuda.device_count() if cuda else 0,
    }


def torchao_ops() -> dict[str, Any]:
    """Whether torchao's C++ ops load here: its wheel is built against PyPI's torch, and another
    torch build (NGC's) may refuse it, which torchao's import only logs at debug level. The
    library is loaded as torchao's import would load it (it registers the same ops)."""
    spec = importlib.util.find_spec("torchao")
    if spec is None or spec.origin is None:
        return {"loaded": None, "why": "torchao is not installed"}
    found = sorted(Path(spec.origin).parent.glob("_C*.so"))
    if not found:
        return {"loaded": None, "why": "this torchao build ships no C++ extension"}
    try:
        import torch

        if str(found[0]) not in torch.ops.loaded_libraries:
            torch.ops.load_library(str(found[0]))
    except (ImportError, OSError, RuntimeError) as error:
        cause = error.__cause__ or error
        return {"loaded": False, "why": f"{found[0].name}: {cause}"}
    return {"loaded": True, "why": None}


def _package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def _git(source: Path | None = None) -> dict[str, Any]:
    """The checkout's commit (the package's own, or `source`); inside an image, the one baked in
    at build time."""
    source = source or Path(__file__).resolve().parents[3]
    try:
        sha = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(source), "status", "--porcelain"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
        return {"sha": sha, "dirty": bool(status.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"sha": os.environ.get("MULTICARD_GIT_SHA"), "dirty": None}


def source_commit() -> str | None:
    """The commit this multicard was built from: its checkout's, an image's baked-in one, or, for
    a copy installed with `pip install .` (a Slurm batch host's), the checkout it runs in; None
    where none is known (an image built without GIT_SHA says "unknown")."""
    own = Path(__file__).resolve().parents[3]
    places = [own] + ([Path.cwd()] if not os.environ.get("MULTICARD_IN_CONTAINER") else [])
    for place in places:  # a multicard checkout only: not a repository a venv happens to sit in
        project = place / "pyproject.toml"
        if project.is_file() and 'name = "multicard"' in project.read_text():
            sha = _git(place)["sha"]
            if sha and sha != "unknown":
                return str(sha)
    sha = os.environ.get("MULTICARD_GIT_SHA")
    return sha if sha and sha != "unknown" else None


def storage(path: Path) -> dict[str, Any]:
    """Filesystem and disk type under `path` (the review asked what "HDD" meant)."""
    path = path.resolve()
    best: tuple[str, str, str] | None = None
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount, fstype = line.split()[:3]
            if path.is_relative_to(mount) and (best is None or len(mount) > len(best[1])):
                best = (device, mount, fstype)
    except OSError:
        return {"path": str(path)}
    if best is None:
        return {"path": str(path)}
    device, mount, fstype = best
    return {"path": str(path), "mount": mount, "fstype": fstype, "device": device,
            "rotational": _rotational(device)}


def _rotational(device: str) -> bool | None:
    """True for a spinning disk, from /sys/block/<disk>/queue/rotational; None when unknown."""
    name = Path(device).name
    for candidate in (name, re.sub(r"p?\d+$", "", name)):
        flag = Path("/sys/block") / candidate / "queue" / "rotational"
        if flag.exists():
            return flag.read_text().strip() == "1"
    return None
