"""An nsys export's activity tables read in rowid slices on every core, tallied slice by slice.

A 20-epoch trace holds millions of rows per table. The summary needs a few columns of every row:
intervals and correlation ids for the GPU breakdown (kept whole), names, kinds and sizes for the
totals (tallied per slice, then dropped). Handing the columns over as Arrow arrays (connectorx,
no Python object per row) costs less per row than SQLite's own conditional aggregates
(`sum(copyKind = 1) ...` evaluates an expression per aggregate per row), so the tallies are numpy.

Each table is cut into rowid ranges of SLICE_ROWS, read by one thread per usable CPU (at most 8;
SQLite steps without the GIL). A slice's arrays are small and freed once tallied, so the
allocator hands the same memory to the next slice; only the kept columns are allocated whole,
once: fresh memory is slow to touch (page faults), and a multi-million-row trace would otherwise
touch gigabytes.
benchmarks/trace_parse.py measures the whole against one plain scan of the same tables.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import numpy as np

from multicard.errors import InputError

Columns = dict[str, np.ndarray]
Tally = dict[str, int]
SLICE_ROWS = 1 << 18  # a column's slice is 2 MiB: small enough to be reused, big enough for numpy


@dataclass(frozen=True)
class Select:
    """What to read of one table: {output name: SQL expression over its columns} and a filter;
    `keep` names the columns returned whole (rows in rowid order), `tally` is run on each slice
    (every column) and its results are returned per slice. Every value must be an integer or NULL
    (read as 0: CUPTI numbers its ids from 1); a computed expression must never be NULL, as
    connectorx infers its type from the first row."""
    table: str | None  # None: the export has no such table, read as an empty one
    columns: dict[str, str]
    where: str = ""
    keep: tuple[str, ...] = ()
    tally: Callable[[Columns], Tally] | None = None

    def sql(self, lo: int, hi: int) -> str:
        picked = ", ".join(f"{expr} AS {name}" for name, expr in self.columns.items())
        where = f"({self.where}) AND " if self.where else ""
        return f"SELECT {picked} FROM {self.table} WHERE {where}rowid BETWEEN {lo} AND {hi}"


@dataclass
class Read:
    kept: Columns
    tallies: list[Tally] = field(default_factory=list)


def slices(db: sqlite3.Connection, table: str, rows: int) -> list[tuple[int, int]]:
    """Rowid ranges (first, last) of at most `rows` rowids that together cover the table; none
    when it is empty. min/max of rowid is a b-tree lookup, not a scan."""
    first, last = db.execute(f"SELECT min(rowid), max(rowid) FROM {table}").fetchone()
    if first is None:
        return []
    return [(lo, min(last, lo + rows - 1)) for lo in range(first, last + 1, rows)]


def read_tables(path: Path, selects: list[Select], threads: int | None = None) -> list[Read]:
    """Each select's kept columns and per-slice tallies, its table read in rowid slices by
    `threads` threads (default: one per CPU this process may use, at most 8)."""
    threads = threads or max(1, min(8, _usable_cpus()))
    db = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True)
    try:
        ranges = [slices(db, s.table, SLICE_ROWS) if s.table else [] for s in selects]
    except sqlite3.DatabaseError as exc:
        raise InputError(f"{path}: unreadable SQLite ({exc})") from None
    finally:
        db.close()
    # each slice is placed where its rowids start: a slice holds at most that many rows
    reads = [Read({name: np.zeros(_span(spans), np.int64) for name in s.keep})
             for s, spans in zip(selects, ranges, strict=True)]
    filled: list[list[tuple[int, int]]] = [[] for _ in selects]
    uri = f"sqlite://{quote(str(path.resolve()))}"

    def one(k: int, lo: int, hi: int) -> tuple[int, int, int, Tally | None]:
        select, at = selects[k], lo - ranges[k][0][0]
        piece = _fetch(path, uri, select.sql(lo, hi))
        for name in select.keep:
            reads[k].kept[name][at:at + len(piece[name])] = piece[name]
        rows = len(next(iter(piece.values()))) if piece else 0
        return k, at, rows, (select.tally(piece) if select.tally else None)

    with ThreadPoolExecutor(max_workers=threads) as pool:
        jobs = [pool.submit(one, k, lo, hi) for k, spans in enumerate(ranges) for lo, hi in spans]
        for job in jobs:
            k, at, rows, tally = job.result()
            filled[k].append((at, rows))
            if tally is not None:
                reads[k].tallies.append(tally)
    for read, pieces in zip(reads, filled, strict=True):
        read.kept = _packed(read.kept, pieces)
    return reads


def _usable_cpus() -> int:
    """The CPUs this process may run on (a cgroup or taskset narrows os.cpu_count())."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _span(spans: list[tuple[int, int]]) -> int:
    return spans[-1][1] - spans[0][0] + 1 if spans else 0


def _fetch(path: Path, uri: str, query: str) -> Columns:
    import connectorx

    try:
        table = connectorx.read_sql(uri, query, return_type="arrow")
    except RuntimeError as exc:
        raise InputError(f"{path}: unreadable SQLite ({exc})") from None
    # an empty range has no first row to infer a computed column's type from: zero int64s
    return {name: (column.fill_null(0).to_numpy() if len(column) else np.zeros(0, np.int64))
            for name, column in zip(table.column_names, table.columns, strict=True)}


def _packed(kept: Columns, pieces: list[tuple[int, int]]) -> Columns:
    """The kept columns with each slice's rows moved up against the last (a filter or rowids
    that are not dense leave slices short), in place: no second copy of a big array."""
    pieces = sorted(pieces)
    end = 0
    for at, rows in pieces:
        if at != end:
            for column in kept.values():
                column[end:end + rows] = column[at:at + rows]  # numpy buffers overlapping moves
        end += rows
    return {name: column[:end] for name, column in kept.items()}
