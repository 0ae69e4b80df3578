"""An nsys export's activity tables as numpy columns, each table read in rowid slices at once.

A 20-epoch trace holds millions of rows per table and the summary needs a handful of columns of
every row (intervals and correlation ids for the GPU breakdown, names and kinds for the totals).
Handing those columns over as Arrow arrays (connectorx, no Python object per row) costs less per
row than SQLite's own conditional aggregates over them (`sum(copyKind = 1) ...` evaluates an
expression per aggregate per row), so the summary aggregates with numpy. Each table is cut into
one rowid range per CPU and the ranges are read by a pool of threads: SQLite steps without the
GIL, so the reads use every core (benchmarks/trace_parse.py measures it against one plain scan).
"""

from __future__ import annotations

import os
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import numpy as np

from multicard.errors import InputError

Columns = dict[str, np.ndarray]


def slices(db: sqlite3.Connection, table: str, parts: int) -> list[tuple[int, int]]:
    """`parts` rowid ranges (first, last) that together cover the table; none when it is empty.
    min/max of rowid is a b-tree lookup, not a scan."""
    first, last = db.execute(f"SELECT min(rowid), max(rowid) FROM {table}").fetchone()
    if first is None:
        return []
    step = (last - first) // parts + 1
    return [(lo, min(last, lo + step - 1)) for lo in range(first, last + 1, step)]


@dataclass(frozen=True)
class Select:
    """What to read of one table: {output name: SQL expression over its columns}, and a filter.
    Every value must be an integer or NULL (read as 0: CUPTI numbers its ids from 1); a computed
    expression must never be NULL, as connectorx infers its type from the first row."""
    table: str | None  # None: the export has no such table, read as an empty one
    columns: dict[str, str]
    where: str = ""

    def sql(self, lo: int, hi: int) -> str:
        picked = ", ".join(f"{expr} AS {name}" for name, expr in self.columns.items())
        where = f"({self.where}) AND " if self.where else ""
        return f"SELECT {picked} FROM {self.table} WHERE {where}rowid BETWEEN {lo} AND {hi}"


def read_tables(path: Path, selects: list[Select], parts: int | None = None) -> list[Columns]:
    """Each select's columns as arrays (rows in rowid order), the tables cut into `parts` rowid
    ranges (default: one per CPU, at most 8) read by as many threads."""
    parts = parts or max(1, min(8, os.cpu_count() or 1))
    db = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True)
    try:
        jobs = [(k, select.sql(lo, hi)) for k, select in enumerate(selects)
                for lo, hi in (slices(db, select.table, parts) if select.table else [])]
    except sqlite3.DatabaseError as exc:
        raise InputError(f"{path}: unreadable SQLite ({exc})") from None
    finally:
        db.close()
    uri = f"sqlite://{quote(str(path.resolve()))}"
    with ThreadPoolExecutor(max_workers=parts) as pool:
        pieces = list(pool.map(lambda job: _fetch(path, uri, job[1]), jobs))
    found: list[list[Columns]] = [[] for _ in selects]
    for (k, _), piece in zip(jobs, pieces, strict=True):
        found[k].append(piece)
    return [_joined(chunks, list(select.columns)) for chunks, select in zip(found, selects, strict=True)]


def _fetch(path: Path, uri: str, query: str) -> Columns:
    import connectorx

    try:
        table = connectorx.read_sql(uri, query, return_type="arrow")
    except RuntimeError as exc:
        raise InputError(f"{path}: unreadable SQLite ({exc})") from None
    # an empty range has no first row to infer a computed column's type from: zero int64s
    return {name: (column.fill_null(0).to_numpy() if len(column) else np.zeros(0, np.int64))
            for name, column in zip(table.column_names, table.columns, strict=True)}


def _joined(chunks: list[Columns], names: list[str]) -> Columns:
    if len(chunks) == 1:
        return chunks[0]
    return {name: (np.concatenate([chunk[name] for chunk in chunks]).astype(np.int64, copy=False)
                   if chunks else np.zeros(0, np.int64)) for name in names}
