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
    """config_id -> relative half-width of its primary-metric interval (see the module doc); a
    config whose baseline has fewer than 2 ok trials falls back to its own mean's interval."""
    trials = summarize.trial_table(_primary_only(spec), records)
    values = {cid: trials.loc[trials["config_id"] == cid, spec.primary].dropna().to_numpy()
              for cid, _, _ in specmod.configs(spec)}
    widths = {}
    for cid, config, _ in specmod.configs(spec):
        mine = values[cid]
        base_config = specmod.baseline_config(spec, config)
        base_id = next((c for c, settings, _ in specmod.configs(spec) if settings == base_config), None)
        if base_id is None or base_id == cid or len(values[base_id]) < 2:
            lo, hi = stats.mean_ci(mine)
            centre = float(mine.mean()) if len(mine) else math.nan
        else:
            ratio = stats.ratio_of_means(values[base_id], mine, cross_check=False)
            lo, hi, centre = ratio.ci_lo, ratio.ci_hi, ratio.value
        widths[cid] = (hi - lo) / 2 / abs(centre) if centre and not math.isnan(lo) else math.nan
    return widths


def _primary_only(spec: Spec) -> Spec:
    import dataclasses

    return dataclasses.replace(spec, metrics=[spec.primary])


def decide(spec: Spec, auto: Auto, records: list[dict[str, Any]], rounds_done: int,
           skipped: set[str]) -> Decision:
    """Whether to start another round. Configs in `skipped` cannot run here, and configs with
    no ok trial after MIN rounds keep failing: neither holds the run open (both are named)."""
    ok = {r["config_id"] for r in records if r.get("status") == "ok" and r.get("trace", "none") == "none"}
    widths = {cid: w for cid, w in half_widths(spec, records).items() if cid not in skipped}
    failing = sorted(cid for cid in widths if cid not in ok)
    open_ = {cid: w for cid, w in widths.items() if cid not in failing
             and (math.isnan(w) or w > auto.half_width)}
    if rounds_done < auto.min_rounds:
        return Decision(False, rounds_done, f"fewer than {auto.min_rounds} rounds", widths)
    left_out = f"; {len(failing)} config(s) with no ok trial left out" if failing else ""
    if len(failing) == len(widths):
        return Decision(True, rounds_done, f"no config has an ok trial after {rounds_done} rounds",
                        widths)
    if not open_:
        return Decision(True, rounds_done, f"every interval within +-{auto.half_width:.1%} after "
                        f"{rounds_done} rounds{left_out}", widths)
    if rounds_done >= auto.max_rounds:
        return Decision(True, rounds_done, f"reached the most rounds ({auto.max_rounds}) with "
                        f"{len(open_)} interval(s) wider than +-{auto.half_width:.1%}{left_out}",
                        widths)
    worst = max(open_.values(), key=lambda w: math.inf if math.isnan(w) else w)
    widest = "undefined" if math.isnan(worst) else f"{worst:.1%}"
    return Decision(False, rounds_done, f"{len(open_)} interval(s) still wider than "
                    f"+-{auto.half_width:.1%} (widest {widest}){left_out}", widths)


def expected_rounds(auto: Auto, cv: float = ASSUMED_CV) -> int:
    """Rounds until a ratio of two arms with relative noise `cv` has a half-width within the
    target: t(0.975, 2(n-1)) * cv * sqrt(2 / n) <= half_width."""
    for n in range(max(2, auto.min_rounds), auto.max_rounds + 1):
        if float(sps.t.ppf(0.975, 2 * (n - 1))) * cv * math.sqrt(2 / n) <= auto.half_width:
            return n
    return auto.max_rounds
