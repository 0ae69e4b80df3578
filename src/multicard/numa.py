"""NUMA topology of the live machine, read from sysfs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

SYSFS_NODES = Path("/sys/devices/system/node")


def parse_cpulist(text: str) -> list[int]:
    """Kernel cpulist syntax ("0-3,8,10-11") -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def sysfs_nodes(root: Path = SYSFS_NODES) -> list[dict[str, Any]]:
    """[{node, cpus, memory_mb}] for every NUMA node; memory_mb is None when unreadable."""
    nodes = []
    for path in sorted(root.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpulist = path / "cpulist"
        cpus = parse_cpulist(cpulist.read_text()) if cpulist.exists() else []
        nodes.append({"node": int(path.name[4:]), "cpus": cpus, "memory_mb": _memory_mb(path)})
    return nodes


def _memory_mb(node_dir: Path) -> int | None:
    try:
        text = (node_dir / "meminfo").read_text()
    except OSError:
        return None
    match = re.search(r"MemTotal:\s+(\d+)\s+kB", text)
    return int(match.group(1)) // 1024 if match else None
