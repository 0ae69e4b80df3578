from __future__ import annotations

import math

import numpy as np
import pytest

from multicard.judge import stats


def cox(values: list[float], t: float) -> tuple[float, float]:
    """Cox's interval by hand: exp(mean(log x) + s^2/2 -+ t sqrt(s^2/n + s^4/(2(n-1))))."""
    logs = [math.log(v) for v in values]
    n = len(logs)
    mean = sum(logs) / n
    var = sum((v - mean) ** 2 for v in logs) / (n - 1)
    half = t * math.sqrt(var / n + var**2 / (2 * (n - 1)))
    return math.exp(mean + var / 2 - half), math.exp(mean + var / 2 + half)


def test_summary_matches_hand_computed_values() -> None:
    s = stats.summarize([1.0, 2.0, 3.0, 4.0])
    assert s.n == 4
    assert s.mean == 2.5
    assert s.std == pytest.approx(math.sqrt(5 / 3))  # ddof = 1
    # positive values: Cox's log-normal interval, t(0.975, 3) = 3.182446305
    assert (s.ci_lo, s.ci_hi) == pytest.approx(cox([1.0, 2.0, 3.0, 4.0], 3.182446305), rel=1e-9)
    assert (s.median, s.min, s.max, s.outliers) == (2.5, 1.0, 4.0, 0)


def test_two_samples_give_a_wide_interval_that_stays_above_zero() -> None:
    s = stats.summarize([10.0, 12.0])
    # t(0.975, 1) = 12.706204736: a Student interval would reach -1.7 s, this one cannot
    assert (s.ci_lo, s.ci_hi) == pytest.approx(cox([10.0, 12.0], 12.706204736), rel=1e-9)
    assert 0 < s.ci_lo < 10.0 and s.ci_hi > 12.0


def test_values_with_zeros_use_a_t_interval_clipped_at_zero() -> None:
    lo, hi = stats.mean_ci([0.0, 0.01, 0.3])
    half = 4.302652730 * statistics_sd([0.0, 0.01, 0.3]) / math.sqrt(3)  # t(0.975, 2)
    assert lo == 0.0 and hi == pytest.approx(0.31 / 3 + half)


def statistics_sd(values: list[float]) -> float:
    import statistics

    return statistics.stdev(values)


def test_single_and_empty_samples_have_undefined_spread() -> None:
    one = stats.summarize([3.0])
    assert (one.n, one.mean, one.median) == (1, 3.0, 3.0)
    assert math.isnan(one.std) and math.isnan(one.ci_lo) and math.isnan(one.ci_hi)
    empty = stats.summarize([])
    assert empty.n == 0 and math.isnan(empty.mean)


def test_outliers_are_counted_by_modified_z_score() -> None:
    # median 10, MAD 0.1: 30 has z = 0.6745 * 20 / 0.1 = 134.9 > 3.5; 10.1 has 0.67
    assert stats.count_outliers([10.0, 10.1, 9.9, 10.0, 30.0]) == 1
    assert stats.count_outliers([1.0, 100.0]) == 0  # too few values to call anything an outlier


def test_outliers_are_found_when_most_values_are_equal() -> None:
    # MAD 0: the spread is 0.1 % of the median, so z = |x - median| / (0.001 * median)
    assert stats.count_outliers([10.0, 10.0, 10.0, 1000.0]) == 1  # any n, a far value is one
    assert stats.count_outliers([10.0, 10.0, 10.0, 10.0, 30.0]) == 1
    assert stats.count_outliers([10.0, 10.0, 10.0, 10.0, 10.001]) == 0  # 0.01 %: noise
    assert stats.count_outliers([10.0, 10.0, 10.0, 10.1]) == 1  # 1 % from an exact majority
    assert stats.count_outliers([5.0, 5.0, 5.0]) == 0
    assert stats.count_outliers([0.0, 0.0, 0.0, 0.5]) == 0  # no scale at all: nothing to say


def test_ratio_of_means_with_welchs_interval_on_log_times() -> None:
    base, other = [10.0, 12.0, 11.0], [5.0, 6.0, 5.5]
    r = stats.ratio_of_means(base, other)
    assert r.value == pytest.approx(2.0)
    assert (r.n_baseline, r.n_other, r.method) == (3, 3, "welch-log")
    # by hand: Welch on logs, df from Welch-Satterthwaite
    lb, lo = [math.log(v) for v in base], [math.log(v) for v in other]
    vb, vo = statistics_sd(lb) ** 2 / 3, statistics_sd(lo) ** 2 / 3
    df = (vb + vo) ** 2 / (vb**2 / 2 + vo**2 / 2)
    from scipy import stats as sps

    half = sps.t.ppf(0.975, df) * math.sqrt(vb + vo)
    centre = sum(lb) / 3 - sum(lo) / 3
    assert (r.ci_lo, r.ci_hi) == pytest.approx((math.exp(centre - half), math.exp(centre + half)))
    assert r.boot_lo < r.value < r.boot_hi  # the bootstrap cross-check
    assert stats.ratio_of_means(base, other) == r


def test_a_ratios_point_is_of_the_same_estimand_as_its_interval() -> None:
    # skewed arms: the ratio of arithmetic means (1.5) is not the ratio of geometric means
    base, other = [1.0, 1.0, 4.0], [1.0, 1.0, 1.0]
    r = stats.ratio_of_means(base, other, cross_check=False)
    assert r.value == pytest.approx(4 ** (1 / 3)) and r.value != pytest.approx(2.0)
    assert math.log(r.value) == pytest.approx((math.log(r.ci_lo) + math.log(r.ci_hi)) / 2)


def test_the_bootstrap_cross_check_is_seeded() -> None:
    # five values a side: enough resamples differ that the seed shows in the interval
    base = np.array([10.0, 12.0, 11.0, 10.5, 11.7])
    other = np.array([5.0, 6.0, 5.5, 5.2, 5.9])
    first = stats.bootstrap_interval(base, other, seed=0, resamples=2000)
    assert stats.bootstrap_interval(base, other, seed=0, resamples=2000) == first
    assert stats.bootstrap_interval(base, other, seed=1, resamples=2000) != first


def test_a_sample_with_zeros_uses_fiellers_interval() -> None:
    r = stats.ratio_of_means([0.0, 2.0, 4.0], [1.0, 1.1, 0.9])
    assert r.method == "fieller" and r.value == pytest.approx(2.0)
    assert r.ci_lo < 2.0 < r.ci_hi
    # a denominator indistinguishable from zero: the interval is unbounded, so undefined
    unbounded = stats.ratio_of_means([1.0, 1.1, 0.9], [0.0, 0.01, 0.5])
    assert math.isnan(unbounded.ci_lo) and math.isnan(unbounded.ci_hi)


def test_ratio_without_spread_information() -> None:
    r = stats.ratio_of_means([10.0], [5.0, 6.0])
    assert r.value == pytest.approx(10 / 5.5)
    assert math.isnan(r.ci_lo) and math.isnan(r.ci_hi)
    assert math.isnan(stats.ratio_of_means([], [1.0]).value)


def simulate(n: int, true_ratio: float, runs: int, sigma: float, seed: int,
             interval) -> tuple[float, float]:
    """(coverage, share of intervals wholly above 1) over log-normal trial times."""
    rng = np.random.default_rng(seed)
    covered = above = 0
    for _ in range(runs):
        base = np.exp(rng.normal(math.log(true_ratio), sigma, n))
        other = np.exp(rng.normal(0.0, sigma, n))
        lo, hi = interval(base, other)
        covered += lo <= true_ratio <= hi
        above += lo > 1.0
    return covered / runs, above / runs


def ratio_interval(base: np.ndarray, other: np.ndarray) -> tuple[float, float]:
    r = stats.ratio_of_means(base, other, cross_check=False)
    return r.ci_lo, r.ci_hi


@pytest.mark.parametrize("n", [3, 5, 10])
def test_the_ratio_interval_covers_95_percent_and_rarely_supports_no_effect(n: int) -> None:
    # 5 % trial-to-trial noise, as GPU training times have; seeded, 3,000 runs per point (the
    # band is 5 standard errors of a 95 % coverage either side; false support, 2.5 % by design,
    # has about 2 standard errors up to its 3 % bound)
    coverage, _ = simulate(n, 2.0, 3_000, 0.05, seed=n, interval=ratio_interval)
    assert 0.93 <= coverage <= 0.97
    coverage, false_support = simulate(n, 1.0, 3_000, 0.05, seed=100 + n, interval=ratio_interval)
    assert 0.93 <= coverage <= 0.97
    assert false_support <= 0.03  # a `direction` claim "supported" with no true effect


@pytest.mark.parametrize(("n_base", "n_other", "sigma_base", "sigma_other"),
                         [(3, 5, 0.03, 0.08), (5, 3, 0.08, 0.03), (10, 4, 0.05, 0.1)])
def test_coverage_holds_with_unequal_noise_and_trial_counts(n_base: int, n_other: int,
                                                            sigma_base: float,
                                                            sigma_other: float) -> None:
    rng = np.random.default_rng(n_base * 100 + n_other)
    covered = 0
    runs = 6000
    for _ in range(runs):
        base = np.exp(rng.normal(math.log(1.5), sigma_base, n_base))
        other = np.exp(rng.normal(0.0, sigma_other, n_other))
        r = stats.ratio_of_means(base, other, cross_check=False)
        covered += r.ci_lo <= 1.5 <= r.ci_hi  # the ratio of medians, the geometric ratio
    assert 0.93 <= covered / runs <= 0.975


@pytest.mark.parametrize("n", [3, 5, 10])
def test_fiellers_interval_covers_a_ratio_of_normal_means(n: int) -> None:
    # the interval used where a sample holds zeros (trace counters), on normal data
    rng = np.random.default_rng(30 + n)
    covered = 0
    runs = 4000
    for _ in range(runs):
        base, other = rng.normal(2.0, 0.3, n), rng.normal(1.0, 0.1, n)
        lo, hi = stats.fieller_interval(base, other)
        covered += lo <= 2.0 <= hi
    assert 0.93 <= covered / runs <= 0.975


def test_the_bootstrap_cross_check_covers_far_too_little_at_three_trials() -> None:
    # why the percentile bootstrap is not the interval verdicts use
    coverage, false_support = simulate(
        3, 1.0, 400, 0.05, seed=7,
        interval=lambda b, o: stats.bootstrap_interval(b, o, seed=0, resamples=2000))
    assert coverage < 0.90 and false_support > 0.03


def test_a_difference_of_means_has_welchs_interval() -> None:
    d = stats.difference_of_means([0.99, 0.98, 0.985], [0.97, 0.975, 0.98])
    assert d.value == pytest.approx(0.01)
    assert d.ci_lo < 0.01 < d.ci_hi and (d.n_a, d.n_b) == (3, 3)


def test_instability_warnings() -> None:
    assert stats.stability([10.0, 10.1, 9.9, 10.0]).flags == ()
    wide = stats.stability([10.0, 13.0, 8.5, 10.0, 11.5])
    assert wide.flags == ("iqr", "max")
    assert wide.iqr_over_median == pytest.approx(0.15) and wide.max_over_median == pytest.approx(1.3)
    assert stats.stability([10.0, 13.0, 9.9, 10.0, 10.1]).flags == ("max",)
    warm = stats.stability([12.0, 10.0, 10.1, 9.9])  # a warm-up effect across trials
    assert warm.flags == ("first",) and warm.first_over_rest == pytest.approx(1.2)
    assert stats.stability([10.0, 30.0]).flags == ()  # too few to say


def test_speedup_readings_of_the_papers_efficiency() -> None:
    # T_fp64 / T_fp16 = 2.1: the review's "+110 %" gain, a 52.4 % time reduction
    assert stats.gain(2.1) == pytest.approx(1.1)
    assert stats.time_reduction(2.1) == pytest.approx(1 - 1 / 2.1)
    assert stats.time_reduction(1.0) == 0.0


@pytest.mark.parametrize(("n", "sigmas"), [(3, (0.02, 0.02, 0.05, 0.05)), (5, (0.05, 0.02, 0.08, 0.03)),
                                          (10, (0.1, 0.1, 0.1, 0.1))])
def test_the_change_of_a_log_ratio_covers_95_percent(n: int, sigmas: tuple[float, ...]) -> None:
    # C6's direct test of a trend: log(30 % gain at 1 GPU) - log(16 % at 4 GPUs), four samples
    rng = np.random.default_rng(n)
    truth = math.log(1 / 0.70) - math.log(1 / 0.84)
    covered, runs = 0, 4000
    for _ in range(runs):
        b1, o1, b2, o2 = (np.exp(rng.normal(mu, s, n)) for mu, s in zip(
            (math.log(1 / 0.70), 0.0, math.log(1 / 0.84), 0.0), sigmas, strict=True))
        d = stats.log_ratio_change((b1, o1), (b2, o2))
        covered += d.ci_lo <= truth <= d.ci_hi
    assert 0.935 <= covered / runs <= 0.97


def test_the_change_of_a_log_ratio_is_undefined_below_two_values_a_sample() -> None:
    d = stats.log_ratio_change(([1.0, 1.1], [1.0]), ([1.0, 1.1], [1.0, 1.2]))
    assert math.isnan(d.ci_lo)
    same = stats.log_ratio_change(([2.0, 2.0], [1.0, 1.0]), ([1.0, 1.0], [1.0, 1.0]))
    assert same.value == same.ci_lo == same.ci_hi == pytest.approx(math.log(2))


def test_a_proportions_interval_stays_in_0_1_where_coxs_reached_300_percent() -> None:
    # the CPU smoke's Table 2 accuracy: 7.42 % +- 2.76 at n = 2 read [0.20, 300.59] %
    values = [0.0547, 0.0937]
    lo, hi = stats.proportion_mean_ci(values)
    assert 0 < lo < np.mean(values) < hi < 1
    assert stats.mean_ci(values)[1] > 1  # the log-normal interval it replaces
    assert stats.summarize(values, proportion=True).ci_hi == hi
    assert stats.proportion_mean_ci([0.99, 0.99, 0.99]) == pytest.approx((0.99, 0.99))
    assert all(math.isnan(x) for x in stats.proportion_mean_ci([0.5]))


@pytest.mark.parametrize(("p", "sd", "n"), [(0.99, 0.002, 5), (0.98, 0.005, 3), (0.5, 0.05, 10)])
def test_a_proportions_interval_covers_95_percent(p: float, sd: float, n: int) -> None:
    rng = np.random.default_rng(int(p * 1000) + n)
    covered, runs = 0, 4000
    for _ in range(runs):
        lo, hi = stats.proportion_mean_ci(np.clip(rng.normal(p, sd, n), 0, 1))
        covered += lo <= p <= hi
    assert 0.93 <= covered / runs <= 0.97


def test_a_pooled_change_of_a_log_ratio_is_the_mean_of_the_groups_changes() -> None:
    one = (([10.3, 10.1, 10.5], [10.0, 9.8, 10.2]), ([10.0, 10.1, 9.9], [10.0, 9.9, 10.1]))
    two = (([11.5, 11.2, 11.8, 11.4], [10.0, 9.9, 10.1, 10.0]), ([10.1, 10.0, 9.9], [10.0, 10.2, 9.8]))
    alone = stats.pooled_log_ratio_change([one])
    assert (alone.value, alone.ci_lo, alone.ci_hi) == pytest.approx(
        (lambda d: (d.value, d.ci_lo, d.ci_hi))(stats.log_ratio_change(*one)))
    both = stats.pooled_log_ratio_change([one, two])
    changes = [stats.log_ratio_change(*g) for g in (one, two)]
    assert both.value == pytest.approx(sum(d.value for d in changes) / 2)
    # two groups' changes averaged: narrower than the wider group's own interval
    assert both.ci_hi - both.ci_lo < max(d.ci_hi - d.ci_lo for d in changes)
    assert (both.n_a, both.n_b) == (3, 3)
    assert math.isnan(stats.pooled_log_ratio_change([]).value)
    assert math.isnan(stats.pooled_log_ratio_change([(([1.0], [1.0]), ([1.0, 1.1], [1.0, 1.2]))]).ci_lo)


@pytest.mark.parametrize("n", [3, 5, 17])
def test_a_pooled_change_of_zero_lies_wholly_above_0_in_at_most_2_5_percent(n: int) -> None:
    # binding that changes nothing: a 3 % penalty with and without it, over two groups
    rng = np.random.default_rng(n)
    sigma, penalty, above, runs = 0.02, math.log(1.03), 0, 2000
    for _ in range(runs):
        groups = [tuple(tuple(np.exp(rng.normal(mu, sigma, n)) for mu in (penalty, 0.0))
                        for _ in ("none", "local")) for _ in (3, 4)]
        above += stats.pooled_log_ratio_change(groups).ci_lo > 0  # type: ignore[arg-type]
    assert above / runs <= 0.025 + 2 * math.sqrt(0.025 * 0.975 / runs)
