"""NVIDIA's NVML bindings (nvidia-ml-py), the ones multicard depends on, wherever they are shadowed.

NGC 24.11 ships pynvml 11.4.1 (for RAPIDS): a package directory named `pynvml`, which Python
prefers over nvidia-ml-py's module file of the same name. Its bindings stop at NVML's field 160
and lack the calls and constants NVML added since. Rather than replace the base's package,
multicard loads nvidia-ml-py's own file where another `pynvml` shadows it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

DISTRIBUTION = "nvidia-ml-py"
SHADOW_FREE_NAME = "multicard_nvidia_ml_py"  # where the unshadowed module is kept in sys.modules


@functools.cache  # reads the distribution's RECORD; every NVML caller asks
def distribution_file(distribution: str = DISTRIBUTION) -> Path | None:
    """The `pynvml.py` that `distribution` installed; None where it is not installed."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [f for f in dist.files or [] if str(f) == "pynvml.py"]
    return Path(str(dist.locate_file(found[0]))).resolve() if found else None


def bindings() -> ModuleType:
    """The `pynvml` module to call: Python's own where it is nvidia-ml-py's (or a test's stand-in
    without a file); nvidia-ml-py's file, loaded under another name, where a package shadows it."""
    module = importlib.import_module("pynvml")
    wanted = distribution_file()
    loaded = getattr(module, "__file__", None)
    if wanted is None or loaded is None or Path(loaded).resolve() == wanted:
        return module
    if SHADOW_FREE_NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(SHADOW_FREE_NAME, wanted)
        assert spec is not None and spec.loader is not None
        own = importlib.util.module_from_spec(spec)
        sys.modules[SHADOW_FREE_NAME] = own  # the module looks itself up there as it runs
        try:
            spec.loader.exec_module(own)
        except BaseException:
            del sys.modules[SHADOW_FREE_NAME]
            raise
    return sys.modules[SHADOW_FREE_NAME]


def describe() -> str:
    """Which bindings `bindings()` gives, for env.json: "nvidia-ml-py 13.615.71", with the
    shadowing package named where there is one."""
    try:
        module = bindings()
    except ImportError as error:
        return f"none: {error}"
    wanted = distribution_file()
    if wanted is None:
        return f"pynvml at {getattr(module, '__file__', None)} (nvidia-ml-py is not installed)"
    version = importlib.metadata.version(DISTRIBUTION)
    plain = importlib.import_module("pynvml")
    if module is plain:
        return f"{DISTRIBUTION} {version}"
    return f"{DISTRIBUTION} {version}, loaded from its file: `pynvml` is {plain.__file__}"
