"""What a folder of experiments holds: each spec's profiles and trials, and the claims it answers.

`multicard list` prints it; nothing here formats.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from multicard.errors import InputError
from multicard.judge import claims as claimsmod
from multicard.plan import spec as specmod


@dataclass(frozen=True)
class Experiment:
    file: str  # relative to the folder listed
    name: str
    workload: str
    title: str
    profiles: tuple[tuple[str, int, int], ...]  # (profile, configs, trials per config)
    claims: tuple[str, ...]  # ids of the claims that read it


def experiments(folder: Path, claim_list: list[claimsmod.Claim]) -> list[Experiment]:
    """Every spec in `folder` (the claims and questions files are not specs) with each of its
    profiles loaded, so a listed profile is one that loads."""
    found = []
    for path in sorted(folder.glob("*.toml")):
        if path.name in (claimsmod.FILE_NAME, claimsmod.QUESTIONS_FILE):
            continue
        profiles = [specmod.load(path, profile) for profile in profile_names(path)]
        base = profiles[0]
        found.append(Experiment(path.name, base.name, base.workload, base.title,
                                tuple((s.profile, len(specmod.configs(s)), s.trials) for s in profiles),
                                tuple(c.id for c in claim_list if answers(c, base.name))))
    if not found:
        raise InputError(f"{folder}: no experiment specs (*.toml) here")
    return found


def profile_names(path: Path) -> list[str]:
    """`paper` first, then the spec's `[profiles.*]` in the order it names them."""
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"{path}: cannot read the spec ({exc})") from None
    named = doc.get("profiles", {})
    return ["paper", *(p for p in named if p != "paper")] if isinstance(named, dict) else ["paper"]


def read_by(claim: claimsmod.Claim) -> list[str]:
    """The experiments `claim` reads (its parts' included), each once, in the order named."""
    named = [claim.experiment] if claim.experiment else []
    return list(dict.fromkeys(named + [e for part in claim.parts for e in read_by(part)]))


def answers(claim: claimsmod.Claim, experiment: str) -> bool:
    return experiment in read_by(claim)
