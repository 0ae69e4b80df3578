"""Traces -> the paper's Nsight metrics (docs/design.md "Trace summary"), for nsys SQLite and Kineto JSON.

A trace of a 20-epoch run holds millions of rows, so each activity table is read once, only the
columns the summary needs, as arrays (profiling/activity.py: connectorx, the tables cut into
rowid ranges read on every core), and every total and the GPU timeline breakdown are computed
from those arrays with numpy (benchmarks/trace_parse.py measures it).

nsys SQLite (`nsys export --type sqlite`), any version from 2021 on:
- names come from `StringIds(id, value)`, or from the older `StringTable(_id_, value)`;
- a table that is missing counts as zero (exports create tables lazily, only for data they have);
- runtime API names count after stripping the version suffix and the per-thread-stream suffix
  (`cudaLaunchKernel_v7000`, `cudaLaunchKernel_ptsz_v7000` -> `cudaLaunchKernel`; the similar
  `cudaLaunchKernelExC` is another function);
- rows of CUPTI_ACTIVITY_KIND_RUNTIME whose eventClass is TRACE_PROCESS_EVENT_CUDABACKTRACE (67)
  repeat a call's interval and correlation id to carry its stack; they are not calls and are
  not counted;
- copy direction and source memory come from ENUM_CUDA_MEMCPY_OPER / ENUM_CUDA_MEM_KIND when the
  export has them, else from nsys's own numbering (HtoD 1, DtoH 2; pageable 0, pinned 1; note that
  CUPTI numbers memory kinds differently, pageable 1, pinned 2);
- correlation ids repeat across processes: an operation is joined to its launch by (process,
  correlation id), and the GPU timeline is broken down per (process, device);
- text that is not valid UTF-8 is decoded with replacement characters.

Kineto (PyTorch profiler) Chrome traces, plain or gzipped: categories `cuda_runtime`, `kernel`,
`gpu_memcpy` (direction and memory kind from the name, `Memcpy HtoD (Pinned -> Device)`, bytes
from `args.bytes`); `ts`/`dur` are microseconds, turned into integer nanoseconds per event.

Pauses before epochs come from the workload's ranges (NVTX in nsys, record_function in Kineto):
for each `epoch_start <e>` marker, the gap from the end of the last `step` before it (or from the
marker itself) to the start of the first `step` after it: `epoch_pauses_ns` = {epoch: ns} for
the epochs the trace covers.
"""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
import zlib
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pandas as pd

from multicard.errors import InputError
from multicard.profiling import activity, breakdown

API_METRICS = {
    "cudaLaunchKernel": "cuda_launch_kernel",
    "cudaStreamSynchronize": "cuda_stream_synchronize",
    "cudaEventSynchronize": "cuda_event_synchronize",
    "cudaEventDestroy": "cuda_event_destroy",
    "cudaMemcpyAsync": "cuda_memcpy_async",
}
COPY_METRICS = ("memcpy_htod", "memcpy_dtoh", "memcpy_htod_pageable", "memcpy_htod_pinned")
COUNTED = ("kernel", "nccl_kernel", *API_METRICS.values())
_API_SUFFIX = re.compile(r"(?:_v\d+)?$")
_PER_THREAD = re.compile(r"_pt(?:sz|ds)$")
# nsys numbering, used when an export carries no ENUM tables
NSYS_COPY_KIND = {"CUDA_MEMCPY_KIND_HTOD": 1, "CUDA_MEMCPY_KIND_DTOH": 2}
NSYS_MEM_KIND = {"CUDA_MEMOPR_MEMORY_KIND_PAGEABLE": 0, "CUDA_MEMOPR_MEMORY_KIND_PINNED": 1}
BACKTRACE_EVENT_CLASS = ("TRACE_PROCESS_EVENT_CUDABACKTRACE", 67)
NVTX_RANGE_TYPES = (59, 60, 70, 71)  # push/pop, start/end, and their NVTXT-imported forms
EPOCH_MARKER, STEP_RANGE = "epoch_start", "step"
_MARKER = re.compile(rf"^{EPOCH_MARKER} (\d+)$")
SQLITE_MAGIC, GZIP_MAGIC = b"SQLite format 3\x00", b"\x1f\x8b"


def api_name(raw: str) -> str:
    """`cudaLaunchKernel_ptsz_v7000` -> `cudaLaunchKernel`; other names keep their body."""
    return _PER_THREAD.sub("", _API_SUFFIX.sub("", raw, count=1))


def empty_summary(fmt: str) -> dict[str, Any]:
    summary: dict[str, Any] = {"format": fmt}
    for name in COPY_METRICS:
        summary |= {f"{name}_count": 0, f"{name}_bytes": 0, f"{name}_ns": 0}
    for name in COUNTED:
        summary |= {f"{name}_count": 0, f"{name}_ns": 0}
    summary["epoch_pauses_ns"] = {}
    # the GPU timeline's breakdown (profiling.breakdown): None where the trace has no GPU work
    summary |= dict.fromkeys(BREAKDOWN_KEYS)
    summary["gpu_timelines"] = []
    return summary


BREAKDOWN_KEYS = ("gpu_span_ns", "gpu_busy_ns", "gpu_copy_ns", "gpu_host_wait_ns", "gpu_idle_ns",
                  "gpu_launch_matched")
# summary entries that are not one number per rank (tables average the rest)
NOT_NUMBERS = ("format", "epoch_pauses_ns", "gpu_timelines")


def breakdown_metrics(found: breakdown.Breakdown) -> dict[str, float | None]:
    if not found.span_ns:
        return dict.fromkeys(BREAKDOWN_KEYS)
    return dict(zip(BREAKDOWN_KEYS, (found.span_ns, found.busy_ns, found.copy_ns, found.host_ns,
                                     found.idle_ns, found.matched), strict=True))


def device_metrics(found: dict[tuple[int, int], breakdown.Breakdown]) -> dict[str, Any]:
    """Each (process, device) timeline in `gpu_timelines`, and their sum in the top-level keys
    (host wait and idle only where every timeline tells them apart)."""
    timelines = [{"process": p, "device": d, **breakdown_metrics(b)} for (p, d), b in found.items()]
    parts = list(found.values())
    if not parts or not sum(b.span_ns for b in parts):
        return {**dict.fromkeys(BREAKDOWN_KEYS), "gpu_timelines": timelines}
    gaps = [b.span_ns - b.busy_ns - b.copy_ns for b in parts]
    split = all(b.host_ns is not None for b in parts)
    matched = (sum(g * (b.matched or 0.0) for g, b in zip(gaps, parts, strict=True)) / sum(gaps)
               if sum(gaps) else None)
    total = breakdown.Breakdown(
        sum(b.span_ns for b in parts), sum(b.busy_ns for b in parts), sum(b.copy_ns for b in parts),
        sum(b.host_ns or 0 for b in parts) if split else None,
        sum(b.idle_ns or 0 for b in parts) if split else None, matched)
    return {**breakdown_metrics(total), "gpu_timelines": timelines}


def summarize(path: Path) -> dict[str, Any]:
    """One trace file -> metrics; InputError (exit 2) for a file that is neither format."""
    if path.exists() and not path.is_file():
        raise InputError(f"{path}: not a regular file (a FIFO or device is never read)")
    try:
        with path.open("rb") as f:
            head = f.read(16)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    if head.startswith(SQLITE_MAGIC):
        return summarize_nsys(path)
    if head.startswith(GZIP_MAGIC):
        try:
            with gzip.open(path, "rb") as f:
                inner = f.read(16)
            if inner.startswith(SQLITE_MAGIC):
                return _with_unpacked_sqlite(path)
        except (EOFError, OSError, zlib.error) as exc:  # BadGzipFile is an OSError
            raise InputError(f"{path}: a corrupt or truncated gzip file ({exc})") from None
        return summarize_kineto(_load_json(path, gzipped=True), path)
    if head.lstrip()[:1] in (b"{", b"["):
        return summarize_kineto(_load_json(path, gzipped=False), path)
    raise InputError(f"{path}: neither an nsys SQLite export nor a Kineto JSON trace")


# --- nsys SQLite -----------------------------------------------------------------------------

KERNELS, RUNTIME = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMCPY, MEMSET = "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"


def summarize_nsys(path: Path) -> dict[str, Any]:
    # quoted: a run directory named "run #1?" would otherwise end the file name early
    db = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True)
    db.text_factory = lambda raw: raw.decode("utf-8", errors="replace")
    try:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables & {"StringIds", "StringTable"} and not any(t.startswith("CUPTI_") for t in tables):
            raise InputError(f"{path}: an SQLite file without nsys tables")
        strings = _string_table(tables)
        names = dict(db.execute(f"SELECT id, value FROM {strings}").fetchall())
        columns = {t: _columns(db, t) for t in (KERNELS, RUNTIME, MEMCPY, MEMSET) if t in tables}
        backtrace = _backtrace_class(db, tables)
        copy_codes = _copy_codes(db, tables)
        pauses = _nsys_pauses(db, tables, strings)
    except sqlite3.DatabaseError as exc:
        raise InputError(f"{path}: unreadable SQLite ({exc})") from None
    finally:
        db.close()
    selects = _activity_selects(columns, backtrace, names, copy_codes)
    kernels, runtime, copies, memsets = activity.read_tables(path, selects)
    summary = empty_summary("nsys-sqlite")
    tallies = [_combined(read.tallies) for read in (kernels, runtime, copies, memsets)]
    summary |= {k: v for tally in tallies for k, v in tally.items() if not k.startswith(_RANGE)}
    summary["epoch_pauses_ns"] = pauses
    summary |= _nsys_breakdown(path, selects, [read.kept for read in (kernels, runtime, copies, memsets)],
                               tallies)
    return summary


# What the summary takes of each row of each activity table (a column an export lacks reads 0),
# and which of those it keeps whole for the GPU breakdown; the rest is tallied slice by slice.
ACTIVITY_COLUMNS = {
    KERNELS: ("start", "end", "correlation", "name", "timeline"),
    RUNTIME: ("start", "end", "correlation", "nameId", "process"),
    MEMCPY: ("start", "end", "correlation", "copyKind", "srcKind", "bytes", "timeline"),
    MEMSET: ("start", "end", "correlation", "timeline"),
}
KEPT = {KERNELS: ("start", "end", "correlation"), RUNTIME: ("start", "correlation"),
        MEMCPY: ("start", "end", "correlation"), MEMSET: ("start", "end", "correlation")}
# nsys's globalPid/globalTid hold the process id in bits 24-47
_PROCESS = "COALESCE(({} >> 24) & 16777215, 0)"
# tally entries that are a range (lowest_*, highest_*), not a sum
_RANGE = ("lowest_", "highest_")


def _activity_selects(columns: dict[str, set[str]], backtrace: int, names: dict[int, str],
                      copy_codes: dict[str, int | None]) -> list[activity.Select]:
    """One select per activity table (an absent table reads as an empty one); an operation's
    (process, device) comes as one timeline key, computed by SQLite: one column handed over
    instead of two, and only its range is kept (a trace per rank has one timeline)."""
    tallies = {KERNELS: partial(_kernel_tally, [i for i, v in names.items() if "nccl" in v.lower()]),
               RUNTIME: partial(_runtime_tally, *_api_lookup(names)),
               MEMCPY: partial(_copy_tally, copy_codes), MEMSET: _range_tally}
    selects = []
    for table, wanted in ACTIVITY_COLUMNS.items():
        present = columns.get(table, set())
        exprs = {name: _activity_expr(name, present) for name in wanted}
        where = f"eventClass != {backtrace}" if table == RUNTIME and "eventClass" in present else ""
        selects.append(activity.Select(table if table in columns else None, exprs, where,
                                       KEPT[table], tallies[table]))
    return selects


def _activity_expr(name: str, present: set[str]) -> str:
    if name == "name":
        return next((c for c in ("demangledName", "shortName", "name") if c in present), "0")
    if name == "correlation":
        return "correlationId" if "correlationId" in present else "0"
    if name == "process":
        return _PROCESS.format("globalTid") if "globalTid" in present else "0"
    if name == "timeline":
        process = _PROCESS.format("globalPid") if "globalPid" in present else "0"
        device = "COALESCE(deviceId, 0)" if "deviceId" in present else "0"
        return f"{process} * {1 << breakdown.DEVICE_BITS} + {device}"
    return name if name in present else "0"


def _combined(tallies: list[activity.Tally]) -> activity.Tally:
    """Slices' tallies as one: sums added, ranges widened."""
    out: activity.Tally = {}
    for tally in tallies:
        for key, value in tally.items():
            if key not in out:
                out[key] = value
            elif key.startswith("lowest_"):
                out[key] = min(out[key], value)
            else:
                out[key] = max(out[key], value) if key.startswith("highest_") else out[key] + value
    return out


def _range_tally(rows: activity.Columns) -> activity.Tally:
    key = "timeline" if "timeline" in rows else "process"
    if not len(rows[key]):
        return {}
    return {f"lowest_{key}": int(rows[key].min()), f"highest_{key}": int(rows[key].max())}


def _nsys_breakdown(path: Path, selects: list[activity.Select], kept: list[activity.Columns],
                    tallies: list[activity.Tally]) -> dict[str, Any]:
    """The GPU timeline of kernels, copies and memsets of each (process, device) against the
    runtime calls that launched them: correlation ids are unique within a process only. Where
    the tallies show more than one timeline (or launches of other processes), their keys are
    read in a second pass."""
    kernels, runtime, copies, memsets = kept
    ops_ranges = [t for t in (tallies[0], tallies[2], tallies[3]) if "lowest_timeline" in t]
    if not ops_ranges:
        return device_metrics({})
    low = min(t["lowest_timeline"] for t in ops_ranges)
    one = all(t["lowest_timeline"] == t["highest_timeline"] == low for t in ops_ranges) and (
        "lowest_process" not in tallies[1]
        or tallies[1]["lowest_process"] == tallies[1]["highest_process"] == low >> breakdown.DEVICE_BITS)
    if one:  # a trace per rank, as the runner writes: one timeline, nothing to filter
        found = breakdown.timeline(_ops(kernels), _ops(copies, memsets),
                                   breakdown.Launches(runtime["correlation"], runtime["start"]))
        return device_metrics({breakdown.pair(low): found})
    keys = [read.kept for read in activity.read_tables(path, [_key_only(s) for s in selects])]
    return device_metrics(breakdown.per_timeline(
        _ops(kernels, timelines=[keys[0]]), _ops(copies, memsets, timelines=[keys[2], keys[3]]),
        breakdown.Launches(runtime["correlation"], runtime["start"], keys[1]["process"])))


def _key_only(select: activity.Select) -> activity.Select:
    """The select reading nothing but its timeline (or, for launches, process) key, kept whole."""
    key = "process" if "process" in select.columns else "timeline"
    return replace(select, columns={key: select.columns[key]}, keep=(key,), tally=None)


def _ops(*tables: activity.Columns, timelines: list[activity.Columns] | None = None) -> breakdown.Ops:
    def joined(parts: list[np.ndarray]) -> np.ndarray:
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    return breakdown.Ops(*(joined([t[name] for t in tables]) for name in ("start", "end", "correlation")),
                         joined([t["timeline"] for t in timelines]) if timelines else None)


def _string_table(tables: set[str]) -> str:
    """A subquery yielding (id, value) from whichever string table the export has."""
    if "StringIds" in tables:
        return "(SELECT id, value FROM StringIds)"
    if "StringTable" in tables:
        return "(SELECT _id_ AS id, value FROM StringTable)"
    return "(SELECT NULL AS id, NULL AS value WHERE 0)"


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


def _durations(rows: activity.Columns) -> np.ndarray:
    return rows["end"] - rows["start"]


def _total(durations: np.ndarray, selected: np.ndarray | None = None) -> tuple[int, int]:
    """(count, summed duration in ns) of the selected rows."""
    if selected is not None:
        durations = durations[selected]
    return len(durations), int(durations.sum())


def _kernel_tally(nccl: list[int], kernels: activity.Columns) -> activity.Tally:
    if not len(kernels["start"]):
        return {}
    durations = _durations(kernels)
    out = dict(zip(("kernel_count", "kernel_ns"), _total(durations), strict=True))
    if nccl:
        found = _total(durations, np.isin(kernels["name"], nccl))
        out |= dict(zip(("nccl_kernel_count", "nccl_kernel_ns"), found, strict=True))
    return out | _range_tally({"timeline": kernels["timeline"]})


def _api_lookup(names: dict[int, str]) -> tuple[np.ndarray, list[str]]:
    """A metric number per string id (-1: none), looked up by array index: a dict lookup per row
    of a multi-million-row table would cost more than reading it; and the metrics' names."""
    metric_of = {i: m for i, v in names.items()
                 if v.startswith("cuda") and (m := API_METRICS.get(api_name(v)))}
    metrics = sorted(set(metric_of.values()))
    lookup = np.full(max(names, default=0) + 2, -1)
    for i, metric in metric_of.items():
        lookup[i] = metrics.index(metric)
    return lookup, metrics


def _runtime_tally(lookup: np.ndarray, metrics: list[str], runtime: activity.Columns) -> activity.Tally:
    if not len(runtime["start"]):
        return {}
    ids = runtime["nameId"]
    codes = lookup[np.where((ids >= 0) & (ids < len(lookup)), ids, -1)]
    durations = _durations(runtime)
    out = {}
    for k, metric in enumerate(metrics):
        out[f"{metric}_count"], out[f"{metric}_ns"] = _total(durations, codes == k)
    return out | _range_tally({"process": runtime["process"]})


def _backtrace_class(db: sqlite3.Connection, tables: set[str]) -> int:
    name, default = BACKTRACE_EVENT_CLASS
    if "ENUM_NSYS_EVENT_CLASS" in tables:
        row = db.execute("SELECT id FROM ENUM_NSYS_EVENT_CLASS WHERE name = ?", (name,)).fetchone()
        if row:
            return int(row[0])
    return default


def _enum(db: sqlite3.Connection, tables: set[str], table: str, wanted: dict[str, int]) -> dict[str, int]:
    if table not in tables:
        return dict(wanted)
    found = dict(db.execute(f"SELECT name, id FROM {table}").fetchall())
    return {name: int(found.get(name, default)) for name, default in wanted.items()}


def _copy_codes(db: sqlite3.Connection, tables: set[str]) -> dict[str, int | None]:
    kinds = _enum(db, tables, "ENUM_CUDA_MEMCPY_OPER", NSYS_COPY_KIND)
    mem = _enum(db, tables, "ENUM_CUDA_MEM_KIND", NSYS_MEM_KIND)
    has_source = MEMCPY in tables and "srcKind" in _columns(db, MEMCPY)
    return {"htod": kinds["CUDA_MEMCPY_KIND_HTOD"], "dtoh": kinds["CUDA_MEMCPY_KIND_DTOH"],
            "pageable": mem["CUDA_MEMOPR_MEMORY_KIND_PAGEABLE"] if has_source else None,
            "pinned": mem["CUDA_MEMOPR_MEMORY_KIND_PINNED"] if has_source else None}


def _copy_tally(codes: dict[str, int | None], copies: activity.Columns) -> activity.Tally:
    if not len(copies["start"]):
        return {}
    kind, source = copies["copyKind"], copies["srcKind"]
    htod = kind == codes["htod"]
    selections = {"memcpy_htod": htod, "memcpy_dtoh": kind == codes["dtoh"],
                  "memcpy_htod_pageable": htod & (source == codes["pageable"]),
                  "memcpy_htod_pinned": htod & (source == codes["pinned"])}
    return _copy_totals(copies, selections) | _range_tally({"timeline": copies["timeline"]})


def _copy_totals(copies: activity.Columns, selections: dict[str, np.ndarray]) -> dict[str, int]:
    durations = _durations(copies)
    size = copies["bytes"]
    out = {}
    for name, selected in selections.items():
        out[f"{name}_count"] = int(selected.sum())
        out[f"{name}_bytes"] = int(size[selected].sum())
        out[f"{name}_ns"] = int(durations[selected].sum())
    return out


def _nsys_pauses(db: sqlite3.Connection, tables: set[str], strings: str) -> dict[int, int]:
    if "NVTX_EVENTS" not in tables:
        return {}
    columns = _columns(db, "NVTX_EVENTS")
    text = "COALESCE(s.value, e.text)" if "textId" in columns else "e.text"
    join = f"LEFT JOIN {strings} s ON e.textId = s.id" if "textId" in columns else ""
    types = ",".join(map(str, NVTX_RANGE_TYPES))
    frame = pd.read_sql_query(
        f"SELECT e.start AS start, e.end AS end, {text} AS name FROM NVTX_EVENTS e {join} "
        f"WHERE e.eventType IN ({types}) AND ({text} = ? OR {text} LIKE ?)", db,
        params=(STEP_RANGE, f"{EPOCH_MARKER} %"))
    return epoch_pauses(frame)


def _with_unpacked_sqlite(path: Path) -> dict[str, Any]:
    import shutil
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".sqlite") as tmp:
        with gzip.open(path, "rb") as source:
            shutil.copyfileobj(source, tmp)
        tmp.flush()
        return summarize_nsys(Path(tmp.name))


# --- Kineto JSON -----------------------------------------------------------------------------

def _load_json(path: Path, gzipped: bool) -> Any:
    try:
        raw = gzip.decompress(path.read_bytes()) if gzipped else path.read_bytes()
    except (EOFError, OSError, zlib.error) as exc:  # BadGzipFile is an OSError
        raise InputError(f"{path}: a corrupt or truncated gzip file ({exc})") from None
    try:
        return json.loads(raw.decode("utf-8", errors="replace"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: neither an nsys SQLite export nor a Kineto JSON trace ({exc})") \
            from None


_COPY_NAME = re.compile(r"^memcpy (\w+) \((\w+) -> (\w+)\)$", re.IGNORECASE)


def summarize_kineto(doc: Any, path: Path) -> dict[str, Any]:
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise InputError(f"{path}: JSON without a traceEvents list: not a Kineto trace")
    # every Chrome-trace event is an object with a phase ("ph"); anything else is not a trace,
    # and all-zero metrics for it would read as "nothing happened"
    if not events or not all(isinstance(e, dict) and "ph" in e for e in events):
        raise InputError(f"{path}: traceEvents holds no trace events (objects with a 'ph' field): "
                         "not a Kineto trace")
    complete = [e for e in events if e["ph"] == "X"]
    if not complete:
        raise InputError(f"{path}: no complete ('X') events: nothing was traced")
    if not all(isinstance(e.get("ts"), int | float) and isinstance(e.get("dur"), int | float)
               for e in complete):
        raise InputError(f"{path}: events whose 'ts' or 'dur' is not a number: not a Kineto trace")
    frame = pd.DataFrame([e for e in events if isinstance(e, dict) and e.get("ph") == "X"],
                         columns=["cat", "name", "ts", "dur", "args"])
    summary = empty_summary("kineto-json")
    if frame.empty:
        return summary
    frame["name"] = frame["name"].astype(str)
    frame["dur_ns"] = (pd.to_numeric(frame["dur"], errors="coerce").fillna(0) * 1000).round().astype(np.int64)
    kernels = frame[frame["cat"] == "kernel"]
    nccl = kernels[kernels["name"].str.contains("nccl", case=False, regex=False)]
    summary |= {"kernel_count": len(kernels), "kernel_ns": int(kernels["dur_ns"].sum()),
                "nccl_kernel_count": len(nccl), "nccl_kernel_ns": int(nccl["dur_ns"].sum())}
    runtime = frame[frame["cat"] == "cuda_runtime"]
    names = runtime["name"].map(api_name).map(API_METRICS)
    for metric, group in runtime.groupby(names):
        summary |= {f"{metric}_count": len(group), f"{metric}_ns": int(group["dur_ns"].sum())}
    summary |= _kineto_copies(frame[frame["cat"] == "gpu_memcpy"])
    spans = frame[(frame["cat"] == "user_annotation")
                  & ((frame["name"] == STEP_RANGE) | frame["name"].str.startswith(EPOCH_MARKER))]
    start = (pd.to_numeric(spans["ts"]) * 1000).round().astype(np.int64)
    summary["epoch_pauses_ns"] = epoch_pauses(pd.DataFrame(
        {"start": start, "end": start + spans["dur_ns"], "name": spans["name"]}))
    summary |= _kineto_breakdown(frame)
    return summary


def _kineto_breakdown(frame: pd.DataFrame) -> dict[str, Any]:
    """Kernels, copies and memsets of each device against the runtime and driver calls that
    launched them (Kineto's `correlation` argument links the two; one trace is one process, and
    a GPU event's `pid` is its device)."""
    start = (pd.to_numeric(frame["ts"]) * 1000).round().astype(np.int64)
    args = frame["args"].map(lambda a: a if isinstance(a, dict) else {})
    device = args.map(lambda a: a.get("device")).fillna(frame.get("pid", pd.Series(0, frame.index)))
    ops = pd.DataFrame({"cat": frame["cat"], "start": start, "end": start + frame["dur_ns"],
                        "process": 0, "device": pd.to_numeric(device, errors="coerce").fillna(0),
                        "correlation": pd.to_numeric(args.map(lambda a: a.get("correlation")),
                                                     errors="coerce").fillna(0)})
    columns = list(breakdown.OP_COLUMNS)
    return device_metrics(breakdown.per_device(
        ops[ops["cat"] == "kernel"][columns], ops[ops["cat"].isin(["gpu_memcpy", "gpu_memset"])][columns],
        ops[ops["cat"].isin(["cuda_runtime", "cuda_driver"])][["process", "correlation", "start"]]))


def _kineto_copies(copies: pd.DataFrame) -> dict[str, int]:
    if copies.empty:
        return {}
    parts = copies["name"].str.extract(_COPY_NAME)
    direction, source = parts[0].str.lower(), parts[1].str.lower()
    selections = {"memcpy_htod": direction == "htod", "memcpy_dtoh": direction == "dtoh",
                  "memcpy_htod_pageable": (direction == "htod") & (source == "pageable"),
                  "memcpy_htod_pinned": (direction == "htod") & (source == "pinned")}
    start = (pd.to_numeric(copies["ts"]) * 1000).round().astype(np.int64)
    size = copies["args"].map(lambda a: a.get("bytes", 0) if isinstance(a, dict) else 0)
    sized = {"start": start.to_numpy(np.int64), "end": (start + copies["dur_ns"]).to_numpy(np.int64),
             "bytes": pd.to_numeric(size).to_numpy(np.int64)}
    return _copy_totals(sized, {k: v.to_numpy(bool) for k, v in selections.items()})


# --- pauses ----------------------------------------------------------------------------------

def epoch_pauses(ranges: pd.DataFrame) -> dict[int, int]:
    """{epoch: gap in ns before its first step}, from rows (start, end, name); epochs whose first
    step the trace does not hold are left out."""
    epochs = ranges["name"].str.extract(_MARKER, expand=False)
    markers = ranges.assign(epoch=epochs).dropna(subset=["epoch"]).sort_values("start")
    steps = ranges[ranges["name"] == STEP_RANGE].dropna(subset=["end"])
    starts = np.sort(steps["start"].to_numpy(np.int64))
    ends = np.sort(steps["end"].to_numpy(np.int64))
    pauses = {}
    for epoch, marker in zip(markers["epoch"].astype(int), markers["start"].astype(np.int64),
                             strict=True):
        after = np.searchsorted(starts, marker, side="left")
        if after == len(starts):
            continue  # the trace ends before this epoch's first step
        before = np.searchsorted(ends, marker, side="right")
        since = ends[before - 1] if before else marker
        pauses[int(epoch)] = int(starts[after] - since)
    return pauses
