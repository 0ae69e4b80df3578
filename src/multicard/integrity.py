"""Files a reader can trust: written whole or not at all, hashed, listed in SHA256SUMS and verified.

SHA256SUMS is in coreutils format (`<sha256>  <relative path>`, sorted), so `sha256sum -c
SHA256SUMS` works without this package. Lock files (`*.lock`) are coordination state, not results,
and are neither listed nor reported as unlisted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

SUMS_FILE = "SHA256SUMS"
LOCK_SUFFIX = ".lock"  # a file lock beside the file it guards (filelock)
_SUM_LINE = re.compile(r"^(\\?)([0-9a-f]{64}) [ *](.+)$")


# --- checksums ------------------------------------------------------------------------------

def _listed_files(root: Path, sums_name: str = SUMS_FILE, ignore: tuple[str, ...] = ()) -> list[str]:
    return scan(root, sums_name, ignore)[0]


def scan(root: Path, sums_name: str = SUMS_FILE, ignore: tuple[str, ...] = ()
         ) -> tuple[list[str], list[str]]:
    """(regular files, entries that are not, or cannot be trusted) under `root`, without
    following any link.

    Only regular files are listed. A symbolic link (to a file, or to a folder anywhere), a FIFO,
    a socket or a device is named as unsafe: a checksum over its target would vouch for a file
    outside the run, and reading a FIFO or device could block or change state. So is a file with
    several hard links (its other name, maybe outside the run, can change it after the check)
    and a folder that cannot be read. Lock files (`*.lock`, empty: filelock's) are left out."""
    files, unsafe = [], []

    def unreadable(error: OSError) -> None:
        unsafe.append(f"{Path(error.filename).relative_to(root).as_posix()} (cannot be read: "
                      f"{error.strerror})")

    for folder, subfolders, names in os.walk(root, onerror=unreadable):  # links are not entered
        for name in [*subfolders, *names]:
            path = Path(folder) / name
            rel = path.relative_to(root).as_posix()
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode):
                if rel == sums_name:
                    unsafe.append(f"{rel} (a folder, not a checksum file)")
                continue
            if not stat.S_ISREG(info.st_mode):
                unsafe.append(f"{rel} ({_kind(path, info.st_mode)})")
            elif name.endswith(LOCK_SUFFIX) and info.st_size == 0:
                continue
            elif info.st_nlink > 1:
                unsafe.append(f"{rel} (a hard link: {info.st_nlink} names for one file)")
            elif rel != sums_name and rel not in ignore:
                files.append(rel)
    return sorted(files), sorted(unsafe)


def _kind(path: Path, mode: int) -> str:
    if stat.S_ISLNK(mode):
        return f"symbolic link -> {path.readlink()}"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device file" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return sha256_stream(f)


def sha256_stream(stream: IO[bytes]) -> str:
    digest = hashlib.sha256()
    for block in iter(lambda: stream.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def _escape(name: str) -> tuple[str, str]:
    """coreutils escapes backslash and newline in names and marks such lines with a leading '\\'."""
    if "\\" in name or "\n" in name:
        return "\\", name.replace("\\", "\\\\").replace("\n", "\\n")
    return "", name


def _unescape(name: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), name)


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`; None where it is missing, unreadable, torn or not an object
    (a file another process or node writes, read without trusting it)."""
    try:
        found = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return found if isinstance(found, dict) else None


def write_text_atomic(path: Path, text: str) -> None:
    """Write `path` whole or not at all: a full disk or a kill mid-write leaves the old file (or
    none), never an empty or half-written one."""
    write_bytes_atomic(path, text.encode("utf-8"))


def umask() -> int:
    """This process's umask, read without changing it (/proc, Linux >= 4.7)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    return 0o022


def write_bytes_atomic(path: Path, data: bytes, durable: bool = True) -> None:
    """`path` whole or not at all, through a temporary name of its own: writers on several
    nodes (or processes) never share, or delete, each other's partial file. `durable`: on disk
    before it takes the name (fsync), which a record needs and a re-creatable image does not."""
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        tmp.chmod(0o666 & ~umask())  # what open() would have made, not mkstemp's 0600
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def write_checksums(root: Path) -> Path:
    """Hash every file under `root` (except SHA256SUMS and locks) into root/SHA256SUMS."""
    lines = []
    for rel in _listed_files(root):
        mark, name = _escape(rel)
        lines.append(f"{mark}{sha256_file(root / rel)}  {name}\n")
    target = root / SUMS_FILE
    write_text_atomic(target, "".join(lines))
    return target


@dataclass
class VerifyResult:
    changed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unlisted: list[str] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)
    unsafe: list[str] = field(default_factory=list)  # archive members that could write outside

    @property
    def ok(self) -> bool:
        return not (self.changed or self.missing or self.unlisted or self.malformed or self.unsafe)


def read_checksums(sums: Path) -> tuple[dict[str, str], list[str]]:
    return parse_checksums(sums.read_bytes(), sums.name)


def parse_checksums(data: bytes, name: str) -> tuple[dict[str, str], list[str]]:
    """({path: sha256}, [problems]). Strict: a blank or unparsable line is a problem, so that even
    a one-byte append to SHA256SUMS itself is caught."""
    listed: dict[str, str] = {}
    problems: list[str] = []
    text = data.decode("utf-8", errors="replace")
    if text and not text.endswith("\n"):
        problems.append(f"{name}: last line is not terminated")
    for number, line in enumerate(text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"), 1):
        match = _SUM_LINE.match(line)
        if not match:
            problems.append(f"{name}: line {number} is not '<sha256>  <path>'")
            continue
        path = _unescape(match.group(3)) if match.group(1) else match.group(3)
        listed[path] = match.group(2)
    return listed, problems


def verify(root: Path, sums_name: str = SUMS_FILE, ignore: tuple[str, ...] = ()) -> VerifyResult:
    """Compare every file under `root` with the sums file; `ignore` lists files not covered."""
    result = VerifyResult()
    sums = root / sums_name
    present_list, result.unsafe = scan(root, sums_name, ignore)
    if sums.is_symlink() or (sums.exists() and not sums.is_file()):
        return result  # named by scan(): a sums file that is a link vouches for nothing
    if not sums.is_file():
        result.missing.append(sums_name)
        return result
    listed, result.malformed = read_checksums(sums)
    present = set(present_list)
    for rel, expected in sorted(listed.items()):
        if rel not in present:
            result.missing.append(rel)
        elif sha256_file(root / rel) != expected:
            result.changed.append(rel)
    result.unlisted = sorted(present - set(listed))
    return result
