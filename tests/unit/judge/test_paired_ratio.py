"""The A-B-B-A order and the paired log ratio (judge/stats.py): hand-computed values, the
interval's coverage by seeded simulation, and the drift that A-B-B-A cancels and A-B does not."""

from __future__ import annotations

import math

import numpy as np
import pytest

from multicard.judge import stats

T_975_2 = 4.302652730  # Student's t, 97.5 % quantile, 2 degrees of freedom


def test_the_order_alternates_which_arm_goes_first_in_each_pair() -> None:
    assert stats.abba_order(0) == []
    assert stats.abba_order(1) == ["A", "B"]
    assert stats.abba_order(3) == ["A", "B", "B", "A", "A", "B"]
    assert stats.abba_order(4) == ["A", "B", "B", "A"] * 2
    assert len(stats.abba_order(11)) == 22
    with pytest.raises(ValueError, match="pairs must be >= 0"):
        stats.abba_order(-1)


def test_pair_k_is_the_kth_a_block_with_the_kth_b_block() -> None:
    assert stats.paired_blocks(["A", "B", "B", "A"], [1.0, 2.0, 3.0, 4.0]) == ([1.0, 4.0], [2.0, 3.0])
    with pytest.raises(ValueError, match="as many A blocks as B blocks"):
        stats.paired_blocks(["A", "B", "A"], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="no other arm"):
        stats.paired_blocks(["A", "C"], [1.0, 2.0])
    with pytest.raises(ValueError, match="3 blocks in the order, 2 values"):
        stats.paired_blocks(["A", "B", "B"], [1.0, 2.0])


def test_the_paired_log_ratio_matches_hand_computed_values() -> None:
    r = stats.paired_log_ratio([1.1, 1.0, 1.2], [1.0, 1.0, 1.0])
    logs = [math.log(1.1), 0.0, math.log(1.2)]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((v - mean) ** 2 for v in logs) / 2)
    half = T_975_2 * sd / math.sqrt(3)
    assert r.value == pytest.approx(math.exp(mean), rel=1e-12)
    assert (r.ci_lo, r.ci_hi) == pytest.approx((math.exp(mean - half), math.exp(mean + half)), rel=1e-9)
    assert (r.n_baseline, r.n_other, r.method) == (3, 3, "paired-log")
    # the geometric mean of the pairs' ratios: (1.1 * 1.0 * 1.2) ** (1/3)
    assert r.value == pytest.approx(1.32 ** (1 / 3), rel=1e-12)


def test_what_the_pairs_share_leaves_the_ratio() -> None:
    # each pair 2:1, at levels a factor 4 apart: the ratio is exact, its interval a point
    r = stats.paired_log_ratio([2.0, 8.0, 32.0], [1.0, 4.0, 16.0])
    assert (r.value, r.ci_lo, r.ci_hi) == pytest.approx((2.0, 2.0, 2.0), rel=1e-12)
    # the same values unpaired: Welch's interval on logs is wide, for the levels' spread
    unpaired = stats.ratio_of_means([2.0, 8.0, 32.0], [1.0, 4.0, 16.0], cross_check=False)
    assert unpaired.ci_hi / unpaired.ci_lo > 10


def test_undefined_where_the_pairs_cannot_say_it() -> None:
    one = stats.paired_log_ratio([3.0], [2.0])
    assert one.value == pytest.approx(1.5) and math.isnan(one.ci_lo) and math.isnan(one.ci_hi)
    for a, b in (([1.0, 0.0], [1.0, 1.0]), ([1.0, 2.0], [-1.0, 1.0]), ([], [])):
        r = stats.paired_log_ratio(a, b)
        assert math.isnan(r.value) and math.isnan(r.ci_lo)
    with pytest.raises(ValueError, match="one value each per pair"):
        stats.paired_log_ratio([1.0, 2.0], [1.0])


def test_the_relative_half_width_is_the_wider_side() -> None:
    # log-symmetric: exp(h) - 1 above, 1 - exp(-h) below; the wider is above
    h = math.log(1.02)
    r = stats.Ratio(1.5, 1.5 * math.exp(-h), 1.5 * math.exp(h), 10, 10, "paired-log")
    assert stats.relative_half_width(r) == pytest.approx(0.02, rel=1e-12)
    assert stats.relative_half_width(stats.Ratio(1.0, 0.97, 1.01)) == pytest.approx(0.03)
    assert math.isnan(stats.relative_half_width(stats.paired_log_ratio([3.0], [2.0])))


def blocks(order: list[str], true_ratio: float, drift: float, noise: float, wander: float,
           rng: np.random.Generator) -> list[float]:
    """One run's block speeds in `order`: arm A `true_ratio` times B's, a linear drift of `drift`
    (log) per block, a random walk of steps `wander` (the machine's slow changes) and white
    noise `noise` per block, both on the log scale."""
    n = len(order)
    logs = (drift * np.arange(n) + np.cumsum(rng.normal(0.0, wander, n)) + rng.normal(0.0, noise, n)
            + np.where(np.array(order) == "A", math.log(true_ratio), 0.0))
    return list(np.exp(logs))


def coverage(order: list[str], runs: int, seed: int, **world: float) -> float:
    rng = np.random.default_rng(seed)
    covered = 0
    for _ in range(runs):
        r = stats.paired_log_ratio(*stats.paired_blocks(order, blocks(order, 1.03, rng=rng, **world)))
        covered += r.ci_lo <= 1.03 <= r.ci_hi
    return covered / runs


def test_the_interval_covers_the_true_ratio_95_percent_of_the_time() -> None:
    # 2000 runs of 10 A-B-B-A pairs: 1 % noise per block, a random walk of 0.5 % per block and a
    # drift of 0.1 % per block; the pairs' ratio is 1.03
    found = coverage(stats.abba_order(10), 2000, seed=7, drift=0.001, noise=0.01, wander=0.005)
    assert 0.93 <= found <= 0.97


def test_abba_cancels_a_linear_drift_that_an_ab_order_keeps() -> None:
    # no noise, speed rising 1 % per block: A-B-B-A reads the true ratio, A-B reads it 1 % low
    # (every B runs one block after its A)
    rng = np.random.default_rng(0)
    ab = ["A", "B"] * 10
    for order, expected in ((stats.abba_order(10), 1.03), (ab, 1.03 * math.exp(-0.01))):
        speeds = blocks(order, 1.03, drift=0.01, noise=0.0, wander=0.0, rng=rng)
        assert stats.paired_log_ratio(*stats.paired_blocks(order, speeds)).value == pytest.approx(
            expected, rel=1e-12)
    # with noise, the A-B order's interval misses the truth most of the time; A-B-B-A's does not
    world = {"drift": 0.01, "noise": 0.005, "wander": 0.0}
    assert coverage(ab, 2000, seed=8, **world) < 0.2
    assert coverage(stats.abba_order(10), 2000, seed=8, **world) >= 0.93
