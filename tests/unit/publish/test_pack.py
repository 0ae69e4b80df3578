"""pack -> verify round trip, and every kind of unsafe archive refused without extracting it."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from multicard import integrity
from multicard.errors import InputError
from multicard.publish import document, pack
from tests.unit.publish.test_report import constructed_run


@pytest.fixture
def run(tmp_path: Path) -> Path:
    directory = constructed_run(tmp_path / "table2-run")
    document.write_report([directory], directory)
    return directory


def test_pack_then_verify_round_trip_and_same_bytes_twice(run: Path, tmp_path: Path) -> None:
    archive = pack.pack(run, pack.default_target(run))
    assert archive == tmp_path / "table2-run.tar.gz"
    result = pack.verify_archive(archive)
    assert result.ok, result
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert names[0] == "table2-run" and "table2-run/SHA256SUMS" in names
    assert set(names[1:]) == {f"table2-run/{rel}" for rel in
                              [*integrity.read_checksums(run / "SHA256SUMS")[0], "SHA256SUMS"]}
    first = archive.read_bytes()
    assert pack.pack(run, tmp_path / "again.tar.gz").read_bytes() == first


def test_an_altered_member_is_named(run: Path, tmp_path: Path) -> None:
    archive = pack.pack(run, tmp_path / "a.tar.gz")
    rebuilt = tmp_path / "b.tar.gz"
    with tarfile.open(archive) as src, tarfile.open(rebuilt, "w:gz") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read() if member.isfile() else None
            if member.name.endswith("trials.jsonl"):
                data = data.replace(b'"train_time_s": 5.0', b'"train_time_s": 4.0')
                member.size = len(data)
            dst.addfile(member, io.BytesIO(data) if data is not None else None)
    result = pack.verify_archive(rebuilt)
    assert result.changed == ["trials.jsonl"] and not result.unsafe


def test_pack_refuses_inside_the_directory(run: Path) -> None:
    with pytest.raises(InputError, match="cannot go inside"):
        pack.pack(run, run / "x.tar.gz")


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    data = b"payload\n" if kind == tarfile.REGTYPE else b""
    info.size = len(data)
    return info, data


def archive_with(tmp_path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> Path:
    path = tmp_path / "evil.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for info, data in (member("run/ok.txt"), *members):
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize(("bad", "reason"), [
    (member("/etc/evil"), "absolute path"),
    (member("run/../../evil"), "'..' in the path"),
    (member("other/evil"), "outside the top folder run/"),
    (member("run/up", tarfile.SYMTYPE, "../../etc/passwd"), "link leaving the tree -> ../../etc/passwd"),
    (member("run/abs", tarfile.SYMTYPE, "/etc/passwd"), "link to the absolute path /etc/passwd"),
    (member("run/hard", tarfile.LNKTYPE, "etc/passwd"), "link leaving the tree -> etc/passwd"),
    (member("run/tty", tarfile.CHRTYPE), "device file"),
    (member("run/disk", tarfile.BLKTYPE), "device file"),
    (member("run/pipe", tarfile.FIFOTYPE), "FIFO"),
])
def test_unsafe_members_are_named_and_nothing_is_written(tmp_path: Path, monkeypatch,
                                                         bad: tuple[tarfile.TarInfo, bytes],
                                                         reason: str) -> None:
    path = archive_with(tmp_path, bad)
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result = pack.verify_archive(path)
    assert result.unsafe == [f"{bad[0].name} ({reason})"]
    assert not result.ok
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_links_are_unsafe_even_inside_the_tree_and_so_are_setuid_files(tmp_path: Path) -> None:
    setuid, data = member("run/suid")
    setuid.mode = 0o4755
    setgid, _ = member("run/sgid")
    setgid.mode = 0o2755
    path = archive_with(tmp_path, member("run/sub/link", tarfile.SYMTYPE, "../ok.txt"),
                        member("run/hard", tarfile.LNKTYPE, "run/ok.txt"), (setuid, data),
                        (setgid, data))
    result = pack.verify_archive(path)
    assert result.unsafe == ["run/sub/link (symbolic link -> ../ok.txt)",
                             "run/hard (hard link -> run/ok.txt)",
                             "run/suid (setuid or setgid bit)", "run/sgid (setuid or setgid bit)"]
    assert not result.ok


def test_not_a_tar_archive_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    with pytest.raises(InputError, match="not a tar archive"):
        pack.verify_archive(path)


def test_a_truncated_archive_is_malformed(run: Path, tmp_path: Path) -> None:
    archive = pack.pack(run, tmp_path / "a.tar.gz")
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    result = pack.verify_archive(cut)
    assert not result.ok and "truncated or corrupt" in result.malformed[0]
