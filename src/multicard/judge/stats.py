"""Statistics over independent trials: small pure functions, no formatting, no I/O.

Each trial is one fresh launch, so trials are independent samples. Per config: n, mean, sample
standard deviation (ddof=1), a 95% confidence interval of the mean, median, min and max (Hoefler
& Belli, SC'15). Trial times are positive and their noise is multiplicative, so:

- the interval of a mean is Cox's interval for the mean of a log-normal sample (Olsson 2005) when
  every value is positive: it never reaches below zero, as a t interval on two samples does (a
  t interval, clipped at zero, only for samples holding zeros);
- a speedup is the ratio of geometric means with Welch's t interval on log values (the ratio of
  means when both arms have the same relative noise), point and interval of one estimand;
  a sample holding zeros uses the ratio of means and Fieller's interval for it instead. Its coverage is
  tested by simulation (tests/unit/judge/test_stats.py); the percentile bootstrap, which covers 80 % at
  n = 3, is kept as a cross-check column only;
- a difference of means (accuracy points) has Welch's t interval, and so has the change of a log
  ratio between two settings (a trend: four samples, one interval);
- the mean of a proportion (an accuracy, a fraction of time) gets a logit-scale interval that
  stays inside (0, 1), where Cox's would reach past 1 (7 % +- 3 reads [0.2 %, 300 %] at n = 2).

Blocks timed in one process are not independent trials: a GPU's clocks and the host's load drift
from block to block. Two arms measured that way are run in an A-B-B-A order (`abba_order`), whose
pairs cancel a linear drift where an A-B order would keep it as a bias, and compared pair by pair
(`paired_log_ratio`: the mean of log(a_i / b_i), Student's t over the pairs, exponentiated).

Outliers are flagged by the modified z-score (Iglewicz & Hoaglin), with a spread of 0.1 % of the
median standing in when the MAD is 0; never dropped. Instability is flagged as hyperfine,
pyperf and torch.utils.benchmark do: a wide interquartile range, a maximum far above the median,
a first trial slower than every other (a warm-up effect that crosses trials).
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats as sps

CONFIDENCE = 0.95
_LEVEL = contextvars.ContextVar("confidence", default=CONFIDENCE)
BOOTSTRAP_RESAMPLES = 10_000
# SciPy 1.15 renamed bootstrap's random_state to rng; NGC 24.11 ships SciPy 1.14.1
SEED_KEYWORD = "rng" if "rng" in inspect.signature(sps.bootstrap).parameters else "random_state"
OUTLIER_Z = 3.5  # Iglewicz & Hoaglin's cut-off for the modified z-score
MAD_TO_SIGMA = 0.6745  # MAD of a standard normal
MAD_FLOOR = 1e-3  # with MAD 0: the spread assumed, as a share of the median
UNSTABLE_IQR = 0.10  # IQR / median above this: torch.utils.benchmark's warning
UNSTABLE_MAX = 1.25  # max / median above this: a run much slower than the typical one
FIRST_TRIAL_SLOWER = 1.05  # trial 0 this much above the median of the rest, and above all of them


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
    """baseline over other: > 1 means `other` is faster when the metric is a time.

    `method` names the interval ("welch-log", "fieller", "paired-log", or "" when it is
    undefined). The point is of the interval's estimand: the ratio of geometric means under
    "welch-log", the geometric mean of the pairs' ratios under "paired-log" (n_baseline and
    n_other are then both the number of pairs), the ratio of arithmetic means under "fieller" and
    where no interval is defined;
    `boot_lo`/`boot_hi` are the percentile bootstrap's, a cross-check only."""

    value: float
    ci_lo: float
    ci_hi: float
    n_baseline: int = 0
    n_other: int = 0
    method: str = ""
    boot_lo: float = math.nan
    boot_hi: float = math.nan


@dataclass(frozen=True)
class Difference:
    """mean(a) - mean(b) with Welch's t interval."""

    value: float
    ci_lo: float
    ci_hi: float
    n_a: int = 0
    n_b: int = 0


NAN = float("nan")


def summarize(values: ArrayLike, proportion: bool = False) -> Summary:
    """n, mean, std (ddof=1), 95% CI of the mean, median, min, max, outliers. NaN where undefined.
    `proportion`: the values lie in [0, 1] (an accuracy, a fraction), and so does the interval
    (proportion_mean_ci); otherwise mean_ci."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        return Summary(0, NAN, NAN, NAN, NAN, NAN, NAN, NAN, 0)
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if n > 1 else NAN
    lo, hi = proportion_mean_ci(x) if proportion else mean_ci(x)
    return Summary(n, mean, std, lo, hi, float(np.median(x)), float(x.min()), float(x.max()),
                   count_outliers(x))


def mean_ci(values: ArrayLike, confidence: float | None = None) -> tuple[float, float]:
    """Interval of the mean: Cox's log-normal interval for positive values, else Student's t
    (clipped at zero for values that are all >= 0); (NaN, NaN) for fewer than two values."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < 2:
        return NAN, NAN
    if np.all(x > 0):
        return _cox_interval(np.log(x), confidence)
    half = _t(confidence, n - 1) * x.std(ddof=1) / math.sqrt(n)
    low = float(x.mean() - half)
    return (max(0.0, low) if np.all(x >= 0) else low), float(x.mean() + half)


def _cox_interval(logs: np.ndarray, confidence: float | None) -> tuple[float, float]:
    n = len(logs)
    mean, var = float(logs.mean()), float(logs.var(ddof=1))
    half = _t(confidence, n - 1) * math.sqrt(var / n + var**2 / (2 * (n - 1)))
    centre = mean + var / 2
    return math.exp(centre - half), math.exp(centre + half)


def _t(confidence: float | None, df: float) -> float:
    level = _LEVEL.get() if confidence is None else confidence
    return float(sps.t.ppf(0.5 + level / 2, df))


@contextlib.contextmanager
def confidence_level(level: float) -> Iterator[None]:
    """Intervals at `level` instead of 95 % where no confidence is passed (a multiplicity
    adjustment re-judges the claims with wider intervals: claims.holm)."""
    token = _LEVEL.set(level)
    try:
        yield
    finally:
        _LEVEL.reset(token)


def family_error(judgements: int,
                 per_judgement: float = (1 - CONFIDENCE) / 2) -> tuple[float, float]:
    """The chance that at least one of `judgements` verdicts is wrong when each errs with
    probability `per_judgement` (2.5 %: a one-sided test at 2.5 %, the truth at its band's end):
    independent, and the Bonferroni bound, which holds whatever their dependence."""
    return 1 - (1 - per_judgement) ** judgements, min(1.0, judgements * per_judgement)


def count_outliers(values: ArrayLike) -> int:
    """Values whose modified z-score 0.6745 |x - median| / MAD exceeds 3.5 (Iglewicz & Hoaglin).
    When more than half the values are equal the MAD is 0; the scale is then 0.1 % of the median
    instead, so a value is an outlier when it lies more than about 0.5 % from the equal majority
    (a fixed relative floor, since no spread of the majority can be measured)."""
    x = np.asarray(values, dtype=float)
    if len(x) < 3:
        return 0
    median = float(np.median(x))
    deviation = np.abs(x - median)
    mad = float(np.median(deviation))
    scale = mad if mad > 0 else MAD_FLOOR * abs(median) * MAD_TO_SIGMA
    if scale == 0:
        return 0  # all equal, at zero
    return int(np.sum(MAD_TO_SIGMA * deviation / scale > OUTLIER_Z))


def ratio_of_means(baseline: ArrayLike, other: ArrayLike, seed: int = 0,
                   resamples: int = BOOTSTRAP_RESAMPLES, cross_check: bool = True) -> Ratio:
    """baseline over other with its 95% interval (module docstring), and the seeded percentile
    bootstrap's beside it when `cross_check`. The point estimates what the interval covers: the
    ratio of geometric means beside Welch's log interval, of arithmetic means beside Fieller's.
    The interval is undefined (NaN) with fewer than two values in a group: one sample says
    nothing about its own spread."""
    b, o = np.asarray(baseline, dtype=float), np.asarray(other, dtype=float)
    if len(b) == 0 or len(o) == 0 or o.mean() == 0:
        return Ratio(NAN, NAN, NAN, len(b), len(o))
    value = float(b.mean() / o.mean())
    if len(b) < 2 or len(o) < 2:
        return Ratio(value, NAN, NAN, len(b), len(o))
    if np.all(b > 0) and np.all(o > 0):
        (lo, hi), method = welch_log_interval(b, o), "welch-log"
        value = math.exp(float(np.log(b).mean() - np.log(o).mean()))
    else:
        (lo, hi), method = fieller_interval(b, o), "fieller"
    boot = bootstrap_interval(b, o, seed, resamples) if cross_check else (NAN, NAN)
    return Ratio(value, lo, hi, len(b), len(o), method, *boot)


def welch_log_interval(b: np.ndarray, o: np.ndarray,
                       confidence: float | None = None) -> tuple[float, float]:
    """exp of Welch's t interval for mean(log b) - mean(log o)."""
    lb, lo = np.log(b), np.log(o)
    vb, vo = lb.var(ddof=1) / len(lb), lo.var(ddof=1) / len(lo)
    centre = float(lb.mean() - lo.mean())
    if vb + vo == 0:
        return math.exp(centre), math.exp(centre)
    df = (vb + vo) ** 2 / (vb**2 / (len(lb) - 1) + vo**2 / (len(lo) - 1))
    half = _t(confidence, df) * math.sqrt(vb + vo)
    return math.exp(centre - half), math.exp(centre + half)


def fieller_interval(b: np.ndarray, o: np.ndarray,
                     confidence: float | None = None) -> tuple[float, float]:
    """Fieller's interval for mean(b)/mean(o), Welch-Satterthwaite degrees of freedom; (NaN,
    NaN) when mean(o) is not clearly away from zero (the interval would be unbounded)."""
    mb, mo = float(b.mean()), float(o.mean())
    vb, vo = b.var(ddof=1) / len(b), o.var(ddof=1) / len(o)
    ratio = mb / mo
    spread = vb**2 / (len(b) - 1) + (ratio**2 * vo) ** 2 / (len(o) - 1)
    df = (vb + ratio**2 * vo) ** 2 / spread if spread > 0 else math.inf
    t2 = _t(confidence, df) ** 2
    a = mo**2 - t2 * vo
    if a <= 0:
        return NAN, NAN
    disc = (mb * mo) ** 2 - a * (mb**2 - t2 * vb)
    root = math.sqrt(max(0.0, disc))
    return (mb * mo - root) / a, (mb * mo + root) / a


def bootstrap_interval(b: np.ndarray, o: np.ndarray, seed: int = 0,
                       resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float]:
    """Percentile bootstrap of mean(b)/mean(o), groups resampled independently, seeded."""
    with np.errstate(divide="ignore", invalid="ignore"):  # resamples whose mean is 0
        result = sps.bootstrap(
            (b, o), _mean_ratio, vectorized=True, paired=False, n_resamples=resamples,
            confidence_level=CONFIDENCE, method="percentile",
            **{SEED_KEYWORD: np.random.default_rng(seed)},
        )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def _mean_ratio(b: np.ndarray, o: np.ndarray, axis: int = -1) -> np.ndarray:
    return b.mean(axis=axis) / o.mean(axis=axis)


def difference_of_means(a: ArrayLike, b: ArrayLike, confidence: float | None = None) -> Difference:
    """mean(a) - mean(b) with Welch's t interval (NaN with fewer than two values in a group)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) == 0 or len(y) == 0:
        return Difference(NAN, NAN, NAN, len(x), len(y))
    value = float(x.mean() - y.mean())
    if len(x) < 2 or len(y) < 2:
        return Difference(value, NAN, NAN, len(x), len(y))
    vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    if vx + vy == 0:
        return Difference(value, value, value, len(x), len(y))
    df = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1))
    half = _t(confidence, df) * math.sqrt(vx + vy)
    return Difference(value, value - half, value + half, len(x), len(y))


def log_contrast(samples: Sequence[ArrayLike], weights: Sequence[float],
                 confidence: float | None = None) -> Difference:
    """sum of w_i * mean(log x_i) over independent samples of positive values, with Welch's t
    interval (Satterthwaite's degrees of freedom): one interval for an effect built from several
    arms (a change of a log ratio, a log ratio pooled over groups). NaN where a sample has fewer
    than two values or a value is not positive; `n_a`, `n_b`: the first two samples' sizes."""
    logs = []
    for x in samples:
        values = np.asarray(x, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            logs.append(np.log(values) if len(values) and np.all(values > 0) else np.array([NAN]))
    sizes = [len(np.asarray(x)) for x in samples] + [0, 0]
    if any(len(x) < 2 or not np.isfinite(x).all() for x in logs):
        return Difference(NAN, NAN, NAN, sizes[0], sizes[1])
    value = float(sum(w * x.mean() for w, x in zip(weights, logs, strict=True)))
    parts = [w**2 * x.var(ddof=1) / len(x) for w, x in zip(weights, logs, strict=True)]
    total = sum(parts)
    if total == 0:
        return Difference(value, value, value, sizes[0], sizes[1])
    df = total**2 / sum(v**2 / (len(x) - 1) for v, x in zip(parts, logs, strict=True))
    half = _t(confidence, df) * math.sqrt(total)
    return Difference(value, value - half, value + half, sizes[0], sizes[1])


def log_ratio_change(first: tuple[ArrayLike, ArrayLike], last: tuple[ArrayLike, ArrayLike],
                     confidence: float | None = None) -> Difference:
    """How much a log ratio changes between two settings: (mean log b1 - mean log o1) -
    (mean log b2 - mean log o2) for `first` = (b1, o1) and `last` = (b2, o2), one log_contrast
    over the four samples. Above 0: the ratio is larger at `first`. A direct test of a trend,
    where two overlapping intervals would say nothing; `n_a`, `n_b`: b1's and b2's sizes."""
    found = log_contrast([*first, *last], [1.0, -1.0, -1.0, 1.0], confidence)
    return replace(found, n_b=len(np.asarray(last[0])))


def pooled_log_ratio(pairs: Sequence[tuple[ArrayLike, ArrayLike]],
                     confidence: float | None = None) -> Difference:
    """The log ratio mean(log b) - mean(log o) averaged over groups (b, o): one interval for one
    effect that several groups share (the DataLoader's penalty over 3 and 4 GPUs), narrower than
    any group's own."""
    k = len(pairs)
    if k == 0:
        return Difference(NAN, NAN, NAN)
    return log_contrast([x for pair in pairs for x in pair], [1 / k, -1 / k] * k, confidence)


def pooled_log_ratio_change(groups: Sequence[tuple[tuple[ArrayLike, ArrayLike], tuple[ArrayLike, ArrayLike]]],
                            confidence: float | None = None) -> Difference:
    """log_ratio_change averaged over groups ((b1, o1), (b2, o2)): how much a log ratio changes
    between two settings, one interval for a change that several groups share (the DataLoader's
    penalty without binding minus under it, over 3 and 4 GPUs). Above 0: the ratio is larger at
    the first setting. `n_a`, `n_b`: the first group's b1 and b2 sizes."""
    k = len(groups)
    if k == 0:
        return Difference(NAN, NAN, NAN)
    samples = [x for first, last in groups for x in (*first, *last)]
    found = log_contrast(samples, [w / k for w in (1.0, -1.0, -1.0, 1.0)] * k, confidence)
    return replace(found, n_b=len(np.asarray(groups[0][1][0])))


def abba_order(pairs: int) -> list[str]:
    """The order of `pairs` pairs of blocks of two arms "A" and "B": A B B A A B B A ... (2 x pairs
    blocks; an odd count ends A B). Pair k is the k-th A with the k-th B; within each A-B-B-A
    quartet the A goes first in one pair and last in the other, so a drift that is linear over
    the quartet adds +d to one pair's log ratio and -d to the other's, and their mean keeps none
    of it (an A-B order adds -d to every pair)."""
    if pairs < 0:
        raise ValueError(f"pairs must be >= 0, got {pairs}")
    quartet = ["A", "B", "B", "A"]
    return [quartet[i % 4] for i in range(2 * pairs)]


def paired_blocks(order: Sequence[str], values: Sequence[float]) -> tuple[list[float], list[float]]:
    """(a, b): the values of the "A" blocks and of the "B" blocks, each in the order they ran, so
    that a[k] and b[k] are pair k (the k-th A with the k-th B, as abba_order pairs them)."""
    if len(order) != len(values):
        raise ValueError(f"{len(order)} blocks in the order, {len(values)} values")
    a = [v for arm, v in zip(order, values, strict=True) if arm == "A"]
    b = [v for arm, v in zip(order, values, strict=True) if arm == "B"]
    if len(a) != len(b) or len(a) + len(b) != len(order):
        raise ValueError(f"expected as many A blocks as B blocks and no other arm, got {list(order)}")
    return a, b


def paired_log_ratio(a: ArrayLike, b: ArrayLike, confidence: float | None = None) -> Ratio:
    """a over b, pair by pair: exp(mean of log(a_i / b_i)) with Student's t interval over the
    pairs (n - 1 degrees of freedom), exponentiated. What the pairs share (the clocks and the
    load of their moment) leaves their ratio; only what changes within a pair is noise. NaN where
    a value is not positive; the interval NaN with fewer than two pairs, the point twice where
    every pair's ratio is the same."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired samples must have one value each per pair, got {x.shape} and {y.shape}")
    n = len(x)
    if n == 0 or not (np.all(x > 0) and np.all(y > 0)):
        return Ratio(NAN, NAN, NAN, n, n, "paired-log")
    logs = np.log(x) - np.log(y)
    centre = float(logs.mean())
    if n < 2:
        return Ratio(math.exp(centre), NAN, NAN, n, n, "paired-log")
    half = _t(confidence, n - 1) * float(logs.std(ddof=1)) / math.sqrt(n)
    return Ratio(math.exp(centre), math.exp(centre - half), math.exp(centre + half), n, n, "paired-log")


def relative_half_width(ratio: Ratio) -> float:
    """How far the interval reaches from its point, as a share of it, on the wider side:
    max(hi / value - 1, 1 - lo / value) (for a log-symmetric interval exp(half) - 1). "Within
    +-2 %" means this is at most 0.02. NaN where the interval is undefined."""
    if not (ratio.value > 0) or math.isnan(ratio.ci_lo) or math.isnan(ratio.ci_hi):
        return NAN
    return max(ratio.ci_hi / ratio.value - 1.0, 1.0 - ratio.ci_lo / ratio.value)


def level() -> float:
    """The confidence of intervals that are not given one: 95 %, or what confidence_level set."""
    return _LEVEL.get()


def shared_level(groups: int, confidence: float | None = None) -> float:
    """The confidence each of `groups` intervals needs for all of them to hold together at
    `confidence` (the current level by default), by Bonferroni: 1 - (1 - confidence) / groups."""
    base = level() if confidence is None else confidence
    return 1 - (1 - base) / max(1, groups)


def proportion_mean_ci(values: ArrayLike, confidence: float | None = None) -> tuple[float, float]:
    """Interval of the mean of values in [0, 1] (accuracies, fractions) that stays inside
    (0, 1): Student's t on the logit scale around the mean, its standard error carried over by
    the delta method (se / (p (1 - p))), mapped back. Same estimand as the mean itself; (NaN,
    NaN) for fewer than two values, the mean twice when every value is the same."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < 2:
        return NAN, NAN
    p, se = float(x.mean()), float(x.std(ddof=1)) / math.sqrt(n)
    if se == 0 or p <= 0 or p >= 1:
        return p, p
    centre, half = math.log(p / (1 - p)), _t(confidence, n - 1) * se / (p * (1 - p))
    return _expit(centre - half), _expit(centre + half)


def _expit(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def direction(ci_lo: float, ci_hi: float, reference: float = 1.0) -> str:
    """Where an interval lies relative to `reference`: "above", "below", "contains 1" (for a
    reference of 1) or "undetermined"."""
    if math.isnan(ci_lo) or math.isnan(ci_hi):
        return "undetermined"
    if ci_lo > reference:
        return "above"
    if ci_hi < reference:
        return "below"
    return f"contains {reference:g}"


@dataclass(frozen=True)
class Stability:
    """The instability rules of hyperfine, pyperf and torch.utils.benchmark on trial values in
    trial order; NaN where there are fewer than 3 values. `flags` names the rules broken:
    "iqr" (IQR/median > 0.10), "max" (max/median > 1.25), "first" (trial 0 slower than every
    other trial and 5 % above their median: a warm-up effect that crosses trials)."""

    iqr_over_median: float
    max_over_median: float
    first_over_rest: float
    flags: tuple[str, ...]


def stability(values: ArrayLike) -> Stability:
    x = np.asarray(values, dtype=float)
    if len(x) < 3 or np.median(x) <= 0:
        return Stability(NAN, NAN, NAN, ())
    median = float(np.median(x))
    q1, q3 = np.percentile(x, [25, 75])
    iqr, peak = float((q3 - q1) / median), float(x.max() / median)
    rest = x[1:]
    first = float(x[0] / np.median(rest))
    flags = [name for name, broken in (
        ("iqr", iqr > UNSTABLE_IQR), ("max", peak > UNSTABLE_MAX),
        ("first", x[0] > rest.max() and first > FIRST_TRIAL_SLOWER)) if broken]
    return Stability(iqr, peak, first, tuple(flags))


def time_reduction(ratio: float) -> float:
    """Share of the baseline's time saved, from a speed ratio T_base/T_x: 1 - 1/ratio."""
    return 1.0 - 1.0 / ratio


def gain(ratio: float) -> float:
    """Relative speed gain, from a speed ratio T_base/T_x: ratio - 1 (the paper's "+54 %")."""
    return ratio - 1.0
