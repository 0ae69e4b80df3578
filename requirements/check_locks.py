"""Every hashed lock of the images resolves for the platform it is for: `nox -s locks`.

For every pin, the file pip would install on the image's Python and glibc is downloaded (`pip
download --no-deps --require-hashes --only-binary :all:`), so pip checks its SHA256 against the
lock (the lock's other hashes, for other platforms, are not fetched); this works where the
images' bases cannot be pulled. Downloads are kept under .nox/locks/ (pip re-checks the hash of a
file it finds there). What no lock can pin is named: the paper-exact image's DALI 1.43.0, whose
wheel is only on NVIDIA's own index (PyPI has a stub that downloads it at install time).

    python requirements/check_locks.py [LOCK ...]     (default: all of LOCKS)
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = ROOT / ".nox" / "locks"


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


def pins(lock: Path) -> int:
    return sum(1 for line in lock.read_text().splitlines() if line[:1].isalnum())


def check(lock: str, python: str, glibc_minor: int) -> tuple[bool, str]:
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
    return True, (f"{lock}: {pins(ROOT / lock)} pins, every file's hash matches "
                  f"(Python {python}, glibc 2.{glibc_minor}, {size:.0f} MiB, {seconds:.0f} s)")


def main(argv: list[str]) -> int:
    chosen = argv or list(LOCKS)
    unknown = [lock for lock in chosen if lock not in LOCKS]
    if unknown:
        print(f"check_locks: unknown lock {', '.join(unknown)} (known: {', '.join(LOCKS)})", file=sys.stderr)
        return 2
    results = [check(lock, *LOCKS[lock]) for lock in chosen]
    for _, line in results:
        print(f"check_locks: {line}")
    print(f"check_locks: not pinned by hash: {NOT_PINNED}")
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
