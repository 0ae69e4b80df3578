"""Bad input, as a list of promises: each case exits 2 with one line naming what is wrong, before
anything is allocated or launched, and leaves no file behind. Run in-process through `cli.main`."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import tomli_w

from multicard import cli, integrity
from tests.helpers import EXPERIMENTS, ROOT, TINY_FIXED, tmpfs, write_spec

Case = Callable[[Path], list[str]]


def spec_with(tmp: Path, **sections: dict) -> str:
    return str(write_spec(tmp, **sections))


def raw_spec(tmp: Path, text: str) -> str:
    """A spec whose [trials] section is `text` verbatim (TOML `nan`, `inf`)."""
    path = Path(write_spec(tmp, trials={"count": 1}))
    path.write_text(path.read_text().replace("[trials]\ncount = 1\n", f"[trials]\n{text}\n"))
    return str(path)


def a_run(tmp: Path) -> Path:
    """A reported run directory (spec.toml, trials.jsonl, SHA256SUMS)."""
    from multicard.plan import spec

    root = tmp / "run"
    root.mkdir()
    (root / "spec.toml").write_text(spec.to_toml(spec.load(write_spec(tmp, name="ran"))))
    (root / "trials.jsonl").write_text("")
    integrity.write_checksums(root)
    return root


def a_fifo(tmp: Path, name: str) -> str:
    import os

    os.mkfifo(tmp / name)
    return str(tmp / name)


def a_file(tmp: Path, name: str = "file.txt", data: bytes = b"x\n") -> str:
    (tmp / name).write_bytes(data)
    return str(tmp / name)


def huge_grid(tmp: Path) -> list[str]:
    grid = {"gpus": list(range(1, 65)), "batch_size": list(range(1, 65)), "epochs": list(range(1, 31))}
    fixed = {k: v for k, v in TINY_FIXED.items() if k not in grid}
    return ["plan", spec_with(tmp, fixed=fixed, grid=grid)]


CASES: dict[str, tuple[Case, str]] = {
    # bounded inputs: refused before the plan is built
    "--trials above the cap": (lambda t: ["plan", spec_with(t), "--trials", "100000"],
                               "expected an integer from 1 to 1000"),
    "[trials].count above the cap": (lambda t: ["plan", spec_with(t, trials={"count": 10**9})],
                                     "[trials].count: expected an integer >= 1 and <= 1000"),
    "a grid of 122,880 trials": (huge_grid, "the plan would hold 122880 trials"),
    "epochs beyond any run": (lambda t: ["plan", spec_with(t, fixed={**TINY_FIXED, "epochs": 10**9})],
                              "[fixed].epochs: expected an integer >= 1 <= 10000"),
    "batch_size beyond any run": (lambda t: ["plan", spec_with(t, fixed={**TINY_FIXED, "batch_size": 10**7})],
                                  "[fixed].batch_size: expected an integer >= 1 <= 65536"),
    "image_size beyond any run": (lambda t: ["plan", spec_with(t, fixed={**TINY_FIXED, "image_size": 10**5})],
                                  "[fixed].image_size: expected an integer >= 28 <= 1024"),
    "gpus beyond any node": (lambda t: ["plan", spec_with(t, grid={"gpus": [1, 1000]})],
                             "[grid].gpus: expected an integer >= 1 <= 64"),
    "timeout_s NaN": (lambda t: ["plan", raw_spec(t, "count = 1\ntimeout_s = nan")],
                      "[trials].timeout_s: expected a finite number of seconds > 0"),
    "timeout_s infinite": (lambda t: ["plan", raw_spec(t, "count = 1\ntimeout_s = inf")],
                           "[trials].timeout_s: expected a finite number of seconds > 0"),
    "timeout_s zero": (lambda t: ["plan", raw_spec(t, "count = 1\ntimeout_s = 0")],
                       "[trials].timeout_s: expected a finite number of seconds > 0"),
    "timeout_s negative": (lambda t: ["plan", raw_spec(t, "count = 1\ntimeout_s = -5")],
                           "[trials].timeout_s: expected a finite number of seconds > 0"),
    "lr NaN": (lambda t: ["plan", spec_with(t, fixed={**TINY_FIXED, "lr": float("nan")})],
               "[fixed].lr: expected a number >= 0"),
    "--node-rank (not a flag of run)": (lambda t: ["run", spec_with(t), "--out", str(t / "o"), "--nnodes",
                                                 "2", "--rdzv-endpoint", "h:29500", "--node-rank", "1"],
                                      "unrecognized arguments: --node-rank 1"),
    "several nodes without an endpoint": (lambda t: ["run", spec_with(t), "--out", str(t / "o"),
                                                     "--nnodes", "2"],
                                          "nnodes > 1 needs --rdzv-endpoint HOST:PORT"),
    "a launcher without --node-rank-env": (
        lambda t: ["run", spec_with(t), "--out", str(t / "o"), "--nnodes", "2", "--rdzv-endpoint",
                   "h:29500", "--launcher", "true -x"], "give --node-rank-env VAR"),
    "--node-rank-env not a name": (
        lambda t: ["run", spec_with(t), "--out", str(t / "o"), "--nnodes", "2", "--rdzv-endpoint",
                   "h:29500", "--launcher", "true", "--node-rank-env", "A B"],
        "--node-rank-env: expected a variable name, got 'A B'"),
    "a launcher not on PATH": (
        lambda t: ["run", spec_with(t), "--out", str(t / "o"), "--nnodes", "2", "--rdzv-endpoint",
                   "h:29500", "--launcher", "no-such-launcher", "--node-rank-env", "RANK_OF_NODE"],
        "--launcher: no-such-launcher is not on PATH"),
    "--launcher unbalanced quotes": (
        lambda t: ["run", spec_with(t), "--out", str(t / "o"), "--nnodes", "2", "--rdzv-endpoint",
                   "h:29500", "--launcher", "mpirun '-np"], "--launcher/--step-wrapper: No closing"),
    "--rdzv-endpoint without a port": (lambda t: ["run", spec_with(t), "--out", str(t / "o"), "--nnodes",
                                                  "2", "--rdzv-endpoint", "node1"],
                                       "--rdzv-endpoint: expected HOST:PORT"),
    "--rdzv-endpoint port out of range": (lambda t: ["run", spec_with(t), "--out", str(t / "o"),
                                                     "--nnodes", "2", "--rdzv-endpoint", "node1:99999"],
                                          "--rdzv-endpoint: expected HOST:PORT"),
    # every profile is validated, selected or not
    "a typo in a profile that is not selected": (
        lambda t: ["plan", spec_with(t, profiles={"p1": {"fixed": {"epoch": 3}}})],
        "(in profile 'p1')"),
    # paths that are the wrong kind of thing
    "plan given a directory": (lambda t: ["plan", str(t)], "a directory, not a spec file"),
    "run given a directory": (lambda t: ["run", str(t), "--out", str(t / "o")],
                              "a directory, not a spec file"),
    "run --out an existing file": (lambda t: ["run", spec_with(t), "--out", a_file(t)],
                                   "--out exists and is not a directory"),
    "report given a file": (lambda t: ["report", a_file(t)], "not a directory"),
    "report --out an existing file": (lambda t: ["report", str(a_run(t)), "--out", a_file(t)],
                                      "--out exists and is not a directory"),
    "report --claims an experiment spec": (
        lambda t: ["report", str(a_run(t)), "--claims", str(EXPERIMENTS / "table2_precision.toml")],
        "not a claims file"),
    "pack --out an existing directory": (lambda t: ["pack", str(a_run(t)), "--out", str(t)],
                                         "--out is a directory"),
    "verify a path that does not exist": (lambda t: ["verify", str(t / "nonexistent")],
                                          "no such directory or archive"),
    "trace summarize a corrupt .json.gz": (
        lambda t: ["trace", "summarize", a_file(t, "t.json.gz", gzip.compress(b'{"traceEvents": [')[:-9])],
        "a corrupt or truncated gzip file"),
    "trace summarize a bad gzip": (lambda t: ["trace", "summarize", a_file(t, "t.gz", b"\x1f\x8bjunk")],
                                   "a corrupt or truncated gzip file"),
    "trace summarize JSON that is a list of numbers": (
        lambda t: ["trace", "summarize", a_file(t, "t.json", b"[1, 2, 3]")], "not a Kineto trace"),
    "trace summarize junk traceEvents": (
        lambda t: ["trace", "summarize", a_file(t, "t.json", b'{"traceEvents": [1, "x"]}')],
        "not a Kineto trace"),
    "data prepare --limit -1": (lambda t: ["data", "prepare", "--size", "32", "--limit", "-1"],
                                "expected an integer from 0 to 60000"),
    "data prepare --out an existing file": (lambda t: ["data", "prepare", "--size", "32", "--out", a_file(t)],
                                            "--out exists and is not a directory"),
    "data prepare a size no memory holds": (lambda t: ["data", "prepare", "--size", "100000"],
                                            "expected an integer from 28 to 1024"),
    "topo on an absurd CPU range": (
        lambda t: ["topo", a_file(t, "n.txt", b"available: 1 nodes (0)\nnode 0 cpus: 0-999999999\n")],
        "CPU number beyond 65535"),
    "--rdzv-endpoint with a digit int() refuses": (
        lambda t: ["run", spec_with(t), "--out", str(t / "o"), "--nnodes", "2", "--rdzv-endpoint",
                   "h:\u00b2"], "--rdzv-endpoint: expected HOST:PORT"),
    "run --trace nsys without nsys leaves nothing behind": (
        lambda t: ["run", spec_with(t), "--out", str(t / "o"), "--trace", "nsys"], "nsys is not on PATH"),
    "report a directory that does not exist": (lambda t: ["report", str(t / "nonexistent")],
                                               "not a directory"),
    "report --out below a file": (lambda t: ["report", str(a_run(t)), "--out", a_file(t) + "/sub"],
                                  "cannot be created"),
    "pack --out below a file": (lambda t: ["pack", str(a_run(t)), "--out", a_file(t) + "/x.tar.gz"],
                                "cannot write the archive"),
    "pack --out a FIFO": (lambda t: ["pack", str(a_run(t)), "--out", a_fifo(t, "pipe")],
                          "is not a regular file"),
    "data prepare --out below a file": (
        lambda t: ["data", "prepare", "--size", "32", "--out", a_file(t) + "/tree"], "is a file"),
    "plan a FIFO": (lambda t: ["plan", a_fifo(t, "spec.toml")], "not a regular file"),
    "trace summarize a FIFO": (lambda t: ["trace", "summarize", a_fifo(t, "t.json")],
                               "not a regular file"),
    "trace summarize metadata events only": (
        lambda t: ["trace", "summarize", a_file(t, "t.json", b'{"traceEvents": [{"ph": "M"}]}')],
        "nothing was traced"),
    "trace summarize events with text times": (
        lambda t: ["trace", "summarize", a_file(t, "t.json",
                                                b'{"traceEvents": [{"ph": "X", "ts": "a", "dur": "b"}]}')],
        "is not a number"),
    "topo on a reversed CPU range": (
        lambda t: ["topo", a_file(t, "n.txt", b"available: 1 nodes (0)\nnode 0 cpus: 5-3\n")],
        "not a CPU list"),
    "topo on a distance matrix of 5000 nodes": (
        lambda t: ["topo", a_file(t, "n.txt", ("available: 1 nodes (0)\nnode 0 cpus: 0\nnode distances:\n"
                                               "node " + " ".join(map(str, range(5000))) + "\n").encode())],
        "beyond any machine's 4096 nodes"),
    "--save-calibration without --calibrate": (
        lambda t: ["plan", spec_with(t), "--save-calibration", str(t / "c.json")], "needs --calibrate RUN"),
    "--save-budget without --budget": (
        lambda t: ["plan", spec_with(t), "--save-budget", str(t / "b.json")], "needs --budget DURATION"),
    "--json with --budget": (lambda t: ["plan", spec_with(t), "--json", "--budget", "1h"], "(use one)"),
    "--budget 1h30": (lambda t: ["plan", spec_with(t), "--budget", "1h30"], "1h30m, not 1h30"),
    "--trials beside --budget-plan": (
        lambda t: ["run", spec_with(t), "--trials", "2", "--budget-plan", a_file(t, "b.json", b"{}")],
        "the budget plan sets the trials"),
    "--budget-plan without this run": (
        lambda t: ["plan", spec_with(t), "--budget-plan", a_file(t, "b.json", b'{"duration": "1h", '
                                                                             b'"experiments": {}}')],
        "no entry for"),
    "topo on an absurd node count": (
        lambda t: ["topo", a_file(t, "n.txt", b"available: 1 nodes (0)\nnode 99999 cpus: 0\n")],
        "NUMA node 99999 is beyond"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_exits_2_with_one_line(name: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    build, expected = CASES[name]
    argv = build(tmp_path)
    before = _files(tmp_path)
    code, lines = run_cli(argv, capsys)
    assert code == 2, (name, lines)
    assert len(lines) == 1 and expected in lines[0], (name, lines)
    assert "Traceback" not in lines[0]
    assert _files(tmp_path) == before, "bad input must not leave files behind"


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    return code, capsys.readouterr().err.strip().splitlines()


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "ro", "ro,size=1m") as target:
        yield target


def test_run_into_a_read_only_directory_is_refused_before_it_starts(
        read_only_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = run_cli(["run", spec_with(tmp_path), "--out", str(read_only_dir / "run")], capsys)
    assert code == 2 and len(lines) == 1
    assert f"{read_only_dir}: not writable (read-only file system or no permission)" in lines[0]


def test_a_torn_line_is_one_warning_line(tmp_path: Path) -> None:
    import sys

    from multicard.plan import spec
    from multicard.publish import runs
    from tests.helpers import ROOT

    run = tmp_path / "run"
    run.mkdir()
    (run / "spec.toml").write_text(spec.to_toml(spec.load(write_spec(tmp_path))))
    (run / "trials.jsonl").write_text('{"schema": 1, "exper')  # a crash mid-write
    done = subprocess.run([sys.executable, "-m", "multicard", "report", str(run)], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"multicard: warning: {run / 'trials.jsonl'}:1: skipped an incomplete record (a crash mid-write)"]
    text = (run / "REPORT.md").read_text()
    assert "trials.jsonl`: 1 line(s) skipped (line 1)" in text
    assert runs.load_run(run).torn_lines == [1]


def test_tomli_w_writes_what_the_cases_read() -> None:
    # the raw_spec helper edits TOML text: make sure the section it replaces is what tomli_w writes
    assert "[trials]\ncount = 1\n" in tomli_w.dumps({"trials": {"count": 1}})


@pytest.mark.parametrize(("value", "expected"), [
    ("\u00b2", "SLURM_NODEID: expected a node index, got '²'"),  # a digit to str.isdigit, not int()
    ("2", "SLURM_NODEID: expected 0 <= index < nnodes (2), got 2"),
    (None, "SLURM_NODEID is not set: the launcher did not say which node this is")])
def test_a_node_step_without_a_valid_node_index_is_bad_input(tmp_path: Path, value: str | None,
                                                              expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SLURM_NODEID"} | \
        ({"SLURM_NODEID": value} if value is not None else {})
    done = subprocess.run([sys.executable, "-m", "multicard.run.node_step", "--nnodes", "2",
                           "--node-rank-env", "SLURM_NODEID", "--dir", str(tmp_path / "trial"),
                           "--ranks-per-node", "1", "--", "true"], env=env, capture_output=True,
                          text=True, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"multicard.run.node_step: error: {expected}"]
    assert not (tmp_path / "trial").exists()


def test_a_tree_the_disk_cannot_hold_is_refused_before_it_is_made(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with tmpfs(tmp_path / "small", "size=1m") as disk:
        code, lines = run_cli(["data", "prepare", "--size", "300", "--out", str(disk / "tree")], capsys)
        assert code == 2 and "GiB free" in lines[-1] and "needs about" in lines[-1]
        assert not (disk / "tree").exists()
