from __future__ import annotations

import math

import pytest

from multicard import stats


def test_summary_matches_hand_computed_values() -> None:
    s = stats.summarize([1.0, 2.0, 3.0, 4.0])
    assert s.n == 4
    assert s.mean == 2.5
    assert s.std == pytest.approx(math.sqrt(5 / 3))  # ddof = 1
    # t(0.975, 3) = 3.182446305; half width = t * sd / sqrt(4)
    assert s.ci_lo == pytest.approx(2.5 - 3.182446305 * math.sqrt(5 / 3) / 2, rel=1e-9)
    assert s.ci_hi == pytest.approx(2.5 + 3.182446305 * math.sqrt(5 / 3) / 2, rel=1e-9)
    assert (s.median, s.min, s.max, s.outliers) == (2.5, 1.0, 4.0, 0)


def test_two_samples_use_t_with_one_degree_of_freedom() -> None:
    s = stats.summarize([10.0, 12.0])
    # t(0.975, 1) = 12.706204736; sd = sqrt(2)
    assert s.ci_hi - s.mean == pytest.approx(12.706204736 * math.sqrt(2) / math.sqrt(2), rel=1e-9)


def test_single_and_empty_samples_have_undefined_spread() -> None:
    one = stats.summarize([3.0])
    assert (one.n, one.mean, one.median) == (1, 3.0, 3.0)
    assert math.isnan(one.std) and math.isnan(one.ci_lo) and math.isnan(one.ci_hi)
    empty = stats.summarize([])
    assert empty.n == 0 and math.isnan(empty.mean)


def test_outliers_are_counted_by_modified_z_score() -> None:
    # median 10, MAD 0.1: 30 has z = 0.6745 * 20 / 0.1 = 134.9 > 3.5; 10.1 has 0.67
    assert stats.count_outliers([10.0, 10.1, 9.9, 10.0, 30.0]) == 1
    assert stats.count_outliers([10.0, 10.0, 10.0, 11.0]) == 0  # MAD 0: nothing flagged
    assert stats.count_outliers([1.0, 100.0]) == 0  # too few values to call anything an outlier


def test_ratio_of_means_and_its_bootstrap_interval() -> None:
    r = stats.ratio_of_means([10.0, 12.0], [5.0, 6.0])
    assert r.value == pytest.approx(2.0)
    # Resampled means: {10, 11, 12} over {5, 5.5, 6}; the extremes 10/6 and 12/5 each have
    # probability 1/16 > 2.5 %, so they are the percentile interval's ends.
    assert r.ci_lo == pytest.approx(10 / 6)
    assert r.ci_hi == pytest.approx(2.4)
    assert stats.ratio_of_means([10.0, 12.0], [5.0, 6.0]) == r  # seeded


def test_ratio_without_spread_information() -> None:
    r = stats.ratio_of_means([10.0], [5.0, 6.0])
    assert r.value == pytest.approx(10 / 5.5)
    assert math.isnan(r.ci_lo) and math.isnan(r.ci_hi)
    assert math.isnan(stats.ratio_of_means([], [1.0]).value)


def test_speedup_readings_of_the_papers_efficiency() -> None:
    # T_fp64 / T_fp16 = 2.1: the review's "+110 %" gain, a 52.4 % time reduction
    assert stats.gain(2.1) == pytest.approx(1.1)
    assert stats.time_reduction(2.1) == pytest.approx(1 - 1 / 2.1)
    assert stats.time_reduction(1.0) == 0.0
