"""Several nodes per trial: the planner's one launcher step per trial, and what each node left.

The runner plans once, on one host (a Slurm job's batch host, with a Python of its own: it needs
no torch), and is the only writer of trials.jsonl. A trial across N nodes is one launcher step
that starts `python -m multicard.run.node_step` once per node, and the step ends when every node's
part has ended:

- `srun --nodes=N --ntasks=N --ntasks-per-node=1 --relative=0 --kill-on-bad-exit=1 --label
  --mpi=none --export=...` inside a Slurm allocation (the node's index is SLURM_NODEID; the step
  starts on the allocation's first node, where the endpoint is; a node whose part fails ends the
  others' at once), with `--gpus-per-node=G --exact` for a GPU trial of G GPUs per node;
- elsewhere any command that starts its argument once per node and tells each its index in an
  environment variable (`--launcher 'mpirun -np {nnodes} --map-by ppr:1:node' --node-rank-env
  OMPI_COMM_WORLD_RANK`; `{nnodes}` is replaced by the trial's node count).

`step_wrapper` words go between the launcher and the node step (`/usr/bin/apptainer exec --nv
... /abs/multicard.sif`): each node's part then runs in the image, with the image's own Python
(`node_python`, default `python3`). Nothing of the planner's host goes into the nodes' argv or
environment then: its interpreter is the slot PYTHON_SLOT, which each node's part fills with its
own, and the step exports only what the nodes' ranks may need (STEP_EXPORTED). Each node's part
writes TRIAL/nodes/node<R>/{node.json,stdout.log,stderr.log}; the ranks write into the shared
TRIAL directory (the same absolute path on every node), global rank 0 on node 0.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
import shlex
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multicard import integrity
from multicard.errors import InputError
from multicard.plan.launch import NODE_RANK_SLOT

NODES_DIR = "nodes"
NODE_JSON = "node.json"
# where the nodes' argv names their Python: each node's part puts its own interpreter there
PYTHON_SLOT = "{python}"
# where the nodes' argv and environment name multicard's own files (the LLM pin_memory hook):
# each node's part puts its own package's folder there
PACKAGE_SLOT = "{multicard}"
PACKAGE_DIR = str(Path(__file__).resolve().parents[1])
# What a step exports to the nodes besides Slurm's own SLURM_*: the communication libraries'
# settings and the user's thread count, never the planner's PATH, PYTHONPATH or venv (unless the
# nodes run the planner's own Python, without a step wrapper: then they are the same files).
STEP_EXPORTED_PREFIXES = ("NCCL_", "GLOO_", "UCX_", "FI_", "OMP_", "TORCH_", "APPTAINER", "SINGULARITY")
STEP_EXPORTED_NAMES = ("HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR")
PLANNER_PYTHON_NAMES = ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH")


@dataclass(frozen=True)
class Launcher:
    """How the planner starts one trial's part on every node."""

    words: tuple[str, ...]  # the launcher's own argv ("srun": built per step from nnodes)
    node_rank_env: str  # where a node's part finds its index
    step_wrapper: tuple[str, ...] = ()
    node_python: str = sys.executable  # the Python each node's part runs (inside the wrapper)

    @property
    def is_srun(self) -> bool:
        return self.words == ("srun",)

    @property
    def runs_planner_python(self) -> bool:
        """The nodes run the planner's own interpreter (no wrapper): its paths hold there too."""
        return not self.step_wrapper and self.node_python == sys.executable


NNODES_SLOT = "{nnodes}"


STEP_CREATE_WAIT_S = 300


def srun_flags(nnodes: int, gpus_per_node: int, exported: Sequence[str],
               cpus_per_node: int | None = None) -> list[str]:
    """One task per node from the allocation's first node on (where the endpoint is), all
    killed when one fails, output lines labelled with the task; no MPI plugin (torchrun meets by
    itself); only `exported` of the planner's environment (Slurm's own SLURM_* always); a GPU
    trial's GPUs per node and no more (`--exact`: the step gets what it asks for); and the job's
    CPUs of each node for its one task."""
    # a CPU trial's step takes no GPU: without --gres=none srun would give it the job's
    # (SLURM_GPUS_PER_NODE from sbatch is one of srun's input variables)
    gpus = [f"--gpus-per-node={gpus_per_node}", "--exact"] if gpus_per_node else ["--gres=none"]
    # on the srun line: which environment variable a step reads for it differs between Slurm
    # versions (SRUN_CPUS_PER_TASK only 22.05-23.02), and with --exact and none each task gets one
    cpus = [f"--cpus-per-task={cpus_per_node}"] if cpus_per_node else []
    # a step srun cannot create within this (a node hung, its resources still held) fails as a
    # trial no node started, instead of waiting until the trial's timeout
    return [f"--nodes={nnodes}", f"--ntasks={nnodes}", "--ntasks-per-node=1", "--relative=0",
            "--kill-on-bad-exit=1", "--label", "--mpi=none",
            f"--export={','.join(exported) if exported else 'NONE'}", *gpus, *cpus,
            f"--immediate={STEP_CREATE_WAIT_S}"]


def job_cpus_per_node(env: Mapping[str, str]) -> int | None:
    """The fewest CPUs the Slurm job holds on any of its nodes (SLURM_JOB_CPUS_PER_NODE, as
    `64(x2),32`; else SLURM_CPUS_ON_NODE); None outside a job or where Slurm says neither."""
    text = env.get("SLURM_JOB_CPUS_PER_NODE") or env.get("SLURM_CPUS_ON_NODE") or ""
    counts = [int(m) for m in re.findall(r"(\d+)(?:\(x\d+\))?(?:,|$)", text)]
    return min(counts) if counts and min(counts) > 0 else None


def step_exported(env: Mapping[str, str], launcher: Launcher) -> list[str]:
    """The names of `env` a step passes on to the nodes (see STEP_EXPORTED_PREFIXES)."""
    names = STEP_EXPORTED_NAMES + (PLANNER_PYTHON_NAMES if launcher.runs_planner_python else ())
    return sorted(k for k in env if k in names or k.startswith(STEP_EXPORTED_PREFIXES))


def make_launcher(command: str, node_rank_env: str | None, step_wrapper: str | None,
                  nnodes: int, env: Mapping[str, str], node_python: str | None = None,
                  check_allocation: bool = True) -> Launcher:
    """`--launcher`, `--node-rank-env`, `--step-wrapper` and `--node-python` as given, for
    trials of up to `nnodes` nodes; bad input otherwise (srun outside an allocation would queue
    a new job per trial; more nodes than the job has would never start). `check_allocation`
    False: only to show the lines (`run --dry-run` on a login node)."""
    try:
        words = tuple(shlex.split(command))
        wrapper = tuple(shlex.split(step_wrapper or ""))
    except ValueError as exc:
        raise InputError(f"--launcher/--step-wrapper: {exc}") from None
    if not words:
        raise InputError("--launcher: expected a command, got an empty string")
    if words == ("srun",):
        if check_allocation:
            _check_allocation(env, nnodes)
        variable = node_rank_env or "SLURM_NODEID"
    elif node_rank_env is None:
        raise InputError(f"--launcher {command!r}: give --node-rank-env VAR, the variable in which "
                         "it tells each node its index (srun's is SLURM_NODEID)")
    else:
        variable = node_rank_env
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", variable):
        raise InputError(f"--node-rank-env: expected a variable name, got {variable!r}")
    if check_allocation and shutil.which(words[0]) is None:
        raise InputError(f"--launcher: {words[0]} is not on PATH (several nodes per trial are "
                         "started with srun under Slurm, or the launcher given with --launcher)")
    if wrapper and not Path(wrapper[0]).is_absolute():
        raise InputError(f"--step-wrapper: {wrapper[0]!r} must be an absolute path (a step exports "
                         "no PATH to the nodes): e.g. $(command -v apptainer)")
    python = node_python or ("python3" if wrapper else sys.executable)
    return Launcher(words, variable, wrapper, python)


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


@dataclass(frozen=True)
class NodePart:
    """What every node's part of one step is given."""

    trial_dir: Path
    ranks_per_node: int
    gpus_per_node: int  # asked of srun (0: a CPU trial asks for none)
    extra_env: Mapping[str, str]
    page_cache: tuple[str, Path] | None = None
    stage_dir: Path | None = None  # node-local disk each node copies the page-cache tree to


def step_argv(launcher: Launcher, nnodes: int, part: NodePart, command: Sequence[str],
              env: Mapping[str, str]) -> list[str]:
    """The planner's argv of one multi-node step: the launcher, then one node step per node,
    with the planner's interpreter in `command` replaced by PYTHON_SLOT."""
    words = ["srun", *srun_flags(nnodes, part.gpus_per_node, step_exported(env, launcher),
                                 job_cpus_per_node(env))] \
        if launcher.is_srun else [word.replace(NNODES_SLOT, str(nnodes)) for word in launcher.words]
    node_step = [launcher.node_python, "-m", "multicard.run.node_step", "--nnodes", str(nnodes),
                 "--node-rank-env", launcher.node_rank_env, "--dir", str(part.trial_dir),
                 "--ranks-per-node", str(part.ranks_per_node)]
    for key, value in sorted(part.extra_env.items()):
        node_step += ["--env", f"{key}={portable_value(key, value, launcher.runs_planner_python)}"]
    if part.page_cache:  # every node's own page cache, not just the planner's
        node_step += ["--page-cache", part.page_cache[0], "--page-cache-tree", str(part.page_cache[1])]
        node_step += ["--stage-dir", str(part.stage_dir)] if part.stage_dir else []
    portable = [PYTHON_SLOT if word == sys.executable else word.replace(PACKAGE_DIR, PACKAGE_SLOT)
                for word in command]
    return [*words, *launcher.step_wrapper, *node_step, "--", *portable]


def portable_value(key: str, value: str, own_python: bool) -> str:
    """An environment value for the nodes: multicard's folder as PACKAGE_SLOT; in PYTHONPATH,
    only the entries of multicard's own, unless the nodes run the planner's Python."""
    value = value.replace(PACKAGE_DIR, PACKAGE_SLOT)
    if key != "PYTHONPATH" or own_python:
        return value
    return ":".join(entry for entry in value.split(":") if PACKAGE_SLOT in entry)


def fill_slots(text: str, node: int, python: str, package_dir: str) -> str:
    """A node's own values in the planner's slots."""
    return text.replace(NODE_RANK_SLOT, str(node)).replace(PYTHON_SLOT, python) \
        .replace(PACKAGE_SLOT, package_dir)


def step_parts(argv: Sequence[str]) -> list[list[str]]:
    """A step's argv cut where its programs meet: the launcher (with the step wrapper), each
    node's part, and what that part starts (torchrun), for a reader."""
    at = next(i for i in range(len(argv) - 2) if argv[i + 1:i + 3] == ["-m", "multicard.run.node_step"])
    end = argv.index("--", at)
    return [list(argv[:at]), list(argv[at:end]), list(argv[end + 1:])]


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


ENDPOINT_FLAG = re.compile(r"--rdzv[-_]endpoint=(.+):([0-9]+)$")


def endpoint_problem(command: Sequence[str]) -> str | None:
    """On node 0: why the rendezvous endpoint in torchrun's argv is not this node (static ranks
    put the store on node 0, so every other node would wait for the rendezvous timeout), or None.
    An address is this host's when a socket can be bound to it."""
    found = next((m for word in command if (m := ENDPOINT_FLAG.match(word))), None)
    if found is None:
        return None
    host = found.group(1).strip("[]")
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        return f"--rdzv-endpoint host {host!r} does not resolve on node 0 ({exc})"
    for family, _, _, _, address in infos:
        with socket.socket(family, socket.SOCK_STREAM) as probe, contextlib.suppress(OSError):
            probe.bind((address[0], 0))
            return None
    return (f"--rdzv-endpoint {host} ({infos[0][4][0]}) is not an address of node 0 "
            f"({socket.gethostname()}): the endpoint must be the step's first node")


def node_dir(trial_dir: Path, rank: int) -> Path:
    return trial_dir / NODES_DIR / f"node{rank}"


def node_reports(trial_dir: Path, nnodes: int) -> list[dict[str, Any]]:
    """What each node's part recorded (node.json), in node order, with its last heartbeat
    (`last_beat_unix`) where it beat; a node that never started its part, or died before writing,
    has `{"node": R, "started": false}` or no `returncode`."""
    reports = []
    for rank in range(nnodes):
        report = integrity.read_json_object(node_dir(trial_dir, rank) / NODE_JSON) or \
            {"node": rank, "started": False}
        with contextlib.suppress(OSError, ValueError):
            report["last_beat_unix"] = float((node_dir(trial_dir, rank) / HEARTBEAT_FILE).read_text())
        reports.append(report)
    return reports


# srun's own words for a task the cgroup's OOM killer hit ("tasks 1-3" for several)
SRUN_OOM = re.compile(r"srun: error: (\S+): tasks? ([0-9][0-9,\-]*): Out Of Memory")


def srun_oom_nodes(launcher_text: str) -> set[int]:
    """The tasks (one per node: the nodes) srun says ran out of memory."""
    found: set[int] = set()
    for match in SRUN_OOM.finditer(launcher_text):
        for part in match.group(2).split(","):
            low, _, high = part.partition("-")
            if low.isdigit() and (high.isdigit() or not high):
                found |= set(range(int(low), int(high or low) + 1))
    return found


@dataclass(frozen=True)
class Blame:
    """Which node's part ended the trial, and how; the others that failed are collateral."""

    node: int | None  # None: no node failed by itself (all never started, or all were stopped)
    how: str  # "oom", "lost" (killed without a word), "failed", "never started", "hung",
    # "hung before start" (at a timeout, never started while another part ran), "stopped", "ok"
    collateral: tuple[int, ...] = ()


# Each node's part writes the time into HEARTBEAT_FILE every HEARTBEAT_S from its start until
# its torchrun ends.
# A part whose last beat is HUNG_AFTER_S older than another's, while neither has ended, is hung
# (a node that stopped answering: its kernel, its file system, a SIGSTOP): a trial that then runs
# past its timeout is that node's failure, not a slow trial to keep as censored.
HEARTBEAT_FILE = "heartbeat"
HEARTBEAT_S = 5.0
HUNG_AFTER_S = 60.0


def beat(where: Path, stop: threading.Event, every_s: float = HEARTBEAT_S) -> None:
    """Write the time to where/HEARTBEAT_FILE now and every `every_s` until `stop` is set."""
    while True:
        # no fsync: the planner reads it live, and a shared file system under an I/O experiment
        # should not sync every few seconds for it
        with contextlib.suppress(OSError):
            integrity.write_bytes_atomic(where / HEARTBEAT_FILE, f"{time.time():.3f}\n".encode(),
                                         durable=False)
        if stop.wait(every_s):
            return


def hung_nodes(reports: Sequence[Mapping[str, Any]], after_s: float = HUNG_AFTER_S) -> list[int]:
    """The nodes whose part had not ended and whose last beat is `after_s` older than the
    freshest part's (module constants); [] where fewer than two parts beat."""
    beats = {int(r["node"]): float(r["last_beat_unix"]) for r in reports if "last_beat_unix" in r}
    if len(beats) < 2:
        return []
    freshest = max(beats.values())
    running = {int(r["node"]) for r in reports if r.get("started", True) and "returncode" not in r}
    return sorted(n for n, t in beats.items() if n in running and freshest - t > after_s)


def blame(reports: Sequence[Mapping[str, Any]], tails: Mapping[int, str], launcher_text: str,
          is_oom: Callable[[str], bool]) -> Blame:
    """The cause among the nodes' parts. An OOM anywhere (srun's word, or a node's own stderr)
    is the cause; then a part killed without being told to stop (its node died); then the part
    that failed by itself first (`ended_unix`); a part the launcher told to stop before it ended
    (`stop_unix`: --kill-on-bad-exit) is collateral, whatever it then reported."""
    started = [r for r in reports if r.get("started", True)]
    if not started:
        return Blame(None, "never started")
    told = {int(r["node"]): float(r["stop_unix"]) for r in reports if "stop_unix" in r}

    def by_itself(r: Mapping[str, Any]) -> bool:
        return int(r["node"]) not in told or float(r.get("ended_unix", math.inf)) < told[int(r["node"])]

    bad = [r for r in reports if not r.get("started", True) or r.get("returncode", 1) != 0]
    oom = sorted(srun_oom_nodes(launcher_text) |
                 {int(r["node"]) for r in started if is_oom(tails.get(int(r["node"]), ""))})
    failed = sorted((float(r.get("ended_unix", math.inf)), int(r["node"])) for r in started
                    if r.get("returncode", 0) != 0 and "returncode" in r and by_itself(r))
    first_failure = failed[0][0] if failed else math.inf
    # killed without a word: lost, unless it still beat after another part failed by itself
    # (then the launcher's kill of the step took it, before its part could say it was told)
    lost = [int(r["node"]) for r in started if "returncode" not in r and by_itself(r)
            and float(r.get("last_beat_unix", -math.inf)) < first_failure]
    never = [int(r["node"]) for r in reports if not r.get("started", True)]
    for how, nodes in (("oom", oom), ("lost", lost), ("failed", [n for _, n in failed]),
                       ("never started", never)):
        if nodes:
            return Blame(nodes[0], how, tuple(int(r["node"]) for r in bad if int(r["node"]) != nodes[0]))
    return Blame(None, "stopped" if bad else "ok", tuple(int(r["node"]) for r in bad))


def describe_node(reports: Sequence[Mapping[str, Any]], node: int) -> str:
    """"node 1 (host)" (the host where its part recorded one)."""
    host = next((r.get("host") for r in reports if int(r["node"]) == node), None)
    return f"node {node}" + (f" ({host})" if host else "")


def blame_message(found: Blame, reports: Sequence[Mapping[str, Any]]) -> str:
    """What a record says of the nodes: the cause first, then the collateral ones."""
    if found.node is None:
        return ""
    report = next(r for r in reports if int(r["node"]) == found.node)
    said = {"oom": "ran out of memory", "never started": "never started its part",
            "lost": "ended without an exit status (its part was killed: the node died, or the "
                    "launcher ended it)",
            "failed": f"failed first (torchrun exit status {report.get('returncode')})",
            "hung": f"stopped making progress (its part's heartbeat fell {HUNG_AFTER_S:.0f} s or "
                    "more behind the others' before the timeout: a hung node)",
            "hung before start": "never started its part while the others ran, until the "
                                 "timeout (it hung before its part could start: a dead mount, "
                                 "a stuck container start)"}[found.how]
    collateral = ", ".join(str(n) for n in found.collateral)
    return f"{describe_node(reports, found.node)} {said}" + \
        (f"; node {collateral} ended after it (collateral)" if collateral else "")


# NCCL's INFO lines (NCCL_DEBUG=INFO; the multi-node template's NCCL_DEBUG_SUBSYS=INIT,NET keeps
# them to start-up): the network it chose, and each channel's transport between two ranks
NCCL_NETWORK = re.compile(r"NCCL INFO Using network (\S+)")
NCCL_CHANNEL = re.compile(r"NCCL INFO Channel \d+/\d+ : \d+\[\S+\] -> \d+\[\S+\] (?:\[\w+\] )?via (\S+)")


def nccl_transports(text: str) -> dict[str, Any] | None:
    """The network and the transports NCCL used, from one node's log; None where NCCL said
    nothing (a CPU trial, or NCCL_DEBUG unset)."""
    networks = sorted(set(NCCL_NETWORK.findall(text)))
    via = sorted({"/".join(found.split("/")[:2]) for found in NCCL_CHANNEL.findall(text)})
    if not networks and not via:
        return None
    return {"network": networks, "transports": via}
