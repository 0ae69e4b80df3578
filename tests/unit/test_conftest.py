"""The test session's own rules, run in a pytest of their own: a stopped runner ends the session
(no failure), and no test starts after $MULTICARD_TEST_DEADLINE (tools/gpu_tests.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, load_script

TESTS = '''
import os, signal
from multicard.run.stopping import stop_on_signals

def test_stopped():
    with stop_on_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()

def test_after():
    pass
'''


def session(tmp_path: Path, body: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_runtest_call, pytest_runtest_setup\n")
    (tmp_path / "test_it.py").write_text(body)
    paths = f"{ROOT}{os.pathsep}{ROOT / 'src'}"
    return subprocess.run([sys.executable, "-m", "pytest", str(tmp_path), "-p", "no:cacheprovider", "-rA"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": paths, **(env or {})})


def test_a_stopped_runner_ends_the_session_instead_of_failing_the_test(tmp_path: Path) -> None:
    done = session(tmp_path, TESTS)
    assert done.returncode == 124, done.stdout
    assert "the runner was stopped (SIGTERM): a time limit, not a failure" in done.stdout
    assert "FAILED" not in done.stdout and "PASSED" not in done.stdout  # nothing after it ran


def test_no_test_starts_after_the_deadline(tmp_path: Path) -> None:
    done = session(tmp_path, "def test_late():\n    pass\n", {"MULTICARD_TEST_DEADLINE": "1"})
    assert done.returncode == 0, done.stdout
    assert "SKIPPED" in done.stdout and "out of time: MULTICARD_TEST_DEADLINE passed" in done.stdout


GPU_TESTS_TOOL = ROOT / "tools" / "gpu_tests.py"


# the image binds tests/ beside an installed tree that has no tools/
@pytest.mark.skipif(not GPU_TESTS_TOOL.is_file(), reason="no tools/ here (the image ships none)")
def test_the_gpu_test_command_interrupts_pytest_before_its_budget_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tool = load_script(GPU_TESTS_TOOL, "gpu_tests_tool")
    with pytest.raises(SystemExit) as refused:  # no time left for a test after margin and grace
        tool.main(["--budget-s", str(tool.MARGIN_S + tool.INTERRUPT_GRACE_S)])
    assert refused.value.code == 2
    ends: list[float] = []
    monkeypatch.setattr(tool, "_follow", lambda proc, lines, end: ends.append(end) or proc.wait())
    monkeypatch.setattr(tool, "argv", lambda extra: [sys.executable, "-c", "pass"])
    monkeypatch.setattr(tool.time, "time", lambda: 1000.0)
    assert tool.main(["--budget-s", "240"]) == 0
    assert ends == [1000.0 + 240 - tool.INTERRUPT_GRACE_S]  # SIGINT then, SIGKILL at the budget
