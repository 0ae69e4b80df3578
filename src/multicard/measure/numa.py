"""NUMA: topology (live or from saved command output), binding policies, placement evidence.

Topology JSON (docs/design.md "Topology"): `nodes` [{node, cpus, memory_mb}], `gpus` [{gpu, numa_node,
cpus}], `links` {"GPU0": {"GPU1": "NV18", ...}}. Live, it comes from sysfs (nodes; each GPU's PCI
device `numa_node` and `local_cpulist`), NVML (which GPUs, their PCI addresses) and
`nvidia-smi topo -m` (links). Saved outputs of `numactl --hardware` and `nvidia-smi topo -m` are
recognised from their text, so a reviewer can check the topology of a node they do not have.

Policies, applied per rank by starting it under numactl (`multicard.run.numa_bind`):
- `none`: nothing; the kernel's first-touch placement and the scheduler decide.
- `local`: CPUs and memory of the rank's home node (its GPU's node; on a CPU-only run, node
  `local_rank mod nodes`). A home node without memory binds memory to the nearest node that has.
- `remote`: deliberately another node (the farthest one with CPUs): the negative control.
- `interleave`: pages spread over the nodes that have CPUs and memory (never memory-only nodes
  such as CXL or HBM), CPUs unbound.
DataLoader workers are forked from their rank and inherit its binding; the evidence shows it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from multicard.errors import InputError
from multicard.measure import devices

SYSFS_NODES = Path("/sys/devices/system/node")
SYSFS_PCI = Path("/sys/bus/pci/devices")
# numactl's policies, applied by multicard.run.numa_bind in front of each rank
NUMACTL_POLICIES = ("none", "local", "remote", "interleave")
# torchrun's own binding (`--numa-binding=MODE`, torch/numa/binding.py: each worker's CPUs set
# from its GPU's NUMA node with numactl --physcpubind; memory is not bound, pages go first-touch)
TORCHRUN_POLICIES = {"torchrun_node": "node", "torchrun_socket": "socket", "torchrun_exclusive": "exclusive"}
POLICIES = (*NUMACTL_POLICIES, *TORCHRUN_POLICIES)
# Linux's own limits (CONFIG_NR_CPUS at most 8192, MAX_NUMNODES 1024) with room to spare
MAX_CPUS, MAX_NODES = 65_536, 4096
# Terminal underline codes around the header; some captures lost the ESC byte itself.
_ANSI = re.compile(r"\x1b?\[[0-9;]*m")


@dataclass(frozen=True)
class Node:
    node: int
    cpus: list[int]
    memory_mb: int | None


@dataclass(frozen=True)
class Gpu:
    gpu: int  # NVML's and nvidia-smi's index (not CUDA's: see multicard.measure.devices)
    numa_node: int | None
    cpus: list[int]
    uuid: str | None = None  # live machines only; saved nvidia-smi output has neither
    pci_bus_id: str | None = None

    def identity(self) -> devices.GpuIdentity:
        return devices.GpuIdentity(self.gpu, self.uuid, self.pci_bus_id)


@dataclass(frozen=True)
class Topology:
    nodes: list[Node] = field(default_factory=list)
    gpus: list[Gpu] = field(default_factory=list)
    links: dict[str, dict[str, str]] = field(default_factory=dict)
    distances: dict[int, dict[int, int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"nodes": [asdict(n) for n in self.nodes], "gpus": [asdict(g) for g in self.gpus],
                "links": self.links}

    def node(self, index: int) -> Node | None:
        return next((n for n in self.nodes if n.node == index), None)


class PolicyNotApplicableError(Exception):
    """A policy that this topology cannot express (the trial is recorded as skipped)."""


# --- text formats ----------------------------------------------------------------------------

def parse_cpulist(text: str) -> list[int]:
    """Kernel cpulist syntax ("0-3,8,10-11", or space-separated as numactl prints) -> sorted ints.

    CPU numbers beyond MAX_CPUS are refused before any range is built: a corrupt file saying
    "0-999999999" would otherwise allocate a billion integers."""
    cpus: set[int] = set()
    for part in re.split(r"[,\s]+", text.strip()):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        if not re.fullmatch(r"[0-9]+", lo) or (hi and not re.fullmatch(r"[0-9]+", hi)) \
                or (hi and int(hi) < int(lo)):
            raise ValueError(f"not a CPU list: {text[:60]!r}")
        if max(int(lo), int(hi or lo)) >= MAX_CPUS:
            raise ValueError(f"CPU number beyond {MAX_CPUS - 1} in {text[:60]!r}")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cpus)


def parse_numactl_hardware(text: str) -> Topology:
    """`numactl --hardware`: nodes with their CPUs and memory, and the distance matrix."""
    cpus: dict[int, list[int]] = {}
    sizes: dict[int, int] = {}
    for line in text.splitlines():
        if match := re.match(r"\s*node (\d+) cpus:(.*)$", line):
            cpus[int(match.group(1))] = parse_cpulist(match.group(2))
        elif match := re.match(r"\s*node (\d+) size: (\d+) MB", line):
            sizes[int(match.group(1))] = int(match.group(2))
    ids = sorted(set(cpus) | set(sizes))
    if ids and ids[-1] >= MAX_NODES:
        raise ValueError(f"NUMA node {ids[-1]} is beyond any machine's {MAX_NODES} nodes")
    claimed = re.search(r"^\s*available:\s*(\d+)\s+nodes?(?:\s*\(([\d,\-]+)\))?", text, re.M)
    if claimed and int(claimed.group(1)) != len(ids):
        raise ValueError(f"numactl says {claimed.group(1)} node(s) are available but lists "
                         f"{len(ids)}: an output that contradicts itself (cut short, or not numactl's)")
    # the ids in parentheses ("(0-1)", or "(0,2)" with a node offline) are the ones listed below
    if claimed and claimed.group(2) and parse_cpulist(claimed.group(2)) != ids:
        raise ValueError(f"numactl says nodes ({claimed.group(2)}) are available but lists nodes "
                         f"{ids}: an output that contradicts itself (cut short, or not numactl's)")
    nodes = [Node(i, cpus.get(i, []), sizes.get(i)) for i in ids]
    return Topology(nodes=nodes, distances=_distances(text))


def _distances(text: str) -> dict[int, dict[int, int]]:
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "node distances:"), None)
    if start is None or start + 1 >= len(lines):
        return {}
    header = [int(x) for x in lines[start + 1].split()[1:]]
    if header and max(header) >= MAX_NODES:
        raise ValueError(f"a distance matrix of node {max(header)}: beyond any machine's {MAX_NODES} nodes")
    table = {}
    for line in lines[start + 2:]:
        if match := re.match(r"\s*(\d+):\s+([\d\s]+)$", line):
            table[int(match.group(1))] = dict(zip(header, map(int, match.group(2).split()), strict=False))
    return table


def parse_nvidia_smi_topo(text: str) -> Topology:
    """`nvidia-smi topo -m`: each GPU's CPU and NUMA affinity columns, and the link matrix.

    Cells are tab-separated (a terminal copy may have spaces); drivers put an extra empty cell
    before every `N/A`, and leave CPU or NUMA affinity empty under a restricted cpuset. A NUMA
    affinity that lists several nodes (POWER9 with GPU memory nodes) gives its first node.
    """
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    header_at = next((i for i, line in enumerate(lines) if re.match(r"\s*GPU0\b", line)), None)
    if header_at is None:
        raise ValueError("no GPU0 column header")
    header = [h for h in _cells(lines[header_at]) if h]
    linked = [h for h in header if _LINK_COLUMN.fullmatch(h)]
    gpus, links = [], {}
    for line in lines[header_at + 1:]:
        cells = _cells(line)
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        name, values = cells[0], cells[1:]
        links[name] = {col: value for col, value in zip(linked, values, strict=False)
                       if col != name and value not in ("X", "")}
        rest = [v for i, v in enumerate(values[len(linked):])
                if not (v == "" and values[len(linked):][i + 1:i + 2] == ["N/A"])]
        row = dict(zip(header[len(linked):], rest, strict=False))
        node = row.get("NUMA Affinity", "")
        cpus = row.get("CPU Affinity", "")
        gpus.append(Gpu(int(name[3:]), parse_cpulist(node)[0] if node not in ("", "N/A") else None,
                        parse_cpulist(cpus) if cpus not in ("", "N/A") else []))
    return Topology(gpus=gpus, links=links)


_LINK_COLUMN = re.compile(r"GPU\d+|NIC\d+|mlx\S+")


def _cells(line: str) -> list[str]:
    """Tab-separated cells (empty ones kept), or cells of a copy whose tabs became spaces."""
    parts = line.split("\t") if "\t" in line else re.split(r" {2,}", line.strip())
    cells = [c.strip() for c in parts]
    return cells[1:] if cells and cells[0] == "" else cells


def detect_format(text: str) -> str:
    clean = _ANSI.sub("", text)
    if re.search(r"^\s*node \d+ cpus:", clean, re.M) or clean.lstrip().startswith("available:"):
        return "numactl"
    if re.search(r"^\s*GPU0\b", clean, re.M):
        return "nvidia-smi"
    raise ValueError("neither `numactl --hardware` nor `nvidia-smi topo -m` output")


def from_files(paths: Iterable[Path]) -> Topology:
    """Merge saved outputs: nodes from numactl, GPUs and links from nvidia-smi."""
    nodes: list[Node] = []
    gpus: list[Gpu] = []
    links: dict[str, dict[str, str]] = {}
    distances: dict[int, dict[int, int]] = {}
    for path in paths:
        if path.exists() and not path.is_file():
            raise InputError(f"{path}: not a regular file (a FIFO or device is never read)")
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
            kind = detect_format(text)
            part = parse_numactl_hardware(text) if kind == "numactl" else parse_nvidia_smi_topo(text)
        except OSError as exc:
            raise InputError(f"{path}: cannot read ({exc.strerror})") from None
        except ValueError as exc:
            raise InputError(f"{path}: {exc}") from None
        nodes, distances = part.nodes or nodes, part.distances or distances
        gpus, links = part.gpus or gpus, part.links or links
    return Topology(nodes, gpus, links, distances)


# --- the live machine ------------------------------------------------------------------------

def sysfs_nodes(root: Path = SYSFS_NODES) -> list[Node]:
    nodes = []
    for path in sorted(root.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpulist = path / "cpulist"
        cpus = parse_cpulist(cpulist.read_text()) if cpulist.exists() else []
        nodes.append(Node(int(path.name[4:]), cpus, _memory_mb(path)))
    return nodes


def _memory_mb(node_dir: Path) -> int | None:
    try:
        text = (node_dir / "meminfo").read_text()
    except OSError:
        return None
    match = re.search(r"MemTotal:\s+(\d+)\s+kB", text)
    return int(match.group(1)) // 1024 if match else None


def _sysfs_distances(root: Path = SYSFS_NODES) -> dict[int, dict[int, int]]:
    table = {}
    for path in root.glob("node[0-9]*"):
        try:
            values = [int(v) for v in (path / "distance").read_text().split()]
        except (OSError, ValueError):
            continue
        table[int(path.name[4:])] = dict(enumerate(values))
    return table


def nvml_gpus(pci_root: Path = SYSFS_PCI) -> list[Gpu]:
    """GPUs in NVML order with their PCI device's NUMA node and local CPUs (sysfs)."""
    gpus = []
    for found in devices.nvml_gpus():
        device = pci_root / (found.pci_bus_id or "")
        node = _read_int(device / "numa_node")
        cpus = parse_cpulist((device / "local_cpulist").read_text()) \
            if (device / "local_cpulist").exists() else []
        gpus.append(Gpu(found.index, node if node is not None and node >= 0 else None, cpus,
                        found.uuid, found.pci_bus_id))
    return gpus


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def live(with_links: bool = True) -> Topology:
    """This machine's topology; `with_links=False` skips running nvidia-smi (a rank needs no links)."""
    links: dict[str, dict[str, str]] = {}
    if with_links and shutil.which("nvidia-smi"):
        try:
            text = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                                  timeout=30, check=True).stdout
            links = parse_nvidia_smi_topo(text).links
        except (OSError, subprocess.SubprocessError, ValueError):
            links = {}
    return Topology(sysfs_nodes(), nvml_gpus(), links, _sysfs_distances())


def within_allocation(topology: Topology, cpus: Iterable[int], memory_nodes: set[int] | None) -> Topology:
    """The topology as an allocation sees it (Slurm's cgroup on part of a node, taskset, a
    container's cpuset): each node's CPUs cut to the allowed ones, and no memory on a node it may
    not allocate on. A policy then binds within the allocation, or is not applicable here (a
    skipped config with its reason); numactl asked to bind outside it would fail the trial."""
    allowed = set(cpus)
    nodes = [replace(n, cpus=[c for c in n.cpus if c in allowed],
                     memory_mb=n.memory_mb if memory_nodes is None or n.node in memory_nodes else 0)
             for n in topology.nodes]
    return replace(topology, nodes=nodes)


def allowed_memory_nodes(status: str | None = None) -> set[int] | None:
    """The memory nodes this process may allocate on (Mems_allowed_list of /proc/self/status);
    None where it does not say."""
    if status is None:
        try:
            status = Path("/proc/self/status").read_text()
        except OSError:
            return None
    found = re.search(r"^Mems_allowed_list:\s*(\S+)", status, re.MULTILINE)
    return set(parse_cpulist(found.group(1))) if found else None


def allocated(topology: Topology) -> Topology:
    """`topology` within this process's own allocation."""
    return within_allocation(topology, os.sched_getaffinity(0), allowed_memory_nodes())


# --- policies --------------------------------------------------------------------------------

def home_node(topology: Topology, device: str, local_rank: int,
              cuda_visible_devices: str | None = None, gpu_uuid: str | None = None) -> int | None:
    """The node a rank belongs to: its GPU's on CUDA, else the ranks spread over the nodes.

    The rank's GPU is the one CUDA calls `local_rank` (CUDA_VISIBLE_DEVICES applied), or, inside
    a rank that knows it, the GPU with `gpu_uuid`; never NVML device `local_rank`."""
    if device == "cuda":
        gpu = _gpu_of_rank(topology, local_rank, cuda_visible_devices, gpu_uuid)
        return gpu.numa_node if gpu else None
    with_cpus = [n.node for n in _nodes(topology) if n.cpus]
    return with_cpus[local_rank % len(with_cpus)] if with_cpus else None


def _gpu_of_rank(topology: Topology, local_rank: int, cuda_visible_devices: str | None,
                 gpu_uuid: str | None) -> Gpu | None:
    if gpu_uuid is not None:
        return next((g for g in topology.gpus if g.uuid == gpu_uuid), None)
    shown = devices.of_local_rank([g.identity() for g in topology.gpus], local_rank,
                                  cuda_visible_devices)
    return next((g for g in topology.gpus if shown and g.gpu == shown.index), None)


def _nodes(topology: Topology) -> list[Node]:
    """The nodes; from `nvidia-smi topo -m` alone, the GPUs' nodes with their CPUs (memory unknown)."""
    if topology.nodes:
        return topology.nodes
    found: dict[int, set[int]] = {}
    for gpu in topology.gpus:
        if gpu.numa_node is not None:
            found.setdefault(gpu.numa_node, set()).update(gpu.cpus)
    return [Node(n, sorted(cpus), None) for n, cpus in sorted(found.items())]


def _with_memory(topology: Topology) -> list[int]:
    """Nodes that have memory; unknown memory (None) counts as memory, 0 MB does not."""
    return [n.node for n in _nodes(topology) if n.memory_mb is None or n.memory_mb > 0]


def _nearest(topology: Topology, origin: int, candidates: list[int]) -> int:
    row = topology.distances.get(origin, {})
    return min(candidates, key=lambda n: (row.get(n, 10**6 if n != origin else 0), n))


def bound_node(policy: str, topology: Topology, home: int | None) -> int | None:
    """The node whose CPUs a numactl policy binds a rank to (local: its home; remote: the
    farthest other node with CPUs); None where it binds no CPUs (none, interleave)."""
    if policy in ("none", "interleave"):
        return None
    args = numactl_args(policy, topology, home)
    return int(next(a for a in args if a.startswith("--cpunodebind=")).split("=", 1)[1])


def omp_threads(own_cpus: Sequence[int], sharing: int) -> int:
    """OpenMP threads for a rank bound to `own_cpus` that `sharing` local ranks share (each rank
    its share of its own binding, not of every CPU the trial was allocated)."""
    return max(1, len(own_cpus) // max(1, sharing))


def numactl_args(policy: str, topology: Topology, home: int | None) -> list[str]:
    """The numactl command prefix for a rank whose home node is `home` ([] for `none`)."""
    if policy == "none":
        return []
    if policy == "interleave":
        # Only nodes with CPUs and memory: `all` would also spread pages over memory-only nodes
        # (CXL expanders, HBM, GPU memory exposed as a node), which no CPU of the node is near.
        spread = [n.node for n in _nodes(topology) if n.cpus and n.node in _with_memory(topology)]
        if len(spread) < 2:
            raise PolicyNotApplicableError("interleave needs two or more NUMA nodes with CPUs and "
                                           f"memory; this machine (within its allocation) has {len(spread)}")
        return ["numactl", f"--interleave={','.join(map(str, spread))}"]
    if home is None:
        raise PolicyNotApplicableError("the rank's NUMA node is unknown (no NUMA affinity for its GPU)")
    if policy == "local":
        target = home
    elif policy == "remote":
        others = [n.node for n in _nodes(topology) if n.cpus and n.node != home]
        if not others:
            raise PolicyNotApplicableError("remote needs a second NUMA node with CPUs; this machine "
                                           "(within its allocation) has one")
        row = topology.distances.get(home, {})
        target = max(others, key=lambda n: (row.get(n, 0), -n))
    else:
        raise InputError(f"numa_policy: expected one of numactl's {', '.join(NUMACTL_POLICIES)} "
                         f"(torchrun binds its own), got {policy!r}")
    return ["numactl", f"--cpunodebind={target}", f"--membind={_memory_for(topology, target, home)}"]


def _memory_for(topology: Topology, target: int, home: int) -> int:
    memory = _with_memory(topology)
    if target in memory:
        return target
    # a memoryless node: the nearest node with memory, but never the home node for `remote`
    candidates = [n for n in memory if n != home or target == home]
    if not candidates:
        raise PolicyNotApplicableError(f"no node with memory to pair with node {target}")
    return _nearest(topology, target, candidates)


# --- placement evidence -----------------------------------------------------------------------

def pages_per_node(numa_maps: str) -> dict[int, int]:
    """Sum of the `N<node>=<pages>` fields of /proc/<pid>/numa_maps (all page sizes as pages)."""
    totals: dict[int, int] = {}
    for node, pages in re.findall(r"\bN(\d+)=(\d+)", numa_maps):
        totals[int(node)] = totals.get(int(node), 0) + int(pages)
    return totals


def allowed_cpus(status: str) -> list[int]:
    match = re.search(r"^Cpus_allowed_list:\s*(.+)$", status, re.M)
    return parse_cpulist(match.group(1)) if match else []


def children(pid: int) -> list[int]:
    """Child processes of `pid` (DataLoader workers of a rank), from /proc/<pid>/task/*/children."""
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
    return sorted(set(kids))


def snapshot(pid: int, role: str, out_dir: Path, label: str) -> dict[str, Any] | None:
    """Save /proc/<pid>/numa_maps and status under out_dir and return what they show."""
    try:
        numa_maps = Path(f"/proc/{pid}/numa_maps").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # the process ended meanwhile
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{label}-{role}-{pid}.numa_maps").write_text(numa_maps)
    (out_dir / f"{label}-{role}-{pid}.status").write_text(status)
    return {"pid": pid, "role": role, "pages": pages_per_node(numa_maps),
            "cpus": allowed_cpus(status)}


def placement(processes: list[dict[str, Any]], home: int | None,
              home_cpus: list[int]) -> dict[str, float | None]:
    """local_page_fraction (pages on the home node / all pages, over the processes) and
    cpus_on_gpu_node_fraction (mean over processes of allowed CPUs on the home node / allowed)."""
    pages = sum(sum(p["pages"].values()) for p in processes)
    local = sum(p["pages"].get(home, 0) for p in processes) if home is not None else 0
    fractions = [len(set(p["cpus"]) & set(home_cpus)) / len(p["cpus"]) for p in processes if p["cpus"]]
    return {"local_page_fraction": local / pages if pages and home is not None else None,
            "cpus_on_gpu_node_fraction": sum(fractions) / len(fractions) if fractions else None}


class PlacementProbe:
    """Where a rank and its worker processes are: their numa_maps and allowed CPUs, read once
    mid-epoch from outside the rank (multicard.measure.observe: reading numa_maps takes the process's
    mmap_lock, so not on the rank's clock), against the rank's GPU's node. Only experiments that
    ask for evidence run it."""

    def __init__(self, out_dir: Path, label: str, device: str, local_rank: int,
                 gpu_uuid: str | None = None) -> None:
        topology = live(with_links=False)
        # the rank's GPU by the UUID its CUDA reports, which CUDA_VISIBLE_DEVICES cannot renumber
        self.home = home_node(topology, device, local_rank, gpu_uuid=gpu_uuid)
        node = topology.node(self.home) if self.home is not None else None
        self.home_cpus = node.cpus if node else []
        self.out_dir, self.label = out_dir, label

    def finish(self, processes: list[dict[str, Any]] | None) -> dict[str, Any]:
        """Placement metrics of the snapshots taken (numa.snapshot of the rank and its workers),
        plus whether every worker kept its rank's CPU list."""
        processes = processes or []
        rank = [p for p in processes if p["role"] == "rank"]
        workers = [p for p in processes if p["role"] == "worker"]
        inherit = all(w["cpus"] == rank[0]["cpus"] for w in workers) if rank and workers else None
        return {**placement(processes, self.home, self.home_cpus), "numa_home_node": self.home,
                "numa_workers_seen": len(workers), "numa_workers_inherit_cpus": inherit}
