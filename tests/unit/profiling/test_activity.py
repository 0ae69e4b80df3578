"""profiling/activity.py: slices that cover a table once, kept columns in rowid order whatever
the slicing, filters and rowid gaps, and per-slice tallies that add up."""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from multicard.profiling import activity


def table_with_gaps(path: Path) -> list[tuple[int, int, int | None]]:
    """Rows (start, kind, correlation) of table t; some rowids deleted, some correlations NULL."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (start INTEGER, kind INTEGER, correlation INTEGER)")
    db.executemany("INSERT INTO t VALUES (?, ?, ?)",
                   [(i * 10, i % 3, None if i % 5 == 0 else i) for i in range(100)])
    db.execute("DELETE FROM t WHERE rowid % 7 = 0 OR rowid BETWEEN 40 AND 52")
    db.commit()
    rows = db.execute("SELECT start, kind, correlation FROM t ORDER BY rowid").fetchall()
    db.close()
    return rows


@pytest.mark.parametrize("slice_rows", [1, 3, 16, 1 << 18])
def test_kept_columns_and_tallies_do_not_depend_on_the_slicing(tmp_path: Path, slice_rows: int,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    rows = table_with_gaps(tmp_path / "t.sqlite")
    monkeypatch.setattr(activity, "SLICE_ROWS", slice_rows)
    def tally(piece: activity.Columns) -> activity.Tally:
        return {"rows": len(piece["kind"]), "kind2": int((piece["kind"] == 2).sum())}

    select = activity.Select("t", {"start": "start", "kind": "kind", "correlation": "correlation",
                                   "twice": "COALESCE(start * 2, 0)"},
                             where="kind != 1", keep=("start", "correlation", "twice"), tally=tally)
    (read,) = activity.read_tables(tmp_path / "t.sqlite", [select], threads=2)
    wanted = [r for r in rows if r[1] != 1]
    assert read.kept["start"].tolist() == [r[0] for r in wanted]
    assert read.kept["correlation"].tolist() == [r[2] or 0 for r in wanted]  # NULL reads 0
    assert read.kept["twice"].tolist() == [2 * r[0] for r in wanted]
    assert sum(t["rows"] for t in read.tallies) == len(wanted)
    assert sum(t["kind2"] for t in read.tallies) == sum(r[1] == 2 for r in wanted)
    db = sqlite3.connect(tmp_path / "t.sqlite")
    assert len(read.tallies) == len(activity.slices(db, "t", slice_rows))
    db.close()


def test_slices_cover_every_rowid_once_and_an_empty_table_has_none(tmp_path: Path) -> None:
    table_with_gaps(tmp_path / "t.sqlite")
    db = sqlite3.connect(tmp_path / "t.sqlite")
    spans = activity.slices(db, "t", 10)
    rowids = [r for (r,) in db.execute("SELECT rowid FROM t")]
    assert spans[0][0] == min(rowids) and spans[-1][1] == max(rowids)
    assert all(b[0] == a[1] + 1 and a[1] - a[0] < 10 for a, b in itertools.pairwise(spans))
    db.execute("CREATE TABLE empty (x INTEGER)")
    assert activity.slices(db, "empty", 10) == []
    db.close()


def test_an_absent_table_reads_as_empty_columns(tmp_path: Path) -> None:
    table_with_gaps(tmp_path / "t.sqlite")
    select = activity.Select(None, {"start": "start"}, keep=("start",), tally=lambda piece: {"rows": 1})
    (read,) = activity.read_tables(tmp_path / "t.sqlite", [select])
    assert read.kept["start"].dtype == np.int64 and len(read.kept["start"]) == 0 and read.tallies == []
