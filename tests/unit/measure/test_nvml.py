"""multicard's NVML bindings are nvidia-ml-py's even where another `pynvml` package shadows them
(NGC 24.11's pynvml 11.4.1)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from multicard.measure import nvml


def test_a_shadowing_pynvml_package_does_not_hide_nvidia_ml_py(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    wanted = nvml.distribution_file()
    assert wanted is not None and wanted.name == "pynvml.py"
    shadow = tmp_path / "pynvml"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("NVML_FI_MAX = 161  # as pynvml 11.4.1's fields end\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # both names set (to what they were, or absent) so that monkeypatch puts them back afterwards
    for name in ("pynvml", nvml.SHADOW_FREE_NAME):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name))
        del sys.modules[name]
    import pynvml

    assert Path(pynvml.__file__).parent == shadow  # Python's own choice: the package
    found = nvml.bindings()
    assert Path(found.__file__).resolve() == wanted and hasattr(found, "NVML_FI_DEV_POWER_INSTANT")
    assert nvml.bindings() is found  # loaded once
    assert nvml.describe().endswith(f"loaded from its file: `pynvml` is {shadow / '__init__.py'}")


def test_nvidia_ml_py_is_what_runs_here_and_a_tests_stand_in_is_used_as_it_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # here: the dev venv's unshadowed module, or, in an image on NGC's base, the shadowed one
    found = nvml.bindings()
    assert Path(found.__file__).resolve() == nvml.distribution_file()
    assert nvml.describe().startswith("nvidia-ml-py ")
    stand_in = SimpleNamespace(nvmlInit=lambda: None)
    monkeypatch.setitem(sys.modules, "pynvml", stand_in)
    assert nvml.bindings() is stand_in
