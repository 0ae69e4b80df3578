"""The GPU tests within a budget, their failures printed: for a borrowed GPU's few minutes.

    PYTHONPATH=src:. python3 tools/gpu_tests.py --budget-s 240 [--out FILE] [-- PYTEST ARGS]

Runs `pytest tests/gpu -rA --tb=short` (plus PYTEST ARGS) with $MULTICARD_TEST_DEADLINE set
`--budget-s` less a margin from now: no test starts after it (tests/conftest.py), so pytest ends
by itself and prints every failure's traceback and the summary of every test (-rA), where a killed
session would print neither. A test that outruns the budget by more than the margin is still cut
off (SIGINT 20 s before the budget ends, so that pytest writes what it has, then SIGKILL at it).
The output goes to stdout and, with --out, to FILE. Exit status: pytest's, or 124 when it had to be cut off.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what the last test to start may still take, and what pytest's summary needs after it
MARGIN_S = 60.0
INTERRUPT_GRACE_S = 20.0
DEADLINE_ENV = "MULTICARD_TEST_DEADLINE"  # read by tests/conftest.py


def argv(extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "tests/gpu", "-rA", "--tb=short", "-p", "no:cacheprovider",
            *extra]


def main(args: list[str] | None = None) -> int:
    given = sys.argv[1:] if args is None else args
    cut = given.index("--") if "--" in given else len(given)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=240.0, help="the whole session's seconds")
    parser.add_argument("--out", type=Path, help="also write the output here")
    ours = parser.parse_args(given[:cut])
    if ours.budget_s <= MARGIN_S + INTERRUPT_GRACE_S:
        parser.error(f"--budget-s must be more than {MARGIN_S + INTERRUPT_GRACE_S:g} s (the margin and the "
                     "interrupt's grace)")
    started = time.time()
    env = {**os.environ, DEADLINE_ENV: str(started + ours.budget_s - MARGIN_S)}
    proc = subprocess.Popen(argv(given[cut + 1:]), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    # the kill, not the interrupt, falls at the budget: an outer limit of --budget-s still sees
    # pytest's summary
    status = _follow(proc, lines, started + ours.budget_s - INTERRUPT_GRACE_S)
    if ours.out is not None:
        ours.out.write_text("".join(lines))
    return status


def _follow(proc: subprocess.Popen[str], lines: list[str], hard_end: float) -> int:
    """Echo pytest's output as it comes; past `hard_end`, interrupt it, then kill it."""
    import threading

    cut: list[bool] = []

    def cut_off() -> None:
        cut.append(True)
        proc.send_signal(signal.SIGINT)  # pytest prints its summary on a KeyboardInterrupt
        time.sleep(INTERRUPT_GRACE_S)
        if proc.poll() is None:
            proc.kill()

    timer = threading.Timer(max(0.0, hard_end - time.time()), cut_off)
    timer.daemon = True
    timer.start()
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        lines.append(line)
    status = proc.wait()
    timer.cancel()
    return 124 if cut else status


if __name__ == "__main__":
    raise SystemExit(main())
