"""The one entry point: `nox -s <session>`; `nox -l` lists them.

With MULTICARD_IN_CONTAINER=1 (set by the Dockerfile and apptainer.def) every session uses the
running Python, so the image's own torch, DALI and nsys are what is measured. Elsewhere the
sessions share one venv, `.nox/dev`, built with the dev pins of pyproject.toml (torch alone is
5.5 GB; one venv for all sessions instead of one each).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tomllib
from datetime import UTC, datetime
from pathlib import Path

import nox

nox.options.sessions = ["tests"]
nox.options.error_on_missing_interpreters = True

ROOT = Path(__file__).resolve().parent
DEV_VENV = ROOT / ".nox" / "dev"
IN_CONTAINER = os.environ.get("MULTICARD_IN_CONTAINER") == "1"
EXPERIMENTS = ROOT / "experiments"
RUNS = ROOT / "artifact" / "runs"


def dev_python(session: nox.Session) -> str:
    """The interpreter that has the package and its pinned dependencies."""
    if IN_CONTAINER:  # the image installed the package and its pins at build time
        return sys.executable
    python = DEV_VENV / "bin" / "python"
    if not python.exists():
        session.run(sys.executable, "-m", "venv", str(DEV_VENV))
    session.run(str(python), "-m", "pip", "install", "--quiet", "-e", f"{ROOT}[dev]")
    return str(python)


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # nox then sends SIGTERM to the command it runs and waits for it


# Slurm's scancel and pre-emption, and a closed terminal, stop nox with SIGTERM or SIGHUP; by
# default Python would die at once and leave `multicard run` and its trial running.
signal.signal(signal.SIGTERM, _stop)
signal.signal(signal.SIGHUP, _stop)
# how long nox waits for `multicard run` to end its trial and record it before a SIGKILL
STOP_WAIT_S = 30.0


# `multicard run`'s exit status when it left trials for lack of time (--deadline): not a failure
LEFT_FOR_LATER = 3


def multicard(session: nox.Session, python: str, *args: str, success_codes: tuple[int, ...] = (0,)) -> None:
    session.run(python, "-m", "multicard", *args, terminate_timeout=STOP_WAIT_S,
                success_codes=list(success_codes))


def stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


# The three tiers, which together hold every test once: the fast one is every unit test and one
# end-to-end test per real component (marked `e2e`); the slow one is every other test that starts
# real processes, but for the long ones (a minute or more each: plans and budgets checked on real
# runs, multi-node faults), which CI leaves out to stay under 45 minutes. GPU tests are in any of
# them and skip without CUDA.
FAST_TIER = "not slow or e2e"
SLOW_TIER = "slow and not e2e and not long"
LONG_TIER = "slow and not e2e and long"


# Inside the image, what the image itself changes: each real component end to end (`e2e`) and the
# fast tests of the modules that load its dependencies (DALI, torchvision, torchtune, torch's
# launcher and TF32 defaults, NVML, numactl, the profilers). The rest of the suite reads no
# dependency the image swaps, and the host's tiers ran it.
IMAGE_TESTS = ("tests/integration", "tests/unit/loaders", "tests/unit/workloads", "tests/unit/measure",
               "tests/unit/profiling", "tests/unit/data", "tests/unit/plan", "tests/unit/test_plain_loop.py")


def pytest_args(session: nox.Session, tier: str, paths: tuple[str, ...] = ("tests",)) -> list[str]:
    """The session's extra args, or else the tier's selection of `paths` (naming its 15 slowest
    tests: where a tier's time goes is in every log)."""
    return list(session.posargs) or ["-m", tier, "--durations=15", *paths]


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """The fast tier: unit tests and one end-to-end test per real component (a few minutes on
    2 cores). Extra args go to pytest instead of the tier's selection."""
    python = dev_python(session)
    session.run(python, "-m", "pytest", *pytest_args(session, FAST_TIER))


@nox.session(name="tests-slow", python=False)
def tests_slow(session: nox.Session) -> None:
    """Every test the fast tier leaves out (real trials, signals and timeouts, multi-node),
    but for the long ones (`tests-long`). Extra args go to pytest as for `tests`."""
    python = dev_python(session)
    session.run(python, "-m", "pytest", *pytest_args(session, SLOW_TIER))


@nox.session(name="tests-long", python=False)
def tests_long(session: nox.Session) -> None:
    """The long tests (a minute or more each) that neither other tier runs: `nox -s tests
    tests-slow tests-long` runs the whole suite once. Extra args go to pytest as for `tests`."""
    python = dev_python(session)
    session.run(python, "-m", "pytest", *pytest_args(session, LONG_TIER))


@nox.session(python=False)
def lint(session: nox.Session) -> None:
    """ruff over the package, tests, benchmarks, the container, lock and import-graph tools, and
    this file; then the package's import graph against its pipeline order (tools/import_graph.py)."""
    python = dev_python(session)
    session.run(python, "-m", "ruff", "check", "src", "tests", "benchmarks", "containers", "requirements",
                "tools", "noxfile.py")
    session.run(python, "tools/import_graph.py", "--check")


@nox.session(python=False)
def smoke(session: nox.Session) -> None:
    """Every experiment's smoke profiles (`smoke`, `smoke_<what>`) on CPU into
    artifact/runs/smoke-<UTC>/, then report + verify."""
    python = dev_python(session)
    out = RUNS / f"smoke-{stamp()}"
    for spec_file in sorted(EXPERIMENTS.glob("*.toml")):
        text = tomllib.loads(spec_file.read_text())
        profiles = [p for p in text.get("profiles", {}) if p == "smoke" or p.startswith("smoke_")]
        if not profiles or "experiment" not in text:
            continue
        if why := os.environ.get(f"MULTICARD_NO_{text['experiment']['workload'].upper()}"):
            session.log(f"smoke: {spec_file.stem} left out: {why}")  # e.g. the paper-exact image
            continue
        for profile in profiles:
            name = spec_file.stem + profile.removeprefix("smoke")
            multicard(session, python, "run", str(spec_file), "--profile", profile, "--out", str(out / name))
    multicard(session, python, "report", str(out))
    multicard(session, python, "verify", str(out))
    session.log(f"smoke run: {out}")


def _take(args: list[str], flag: str) -> tuple[str | None, list[str]]:
    """The value of `flag VALUE` in `args`, and `args` without them."""
    if flag not in args:
        return None, args
    at = args.index(flag)
    if at + 1 == len(args):
        raise SystemExit(f"nox: {flag} needs a value")
    return args[at + 1], args[:at] + args[at + 2:]


def _paper_session(session: nox.Session, experiment: str) -> None:
    """Plan, run, report and verify one experiment; `-- ARGS` go to `multicard run`."""
    python = dev_python(session)
    given, args = _take(list(session.posargs), "--out")
    out = Path(given) if given else RUNS / f"{experiment}-{stamp()}"
    spec_file = str(EXPERIMENTS / f"{experiment}.toml")
    multicard(session, python, "plan", spec_file, *args)
    multicard(session, python, "run", spec_file, *args, "--out", str(out),
              success_codes=(0, LEFT_FOR_LATER))
    if os.environ.get("MULTICARD_REPORT_ELSEWHERE") == "1":
        # a Slurm job: its report job writes them once it has ended (slurm/job.sh), where no
        # time limit can cut them short
        session.log(f"report and verify of {out}: left to the report job")
        return
    multicard(session, python, "report", str(out))
    multicard(session, python, "verify", str(out))


@nox.session(python=False)
def table2(session: nox.Session) -> None:
    """Table 2 (precision, Scenario A) on GPUs with the paper profile; -- ARGS to `multicard run`."""
    _paper_session(session, "table2_precision")


@nox.session(python=False)
def table3(session: nox.Session) -> None:
    """Table 3 (pin_memory on/off, Scenario A) on GPUs; -- ARGS to `multicard run`."""
    _paper_session(session, "table3_pin_memory")


@nox.session(python=False)
def figure6(session: nox.Session) -> None:
    """Figure 6 (DataLoader vs DALI vs synthetic, Scenario B 300/500) on GPUs; -- ARGS to run."""
    _paper_session(session, "figure6_loaders")


@nox.session(python=False)
def nhwc(session: nox.Session) -> None:
    """Figure 9 (NCHW vs NHWC with DataLoader and DALI, Scenario B) on GPUs; -- ARGS to run."""
    _paper_session(session, "nhwc_layout")


@nox.session(python=False)
def table4(session: nox.Session) -> None:
    """Table 4 (Llama3-8B LoRA/QLoRA/DPO/QAT/full x GEC/SAMSum x 1-4 GPUs, torchtune); -- ARGS to run."""
    _paper_session(session, "table4_llm_methods")


@nox.session(python=False)
def table5(session: nox.Session) -> None:
    """Table 5 (pin_memory off/on in Llama3-8B LoRA tuning, 1-4 GPUs); -- ARGS to `multicard run`."""
    _paper_session(session, "table5_llm_pin_memory")


@nox.session(python=False)
def numa(session: nox.Session) -> None:
    """The NUMA test (binding policies, placement evidence, verdict); `-- --profile controls` for
    the alternative explanations, `-- --profile dali_affinity` for DALI's thread affinity."""
    _paper_session(session, "numa_binding")


@nox.session(python=False, name="first-evidence")
def first_evidence(session: nox.Session) -> None:
    """One GPU, at most 9 minutes: the step profile, FP64/FP32/FP16 at 224 px x 5 trials (C1,
    C2; C3 read), report and verify, into artifact/runs/1x<gpu>-first-evidence-<UTC>/; `--
    --dry-run` prints the plan (exit 1 if it does not fit), `-- --out DIR` goes on."""
    python = dev_python(session)
    multicard(session, python, "first-evidence", *session.posargs, success_codes=(0, LEFT_FOR_LATER))


@nox.session(python=False, name="device-check")
def device_check(session: nox.Session) -> None:
    """benchmarks/device_check.py: one GPU, under 8 minutes, into artifact/runs/<gpu>-device-check-<UTC>/;
    `-- --dry-run` prints the plan, `-- --device cpu` runs it on CPU."""
    python = dev_python(session)
    session.run(python, str(ROOT / "benchmarks" / "device_check.py"), *session.posargs,
                terminate_timeout=STOP_WAIT_S)


@nox.session(python=False)
def container(session: nox.Session) -> None:
    """Host side, podman as root: build an NGC-24.11-like stand-in base and the Dockerfile on it,
    run smoke and the CPU tests inside as a host user (uid 1000, no network, read-only root),
    verify on the host, build apptainer.def and run its %test (containers/podman_build.py).
    Inside, the fast tier of IMAGE_TESTS; extra args go to pytest there instead."""
    if IN_CONTAINER:
        session.error("nox -s container builds images: run it on the host, not inside one")
    python = dev_python(session)
    session.run(python, str(ROOT / "containers" / "podman_build.py"),
                *pytest_args(session, FAST_TIER, IMAGE_TESTS), terminate_timeout=STOP_WAIT_S)


@nox.session(python=False)
def locks(session: nox.Session) -> None:
    """Every pin of the images' hashed locks: the file pip would install on that image's platform
    has its hash in the lock, by the registry's metadata (requirements/check_locks.py; seconds)."""
    python = dev_python(session)
    session.run(python, str(ROOT / "requirements" / "check_locks.py"), *session.posargs)


@nox.session(name="locks-download", python=False)
def locks_download(session: nox.Session) -> None:
    """As `locks`, but every file is downloaded and pip checks its hash (about 3 GB the first
    time, kept under .nox/locks/)."""
    python = dev_python(session)
    session.run(python, str(ROOT / "requirements" / "check_locks.py"), "--download", *session.posargs)


# The paper's experiments in the order `reproduce` runs them: (experiment, profile).
PAPER_RUNS = (
    ("table2_precision", "paper"), ("table2_precision", "traced"), ("table3_pin_memory", "paper"),
    ("figure6_loaders", "paper"),
    ("figure6_loaders", "loader_only"), ("nhwc_layout", "paper"), ("numa_binding", "paper"),
    ("numa_binding", "controls"), ("numa_binding", "dali_affinity"), ("table4_llm_methods", "paper"),
    ("table4_llm_methods", "datasets"), ("table4_llm_methods", "traced"), ("table5_llm_pin_memory", "paper"),
)
# The rates the last kick-the-tires measured, read by every plan of reproduce and kick-the-tires
CALIBRATION = RUNS / "calibration.json"
BUDGET_PLAN = "budget.json"  # in a collection run with --budget D: what each run kept and gave up
# One GPU, est. 47 minutes: C1-C3 (precision), C5 (pin_memory), the loaders vs the bound.
KICK_RUNS = (("table2_precision", "kick"), ("table3_pin_memory", "kick"), ("figure6_loaders", "kick"))
# Four GPUs, est. 15 h 02 min: the multi-card claims C5-C19 (LLM with random weights), each
# experiment at the trials per config its claims need for 80 % power at 5 % noise (8-30; 3 traced
# for C18); C1-C4 are kick-the-tires' and reproduce's.
EVAL_RUNS = (
    ("table2_precision", "eval"), ("table3_pin_memory", "eval"), ("figure6_loaders", "eval"),
    ("figure6_loaders", "eval_500"), ("nhwc_layout", "eval"), ("numa_binding", "eval"),
    ("table4_llm_methods", "eval"), ("table4_llm_methods", "eval_qat"),
    ("table4_llm_methods", "eval_datasets"), ("table4_llm_methods", "eval_traced"),
    ("table5_llm_pin_memory", "eval"),
)


def _run_collection(session: nox.Session, runs: tuple[tuple[str, str], ...], name: str,
                    save_calibration: bool = False, power: bool = False) -> None:
    """Plan all (printing the cost, from CALIBRATION's measured rates where it exists), then run
    each into one collection, reporting after each so that a stop half-way still leaves a report;
    `-- --dry-run` stops after the plan, `-- --out DIR` resumes, other args (e.g. --trials 3) go
    to `multicard plan` and `multicard run`. `save_calibration`: at the end, the rates this
    collection measured become CALIBRATION. `power`: the plan also says each claim's power."""
    python = dev_python(session)
    args = list(session.posargs)
    dry_run = "--dry-run" in args
    args = [a for a in args if a != "--dry-run"]
    given, args = _take(args, "--out")
    duration, args = _take(args, "--budget")
    out = Path(given) if given else RUNS / f"{name}-{stamp()}"
    specs = [f"{EXPERIMENTS / experiment}.toml@{profile}" for experiment, profile in runs]
    measured = ["--calibrate", str(CALIBRATION)] if CALIBRATION.exists() else []
    budgeted = _budget_plan(session, python, out, duration, dry_run, [*args, *measured, *specs])
    if not budgeted and duration is None:
        multicard(session, python, "plan", "--summary", *(["--power"] if power else []), *args,
                  *measured, *specs)
    if dry_run:
        session.log("--dry-run: nothing started")
        return
    run_args = _take(args, "--trials")[1] if budgeted else args  # the budget plan sets the trials
    for experiment, profile in runs:
        run_dir = out / (experiment if profile == "paper" else f"{experiment}-{profile}")
        multicard(session, python, "run", str(EXPERIMENTS / f"{experiment}.toml"), "--profile", profile,
                  *run_args, *budgeted, "--out", str(run_dir))
        multicard(session, python, "report", str(out))
    multicard(session, python, "verify", str(out))
    session.log(f"{name}: {out}/REPORT.md")
    if save_calibration:  # a later `reproduce -- --dry-run` prints a measured plan
        kept = [str(CALIBRATION)] if CALIBRATION.exists() else []  # rates of keys this run did not measure
        multicard(session, python, "plan", "--summary", *specs, "--calibrate", *kept, str(out),
                  "--save-calibration", str(CALIBRATION))


def _budget_plan(session: nox.Session, python: str, out: Path, duration: str | None, dry_run: bool,
                 plan_args: list[str]) -> list[str]:
    """`--budget D`: fit the collection into D (the session fails when no plan fits) and save the
    choice as OUT/budget.json for every run. A collection that has one (resumed with `--out DIR`,
    with or without `--budget`) keeps the plan it started with."""
    plan_file = out / BUDGET_PLAN
    if plan_file.is_file():
        try:
            started = json.loads(plan_file.read_text(encoding="utf-8"))["duration"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            session.error(f"{plan_file}: not a budget plan ({exc}); move it away to plan afresh")
        if duration is not None and _seconds(session, python, started) != _seconds(session, python, duration):
            session.error(f"{plan_file}: this collection was planned for --budget {started}, not {duration}")
        session.log(f"--budget {started}: resuming with the plan in {plan_file}")
        return ["--budget-plan", str(plan_file)]
    if duration is None:
        return []
    if any(out.glob("*/spec.toml")):
        session.error(f"{out}: this collection was started without --budget; resume it without "
                      "--budget, or start a new one")
    if dry_run:
        multicard(session, python, "plan", "--summary", "--budget", duration, *plan_args)
        return []
    multicard(session, python, "plan", "--summary", "--budget", duration, "--save-budget", str(plan_file),
              *plan_args)
    return ["--budget-plan", str(plan_file)]


def _seconds(session: nox.Session, python: str, duration: str) -> float:
    """`--budget`'s duration in seconds, parsed as `multicard plan` parses it."""
    parsed = session.run(python, "-c", "import sys; from multicard.judge.budget import parse_duration; "
                         "print(parse_duration(sys.argv[1]))", duration, silent=True)
    return float(str(parsed).strip())


@nox.session(python=False)
def reproduce(session: nox.Session) -> None:
    """Every paper experiment in order (plan and cost first; `-- --dry-run` stops there) into
    artifact/runs/reproduce-<UTC>/, one REPORT.md with the claims table; `-- --out DIR` resumes;
    `-- --budget 24h` first fits the plan into 24 hours (trials, epochs, configs no claim reads)."""
    _run_collection(session, PAPER_RUNS, "reproduce")


@nox.session(name="kick-the-tires", python=False)
def kick_the_tires(session: nox.Session) -> None:
    """Est. 47 min on one GPU: Table 2 (FP64/FP32/FP16), Table 3 and Figure 6 at 1 GPU with 5
    trials each, into artifact/runs/kick-<UTC>/ with REPORT.md and its claims table; the plan
    first says each claim's power at the last calibration's noise (underpowered ones named)."""
    _run_collection(session, KICK_RUNS, "kick", save_calibration=True, power=True)


@nox.session(python=False)
def evaluate(session: nox.Session) -> None:
    """Est. 15 h 02 min on 4 GPUs: the multi-card claims C5-C19 (LLM with random weights), plan and
    each claim's power first (`-- --dry-run` stops there), into artifact/runs/evaluate-<UTC>/."""
    _run_collection(session, EVAL_RUNS, "evaluate", power=True)


@nox.session(python=False)
def report(session: nox.Session) -> None:
    """One merged REPORT.md (claims judged over all of them) for the run directories given after
    `--` (default: every GPU run under artifact/runs/) into artifact/reports/<UTC>/."""
    python = dev_python(session)
    given, dirs = _take(list(session.posargs), "--out")
    dirs = dirs or [str(p) for p in sorted(RUNS.iterdir()) if p.is_dir()
                    and not p.name.startswith(("smoke-", "bench-"))]
    if not dirs:
        session.error("no run directory under artifact/runs/ (give some: nox -s report -- DIR...)")
    out = given or str(ROOT / "artifact" / "reports" / stamp())
    multicard(session, python, "report", *dirs, "--out", out)
    multicard(session, python, "verify", out)


@nox.session(python=False)
def verify(session: nox.Session) -> None:
    """Check SHA256SUMS of the given run directories (default: every run under artifact/runs/)."""
    python = dev_python(session)
    dirs = session.posargs or [str(p) for p in sorted(RUNS.iterdir())
                               if (p / "SHA256SUMS").is_file()]
    if not dirs:
        session.error("no run directory with SHA256SUMS under artifact/runs/")
    for directory in dirs:
        multicard(session, python, "verify", directory)


@nox.session(python=False)
def bench(session: nox.Session) -> None:
    """benchmarks/: harness overhead (a smoke trial's wall time split; the harness's epoch path
    against a plain loop, A-B-B-A in one process, into artifact/runs/bench-harness-ab-<UTC>/),
    loader images/s vs the bound, trace-parser speed vs a scan."""
    python = dev_python(session)
    for script in ("harness_overhead.py", "loader_throughput.py", "trace_parse.py"):
        session.run(python, str(ROOT / "benchmarks" / script))
    # on the GPU where there is one (both operating points, about 6 minutes), else the CPU's tiny
    # stand-ins (about a minute on 2 cores): the path, not the numbers
    found = session.run(python, "-c", "import torch; print(torch.cuda.is_available())", silent=True)
    device = "cuda" if str(found).strip().endswith("True") else "cpu"
    out = RUNS / f"bench-harness-ab-{stamp()}" / "harness_ab.json"
    session.run(python, str(ROOT / "benchmarks" / "harness_ab.py"), "--device", device, "--out", str(out))
