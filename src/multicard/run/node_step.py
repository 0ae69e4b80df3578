"""One node's part of a multi-node trial, started by the planner's launcher step on every node.

    python -m multicard.run.node_step --nnodes N --node-rank-env SLURM_NODEID --dir TRIAL \\
        --ranks-per-node G [--env KEY=VALUE ...] [--page-cache MODE --page-cache-tree DIR] \\
        -- python -m torch.distributed.run ...

It finds its node index in the launcher's variable, puts it into torchrun's `--node-rank`, sets
this node's page cache for the trial's files, gives torchrun the trial environment of *this*
node (threads from this node's allocation; MULTICARD_NODE = the index, for the ranks), and keeps
its own record: TRIAL/nodes/node<R>/node.json (host, index, allocation, exit status) with the
node's stdout.log and stderr.log beside it. A node.json without an exit status is a node whose
part was killed (the planner names it `NodeLost`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from multicard import integrity
from multicard.data import page_cache
from multicard.errors import InputError, OneLineParser
from multicard.measure import environment, observe, processes, telemetry
from multicard.plan import launch
from multicard.run import cluster

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = OneLineParser(prog="python -m multicard.run.node_step", description=__doc__)
    p.add_argument("--nnodes", type=int, required=True)
    p.add_argument("--node-rank-env", required=True)
    p.add_argument("--dir", type=Path, required=True, help="the trial directory (shared)")
    p.add_argument("--ranks-per-node", type=int, required=True)
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--page-cache", choices=page_cache.MODES)
    p.add_argument("--page-cache-tree", type=Path)
    p.add_argument("--stage-dir", type=Path, help="node-local disk to copy the tree to first")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then torchrun's argv")
    args = p.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command or args.nnodes < 2 or args.ranks_per_node < 1 or \
            any("=" not in pair for pair in args.env) or \
            (args.page_cache is None) != (args.page_cache_tree is None) or \
            (args.stage_dir is not None and args.page_cache is None):
        p.error("expected --nnodes >= 2, --ranks-per-node >= 1, KEY=VALUE pairs, --page-cache "
                "with --page-cache-tree (and --stage-dir only with them), and -- COMMAND")
    return args


def describe_node(rank: int, command: list[str], ranks_per_node: int) -> dict[str, Any]:
    """Who ran this node's part, and with what allocation."""
    return {"node": rank, "host": socket.gethostname(), "pid": os.getpid(),
            "ranks_per_node": ranks_per_node, "python": sys.executable,
            "cpus_allowed": launch.allocated_cpus(), "started_unix": round(time.time(), 3),
            "slurm": {k: v for k, v in sorted(os.environ.items()) if k.startswith("SLURM_")},
            "argv": command}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        rank = cluster.node_rank(os.environ, args.node_rank_env, args.nnodes)
    except InputError as exc:
        print(f"multicard.run.node_step: error: {exc}", file=sys.stderr)
        return 2
    command = [cluster.fill_slots(word, rank, sys.executable, cluster.PACKAGE_DIR) for word in args.command]
    where = cluster.node_dir(args.dir, rank)
    where.mkdir(parents=True, exist_ok=True)
    report = describe_node(rank, command, args.ranks_per_node)
    # before anything slow (staging, torchrun's start): a stop the launcher sends from now on is
    # written down, so that this part is never taken for a node that died by itself
    stopping = Stopping(where, report)
    for sig in FORWARDED:
        signal.signal(sig, stopping.handle)
    integrity.write_text_atomic(where / cluster.NODE_JSON, json.dumps(dict(report), indent=1))
    threading.Thread(target=cluster.beat, args=(where, stopping.beating_done), daemon=True).start()
    if rank == 0 and (problem := cluster.endpoint_problem(command)):  # fail now, not at the timeout
        return _ended_here(where, report, problem, 2)
    env = node_env(args, rank)
    if args.page_cache:
        try:
            report["page_cache"] = set_page_cache(args.page_cache, args.page_cache_tree, args.stage_dir, env)
        except OSError as exc:  # a full or missing scratch disk: this node's failure, said
            return _ended_here(where, report, f"staging {args.page_cache_tree} to {args.stage_dir}: {exc}", 1)
    returncode = run_forwarding_signals(command, env, where, args.dir, report, stopping)
    stopping.beating_done.set()
    ended = time.time()
    report |= {"returncode": returncode, "ended_unix": round(ended, 3),
               "wall_s": round(ended - report["started_unix"], 3)}
    integrity.write_text_atomic(where / cluster.NODE_JSON, json.dumps(dict(report), indent=1))
    return returncode if returncode >= 0 else 128 - returncode


def node_env(args: argparse.Namespace, rank: int) -> dict[str, str]:
    """The trial's environment on this node: the pairs the planner gave, this node's GPUs and
    its own allocation's threads."""
    extra = {key: cluster.fill_slots(value, rank, sys.executable, cluster.PACKAGE_DIR)
             for key, value in (pair.split("=", 1) for pair in args.env)} | {"MULTICARD_NODE": str(rank)}
    if telemetry.visible_gpus():  # a GPU node: this node's part of the trial sees its own GPUs only
        extra |= launch.own_gpus("cuda", args.ranks_per_node, os.environ.get("CUDA_VISIBLE_DEVICES"))
    return launch.trial_env({**os.environ, **extra}, args.ranks_per_node, launch.allocated_cpus())


def set_page_cache(mode: str, tree: Path, stage_dir: Path | None, env: dict[str, str]) -> dict[str, Any]:
    """This node's page cache for the trial's tree, after staging it to node-local `stage_dir`
    (the ranks then read the local copy: MULTICARD_CACHE_DIR); what was done, and whether `cold`
    reaches the disk on the tree's file system."""
    staged = None
    if stage_dir is not None:
        from multicard.data import scenario_b  # numpy with it: only where a tree is staged

        staged = scenario_b.stage(tree, stage_dir)
        tree, env["MULTICARD_CACHE_DIR"] = Path(staged["to"]), str(stage_dir)
    page_cache.apply(mode, tree)
    storage = environment.storage(tree)
    disk, why = page_cache.cold_reaches_disk(storage.get("fstype"))
    return {"mode": mode, "storage": storage, **({"staged": staged} if staged else {}),
            **({"disk_cold": disk, "why": why} if mode == "cold" else {})}


def _ended_here(where: Path, report: dict[str, Any], problem: str, returncode: int) -> int:
    """This node's part ends before torchrun, with one line saying why (in node.json too)."""
    print(f"multicard.run.node_step: error: {problem}", file=sys.stderr)
    (where / "stderr.log").write_text(f"multicard.run.node_step: error: {problem}\n")
    report |= {"returncode": returncode, "ended_unix": round(time.time(), 3), "error": problem}
    integrity.write_text_atomic(where / cluster.NODE_JSON, json.dumps(dict(report), indent=1))
    return returncode


class Stopping:
    """The launcher's stop, from node_step's start on: written to node.json at once (before a
    KILL can follow: what ended this part was another's failure), then passed to torchrun once
    it runs, or, before it does, ending this part with 128 + the signal."""

    def __init__(self, where: Path, report: dict[str, Any]) -> None:
        self.where, self.report = where, report
        self.child: subprocess.Popen[bytes] | None = None
        self.beating_done = threading.Event()

    def _write(self) -> None:
        integrity.write_text_atomic(self.where / cluster.NODE_JSON, json.dumps(dict(self.report), indent=1))

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if "stop_unix" not in self.report:
            self.report.update(stop_signal=signal.Signals(signum).name, stop_unix=round(time.time(), 3))
            self._write()
        if self.child is not None:
            self.child.send_signal(signum)
            return
        self.report |= {"returncode": 128 + signum, "ended_unix": round(time.time(), 3)}
        self._write()
        os._exit(128 + signum)  # before torchrun: nothing of this part to wait for


def run_forwarding_signals(command: list[str], env: dict[str, str], where: Path, trial_dir: Path,
                           report: dict[str, Any], stopping: Stopping) -> int:
    """torchrun as a child: it dies with this process (a node part killed with SIGKILL leaves no
    trainer behind), and a stop the launcher sends (srun forwards scancel's SIGTERM, and ends
    the other nodes' parts when one fails) reaches it. The first stop is written to node.json
    at once, before a KILL can follow: what ended this part was another's failure."""
    parent = os.getpid()
    launch.become_subreaper()
    # this node's ranks ask, mid-epoch, to be looked at from outside (multicard.measure.observe)
    with (where / "stdout.log").open("wb") as stdout, (where / "stderr.log").open("wb") as stderr, \
            observe.Observer(trial_dir):
        child = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=env,
                                 preexec_fn=lambda: launch.set_parent_death_signal(parent))
        stopping.child = child
        if "stop_unix" in report:  # told to stop while torchrun was starting
            child.send_signal(signal.Signals[report["stop_signal"]])
        returncode = child.wait()
    # a rank torchrun left behind is this process's now: it must not live on into the next
    # trial, which meets at the same port
    for pid in set(processes.process_tree(os.getpid())) - {os.getpid()}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return returncode


if __name__ == "__main__":
    sys.exit(main())
