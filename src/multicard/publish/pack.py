"""A run or report directory as one archive (for Zenodo and the like), and its verification
without extracting it.

`pack` writes DIR.tar.gz: the files listed in DIR/SHA256SUMS plus SHA256SUMS itself, under one top
folder named like DIR, in sorted order with fixed owner, mode and time, in a gzip stream without a
time stamp, so packing the same files twice gives the same bytes ($SOURCE_DATE_EPOCH sets the
member time, default 0). It packs only a directory that verifies: an archive of files that do not
match their sums would carry the mismatch to everyone who downloads it.

`verify_archive` reads the members one by one from the compressed stream, hashing regular files
in memory; nothing is written to disk. Members that extraction could turn against the reader are
reported as unsafe and never read: absolute names, `..` components, names outside the one top
folder, links of either kind (`pack` writes none; a hard link aliases another member even inside
the tree), device files, FIFOs, and files with the setuid or setgid bit.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import posixpath
import stat
import tarfile
import zlib
from pathlib import Path

from multicard import integrity
from multicard.errors import InputError

SUFFIX = ".tar.gz"


def default_target(root: Path) -> Path:
    return root.resolve().parent / f"{root.resolve().name}{SUFFIX}"


def pack(root: Path, target: Path) -> Path:
    """Write `target` from the verified directory `root`; the caller verifies first."""
    if target.resolve().is_relative_to(root.resolve()):
        raise InputError(f"{target}: the archive cannot go inside the directory it packs")
    listed, _ = integrity.read_checksums(root / integrity.SUMS_FILE)
    top = root.resolve().name
    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    tmp = target.with_name(target.name + ".tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tmp.open("wb") as raw, \
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as compressed, \
                tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as tar:
            tar.addfile(_info(top, tarfile.DIRTYPE, 0, mtime))
            for rel in sorted([*listed, integrity.SUMS_FILE]):
                path = root / rel
                with path.open("rb") as f:
                    tar.addfile(_info(f"{top}/{rel}", tarfile.REGTYPE, path.stat().st_size, mtime), f)
        tmp.replace(target)
    except OSError as exc:
        with contextlib.suppress(OSError):  # no half-written archive left behind
            tmp.unlink(missing_ok=True)
        raise InputError(f"{target}: cannot write the archive ({exc.strerror})") from None
    return target


def _info(name: str, kind: bytes, size: int, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mtime = kind, size, mtime
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def verify_archive(path: Path) -> integrity.VerifyResult:
    """Compare the archive's files with the SHA256SUMS it carries, reading it once as a stream."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    if not tarfile.is_tarfile(path):
        raise InputError(f"{path}: not a tar archive (plain, gzip, bzip2 or xz)")
    result = integrity.VerifyResult()
    hashes: dict[str, str] = {}
    sums: bytes | None = None
    top: str | None = None
    try:
        with tarfile.open(path, mode="r|*") as tar:
            for member in tar:
                top = top or member.name.split("/", 1)[0]
                problem = unsafe_reason(member, top)
                if problem:
                    result.unsafe.append(f"{member.name} ({problem})")
                    continue
                if not member.isfile():
                    continue
                if "/" not in member.name:
                    result.malformed.append(f"{member.name}: a file outside a top folder")
                    continue
                rel = member.name.split("/", 1)[1]
                if rel in hashes or (rel == integrity.SUMS_FILE and sums is not None):
                    result.malformed.append(f"{member.name}: appears twice in the archive")
                stream = tar.extractfile(member)
                assert stream is not None  # regular files always have a stream
                if rel == integrity.SUMS_FILE:
                    sums = stream.read()
                else:
                    hashes[rel] = integrity.sha256_stream(stream)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        result.malformed.append(f"{path.name}: truncated or corrupt archive ({exc})")
        return result
    return _compare(result, hashes, sums, top)


def _compare(result: integrity.VerifyResult, hashes: dict[str, str], sums: bytes | None,
             top: str | None) -> integrity.VerifyResult:
    if sums is None:
        result.missing.append(f"{top or '?'}/{integrity.SUMS_FILE}")
        return result
    listed, problems = integrity.parse_checksums(sums, integrity.SUMS_FILE)
    result.malformed += problems
    for rel, expected in sorted(listed.items()):
        if rel not in hashes:
            result.missing.append(rel)
        elif hashes[rel] != expected:
            result.changed.append(rel)
    result.unlisted = sorted(set(hashes) - set(listed))
    return result


def unsafe_reason(member: tarfile.TarInfo, top: str) -> str | None:
    """Why extracting `member` could write outside the archive's top folder (None: it cannot)."""
    name = member.name
    if name.startswith("/") or posixpath.isabs(name) or (len(name) > 1 and name[1] == ":"):
        return "absolute path"
    if ".." in name.split("/"):
        return "'..' in the path"
    if name.split("/", 1)[0] != top:
        return f"outside the top folder {top}/"
    if member.ischr() or member.isblk():
        return "device file"
    if member.isfifo():
        return "FIFO"
    if member.issym() or member.islnk():
        return _link_reason(member, top)
    if not (member.isfile() or member.isdir()):
        return "unsupported member type"
    if member.mode & (stat.S_ISUID | stat.S_ISGID):
        return "setuid or setgid bit"
    return None


def _link_reason(member: tarfile.TarInfo, top: str) -> str:
    """Every link is unsafe: `pack` writes none, and extraction would make a file that no
    checksum covers (a hard link aliases another member, even one inside the tree)."""
    target = member.linkname
    if target.startswith("/"):
        return f"link to the absolute path {target}"
    # a symbolic link resolves from its own folder, a hard link from the archive root
    base = posixpath.dirname(member.name) if member.issym() else ""
    resolved = posixpath.normpath(posixpath.join(base, target))
    if resolved.split("/", 1)[0] != top or resolved.startswith(".."):
        return f"link leaving the tree -> {target}"
    return f"{'symbolic' if member.issym() else 'hard'} link -> {target}"
