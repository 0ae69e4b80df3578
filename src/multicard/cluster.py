"""Several nodes per trial: the planner's one launcher step per trial, and what each node left.

The runner plans once, on one host (Slurm's batch host), and is the only writer of trials.jsonl.
A trial across N nodes is one launcher step that starts `python -m multicard.node_step` once per
node, and the step ends when every node's part has ended:

- `srun --nodes=N --ntasks=N --ntasks-per-node=1 --relative=0 --kill-on-bad-exit=1 --label`
  inside a Slurm allocation (the node's index is SLURM_NODEID; the step starts on the batch
  host, where the endpoint is; a node whose part fails ends the others' at once);
- elsewhere any command that starts its argument once per node and tells each its index in an
  environment variable (`--launcher 'mpirun -np {nnodes} --map-by ppr:1:node' --node-rank-env
  OMPI_COMM_WORLD_RANK`; `{nnodes}` is replaced by the trial's node count).

`step_wrapper` words go between the launcher and the node step (`apptainer exec --nv ... SIF`:
the planner runs in the image, and each node's part must enter it too). Each node's part writes
TRIAL/nodes/node<R>/{node.json,stdout.log,stderr.log}; the ranks write into the shared TRIAL
directory, global rank 0 on node 0 (launch.rendezvous_flags).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multicard.errors import InputError

NODES_DIR = "nodes"
NODE_JSON = "node.json"


@dataclass(frozen=True)
class Launcher:
    """How the planner starts one trial's part on every node."""

    words: tuple[str, ...]  # the launcher's own argv ("srun": built per step from nnodes)
    node_rank_env: str  # where a node's part finds its index
    step_wrapper: tuple[str, ...] = ()

    @property
    def is_srun(self) -> bool:
        return self.words == ("srun",)


NNODES_SLOT = "{nnodes}"


def srun_flags(nnodes: int) -> list[str]:
    """One task per node from the allocation's first node on (the batch host, where the
    endpoint is), all killed when one fails, output lines labelled with the task."""
    return [f"--nodes={nnodes}", f"--ntasks={nnodes}", "--ntasks-per-node=1", "--relative=0",
            "--kill-on-bad-exit=1", "--label"]


def make_launcher(command: str, node_rank_env: str | None, step_wrapper: str | None,
                  nnodes: int, env: Mapping[str, str]) -> Launcher:
    """`--launcher`, `--node-rank-env` and `--step-wrapper` as given, for trials of up to
    `nnodes` nodes; bad input otherwise (srun outside an allocation would queue a new job per
    trial; more nodes than the job has would never start)."""
    try:
        words = tuple(shlex.split(command))
        wrapper = tuple(shlex.split(step_wrapper or ""))
    except ValueError as exc:
        raise InputError(f"--launcher/--step-wrapper: {exc}") from None
    if not words:
        raise InputError("--launcher: expected a command, got an empty string")
    if words == ("srun",):
        _check_allocation(env, nnodes)
        variable = node_rank_env or "SLURM_NODEID"
    elif node_rank_env is None:
        raise InputError(f"--launcher {command!r}: give --node-rank-env VAR, the variable in which "
                         "it tells each node its index (srun's is SLURM_NODEID)")
    else:
        variable = node_rank_env
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", variable):
        raise InputError(f"--node-rank-env: expected a variable name, got {variable!r}")
    if shutil.which(words[0]) is None:
        raise InputError(f"--launcher: {words[0]} is not on PATH (several nodes per trial are "
                         "started with srun under Slurm, or the launcher given with --launcher)")
    return Launcher(words, variable, wrapper)


def _check_allocation(env: Mapping[str, str], nnodes: int) -> None:
    if "SLURM_JOB_ID" not in env:
        raise InputError("--launcher srun: not inside a Slurm allocation (SLURM_JOB_ID is not set): "
                         "srun would queue a new job for every trial; run under sbatch or salloc")
    nodes = env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", ""))
    if nodes.isascii() and nodes.isdigit() and int(nodes) < nnodes:
        raise InputError(f"--nnodes {nnodes}: the Slurm job has {nodes} node(s)")


def rendezvous_id(out: Path, experiment: str, trial_key: str, attempt: int) -> str:
    """The run (its experiment and directory), the trial and the attempt: every step meets in
    a rendezvous of its own, however often the same port is used."""
    digest = hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:8]
    return f"{experiment}-{digest}-{trial_key}-a{attempt}"


def step_argv(launcher: Launcher, nnodes: int, trial_dir: Path, ranks_per_node: int,
              extra_env: Mapping[str, str], command: Sequence[str],
              page_cache: tuple[str, Path] | None = None) -> list[str]:
    """The planner's argv of one multi-node trial: the launcher, then one node step per node."""
    words = ["srun", *srun_flags(nnodes)] if launcher.is_srun else \
        [word.replace(NNODES_SLOT, str(nnodes)) for word in launcher.words]
    node_step = [sys.executable, "-m", "multicard.node_step", "--nnodes", str(nnodes),
                 "--node-rank-env", launcher.node_rank_env, "--dir", str(trial_dir),
                 "--ranks-per-node", str(ranks_per_node)]
    for key, value in sorted(extra_env.items()):
        node_step += ["--env", f"{key}={value}"]
    if page_cache:  # every node's own page cache, not just the planner's
        node_step += ["--page-cache", page_cache[0], "--page-cache-tree", str(page_cache[1])]
    return [*words, *launcher.step_wrapper, *node_step, "--", *command]


def node_rank(env: Mapping[str, str], variable: str, nnodes: int) -> int:
    """This node's index from the launcher's variable; bad input when missing or out of range."""
    text = env.get(variable)
    if text is None:
        raise InputError(f"{variable} is not set: the launcher did not say which node this is")
    if not re.fullmatch(r"[0-9]{1,4}", text):
        raise InputError(f"{variable}: expected a node index, got {text!r}")
    if not int(text) < nnodes:
        raise InputError(f"{variable}: expected 0 <= index < nnodes ({nnodes}), got {text}")
    return int(text)


def node_dir(trial_dir: Path, rank: int) -> Path:
    return trial_dir / NODES_DIR / f"node{rank}"


def node_reports(trial_dir: Path, nnodes: int) -> list[dict[str, Any]]:
    """What each node's part recorded (node.json), in node order; a node that never started its
    part, or died before writing, has `{"node": R, "started": false}` or no `returncode`."""
    reports = []
    for rank in range(nnodes):
        try:
            found = json.loads((node_dir(trial_dir, rank) / NODE_JSON).read_text())
        except (OSError, json.JSONDecodeError):
            found = None
        reports.append(found if isinstance(found, dict) else {"node": rank, "started": False})
    return reports


def lost_nodes(reports: Sequence[Mapping[str, Any]]) -> dict[str, str] | None:
    """The nodes whose part did not end by itself (killed without a word: a node that died, or
    one the launcher ended; or never started), as a named cause; None when every part ended."""
    def names(selected: list[Mapping[str, Any]]) -> str:
        return ", ".join(f"{r['node']}" + (f" ({r['host']})" if "host" in r else "") for r in selected)

    killed = [r for r in reports if r.get("started", True) and "returncode" not in r]
    never = [r for r in reports if not r.get("started", True)]
    parts = ([f"node {names(killed)} ended without an exit status (its part was killed: the node "
              "died, or the launcher ended it)"] if killed else []) + \
        ([f"node {names(never)} never started its part"] if never else [])
    return {"type": "NodeLost", "message": "; ".join(parts)} if parts else None


def failed_nodes(reports: Sequence[Mapping[str, Any]]) -> str:
    """"node 1 (host): torchrun exit status 137", for the nodes whose torchrun failed."""
    return "; ".join(f"node {r['node']} ({r.get('host')}): torchrun exit status {r['returncode']}"
                     for r in reports if r.get("returncode", 0) != 0)


def stderr_order(reports: Sequence[Mapping[str, Any]]) -> list[int]:
    """Nodes whose stderr names the cause first: failed ones, then the rest, in node order."""
    failed = [int(r["node"]) for r in reports if r.get("returncode", 1) != 0]
    return failed + [int(r["node"]) for r in reports if int(r["node"]) not in failed]
