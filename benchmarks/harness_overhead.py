"""How much of a smoke trial's wall time is harness, not training; and the smoke run's wall time.

    python benchmarks/harness_overhead.py             # runs table2_precision --profile smoke
    python benchmarks/harness_overhead.py --run DIR   # analyses a finished run instead

Per trial, the runner's wall time is split with the rank-0 timeline in result.json:
launch (interpreter + torchrun start), imports (torch, torchvision), setup (process group, MNIST
read + checksum, model, warm-up), train (the measured region), eval, teardown (result gathering,
process exit). "outside" is the share of the wall time that is not the measured training.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("launch", "imports", "setup", "train", "eval", "teardown")


def phases(record: dict, timeline: dict) -> dict[str, float]:
    end = record["started_unix"] + record["wall_s"]
    marks = [record["started_unix"], timeline["process_start"], timeline["imported"],
             timeline["warmup_done"], timeline["train_done"], timeline["eval_done"], end]
    return {name: b - a for name, (a, b) in zip(PHASES, itertools.pairwise(marks), strict=True)}


def analyse(run: Path) -> list[dict[str, float]]:
    rows = []
    for line in (run / "trials.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["status"] != "ok":
            continue
        result_file = next(a for a in record["artifacts"] if a.endswith("result.json"))
        timeline = json.loads((run / result_file).read_text())["timeline"]
        row = phases(record, timeline)
        row["wall"] = record["wall_s"]
        row["outside"] = 1 - record["metrics"]["train_time_s"] / record["wall_s"]
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="analyse this finished run directory")
    args = parser.parse_args()
    run_wall = None
    run = args.run
    if run is None:
        run = ROOT / "artifact" / "runs" / f"bench-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"
        start = time.monotonic()
        subprocess.run([sys.executable, "-m", "multicard", "run",
                        str(ROOT / "experiments" / "table2_precision.toml"), "--profile", "smoke",
                        "--out", str(run)], check=True, cwd=ROOT)
        run_wall = time.monotonic() - start
    rows = analyse(run)
    print(f"\n{len(rows)} ok trials in {run}")
    print(f"{'phase':<10} {'median s':>9} {'share of wall':>14}")
    wall = statistics.median(r["wall"] for r in rows)
    for name in PHASES:
        median = statistics.median(r[name] for r in rows)
        print(f"{name:<10} {median:>9.2f} {median / wall:>13.1%}")
    print(f"{'wall':<10} {wall:>9.2f}")
    outside = [r["outside"] for r in rows]
    print(f"\nshare of trial wall time outside the measured training: median {statistics.median(outside):.1%}"
          f" (min {min(outside):.1%}, max {max(outside):.1%})")
    if run_wall is not None:
        print(f"whole smoke run (table2_precision, {len(rows)} trials): {run_wall:.1f} s wall")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
