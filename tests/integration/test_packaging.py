"""multicard builds on NGC 24.11's own packaging, as the images install it: setuptools 70.3.0,
wheel 0.45.0 and packaging 23.2, without build isolation (the base's setuptools, no download)."""

from __future__ import annotations

import subprocess
import venv
import zipfile
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow
NGC_24_11 = ["setuptools==70.3.0", "wheel==0.45.0", "packaging==23.2"]


def test_the_project_builds_with_ngc_24_11_setuptools_without_isolation(tmp_path: Path) -> None:
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    installed = subprocess.run([python, "-m", "pip", "install", "-q", *NGC_24_11],
                               capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr[-2000:]
    built = subprocess.run([python, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path / "wheels"), str(ROOT)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = (tmp_path / "wheels").glob("multicard-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(next(n for n in archive.namelist() if n.endswith("METADATA"))).decode()
    assert "License: Apache-2.0" in metadata.splitlines()
