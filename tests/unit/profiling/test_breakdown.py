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


def test_the_earliest_call_of_a_correlation_and_unknown_ones() -> None:
    found = breakdown.earliest_launch(np.array([7, 3, 0, 9]), np.array([3, 7, 3, 0, 7]),
                                      np.array([50, 20, 40, 1, 30]))
    assert found[:2].tolist() == [20.0, 40.0] and np.isnan(found[2:]).all()


@pytest.mark.parametrize("offset", [0, 10**12])  # dense ids: a table; sparse ones: a binary search
def test_a_launch_is_found_the_same_whether_ids_are_dense_or_sparse(offset: int) -> None:
    rng = np.random.default_rng(1)
    ids = np.arange(1, 2001) + offset
    starts = rng.integers(0, 10**9, len(ids))
    wanted = np.concatenate([rng.choice(ids, 500), [offset + 5000, 0, -3]])
    found = breakdown.earliest_launch(wanted, ids, starts)
    lookup = dict(zip(ids.tolist(), starts.tolist(), strict=True))
    assert found[:500].tolist() == [float(lookup[w]) for w in wanted[:500].tolist()]
    assert np.isnan(found[500:]).all()


def test_each_process_and_device_is_its_own_timeline() -> None:
    def ops(rows: list[tuple[int, int, int, int, int]]) -> pd.DataFrame:
        return pd.DataFrame(rows, columns=list(breakdown.OP_COLUMNS))

    # process 1 on devices 0 and 1 at the same time, process 2 on device 0 later; process 2
    # reuses correlation 2, launched (in its own process) only after its GPU fell idle
    kernels = ops([(0, 100, 1, 0, 1), (200, 300, 1, 0, 2), (0, 300, 1, 1, 3),
                   (1000, 1100, 2, 0, 1), (1300, 1400, 2, 0, 2)])
    launches = pd.DataFrame({"process": [1, 1, 1, 2, 2], "correlation": [1, 2, 3, 1, 2],
                             "start": [-10, 50, -5, 990, 1250]})
    found = breakdown.per_device(kernels, ops([]), launches)
    assert found == {
        (1, 0): Breakdown(300, 200, 0, 0, 100, 1.0),
        (1, 1): Breakdown(300, 300, 0, 0, 0, None),
        (2, 0): Breakdown(400, 200, 0, 150, 50, 1.0),
    }
