"""`nox -s container`: build multicard's images with podman and run them, on a machine that cannot
pull NGC.

1. The stand-in base (once; kept in podman's store): Ubuntu noble made by mmdebstrap, imported with
   `podman import`, then containers/standin/Containerfile (Python 3.12, PyPI torch, DALI).
2. The real Dockerfile on it (`--build-arg BASE_IMAGE=...`).
   with containers/build.sh, the documented build line (provenance: the base's digest, the
   commit, the date).
3. Inside that image, as a host user who is not root (uid 1000, owning a fresh host folder
   artifact/container/<UTC>/ bound at /opt/multicard/artifact, as the README's
   `--user "$(id -u):$(id -g)"` runs it), with no network and a read-only root: first a check that
   a uid that cannot write artifact/ is stopped with the one-line fix, then `nox -s smoke`, then
   the CPU tests `nox -s container` names (tests/ bound read-only into an image that adds
   pytest). Back on the host: every experiment's smoke run is there, owned by that user, and
   `multicard verify` passes.
4. apptainer.def built as Apptainer would build it (containers/apptainer_def.py) on the same base,
   and its %test run.

Every step is timed; the image sizes and times are printed at the end and kept in
<host folder>/container-build.json. Runs as root with podman, as rootful Docker does (rootless
podman maps the container's uids to subordinate ones the host folder would need to be shared with).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import apptainer_def

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "containers" / "standin"
ROOTFS_TAG = "localhost/multicard-standin-rootfs:noble"
STANDIN_TAG = "localhost/multicard-standin:noble"
IMAGE_TAG = "localhost/multicard:standin"
TESTS_TAG = "localhost/multicard-tests:standin"
APPTAINER_TAG = "localhost/multicard-apptainer:standin"
STANDIN_VERSIONS = "/etc/multicard-standin/versions.toml"
UBUNTU_MIRROR = "http://archive.ubuntu.com/ubuntu"
# Debian carries no Ubuntu keyring: Ubuntu's own package, taken only if it has the SHA256 that
# noble's Packages index lists for it (this line is the trust anchor for the whole root fs)
KEYRING_DEB = f"{UBUNTU_MIRROR}/pool/main/u/ubuntu-keyring/ubuntu-keyring_2023.11.28.1_all.deb"
KEYRING_SHA256 = "36de43b15853ccae0028e9a767613770c704833f82586f28eb262f0311adb8a8"
ROOTFS_PACKAGES = ("apt", "ubuntu-keyring", "ca-certificates", "python3", "python3-pip", "python-is-python3",
                   "libstdc++6", "libgomp1")  # Ubuntu's minbase has no apt; torch links the last two
# podman as machines like this one need it: crun fails on their cgroup mode (MULTICARD_PODMAN_RUNTIME
# names another runtime), and the rlimits must be explicit for runc to start a container
RUNTIME = os.environ.get("MULTICARD_PODMAN_RUNTIME", "runc")
RUN_FLAGS = ("--runtime", RUNTIME, "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768")
STANDIN_RECIPE_LABEL = "io.multicard.standin.recipe"
# the reviewer: a host user who is not root and owns the clone's artifact/ (`--user "$(id -u):$(id -g)"`)
HOST_USER = (1000, 1000)
NOT_WRITABLE_EXIT = 2  # containers/entrypoint.sh, where artifact/ is not writable
# host-side only: tests that read the container files from outside the image (hadolint,
# spython), and the Slurm templates' tests (a batch script runs on the host; the image has no
# slurm/)
HOST_ONLY_TESTS = ("tests/unit/test_container.py", "tests/unit/test_slurm.py")


class BuildError(RuntimeError):
    """A step failed: its name and what to do."""


@dataclass
class Log:
    echo: Callable[[str], None]
    steps: list[dict[str, object]] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)  # image ids a rebuild left without a tag

    def step(self, name: str, command: Sequence[str]) -> float:
        """Run `command`, time it, and raise BuildError naming the step if it fails."""
        self.echo(f"container: {name}")
        started = time.monotonic()
        done = subprocess.run(list(command), check=False)
        seconds = time.monotonic() - started
        self.steps.append({"step": name, "seconds": round(seconds, 1), "exit": done.returncode})
        if done.returncode != 0:
            raise BuildError(f"{name}: exit {done.returncode} after {seconds:.0f} s")
        self.echo(f"container: {name}: {seconds:.0f} s")
        return seconds


def missing_tools() -> list[str]:
    """What this machine lacks to run the session (each with the package that has it)."""
    tools = (("podman", "podman"), (RUNTIME, RUNTIME), ("mmdebstrap", "mmdebstrap"),
             ("newuidmap", "uidmap"), ("dpkg-deb", "dpkg"))
    missing = [f"{tool} (apt-get install {package})" for tool, package in tools if shutil.which(tool) is None]
    return missing + (["root (podman as root: rootless podman is not supported here)"]
                      if os.geteuid() != 0 else [])


def inspect(tag: str, template: str) -> str | None:
    done = subprocess.run(["podman", "image", "inspect", "--format", template, tag], check=False,
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def image_sizes(tags: Sequence[str]) -> dict[str, int]:
    found = {tag: inspect(tag, "{{.Size}}") for tag in tags}
    return {tag: int(size) for tag, size in found.items() if size and size.isdigit()}


def standin_recipe() -> str:
    """A digest of what makes the stand-in base: an image built from other files is remade."""
    digest = hashlib.sha256(" ".join(ROOTFS_PACKAGES).encode())
    for name in ("Containerfile", "requirements.txt", "packaging-tools.txt", "versions.toml"):
        digest.update((STANDIN / name).read_bytes())
    return digest.hexdigest()[:16]


def pip_mounts(scratch: Path) -> list[str]:
    """`podman build` volumes that give pip inside a build what the host's pip has: its CA bundle
    (SSL_CERT_FILE or PIP_CERT, at the same path) and its local wheel folder (PIP_FIND_LINKS),
    through /etc/pip.conf."""
    lines, mounts = ["[global]"], []
    cert = os.environ.get("SSL_CERT_FILE") or os.environ.get("PIP_CERT")
    if cert and Path(cert).is_file():
        mounts += ["-v", f"{cert}:{cert}:ro"]
        lines.append(f"cert = {cert}")
    links = [p for p in os.environ.get("PIP_FIND_LINKS", "").split() if Path(p).is_dir()]
    for folder in links:
        mounts += ["-v", f"{folder}:{folder}:ro"]
    if links:
        lines.append(f"find-links = {' '.join(links)}")
    conf = scratch / "pip.conf"
    conf.write_text("\n".join(lines) + "\n")
    return [*mounts, "-v", f"{conf}:/etc/pip.conf:ro"]


def build_options(scratch: Path) -> list[str]:
    return ["--runtime", RUNTIME, *pip_mounts(scratch)]


def podman_build(scratch: Path, *args: str) -> list[str]:
    return ["podman", "build", *build_options(scratch), *args]


def build_tag(log: Log, name: str, tag: str, command: list[str]) -> None:
    """Run a build of `tag`, noting the image the tag named before when the build replaced it."""
    before = inspect(tag, "{{.Id}}")
    log.step(name, command)
    if before and before != inspect(tag, "{{.Id}}"):
        log.replaced.append(before)


def remove_replaced(log: Log) -> None:
    """The images rebuilds replaced (a stand-in is several GB), the last built first: an older
    image is refused while an image built on it is still there."""
    for image in reversed(log.replaced):
        if inspect(image, "{{.Id}}") is None:  # podman drops an untagged parent with its child
            continue
        done = subprocess.run(["podman", "rmi", image], check=False, capture_output=True, text=True)
        if done.returncode != 0:
            log.echo(f"container: kept replaced image {image[:12]} ({done.stderr.strip()[-160:]})")


def fetch_keyring(scratch: Path) -> Path:
    """Ubuntu's archive keys (a folder apt reads as trusted parts), from their package checked
    against KEYRING_SHA256."""
    deb = scratch / "ubuntu-keyring.deb"
    scratch.chmod(0o755)  # apt reads the keys as its own unprivileged user
    with urllib.request.urlopen(KEYRING_DEB, timeout=60) as response:
        deb.write_bytes(response.read())
    digest = hashlib.sha256(deb.read_bytes()).hexdigest()
    if digest != KEYRING_SHA256:
        raise BuildError(f"{KEYRING_DEB}: SHA256 {digest}, expected {KEYRING_SHA256}")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(scratch / "keyring")], check=True)
    return scratch / "keyring" / "etc" / "apt" / "trusted.gpg.d"


def build_rootfs(log: Log, scratch: Path) -> None:
    keyring = fetch_keyring(scratch)
    tarball = scratch / "noble.tar"
    log.step("stand-in root fs (mmdebstrap, Ubuntu noble)",
             ["mmdebstrap", "--variant=minbase", "--components=main,universe", f"--keyring={keyring}",
              f"--include={','.join(ROOTFS_PACKAGES)}", "noble", str(tarball), UBUNTU_MIRROR])
    build_tag(log, "stand-in root fs (podman import)", ROOTFS_TAG,
              ["podman", "import", str(tarball), ROOTFS_TAG])
    tarball.unlink()


def build_standin(log: Log, scratch: Path) -> None:
    """The stand-in base, unless podman's store has one made from these files."""
    recipe = standin_recipe()
    if inspect(STANDIN_TAG, f'{{{{index .Labels "{STANDIN_RECIPE_LABEL}"}}}}') == recipe:
        log.echo(f"container: stand-in base {STANDIN_TAG} is built from these files")
        return
    build_rootfs(log, scratch)  # anew with the base: the package list is part of the recipe
    build_tag(log, "stand-in base (pip: torch, torchvision, DALI)", STANDIN_TAG,
              podman_build(scratch, "--build-arg", f"ROOTFS={ROOTFS_TAG}", "--label",
                           f"{STANDIN_RECIPE_LABEL}={recipe}", "-t", STANDIN_TAG,
                           "-f", str(STANDIN / "Containerfile"), str(STANDIN)))


def build_image(log: Log, scratch: Path) -> None:
    """The Dockerfile on the stand-in, by the documented build line (containers/build.sh)."""
    env = {"MULTICARD_BASE": STANDIN_TAG, "EXPECTED_VERSIONS": STANDIN_VERSIONS}
    build_tag(log, "multicard image (containers/build.sh: the Dockerfile on the stand-in)", IMAGE_TAG,
              ["env", *(f"{k}={v}" for k, v in env.items()), str(ROOT / "containers" / "build.sh"),
               "podman", IMAGE_TAG, *build_options(scratch)])


def provenance(tag: str) -> dict[str, str | None]:
    """The OCI labels a build put on `tag` that say where it came from."""
    keys = ("created", "source", "revision", "base.name", "base.digest")
    return {key: inspect(tag, f'{{{{index .Labels "org.opencontainers.image.{key}"}}}}') for key in keys}


def build_tests_image(log: Log, scratch: Path) -> None:
    """The image plus pytest (containers/tests.Containerfile); tests/ is bound at run time."""
    context = scratch / "tests-context"
    context.mkdir()
    shutil.copy2(ROOT / "containers" / "tests-requirements.txt", context)
    build_tag(log, "tests image (pytest on the multicard image)", TESTS_TAG,
              podman_build(scratch, "--build-arg", f"IMAGE={IMAGE_TAG}", "-t", TESTS_TAG,
                           "-f", str(ROOT / "containers" / "tests.Containerfile"), str(context)))


def readme_flags(artifact: Path, user: tuple[int, int] = HOST_USER) -> list[str]:
    """`podman run` as the README's smoke line writes it for a reviewer (`--ipc=host --user
    "$(id -u):$(id -g)"`, the clone's artifact/ bound), plus what podman needs on this machine
    (RUN_FLAGS). No HOME is given: the entry point must make one for a uid the image does not
    know."""
    return ["podman", "run", "--rm", *RUN_FLAGS, "--ipc=host", "--user", f"{user[0]}:{user[1]}",
            "-v", f"{artifact}:/opt/multicard/artifact"]


def run_flags(artifact: Path, user: tuple[int, int] = HOST_USER) -> list[str]:
    """The README's flags, locked down as well: no network, a read-only root (a /tmp of its own;
    with --ipc=host podman takes no --shm-size, the host's /dev/shm serves)."""
    return [*readme_flags(artifact, user), "--network", "none", "--read-only",
            "--tmpfs", "/tmp:rw,mode=1777,size=8g"]


def owned_by_host_user(artifact: Path) -> None:
    """The run folder as a fresh clone's artifact/ is: the reviewer's, not root's."""
    os.chown(artifact, *HOST_USER)


def refused_when_not_writable(log: Log, artifact: Path) -> None:
    """The image's default uid (1001) on the reviewer's folder: stopped at once, with the fix."""
    command = [*run_flags(artifact, (1001, 1001)), IMAGE_TAG, "nox", "-l"]
    log.echo("container: a uid that cannot write artifact/ is stopped with the fix")
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    said = done.stderr.strip().splitlines()
    if done.returncode != NOT_WRITABLE_EXIT or not said or "--user" not in said[-1]:
        raise BuildError(f"a uid that cannot write artifact/: exit {done.returncode}, said {said[-3:]}")
    log.steps.append({"step": "uid 1001 on the reviewer's artifact/: refused", "seconds": round(seconds, 1),
                      "exit": done.returncode, "said": said[-1]})


def smoke_experiments(root: Path = ROOT) -> list[str]:
    """The experiments `nox -s smoke` runs: those with a smoke profile."""
    return sorted(p.stem for p in (root / "experiments").glob("*.toml")
                  if "[profiles.smoke]" in p.read_text())


def smoke_gaps(run: Path, experiments: Sequence[str]) -> list[str]:
    """What a finished smoke run lacks: an experiment without an ok trial (`multicard run` exits 0
    with every trial failed, and some configs are skipped on CPU by design), or the checksums."""
    gaps = []
    for name in experiments:
        records = run / name / "trials.jsonl"
        lines = records.read_text().splitlines() if records.is_file() else []
        if not any(json.loads(line).get("status") == "ok" for line in lines if line.strip()):
            gaps.append(f"{name}: no ok trial" if lines else f"{name}: no records")
    return gaps + ([] if (run / "SHA256SUMS").is_file() else ["SHA256SUMS: missing"])


def smoke_in_image(log: Log, artifact: Path) -> Path:
    log.step("nox -s smoke inside the image, run as the README writes it",
             [*readme_flags(artifact), IMAGE_TAG, "nox", "-s", "smoke"])
    runs = sorted((artifact / "runs").glob("smoke-*"))
    if not runs:
        raise BuildError(f"the smoke run wrote no run directory under {artifact}/runs")
    if (runs[-1].stat().st_uid, runs[-1].stat().st_gid) != HOST_USER:
        raise BuildError(f"the smoke run {runs[-1]} is not owned by the host user {HOST_USER}")
    if gaps := smoke_gaps(runs[-1], smoke_experiments()):
        raise BuildError(f"the smoke run {runs[-1]} is incomplete: {'; '.join(gaps)}")
    return runs[-1]


def tests_in_image(log: Log, artifact: Path, pytest_args: Sequence[str]) -> None:
    ignore = [f"--ignore={path}" for path in HOST_ONLY_TESTS]
    log.step("CPU tests inside the image (tests/ bound read-only)",
             [*run_flags(artifact), "-v", f"{ROOT / 'tests'}:/opt/multicard/tests:ro",
              "-w", "/opt/multicard", TESTS_TAG, "python", "-m", "pytest", "-p", "no:cacheprovider",
              *ignore, *(pytest_args or ["tests"])])


def verify_on_host(log: Log, run: Path) -> None:
    log.step("multicard verify on the host", [sys.executable, "-m", "multicard", "verify", str(run)])


def build_apptainer(log: Log, scratch: Path, artifact: Path) -> None:
    definition = apptainer_def.read(ROOT / "apptainer.def", {
        "BASE_IMAGE": STANDIN_TAG, "EXPECTED_VERSIONS": STANDIN_VERSIONS})
    containerfile = apptainer_def.write_context(definition, ROOT, scratch / "apptainer-context")
    build_tag(log, "apptainer.def as Apptainer builds it (%files, %post as one script)", APPTAINER_TAG,
              podman_build(scratch, "-t", APPTAINER_TAG, "-f", str(containerfile),
                           str(containerfile.parent)))
    log.step("apptainer.def %test", [*run_flags(artifact), APPTAINER_TAG,
                                      *apptainer_def.run_command("test")])


@dataclass(frozen=True)
class Summary:
    seconds: float
    steps: list[dict[str, object]]
    image_bytes: dict[str, int]
    labels: dict[str, str | None]

    def to_json(self) -> str:
        return json.dumps({"total_seconds": round(self.seconds, 1), "steps": self.steps,
                           "image_bytes": self.image_bytes, "labels": self.labels}, indent=1) + "\n"


def build_and_run(log: Log, artifact: Path, pytest_args: Sequence[str]) -> Path:
    """Every step, in order; the smoke run the container wrote."""
    with tempfile.TemporaryDirectory(prefix="multicard-container-") as name:
        scratch = Path(name)
        build_standin(log, scratch)
        build_image(log, scratch)
        owned_by_host_user(artifact)
        refused_when_not_writable(log, artifact)
        run = smoke_in_image(log, artifact)
        verify_on_host(log, run)
        build_tests_image(log, scratch)
        tests_in_image(log, artifact, pytest_args)
        build_apptainer(log, scratch, artifact)
    remove_replaced(log)
    return run


def main(argv: Sequence[str], echo: Callable[[str], None] = print) -> int:
    """Every step above; `argv` goes to pytest inside the image (default: the whole of tests/)."""
    if missing := missing_tools():
        echo(f"container: this machine lacks {', '.join(missing)}")
        return 2
    artifact = ROOT / "artifact" / "container" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    artifact.mkdir(parents=True)
    log, started = Log(echo), time.monotonic()
    try:
        run = build_and_run(log, artifact, argv)
    except (BuildError, apptainer_def.DefinitionError, OSError, urllib.error.URLError,
            subprocess.CalledProcessError) as error:
        echo(f"container: failed: {error} (what ran is in {artifact})")
        return 1
    finally:
        record = Summary(time.monotonic() - started, log.steps,
                         image_sizes((STANDIN_TAG, IMAGE_TAG, TESTS_TAG, APPTAINER_TAG)),
                         provenance(IMAGE_TAG))
        (artifact / "container-build.json").write_text(record.to_json())
    for step in log.steps:
        echo(f"container: {step['seconds']:>7.1f} s  {step['step']}")
    for tag, size in record.image_bytes.items():
        echo(f"container: {size / 2**30:6.2f} GiB  {tag}")
    echo("container: labels of " + IMAGE_TAG + ": " + ", ".join(f"{k} {v}" for k, v in record.labels.items()))
    echo(f"container: done in {record.seconds:.0f} s; smoke run {run}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
