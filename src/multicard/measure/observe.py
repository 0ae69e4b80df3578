"""A rank's processes looked at from outside while it trains: off the rank's clock.

Mid-epoch 0, while its DataLoader workers live and have touched their data, a rank wants to know
the CPUs it and each worker may run on, the device memory each holds on every GPU (a stray
context lives only as long as its worker), and, for the NUMA test, where their pages are. Done
inside the rank, that is two scans of all of /proc, NVML's process list of every GPU and reading
numa_maps (which takes the process's mmap_lock and can stall its workers' shared memory): tens of
milliseconds of the rank's own time inside the timed epoch. So the rank only asks (one small
file write), and the process that launched it answers from outside: the runner for a trial on
one node, each node's part (multicard.run.node_step) for its own ranks. The rank reads the answer
after training, off the clock. Every answer says how long each look took. Reading numa_maps
from outside still takes the process's mmap_lock for as long as the walk lasts (as reading it
from a thread of the rank did): what moves off the rank is its own time, not that lock.

Files in the trial directory: `observer-<host>.json` (while an observer on that host watches
it), `observe-rank<R>.request` (the rank's pid, host, and where numa_maps go) and
`observed-rank<R>.json` (the answer).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multicard.integrity import write_text_atomic
from multicard.measure import numa, processes, telemetry

OBSERVER = "observer-{host}.json"  # one per host: each node's part marks its own
POLL_S = 0.02  # how often the observer looks for a request: the workers live for half an epoch
ANSWER_TIMEOUT_S = 60.0  # how long a rank waits for an answer after training


def request_path(trial_dir: Path, rank: int) -> Path:
    return trial_dir / f"observe-rank{rank}.request"


def answer_path(trial_dir: Path, rank: int) -> Path:
    return trial_dir / f"observed-rank{rank}.json"


def marker(trial_dir: Path, host: str) -> Path:
    return trial_dir / OBSERVER.format(host=host)


def watched(trial_dir: Path) -> bool:
    """Whether an observer on this host watches the trial directory."""
    return marker(trial_dir, socket.gethostname()).is_file()


def ask(trial_dir: Path, rank: int, numa_dir: Path | None, label: str) -> bool:
    """Ask the observer to look at this process now; False where none watches (the rank was
    started without multicard's runner). Inside the clock, so one plain write of a few hundred
    bytes: no temporary name, no fsync (the observer retries a request it reads half-written)."""
    if not watched(trial_dir):
        return False
    request_path(trial_dir, rank).write_text(json.dumps({
        "pid": os.getpid(), "host": socket.gethostname(), "label": label,
        "numa_dir": str(numa_dir) if numa_dir is not None else None, "asked_unix": time.time()}))
    return True


@dataclass(frozen=True)
class Seen:
    """What the observer saw of one rank and its workers, or why nothing."""

    affinity: dict[str, Any] = field(default_factory=dict)  # {"rank": cpus, "workers": {pid: cpus}}
    gpu_processes: list[tuple[int, str, int | None]] | None = None  # (pid, GPU UUID, bytes)
    gpu_processes_reason: str | None = None
    numa: list[dict[str, Any]] | None = None  # numa.snapshot of the rank and each worker
    took_s: dict[str, float] = field(default_factory=dict)
    reason: str | None = None  # why there is no answer


def answer(trial_dir: Path, rank: int, asked: bool, timeout_s: float = ANSWER_TIMEOUT_S) -> Seen:
    """The observer's answer, read after training (off the clock), or why there is none."""
    if not asked:
        return Seen(reason="no observer watched this rank (started without multicard's runner)")
    path, deadline = answer_path(trial_dir, rank), time.monotonic() + timeout_s
    while not path.is_file():
        if time.monotonic() > deadline:
            return Seen(reason=f"the observer did not answer within {timeout_s:g} s")
        time.sleep(POLL_S)
    found = json.loads(path.read_text())
    held = found.get("gpu_processes")
    # JSON keeps a snapshot's node numbers as text: numa.placement reads them as numbers
    shots = [{**shot, "pages": {int(node): n for node, n in shot["pages"].items()}}
             for shot in found.get("numa") or []] if found.get("numa") is not None else None
    return Seen(found.get("affinity") or {},
                None if held is None else [(int(p), str(g), b) for p, g, b in held],
                found.get("gpu_processes_reason"), shots, found.get("took_s", {}))


def look(request: dict[str, Any]) -> dict[str, Any]:
    """Everything an answer holds, read now from outside the rank, with how long each part took:
    the process tree first (the workers may end with the epoch), then NVML, then numa_maps."""
    pid = int(request["pid"])
    t0 = time.monotonic()
    workers = sorted(set(processes.process_tree(pid)) - {pid})
    found: dict[str, Any] = {"affinity": processes.affinities(pid, workers)}
    t1 = time.monotonic()
    held, why = telemetry.processes_on_gpus()
    mine = {pid, *workers}
    found["gpu_processes"] = None if held is None else [
        [p, gpu, used] for gpu, processes in held.items() for p, used in processes if p in mine]
    found["gpu_processes_reason"] = why
    t2 = time.monotonic()
    if request.get("numa_dir"):
        out, label = Path(request["numa_dir"]), str(request["label"])
        shots = [numa.snapshot(pid, "rank", out, label),
                 *(numa.snapshot(w, "worker", out, label) for w in numa.children(pid))]
        found["numa"] = [s for s in shots if s is not None]
    t3 = time.monotonic()
    found["took_s"] = {"process_tree_and_affinity": t1 - t0, "gpu_processes": t2 - t1,
                       "numa_maps": t3 - t2}
    return found


class Observer:
    """Answers the requests of the ranks on this host in `trial_dir` for as long as the `with`
    block runs (a thread polling every POLL_S)."""

    def __init__(self, trial_dir: Path) -> None:
        self.trial_dir = trial_dir
        self.host = socket.gethostname()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._answered: set[Path] = set()

    def __enter__(self) -> Observer:
        write_text_atomic(marker(self.trial_dir, self.host), json.dumps({"pid": os.getpid()}))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        marker(self.trial_dir, self.host).unlink(missing_ok=True)  # no one watches any more

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self.answer_pending()

    def answer_pending(self) -> None:
        for request in sorted(self.trial_dir.glob("observe-rank*.request")):
            if request in self._answered:
                continue
            try:
                asked = json.loads(request.read_text())
            except (OSError, ValueError):  # being written: the next poll reads it
                continue
            if asked.get("host") != self.host:
                continue  # another node's rank: its own node part answers it
            self._answered.add(request)
            rank = request.name.removeprefix("observe-rank").removesuffix(".request")
            write_text_atomic(self.trial_dir / f"observed-rank{rank}.json", json.dumps(look(asked)))
