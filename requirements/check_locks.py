"""Every hashed lock of the images resolves for the platform it is for: `nox -s locks`.

For every pin, the registry's metadata of that project (its index page as PEP 691 JSON: tens of
kilobytes for most, about 40 MiB for all the locks, torch's and NVIDIA's pages being the largest)
names its files and their SHA256 digests. Of those, the file pip would install on the image's
Python and glibc is picked as pip picks it (the wheel whose best tag ranks highest among the tags
that platform accepts, `packaging.tags`; no sdist, as the images install `--only-binary`), and its
digest must be among the lock's hashes; every other hash in the lock must belong to some file of
that release (a stale or mistyped hash fails). This works where the images' bases cannot be
pulled, in seconds, without downloading the 3 GB the files weigh.

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


def manylinux(glibc_minor: int) -> list[str]:
    """The x86_64 platform tags a glibc 2.<minor> system accepts, newest first."""
    tags = [f"manylinux_2_{minor}_x86_64" for minor in range(glibc_minor, 4, -1)]
    return [*tags, "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]


# lock (relative to the repository) -> (Python version, glibc minor) of the image that installs it
LOCKS: dict[str, tuple[str, int]] = {
    "requirements/container.txt": ("3.12", 39),  # NGC 24.11: Ubuntu 24.04, glibc 2.39
    "containers/tests-requirements.txt": ("3.12", 39),
    "requirements/paper-exact.txt": ("3.11", 35),  # Ubuntu 22.04, glibc 2.35
    "requirements/uv.txt": ("3.10", 35),
}
NOT_PINNED = ("containers/paper-exact/Dockerfile: nvidia-dali-cuda120==1.43.0 from NVIDIA's index "
              "(pypi.nvidia.com), pinned by version only: its wheel is on no index reachable here")


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


def target_tags(python: str, glibc_minor: int) -> list[Tag]:
    """The tags a CPython `python` on x86_64 glibc 2.<minor> accepts, most preferred first."""
    version = tuple(int(part) for part in python.split("."))
    platforms = manylinux(glibc_minor)
    return [*cpython_tags(version, platforms=platforms),
            *compatible_tags(version, f"cp{version[0]}{version[1]}", platforms=platforms)]


def release_files(files: list[dict[str, Any]], version: str) -> list[tuple[str, str, frozenset[Tag]]]:
    """(filename, sha256, tags) of each wheel and sdist of `version` on a project's index page
    (PEP 691 `files`); an sdist has no tags: the images install with --only-binary :all:."""
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
            found.append((name, sha, tags))
    return found


def chosen_wheel(wheels: list[tuple[str, str, frozenset[Tag]]],
                 tags: list[Tag]) -> tuple[str, str, frozenset[Tag]] | None:
    """The wheel pip would install: the one whose best tag comes first in `tags`; None where
    no wheel fits."""
    rank = {tag: k for k, tag in enumerate(tags)}
    best, best_rank = None, len(tags)
    for wheel in wheels:
        found = min((rank[t] for t in wheel[2] if t in rank), default=len(tags))
        if found < best_rank:
            best, best_rank = wheel, found
    return best


def judge(pin: Pin, files: list[dict[str, Any]], tags: list[Tag]) -> str | None:
    """None where the lock holds for this pin, else what is wrong, in one line."""
    released = release_files(files, pin.version)
    if not released:
        return f"{pin.name}=={pin.version}: no such release on the registry"
    chosen = chosen_wheel(released, tags)
    if chosen is None:
        return f"{pin.name}=={pin.version}: no wheel for this platform"
    if chosen[1] not in pin.hashes:
        return f"{pin.name}=={pin.version}: {chosen[0]}'s sha256 is not in the lock"
    if stray := sorted(pin.hashes - {sha for _, sha, _ in released}):
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
        except (urllib.error.URLError, TimeoutError):
            if attempt == 2:
                raise
        time.sleep(2 ** attempt)  # a registry's hiccup, not the lock's fault
    return [], 0


def check_metadata(lock: str, python: str, glibc_minor: int, registry: str) -> tuple[bool, str]:
    """Every pin of `lock` against its release's metadata; (ok, one line saying what happened)."""
    pins = read_pins((ROOT / lock).read_text())
    tags = target_tags(python, glibc_minor)
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            pages = list(pool.map(lambda pin: project_files(registry, pin.name), pins))
    except (urllib.error.URLError, TimeoutError) as exc:
        return False, f"{lock}: FAILED (the registry {registry} did not answer: {exc})"
    seconds = time.monotonic() - started
    problems = [problem for pin, (files, _) in zip(pins, pages, strict=True)
                if (problem := judge(pin, files, tags))]
    size = sum(size for _, size in pages) / 2**20
    if problems:
        return False, f"{lock}: FAILED ({'; '.join(problems[:3])}{' ...' if len(problems) > 3 else ''})"
    return True, (f"{lock}: {len(pins)} pins, the file of each for Python {python} on glibc "
                  f"2.{glibc_minor} has its hash in the lock, by the registry's metadata "
                  f"({size:.1f} MiB of index pages, {seconds:.0f} s)")


def check_download(lock: str, python: str, glibc_minor: int) -> tuple[bool, str]:
    """Download every file of `lock` for its platform; (ok, one line saying what happened)."""
    dest = CACHE / Path(lock).stem
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [arg for tag in manylinux(glibc_minor) for arg in ("--platform", tag)]
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                           "--require-hashes", "--only-binary", ":all:", "--python-version", python,
                           "--implementation", "cp", *platforms, "-d", str(dest), "-r", str(ROOT / lock)],
                          capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "ERROR" in line or "expected" in line.lower()]
        return False, f"{lock}: FAILED ({'; '.join(errors[:3]) or done.stderr.strip()[-300:]})"
    size = sum(f.stat().st_size for f in dest.iterdir()) / 2**20
    return True, (f"{lock}: {len(read_pins((ROOT / lock).read_text()))} pins, every file's hash "
                  f"matches (Python {python}, glibc 2.{glibc_minor}, {size:.0f} MiB, {seconds:.0f} s)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="check_locks", description=__doc__.splitlines()[0])
    parser.add_argument("locks", nargs="*", metavar="LOCK", help=f"default: {', '.join(LOCKS)}")
    parser.add_argument("--download", action="store_true",
                        help="download every file and let pip check its hash (about 3 GB)")
    parser.add_argument("--registry", default=REGISTRY,
                        help=f"the index's base URL, PEP 691 JSON (default {REGISTRY})")
    args = parser.parse_args(argv)
    chosen = args.locks or list(LOCKS)
    unknown = [lock for lock in chosen if lock not in LOCKS]
    if unknown:
        print(f"check_locks: unknown lock {', '.join(unknown)} (known: {', '.join(LOCKS)})", file=sys.stderr)
        return 2
    results = [check_download(lock, *LOCKS[lock]) if args.download
               else check_metadata(lock, *LOCKS[lock], args.registry.rstrip("/")) for lock in chosen]
    for _, line in results:
        print(f"check_locks: {line}")
    print(f"check_locks: not pinned by hash: {NOT_PINNED}")
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
