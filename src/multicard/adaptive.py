"""Trials until the answer is clear (`[trials].count = "auto[:MIN..MAX]"`, `--trials auto`).

The runner runs rounds of interleaved trials (round t = trial t of every config). From round MIN
on, before starting the next round, it asks `decide`: stop once every config's interval on the
primary metric has a relative half-width of at most `half_width` (2 % by default), or when MAX
rounds are done. A config's interval is its ratio to its baseline config (the speedup the report
shows), or, for a baseline config and in a spec without one, the interval of its own mean. The
rule reads only the records, so a resumed run takes the same decisions.

`expected_rounds` is what `plan` shows beside the worst case: the rounds a ratio interval needs at
a given trial-to-trial variation (3 % unless told), from the t quantile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from scipy import stats as sps

from multicard import spec as specmod
from multicard import stats, summarize
from multicard.spec import Auto, Spec

ASSUMED_CV = 0.03


@dataclass(frozen=True)
class Decision:
    stop: bool
    rounds: int  # complete rounds of timing trials so far
    reason: str
    widest: dict[str, float]  # config_id -> relative half-width (NaN: fewer than 2 ok trials)


def half_widths(spec: Spec, records: list[dict[str, Any]]) -> dict[str, float]:
    """config_id -> relative half-width of its primary-metric interval (see the module doc)."""
    trials = summarize.trial_table(_primary_only(spec), records)
    widths = {}
    for cid, config, _ in specmod.configs(spec):
        mine = trials.loc[trials["config_id"] == cid, spec.primary].dropna().to_numpy()
        base_config = specmod.baseline_config(spec, config)
        if base_config is None or base_config == config:
            lo, hi = stats.mean_ci(mine)
            centre = float(mine.mean()) if len(mine) else math.nan
        else:
            base_id = next(c for c, settings, _ in specmod.configs(spec) if settings == base_config)
            base = trials.loc[trials["config_id"] == base_id, spec.primary].dropna().to_numpy()
            ratio = stats.ratio_of_means(base, mine, cross_check=False)
            lo, hi, centre = ratio.ci_lo, ratio.ci_hi, ratio.value
        widths[cid] = (hi - lo) / 2 / abs(centre) if centre and not math.isnan(lo) else math.nan
    return widths


def _primary_only(spec: Spec) -> Spec:
    import dataclasses

    return dataclasses.replace(spec, metrics=[spec.primary])


def decide(spec: Spec, auto: Auto, records: list[dict[str, Any]], rounds_done: int,
           skipped: set[str]) -> Decision:
    """Whether to start another round (configs in `skipped` cannot run here and do not count)."""
    widths = {cid: w for cid, w in half_widths(spec, records).items() if cid not in skipped}
    if rounds_done >= auto.max_rounds:
        return Decision(True, rounds_done, f"reached the most rounds ({auto.max_rounds})", widths)
    if rounds_done < auto.min_rounds:
        return Decision(False, rounds_done, f"fewer than {auto.min_rounds} rounds", widths)
    open_ = {cid: w for cid, w in widths.items() if math.isnan(w) or w > auto.half_width}
    if not open_:
        return Decision(True, rounds_done, f"every interval within +-{auto.half_width:.1%} after "
                        f"{rounds_done} rounds", widths)
    worst = max(open_.values(), key=lambda w: math.inf if math.isnan(w) else w)
    return Decision(False, rounds_done, f"{len(open_)} interval(s) still wider than "
                    f"+-{auto.half_width:.1%} (widest {worst:.1%})", widths)


def expected_rounds(auto: Auto, cv: float = ASSUMED_CV) -> int:
    """Rounds until a ratio of two arms with relative noise `cv` has a half-width within the
    target: t(0.975, 2(n-1)) * cv * sqrt(2 / n) <= half_width."""
    for n in range(max(2, auto.min_rounds), auto.max_rounds + 1):
        if float(sps.t.ppf(0.975, 2 * (n - 1))) * cv * math.sqrt(2 / n) <= auto.half_width:
            return n
    return auto.max_rounds
