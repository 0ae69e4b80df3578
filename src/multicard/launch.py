"""Command lines and environments for one trial: torchrun, single node or multi-node.

Nothing here imports torch; the argv runs `torch.distributed.run` with the same interpreter, so a
venv or a container's Python is used consistently.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import multicard
from multicard import params
from multicard.params import Value

PR_SET_PDEATHSIG = 1
# TF32 is set explicitly per precision; this NGC variable would force it on for cuBLAS regardless.
DROPPED_ENV = ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",)


def torchrun_argv(
    module: str,
    module_args: Sequence[str],
    nproc_per_node: int,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    rdzv_id: str = "multicard",
    wrapper: Sequence[str] = (),
) -> list[str]:
    """`python -m torch.distributed.run ... -m module args`.

    One node uses `--standalone` (a private rendezvous on a free port). Several nodes use the c10d
    rendezvous at `rdzv_endpoint`; every node runs the same command. A `wrapper` (nsys) is put in
    front of every rank with `--no-python`, so each rank gets its own wrapped process.
    """
    argv = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes == 1 and rdzv_endpoint is None:
        argv.append("--standalone")
    else:
        if rdzv_endpoint is None:
            raise ValueError("several nodes need a rendezvous endpoint HOST:PORT")
        argv += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
                 f"--rdzv-id={rdzv_id}"]
    argv.append(f"--nproc-per-node={nproc_per_node}")
    if wrapper:
        return [*argv, "--no-python", *wrapper, sys.executable, "-m", module, *module_args]
    return [*argv, "-m", module, *module_args]


def trial_env(base: Mapping[str, str], ranks_per_node: int, cpu_count: int) -> dict[str, str]:
    """The environment of a trial: the caller's, minus DROPPED_ENV, plus what makes it reproducible.

    OMP_NUM_THREADS: torchrun would default it to 1; we share the node's cores between the local
    ranks instead (a CPU rank with one thread would leave cores idle). A value set by the user wins.
    """
    env = {k: v for k, v in base.items() if k not in DROPPED_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    # CUDA's default order is "fastest first"; PCI order makes CUDA index i the GPU that NVML,
    # nvidia-smi and the NUMA topology call i.
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    env.setdefault("OMP_NUM_THREADS", str(max(1, cpu_count // ranks_per_node)))
    # The rank processes must import this same copy of the package (a source checkout included).
    package_root = str(Path(multicard.__file__).resolve().parents[1])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([package_root, *[p for p in paths if p != package_root]])
    return env


def set_parent_death_signal(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """Ask Linux to kill this process when its parent `parent_pid` dies (no-op elsewhere).

    A runner killed with SIGKILL cannot clean up; without this its torchrun and ranks would keep
    training as orphans and compete with the resumed run for the same cores or GPUs.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)


def rank_wrapper(numa_policy: str, device: str, inner: Sequence[str] = ()) -> list[str]:
    """What runs in front of every rank: the NUMA binder (outermost), then e.g. nsys."""
    numa = [sys.executable, "-m", "multicard.numa_bind", numa_policy, device, "--"] \
        if numa_policy != "none" else []
    return [*numa, *inner]


def vision_argv(settings: Mapping[str, Value], trial_dir: Path, data_dir: Path, trace: str,
                wrapper: Sequence[str] = (), rdzv_endpoint: str | None = None,
                rdzv_id: str = "multicard") -> list[str]:
    """torchrun over `multicard.workloads.vision` with every setting as a flag."""
    module_args = ["--out", str(trial_dir), "--data-dir", str(data_dir), "--trace", trace,
                   *params.to_flags(settings)]
    return torchrun_argv("multicard.workloads.vision", module_args,
                         nproc_per_node=int(settings["gpus"]), nnodes=int(settings["nnodes"]),
                         rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, wrapper=wrapper)
