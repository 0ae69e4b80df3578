"""Far and near DRAM traffic of each rank, counted by `perf stat` around it (numa_counters).

The NUMA hypothesis is about where memory is, so wall time alone cannot settle it: PyTorch
validated its `--numa-binding` with AMD Zen's fill counters, far vs near. Per CPU vendor:
- AMD Zen: `ls_dmnd_fills_from_sys.dram_io_far` / `..._near` (demand data-cache fills from DRAM
  or I/O of another / the same NUMA node);
- Intel (Skylake-SP and later): `mem_load_l3_miss_retired.remote_dram` / `..._local_dram`
  (retired loads served by remote / local DRAM).
`python -m multicard.measure.counters PERF_DIR -- CMD...` runs in front of a rank: it first tries the
events on `true` (perf refuses an event the CPU, the VM or the kernel does not offer without
running anything, which would fail the trial), then replaces itself with
`perf stat -x, -e FAR,NEAR --delay=-1 --control=fd:CTL,ACK -o PERF_DIR/rank<RANK>.csv -- CMD`
(children counted too: the rank's DataLoader workers): the events start disabled, and the rank
enables them where its clock starts and disables them where it stops (Window), so imports,
warm-up and evaluation are not counted. A perf without --control counts the whole rank, and says
so. Where the counters are not available it writes the reason to PERF_DIR/rank<RANK>.json and
runs CMD as it is. The runner reads both after the trial, and how the counts were taken
(`rank<RANK>.how.json`; user space only where perf fell back to `EVENT:u`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

EVENTS = {
    "AuthenticAMD": ("ls_dmnd_fills_from_sys.dram_io_far", "ls_dmnd_fills_from_sys.dram_io_near"),
    "GenuineIntel": ("mem_load_l3_miss_retired.remote_dram", "mem_load_l3_miss_retired.local_dram"),
}
DIRECTORY = "perf"  # in the trial directory
METRICS = ("far_dram_count", "near_dram_count", "far_dram_fraction")
NOT_COUNTED = ("<not supported>", "<not counted>")


def vendor(cpuinfo: str) -> str | None:
    """`vendor_id` of /proc/cpuinfo's first processor."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "vendor_id":
            return value.strip()
    return None


def event_name(field: str) -> str:
    """perf's name of a counted event -> the event asked for: `ev:u` (user-only counting, perf's
    fallback under perf_event_paranoid 2) and `cpu_core/ev/` (a hybrid Intel core's PMU) -> `ev`."""
    name = re.sub(r":[ukhHGpPI]+$", "", field.strip())
    pmu = re.fullmatch(r"[\w.-]+/([^=/,]+)/[ukhHGpPI]*", name)
    return pmu.group(1) if pmu else name


def user_only(text: str) -> bool:
    """Whether perf counted user space only: its fallback under perf_event_paranoid 2, which it
    marks by printing the events as `EVENT:u` (kernel-side fills are then not counted)."""
    # `ev:u`, and a PMU's `cpu_core/ev/u` (the modifiers after its closing slash)
    return any(re.search(r"[:/][hHGpPI]*u[hHGpPI]*$", fields[2].strip())
               for line in text.splitlines()
               if not line.startswith("#") and len(fields := line.split(",")) >= 3 and fields[2])


def parse_perf_csv(text: str) -> dict[str, int | None]:
    """`perf stat -x,` output -> {event: count}, None where perf says <not supported> or <not
    counted> (a count perf scaled for multiplexing is kept as perf printed it; the PMUs of a
    hybrid CPU are summed)."""
    counts: dict[str, int | None] = {}
    for line in text.splitlines():
        fields = line.split(",")
        if line.startswith("#") or len(fields) < 3 or not fields[2]:
            continue
        name, value = event_name(fields[2]), fields[0].strip()
        if value in NOT_COUNTED:
            counts.setdefault(name, None)
            continue
        try:
            counted = round(float(value))
        except ValueError:
            continue
        counts[name] = (counts.get(name) or 0) + counted
    return counts


def rank_counts(counts: dict[str, int | None],
                events: Sequence[str]) -> tuple[tuple[int, int] | None, str | None]:
    """(far, near) of one rank, or None and why."""
    for event in events:
        if event not in counts:
            return None, f"perf printed no count of {event}"
        if counts[event] is None:
            return None, f"{event}: <not supported> or <not counted> by this CPU, VM or kernel"
    far, near = (counts[e] for e in events)
    return (int(far or 0), int(near or 0)), None


def trial_metrics(perf_dir: Path, ranks: int) -> tuple[dict[str, Any], dict[str, str]]:
    """far_dram_count and near_dram_count summed over the trial's ranks, far_dram_fraction;
    all None with the first rank's reason where one rank has no counts."""
    total_far = total_near = 0
    for rank in range(ranks):
        found, why = _rank_file(perf_dir, rank)
        if found is None:
            return dict.fromkeys(METRICS), dict.fromkeys(METRICS, f"rank {rank}: {why}")
        total_far, total_near = total_far + found[0], total_near + found[1]
    both = total_far + total_near
    metrics = {"far_dram_count": total_far, "near_dram_count": total_near,
               "far_dram_fraction": total_far / both if both else None}
    return metrics, {} if both else {"far_dram_fraction": "no DRAM fill or load was counted"}


def how_counted(perf_dir: Path, ranks: int) -> str | None:
    """How the ranks' counts were taken, in words (a trial's measured_how): over the timed epochs
    or the whole rank, and all events or user space only; None without counts."""
    said = set()
    for rank in range(ranks):
        csv, how = perf_dir / f"rank{rank}.csv", perf_dir / f"rank{rank}.how.json"
        if not csv.exists() or not how.exists():
            return None
        window = str(json.loads(how.read_text()).get("window"))
        said.add(f"perf stat over {window}" + (", user space only (perf fell back to EVENT:u)"
                                               if user_only(csv.read_text(errors="replace")) else ""))
    return "; ".join(sorted(said)) or None


def _rank_file(perf_dir: Path, rank: int) -> tuple[tuple[int, int] | None, str]:
    csv, note = perf_dir / f"rank{rank}.csv", perf_dir / f"rank{rank}.json"
    if note.exists():
        return None, str(json.loads(note.read_text())["reason"])
    if not csv.exists():
        return None, "no perf output (the rank ended before perf wrote it)"
    try:
        written = json.loads((perf_dir / f"rank{rank}.events.json").read_text())
    except (OSError, ValueError) as exc:
        return None, f"the rank's list of counted events is unreadable ({exc})"
    found, why = rank_counts(parse_perf_csv(csv.read_text(errors="replace")), written)
    return found, str(why)


def usable_events() -> tuple[tuple[str, str] | None, str | None]:
    """The far/near events of this CPU if perf can count them here, else None and why."""
    if shutil.which("perf") is None:
        return None, "perf is not installed"
    try:
        found = vendor(Path("/proc/cpuinfo").read_text())
    except OSError as exc:
        return None, f"/proc/cpuinfo: {exc.strerror}"
    events = EVENTS.get(found or "")
    if events is None:
        return None, f"no far/near DRAM events known for CPU vendor {found!r}"
    try:
        tried = subprocess.run(["perf", "stat", "-x", ",", "-e", ",".join(events), "--", "true"],
                               capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"perf stat could not be run here: {exc}"
    return probe_verdict(events, tried.returncode, tried.stderr)


def probe_verdict(events: tuple[str, str], returncode: int, stderr: str
                  ) -> tuple[tuple[str, str] | None, str | None]:
    """What `perf stat -x, -e EVENTS -- true` said: the events if it counted both, else why not."""
    if returncode != 0:
        first = next((line.strip() for line in stderr.splitlines() if line.strip()), "")
        return None, f"perf stat cannot count {', '.join(events)} here: {first}"
    _, why = rank_counts(parse_perf_csv(stderr), events)
    return (events, None) if why is None else (None, why)


def has_control() -> bool:
    """Whether this perf can start with its events disabled and take enable/disable commands."""
    try:
        shown = subprocess.run(["perf", "stat", "-h"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    text = shown.stdout + shown.stderr
    return "--control" in text and "--delay" in text


def perf_argv(events: Sequence[str], csv: Path, control: tuple[int, int] | None,
              command: Sequence[str]) -> list[str]:
    """perf stat around the rank; with `control` (its command and acknowledgement fds) the
    events start disabled, for the rank to enable over its timed epochs (Window)."""
    window = ["--delay=-1", f"--control=fd:{control[0]},{control[1]}"] if control else []
    return ["perf", "stat", "-x", ",", "-e", ",".join(events), *window, "-o", str(csv), "--", *command]


CONTROL_ENV = "MULTICARD_PERF_CONTROL"  # "CTL_FD,ACK_FD": the rank's ends of perf's control pipes
# where the rank says its window failed: the note that makes the rank's counts null with the reason
NOTE_ENV = "MULTICARD_PERF_NOTE"


def prepare(out: Path, rank: str, events: Sequence[str], control: bool,
            command: Sequence[str]) -> tuple[list[str], list[int], dict[str, str]]:
    """(perf's argv, the fds it and the rank must inherit, the rank's environment additions).
    With `control`, two pipes: perf reads commands from one and writes acknowledgements to the
    other, the rank holds the other ends (no file: a FIFO in the trial directory would be a
    special file there, which `verify` rightly refuses)."""
    (out / f"rank{rank}.events.json").write_text(json.dumps(list(events)))
    window = "the timed epochs" if control else "the whole rank (this perf has no --control)"
    (out / f"rank{rank}.how.json").write_text(json.dumps({"window": window}))
    if not control:
        return perf_argv(events, out / f"rank{rank}.csv", None, command), [], {}
    ctl_read, ctl_write = os.pipe()
    ack_read, ack_write = os.pipe()
    fds = [ctl_read, ctl_write, ack_read, ack_write]
    for fd in fds:
        os.set_inheritable(fd, True)
    argv = perf_argv(events, out / f"rank{rank}.csv", (ctl_read, ack_write), command)
    return argv, fds, {CONTROL_ENV: f"{ctl_write},{ack_read}", NOTE_ENV: str(out / f"rank{rank}.json")}


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: python -m multicard.measure.counters PERF_DIR -- CMD...")
    out, command = Path(argv[0]), argv[2:]
    rank = os.environ.get("RANK", "0")
    out.mkdir(parents=True, exist_ok=True)
    events, why = usable_events()
    if events is None:
        (out / f"rank{rank}.json").write_text(json.dumps({"reason": why}))
        os.execvp(command[0], command)
    perf, _, env = prepare(out, rank, events, has_control(), command)
    os.environ.update(env)
    os.execvp("perf", perf)


class Window:
    """perf stat's counters over the timed epochs only: enabled where the rank's clock starts,
    disabled where it stops, through the control fds perf handed down (CONTROL_ENV); nothing
    where the rank runs without them. Entered with the rank's other meters (timing.start_together)."""

    ACK_TIMEOUT_S = 10.0

    def __init__(self, environ: Mapping[str, str] = os.environ) -> None:
        found = environ.get(CONTROL_ENV)
        self.fds = tuple(int(fd) for fd in found.split(",")) if found else None
        self.note = Path(environ[NOTE_ENV]) if environ.get(NOTE_ENV) else None
        self.error: str | None = None

    def __enter__(self) -> Window:
        return self

    def mark_start(self) -> None:
        self._send(b"enable\n")

    def __exit__(self, *exc: object) -> None:
        self._send(b"disable\n")

    def _send(self, command: bytes) -> None:
        """The command, then perf's acknowledgement ("ack\n"): the counters are on (off) once
        this returns."""
        if self.fds is None or self.error:
            return
        import select

        ctl, ack = self.fds
        os.write(ctl, command)
        ready, _, _ = select.select([ack], [], [], self.ACK_TIMEOUT_S)
        if not ready:
            # counts over an unknown window are no counts: said, not kept as "the timed epochs"
            said = command.decode().strip()
            self.error = f"perf did not acknowledge {said!r} within {self.ACK_TIMEOUT_S:g} s"
            if self.note is not None:
                self.note.write_text(json.dumps({"reason": self.error}))
            return
        os.read(ack, 16)


if __name__ == "__main__":
    main(sys.argv[1:])
