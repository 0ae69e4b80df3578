"""Build-time check of a multicard image (the Dockerfiles and apptainer.def run it).

    python requirements/check_image.py [EXPECTED_VERSIONS [BASE_PIP_CHECK]]

EXPECTED_VERSIONS (default requirements/image.toml, NGC 24.11's) names the image's Python and DALI
and, where the base's build must be a given one, torch and torchvision (containers/standin/
versions.toml is the stand-in base's, requirements/paper-exact.toml the paper-exact image's). It
also names the lock the image installed (`lock`, default container.txt): torchtune and torchao must
be exactly its pins (unless `llm = false`), and the lock must not pin torch unless
`torch_in_lock = true` (NGC's own torch build stays). BASE_PIP_CHECK is what `pip check` said of
the base before the lock was installed: any line `pip check` says now that it did not is a
problem the image added (RAPIDS's pins on pandas and pyarrow, say), and fails the build; the
base's own lines are printed. It also prints which NVML bindings multicard calls and whether
torchao's C++ ops load. Exits non-zero, naming what differs, so a drifting base or lock fails the
build.
"""

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
# imported at build time: a package that works only with another NumPy and says so only on import
# (pyarrow 26, under torchtune's datasets) fails the build instead of the first trial
IMPORTS = ("scipy.stats", "pandas", "matplotlib.pyplot", "nvidia.dali", "torchvision")
LLM_IMPORTS = ("pyarrow", "datasets", "torchtune", "torchao")


def problems(expected: dict[str, object], pins: dict[str, str], found: dict[str, str]) -> list[str]:
    """What differs between the image (`found`: package or "python" -> version) and the
    expectations; empty when the image is as it should be."""
    issues = []
    if expected.get("llm", True):
        issues += [f"{package} {found[package]}, the lock pins {pins.get(package, 'nothing')}"
                   for package in ("torchtune", "torchao") if found[package] != pins.get(package)]
    if not found["dali"].startswith(str(expected["dali"])):
        issues.append(f"DALI {found['dali']}, expected {expected['dali']}")
    for package in ("torch", "torchvision"):
        if package in expected and found[package].split("+")[0] != expected[package]:
            issues.append(f"{package} {found[package]}, expected {expected[package]}")
    if "torch" in pins and not expected.get("torch_in_lock", False):
        issues.append("the lock pins torch: it must stay the base image's build")
    if not found["python"].startswith(str(expected["python"])):
        issues.append(f"Python {found['python']}, expected {expected['python']}")
    return issues


def unmet(pins: dict[str, str]) -> list[str]:
    """The locked packages' own requirements that the image does not meet (as `pip check`, but
    only for the lock: a conflict among the base's own packages is the base's)."""
    from packaging.requirements import Requirement

    issues = []
    for name in pins:
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            issues.append(f"{name} {pins[name]} is locked but not installed")
            continue
        for line in requires:
            need = Requirement(line)
            if need.marker and not need.marker.evaluate({"extra": ""}):
                continue
            have = installed(need.name)
            if have == "not installed" or not need.specifier.contains(have, prereleases=True):
                issues.append(f"{name} {pins[name]} needs {need}, the image has {need.name} {have}")
    return issues


def failed_imports(modules: tuple[str, ...]) -> list[str]:
    issues = []
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as error:  # any failure to import is the finding
            issues.append(f"import {module}: {type(error).__name__}: {error}")
    return issues


def pip_check_lines(text: str) -> list[str]:
    """The problems in `pip check`'s output (none where it says there are none)."""
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.startswith("No broken requirements")]


def added_pip_problems(base: str, now: str) -> list[str]:
    """What `pip check` says now that it did not say of the base."""
    before = set(pip_check_lines(base))
    return [f"pip check: {line} (the base did not have this)" for line in pip_check_lines(now)
            if line not in before]


def nvml_problems() -> list[str]:
    """multicard's NVML bindings must be nvidia-ml-py's, with the instantaneous power field."""
    from multicard.measure import nvml

    module = nvml.bindings()
    if not hasattr(module, "NVML_FI_DEV_POWER_INSTANT"):
        return [f"NVML bindings without NVML_FI_DEV_POWER_INSTANT: {nvml.describe()}"]
    return []


def installed(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main(argv: list[str]) -> int:
    expected_file = Path(argv[0]) if argv else HERE / "image.toml"
    expected = tomllib.loads(expected_file.read_text())
    lock = (HERE / str(expected.get("lock", "container.txt"))).read_text()
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", lock, re.M))
    import nvidia.dali
    import torch
    import torchvision

    found = {"torchtune": installed("torchtune"), "torchao": installed("torchao"),
             "dali": nvidia.dali.__version__, "torch": torch.__version__,
             "torchvision": torchvision.__version__, "python": sys.version.split()[0]}
    modules = IMPORTS + (LLM_IMPORTS if expected.get("llm", True) else ())
    issues = problems(expected, pins, found) + unmet(pins) + failed_imports(modules) + nvml_problems()
    if len(argv) > 1:
        base = Path(argv[1]).read_text()
        done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True,
                              check=False)
        if done.returncode != 0 and not pip_check_lines(done.stdout):  # pip itself failed
            issues.append(f"pip check did not run: exit {done.returncode}: {done.stderr.strip()[-300:]}")
        issues += added_pip_problems(base, done.stdout)
        for line in pip_check_lines(base):
            print(f"check_image: the base's own pip check: {line}")
    for problem in issues:
        print(f"check_image: {problem}", file=sys.stderr)
    from multicard.measure import environment, nvml

    print(f"check_image ({expected_file.name}): " + ", ".join(f"{k} {v}" for k, v in found.items()))
    print(f"check_image: NVML bindings: {nvml.describe()}; torchao's C++ ops: {environment.torchao_ops()}")
    return 1 if issues else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
