"""The bottleneck ladder of a config: images/s with the synthetic loader on the device (the
compute ceiling, FlagPerf's p_core), with the real loader over the training loop (p_train), and
over the whole trial, start-up and evaluation included (p_whole); loader-only images/s beside.

`bound` says what limits training, from real / synthetic throughput with its 95% interval (the
DALI maintainers' check: a loader that does not slow training down leaves nothing to gain):
- compute-bound: the interval lies above COMPUTE_BOUND (the loader costs under 5 %);
- data-bound: it lies below DATA_BOUND (the loader costs over 20 %);
- mixed: it lies between the two;
- unclear: it straddles a threshold (more trials would tell), or it is undefined (< 2 trials).
Pure functions: the report formats, this decides.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from multicard.judge import stats

COMPUTE_BOUND = 0.95
DATA_BOUND = 0.80


@dataclass(frozen=True)
class Bound:
    label: str  # compute-bound, data-bound, mixed, unclear
    ratio: float  # mean real / mean synthetic images/s
    ci_lo: float
    ci_hi: float
    n_real: int
    n_synthetic: int


def classify(real: Sequence[float], synthetic: Sequence[float]) -> Bound:
    """`bound` of a config from its trials' images/s with the real and the synthetic loader."""
    found = stats.ratio_of_means(real, synthetic, cross_check=False)
    return Bound(label(found.ci_lo, found.ci_hi), found.value, found.ci_lo, found.ci_hi,
                 found.n_baseline, found.n_other)


def label(ci_lo: float, ci_hi: float) -> str:
    if math.isnan(ci_lo) or math.isnan(ci_hi):
        return "unclear"
    if ci_lo >= COMPUTE_BOUND:
        return "compute-bound"
    if ci_hi < DATA_BOUND:
        return "data-bound"
    if ci_lo >= DATA_BOUND and ci_hi < COMPUTE_BOUND:
        return "mixed"
    return "unclear"
