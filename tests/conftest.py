"""Skip tests marked `gpu` where CUDA is unavailable; keep every test's prepared data where the
test puts it; with $MULTICARD_TEST_DEADLINE (unix seconds), start no test after it.

The deadline is for a borrowed GPU's few minutes (tools/gpu_tests.py): a session that a time limit
kills prints no failure; one whose last tests are skipped as out of time ends normally and prints
every failure with its traceback.
"""

from __future__ import annotations

import os
import time

import pytest

DEADLINE_ENV = "MULTICARD_TEST_DEADLINE"


def deadline() -> float | None:
    text = os.environ.get(DEADLINE_ENV)
    return float(text) if text else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> object:
    """A runner stopped by a signal (a time limit's SIGTERM, tools/gpu_tests.py's SIGINT) raises
    Interrupted, which pytest would count as the test's failure and then go on: the session
    ends here instead, with its summary and status 124, and no failure that did not happen."""
    from multicard.run.stopping import Interrupted

    try:
        return (yield)
    except Interrupted as stop:
        pytest.exit(f"{item.nodeid}: the runner was stopped ({stop}): a time limit, not a failure",
                    returncode=124)


def pytest_runtest_setup(item: pytest.Item) -> None:
    ends = deadline()
    if ends is not None and time.time() >= ends:
        pytest.skip(f"out of time: {DEADLINE_ENV} passed before this test started")


def pytest_configure(config: pytest.Config) -> None:
    # the images set MULTICARD_CACHE_DIR for their runs; a test that names its data folder
    # (MULTICARD_DATA_DIR, --data-dir) expects what is prepared from it there, not in a cache the
    # smoke run filled. Dropped before any fixture, module-scoped ones included; a test that wants
    # it sets it itself.
    os.environ.pop("MULTICARD_CACHE_DIR", None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
