from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from multicard import artifact


def make_run(root: Path) -> Path:
    (root / "raw" / "a1-t0-a0").mkdir(parents=True)
    (root / "raw" / "a1-t0-a0" / "stdout.log").write_text("hello\n")
    (root / "trials.jsonl").write_text('{"a": 1}\n')
    (root / "tables").mkdir()
    (root / "tables" / "t.md").write_text("| a |\n")
    (root / "trials.jsonl.lock").write_text("")  # coordination state, never listed
    artifact.write_checksums(root)
    return root


def test_checksums_pass_coreutils_and_our_verify(tmp_path: Path) -> None:
    root = make_run(tmp_path)
    listed = (root / "SHA256SUMS").read_text().splitlines()
    assert [line.split("  ", 1)[1] for line in listed] == [
        "raw/a1-t0-a0/stdout.log", "tables/t.md", "trials.jsonl"]
    subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=root, check=True)
    assert artifact.verify(root).ok


@pytest.mark.parametrize("name", ["raw/a1-t0-a0/stdout.log", "tables/t.md", "trials.jsonl"])
def test_one_appended_byte_is_named(tmp_path: Path, name: str) -> None:
    root = make_run(tmp_path)
    with (root / name).open("ab") as f:
        f.write(b"x")
    result = artifact.verify(root)
    assert result.changed == [name] and not result.missing and not result.unlisted


@pytest.mark.parametrize("byte", [b"x", b"\n", b" "])
def test_one_byte_appended_to_the_sums_file_itself_is_caught(tmp_path: Path, byte: bytes) -> None:
    root = make_run(tmp_path)
    with (root / "SHA256SUMS").open("ab") as f:
        f.write(byte)
    result = artifact.verify(root)
    assert not result.ok
    assert any("SHA256SUMS" in m for m in result.malformed)


def test_missing_and_unlisted_files_are_named(tmp_path: Path) -> None:
    root = make_run(tmp_path)
    (root / "tables" / "t.md").unlink()
    (root / "extra.txt").write_text("new")
    result = artifact.verify(root)
    assert result.missing == ["tables/t.md"]
    assert result.unlisted == ["extra.txt"]
    assert not result.changed


def test_names_with_backslash_or_newline_use_coreutils_escaping(tmp_path: Path) -> None:
    (tmp_path / "we\\ird\nname").write_text("x")
    artifact.write_checksums(tmp_path)
    assert (tmp_path / "SHA256SUMS").read_text().startswith("\\")
    assert artifact.verify(tmp_path).ok
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
    result = artifact.verify(root)
    assert result.unsafe == [f"elsewhere (symbolic link -> {outside})", "pipe (FIFO)",
                             f"tables/link.md (symbolic link -> {outside / 'secret.txt'})"]
    assert not result.ok and not result.unlisted  # nothing was read through the links


def test_a_sums_file_that_is_a_link_vouches_for_nothing(tmp_path: Path) -> None:
    root = make_run(tmp_path / "run")
    real = tmp_path / "elsewhere.sums"
    (root / "SHA256SUMS").rename(real)
    (root / "SHA256SUMS").symlink_to(real)
    result = artifact.verify(root)
    assert result.unsafe == [f"SHA256SUMS (symbolic link -> {real})"] and not result.ok


def test_no_sums_file_is_a_failed_check(tmp_path: Path) -> None:
    assert artifact.verify(tmp_path).missing == ["SHA256SUMS"]


def test_env_capture_has_the_fields_reviewers_need(tmp_path: Path) -> None:
    env = artifact.capture_env(tmp_path)
    json.dumps(env)  # serialisable
    assert env["python"].count(".") == 2
    assert env["cpu"]["logical_cpus"] >= 1
    assert env["topology"]["nodes"] and env["topology"]["nodes"][0]["cpus"]
    assert env["storage"]["fstype"]
    assert isinstance(env["gpus"], list)
    assert "multicard" in env["packages"]


def test_a_sums_file_that_is_a_folder_fails(tmp_path: Path) -> None:
    root = make_run(tmp_path / "run")
    (root / "SHA256SUMS").unlink()
    (root / "SHA256SUMS").mkdir()
    (root / "trials.jsonl").write_text("tampered\n")
    result = artifact.verify(root)
    assert result.unsafe == ["SHA256SUMS (a folder, not a checksum file)"] and not result.ok


def test_hard_links_and_lock_files_with_content_are_not_trusted(tmp_path: Path) -> None:
    import os

    root = make_run(tmp_path / "run")
    os.link(root / "tables" / "t.md", tmp_path / "outside-name")  # a second name, outside
    (root / "raw" / "x.lock").write_text("anything\n")  # filelock's locks are empty
    result = artifact.verify(root)
    assert result.unsafe == ["tables/t.md (a hard link: 2 names for one file)"]
    assert result.unlisted == ["raw/x.lock"] and not result.ok


def test_env_records_the_network_nccl_uses_and_the_slurm_allocation(monkeypatch) -> None:
    for key, value in {"NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_HCA": "mlx5_0", "SLURM_JOB_NUM_NODES": "2",
                       "SLURM_GPUS_PER_NODE": "4", "SLURM_CPUS_PER_TASK": "32"}.items():
        monkeypatch.setenv(key, value)
    recorded = artifact.capture_env()["env"]
    assert (recorded["NCCL_SOCKET_IFNAME"], recorded["NCCL_IB_HCA"]) == ("ib0", "mlx5_0")
    assert (recorded["SLURM_JOB_NUM_NODES"], recorded["SLURM_GPUS_PER_NODE"],
            recorded["SLURM_CPUS_PER_TASK"]) == ("2", "4", "32")


def test_atomic_writes_keep_the_umask_and_leave_no_temporary_file(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        artifact.write_bytes_atomic(tmp_path / "f", b"x", durable=False)
        assert artifact.umask() == 0o027
    finally:
        os.umask(old)
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_env_json_says_which_nvml_bindings_ran_and_whether_torchaos_ops_loaded() -> None:
    found = artifact.torchao_ops()
    assert set(found) == {"loaded", "why"}
    assert (found["loaded"] is True) == (found["why"] is None)  # a failure always says why
    env = artifact.capture_env()
    assert env["torchao_ops"] == found and env["nvml_bindings"].startswith("nvidia-ml-py ")
    assert {"image_created", "base_digest"} <= set(env["container"])
