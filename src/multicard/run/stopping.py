"""Stop requests to the runner: SIGTERM (Slurm's scancel, pre-emption, `kill`), SIGHUP (a closed
terminal) and SIGINT (Ctrl-C) become one `Interrupted`, raised in the main thread, but only where
the runner can act on it.

Some work must not be cut short by a stop: ending a trial's processes, writing a record, reading
a finished trial's results. The runner does it inside `GATE.hold()`: a stop that arrives then is
kept, and raised at the next `GATE.check()`, after the work. Only the first stop counts: Slurm,
nox and impatient users send a second one, which must not abort the clean-up of the first.
Holding by a flag (not by blocking the signal) is what works in a process with other threads:
the kernel may deliver a blocked-in-one-thread signal to another, and Python runs the handler in
the main thread regardless.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Interrupted(BaseException):
    """The runner was told to stop. The trial in flight, if any, has been ended, every process of
    it, and recorded as `interrupted`; running the same command again resumes."""

    def __init__(self, signum: int, out: Path | None = None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum, self.out = signum, out
        self.record: dict[str, Any] | None = None  # the attempt that was in flight

    @property
    def exit_status(self) -> int:
        return 128 + self.signum  # what a shell reports for a process killed by the signal


class StopGate:
    def __init__(self) -> None:
        self.signum: int | None = None  # the first stop request, once one came
        self.raised = False
        self.held = 0

    def reset(self) -> None:
        self.signum, self.raised, self.held = None, False, 0

    def on_signal(self, signum: int, frame: object) -> None:
        if self.signum is not None:
            return  # a second request: the first one is being served
        self.signum = signum
        if not self.held:
            self.raised = True
            raise Interrupted(signum)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """A stop that arrives inside waits for `check()`."""
        self.held += 1
        try:
            yield
        finally:
            self.held -= 1

    def check(self) -> None:
        """Raise the stop that arrived while held (once)."""
        if self.signum is not None and not self.raised and not self.held:
            self.raised = True
            raise Interrupted(self.signum)


GATE = StopGate()


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Route SIGTERM, SIGHUP and SIGINT to GATE for the duration (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    GATE.reset()
    previous = {sig: signal.signal(sig, GATE.on_signal) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
