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


OP_COLUMNS = ("start", "end", "process", "device", "correlation")


def breakdown(kernels: pd.DataFrame, copies: pd.DataFrame, launches: pd.DataFrame) -> Breakdown:
    """One device's timeline. `kernels` and `copies`: start, end, correlation; `launches`:
    correlation, start (the API call that launched each operation). Correlation 0 or missing
    means "not known": CUPTI numbers correlations from 1."""
    def column(frame: pd.DataFrame, name: str, dtype: type) -> np.ndarray:
        return pd.to_numeric(frame[name]).to_numpy(dtype, na_value=0) if len(frame) else np.array([], dtype)

    k_starts, k_ends = column(kernels, "start", np.int64), column(kernels, "end", np.int64)
    starts = np.concatenate([k_starts, column(copies, "start", np.int64)])
    if not len(starts):
        return Breakdown(0, 0, 0, 0, 0)
    order = np.argsort(starts, kind="stable")
    starts = starts[order]
    ends = np.concatenate([k_ends, column(copies, "end", np.int64)])[order]
    correlation = np.concatenate([column(kernels, "correlation", np.int64),
                                  column(copies, "correlation", np.int64)])[order]
    seg_starts, seg_ends, segment = union(starts, ends)
    span = int(seg_ends[-1] - seg_starts[0])
    busy = covered(k_starts, k_ends)
    copy_only = int((seg_ends - seg_starts).sum()) - busy
    gaps = seg_starts[1:] - seg_ends[:-1]
    # the operation that ends each gap: the first (in start order) of the next segment
    first = np.flatnonzero(np.diff(segment)) + 1
    launch = earliest_launch(correlation[first], column(launches, "correlation", np.int64),
                             column(launches, "start", np.int64))
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
    keep = (correlation > 0) & np.isin(correlation, wanted)
    correlation, start = correlation[keep], start[keep]
    order = np.lexsort((start, correlation))
    correlation, start = correlation[order], start[order]
    first = np.ones(len(correlation), dtype=bool)
    first[1:] = correlation[1:] != correlation[:-1]
    correlation, start = correlation[first], start[first]
    found = np.full(len(wanted), np.nan)
    if len(correlation):
        at = np.minimum(np.searchsorted(correlation, wanted), len(correlation) - 1)
        hit = (correlation[at] == wanted) & (wanted > 0)
        found[hit] = start[at[hit]]
    return found


def per_device(kernels: pd.DataFrame, copies: pd.DataFrame,
               launches: pd.DataFrame) -> dict[tuple[int, int], Breakdown]:
    """{(process, device): its timeline's breakdown}. Operations have OP_COLUMNS, launches
    process, correlation, start: a correlation id names a launch only within its process."""
    devices = pd.concat([kernels[["process", "device"]].drop_duplicates(),
                         copies[["process", "device"]].drop_duplicates()]).drop_duplicates()
    one = len(devices) == 1 and set(launches["process"].unique()) <= {devices.iloc[0]["process"]}
    found = {}
    for process, device in sorted(devices.astype(np.int64).itertuples(index=False, name=None)):
        # one device and one process (a trace per rank, as the runner writes): nothing to filter
        mine = (kernels, copies, launches) if one else (
            _on(kernels, process, device), _on(copies, process, device),
            launches[launches["process"] == process])
        found[(int(process), int(device))] = breakdown(*mine)
    return found


def _on(ops: pd.DataFrame, process: int, device: int) -> pd.DataFrame:
    return ops[(ops["process"] == process) & (ops["device"] == device)]
