"""`trace summarize` on a large synthetic nsys export, against the floor of one plain scan.

    python benchmarks/trace_parse.py [--rows 3000000] [--keep FILE]

Builds an SQLite file in the nsys 2024.6 export schema (tests/fixtures/nsys_schema.py) with
`--rows` kernel rows, `--rows` runtime-API rows (API names with version suffixes, 2 % CUDA
backtrace records) and `--rows` memcpy rows (host-to-device and back, pageable and pinned, between
the kernels), a tenth of the kernels NCCL, then times `parse.summarize` on it (the GPU breakdown
included) and `SELECT count(*), sum(end - start)` over the same three tables (the floor), and SQLite alone
reading every column the summary needs (the GPU breakdown needs each operation's timeline and
correlation id: more than the floor's two), one table after another and side by side on the
usable cores (what any reader through SQLite's API costs at least), the same columns handed over
as arrays on every core
(profiling/activity.py, nothing else done with them), and `multicard trace summarize` as a whole
process (interpreter start and imports included). All timed warm (file in the page cache), best
of three.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the schema lives with the test fixtures

from tests.fixtures import nsys_schema as ns  # noqa: E402

from multicard.profiling import activity, parse  # noqa: E402

API = ["cudaLaunchKernel_v7000", "cudaStreamSynchronize_v3020", "cudaEventSynchronize_v3020",
       "cudaEventDestroy_v3020", "cudaMemcpyAsync_v3020", "cudaEventRecord_v3020",
       "cudaLaunchKernel_ptsz_v7000", "cudaGetDevice_v3020", "cuLaunchKernel", "cudaMalloc_v3020"]
TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY")
KERNELS = [f"kernel_{i}" for i in range(45)] + [f"ncclDevKernel_{i}" for i in range(5)]


def build(path: Path, rows: int) -> None:
    db = ns.create(path, ns.MODERN)
    ns.insert(db, "StringIds", list(enumerate(API + KERNELS, start=1)))
    ns.insert(db, "ENUM_NSYS_EVENT_CLASS", ns.EVENT_CLASSES)
    series = f"WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {rows - 1})"
    db.execute(
        f"INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME {series} SELECT i * 1000, i * 1000 + 1 + i % 997, "
        f"CASE WHEN i % 50 = 0 THEN 67 ELSE 0 END, {ns.global_tid(4242, 4242)}, i, "
        f"1 + i % {len(API)}, 0, NULL FROM n")
    first = len(API) + 1
    db.execute(
        f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, "
        "correlationId, globalPid, demangledName, shortName, registersPerThread, gridX, gridY, "
        "gridZ, blockX, blockY, blockZ, staticSharedMemory, dynamicSharedMemory, "
        "localMemoryPerThread, localMemoryTotal, gridId) "
        f"{series} SELECT i * 1000 + 10, i * 1000 + 20 + i % 991, 0, 1, 7, i, "
        f"{ns.global_tid(4242, 0)}, {first} + i % {len(KERNELS)}, {first} + i % {len(KERNELS)}, "
        "32, 1, 1, 1, 128, 1, 1, 0, 0, 0, 0, 1 FROM n")
    ns.insert(db, "ENUM_CUDA_MEMCPY_OPER", ns.COPY_KINDS)
    ns.insert(db, "ENUM_CUDA_MEM_KIND", ns.MEM_KINDS)
    # a copy in each gap between two kernels; every 7th has no correlation id (CUPTI leaves some out)
    db.execute(
        "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, end, deviceId, contextId, streamId, "
        "correlationId, globalPid, bytes, copyKind, srcKind, dstKind) "
        f"{series} SELECT i * 1000 + 700, i * 1000 + 740 + i % 13, 0, 1, 8, "
        f"CASE WHEN i % 7 = 0 THEN NULL ELSE {rows} + i END, {ns.global_tid(4242, 0)}, "
        "4096 + i % 4096, 1 + i % 2, i % 2, 2 FROM n")
    db.commit()
    db.close()


def floor_scan(path: Path) -> None:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    for table in TABLES:
        db.execute(f"SELECT count(*), sum(end - start) FROM {table}").fetchone()
    db.close()


def column_queries(path: Path) -> list[str]:
    """One query per table: an aggregate of every column the summary takes of each row (the GPU
    breakdown needs each operation's timeline and correlation id), no rows returned."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    columns = {table: {row[1] for row in db.execute(f"PRAGMA table_info({table})")} for table in TABLES}
    db.close()
    queries = []
    for select in parse._activity_selects(columns, parse.BACKTRACE_EVENT_CLASS[1], {}, {}):
        if select.table in TABLES:
            aggregates = ", ".join(f"max({expr})" for expr in select.columns.values())
            where = f" WHERE {select.where}" if select.where else ""
            queries.append(f"SELECT {aggregates} FROM {select.table}{where}")
    return queries


def columns_scan(path: Path, threads: int = 1) -> None:
    """SQLite alone reading the needed columns, the tables one after another (threads = 1) or
    side by side, one connection each (SQLite steps without the GIL)."""
    def one(query: str) -> None:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        db.execute(query).fetchone()
        db.close()

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(one, column_queries(path)))


def handed_over(path: Path) -> None:
    """The columns handed over as arrays (profiling/activity.py, every core), nothing kept or
    tallied: the part of `trace summarize` that is reading."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    columns = {table: {row[1] for row in db.execute(f"PRAGMA table_info({table})")} for table in TABLES}
    db.close()
    selects = parse._activity_selects(columns, parse.BACKTRACE_EVENT_CLASS[1], {}, {})
    activity.read_tables(path, [replace(s, keep=(), tally=None) for s in selects if s.table in TABLES])


def best_of(runs: int, action: object) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        action()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--keep", type=Path, help="write the generated export here and keep it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "synthetic.sqlite"
        start = time.perf_counter()
        build(path, args.rows)
        print(f"built {path} ({path.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - start:.1f} s")
        floor_scan(path)  # warm the page cache
        summary = parse.summarize(path)
        floor = best_of(3, lambda: floor_scan(path))
        needed = best_of(3, lambda: columns_scan(path))
        cores = activity._usable_cpus()
        needed_parallel = best_of(3, lambda: columns_scan(path, threads=min(cores, len(TABLES))))
        read = best_of(3, lambda: handed_over(path))
        ours = best_of(3, lambda: parse.summarize(path))
        # the command as a user runs it: interpreter start, imports, JSON out included
        command = [sys.executable, "-m", "multicard", "trace", "summarize", str(path)]
        process = best_of(3, lambda: subprocess.run(command, check=True, stdout=subprocess.DEVNULL))
    total = len(TABLES) * args.rows
    print(f"kernels {summary['kernel_count']}, cudaLaunchKernel {summary['cuda_launch_kernel_count']}")
    print(f"floor (count + sum scan of the three tables): {floor:.2f} s, {total / floor / 1e6:.1f} M rows/s")
    print(f"SQLite reading the needed columns:       {needed:.2f} s ({needed / floor:.2f}x the floor)")
    print(f"  the three tables side by side:         {needed_parallel:.2f} s "
          f"({needed_parallel / floor:.2f}x the floor, {min(cores, len(TABLES))} threads)")
    print(f"the same columns handed over as arrays:  {read:.2f} s ({read / floor:.2f}x the floor, "
          f"{os.cpu_count()} threads)")
    print(f"trace summarize:                         {ours:.2f} s, {total / ours / 1e6:.1f} M rows/s "
          f"({os.cpu_count()} CPUs)")
    print(f"ratio to the floor: {ours / floor:.2f}")
    print(f"`multicard trace summarize` as a process:  {process:.2f} s ({process / floor:.2f}x the floor)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
