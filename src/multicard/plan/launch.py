"""Command lines and environments for one trial: torchrun, single node or multi-node.

Nothing here imports torch; the argv runs `torch.distributed.run` with the same interpreter, so a
venv or a container's Python is used consistently.
"""

from __future__ import annotations

import ast
import ctypes
import importlib.metadata
import importlib.util
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import multicard
from multicard.measure.numa import TORCHRUN_POLICIES
from multicard.plan import params
from multicard.plan.params import Value

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# TF32 is set explicitly per precision. TORCH_ALLOW_TF32_CUBLAS_OVERRIDE (NGC images) forces it
# on for cuBLAS whatever the flags say; NVIDIA_TF32_OVERRIDE=0 forces it off in the libraries
# themselves, silently turning the tf32 arm into fp32. Both are cleared, and what the caller's
# environment had is recorded (`cleared_env`).
DROPPED_ENV = ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "NVIDIA_TF32_OVERRIDE")
# how torchrun's agent appears in a rank's ancestry: `python -m torch.distributed.run`, `torchrun`
AGENT_MARKERS = ("torch.distributed.run", "torchrun")


def torchrun_argv(
    module: str,
    module_args: Sequence[str],
    nproc_per_node: int,
    nnodes: int = 1,
    rdzv: Rendezvous | None = None,
    wrapper: Sequence[str] = (),
    numa_binding: str | None = None,
) -> list[str]:
    """`python -m torch.distributed.run ... -m module args`.

    One node uses `--standalone` (a private rendezvous on a free port). Several nodes use
    `rendezvous_flags` (static ranks: the node rank is filled in on each node). A `wrapper`
    (nsys) is put in front of every rank with `--no-python`, so each rank gets its own process.
    `numa_binding`: torchrun's own `--numa-binding` mode (node, socket, exclusive).
    """
    argv = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes == 1:
        argv.append("--standalone")
    else:
        if rdzv is None:
            raise ValueError("several nodes need a rendezvous (HOST:PORT and an id)")
        argv += rendezvous_flags(nnodes, rdzv, "-")
    argv.append(f"--nproc-per-node={nproc_per_node}")
    if numa_binding:
        argv.append(f"--numa-binding={numa_binding}")
    if wrapper:
        return [*argv, "--no-python", *wrapper, sys.executable, "-m", module, *module_args]
    return [*argv, "-m", module, *module_args]


# Where each node's step puts its own node rank into the argv (multicard.run.node_step fills it).
NODE_RANK_SLOT = "{node_rank}"
# How long the first node waits for the last (and the others for the first): a node warming a
# page cache or starting 90 s late must not fail the trial; a node that never comes still does.
RDZV_TIMEOUT_S = 900


@dataclass(frozen=True)
class Rendezvous:
    """Where the nodes of one trial meet: HOST:PORT on the first node and an id that names the
    run, the trial and the attempt (the agents' keys in the store live under it; the ranks'
    own keys do not, which is why no rank may outlive its step: node_step)."""

    endpoint: str
    run_id: str
    timeout_s: int = RDZV_TIMEOUT_S


def rendezvous_flags(nnodes: int, rdzv: Rendezvous, sep: str) -> list[str]:
    """torchrun's flags for a static rendezvous (`sep` "-" for torchrun, "_" for `tune run`).

    Static, not c10d: c10d numbers the nodes by the order their agents sort in (host name, pid),
    so global rank 0, where torchtune writes its logs, could be on any node. Static ranks make
    the node with SLURM_NODEID 0, which hosts the store at the endpoint, rank 0."""
    return [f"--nnodes={nnodes}", f"--node{sep}rank={NODE_RANK_SLOT}", f"--rdzv{sep}backend=static",
            f"--rdzv{sep}endpoint={rdzv.endpoint}", f"--rdzv{sep}id={rdzv.run_id}",
            f"--rdzv{sep}conf=timeout={rdzv.timeout_s}", f"--max{sep}restarts=0"]


def allocated_cpus() -> int:
    """The CPUs this process may run on: Slurm's cgroup, `taskset` and a container's cpuset
    narrow it, where os.cpu_count() still counts the whole node."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def own_gpus(device: str, gpus: int, caller: str | None) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES of a trial: its own GPUs only, so that torchrun's `--numa-binding`,
    which divides a node's CPUs among the GPUs it sees, divides them among the trial's. The
    first `gpus` entries of the caller's CUDA_VISIBLE_DEVICES as written (CUDA reads them as it
    read the caller's: never a GPU the caller's CUDA could not open), or 0..gpus-1 where it sets
    none; {} on CPU or where the caller shows fewer (a trial that asks for more is refused
    before it starts)."""
    if device != "cuda":
        return {}
    entries = [str(i) for i in range(gpus)] if caller is None else \
        [e.strip() for e in caller.split(",") if e.strip()][:gpus]
    return {"CUDA_VISIBLE_DEVICES": ",".join(entries)} if len(entries) == gpus else {}


OMP_DEFAULTED = "MULTICARD_OMP_DEFAULTED"  # "1": the launcher chose OMP_NUM_THREADS, not the user


def trial_env(base: Mapping[str, str], ranks_per_node: int, cpu_count: int | None) -> dict[str, str]:
    """The environment of a trial: the caller's, minus DROPPED_ENV, plus what makes it reproducible.

    OMP_NUM_THREADS: torchrun would default it to 1; we share the node's cores between the local
    ranks instead (a CPU rank with one thread would leave cores idle), and a rank under a NUMA
    binding takes its share of its own binding (multicard.run.numa_bind). A value set by the user wins.
    `cpu_count` None leaves it to each node's step (its own allocation, see multicard.run.node_step).
    """
    env = {k: v for k, v in base.items() if k not in DROPPED_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    # CUDA's default order is "fastest first"; PCI order makes CUDA index i the GPU that NVML,
    # nvidia-smi and the NUMA topology call i.
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if cpu_count is not None and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, cpu_count // ranks_per_node))
        env[OMP_DEFAULTED] = "1"  # ours: a rank's binding may set its own (multicard.run.numa_bind)
    # The rank processes must import this same copy of the package (a source checkout included).
    package_root = str(Path(multicard.__file__).resolve().parents[1])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([package_root, *[p for p in paths if p != package_root]])
    return env


# what a CPU trial's OpenMP threads spin for at a barrier before they sleep (libgomp, which torch's
# wheels ship; its default is 300,000 spins)
CPU_SPINCOUNT = "1000"


def cpu_trial_env(device: str, base: Mapping[str, str]) -> dict[str, str]:
    """GOMP_SPINCOUNT=1000 for a CPU trial, unless the caller set it or OMP_WAIT_POLICY: its
    OpenMP threads spin briefly at a barrier, then sleep. A CPU trial's kernels are tiny, so it
    meets thousands of barriers a step. Where other work holds a core (a laptop, a CI runner), a
    thread spinning the default count holds its core while the thread it waits for is
    descheduled; where none does, sleeping at once costs a wake-up per barrier. Measured on 2
    cores, a 1-rank Table 2 smoke trial (2 threads), fp64: quiet 10-14 s with the default,
    9.7 s with 1000 spins, 33-36 s with OMP_WAIT_POLICY=PASSIVE; one core held by a busy loop:
    220-360 s with the default or ACTIVE, 229 s with 10,000 spins, 33 s with 1000. GPU trials keep
    the libraries' default, as the paper's runs did."""
    if device != "cpu" or "OMP_WAIT_POLICY" in base or "GOMP_SPINCOUNT" in base:
        return {}
    return {"GOMP_SPINCOUNT": CPU_SPINCOUNT}


def cleared_env(base: Mapping[str, str]) -> dict[str, str]:
    """The DROPPED_ENV variables `base` sets, with their values (for the trial's record)."""
    return {k: base[k] for k in DROPPED_ENV if k in base}


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


def become_subreaper() -> bool:
    """Make this process inherit its descendants' orphans (Linux >= 3.4), so that it can end
    every process of what it started, the ones whose parent died included."""
    if not sys.platform.startswith("linux"):
        return False
    return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def find_agent(ancestors: Sequence[tuple[int, list[str]]]) -> int | None:
    """The pid of torchrun's agent among a rank's ancestors (nearest first), from their argv:
    `torchrun ...`, `python [options] /path/torchrun ...` or `python [options] -m
    torch.distributed.run ...`."""
    for pid, argv in ancestors:
        if _program(argv) in AGENT_MARKERS:
            return pid
    return None


def _program(argv: list[str]) -> str:
    """What an argv runs: the module after `-m`, the script after the interpreter's options, or
    the executable itself."""
    name = Path(argv[0]).name if argv else ""
    if not name.startswith("python"):
        return name
    rest = iter(argv[1:])
    for arg in rest:
        if arg == "-m":
            return next(rest, "")
        if arg in ("-X", "-W", "-c"):  # options that take a value (-c: not a program we know)
            if arg == "-c":
                return ""
            next(rest, None)
        elif not arg.startswith("-"):
            return Path(arg).name
    return name


def ancestors(pid: int, limit: int = 8) -> list[tuple[int, list[str]]]:
    """(pid, argv) of the parent of `pid`, its parent, ... (at most `limit`), from /proc."""
    chain: list[tuple[int, list[str]]] = []
    while len(chain) < limit:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, IndexError, ValueError):
            break
        if pid <= 1:
            break
        chain.append((pid, [a for a in argv if a]))
    return chain


def die_with_agent() -> str:
    """Make this rank die when torchrun's agent dies; returns how (recorded in result.json).

    A runner killed with SIGKILL cannot clean up: its torchrun dies by its own parent-death
    signal, and the ranks must follow. PR_SET_PDEATHSIG fires when the *thread* that forked us
    exits, so it is armed only when torchrun's agent is the direct parent. With a wrapper in
    between (nsys forks the rank from a helper thread that may exit at any time; numactl execs
    and so does not count) a thread waits on a pidfd of the agent instead."""
    chain = ancestors(os.getpid())
    agent = find_agent(chain)
    if agent is None and os.environ.get("TORCHELASTIC_RUN_ID") and orphaned(chain):
        # torchrun started this rank and died before it got here (a node's part killed while
        # spawning): an orphan would wait at the store's port and join the next trial there
        os.kill(os.getpid(), signal.SIGKILL)
    if agent is None:  # started some other way: the direct parent is all we know
        set_parent_death_signal(os.getppid())
        return "pdeathsig (parent; no torchrun agent among the ancestors)"
    if agent == os.getppid():
        set_parent_death_signal(agent)
        return "pdeathsig"
    try:
        handle = os.pidfd_open(agent)
    except ProcessLookupError:  # the agent is gone already
        os.kill(os.getpid(), signal.SIGKILL)
    except OSError:  # a kernel without pidfd (< 5.3)
        handle = None
    threading.Thread(target=_kill_self_when_gone, args=(agent, handle), daemon=True).start()
    return "agent watcher"


def orphaned(chain: Sequence[tuple[int, list[str]]]) -> bool:
    """Re-parented: to init (pid 1 ends the chain, so it is empty) or to a node step, which
    adopts the orphans of what it started."""
    return not chain or _program(chain[0][1]) == "multicard.run.node_step"


def _kill_self_when_gone(pid: int, handle: int | None) -> None:
    if handle is not None:
        select.select([handle], [], [])  # a pidfd turns readable when its process exits
    else:
        while Path(f"/proc/{pid}").exists():
            time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)


def rank_wrapper(numa_policy: str, device: str, inner: Sequence[str] = ()) -> list[str]:
    """What runs in front of every rank: the numactl binder (outermost), then e.g. nsys; under
    torchrun's own policies (torchrun binds the rank itself) it only sets the rank's threads."""
    numa = [sys.executable, "-m", "multicard.run.numa_bind", numa_policy, device, "--"] \
        if numa_policy != "none" else []
    return [*numa, *inner]


def counters_wrapper(perf_dir: Path) -> list[str]:
    """perf stat's far/near DRAM counts around a rank (multicard.measure.counters), inside its binding."""
    return [sys.executable, "-m", "multicard.measure.counters", str(perf_dir), "--"]


def torchrun_binding_modes() -> tuple[frozenset[str], str | None]:
    """The `--numa-binding` modes of the installed torch's torchrun, read from its source
    (torch/numa/binding.py's AffinityMode) so that nothing here imports torch; none and why
    where it has none."""
    found = importlib.util.find_spec("torch")
    if found is None or not found.submodule_search_locations:
        return frozenset(), "torch is not installed"
    root = Path(next(iter(found.submodule_search_locations)))
    version = importlib.metadata.version("torch")
    source, run = root / "numa" / "binding.py", root / "distributed" / "run.py"
    if not source.exists() or "--numa-binding" not in run.read_text(errors="replace"):
        return frozenset(), f"the installed torch {version} has no torchrun --numa-binding"
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == "AffinityMode":
            return frozenset(stmt.value.value for stmt in node.body if isinstance(stmt, ast.Assign)
                             and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)
                             ), None
    return frozenset(), f"torch {version}'s torch/numa/binding.py defines no AffinityMode"


def vision_argv(settings: Mapping[str, Value], trial_dir: Path, data_dir: Path, trace: str,
                wrapper: Sequence[str] = (), rdzv: Rendezvous | None = None
                ) -> tuple[list[str], dict[str, str]]:
    """The command of `multicard.workloads.vision` with every setting as a flag, and what it
    needs in its environment: torchrun, or the rank alone (agentless)."""
    module_args = ["--out", str(trial_dir), "--data-dir", str(data_dir), "--trace", trace,
                   *params.to_flags(settings)]
    binding = TORCHRUN_POLICIES.get(str(settings["numa_policy"]))
    if agentless(int(settings["gpus"]), int(settings["nnodes"]), wrapper, binding):
        return [sys.executable, "-m", "multicard.workloads.vision", *module_args], single_rank_env()
    return torchrun_argv("multicard.workloads.vision", module_args,
                         nproc_per_node=int(settings["gpus"]), nnodes=int(settings["nnodes"]),
                         rdzv=rdzv, wrapper=wrapper, numa_binding=binding), {}


def agentless(ranks_per_node: int, nnodes: int, wrapper: Sequence[str], binding: str | None) -> bool:
    """Whether a trial's one rank is started without torchrun's agent. The agent costs a trial
    about 7 s (its own interpreter and torch import, the rendezvous, the teardown: the H200 run's
    trials spent 7.1-7.7 s outside their rank) and does nothing for one rank on one node. Kept
    where it does something: several ranks or nodes, its own --numa-binding, and a wrapper in
    front of the rank (nsys forks the rank from a thread, whose exit would fire the rank's
    parent-death signal: the agent's watcher, die_with_agent, covers that)."""
    return ranks_per_node == 1 and nnodes == 1 and not wrapper and binding is None


def single_rank_env() -> dict[str, str]:
    """What torchrun would give its one rank: rank 0 of 1, and a free port on this host for the
    process group's store (env:// initialisation)."""
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
            "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}


def free_port() -> int:
    """A TCP port the kernel has just handed out and released: the rank binds it a moment later
    (a race with another program taking it is possible, as with torchrun's --standalone)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
