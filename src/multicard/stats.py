"""Statistics over independent trials: small pure functions, no formatting, no I/O.

Each trial is one fresh launch, so trials are independent samples. Per config we report n, mean,
sample standard deviation (ddof=1), a 95% confidence interval of the mean from Student's t,
median, min and max (Hoefler & Belli, SC'15). Speedups are ratios of means with a percentile
bootstrap CI that resamples each group independently. Outliers are flagged (modified z-score,
Iglewicz & Hoaglin), never dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats as sps

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 10_000
OUTLIER_Z = 3.5  # Iglewicz & Hoaglin's cut-off for the modified z-score
MAD_TO_SIGMA = 0.6745  # MAD of a standard normal


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    std: float
    ci_lo: float
    ci_hi: float
    median: float
    min: float
    max: float
    outliers: int


@dataclass(frozen=True)
class Ratio:
    """mean(baseline) / mean(other): > 1 means `other` is faster when the metric is a time."""

    value: float
    ci_lo: float
    ci_hi: float


NAN = float("nan")


def summarize(values: ArrayLike) -> Summary:
    """n, mean, std (ddof=1), t-based 95% CI, median, min, max, outlier count. NaN where undefined."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        return Summary(0, NAN, NAN, NAN, NAN, NAN, NAN, NAN, 0)
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if n > 1 else NAN
    lo, hi = mean_ci(x)
    return Summary(n, mean, std, lo, hi, float(np.median(x)), float(x.min()), float(x.max()),
                   count_outliers(x))


def mean_ci(values: ArrayLike, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Student-t interval of the mean; (NaN, NaN) for fewer than two values."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < 2:
        return NAN, NAN
    half = sps.t.ppf(0.5 + confidence / 2, n - 1) * x.std(ddof=1) / math.sqrt(n)
    return float(x.mean() - half), float(x.mean() + half)


def count_outliers(values: ArrayLike) -> int:
    """Values whose modified z-score 0.6745 * |x - median| / MAD exceeds 3.5 (none if MAD is 0)."""
    x = np.asarray(values, dtype=float)
    if len(x) < 3:
        return 0
    median = np.median(x)
    mad = np.median(np.abs(x - median))
    if mad == 0:
        return 0
    return int(np.sum(MAD_TO_SIGMA * np.abs(x - median) / mad > OUTLIER_Z))


def ratio_of_means(
    baseline: ArrayLike, other: ArrayLike, seed: int = 0,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> Ratio:
    """mean(baseline)/mean(other) with a percentile-bootstrap 95% CI (scipy.stats.bootstrap,
    groups resampled independently, seeded so that a report is reproducible).

    With fewer than two values in a group the CI is undefined (NaN): one sample says nothing
    about its own spread.
    """
    b, o = np.asarray(baseline, dtype=float), np.asarray(other, dtype=float)
    if len(b) == 0 or len(o) == 0:
        return Ratio(NAN, NAN, NAN)
    value = float(b.mean() / o.mean())
    if len(b) < 2 or len(o) < 2:
        return Ratio(value, NAN, NAN)
    result = sps.bootstrap(
        (b, o), _mean_ratio, vectorized=True, paired=False, n_resamples=resamples,
        confidence_level=CONFIDENCE, method="percentile", rng=np.random.default_rng(seed),
    )
    interval = result.confidence_interval
    return Ratio(value, float(interval.low), float(interval.high))


def _mean_ratio(b: np.ndarray, o: np.ndarray, axis: int = -1) -> np.ndarray:
    return b.mean(axis=axis) / o.mean(axis=axis)


def direction(ci_lo: float, ci_hi: float) -> str:
    """Where a ratio's CI lies relative to 1: "above", "below", "contains 1" or "undetermined"."""
    if math.isnan(ci_lo) or math.isnan(ci_hi):
        return "undetermined"
    if ci_lo > 1.0:
        return "above"
    if ci_hi < 1.0:
        return "below"
    return "contains 1"


def time_reduction(ratio: float) -> float:
    """Share of the baseline's time saved, from a speed ratio T_base/T_x: 1 - 1/ratio."""
    return 1.0 - 1.0 / ratio


def gain(ratio: float) -> float:
    """Relative speed gain, from a speed ratio T_base/T_x: ratio - 1 (the paper's "+54 %")."""
    return ratio - 1.0
