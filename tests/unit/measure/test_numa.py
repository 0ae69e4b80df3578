"""Topology parsers on real command outputs (tests/fixtures/topology/README.md) and the policies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from multicard.errors import InputError
from multicard.measure import numa
from tests.helpers import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "topology"


def load(*names: str) -> numa.Topology:
    return numa.from_files([FIXTURES / n for n in names])


ONE_NODE = "numactl_one_node.txt"
TWO_SOCKETS = "numactl_two_sockets.txt"
MEMORYLESS = "numactl_memoryless_nodes.txt"
CPULESS = "numactl_cpuless_nodes.txt"
GPU4 = "nvidia_smi_topo_4gpu_2socket.txt"  # the same machine as TWO_SOCKETS (della-i16g1)
GPU8 = "nvidia_smi_topo_8gpu_nvlink.txt"


def test_two_socket_numactl() -> None:
    t = load(TWO_SOCKETS)
    assert [(n.node, n.cpus, n.memory_mb) for n in t.nodes] == [
        (0, list(range(24)), 515346), (1, list(range(24, 48)), 516087)]
    assert t.distances == {0: {0: 10, 1: 32}, 1: {0: 32, 1: 10}}


def test_node_with_cpus_but_no_memory_and_nodes_with_memory_but_no_cpus() -> None:
    memoryless = load(MEMORYLESS)
    assert len(memoryless.nodes) == 8
    node1 = memoryless.node(1)
    assert node1 and node1.memory_mb == 0 and node1.cpus == [*range(8, 16), *range(72, 80)]
    assert memoryless.distances[1][4] == 32
    cpuless = load(CPULESS)
    assert [(n.node, len(n.cpus), n.memory_mb) for n in cpuless.nodes] == [
        (0, 104, 515489), (1, 104, 515028), (2, 0, 65536), (3, 0, 65536)]


def test_one_node() -> None:
    t = load(ONE_NODE)
    assert len(t.nodes) == 1 and t.nodes[0].node == 0 and t.nodes[0].cpus


def test_four_gpus_on_two_sockets() -> None:
    t = load(GPU4)
    assert [(g.gpu, g.numa_node) for g in t.gpus] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert t.gpus[3].cpus == list(range(24, 48))
    assert t.links["GPU0"] == {"GPU1": "NV4", "GPU2": "NV4", "GPU3": "NV4", "mlx5_0": "NODE"}
    assert t.links["GPU2"]["mlx5_0"] == "SYS"


def test_eight_gpu_nvlink_machine_with_nps4_nodes() -> None:
    t = load(GPU8)
    assert [g.numa_node for g in t.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert t.gpus[0].cpus == [*range(48, 64), *range(176, 192)]
    assert sorted(t.links) == [f"GPU{i}" for i in range(8)]
    assert t.links["GPU7"]["GPU0"] == "NV12" and t.links["GPU0"]["NIC0"] == "PXB"
    assert len(t.links["GPU0"]) == 7 + 10  # 7 GPUs and 10 NICs, not itself


def test_newer_driver_columns_empty_cells_and_old_drivers() -> None:
    modern = load("nvidia_smi_topo_gpu_numa_id.txt")  # extra GPU NUMA ID column
    assert [(g.numa_node, g.cpus[-1]) for g in modern.gpus] == [(0, 383), (0, 383), (1, 511), (1, 511)]
    restricted = load("nvidia_smi_topo_cpuset_restricted.txt")  # empty CPU affinity in a cpuset
    assert [(g.numa_node, len(g.cpus)) for g in restricted.gpus] == [(0, 16), (1, 0), (1, 0), (1, 0)]
    old = load("nvidia_smi_topo_old_driver.txt")  # no NUMA Affinity column at all
    assert [g.numa_node for g in old.gpus] == [None] * 4 and old.gpus[2].cpus == list(range(6, 12))


def test_underlined_header_and_space_separated_copies() -> None:
    tabs = (FIXTURES / GPU4).read_text()
    header, rest = tabs.split("\n", 1)
    for underline in ("\x1b[4m", "[4m"):  # a capture through a pipe; some lose the ESC byte
        text = header.replace("\tGPU0", f"\t{underline}GPU0", 1) + "[0m\n" + rest
        assert numa.parse_nvidia_smi_topo(text) == numa.parse_nvidia_smi_topo(tabs)
    spaces = tabs.expandtabs(8)
    assert numa.parse_nvidia_smi_topo(spaces).gpus == numa.parse_nvidia_smi_topo(tabs).gpus


def test_merged_outputs_of_one_machine() -> None:
    t = load(TWO_SOCKETS, GPU4)
    assert len(t.nodes) == 2 and len(t.gpus) == 4
    assert set(t.to_json()) == {"nodes", "gpus", "links"}


def test_unrecognised_text_is_bad_input(tmp_path: Path) -> None:
    junk = tmp_path / "notes.txt"
    junk.write_text("hello world\n")
    with pytest.raises(InputError, match=f"{junk}: neither"):
        numa.from_files([junk])


@pytest.mark.parametrize(
    ("files", "device", "local_rank", "policy", "expected"),
    [
        ((ONE_NODE,), "cpu", 1, "local", ["numactl", "--cpunodebind=0", "--membind=0"]),
        ((ONE_NODE,), "cpu", 0, "none", []),
        ((TWO_SOCKETS, GPU4), "cuda", 2, "local", ["numactl", "--cpunodebind=1", "--membind=1"]),
        ((TWO_SOCKETS, GPU4), "cuda", 2, "remote", ["numactl", "--cpunodebind=0", "--membind=0"]),
        ((TWO_SOCKETS, GPU4), "cuda", 0, "interleave", ["numactl", "--interleave=0,1"]),
        # memoryless home node 1: memory from the nearest node that has some (0 at distance 16)
        ((MEMORYLESS,), "cpu", 1, "local", ["numactl", "--cpunodebind=1", "--membind=0"]),
        # remote from node 1: the farthest node with CPUs (4, at 32), which has memory
        ((MEMORYLESS,), "cpu", 1, "remote", ["numactl", "--cpunodebind=4", "--membind=4"]),
        # only the nodes with CPUs and memory (0 and 4), never the memoryless ones
        ((MEMORYLESS,), "cpu", 0, "interleave", ["numactl", "--interleave=0,4"]),
        # CPU-less HBM nodes 2 and 3 never take ranks
        ((CPULESS,), "cpu", 1, "local", ["numactl", "--cpunodebind=1", "--membind=1"]),
        ((CPULESS,), "cpu", 0, "remote", ["numactl", "--cpunodebind=1", "--membind=1"]),
        # interleaving never spreads pages over the CPU-less HBM nodes
        ((CPULESS,), "cpu", 0, "interleave", ["numactl", "--interleave=0,1"]),
        # from `nvidia-smi topo -m` alone: nodes are the GPUs' NUMA affinities
        ((GPU8,), "cuda", 4, "local", ["numactl", "--cpunodebind=7", "--membind=7"]),
        # no distances known: the lowest other node
        ((GPU8,), "cuda", 0, "remote", ["numactl", "--cpunodebind=1", "--membind=1"]),
        ((GPU8,), "cuda", 0, "interleave", ["numactl", "--interleave=1,3,5,7"]),
    ],
)
def test_policy_to_command_line(files: tuple[str, ...], device: str, local_rank: int, policy: str,
                                expected: list[str]) -> None:
    topology = load(*files)
    home = numa.home_node(topology, device, local_rank)
    assert numa.numactl_args(policy, topology, home) == expected


@pytest.mark.parametrize(
    ("files", "device", "local_rank", "policy", "reason"),
    [((ONE_NODE,), "cpu", 0, "remote", "remote needs a second NUMA node with CPUs"),
     ((ONE_NODE,), "cpu", 0, "interleave", "interleave needs two or more NUMA nodes with CPUs and memory"),
     (("nvidia_smi_topo_old_driver.txt",), "cuda", 0, "local", "NUMA node is unknown")],
)
def test_policies_a_topology_cannot_express(files: tuple[str, ...], device: str, local_rank: int,
                                            policy: str, reason: str) -> None:
    topology = load(*files)
    with pytest.raises(numa.PolicyNotApplicableError, match=reason):
        numa.numactl_args(policy, topology, numa.home_node(topology, device, local_rank))


def test_numa_maps_and_status_parsing() -> None:
    maps = ("7f00 default file=/lib/x.so mapped=3 N0=3 kernelpagesize_kB=4\n"
            "7f10 interleave:0-1 anon=10 dirty=10 N0=4 N1=6 kernelpagesize_kB=4\n"
            "7f20 bind:1 huge anon=2 N1=2 kernelpagesize_kB=2048\n")
    assert numa.pages_per_node(maps) == {0: 7, 1: 8}
    assert numa.allowed_cpus("Name:\tpython\nCpus_allowed_list:\t0-3,8\n") == [0, 1, 2, 3, 8]
    processes = [{"pages": {0: 7, 1: 8}, "cpus": [0, 1, 2, 3]}, {"pages": {1: 5}, "cpus": [2, 3]}]
    assert numa.placement(processes, home=1, home_cpus=[2, 3]) == {
        "local_page_fraction": 13 / 20, "cpus_on_gpu_node_fraction": (0.5 + 1.0) / 2}


def test_topo_cli_prints_the_contract_json() -> None:
    result = subprocess.run([sys.executable, "-m", "multicard", "topo", str(FIXTURES / TWO_SOCKETS),
                             str(FIXTURES / GPU4)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0
    data = json.loads(result.stdout)
    assert data["gpus"][2] == {"gpu": 2, "numa_node": 1, "cpus": list(range(24, 48)), "uuid": None,
                               "pci_bus_id": None}  # saved nvidia-smi output names neither
    assert data["nodes"][1]["memory_mb"] == 516087
    live = subprocess.run([sys.executable, "-m", "multicard", "topo"], cwd=ROOT, capture_output=True,
                          text=True)
    assert live.returncode == 0 and json.loads(live.stdout)["nodes"]


def live_like(*buses: str) -> numa.Topology:
    """A 4-GPU two-socket node as NVML and sysfs describe it: GPUs 0, 1 on node 0; 2, 3 on node 1."""
    nodes = [numa.Node(0, list(range(24)), 515346), numa.Node(1, list(range(24, 48)), 516087)]
    gpus = [numa.Gpu(i, i // 2, list(range(24 * (i // 2), 24 * (i // 2) + 24)), f"GPU-{i}aaa-uuid",
                     bus) for i, bus in enumerate(buses)]
    return numa.Topology(nodes, gpus, {}, {0: {0: 10, 1: 32}, 1: {0: 32, 1: 10}})


@pytest.mark.parametrize(
    ("visible", "local_rank", "home"),
    [(None, 0, 0), (None, 2, 1),
     ("2,3", 0, 1), ("2,3", 1, 1),  # what Slurm gives the second job on the node
     ("3,0", 1, 0),
     ("GPU-2aaa-uuid,GPU-0aaa", 0, 1), ("GPU-2aaa-uuid,GPU-0aaa", 1, 0),  # UUIDs and prefixes
     ("2,7,0", 1, None),  # CUDA stops at the first entry that names no GPU
     ("1,1", 0, None)],  # a repeated device: CUDA shows none
)
def test_a_ranks_home_node_follows_cuda_visible_devices(visible: str | None, local_rank: int,
                                                        home: int | None) -> None:
    topology = live_like("0000:1b:00.0", "0000:43:00.0", "0000:9b:00.0", "0000:c3:00.0")
    assert numa.home_node(topology, "cuda", local_rank, visible) == home


def test_cuda_indices_count_in_pci_bus_order_not_nvml_order() -> None:
    # NVML index 0 sits on bus c3 (node 0 by construction); CUDA's PCI_BUS_ID order puts it last
    topology = live_like("0000:c3:00.0", "0000:1b:00.0", "0000:43:00.0", "0000:9b:00.0")
    assert numa.home_node(topology, "cuda", 0, "0") == 0  # bus 1b is NVML 1, on node 0
    assert numa.home_node(topology, "cuda", 0, "3") == 0  # bus c3 is NVML 0, on node 0
    assert numa.home_node(topology, "cuda", 0, "2") == 1  # bus 9b is NVML 3, on node 1


def test_inside_a_rank_its_gpu_is_found_by_uuid() -> None:
    topology = live_like("0000:1b:00.0", "0000:43:00.0", "0000:9b:00.0", "0000:c3:00.0")
    assert numa.home_node(topology, "cuda", 0, "0", gpu_uuid="GPU-3aaa-uuid") == 1


def test_mig_instances_are_refused_with_a_clear_message() -> None:
    topology = live_like("0000:1b:00.0", "0000:43:00.0", "0000:9b:00.0", "0000:c3:00.0")
    with pytest.raises(InputError, match=r"MIG instances \(MIG-4b2f"):
        numa.home_node(topology, "cuda", 0, "MIG-4b2f7e1c-9a3d-5e88-b2a1-3c1d0f9e8a77")


def test_a_numactl_output_that_contradicts_itself_is_bad_input(tmp_path: Path) -> None:
    claimed = tmp_path / "numactl.txt"
    claimed.write_text("available: 99999999999 nodes (0-99999999998)\nnode distances:\n")
    with pytest.raises(InputError, match="says 99999999999 node"):
        numa.from_files([claimed])
    done = subprocess.run([sys.executable, "-m", "multicard", "topo", str(claimed)], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "contradicts itself" in done.stderr
    # the right count, the wrong ids; an offline node's gap ("(0,2)") is no contradiction
    two = ("available: 2 nodes ({ids})\nnode 0 cpus: 0 1\nnode 0 size: 100 MB\n"
           "node 5 cpus: 2 3\nnode 5 size: 100 MB\n")
    claimed.write_text(two.format(ids="0-1"))
    with pytest.raises(InputError, match=r"nodes \(0-1\) are available but lists nodes \[0, 5\]"):
        numa.from_files([claimed])
    claimed.write_text(two.format(ids="0,5"))
    assert [n.node for n in numa.from_files([claimed]).nodes] == [0, 5]


@pytest.mark.parametrize(("policy", "local_rank", "own", "sharing"), [
    ("local", 0, list(range(24)), 2),          # node 0's 24 CPUs, shared by ranks 0 and 1
    ("local", 2, list(range(24, 48)), 2),
    ("remote", 0, list(range(24, 48)), 2),     # bound to the other node: ranks 0, 1 share it
    ("interleave", 0, [], 4),                  # memory only: threads as the launcher set them
    ("torchrun_node", 3, list(range(36, 48)), 2),    # torchrun bound it: its own CPUs, per node
    ("torchrun_exclusive", 3, list(range(36, 48)), 1),  # exclusive: a slice of its own
])
def test_a_ranks_threads_follow_its_own_binding(policy: str, local_rank: int, own: list[int],
                                                sharing: int) -> None:
    from multicard.run import numa_bind

    topology = live_like("0000:1b:00.0", "0000:43:00.0", "0000:9b:00.0", "0000:c3:00.0")
    allowed = range(36, 48) if policy.startswith("torchrun") else range(48)
    prefix, cpus, shared = numa_bind.binding(policy, "cuda", topology, local_rank, 4, None, allowed)
    assert (cpus, shared) == (own, sharing)
    assert (prefix[:1] == ["numactl"]) is (policy in ("local", "remote", "interleave"))
    if cpus:
        assert numa.omp_threads(cpus, shared) == len(own) // sharing  # not 48 // 4 = 12 each


def test_torchruns_socket_binding_is_shared_by_every_rank_of_the_sockets_nodes() -> None:
    from multicard.run import numa_bind

    # one socket of both nodes (CPUs 0-47): its four ranks share them; per node, two do
    topology = live_like("0000:1b:00.0", "0000:43:00.0", "0000:9b:00.0", "0000:c3:00.0")
    _, cpus, shared = numa_bind.binding("torchrun_socket", "cuda", topology, 1, 4, None, range(48))
    assert (len(cpus), shared) == (48, 4)
    _, cpus, shared = numa_bind.binding("torchrun_node", "cuda", topology, 1, 4, None, range(24))
    assert (len(cpus), shared) == (24, 2) and numa.omp_threads(cpus, shared) == 12


def test_a_job_on_one_socket_of_two_binds_within_its_allocation() -> None:
    # Slurm's cgroup gave the job node 0's CPUs and memory only (Cpus_allowed, Mems_allowed):
    # `remote` is not applicable there (a skipped config), where numactl would fail the trial
    whole = load(TWO_SOCKETS)
    node0 = whole.nodes[0]
    job = numa.within_allocation(whole, node0.cpus, {0})
    assert [n.cpus for n in job.nodes] == [node0.cpus, []]
    assert job.nodes[1].memory_mb == 0 and job.nodes[0].memory_mb == node0.memory_mb
    assert numa.numactl_args("local", job, 0) == ["numactl", "--cpunodebind=0", "--membind=0"]
    with pytest.raises(numa.PolicyNotApplicableError, match="within its allocation"):
        numa.numactl_args("remote", job, 0)
    with pytest.raises(numa.PolicyNotApplicableError, match="within its allocation"):
        numa.numactl_args("interleave", job, 0)
    # half of each socket: both policies still bind, to the allowed half of the far node
    half = [c for n in whole.nodes for c in n.cpus[: len(n.cpus) // 2]]
    split = numa.within_allocation(whole, half, None)
    assert numa.numactl_args("remote", split, 0) == ["numactl", "--cpunodebind=1", "--membind=1"]
    assert split.nodes[1].cpus == whole.nodes[1].cpus[: len(whole.nodes[1].cpus) // 2]


def test_the_memory_nodes_a_process_may_use_come_from_its_status() -> None:
    assert numa.allowed_memory_nodes("Name:\tx\nMems_allowed:\t3\nMems_allowed_list:\t0-1,3\n") == {0, 1, 3}
    assert numa.allowed_memory_nodes("Name:\tx\n") is None
    # this process's own: every node it may allocate on is a node of the machine (node 0 where
    # the machine shows no node folders in sysfs, as some containers do)
    assert numa.allowed_memory_nodes() <= {n.node for n in numa.live(with_links=False).nodes} | {0}
