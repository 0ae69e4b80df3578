"""The command line as users call it: exit codes and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import EXPERIMENTS, ROOT, write_spec
from tests.unit.publish.test_report import constructed_run


def multicard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "multicard", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_plan_json_lists_every_trial_in_order() -> None:
    result = multicard("plan", str(EXPERIMENTS / "table2_precision.toml"), "--profile", "smoke",
                       "--trials", "2", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert len(plan) == 20
    assert set(plan[0]) == {"config_id", "config", "trial", "estimate_s", "estimate"}
    assert {p["estimate"] for p in plan} == {"guessed"} and all(p["estimate_s"] > 0 for p in plan)
    assert [p["trial"] for p in plan] == [0] * 10 + [1] * 10


def test_plan_prints_the_cost_estimate() -> None:
    result = multicard("plan", str(EXPERIMENTS / "table2_precision.toml"), "--trials", "3")
    assert result.returncode == 0
    assert "3 trial(s) x 20 configs = 60 trials; estimated" in result.stdout
    assert "GPU-hours" in result.stdout


@pytest.mark.parametrize(
    ("sections", "key"),
    [({"fixed": {"device": "cpu", "colour": "red"}}, "[fixed].colour"),
     ({"fixed": {"device": "cpu", "epochs": "2"}}, "[fixed].epochs"),
     ({"grid": {"precision": []}}, "[grid].precision")],
)
def test_bad_specs_exit_2_with_one_line(tmp_path: Path, sections: dict, key: str) -> None:
    path = write_spec(tmp_path, **sections)
    for command in ("plan", "run"):
        result = multicard(command, str(path), "--out", str(tmp_path / "o")) if command == "run" \
            else multicard(command, str(path))
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and str(path) in lines[0] and key in lines[0]
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_bad_arguments_exit_2_with_one_line(tmp_path: Path) -> None:
    for args in (["plan"], ["plan", "x.toml", "--trials", "0"], ["frobnicate"],
                 ["plan", str(EXPERIMENTS / "table2_precision.toml"), "--profile", "nope"],
                 ["verify", str(tmp_path / "missing")]):
        result = multicard(*args)
        assert result.returncode == 2, args
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)


def test_report_then_verify_then_tamper(tmp_path: Path) -> None:
    run = constructed_run(tmp_path / "run")
    assert multicard("report", str(run)).returncode == 0
    assert (run / "REPORT.md").exists()
    ok = multicard("verify", str(run))
    assert ok.returncode == 0 and "all files match" in ok.stdout
    with (run / "trials.jsonl").open("ab") as f:
        f.write(b"\x00")
    bad = multicard("verify", str(run))
    assert bad.returncode == 1
    assert bad.stdout.splitlines() == ["CHANGED: trials.jsonl"]


def test_pack_prints_the_archive_and_verify_reads_it(tmp_path: Path) -> None:
    run = constructed_run(tmp_path / "run")
    assert multicard("report", str(run)).returncode == 0
    packed = multicard("pack", str(run))
    assert packed.returncode == 0
    archive = Path(packed.stdout.splitlines()[-1])
    assert archive == tmp_path / "run.tar.gz" and archive.is_file()
    checked = multicard("verify", str(archive))
    assert checked.returncode == 0 and "all files match" in checked.stdout
    (run / "REPORT.md").write_text("edited\n")  # a directory that no longer verifies is not packed
    refused = multicard("pack", str(run), "--out", str(tmp_path / "other.tar.gz"))
    assert refused.returncode == 1 and "CHANGED: REPORT.md" in refused.stdout
    assert not (tmp_path / "other.tar.gz").exists()
    (tmp_path / "notes.txt").write_text("hello\n")
    not_tar = multicard("verify", str(tmp_path / "notes.txt"))
    assert not_tar.returncode == 2 and "not a tar archive" in not_tar.stderr


def test_plan_several_specs_prints_one_line_each_and_a_total() -> None:
    result = multicard("plan", "--summary", str(EXPERIMENTS / "table2_precision.toml"),
                       str(EXPERIMENTS / "numa_binding.toml") + "@controls")
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 0
    assert lines[0].startswith("table2_precision (profile paper): 5 trial(s) x 20 configs")
    assert lines[1].startswith("numa_binding (profile controls):")
    total = next(i for i, line in enumerate(lines) if line.startswith("total: 260 trials; estimated "))
    # then which claims each can decide, and which neither can
    assert lines[total + 1] == "table2_precision (profile paper) can decide: C1, C2, C3, C7"
    # the controls run the DataLoader alone: the NUMA test needs DALI beside it
    assert lines[total + 2] == "numa_binding (profile controls) can decide: no claim"
    assert lines[-1].startswith("claims these runs cannot decide: C4, C5, C6, C8, C9, C10, C11")


def test_env_and_data_verify() -> None:
    env = multicard("env")
    assert env.returncode == 0 and json.loads(env.stdout)["schema"] == 1
    data = multicard("data", "verify")
    assert data.returncode == 0 and "all 4 MNIST files match" in data.stdout


def test_set_fixes_a_setting_for_one_run(tmp_path: Path) -> None:
    spec_file = str(EXPERIMENTS / "table2_precision.toml")
    result = multicard("plan", spec_file, "--set", "gpus=2", "--set", "image_size=300", "--json")
    plan = json.loads(result.stdout)
    assert len(plan) == 25 and all("gpus" not in p["config"] for p in plan)  # gpus left the grid
    bad = multicard("plan", spec_file, "--set", "image_size=huge")
    assert bad.returncode == 2 and "[fixed].image_size" in bad.stderr
    assert multicard("plan", spec_file, "--set", "nonsense").returncode == 2
