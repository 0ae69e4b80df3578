from __future__ import annotations

import json
from pathlib import Path

import pytest

from multicard.run import store


def record(config_id: str = "abc", trial: int = 0, status: str = "ok") -> dict:
    return {"schema": 1, "experiment": "e", "config_id": config_id, "config": {}, "trial": trial,
            "status": status, "started": "2026-01-01T00:00:00+00:00", "wall_s": 1.0,
            "metrics": {}, "error": None, "artifacts": []}


def test_append_then_read_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "trials.jsonl"
    store.append(path, record(trial=0))
    store.append(path, record(trial=1, status="failed"))
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line)["schema"] == 1 for line in lines)
    assert [r["trial"] for r in store.read(path)] == [0, 1]
    assert store.finished(store.read(path)) == {("abc", 0, "none")}


def test_torn_last_line_is_skipped_with_a_warning_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "trials.jsonl"
    store.append(path, record(trial=0))
    with path.open("ab") as f:
        f.write(b'{"schema": 1, "experiment": "e", "conf')  # crash mid-write
    with pytest.warns(store.TornLineWarning, match=r"trials\.jsonl:2"):
        assert len(store.read(path)) == 1
    # the next append starts a fresh line instead of corrupting itself
    store.append(path, record(trial=1))
    with pytest.warns(store.TornLineWarning):
        records = store.read(path)
    assert [r["trial"] for r in records] == [0, 1]
    assert b'"conf\n' in path.read_bytes()  # the torn bytes are kept, not lost


def test_invalid_status_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="status"):
        store.append(tmp_path / "t.jsonl", record(status="done"))
    assert not (tmp_path / "t.jsonl").exists()


def test_reading_a_missing_file_gives_no_records(tmp_path: Path) -> None:
    assert store.read(tmp_path / "none.jsonl") == []


def test_an_append_the_disk_cannot_hold_is_taken_back_whole(tmp_path: Path) -> None:
    import errno

    from tests.helpers import tmpfs

    with tmpfs(tmp_path / "disk", "size=64k") as disk:
        path = disk / "trials.jsonl"
        store.append(path, {"status": "ok", "trial": 0})
        before = path.read_bytes()
        (disk / "spare").write_bytes(b"\0" * 4096)
        with (disk / "filler").open("wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 1024)
            except OSError:
                pass
        (disk / "spare").unlink()  # one page free: less than the next record needs
        with pytest.raises(OSError) as caught:
            store.append(path, {"status": "ok", "trial": 1, "pad": "x" * 20_000})
        assert caught.value.errno == errno.ENOSPC
        assert path.read_bytes() == before  # no partial line left
        assert store.read_with_skipped(path) == ([{"status": "ok", "trial": 0}], [])
