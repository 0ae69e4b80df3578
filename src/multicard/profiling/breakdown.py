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


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The union of intervals as disjoint segments (starts, ends) in time order, and for every
    input interval (in start order) the segment it belongs to."""
    if len(starts) == 0:
        empty = np.array([], dtype=np.int64)
        return empty, empty, empty
    order = np.argsort(starts, kind="stable")
    s, e = np.asarray(starts)[order], np.asarray(ends)[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0], new[1:] = True, s[1:] > reach[:-1]
    segment = np.cumsum(new) - 1
    seg_starts = s[new]
    seg_ends = np.maximum.reduceat(e, np.flatnonzero(new))
    return seg_starts, seg_ends, segment


def covered(starts: np.ndarray, ends: np.ndarray) -> int:
    seg_starts, seg_ends, _ = union(starts, ends)
    return int((seg_ends - seg_starts).sum())


def breakdown(kernels: pd.DataFrame, copies: pd.DataFrame, launches: pd.DataFrame) -> Breakdown:
    """`kernels` and `copies`: start, end, correlation; `launches`: correlation, start (the
    runtime API call that launched each operation)."""
    ops = pd.concat([kernels, copies], ignore_index=True).sort_values("start", kind="stable")
    if ops.empty:
        return Breakdown(0, 0, 0, 0, 0)
    starts, ends = ops["start"].to_numpy(np.int64), ops["end"].to_numpy(np.int64)
    seg_starts, seg_ends, segment = union(starts, ends)
    span = int(seg_ends[-1] - seg_starts[0])
    busy = covered(kernels["start"].to_numpy(np.int64), kernels["end"].to_numpy(np.int64))
    copy_only = int((seg_ends - seg_starts).sum()) - busy
    gaps = seg_starts[1:] - seg_ends[:-1]
    # the operation that ends each gap: the first of the next segment
    first = ops.assign(segment=segment).groupby("segment", sort=True).head(1).iloc[1:]
    # the earliest call per correlation id (a trace may list one twice, or none at all)
    launched = launches.dropna(subset=["correlation"]).groupby("correlation")["start"].min()
    launch = first["correlation"].map(launched).to_numpy(float)
    total_gap = int(gaps.sum())
    matched = float(gaps[~np.isnan(launch)].sum() / total_gap) if total_gap else None
    if matched is not None and matched < MIN_MATCHED:
        return Breakdown(span, busy, copy_only, None, None, matched)
    waited = np.clip(np.nan_to_num(launch - seg_ends[:-1], nan=0.0), 0, gaps)
    host = int(waited.sum())
    return Breakdown(span, busy, copy_only, host, total_gap - host, matched)
