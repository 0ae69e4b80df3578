"""Where a GPU's time went over a trace, in the spirit of HTA's idle-time breakdown.

Over the span from the first device operation to the last, every instant is one of:
- busy: a kernel runs;
- copy: a memory copy runs and no kernel does (the GPU waits on a copy);
- host: nothing runs and the next operation had not yet been launched by the host (the launch
  API call started after the GPU fell idle): the GPU waits on the host;
- idle: nothing runs though the next operation was launched (a dependency, a synchronisation,
  or a launch whose record is missing).
The four add up to the span. Host and idle are told apart only where the launch of the operation
after a gap is in the trace; where that covers under half of the gap time (copies without a
correlation id, launches through the driver API the trace did not record) both are None, and
`matched` says how much was covered. Pure numpy/pandas on interval arrays (nanoseconds); the trace
parsers feed them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

MIN_MATCHED = 0.5
DENSE_IDS = 4  # ids at most this many times the launches: looked up in a table


@dataclass(frozen=True)
class Breakdown:
    span_ns: int
    busy_ns: int
    copy_ns: int
    host_ns: int | None
    idle_ns: int | None
    matched: float | None = None  # the share of gap time whose next operation's launch is known

    def fractions(self) -> dict[str, float | None]:
        parts = {"busy": self.busy_ns, "copy": self.copy_ns, "host": self.host_ns, "idle": self.idle_ns}
        return {k: (v / self.span_ns if self.span_ns and v is not None else None)
                for k, v in parts.items()}


@dataclass(frozen=True)
class Ops:
    """GPU operations of one kind (kernels, or copies and memsets) as parallel int64 arrays;
    `timeline` is timeline_key(process, device) of each, where the trace has more than one."""
    start: np.ndarray
    end: np.ndarray
    correlation: np.ndarray
    timeline: np.ndarray | None = None

    def where(self, keep: np.ndarray) -> Ops:
        return Ops(self.start[keep], self.end[keep], self.correlation[keep],
                   None if self.timeline is None else self.timeline[keep])


@dataclass(frozen=True)
class Launches:
    """The API calls that launched operations: their correlation id, start and process (where
    the trace has more than one)."""
    correlation: np.ndarray
    start: np.ndarray
    process: np.ndarray | None = None

    def where(self, keep: np.ndarray) -> Launches:
        return Launches(self.correlation[keep], self.start[keep],
                        None if self.process is None else self.process[keep])


DEVICE_BITS = 16


def timeline_key(process: np.ndarray | int, device: np.ndarray | int) -> np.ndarray:
    """One int64 per (process, device): process ids fit in 24 bits, device ids in 16."""
    return (np.asarray(process, np.int64) << DEVICE_BITS) | np.asarray(device, np.int64)


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The union of intervals as disjoint segments (starts, ends) in time order, and for every
    input interval (in start order) the segment it belongs to."""
    order = np.argsort(starts, kind="stable")
    seg_starts, seg_ends, first = _sorted_union(np.asarray(starts)[order], np.asarray(ends)[order])
    segment = np.zeros(len(order), dtype=np.int64)
    segment[first[1:]] = 1
    return seg_starts, seg_ends, np.cumsum(segment)


def _sorted_union(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Segments of intervals already in start order, and the index of each segment's first
    interval. An interval that starts where the reach so far ends touches it: no gap."""
    if not len(s):
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    np.greater(s[1:], reach[:-1], out=new[1:])
    first = np.flatnonzero(new)
    return s[first], np.maximum.reduceat(e, first), first


def covered(starts: np.ndarray, ends: np.ndarray) -> int:
    seg_starts, seg_ends, _ = union(starts, ends)
    return int((seg_ends - seg_starts).sum())


OP_COLUMNS = ("start", "end", "process", "device", "correlation")


def breakdown(kernels: pd.DataFrame, copies: pd.DataFrame, launches: pd.DataFrame) -> Breakdown:
    """One device's timeline. `kernels` and `copies`: start, end, correlation; `launches`:
    correlation, start (the API call that launched each operation). Correlation 0 or missing
    means "not known": CUPTI numbers correlations from 1."""
    return timeline(_ops(kernels), _ops(copies), _launches(launches))


def timeline(kernels: Ops, copies: Ops, launches: Launches) -> Breakdown:
    """One (process, device)'s breakdown from its operations and its process's launches."""
    starts = np.concatenate([kernels.start, copies.start])
    if not len(starts):
        return Breakdown(0, 0, 0, 0, 0)
    # each kind is usually in time order already: a stable sort then merges two runs
    order = np.argsort(starts, kind="stable")
    starts = starts[order]
    ends = np.concatenate([kernels.end, copies.end])[order]
    seg_starts, seg_ends, first = _sorted_union(starts, ends)
    is_kernel = order < len(kernels.start)
    k_starts, k_ends, _ = _sorted_union(starts[is_kernel], ends[is_kernel])
    busy = int((k_ends - k_starts).sum())
    span = int(seg_ends[-1] - seg_starts[0])
    copy_only = int((seg_ends - seg_starts).sum()) - busy
    gaps = seg_starts[1:] - seg_ends[:-1]
    # the operation that ends each gap is the first of the next segment
    after_gap = order[first[1:]]
    correlation = np.concatenate([kernels.correlation, copies.correlation])[after_gap]
    launch = earliest_launch(correlation, launches.correlation, launches.start)
    total_gap = int(gaps.sum())
    matched = float(gaps[~np.isnan(launch)].sum() / total_gap) if total_gap else None
    if matched is not None and matched < MIN_MATCHED:
        return Breakdown(span, busy, copy_only, None, None, matched)
    waited = np.clip(np.nan_to_num(launch - seg_ends[:-1], nan=0.0), 0, gaps)
    host = int(waited.sum())
    return Breakdown(span, busy, copy_only, host, total_gap - host, matched)


def earliest_launch(wanted: np.ndarray, correlation: np.ndarray, start: np.ndarray) -> np.ndarray:
    """For each wanted correlation id, the start of the earliest call carrying it (a trace may
    list one twice), NaN where none does or the id is 0 (unknown)."""
    correlation, start = np.asarray(correlation, np.int64), np.asarray(start, np.int64)
    if (correlation <= 0).any():
        known = correlation > 0
        correlation, start = correlation[known], start[known]
    # calls are numbered in the order they are made, so the ids usually come sorted and unique
    if len(correlation) > 1 and not (correlation[1:] > correlation[:-1]).all():
        order = np.argsort(correlation, kind="stable")
        correlation, start = correlation[order], start[order]
        first = np.flatnonzero(np.concatenate([[True], correlation[1:] != correlation[:-1]]))
        correlation, start = correlation[first], np.minimum.reduceat(start, first)
    found = np.full(len(wanted), np.nan)
    if not len(correlation):
        return found
    top = int(correlation[-1])
    if top <= DENSE_IDS * len(correlation) + 1024:
        # ids numbered densely from 1 (CUPTI's way): a table indexed by id beats a binary search
        # (2.9 M launches, 5 M lookups: 0.03 s against 0.24 s)
        table = np.full(top + 1, np.nan)
        table[correlation] = start
        inside = (wanted > 0) & (wanted <= top)
        found[inside] = table[wanted[inside]]
        return found
    at = np.minimum(np.searchsorted(correlation, wanted), len(correlation) - 1)
    hit = (correlation[at] == wanted) & (wanted > 0)
    found[hit] = start[at[hit]]
    return found


def per_device(kernels: pd.DataFrame, copies: pd.DataFrame,
               launches: pd.DataFrame) -> dict[tuple[int, int], Breakdown]:
    """{(process, device): its timeline's breakdown}. Operations have OP_COLUMNS, launches
    process, correlation, start: a correlation id names a launch only within its process."""
    ops, others, calls = _ops(kernels), _ops(copies), _launches(launches)
    assert ops.timeline is not None and others.timeline is not None and calls.process is not None
    keys = np.concatenate([ops.timeline, others.timeline])
    if not len(keys):
        return {}
    if keys.min() == keys.max() and (calls.process == keys[0] >> DEVICE_BITS).all():
        # one device and one process (a trace per rank, as the runner writes): nothing to filter
        return {pair(int(keys[0])): timeline(ops, others, calls)}
    return per_timeline(ops, others, calls)


def per_timeline(kernels: Ops, copies: Ops, launches: Launches) -> dict[tuple[int, int], Breakdown]:
    """{(process, device): breakdown} from operations whose `timeline` is set and launches whose
    `process` is."""
    assert kernels.timeline is not None and copies.timeline is not None and launches.process is not None
    keys = np.concatenate([kernels.timeline, copies.timeline])
    found = {}
    for key in np.unique(keys).tolist():
        found[pair(key)] = timeline(kernels.where(kernels.timeline == key),
                                    copies.where(copies.timeline == key),
                                    launches.where(launches.process == key >> DEVICE_BITS))
    return found


def pair(key: int) -> tuple[int, int]:
    return key >> DEVICE_BITS, key & ((1 << DEVICE_BITS) - 1)


def _column(frame: pd.DataFrame, name: str) -> np.ndarray:
    if not len(frame) or name not in frame:
        return np.zeros(len(frame), dtype=np.int64)
    return pd.to_numeric(frame[name]).to_numpy(np.int64, na_value=0)


def _ops(frame: pd.DataFrame) -> Ops:
    return Ops(_column(frame, "start"), _column(frame, "end"), _column(frame, "correlation"),
               timeline_key(_column(frame, "process"), _column(frame, "device")))


def _launches(frame: pd.DataFrame) -> Launches:
    return Launches(_column(frame, "correlation"), _column(frame, "start"), _column(frame, "process"))
