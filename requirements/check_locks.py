"""Every hashed lock of the images resolves for the platform it is for: `nox -s locks`.

For every pin, the registry's metadata of that project (its index page as PEP 691 JSON: tens of
kilobytes for most, about 40 MiB for all the locks, torch's and NVIDIA's pages being the largest)
names its files and their SHA256 digests. The files pip could install on the image's Python and
glibc are found as pip finds them: wheels whose `requires-python` admits that Python and one of
whose tags that platform accepts (`packaging.tags`; no sdist, as the images install
`--only-binary`). As pip with `--require-hashes` prefers a file whose hash the lock allows over a
better tag, the lock holds where one of them has its digest among the lock's hashes; every other
hash in the lock must belong to some file of that release (a stale or mistyped hash fails). This
works where the images' bases cannot be pulled, in seconds, without downloading the 3 GB the
files weigh.

`--download` (`nox -s locks-download`) instead downloads each file pip would install (`pip
download --no-deps --require-hashes --only-binary :all:`) and lets pip check its SHA256 against
the lock: the registry's bytes, not its word. Downloads are kept under .nox/locks/ (pip re-checks
the hash of a file it finds there).

What no lock can pin is named: the paper-exact image's DALI 1.43.0, whose wheel is only on
NVIDIA's own index (PyPI has a stub that downloads it at install time).

    python requirements/check_locks.py [--download] [--registry URL] [LOCK ...]   (default: all of LOCKS)
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = ROOT / ".nox" / "locks"
REGISTRY = "https://pypi.org/simple"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


def manylinux(glibc_minor: int, arch: str = "x86_64") -> list[str]:
    """The platform tags a glibc 2.<minor> system on `arch` accepts, newest first."""
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"} if arch == "x86_64" \
        else {17: "manylinux2014"}  # the older aliases were never defined for aarch64
    tags = []
    for minor in range(glibc_minor, 4, -1):  # each legacy alias where packaging ranks it
        tags += [f"manylinux_2_{minor}_{arch}", *([f"{legacy[minor]}_{arch}"] if minor in legacy else [])]
    return [*tags, f"linux_{arch}"]


class Target(NamedTuple):
    """The image that installs a lock: its Python, its glibc's minor version, its machines."""
    python: str
    glibc_minor: int
    arches: tuple[str, ...] = ("x86_64",)


# lock (relative to the repository) -> the image that installs it
LOCKS: dict[str, Target] = {
    # NGC 24.11: Ubuntu 24.04, glibc 2.39; its arm64 image (GH200, GB200 nodes) takes the same lock
    "requirements/container.txt": Target("3.12", 39, ("x86_64", "aarch64")),
    "containers/tests-requirements.txt": Target("3.12", 39, ("x86_64", "aarch64")),
    "requirements/paper-exact.txt": Target("3.11", 35),  # Ubuntu 22.04, glibc 2.35
    "requirements/uv.txt": Target("3.10", 35),
}
NOT_PINNED = ("containers/paper-exact/Dockerfile: nvidia-dali-cuda120==1.43.0 from NVIDIA's index "
              "(pypi.nvidia.com), pinned by version only: its wheel is on no index reachable here")


class RegistryError(Exception):
    """The registry answered, but not with an index page."""


class Pin(NamedTuple):
    name: str
    version: str
    hashes: frozenset[str]  # sha256 hex digests


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")


def read_pins(text: str) -> list[Pin]:
    """The `name==version --hash=sha256:...` entries of a hashed requirements file."""
    pins, entry = [], ""
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
        entry += " " + line.rstrip("\\").strip()
        if line.endswith("\\"):
            continue
        if match := _PIN.match(entry.strip()):
            hashes = frozenset(re.findall(r"--hash=sha256:([0-9a-f]{64})", entry))
            pins.append(Pin(canonicalize_name(match[1]), match[2], hashes))
        entry = ""
    return pins


def target_tags(python: str, glibc_minor: int, arch: str = "x86_64") -> list[Tag]:
    """The tags a CPython `python` on `arch` glibc 2.<minor> accepts, most preferred first."""
    version = tuple(int(part) for part in python.split("."))
    platforms = manylinux(glibc_minor, arch)
    return [*cpython_tags(version, platforms=platforms),
            *compatible_tags(version, f"cp{version[0]}{version[1]}", platforms=platforms)]


class File(NamedTuple):
    name: str
    sha256: str
    tags: frozenset[Tag]  # empty for an sdist
    requires_python: str | None


def release_files(files: list[dict[str, Any]], version: str) -> list[File]:
    """Each wheel and sdist of `version` on a project's index page (PEP 691 `files`)."""
    wanted = Version(version)
    found = []
    for entry in files:
        name, sha = entry["filename"], entry.get("hashes", {}).get("sha256")
        try:
            if name.endswith(".whl"):
                _, of, _, tags = parse_wheel_filename(name)
            else:
                (_, of), tags = parse_sdist_filename(name), frozenset()
        except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
            continue  # an egg, an exe: not a file pip installs
        if of == wanted and sha:
            found.append(File(name, sha, tags, entry.get("requires-python")))
    return found


def installable(files: list[File], python: str, tags: list[Tag]) -> list[File]:
    """The wheels pip could install on `python` with `tags` (no sdist: the images install with
    --only-binary :all:), most preferred tag first."""
    rank = {tag: k for k, tag in enumerate(tags)}
    fits = [(min((rank[t] for t in f.tags if t in rank), default=len(tags)), k, f)
            for k, f in enumerate(files) if _admits(f.requires_python, python)]
    return [f for best, _, f in sorted(fits) if best < len(tags)]


def _admits(requires_python: str | None, python: str) -> bool:
    try:
        return not requires_python or SpecifierSet(requires_python).contains(python, prereleases=True)
    except InvalidSpecifier:
        return True  # pip ignores a requires-python it cannot parse


def judge(pin: Pin, files: list[dict[str, Any]], python: str, tags: list[Tag]) -> str | None:
    """None where the lock holds for this pin, else what is wrong, in one line. With
    --require-hashes pip prefers a file whose hash the lock allows over a better tag, so the lock
    holds where any installable wheel's hash is in it (pip installs the best-ranked of those)."""
    released = release_files(files, pin.version)
    if not released:
        return f"{pin.name}=={pin.version}: no such release on the registry"
    candidates = installable(released, python, tags)
    if not candidates:
        return f"{pin.name}=={pin.version}: no wheel for Python {python} on this platform"
    if not any(f.sha256 in pin.hashes for f in candidates):
        return f"{pin.name}=={pin.version}: {candidates[0].name}'s sha256 is not in the lock"
    if stray := sorted(pin.hashes - {f.sha256 for f in released}):
        return (f"{pin.name}=={pin.version}: {len(stray)} hash(es) of no file of the release "
                f"({stray[0][:12]}...)")
    return None


def project_files(registry: str, name: str) -> tuple[list[dict[str, Any]], int]:
    """The project's files on the index (PEP 691 JSON) and the page's size in bytes."""
    request = urllib.request.Request(f"{registry}/{name}/", headers={"Accept": SIMPLE_JSON})
    for attempt in range(3):
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                body = response.read()
            return list(json.loads(body)["files"]), len(body)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return [], 0
            if attempt == 2:
                raise
        except (json.JSONDecodeError, KeyError) as exc:
            raise RegistryError(f"{registry}/{name}/ is not a PEP 691 JSON page ({exc})") from None
        except OSError:  # URLError, a timeout, a connection reset mid-read
            if attempt == 2:
                raise
        time.sleep(2 ** attempt)  # a registry's hiccup, not the lock's fault
    return [], 0


def check_metadata(lock: str, target: Target, registry: str) -> tuple[bool, str]:
    """Every pin of `lock` against its release's metadata, on each machine of `target`; (ok, one
    line saying what happened)."""
    pins = read_pins((ROOT / lock).read_text())
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            pages = list(pool.map(lambda pin: project_files(registry, pin.name), pins))
    except RegistryError as exc:
        return False, f"{lock}: FAILED ({exc})"
    except OSError as exc:
        return False, f"{lock}: FAILED (the registry {registry} did not answer: {exc})"
    seconds = time.monotonic() - started
    problems = [f"{arch}: {problem}" for arch in target.arches
                for pin, (files, _) in zip(pins, pages, strict=True)
                if (problem := judge(pin, files, target.python,
                                     target_tags(target.python, target.glibc_minor, arch)))]
    size = sum(size for _, size in pages) / 2**20
    if problems:
        return False, f"{lock}: FAILED ({'; '.join(problems[:3])}{' ...' if len(problems) > 3 else ''})"
    return True, (f"{lock}: {len(pins)} pins, the file of each for Python {target.python} on glibc "
                  f"2.{target.glibc_minor} ({', '.join(target.arches)}) has its hash in the lock, by "
                  f"the registry's metadata ({size:.1f} MiB of index pages, {seconds:.0f} s)")


def check_download(lock: str, target: Target, index: str | None) -> tuple[bool, str]:
    """Download every file of `lock` for each machine of `target`; (ok, one line saying what
    happened)."""
    lines = [_download(lock, target.python, target.glibc_minor, arch, index) for arch in target.arches]
    return all(ok for ok, _ in lines), "; ".join(line for _, line in lines)


def _download(lock: str, python: str, glibc_minor: int, arch: str, index: str | None) -> tuple[bool, str]:
    dest = CACHE / Path(lock).stem / arch
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [arg for tag in manylinux(glibc_minor, arch) for arg in ("--platform", tag)]
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                           "--require-hashes", "--only-binary", ":all:", "--python-version", python,
                           "--implementation", "cp", *platforms, *(["--index-url", index] if index else []),
                           "-d", str(dest), "-r", str(ROOT / lock)],
                          capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "ERROR" in line or "expected" in line.lower()]
        return False, f"{lock}: FAILED ({'; '.join(errors[:3]) or done.stderr.strip()[-300:]})"
    size = sum(f.stat().st_size for f in dest.iterdir()) / 2**20
    return True, (f"{lock}: {len(read_pins((ROOT / lock).read_text()))} pins, every file's hash "
                  f"matches (Python {python}, glibc 2.{glibc_minor}, {arch}, {size:.0f} MiB, "
                  f"{seconds:.0f} s)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="check_locks", description=__doc__.splitlines()[0])
    parser.add_argument("locks", nargs="*", metavar="LOCK", help=f"default: {', '.join(LOCKS)}")
    parser.add_argument("--download", action="store_true",
                        help="download every file and let pip check its hash (about 3 GB)")
    parser.add_argument("--registry", help=f"the index's base URL, PEP 691 JSON (default {REGISTRY}; "
                                           "with --download, pip's --index-url)")
    args = parser.parse_args(argv)
    chosen = args.locks or list(LOCKS)
    unknown = [lock for lock in chosen if lock not in LOCKS]
    if unknown:
        print(f"check_locks: unknown lock {', '.join(unknown)} (known: {', '.join(LOCKS)})", file=sys.stderr)
        return 2
    results = [check_download(lock, LOCKS[lock], args.registry) if args.download
               else check_metadata(lock, LOCKS[lock], (args.registry or REGISTRY).rstrip("/"))
               for lock in chosen]
    for _, line in results:
        print(f"check_locks: {line}")
    print(f"check_locks: not pinned by hash: {NOT_PINNED}")
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
