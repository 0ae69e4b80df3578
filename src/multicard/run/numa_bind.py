"""Start one rank under its NUMA policy: `python -m multicard.run.numa_bind POLICY DEVICE -- CMD...`.

torchrun starts this in place of the rank (`--no-python`); it reads LOCAL_RANK, finds the rank's
GPU through CUDA_VISIBLE_DEVICES (multicard.measure.devices: CUDA device `LOCAL_RANK`, not NVML device
`LOCAL_RANK`), its home node on this machine (multicard.measure.numa), and replaces itself with
`numactl <policy> CMD`. The binding is inherited by everything the rank starts, DataLoader
workers included. Under torchrun's own `--numa-binding` (torchrun bound the rank already) it
binds nothing. Either way it gives the rank OpenMP threads for its own binding: its share of the
CPUs it is bound to among the local ranks bound to the same ones, where the launcher chose the
thread count (launch.OMP_DEFAULTED), not a user.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

from multicard.measure import numa
from multicard.plan import launch


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--":
        sys.exit("usage: python -m multicard.run.numa_bind POLICY DEVICE -- CMD...")
    policy, device, command = argv[0], argv[1], argv[3:]
    prefix, own, sharing = binding(policy, device, numa.allocated(numa.live(with_links=False)),
                                   int(os.environ.get("LOCAL_RANK", "0")),
                                   int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                                   os.environ.get("CUDA_VISIBLE_DEVICES"), os.sched_getaffinity(0))
    if own and os.environ.get(launch.OMP_DEFAULTED) == "1":
        os.environ["OMP_NUM_THREADS"] = str(numa.omp_threads(own, sharing))
    os.execvp(prefix[0] if prefix else command[0], [*prefix, *command])


def binding(policy: str, device: str, topology: numa.Topology, local_rank: int, local_world: int,
            cuda_visible_devices: str | None, allowed: Iterable[int]) -> tuple[list[str], list[int], int]:
    """(the numactl prefix, the CPUs the rank is bound to, how many local ranks share them) for
    one rank: under torchrun's policies the CPUs it was started on (`allowed`: torchrun bound
    it), shared by the local ranks whose home node lies within them (by none under `exclusive`;
    under `socket`, every rank of the socket's nodes); under numactl's the CPUs of the node it
    binds to; none under `interleave` (it binds memory only)."""
    homes = [numa.home_node(topology, device, rank, cuda_visible_devices)
             for rank in range(max(local_world, local_rank + 1))]
    if policy in numa.TORCHRUN_POLICIES:
        sharing = 1 if numa.TORCHRUN_POLICIES[policy] == "exclusive" else \
            _ranks_within(topology, homes, local_rank, set(allowed))
        return [], sorted(allowed), sharing
    prefix = numa.numactl_args(policy, topology, homes[local_rank])
    targets = [numa.bound_node(policy, topology, home) for home in homes]
    node = topology.node(targets[local_rank]) if targets[local_rank] is not None else None
    own = sorted(set(node.cpus) & set(allowed)) if node else []
    return prefix, own, targets.count(targets[local_rank])


def _ranks_within(topology: numa.Topology, homes: list[int | None], local_rank: int, own: set[int]) -> int:
    """Local ranks whose home node's CPUs all lie within `own` (torchrun bound each rank to its
    node's or socket's CPUs): the ranks that share them; those of the same home node where its
    own node is not wholly within (a binding the topology does not show)."""
    nodes = [topology.node(home) if home is not None else None for home in homes]
    within = [node is not None and bool(node.cpus) and set(node.cpus) <= own for node in nodes]
    return sum(within) if within[local_rank] else homes.count(homes[local_rank])


if __name__ == "__main__":
    main(sys.argv[1:])
