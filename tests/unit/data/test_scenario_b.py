from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from multicard.data import mnist, scenario_b
from multicard.data.scenario_a import resize_unit
from multicard.errors import InputError
from tests.helpers import DATA, ROOT


def request(out: Path, fmt: str = "png", limit: int = 300, size: int = 40) -> scenario_b.Request:
    return scenario_b.Request(DATA / "mnist", out, size, fmt, limit)


@pytest.fixture(scope="module")
def png_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("b") / "40px-png"
    scenario_b.prepare(request(out), workers=2, echo=lambda _: None, progress=False)
    return out


def test_tree_layout_lists_and_labels(png_tree: Path) -> None:
    meta = json.loads((png_tree / "dataset.json").read_text())
    assert meta["counts"] == {"train": 300, "test": 300} and meta["size"] == 40
    lines = (png_tree / "train_index.txt").read_text().splitlines()
    assert len(lines) == 300 and lines[0] == "train/5/00000.png 0"  # MNIST's first digit is a 5
    labels = np.load(png_tree / "labels_train.npy")
    assert labels.tolist() == mnist.load(DATA / "mnist", "train", 300).labels.tolist()
    assert all((png_tree / line.split()[0]).is_file() for line in lines)
    assert not (png_tree / scenario_b.PARTS).exists()
    assert scenario_b.verify(png_tree).ok


def test_stored_pixels_are_the_scenario_a_pixels(png_tree: Path) -> None:
    from PIL import Image

    image = np.asarray(Image.open(png_tree / "test/7/00000.png"))  # PNG: lossless
    source = torch.from_numpy(mnist.load(DATA / "mnist", "test", 1).images.copy())
    expected = resize_unit(source, 40).mul(255).round().to(torch.uint8).numpy()[0]
    assert image.shape == (40, 40) and np.array_equal(image, expected)


def test_prepare_is_idempotent(png_tree: Path) -> None:
    before = {p: p.stat().st_mtime_ns for p in png_tree.rglob("*")}
    messages: list[str] = []
    scenario_b.prepare(request(png_tree), echo=messages.append, progress=False)
    assert messages == [f"{png_tree}: already prepared (600 images), nothing to do"]
    assert {p: p.stat().st_mtime_ns for p in png_tree.rglob("*")} == before


def test_another_dataset_in_the_same_place_is_refused(png_tree: Path) -> None:
    with pytest.raises(InputError, match="holds a different dataset"):
        scenario_b.prepare(request(png_tree, size=48), echo=lambda _: None, progress=False)


def test_an_interrupted_preparation_resumes_without_redoing_finished_chunks(tmp_path: Path) -> None:
    req = request(tmp_path / "t", fmt="jpeg", limit=2300)  # chunks: 0-2000, 2000-2300 per split
    scenario_b._load_source(req.mnist_dir)
    scenario_b._write_chunk(req.out, "train", 0, 2000, req.size, req.fmt)  # then "the crash"
    done = req.out / "train/5/00000.jpg"
    stamp = done.stat().st_mtime_ns
    scenario_b.prepare(req, workers=2, echo=lambda _: None, progress=False)
    assert done.stat().st_mtime_ns == stamp
    assert scenario_b.verify(req.out).ok
    assert len((req.out / "test_index.txt").read_text().splitlines()) == 2300


def test_verify_names_changed_missing_and_unlisted_files(tmp_path: Path) -> None:
    out = tmp_path / "t"
    scenario_b.prepare(request(out, fmt="jpeg", limit=50), workers=1, echo=lambda _: None,
                       progress=False)
    with (out / "train/5/00000.jpg").open("ab") as f:
        f.write(b"\0")
    (out / "test/7/00000.jpg").unlink()
    (out / "train/5/extra.jpg").write_bytes(b"x")
    result = scenario_b.verify(out)
    assert result.changed == ["train/5/00000.jpg"]
    assert result.missing == ["test/7/00000.jpg"]
    assert result.unlisted == ["train/5/extra.jpg"]
    cli = subprocess.run([sys.executable, "-m", "multicard", "data", "verify", str(out)], cwd=ROOT,
                         capture_output=True, text=True)
    assert cli.returncode == 1
    assert "CHANGED: train/5/00000.jpg" in cli.stdout and "MISSING: test/7/00000.jpg" in cli.stdout


def test_estimate_is_in_the_right_range(tmp_path: Path) -> None:
    # 600 PNG files of a few hundred bytes each occupy one 4 KiB block apiece
    assert scenario_b.estimate_bytes(request(tmp_path / "x")) == 600 * 4096


def test_unprepared_tree_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a prepared Scenario B tree"):
        scenario_b.verify(tmp_path)


def fake_tree(path: Path, manifest: bytes) -> Path:
    (path / "train" / "3").mkdir(parents=True)
    (path / "train" / "3" / "00007.jpg").write_bytes(b"\xff\xd8 an image")
    (path / scenario_b.MANIFEST).write_bytes(manifest)
    (path / scenario_b.DATASET_JSON).write_text("{}")
    return path


def test_a_tree_is_staged_to_local_disk_once_and_again_when_it_changed(tmp_path: Path) -> None:
    tree = fake_tree(tmp_path / "shared" / "scenario_b" / "32px-jpeg", b"abc  train/3/00007.jpg\n")
    local = tmp_path / "local"
    first = scenario_b.stage(tree, local)
    target = local / "scenario_b" / "32px-jpeg"
    assert first["to"] == str(target) and first["copied"] is True and first["bytes"] > 0
    assert (target / "train" / "3" / "00007.jpg").read_bytes() == b"\xff\xd8 an image"
    assert scenario_b.stage(tree, local)["copied"] is False  # the same manifest: kept
    (tree / scenario_b.MANIFEST).write_bytes(b"def  train/3/00007.jpg\n")  # prepared anew
    assert scenario_b.stage(tree, local)["copied"] is True
    assert sorted(p.name for p in (local / "scenario_b").iterdir()) == ["32px-jpeg"]  # no half copy left
