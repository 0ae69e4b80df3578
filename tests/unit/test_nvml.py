"""multicard's NVML bindings are nvidia-ml-py's even where another `pynvml` package shadows them
(NGC 24.11's pynvml 11.4.1)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from multicard import nvml


def test_a_shadowing_pynvml_package_does_not_hide_nvidia_ml_py(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    wanted = nvml.distribution_file()
    assert wanted is not None and wanted.name == "pynvml.py"
    shadow = tmp_path / "pynvml"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("NVML_FI_MAX = 161  # as pynvml 11.4.1's fields end\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.delitem(sys.modules, nvml.SHADOW_FREE_NAME, raising=False)
    import pynvml

    assert Path(pynvml.__file__).parent == shadow  # Python's own choice: the package
    found = nvml.bindings()
    assert Path(found.__file__).resolve() == wanted and hasattr(found, "NVML_FI_DEV_POWER_INSTANT")
    assert nvml.bindings() is found  # loaded once
    assert nvml.describe().endswith(f"loaded from its file: `pynvml` is {shadow / '__init__.py'}")


def test_the_unshadowed_module_and_a_tests_stand_in_are_used_as_they_are(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    import pynvml

    assert nvml.bindings() is pynvml and nvml.describe().startswith("nvidia-ml-py ")
    stand_in = SimpleNamespace(nvmlInit=lambda: None)
    monkeypatch.setitem(sys.modules, "pynvml", stand_in)
    assert nvml.bindings() is stand_in
