"""Before a multi-node sweep: one launcher step that checks every node, so that a launcher that
cannot start, an image that does not run, unlike GPUs or a network the ranks cannot cross fail
the run at once, with one line, instead of each trial of a long plan.

The step is a trial's step without the workload: the launcher starts each node's part
(multicard.run.node_step, inside the step wrapper), which starts torchrun with the trial's ranks per
node; every rank joins one all_reduce across all nodes (gloo on CPU, NCCL on GPUs), and each
node's first rank writes preflight-node<R>.json: its host, Python, multicard and torch, the
GPUs it sees, the CPUs the step binds it to, whether it sees the run's folders (data, cache,
run directory), the sum it got and its whole environment as env.json has it (the trials'
environment is the nodes' image, not the planner's host). `problems` reads what the nodes
left; the planner writes preflight.json.

    python -m multicard.run.preflight --out DIR --device cpu|cuda   (one rank; torchrun starts it)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import multicard
from multicard import integrity
from multicard.measure import environment
from multicard.run import cluster

DIR = "preflight"
SUMMARY = "preflight.json"
# the nodes' parts start, import torch and meet: minutes at most, even with a slow shared file
# system; a node that does not come within this fails the check (the trials wait longer)
RDZV_TIMEOUT_S = 300
TIMEOUT_S = 420


def node_file(out: Path, node: int) -> Path:
    return out / f"preflight-node{node}.json"


def problems(step_dir: Path, nnodes: int, gpus_per_node: int, returncode: int | None,
             timed_out: bool, launcher_tail: str, tails: Mapping[int, str],
             version: str = multicard.__version__, cpus_per_node: int | None = None,
             commit: str | None = None, step_unix: tuple[float, float] | None = None) -> list[str]:
    """What stops the run from going on, first the most telling; [] when every node passed.
    `step_unix`: when the planner started and saw the end of the step, on its own clock."""
    reports = cluster.node_reports(step_dir, nnodes)
    if not any(r.get("started", True) for r in reports):
        return [f"no node started its part: the launcher exited with status {returncode}"
                f"{last_line(launcher_tail, ': ')}"]
    found = [f"{cluster.describe_node(reports, int(r['node']))} never started its part"
             for r in reports if not r.get("started", True)]
    found += [f"{cluster.describe_node(reports, int(r['node']))}: its part ended with status "
              f"{r.get('returncode', 'none (killed)')}{last_line(tails.get(int(r['node']), ''), ': ')}"
              for r in reports if r.get("started", True) and r.get("returncode", 1) != 0]
    if timed_out:
        found.append(f"the step did not end within {TIMEOUT_S} s")
    seen = [integrity.read_json_object(node_file(step_dir, n)) for n in range(nnodes)]
    return found + _compare(seen, gpus_per_node, version, cpus_per_node, commit) + \
        (_skewed_clocks(seen, *step_unix) if step_unix else [])


# The hung-node check (cluster.HUNG_AFTER_S) and which node failed first compare times the nodes
# wrote by their own clocks: a node whose clock is off the planner's by more than this is named
MAX_CLOCK_SKEW_S = 20.0


def _skewed_clocks(seen: Sequence[dict[str, Any] | None], start: float, end: float) -> list[str]:
    """Nodes whose clock read, while they ran the step, a time outside the step's span on the
    planner's clock widened by MAX_CLOCK_SKEW_S (a node's reading is taken within the span)."""
    found = []
    for s in (s for s in seen if s is not None and isinstance(s.get("clock_unix"), int | float)):
        off = max(start - s["clock_unix"], s["clock_unix"] - end, 0.0)
        if off > MAX_CLOCK_SKEW_S:
            found.append(f"node {s['node']} ({s['host']}): its clock is at least {off:.0f} s off the "
                         f"planner's (over {MAX_CLOCK_SKEW_S:.0f} s): naming a hung node and the node "
                         "that failed first compares the nodes' clocks; synchronize them (NTP, chrony)")
    return found


def _compare(seen: Sequence[dict[str, Any] | None], gpus_per_node: int, version: str,
             cpus_per_node: int | None = None, commit: str | None = None) -> list[str]:
    found = [f"node {n} wrote no {node_file(Path(), n).name}" for n, s in enumerate(seen) if s is None]
    present = [s for s in seen if s is not None]
    found += [f"node {s['node']} ({s['host']}) does not see {path}: bind it into the image at the "
              "same path" for s in present for path, there in s.get("paths", {}).items() if not there]
    found += [f"node {s['node']} ({s['host']}) runs multicard {s['multicard']}, the planner "
              f"{version}: install the same on both" for s in present
              if s.get("multicard") not in (None, version)]
    # the version is the same for every commit: the image must be built from the planner's
    found += [f"node {s['node']} ({s['host']}) runs multicard of commit {s['commit'][:12]}, the "
              f"planner of {commit[:12]}: rebuild the image from this checkout" for s in present
              if commit and s.get("commit") and s["commit"] != commit]
    found += [f"node {s['node']} ({s['host']}): all_reduce gave {s['all_reduce']}, expected "
              f"{s['expected']}" for s in present if s["all_reduce"] != s["expected"]]
    if cpus_per_node:  # the step's binding: every rank and loader worker of the node shares it
        found += [f"node {s['node']} ({s['host']}): the step is bound to {s['cpus']} CPU(s) of the "
                  f"{cpus_per_node} the job holds there (srun --cpus-per-task)" for s in present
                  if isinstance(s.get("cpus"), int) and s["cpus"] < cpus_per_node]
    if gpus_per_node:
        found += [f"node {s['node']} ({s['host']}) sees {len(s['gpus'])} GPU(s), the trials need "
                  f"{gpus_per_node}" for s in present if len(s["gpus"]) < gpus_per_node]
        models = {name for s in present for name in s["gpus"]}
        if len(models) > 1:
            found.append(f"the nodes' GPUs differ: {', '.join(sorted(models))}")
    return found


def summary(step_dir: Path, nnodes: int, found: list[str], wall_s: float) -> dict[str, Any]:
    """preflight.json: whether it passed, why not, and what each node said of itself."""
    return {"ok": not found, "problems": found, "wall_s": round(wall_s, 3),
            "dir": step_dir.name,
            "nodes": [integrity.read_json_object(node_file(step_dir, n)) for n in range(nnodes)]}


def last_line(text: str, prefix: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"{prefix}{lines[-1]}" if lines else ""


def main(argv: list[str] | None = None) -> int:
    """One rank: join the all_reduce; the node's first rank records what the node is."""
    p = argparse.ArgumentParser(prog="python -m multicard.run.preflight")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", choices=("cpu", "cuda"), required=True)
    p.add_argument("--path", action="append", default=[], help="a folder every node must see")
    args = p.parse_args(argv)
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank + 1)], device=args.device)
    dist.all_reduce(value)
    if local == 0:
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
            if args.device == "cuda" else []
        node = int(os.environ.get("MULTICARD_NODE", "0"))
        # the node's own environment (its image's): the planner's env.json is its host's
        integrity.write_text_atomic(node_file(args.out, node), json.dumps({
            "node": node, "host": socket.gethostname(), "python": sys.executable,
            "multicard": multicard.__version__, "torch": torch.__version__, "gpus": gpus,
            "cpus": len(os.sched_getaffinity(0)), "commit": environment.source_commit(),
            "paths": {path: Path(path).is_dir() for path in args.path}, "all_reduce": value.item(),
            "expected": world * (world + 1) / 2, "env": environment.capture_env(),
            "clock_unix": round(time.time(), 3)}, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
