"""Stop requests arrive where the runner can act on them, once, and never cut a clean-up short."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from multicard.run import runner
from multicard.run.stopping import GATE, Interrupted, stop_on_signals


def test_a_stop_inside_hold_waits_for_check() -> None:
    # other threads (numpy's) may take the signal: the hold is a flag, not a blocked signal
    with stop_on_signals():
        with GATE.hold():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler has run, and raised nothing
        with pytest.raises(Interrupted) as caught:
            GATE.check()
        assert caught.value.signum == signal.SIGTERM and caught.value.exit_status == 143
        GATE.check()  # raised once only


def test_only_the_first_stop_counts() -> None:
    with stop_on_signals():
        with pytest.raises(Interrupted):
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(1)
        os.kill(os.getpid(), signal.SIGTERM)  # the second one, during the clean-up
        time.sleep(0.05)
        GATE.check()  # nothing more to raise


def test_a_stop_during_the_end_of_a_timed_out_trial_does_not_cut_it_short(tmp_path: Path) -> None:
    # the trial ignores SIGTERM, so ending it takes the whole grace period and a SIGKILL; a stop
    # that arrives meanwhile must wait until every process is gone
    argv = ["sh", "-c", "trap '' TERM; sleep 30.25 & sleep 30.25 & wait"]  # a name of its own
    killer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM))
    with stop_on_signals():
        killer.start()
        _, timed_out, _, _ = runner._execute(argv, dict(os.environ), tmp_path, 1.0,
                                              False, [])
        assert timed_out
        with pytest.raises(Interrupted):
            GATE.check()  # served once the trial has ended
    # the shell and both of its sleeps, which ignored SIGTERM, are gone
    leftover = subprocess.run(["pgrep", "-f", "sleep 30.25"], capture_output=True)
    assert leftover.stdout == b""
