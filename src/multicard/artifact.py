"""What makes a run trustworthy on its own: env.json, SHA256SUMS and their verification.

SHA256SUMS is in coreutils format (`<sha256>  <relative path>`, sorted), so `sha256sum -c
SHA256SUMS` works without this package. Lock files (`*.lock`) are coordination state, not results,
and are neither listed nor reported as unlisted.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import socket
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from multicard import gpu_state, numa, nvml
from multicard.store import LOCK_SUFFIX

SUMS_FILE = "SHA256SUMS"
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
_SUM_LINE = re.compile(r"^(\\?)([0-9a-f]{64}) [ *](.+)$")


# --- checksums ------------------------------------------------------------------------------

def _listed_files(root: Path, sums_name: str = SUMS_FILE, ignore: tuple[str, ...] = ()) -> list[str]:
    return scan(root, sums_name, ignore)[0]


def scan(root: Path, sums_name: str = SUMS_FILE, ignore: tuple[str, ...] = ()
         ) -> tuple[list[str], list[str]]:
    """(regular files, entries that are not, or cannot be trusted) under `root`, without
    following any link.

    Only regular files are listed. A symbolic link (to a file, or to a folder anywhere), a FIFO,
    a socket or a device is named as unsafe: a checksum over its target would vouch for a file
    outside the run, and reading a FIFO or device could block or change state. So is a file with
    several hard links (its other name, maybe outside the run, can change it after the check)
    and a folder that cannot be read. Lock files (`*.lock`, empty: filelock's) are left out."""
    files, unsafe = [], []

    def unreadable(error: OSError) -> None:
        unsafe.append(f"{Path(error.filename).relative_to(root).as_posix()} (cannot be read: "
                      f"{error.strerror})")

    for folder, subfolders, names in os.walk(root, onerror=unreadable):  # links are not entered
        for name in [*subfolders, *names]:
            path = Path(folder) / name
            rel = path.relative_to(root).as_posix()
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode):
                if rel == sums_name:
                    unsafe.append(f"{rel} (a folder, not a checksum file)")
                continue
            if not stat.S_ISREG(info.st_mode):
                unsafe.append(f"{rel} ({_kind(path, info.st_mode)})")
            elif name.endswith(LOCK_SUFFIX) and info.st_size == 0:
                continue
            elif info.st_nlink > 1:
                unsafe.append(f"{rel} (a hard link: {info.st_nlink} names for one file)")
            elif rel != sums_name and rel not in ignore:
                files.append(rel)
    return sorted(files), sorted(unsafe)


def _kind(path: Path, mode: int) -> str:
    if stat.S_ISLNK(mode):
        return f"symbolic link -> {path.readlink()}"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device file" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return sha256_stream(f)


def sha256_stream(stream: IO[bytes]) -> str:
    digest = hashlib.sha256()
    for block in iter(lambda: stream.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def _escape(name: str) -> tuple[str, str]:
    """coreutils escapes backslash and newline in names and marks such lines with a leading '\\'."""
    if "\\" in name or "\n" in name:
        return "\\", name.replace("\\", "\\\\").replace("\n", "\\n")
    return "", name


def _unescape(name: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), name)


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`; None where it is missing, unreadable, torn or not an object
    (a file another process or node writes, read without trusting it)."""
    try:
        found = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return found if isinstance(found, dict) else None


def write_text_atomic(path: Path, text: str) -> None:
    """Write `path` whole or not at all: a full disk or a kill mid-write leaves the old file (or
    none), never an empty or half-written one."""
    write_bytes_atomic(path, text.encode("utf-8"))


def umask() -> int:
    """This process's umask, read without changing it (/proc, Linux >= 4.7)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    return 0o022


def write_bytes_atomic(path: Path, data: bytes, durable: bool = True) -> None:
    """`path` whole or not at all, through a temporary name of its own: writers on several
    nodes (or processes) never share, or delete, each other's partial file. `durable`: on disk
    before it takes the name (fsync), which a record needs and a re-creatable image does not."""
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        tmp.chmod(0o666 & ~umask())  # what open() would have made, not mkstemp's 0600
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def write_checksums(root: Path) -> Path:
    """Hash every file under `root` (except SHA256SUMS and locks) into root/SHA256SUMS."""
    lines = []
    for rel in _listed_files(root):
        mark, name = _escape(rel)
        lines.append(f"{mark}{sha256_file(root / rel)}  {name}\n")
    target = root / SUMS_FILE
    write_text_atomic(target, "".join(lines))
    return target


@dataclass
class VerifyResult:
    changed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unlisted: list[str] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)
    unsafe: list[str] = field(default_factory=list)  # archive members that could write outside

    @property
    def ok(self) -> bool:
        return not (self.changed or self.missing or self.unlisted or self.malformed or self.unsafe)


def read_checksums(sums: Path) -> tuple[dict[str, str], list[str]]:
    return parse_checksums(sums.read_bytes(), sums.name)


def parse_checksums(data: bytes, name: str) -> tuple[dict[str, str], list[str]]:
    """({path: sha256}, [problems]). Strict: a blank or unparsable line is a problem, so that even
    a one-byte append to SHA256SUMS itself is caught."""
    listed: dict[str, str] = {}
    problems: list[str] = []
    text = data.decode("utf-8", errors="replace")
    if text and not text.endswith("\n"):
        problems.append(f"{name}: last line is not terminated")
    for number, line in enumerate(text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"), 1):
        match = _SUM_LINE.match(line)
        if not match:
            problems.append(f"{name}: line {number} is not '<sha256>  <path>'")
            continue
        path = _unescape(match.group(3)) if match.group(1) else match.group(3)
        listed[path] = match.group(2)
    return listed, problems


def verify(root: Path, sums_name: str = SUMS_FILE, ignore: tuple[str, ...] = ()) -> VerifyResult:
    """Compare every file under `root` with the sums file; `ignore` lists files not covered."""
    result = VerifyResult()
    sums = root / sums_name
    present_list, result.unsafe = scan(root, sums_name, ignore)
    if sums.is_symlink() or (sums.exists() and not sums.is_file()):
        return result  # named by scan(): a sums file that is a link vouches for nothing
    if not sums.is_file():
        result.missing.append(sums_name)
        return result
    listed, result.malformed = read_checksums(sums)
    present = set(present_list)
    for rel, expected in sorted(listed.items()):
        if rel not in present:
            result.missing.append(rel)
        elif sha256_file(root / rel) != expected:
            result.changed.append(rel)
    result.unlisted = sorted(present - set(listed))
    return result


# --- environment ----------------------------------------------------------------------------

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


def _git() -> dict[str, Any]:
    """The checkout's commit; inside an image, the one baked in at build time."""
    source = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(source), "status", "--porcelain"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
        return {"sha": sha, "dirty": bool(status.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"sha": os.environ.get("MULTICARD_GIT_SHA"), "dirty": None}


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
