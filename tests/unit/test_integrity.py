from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from multicard import integrity


def make_run(root: Path) -> Path:
    (root / "raw" / "a1-t0-a0").mkdir(parents=True)
    (root / "raw" / "a1-t0-a0" / "stdout.log").write_text("hello\n")
    (root / "trials.jsonl").write_text('{"a": 1}\n')
    (root / "tables").mkdir()
    (root / "tables" / "t.md").write_text("| a |\n")
    (root / "trials.jsonl.lock").write_text("")  # coordination state, never listed
    integrity.write_checksums(root)
    return root


def test_checksums_pass_coreutils_and_our_verify(tmp_path: Path) -> None:
    root = make_run(tmp_path)
    listed = (root / "SHA256SUMS").read_text().splitlines()
    assert [line.split("  ", 1)[1] for line in listed] == [
        "raw/a1-t0-a0/stdout.log", "tables/t.md", "trials.jsonl"]
    subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=root, check=True)
    assert integrity.verify(root).ok


@pytest.mark.parametrize("name", ["raw/a1-t0-a0/stdout.log", "tables/t.md", "trials.jsonl"])
def test_one_appended_byte_is_named(tmp_path: Path, name: str) -> None:
    root = make_run(tmp_path)
    with (root / name).open("ab") as f:
        f.write(b"x")
    result = integrity.verify(root)
    assert result.changed == [name] and not result.missing and not result.unlisted


@pytest.mark.parametrize("byte", [b"x", b"\n", b" "])
def test_one_byte_appended_to_the_sums_file_itself_is_caught(tmp_path: Path, byte: bytes) -> None:
    root = make_run(tmp_path)
    with (root / "SHA256SUMS").open("ab") as f:
        f.write(byte)
    result = integrity.verify(root)
    assert not result.ok
    assert any("SHA256SUMS" in m for m in result.malformed)


def test_missing_and_unlisted_files_are_named(tmp_path: Path) -> None:
    root = make_run(tmp_path)
    (root / "tables" / "t.md").unlink()
    (root / "extra.txt").write_text("new")
    result = integrity.verify(root)
    assert result.missing == ["tables/t.md"]
    assert result.unlisted == ["extra.txt"]
    assert not result.changed


def test_names_with_backslash_or_newline_use_coreutils_escaping(tmp_path: Path) -> None:
    (tmp_path / "we\\ird\nname").write_text("x")
    integrity.write_checksums(tmp_path)
    assert (tmp_path / "SHA256SUMS").read_text().startswith("\\")
    assert integrity.verify(tmp_path).ok
    subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=tmp_path, check=True)


def test_links_fifos_and_devices_in_a_run_are_named_as_unsafe(tmp_path: Path) -> None:
    import os

    root = make_run(tmp_path / "run")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not part of the run\n")
    (root / "tables" / "link.md").symlink_to(outside / "secret.txt")
    (root / "elsewhere").symlink_to(outside, target_is_directory=True)
    os.mkfifo(root / "pipe")
    result = integrity.verify(root)
    assert result.unsafe == [f"elsewhere (symbolic link -> {outside})", "pipe (FIFO)",
                             f"tables/link.md (symbolic link -> {outside / 'secret.txt'})"]
    assert not result.ok and not result.unlisted  # nothing was read through the links


def test_a_sums_file_that_is_a_link_vouches_for_nothing(tmp_path: Path) -> None:
    root = make_run(tmp_path / "run")
    real = tmp_path / "elsewhere.sums"
    (root / "SHA256SUMS").rename(real)
    (root / "SHA256SUMS").symlink_to(real)
    result = integrity.verify(root)
    assert result.unsafe == [f"SHA256SUMS (symbolic link -> {real})"] and not result.ok


def test_no_sums_file_is_a_failed_check(tmp_path: Path) -> None:
    assert integrity.verify(tmp_path).missing == ["SHA256SUMS"]


def test_a_sums_file_that_is_a_folder_fails(tmp_path: Path) -> None:
    root = make_run(tmp_path / "run")
    (root / "SHA256SUMS").unlink()
    (root / "SHA256SUMS").mkdir()
    (root / "trials.jsonl").write_text("tampered\n")
    result = integrity.verify(root)
    assert result.unsafe == ["SHA256SUMS (a folder, not a checksum file)"] and not result.ok


def test_hard_links_and_lock_files_with_content_are_not_trusted(tmp_path: Path) -> None:
    import os

    root = make_run(tmp_path / "run")
    os.link(root / "tables" / "t.md", tmp_path / "outside-name")  # a second name, outside
    (root / "raw" / "x.lock").write_text("anything\n")  # filelock's locks are empty
    result = integrity.verify(root)
    assert result.unsafe == ["tables/t.md (a hard link: 2 names for one file)"]
    assert result.unlisted == ["raw/x.lock"] and not result.ok


def test_atomic_writes_keep_the_umask_and_leave_no_temporary_file(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        integrity.write_bytes_atomic(tmp_path / "f", b"x", durable=False)
        assert integrity.umask() == 0o027
    finally:
        os.umask(old)
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["f"]
