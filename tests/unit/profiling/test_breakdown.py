from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from multicard.profiling import breakdown
from multicard.profiling.breakdown import Breakdown


def frame(rows: list[tuple[int, int, int]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["start", "end", "correlation"])


def test_union_merges_overlaps_and_touching_is_not_a_gap() -> None:
    starts, ends = np.array([50, 0, 10, 30, 31]), np.array([60, 20, 15, 31, 40])
    seg_starts, seg_ends, segment = breakdown.union(starts, ends)
    assert seg_starts.tolist() == [0, 30, 50] and seg_ends.tolist() == [20, 40, 60]
    assert segment.tolist() == [0, 0, 1, 1, 2]  # in start order: 0, 10, 30, 31, 50


def test_a_timeline_with_every_kind_of_time() -> None:
    # kernel 0-100; copy 100-150 alone; gap 150-200, the next kernel launched at 180 (host late
    # by 30 of the 50); kernel 200-300 with a copy 250-320 (copy alone 300-320); gap 320-400
    # though its kernel was launched at 310 (idle: a dependency); kernel 400-500
    kernels = frame([(0, 100, 1), (200, 300, 3), (400, 500, 5)])
    copies = frame([(100, 150, 2), (250, 320, 4)])
    launches = pd.DataFrame({"correlation": [1, 2, 3, 4, 5], "start": [-5, 90, 180, 240, 310]})
    found = breakdown.breakdown(kernels, copies, launches)
    assert found == Breakdown(span_ns=500, busy_ns=300, copy_ns=70, host_ns=30, idle_ns=100, matched=1.0)
    assert found.busy_ns + found.copy_ns + found.host_ns + found.idle_ns == found.span_ns
    assert found.fractions() == pytest.approx({"busy": 0.6, "copy": 0.14, "host": 0.06, "idle": 0.2})


def test_a_launch_after_the_whole_gap_makes_it_all_host_and_a_missing_one_idle() -> None:
    kernels = frame([(0, 10, 1), (50, 60, 2), (100, 110, 3)])
    launches = pd.DataFrame({"correlation": [1, 2], "start": [0, 70]})  # 3's launch not recorded
    found = breakdown.breakdown(kernels, frame([]), launches)
    assert (found.host_ns, found.idle_ns, found.matched) == (40, 40, 0.5)


def test_without_most_launches_host_wait_and_idle_are_not_told_apart() -> None:
    kernels = frame([(0, 10, 1), (50, 60, 2), (100, 110, 3)])
    found = breakdown.breakdown(kernels, frame([]), pd.DataFrame({"correlation": [], "start": []}))
    assert (found.busy_ns, found.host_ns, found.idle_ns, found.matched) == (30, None, None, 0.0)
    assert found.fractions()["host"] is None and found.fractions()["busy"] == pytest.approx(30 / 110)


def test_an_empty_trace_has_no_fractions() -> None:
    empty = breakdown.breakdown(frame([]), frame([]), pd.DataFrame({"correlation": [], "start": []}))
    assert empty == Breakdown(0, 0, 0, 0, 0) and empty.fractions()["busy"] is None
