"""Start one rank under its NUMA policy: `python -m multicard.numa_bind POLICY DEVICE -- CMD...`.

torchrun starts this in place of the rank (`--no-python`); it reads LOCAL_RANK, finds the rank's
GPU through CUDA_VISIBLE_DEVICES (multicard.devices: CUDA device `LOCAL_RANK`, not NVML device
`LOCAL_RANK`), its home node on this machine (multicard.numa), and replaces itself with
`numactl <policy> CMD`. The binding is inherited by everything the rank starts, DataLoader
workers included.
"""

from __future__ import annotations

import os
import sys

from multicard import numa


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--":
        sys.exit("usage: python -m multicard.numa_bind POLICY DEVICE -- CMD...")
    policy, device, command = argv[0], argv[1], argv[3:]
    topology = numa.live(with_links=False)
    home = numa.home_node(topology, device, int(os.environ.get("LOCAL_RANK", "0")),
                          os.environ.get("CUDA_VISIBLE_DEVICES"))
    prefix = numa.numactl_args(policy, topology, home)
    os.execvp(prefix[0] if prefix else command[0], [*prefix, *command])


if __name__ == "__main__":
    main(sys.argv[1:])
