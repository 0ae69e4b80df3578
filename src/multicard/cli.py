"""multicard: repeated, verifiable re-runs of the experiments of arXiv 2505.22905.

The command line (docs/design.md "CLI"): one small function per subcommand.

Exit status: 0 ok; 1 a check failed (verify); 2 bad input, reported on one line.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from multicard.errors import InputError, OneLineParser

if TYPE_CHECKING:  # the commands import what they need when they run: `multicard --help` stays fast
    from multicard.plan.spec import PlannedTrial, Shard, Spec
    from multicard.run.runner import Nodes


def cmd_plan(args: argparse.Namespace) -> int:
    from multicard.plan import spec

    if args.save_budget is not None and args.budget is None:
        raise InputError("plan: --save-budget FILE needs --budget DURATION")
    if args.json and args.budget is not None:
        raise InputError("plan: --json prints the trial plan; --budget prints what fits (use one)")
    specs = [_load_spec(path, profile or args.profile, dict(args.set), args) for path, profile in args.spec]
    plans = [spec.plan(s, None, args.trace) for s in specs]
    rates = _calibration(args.calibrate, args.save_calibration)
    if args.json:
        from multicard.plan import calibrate

        print(json.dumps([{"config_id": p.config_id, "config": p.config, "trial": p.trial}
                          | ({"trace": p.trace} if p.trace != "none" else {})
                          | ({"experiment": s.name, "profile": s.profile} if len(specs) > 1 else {})
                          | _estimate_json(calibrate.estimate(s.workload, p.params, rates, p.trace))
                          for s, planned in zip(specs, plans, strict=True) for p in planned],
                         indent=1))
        return 0
    if args.budget is not None:
        # traced trials on top of the timing ones ("first": they are among them, cut with them)
        traced = [0 if s.trace_trials == "first" else
                  sum(p.trace != "none" for p in planned) // max(1, len(spec.configs(s)))
                  for s, planned in zip(specs, plans, strict=True)]
        return _print_budget(specs, traced, [path for path, _ in args.spec], rates, args.budget,
                             args.save_budget, _plan_cv(args))
    wall = device_hours = 0.0
    for s, planned in zip(specs, plans, strict=True):
        seconds, hours = _print_plan(s, planned, table=len(specs) == 1 and not args.summary, rates=rates)
        wall, device_hours = wall + seconds, device_hours + hours
    if len(specs) > 1:
        from multicard.run.runner import format_duration

        print(f"\ntotal: {sum(len(p) for p in plans)} trials; estimated {format_duration(wall)} "
              f"wall, {device_hours:.2f} device-hours (GPU-hours for cuda specs).")
    _print_decidable(specs, [path for path, _ in args.spec])
    if args.power:
        _print_power(specs, [path for path, _ in args.spec], _plan_cv(args))
    return 0


def _plan_cv(args: argparse.Namespace) -> tuple[float, str]:
    """The trial-to-trial CV a plan's power assumes, and where it comes from: --cv, else the
    --calibrate runs' own (the median over their configs), else DEFAULT_POWER_CV, said to be assumed."""
    if args.cv is not None:
        return args.cv, "given with --cv"
    if (found := _calibrated_noise(args.calibrate)) is not None:
        return found
    return DEFAULT_POWER_CV, ("assumed, not measured: --calibrate RUN or --cv X gives the noise of "
                              "your node")


def _load_spec(path: Path, profile: str, settings: dict[str, Any], args: argparse.Namespace) -> Spec:
    """One spec as the command line asks: --set, --trials, and a saved --budget-plan's choice."""
    from multicard.judge import budget
    from multicard.plan import spec

    if args.budget_plan is not None:
        if args.trials is not None:
            raise InputError("--trials and --budget-plan: the budget plan sets the trials (plan it "
                             "with --trials N --budget D instead)")
        return budget.budgeted_spec(path, profile, settings, args.budget_plan)
    return spec.with_trials(spec.load(path, profile, settings), args.trials)


def _calibration(paths: list[Path], save: Path | None) -> dict[str, Any]:
    """Rates fitted from the runs (or calibration files) given, saved where asked."""
    from multicard.plan import calibrate
    from multicard.publish.runs import calibration

    if save is not None and not paths:
        raise InputError("plan: --save-calibration FILE needs --calibrate RUN... (nothing to save)")
    rates = calibration(paths)
    if save is not None:
        dirs = [p for p in paths if p.is_dir()]
        calibrate.save(rates, save, _runs_noise(dirs) if dirs else None)
        print(f"calibration: {len(rates)} rate(s) saved to {save}", file=sys.stderr)
    return rates


def _print_plan(s: Spec, planned: list[PlannedTrial], table: bool,
                rates: dict[str, Any] | None = None) -> tuple[float, float]:
    """Print one spec's plan (its trial table when `table`); return (wall s, device-hours)."""
    from tabulate import tabulate

    from multicard.plan import calibrate, cost, spec
    from multicard.run import runner

    estimates = [calibrate.estimate(s.workload, p.params, rates or {}, p.trace) for p in planned]
    seconds = [e.seconds for e in estimates]
    start = (rates or {}).get(calibrate.run_start_key(s.workload))
    once = start.startup_s if start is not None and planned else 0.0
    if table:
        rows = [[p.order, p.config_id, *p.config.values(), p.trial, p.trace,
                 runner.format_duration(e.seconds), e.how if e.source is None else f"{e.how} ({e.source})"]
                for p, e in zip(planned, estimates, strict=True)]
        print(tabulate(rows, headers=["order", "config_id", *s.grid, "trial", "trace", "estimate", "from"],
                       tablefmt="plain") + "\n")
    device_hours = sum(cost.device_seconds(sec, p.params)
                       for p, sec in zip(planned, seconds, strict=True)) / 3600
    unit = cost.device_unit(str(s.fixed.get("device", "cuda")))
    configs = len(spec.configs(s))
    if s.auto:
        from multicard.judge import adaptive

        print(f"{s.name}: trials auto: {s.auto.pilot_rounds} pilot rounds set the count (not "
              f"judged), then {s.auto.min_judged} to {s.auto.max_rounds - s.auto.pilot_rounds} "
              f"rounds for comparison intervals of +-{s.auto.half_width:.1%}; expected about "
              f"{adaptive.expected_rounds(s.auto)} rounds in all at {adaptive.ASSUMED_CV:.0%} "
              f"trial-to-trial variation; the estimate below is the worst case "
              f"({s.auto.max_rounds} rounds)")
    print(f"{s.name} (profile {s.profile}): {len(planned) // max(1, configs)} trial(s) x {configs} "
          f"configs = {len(planned)} trials"
          f"{' (traced ones included)' if any(p.trace != 'none' for p in planned) else ''}; estimated "
          f"{runner.format_duration(sum(seconds) + once)} wall"
          f"{f' (its one-off start {once:.0f} s, measured, included)' if start is not None else ''}, "
          f"{device_hours:.2f} {unit}. " + _provenance(estimates))
    return sum(seconds) + once, device_hours


def _claims_beside(paths: list[Path], questions: bool = True) -> list[Any]:
    """The claims beside the specs (experiments/ for the paper's), else the paper's own; and the
    artifact's own questions beside them."""
    from multicard.judge import claims

    folder = _claims_folder(paths)
    names = (claims.FILE_NAME, claims.QUESTIONS_FILE) if questions else (claims.FILE_NAME,)
    return [c for path in (folder / name for name in names) if path.is_file() for c in claims.load(path)]


def _print_decidable(specs: list[Spec], paths: list[Path]) -> None:
    """Which claims each spec's run can decide as planned, and which none of them can."""
    from multicard.judge import claims

    claim_list = _claims_beside(paths, questions=False)
    for s in specs:
        print(f"{s.name} (profile {s.profile}) can decide: "
              f"{_decided_text(claim_list, [s], 'no claim')}")
    if len(specs) > 1:
        left = [c for c in claim_list if not all(claims.decided_by(c, specs))]
        print(f"claims these runs cannot decide: {_decided_text(left, specs, 'none', all_parts=False)}")


def _decided_text(claim_list: list[Any], specs: list[Spec], empty: str, all_parts: bool = True) -> str:
    """`C1, C2, C10 (1 of 2 parts)`: the claims (or, all_parts False, the ones missing) with
    how many of their parts the specs can decide where it is not all or none."""
    from multicard.judge import claims

    texts = []
    for claim in claim_list:
        parts = claims.decided_by(claim, specs)
        if all_parts and not any(parts):
            continue
        some = f" ({sum(parts)} of {len(parts)} parts)" if 0 < sum(parts) < len(parts) else ""
        texts.append(claim.id + some)
    return ", ".join(texts) or empty


def _print_power(specs: list[Spec], paths: list[Path], noise: tuple[float, str]) -> None:
    """Each claim the specs can decide: P(supported) where the paper is right at the trials of
    the spec that decides it, and the fewest trials for 80 % (power.py, seed 0, 100 draws); below
    80 % the claim is underpowered, not decidable, at this plan and noise."""
    from tabulate import tabulate

    from multicard.judge import claims, power

    claim_list = _claims_beside(paths, questions=False)
    folder = _claims_folder(paths)
    cv, source = noise
    rows = []
    for claim in claim_list:
        deciding = [s for s in specs for part in (claim.parts or (claim,)) if claims.can_decide(part, s)]
        if not deciding:
            continue
        s = deciding[0]
        counts = _planned_counts(claim, specs)
        found = power.claim_power(claim_list, claim, s.profile, folder, cv,
                                  claims.timing_trials(s), 100, 0, needed=True,
                                  verdict_minimum=s.min_ok,  # a budget plan's, where it lowered it
                                  counts=counts)
        weakest = power.weakest_paper(found)
        trials = ", ".join(f"{n} ({e})" for e, n in counts.items()) if counts else found.trials
        rows.append([claim.id, f"{s.name}@{s.profile}", trials,
                     found.skipped or (f"{weakest:.2f}" if weakest is not None else "–"),
                     found.needed if found.needed is not None else ("> 30" if found.searched else "–"),
                     power_reading(weakest)])
    print(f"\npower at CV {cv:.1%} ({source}; 100 seeded draws per world through the judge; "
          "`multicard claims power` gives every world):")
    print(tabulate(rows, headers=["claim", "decided by", "trials", "P(supported) if the paper is "
                                  "right", "trials for 80 %", "at this plan"], tablefmt="github"))


POWER_TARGET = 0.8  # a claim the plan gives less power than this is underpowered, not decidable


def power_reading(weakest: float | None) -> str:
    if weakest is None:
        return "–"
    return "decidable" if weakest >= POWER_TARGET else f"underpowered (< {POWER_TARGET:.2f})"


def _planned_counts(claim: Any, specs: list[Spec]) -> dict[str, int] | None:
    """Each part's trials per config as the specs planned them, where the plan holds every part
    and they differ (C10: the NUMA test's 30 beside nhwc_layout's 5); else None."""
    from multicard.judge import claims

    parts = claim.parts or (claim,)
    planned = {p.experiment: claims.timing_trials(s) for p in parts for s in specs if claims.can_decide(p, s)}
    whole = len(planned) == len({p.experiment for p in parts})
    return planned if whole and len(set(planned.values())) > 1 else None


def _claims_folder(paths: list[Path]) -> Path:
    from multicard.judge import claims

    beside = paths[0].parent
    return beside if (beside / claims.FILE_NAME).is_file() else claims.default_file().parent


def _budget_power(claim_list: list[Any], folder: Path, cv: float) -> Callable[[Any, int], float | None]:
    """budget.Power: the least P(supported) where the paper is right among an experiment's
    claims at n trials (50 seeded draws each, remembered); below the verdict minimum the budget
    lowers it with the trials (budget.verdict_minimum), and so does the simulation."""
    import functools

    from multicard.judge import budget, power

    by_id = {c.id: c for c in claim_list}

    @functools.cache
    def support(claim_id: str, profile: str, n: int, minimum: int) -> float | None:
        return power.paper_support(claim_list, by_id[claim_id], profile, folder, cv, n,
                                   verdict_minimum=minimum)

    def least(experiment: Any, n: int) -> float | None:
        profile = experiment.name.partition("@")[2] or "paper"
        minimum = min(experiment.min_ok, max(n, budget.TRIALS_FLOOR))
        known = [f for c in experiment.claims if c in by_id
                 and (f := support(c, profile, n, minimum)) is not None]
        return min(known) if known else None

    return least


def _print_budget(specs: list[Spec], traced: list[int], paths: list[Path], rates: dict[str, Any],
                  text: str, save: Path | None, noise: tuple[float, str]) -> int:
    """Fit the specs into the budget and say what each experiment and claim gave up (saved to
    `save` for `run --budget-plan`); 1 when no plan fits (nothing saved, the least plan said)."""
    from multicard.judge import budget
    from multicard.plan import calibrate
    from multicard.run.runner import format_duration

    seconds = budget.parse_duration(text)
    # the claims beside the specs (experiments/ for the paper's), else the paper's own
    claim_list = _claims_beside(paths)
    experiments = [budget.experiment_of(s, claim_list, n, s.trace)
                   for s, n in zip(specs, traced, strict=True)]

    def estimate(workload: str, settings: Any, trace: str) -> float:
        return calibrate.estimate(workload, settings, rates, trace).seconds

    cv = noise[0]
    power = _budget_power(claim_list, _claims_folder(paths), cv)
    chosen = budget.fit(experiments, seconds, estimate, power)
    full = budget.fit(experiments, float("inf"), estimate)
    if not chosen.fits:
        print(f"budget {format_duration(seconds)}: no plan fits; the least plan (every lever at its "
              f"floor) takes {format_duration(chosen.seconds)} of the {format_duration(full.seconds)} "
              "planned:")
    else:
        print(f"budget {format_duration(seconds)}: fits in {format_duration(chosen.seconds)} of the "
              f"{format_duration(full.seconds)} planned")
    lost = {c.experiment.name: budget.given_up(c) for c in chosen.choices}
    for choice in chosen.choices:
        e = choice.experiment
        print(f"  {e.name}: {choice.trials} trial(s) x {len(choice.configs)} configs"
              f"{f', {choice.epochs} epochs' if choice.epochs is not None else ''}, "
              f"{format_duration(choice.seconds(estimate))}: {'; '.join(lost[e.name]) or 'nothing given up'}")
    _print_claims_given_up(chosen.choices, claim_list, power, noise)
    if not chosen.fits:
        return 1
    if save is not None:
        budget.save_plan(budget.plan_document(chosen, text), save)
        print(f"budget plan saved to {save} (multicard run ... --budget-plan {save})")
    return 0


def _print_claims_given_up(choices: tuple[Any, ...], claim_list: list[Any],
                           power: Callable[[Any, int], float | None], noise: tuple[float, str]) -> None:
    """Per claim, what the experiments it reads gave up (dropped configs are none it reads), its
    power where the paper is right (before and after, where their trials went down), and whether
    the plan can still decide it: below POWER_TARGET it is listed as underpowered."""
    from multicard.judge import budget

    cv, source = noise
    lost = {c.experiment.name: budget.given_up(c, by_claims=True) for c in choices}
    underpowered = []
    for claim in claim_list:
        mine = [c for c in choices if claim.id in c.experiment.claims]
        gone = [f"{c.experiment.name}: {'; '.join(lost[c.experiment.name])}" for c in mine
                if lost[c.experiment.name]]
        shown = ""
        if mine:  # at the fewest trials among its experiments, in all of them (conservative)
            fewest = min(mine, key=lambda c: c.trials)
            one = replace(fewest.experiment, claims=(claim.id,))
            before, after = power(one, one.trials), power(one, fewest.trials)
            if after is not None:
                change = f"{before:.2f} -> {after:.2f}" if before is not None and before != after \
                    else f"{after:.2f}"
                shown = f" [P(supported) where the paper is right: {change}]"
                if after < POWER_TARGET:
                    underpowered.append(f"{claim.id} ({after:.2f})")
                    shown += " underpowered: not decidable at this budget"
        print(f"  {claim.id}: {' | '.join(gone) if gone else 'nothing given up'}{shown}"
              f"{'' if mine else ' (no experiment of this plan reads it)'}")
    print(f"power at CV {cv:.1%} ({source}); underpowered (P(supported) where the paper is right "
          f"< {POWER_TARGET:.2f}): {', '.join(underpowered) or 'none'}")


def _estimate_json(found: Any) -> dict[str, Any]:
    return {"estimate_s": round(found.seconds, 1), "estimate": found.how,
            **({"estimate_from": found.source} if found.source else {})}


def _provenance(estimates: list[Any]) -> str:
    measured = sum(e.how == "measured" for e in estimates)
    scaled = sum(e.how == "scaled" for e in estimates)
    if not measured and not scaled:
        return "Cost model: src/multicard/plan/cost.py, guessed (CUDA rates are estimates)."
    carried = (f"{scaled} scaled from a rate measured at another image size, batch or one-rank DDP "
               "(plan/calibrate.py scaled_estimate), ") if scaled else ""
    return (f"{measured} of {len(estimates)} trial estimates measured (plan --calibrate), {carried}"
            f"{len(estimates) - measured - scaled} guessed (src/multicard/plan/cost.py).")


def cmd_run(args: argparse.Namespace) -> int:
    from multicard.plan import spec
    from multicard.run import runner

    if args.rdzv_endpoint is not None:
        rendezvous_endpoint(args.rdzv_endpoint)
    overrides = dict(args.set) | ({"nnodes": args.nnodes} if args.nnodes else {})
    s = _load_spec(args.spec, args.profile, overrides, args)
    if not spec.configs(s):
        print(f"{s.name}@{s.profile}: nothing to run, the budget plan dropped every config "
              f"({'; '.join(s.budget.given_up) if s.budget else 'none kept'})")
        return 0
    nnodes = max(int(settings["nnodes"]) for _, _, settings in spec.configs(s))
    out = args.out or Path("artifact/runs") / (
        f"{s.name}-{s.profile}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}")
    if args.dry_run:
        return _show_dry_run(s, out, args, nnodes)
    _check_out(out)
    outcome = runner.run(s, out, trace=args.trace, nodes=_nodes(args, nnodes) if nnodes > 1 else None,
                         deadline_unix=args.deadline if args.deadline is not None else _env_deadline(),
                         shard=_shard(args), rates=_calibration(args.calibrate, None))
    print(f"next: multicard report {outcome.out}")
    if outcome.left:  # not a failure: the rest needs more time than was left
        print(f"multicard: {outcome.left} trial(s) left for the next run (exit status 3): run the "
              "same command to go on", file=sys.stderr)
        return 3
    return 0


def _show_dry_run(s: Spec, out: Path, args: argparse.Namespace, nnodes: int) -> int:
    from multicard.run import runner

    nodes = _nodes(args, nnodes, check_allocation=False) if nnodes > 1 else None
    shown = runner.dry_run(s, out, nodes=nodes, shard=_shard(args))
    for what, parts in shown:
        print(what)
        for part in parts:
            print(f"  {shlex.join(part)}")
    print(f"{len(shown)} trial(s) would start; nothing was started or written")
    return 0


def _shard(args: argparse.Namespace) -> Shard | None:
    """--shard I/N, else $MULTICARD_SHARD (the single-node template sets it in a job array)."""
    from multicard.plan import spec

    text = args.shard or os.environ.get("MULTICARD_SHARD")
    return spec.parse_shard(text) if text else None


def _env_deadline() -> float | None:
    """$MULTICARD_DEADLINE (a Slurm template sets it from the job's end), as --deadline reads it."""
    text = os.environ.get("MULTICARD_DEADLINE")
    try:
        return deadline(text) if text else None
    except argparse.ArgumentTypeError as exc:
        raise InputError(f"MULTICARD_DEADLINE: {exc}") from None


def deadline(text: str) -> float:
    """`--deadline`: `@UNIX_SECONDS` or an ISO 8601 time (UTC unless it says otherwise)."""
    try:
        if text.startswith("@"):
            return float(text[1:])
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected @UNIX_SECONDS or an ISO 8601 time, got {text!r}") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def rendezvous_endpoint(text: str) -> tuple[str, int]:
    """`HOST:PORT` (or `[IPv6]:PORT`) -> (host, port); bad input otherwise."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not re.fullmatch(r"[0-9]{1,5}", port) or not 1 <= int(port) <= 65535 \
            or any(c.isspace() for c in host):
        raise InputError(f"--rdzv-endpoint: expected HOST:PORT with a port 1-65535, got {text!r}")
    return host, int(port)


def _nodes(args: argparse.Namespace, nnodes: int, check_allocation: bool = True) -> Nodes:
    """How trials across nodes are launched; bad input when something is missing."""
    from multicard.run import cluster, runner

    if args.rdzv_endpoint is None:
        raise InputError("run: nnodes > 1 needs --rdzv-endpoint HOST:PORT (the first node's host "
                         "and a free port below 32768, outside the ephemeral range)")
    launcher = cluster.make_launcher(args.launcher, args.node_rank_env, args.step_wrapper, nnodes,
                                     os.environ, args.node_python, check_allocation)
    stage = args.stage_dir or os.environ.get("MULTICARD_STAGE_DIR")
    return runner.Nodes(launcher, args.rdzv_endpoint, Path(stage) if stage else None)


def _check_out(out: Path) -> None:
    """--out must be a directory this process can write (checked before anything starts)."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: --out exists and is not a directory")
    existing = next((p for p in [out, *out.parents] if p.exists()), None)
    if existing is not None and not _writable(existing):
        raise InputError(f"{existing}: not writable (read-only file system or no permission); "
                         f"--out {out} cannot be created or written")


def _writable(directory: Path) -> bool:
    """Whether a file can really be created in `directory` (root ignores permission bits, so
    os.access would say yes on a read-only mount)."""
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=directory):
            return True
    except OSError:
        return False


def cmd_first_evidence(args: argparse.Namespace) -> int:
    from multicard import first_evidence

    return first_evidence.main(args)


def cmd_report(args: argparse.Namespace) -> int:
    from multicard.judge import claims
    from multicard.publish import document, runs

    if args.out is None and len(args.dirs) != 1:
        raise InputError("report: several DIRs need --out (where REPORT.md and tables go)")
    for directory in args.dirs:
        runs.discover_runs(directory)  # each DIR holds runs: checked before anything is made
    out = args.out or args.dirs[0]
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: --out exists and is not a directory")
    claim_file = args.claims or claims.default_file()
    claim_list = claims.load(claim_file) if args.claims or claim_file.is_file() else None
    question_file = claims.default_file(claims.QUESTIONS_FILE)
    questions = claims.load(question_file) if question_file.is_file() else None
    make_dir(out, "--out")
    try:
        sums = document.write_report(args.dirs, out, claim_list, echo=print, questions=questions)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
            raise
        print(f"multicard: error: {out}: {exc.strerror} while writing the report; its SHA256SUMS "
              "is not up to date: free space and run the report again", file=sys.stderr)
        return 1
    print(f"wrote {out / 'REPORT.md'}, tables/, figures/ and {sums}")
    return 0


def make_dir(path: Path, what: str) -> None:
    """mkdir -p, or one line of bad input saying why not."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{path}: {what} cannot be created ({exc.strerror})") from None


def cmd_verify(args: argparse.Namespace) -> int:
    from multicard import integrity
    from multicard.publish import pack

    if args.path.is_dir():
        return _print_verify(args.path, integrity.verify(args.path), integrity.SUMS_FILE)
    if not args.path.exists():
        raise InputError(f"{args.path}: no such directory or archive")
    return _print_verify(args.path, pack.verify_archive(args.path), integrity.SUMS_FILE)


def cmd_pack(args: argparse.Namespace) -> int:
    from multicard import integrity
    from multicard.publish import pack

    if not args.dir.is_dir():
        raise InputError(f"{args.dir}: not a directory")
    if not (args.dir / integrity.SUMS_FILE).is_file():
        raise InputError(f"{args.dir}: no {integrity.SUMS_FILE}; run `multicard report {args.dir}` first")
    status = _print_verify(args.dir, integrity.verify(args.dir), integrity.SUMS_FILE)
    if status:
        print(f"{args.dir}: not packed, its files do not match {integrity.SUMS_FILE}")
        return status
    target = args.out or pack.default_target(args.dir)
    if target.is_dir():
        raise InputError(f"{target}: --out is a directory; name the archive file (e.g. {target}/"
                         f"{args.dir.resolve().name}{pack.SUFFIX})")
    if target.exists() and not target.is_file():
        raise InputError(f"{target}: --out exists and is not a regular file (a device, FIFO or "
                         "socket is never replaced)")
    print(pack.pack(args.dir, target))
    return 0


def cmd_trace_summarize(args: argparse.Namespace) -> int:
    from multicard.profiling import parse

    print(json.dumps({str(path): parse.summarize(path) for path in args.files}, indent=1))
    return 0


def cmd_claims_power(args: argparse.Namespace) -> int:
    from multicard.judge import claims, power
    from multicard.publish.tables import display_power, render_markdown

    path = args.claims or claims.default_file()
    claim_list = claims.load(path)
    chosen = [c for c in claim_list if not args.claim or c.id in args.claim]
    unknown = sorted(set(args.claim or ()) - {c.id for c in claim_list})
    if unknown:
        raise InputError(f"claims power: --claim: no claim {', '.join(unknown)} in {path}")
    if args.calibrate and args.cv is not None:
        raise InputError("claims power: --cv X or --calibrate RUN... (the noise drawn), not both")
    cvs, source = args.cv or [DEFAULT_POWER_CV], ""
    if args.calibrate:
        cvs, source = _measured_cv(args.calibrate)
    found = power.claims_power(chosen, args.profile, path.parent, cvs, args.trials, args.runs,
                               args.seed, needed=not args.no_needed)
    if args.json:
        print(json.dumps([{"claim": f.claim.id, "cv": f.cv, "trials": f.trials, "skipped": f.skipped,
                           "trials_for_80pct": f.needed,
                           "worlds": [{"world": r.world, "role": r.role, "runs": r.runs,
                                       "shares": r.shares} for r in f.rows]} for f in found], indent=1))
        return 0
    print(render_markdown(display_power(found)), end="")
    print(f"{args.runs} seeded draws per row (seed {args.seed}) through the verdict rules of {path}, "
          f"profile {args.profile}; 'holds': the paper right (paper), no effect (none), half the "
          "paper's effect (half), shown only (other)" + (f"; CV {source}" if source else ""))
    return 0


def _measured_cv(paths: list[Path]) -> tuple[list[float], str]:
    found = _calibrated_noise(paths)
    if found is None:
        named = ", ".join(map(str, paths))
        raise InputError(f"claims power: --calibrate: no config with 2 ok trials in {named}, and no "
                         "noise saved in a calibration file among them")
    return [found[0]], f"{found[0]:.1%} {found[1]}"


def _calibrated_noise(paths: list[Path]) -> tuple[float, str] | None:
    """The trial-to-trial CV of the finished runs among `paths`, else the one a calibration file
    among them saved, with where it comes from; None without either."""
    from multicard.plan import calibrate

    dirs = [p for p in paths if p.is_dir()]
    if dirs and (found := _runs_noise(dirs)) is not None:
        return found[0], f"measured: the median over {found[1]} config(s) of the --calibrate runs"
    for saved in (p for p in paths if p.is_file()):
        if (noise := calibrate.load_noise(saved)) is not None:
            return noise[0], f"measured: the median over {noise[1]} config(s), saved in {saved}"
    return None


def _runs_noise(dirs: list[Path]) -> tuple[float, int] | None:
    """The finished runs' trial-to-trial CV (power.measured_cv) and its configs; None without any."""
    from multicard.judge import power, summarize
    from multicard.publish.runs import discover_runs, load_run

    runs = [load_run(p) for d in dirs for p in discover_runs(d)]
    cv, configs = power.measured_cv([(r.spec, summarize.trial_table(r.spec, r.records)) for r in runs])
    return None if cv is None else (cv, configs)


def cmd_list(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from multicard.judge import catalog, claims

    claims_file = args.claims or claims.default_file()
    questions = claims_file.parent / claims.QUESTIONS_FILE
    claim_list = claims.load(claims_file) + (claims.load(questions) if questions.is_file() else [])
    found = catalog.experiments(args.experiments or claims_file.parent, claim_list)
    rows = [[e.file, e.workload, "\n".join(f"{p}: {n} configs x {t}" for p, n, t in e.profiles),
             " ".join(e.claims) or "-"] for e in found]
    print(tabulate(rows, headers=["experiment", "workload", "profiles (configs x trials)", "claims"],
                   tablefmt="simple_grid", maxcolwidths=[None, None, None, 30]))
    rows = [[c.id, "\n".join(catalog.read_by(c)), c.kind, c.text] for c in claim_list]
    print(tabulate(rows, headers=["claim", "experiments", "kind", "statement"],
                   tablefmt="simple_grid", maxcolwidths=[None, 24, None, 60]))
    return 0


def cmd_topo(args: argparse.Namespace) -> int:
    from multicard.measure import numa

    topology = numa.from_files(args.files) if args.files else numa.live()
    print(json.dumps(topology.to_json(), indent=1))
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from multicard.data import mnist
    from multicard.measure import environment

    print(json.dumps(environment.capture_env(mnist.default_root()), indent=1))
    return 0


def cmd_data_verify(args: argparse.Namespace) -> int:
    from multicard.data import mnist, scenario_b

    if args.dir is None:
        root = args.root or mnist.default_root()
        mnist.verify(root / "mnist")
        print(f"{root / 'mnist'}: all {len(mnist.SHA256)} MNIST files match their SHA-256")
        return 0
    result = scenario_b.verify(args.dir)
    return _print_verify(args.dir, result, scenario_b.MANIFEST)


def cmd_data_prepare(args: argparse.Namespace) -> int:
    from multicard.data import mnist, scenario_b

    root = args.root or mnist.default_root()
    out = args.out or scenario_b.tree_path(root, args.size, args.format)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: --out exists and is not a directory")
    if (blocked := next((p for p in out.parents if p.exists() and not p.is_dir()), None)) is not None:
        raise InputError(f"{out}: --out cannot be created ({blocked} is a file)")
    request = scenario_b.Request(root / "mnist", out, args.size, args.format, args.limit)
    from multicard.run.stopping import stop_on_signals

    with stop_on_signals():  # SIGTERM ends the workers too; a resume finishes the tree
        scenario_b.prepare(request, workers=args.workers)
    return 0


def cmd_data_fetch_llm(args: argparse.Namespace) -> int:
    from multicard.data import llm, mnist

    out = args.out or mnist.derived_root(args.root or mnist.default_root()) / "llm" / "real"
    llm.fetch(out, args.rows)
    print(f"{out}: {args.rows} records of each dataset, checksums in {out / 'dataset.json'}")
    return 0


def _print_verify(directory: Path, result: Any, sums_name: str) -> int:
    for kind in ("unsafe", "malformed", "missing", "changed", "unlisted"):
        for item in getattr(result, kind):
            print(f"{kind.upper()}: {item}")
    if result.ok:
        print(f"{directory}: all files match {sums_name}")
        return 0
    return 1


DEFAULT_POWER_CV = 0.02  # `claims power` without --cv or --calibrate
EXAMPLES = """examples:
  multicard list                                        experiments, profiles and claims
  multicard plan experiments/table2_precision.toml --profile kick --power
  multicard run experiments/table2_precision.toml --profile kick --out runs/t2
  multicard report runs/t2                              tables, figures, REPORT.md, SHA256SUMS
  multicard verify runs/t2 && multicard pack runs/t2    check every file, then archive it
  multicard claims power --profile kick --cv 0.02 0.05  what each verdict reads where the paper is right

Each command's own --help has its options. Exit status: 0 ok, 1 a check failed, 2 bad input."""


def build_parser() -> argparse.ArgumentParser:
    from multicard import __version__

    parser = OneLineParser(prog="multicard", description=__doc__.splitlines()[0], epilog=EXAMPLES,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"multicard {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser,
                                metavar="COMMAND")

    def add(name: str, func: Callable[[argparse.Namespace], int], help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        return p

    p = add("plan", cmd_plan, "print the trial plan and its estimated cost; runs nothing")
    _spec_args(p, several=True)
    p.add_argument("--json", action="store_true", help="[{config_id, config, trial}, ...]")
    p.add_argument("--summary", action="store_true", help="one line per SPEC, no trial table")
    p.add_argument("--calibrate", type=Path, nargs="+", default=[], metavar="RUN",
                   help="estimate from rates measured in these finished runs (directories) or "
                        "calibration files; each estimate says measured or guessed")
    p.add_argument("--budget", metavar="DURATION",
                   help="fit the plan into DURATION (24h, 1h30m, 2d): fewer configs no claim reads, "
                        "then fewer trials (never below the verdict minimum; first where the "
                        "claims keep the most power at --cv), then fewer epochs "
                        "(never below what the claims need); says what each claim gives up")
    p.add_argument("--save-budget", type=Path, metavar="FILE",
                   help="with --budget: save the plan that fits, for `run --budget-plan FILE`")
    p.add_argument("--save-calibration", type=Path, metavar="FILE",
                   help="write the rates --calibrate fitted to FILE (for a later --calibrate FILE)")
    p.add_argument("--power", action="store_true",
                   help="after the plan, each claim's P(supported) where the paper is right at the "
                        "planned trials and the trials it needs for 80 %% (simulated: minutes)")
    p.add_argument("--cv", type=_fraction, metavar="X",
                   help="trial-to-trial CV that --power and --budget assume (default: the "
                        f"--calibrate runs' own, else {DEFAULT_POWER_CV}, said to be assumed)")

    p = add("run", cmd_run, "run (or resume) an experiment")
    _spec_args(p)
    p.add_argument("--out", type=Path, help="run directory (default artifact/runs/<name>-<profile>-<UTC>)")
    p.add_argument("--nnodes", type=_bounded_int(1, 4096),
                   help="nodes per trial: each trial is one launcher step over them; this "
                        "command runs once (on the first node)")
    p.add_argument("--rdzv-endpoint", metavar="HOST:PORT",
                   help="where the nodes of a trial meet, for --nnodes > 1: the first node and "
                        "a port below 32768 (e.g. node1:29500)")
    p.add_argument("--launcher", default="srun",
                   help="what starts a trial's part on every node (default srun: one task per "
                        "node); another command needs --node-rank-env")
    p.add_argument("--node-rank-env", metavar="VAR",
                   help="the variable in which the launcher tells each node its index "
                        "(default for srun: SLURM_NODEID)")
    p.add_argument("--step-wrapper", metavar="WORDS",
                   help="words between the launcher and each node's part, from an absolute path, "
                        "e.g. '/usr/bin/apptainer exec --nv /scratch/multicard.sif'")
    p.add_argument("--stage-dir", type=Path, metavar="DIR",
                   help="across nodes: node-local disk where each node copies a Scenario B tree "
                        "before a trial reads it (a disk-cold read off shared storage is not one; "
                        "default $MULTICARD_STAGE_DIR)")
    p.add_argument("--node-python", metavar="PATH",
                   help="the Python of each node's part (default: python3 inside --step-wrapper, "
                        "else this one)")
    p.add_argument("--shard", metavar="I/N",
                   help="run only part I of N of the plan (every N-th planned trial from I on; "
                        "default $MULTICARD_SHARD), e.g. one task of a Slurm array each; `multicard "
                        "report` merges the parts")
    p.add_argument("--dry-run", action="store_true",
                   help="print each trial's command lines (across nodes: the launcher, each node's "
                        "part, torchrun) and start nothing")
    p.add_argument("--deadline", type=deadline, metavar="@UNIX|ISO",
                   help="start no trial whose estimate reaches past this time (a job's time limit; "
                        "default $MULTICARD_DEADLINE); the rest is left for the next run (left.json), "
                        "exit status 3")
    p.add_argument("--calibrate", type=Path, nargs="+", default=[], metavar="RUN",
                   help="estimate trials (the ETA, --deadline) from rates measured in these runs or "
                        "calibration files, as `plan --calibrate`; the run's own trials add theirs")

    p = add("first-evidence", cmd_first_evidence, "one GPU, at most 9 minutes: the step profile, "
            "FP64/FP32/FP16 at 224 px x 5 trials (C1, C2; C3 read), report and verify; "
            "--dry-run prints the plan")
    p.add_argument("--out", type=Path,
                   help="the collection (default artifact/runs/1x<gpu>-first-evidence-<UTC>)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan and whether it fits; start nothing (exit 1 if it does not)")
    p.add_argument("--budget-s", type=float, help="the seconds it must fit (default 540)")
    p.add_argument("--calibrate", type=Path, nargs="+", metavar="RUN",
                   help="runs or calibration files the estimates come from (default: the "
                        "collections under artifact/runs/ but smoke and bench)")
    p.add_argument("--experiments", type=Path, default=Path("experiments"),
                   help="where table2_precision.toml is (default experiments/)")

    p = add("list", cmd_list, "the experiments (with their profiles, configs and trials) and the "
            "claims each answers")
    p.add_argument("--experiments", type=Path, metavar="DIR",
                   help="folder of experiment specs (default: experiments/ beside claims.toml)")
    p.add_argument("--claims", type=Path, help="claims file (default: experiments/claims.toml)")

    p = add("report", cmd_report, "tables, figures, REPORT.md and SHA256SUMS for run directories")
    p.add_argument("dirs", type=Path, nargs="+", metavar="DIR",
                   help="run directories (several: one report judging the claims over all)")
    p.add_argument("--out", type=Path, help="output directory (default: DIR when only one is given)")
    p.add_argument("--claims", type=Path, help="claims to judge (default: experiments/claims.toml)")

    p = add("verify", cmd_verify, "check every file of a directory or a packed archive against "
            "SHA256SUMS, without extracting (exit 1 naming bad or unsafe files)")
    p.add_argument("path", type=Path, metavar="DIR|ARCHIVE",
                   help="a run or report directory, or an archive `multicard pack` wrote")

    p = add("pack", cmd_pack, "verify DIR, then write its files and SHA256SUMS to DIR.tar.gz "
            "beside it (deterministic); prints the archive's path")
    p.add_argument("dir", type=Path, metavar="DIR", help="a run or report directory with SHA256SUMS")
    p.add_argument("--out", type=Path, help="archive path (default: DIR.tar.gz beside DIR)")

    add("env", cmd_env, "print the environment record (env.json) to stdout")

    p = add("topo", cmd_topo, "NUMA nodes, GPUs and links as JSON: this machine, or saved outputs "
            "of `numactl --hardware` / `nvidia-smi topo -m`")
    p.add_argument("files", type=Path, nargs="*", metavar="FILE",
                   help="saved `numactl --hardware` and `nvidia-smi topo -m` outputs (none: this "
                        "machine)")

    p = add("claims", lambda a: a.claims_func(a), "the claims' verdict rules")
    claims_sub = p.add_subparsers(dest="claims_command", required=True, parser_class=OneLineParser)
    c = claims_sub.add_parser("power", help="what each claim's verdict reads in worlds where the "
                              "paper is right, half right and wrong: seeded draws through the judge")
    c.add_argument("--claims", type=Path, help="claims file (default: experiments/claims.toml)")
    c.add_argument("--claim", nargs="+", metavar="ID", help="only these claims (e.g. C1 C5)")
    c.add_argument("--profile", default="paper", help="the profile whose grids and trials are drawn")
    c.add_argument("--cv", type=_fraction, nargs="+", default=None, metavar="X",
                   help="run-to-run CV of times (default 0.02; accuracy: 0.1 points per 1 %%)")
    c.add_argument("--calibrate", type=Path, nargs="+", metavar="RUN",
                   help="draw at the CV these finished runs measured (instead of --cv)")
    c.add_argument("--trials", type=_bounded_int(2, 1000),
                   help="trials per config (default: the profile's)")
    c.add_argument("--runs", type=_bounded_int(10, 100_000), default=100,
                   help="draws per world (default 100)")
    c.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")
    c.add_argument("--no-needed", action="store_true", help="skip the trials-for-80%% search")
    c.add_argument("--json", action="store_true", help="one JSON object per claim and world")
    c.set_defaults(claims_func=cmd_claims_power)

    p = add("trace", lambda a: a.trace_func(a), "profiling traces")
    trace_sub = p.add_subparsers(dest="trace_command", required=True, parser_class=OneLineParser)
    t = trace_sub.add_parser("summarize", help="the paper's Nsight metrics of nsys SQLite exports "
                             "or Kineto JSON traces, as JSON keyed by file")
    t.add_argument("files", type=Path, nargs="+", metavar="FILE",
                   help="nsys SQLite exports (.sqlite) or Kineto JSON traces (.json, .json.gz)")
    t.set_defaults(trace_func=cmd_trace_summarize)

    p = add("data", lambda a: a.data_func(a), "datasets")
    data_sub = p.add_subparsers(dest="data_command", required=True, parser_class=OneLineParser)
    v = data_sub.add_parser("verify", help="check a prepared tree against its manifest, or (no "
                            "DIR) the MNIST files against their SHA-256")
    v.add_argument("dir", type=Path, nargs="?", metavar="DIR", help="a prepared Scenario B tree")
    v.add_argument("--root", type=Path, help="folder that holds mnist/ (default: ./data)")
    v.set_defaults(data_func=cmd_data_verify)
    pr = data_sub.add_parser("prepare", help="write Scenario B: MNIST upsampled to NxN as files")
    pr.add_argument("--size", type=_bounded_int(28, 1024), required=True,
                    help="N, 28 to 1024 (the paper: 300, 500)")
    pr.add_argument("--format", default="jpeg", choices=("jpeg", "png", "npy"),
                    help="file format (default jpeg: what both DALI and the DataLoader decode)")
    pr.add_argument("--out", type=Path, help="default: <root>/scenario_b/<N>px-<format>")
    pr.add_argument("--root", type=Path, help="folder that holds mnist/ (default: ./data)")
    pr.add_argument("--limit", type=_bounded_int(0, 60_000), default=0,
                    help="first N images of each split (0 = all)")
    pr.add_argument("--workers", type=_positive_int, help="processes (default: all CPUs)")
    pr.set_defaults(data_func=cmd_data_prepare)
    fe = data_sub.add_parser("fetch-llm", help="download GEC (c4_200m) and SAMSum records into "
                             "local JSON for the LLM experiments (needs the network)")
    fe.add_argument("--rows", type=_positive_int, default=20000, help="records per dataset")
    fe.add_argument("--out", type=Path, help="default: <root>/llm/real")
    fe.add_argument("--root", type=Path, help="folder that holds mnist/ (default: ./data)")
    fe.set_defaults(data_func=cmd_data_fetch_llm)
    return parser


def _spec_args(p: argparse.ArgumentParser, several: bool = False) -> None:
    if several:
        p.add_argument("spec", type=_spec_profile, nargs="+", metavar="SPEC[@PROFILE]",
                       help="experiment TOML(s); @PROFILE overrides --profile for that one; "
                            "several print one line each and a total")
    else:
        p.add_argument("spec", type=Path, metavar="SPEC", help="experiment TOML")
    p.add_argument("--profile", default="paper", help="paper (default) or a profile of the spec")
    p.add_argument("--trials", type=_trials,
                   help="trials per config, at most 1000, or auto[:PILOT..MAX]: PILOT rounds "
                        "whose variances set how many follow, for comparison intervals within "
                        "[trials].half_width (default: the spec's)")
    p.add_argument("--set", type=_setting, action="append", metavar="KEY=VALUE", default=[],
                   help="fix a setting for this run (TOML value; a string may be bare), e.g. "
                        "--set weights=/models/llama3-8b/original; repeatable")
    p.add_argument("--budget-plan", type=Path, metavar="FILE",
                   help="the trials, epochs and configs that `plan --budget D --save-budget FILE` "
                        "chose for this spec")
    p.add_argument("--trace", choices=("none", "torch", "nsys"),
                   help="profile extra trials with the PyTorch profiler or Nsight Systems "
                        "(default: the spec's [trials].trace)")


def _spec_profile(text: str) -> tuple[Path, str | None]:
    """`experiments/numa_binding.toml@controls` -> (path, "controls"); no @: (path, None)."""
    path, sep, profile = text.rpartition("@")
    if sep and path.endswith(".toml") and profile:
        return Path(path), profile
    return Path(text), None


def _setting(text: str) -> tuple[str, Any]:
    import tomllib

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key.strip(), tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return key.strip(), value  # a bare string: a path, a name


def _trials(text: str) -> int | str:
    if text.strip().startswith("auto"):
        from multicard.plan import spec

        try:  # checked now, applied once the spec is loaded
            spec.parse_auto(text, 3, spec.HALF_WIDTH_DEFAULT, "--trials")
        except InputError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("--trials: ")) from None
        return text.strip()
    return _bounded_int(1, 1000)(text)


def _bounded_int(lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = lo - 1
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected an integer from {lo} to {hi}, got {text!r}")
        return value

    return parse


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 1 (0.02 = 2 %), got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      line: str | None = None) -> str:
    return f"multicard: warning: {message}\n"


def main(argv: list[str] | None = None) -> int:
    import warnings

    previous, warnings.formatwarning = warnings.formatwarning, _one_line_warning
    try:  # a warning is one line, like an error
        return _main(argv)
    finally:
        warnings.formatwarning = previous


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except InputError as exc:
        print(f"multicard: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `multicard plan SPEC | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("multicard: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        from multicard.run.runner import RunStopped

        if not isinstance(exc, RunStopped):
            raise
        print(f"multicard: error: {exc}", file=sys.stderr)
        return 1
    except BaseException as exc:
        from multicard.run.stopping import Interrupted

        if not isinstance(exc, Interrupted):
            raise
        where = f"; run the same command to resume {exc.out}" if exc.out else \
            "; run the same command to resume"
        ended = ", the trial in flight ended and recorded as interrupted" if exc.record else ""
        print(f"multicard: stopped by {exc}{ended}{where}", file=sys.stderr)
        return exc.exit_status
