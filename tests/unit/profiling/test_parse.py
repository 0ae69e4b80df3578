"""`trace summarize` on small traces whose totals are computed by hand (tests/fixtures/README.md)."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from multicard.errors import InputError
from multicard.profiling import activity, parse
from tests.fixtures import nsys_schema as ns
from tests.helpers import ROOT

KINETO = ROOT / "tests" / "fixtures" / "kineto_gpu_small.json"
P1, P2 = ns.global_tid(4101, 4101), ns.global_tid(4202, 4202)  # two processes (ranks)

# StringIds of the modern fixture
STRINGS = [
    (1, "cudaLaunchKernel_v7000"), (2, "cudaLaunchKernel_ptsz_v7000"), (3, "cudaLaunchKernelExC_v11060"),
    (4, "cudaStreamSynchronize_v3020"), (5, "cudaStreamSynchronize"), (6, "cudaEventSynchronize_v3020"),
    (7, "cudaEventDestroy_v3020"), (8, "cudaMemcpyAsync_v3020"), (9, "cuLaunchKernel"),
    (10, "volta_sgemm_128x64_nn"), (11, "ncclDevKernel_AllGather_RING_LL"), (12, "ncclKernel_AllReduce"),
    (13, "step"), (14, "epoch_start 0"), (15, "epoch_start 1"), (16, "cudaMemcpyAsync_v10000"),
]


def runtime(start: int, end: int, name: int, tid: int = P1, corr: int = 1, event_class: int = 0) -> dict:
    return {"start": start, "end": end, "eventClass": event_class, "globalTid": tid,
            "correlationId": corr, "nameId": name, "returnValue": 0}


def copy(start: int, end: int, size: int, kind: int, src: int, dst: int, corr: int | None = None) -> dict:
    return {**ns.COPY_DEFAULTS, "start": start, "end": end, "bytes": size, "copyKind": kind,
            "srcKind": src, "dstKind": dst, "globalPid": P1, "correlationId": corr}


def modern_trace(path: Path) -> Path:
    db = ns.create(path, ns.MODERN)
    ns.insert(db, "StringIds", STRINGS)
    db.execute("INSERT INTO StringIds VALUES (17, CAST(? AS TEXT))", (b"\xffbad-utf8-nccl-kernel",))
    ns.insert(db, "ENUM_NSYS_EVENT_CLASS", ns.EVENT_CLASSES)
    ns.insert(db, "ENUM_CUDA_MEMCPY_OPER", ns.COPY_KINDS)
    ns.insert(db, "ENUM_CUDA_MEM_KIND", ns.MEM_KINDS)
    ns.insert(db, "CUPTI_ACTIVITY_KIND_RUNTIME", [
        runtime(0, 10, 1, corr=1), runtime(20, 40, 1, tid=P2, corr=1),  # the same corr id, 2 ranks
        runtime(50, 55, 2, corr=2),  # per-thread-stream variant: still cudaLaunchKernel
        runtime(60, 67, 3, corr=3),  # cudaLaunchKernelExC: another function
        runtime(100, 200, 4, corr=4),
        runtime(99, 209, 5, corr=4, event_class=67),  # backtrace record of that call: not a call
        runtime(300, 340, 6, corr=5), runtime(400, 403, 7, corr=6),
        runtime(500, 515, 8, corr=7), runtime(600, 625, 16, corr=8),  # both versions of the API
        runtime(700, 790, 9, corr=9, event_class=1),  # a driver call
    ])
    ns.insert(db, "CUPTI_ACTIVITY_KIND_KERNEL", [
        {**ns.KERNEL_DEFAULTS, "start": 1000, "end": 1100, "globalPid": P1, "correlationId": 1,
         "demangledName": 10, "shortName": 10},
        {**ns.KERNEL_DEFAULTS, "start": 1200, "end": 2200, "globalPid": P1, "correlationId": 2,
         "demangledName": 11, "shortName": 11},
        {**ns.KERNEL_DEFAULTS, "start": 2300, "end": 2800, "globalPid": P2, "correlationId": 1,
         "demangledName": 12, "shortName": 12},
        {**ns.KERNEL_DEFAULTS, "start": 2900, "end": 2907, "globalPid": P2, "correlationId": 3,
         "demangledName": 17, "shortName": 17},
    ])
    ns.insert(db, "CUPTI_ACTIVITY_KIND_MEMCPY", [
        copy(3000, 3200, 1000, kind=1, src=0, dst=2, corr=7),  # cudaMemcpyAsync at 500
        copy(3300, 3400, 3000, kind=1, src=1, dst=2),
        copy(3500, 3600, 3000, kind=1, src=1, dst=2),
        copy(3700, 3750, 500, kind=2, src=2, dst=0),
        copy(3800, 3900, 9999, kind=8, src=2, dst=2),
    ])
    ns.insert(db, "NVTX_EVENTS", [
        {"start": 0, "end": 1, "eventType": 59, "textId": 14, "globalTid": P1},
        {"start": 100, "end": 200, "eventType": 59, "textId": 13, "globalTid": P1},
        {"start": 250, "end": 300, "eventType": 59, "text": "step", "globalTid": P1},  # inline text
        {"start": 400, "end": 401, "eventType": 59, "textId": 15, "globalTid": P1},
        {"start": 1000, "end": 1100, "eventType": 59, "textId": 13, "globalTid": P1},
        {"start": 1200, "end": None, "eventType": 59, "textId": 13, "globalTid": P1},  # never closed
        {"start": 5, "eventType": 34, "text": "epoch_start 9", "globalTid": P1},  # a mark, not a range
    ])
    ns.insert(db, "META_DATA_EXPORT", [("EXPORT_SCHEMA_VERSION", "3.16.1")])
    db.commit()
    db.close()
    return path


EXPECTED_MODERN = {
    "format": "nsys-sqlite",
    "kernel_count": 4, "kernel_ns": 100 + 1000 + 500 + 7,
    "nccl_kernel_count": 3, "nccl_kernel_ns": 1000 + 500 + 7,
    "cuda_launch_kernel_count": 3, "cuda_launch_kernel_ns": 10 + 20 + 5,
    "cuda_stream_synchronize_count": 1, "cuda_stream_synchronize_ns": 100,
    "cuda_event_synchronize_count": 1, "cuda_event_synchronize_ns": 40,
    "cuda_event_destroy_count": 1, "cuda_event_destroy_ns": 3,
    "cuda_memcpy_async_count": 2, "cuda_memcpy_async_ns": 15 + 25,
    "memcpy_htod_count": 3, "memcpy_htod_bytes": 7000, "memcpy_htod_ns": 400,
    "memcpy_htod_pageable_count": 1, "memcpy_htod_pageable_bytes": 1000, "memcpy_htod_pageable_ns": 200,
    "memcpy_htod_pinned_count": 2, "memcpy_htod_pinned_bytes": 6000, "memcpy_htod_pinned_ns": 200,
    "memcpy_dtoh_count": 1, "memcpy_dtoh_bytes": 500, "memcpy_dtoh_ns": 50,
    # epoch 0: marker at 0, first step at 100; epoch 1: last step ended at 300, next starts at 1000
    "epoch_pauses_ns": {0: 100, 1: 700},
    # one timeline per (process, device). Rank 4101, 1000-3900: kernels 1100 ns, copies alone 550
    # (200 + 100 + 100 + 50 + 100), gaps 1250; the launches of the operations after the gaps of
    # 100 (kernel, corr 2, launched at 50) and 800 ns (the copy of corr 7, launched at 500) came
    # before the GPU fell idle: 900 of 1250 ns matched, all idle. Rank 4202, 2300-2907: kernels
    # 507 ns, one gap of 100 ns before its kernel of corr 3, whose launch is not in its process
    # (corr 3 at 60 ns is rank 4101's): nothing matched, host wait and idle not told apart.
    "gpu_span_ns": 2900 + 607, "gpu_busy_ns": 1100 + 507, "gpu_copy_ns": 550,
    "gpu_host_wait_ns": None, "gpu_idle_ns": None, "gpu_launch_matched": 900 / 1350,
    "gpu_timelines": [
        {"process": 4101, "device": 0, "gpu_span_ns": 2900, "gpu_busy_ns": 1100, "gpu_copy_ns": 550,
         "gpu_host_wait_ns": 0, "gpu_idle_ns": 1250, "gpu_launch_matched": 900 / 1250},
        {"process": 4202, "device": 0, "gpu_span_ns": 607, "gpu_busy_ns": 507, "gpu_copy_ns": 0,
         "gpu_host_wait_ns": None, "gpu_idle_ns": None, "gpu_launch_matched": 0.0},
    ],
}


def test_modern_nsys_export_by_hand(tmp_path: Path) -> None:
    assert parse.summarize(modern_trace(tmp_path / "r.sqlite")) == EXPECTED_MODERN


def test_the_same_numbers_read_a_row_per_slice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # every slice one rowid: tallies added and ranges widened across slices, the two ranks'
    # timelines found from the ranges and their keys read in a second pass
    monkeypatch.setattr(activity, "SLICE_ROWS", 1)
    assert parse.summarize(modern_trace(tmp_path / "r.sqlite")) == EXPECTED_MODERN


def test_one_rank_read_in_slices_is_one_timeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = modern_trace(tmp_path / "r.sqlite")
    db = sqlite3.connect(path)
    for table, column in (("CUPTI_ACTIVITY_KIND_KERNEL", "globalPid"),
                          ("CUPTI_ACTIVITY_KIND_RUNTIME", "globalTid")):
        db.execute(f"DELETE FROM {table} WHERE {column} = ?", (P2,))
    db.commit()
    db.close()
    whole = parse.summarize(path)
    monkeypatch.setattr(activity, "SLICE_ROWS", 2)
    assert parse.summarize(path) == whole
    assert whole["gpu_timelines"] == [{**EXPECTED_MODERN["gpu_timelines"][0]}]
    assert (whole["kernel_count"], whole["gpu_busy_ns"]) == (2, 1100)


def test_timelines_without_a_runtime_table_are_told_apart(tmp_path: Path) -> None:
    path = modern_trace(tmp_path / "r.sqlite")
    db = sqlite3.connect(path)
    db.execute("DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME")
    db.commit()
    db.close()
    found = parse.summarize(path)
    assert [(t["process"], t["gpu_span_ns"], t["gpu_launch_matched"]) for t in found["gpu_timelines"]] == [
        (4101, 2900, 0.0), (4202, 607, 0.0)]
    assert found["cuda_launch_kernel_count"] == 0 and found["gpu_host_wait_ns"] is None


def test_gzipped_export_gives_the_same_numbers(tmp_path: Path) -> None:
    plain = modern_trace(tmp_path / "r.sqlite")
    packed = tmp_path / "r.sqlite.gz"
    with plain.open("rb") as source, gzip.open(packed, "wb") as target:
        shutil.copyfileobj(source, target)
    assert parse.summarize(packed) == EXPECTED_MODERN


def test_legacy_export_string_table_no_event_class_no_enums(tmp_path: Path) -> None:
    db = ns.create(tmp_path / "old.sqlite", ns.LEGACY)
    ns.insert(db, "StringTable", [(1, "cudaLaunchKernel_v7000"), (2, "NCCL_kernel_Broadcast"),
                                  (3, "sgemm"), (4, "cudaMemcpyAsync_ptds_v7000")])
    ns.insert(db, "CUPTI_ACTIVITY_KIND_RUNTIME", [(0, 3, P1, 1, 1, 0), (5, 9, P1, 2, 1, 0),
                                                  (10, 30, P1, 3, 4, 0)])
    ns.insert(db, "CUPTI_ACTIVITY_KIND_KERNEL", [(0, 50, 0, 1, 7, 1, P1, 2, 2),
                                                 (60, 70, 0, 1, 7, 2, P1, 3, 3)])
    # copyKind 1 = HtoD; without ENUM tables nsys numbering applies: srcKind 1 = pinned
    ns.insert(db, "CUPTI_ACTIVITY_KIND_MEMCPY", [(0, 40, 0, 1, 7, 3, P1, 64, 1, 1, 2)])
    db.commit()
    db.close()
    result = parse.summarize(tmp_path / "old.sqlite")
    assert (result["cuda_launch_kernel_count"], result["cuda_launch_kernel_ns"]) == (2, 7)
    assert (result["cuda_memcpy_async_count"], result["cuda_memcpy_async_ns"]) == (1, 20)
    assert (result["kernel_count"], result["kernel_ns"]) == (2, 60)
    assert (result["nccl_kernel_count"], result["nccl_kernel_ns"]) == (1, 50)
    assert (result["memcpy_htod_pinned_count"], result["memcpy_htod_pinned_bytes"]) == (1, 64)
    assert result["memcpy_htod_pageable_count"] == 0
    assert result["epoch_pauses_ns"] == {}


def test_missing_tables_mean_zero(tmp_path: Path) -> None:
    db = ns.create(tmp_path / "empty.sqlite", {"StringIds": ns.MODERN["StringIds"]})
    db.close()
    assert parse.summarize(tmp_path / "empty.sqlite") == parse.empty_summary("nsys-sqlite")


def test_kineto_fixture_by_hand() -> None:
    result = parse.summarize(KINETO)
    assert result == {
        **parse.empty_summary("kineto-json"),
        "kernel_count": 2, "kernel_ns": 120_000, "nccl_kernel_count": 1, "nccl_kernel_ns": 100_000,
        "cuda_launch_kernel_count": 3, "cuda_launch_kernel_ns": 5_250 + 4_750 + 1_000,
        "cuda_stream_synchronize_count": 1, "cuda_stream_synchronize_ns": 30_125,
        "cuda_memcpy_async_count": 1, "cuda_memcpy_async_ns": 3_000,
        "memcpy_htod_count": 2, "memcpy_htod_bytes": 12_288, "memcpy_htod_ns": 10_500,
        "memcpy_htod_pageable_count": 1, "memcpy_htod_pageable_bytes": 4_096,
        "memcpy_htod_pageable_ns": 8_000,
        "memcpy_htod_pinned_count": 1, "memcpy_htod_pinned_bytes": 8_192, "memcpy_htod_pinned_ns": 2_500,
        "memcpy_dtoh_count": 1, "memcpy_dtoh_bytes": 40, "memcpy_dtoh_ns": 1_000,
        "epoch_pauses_ns": {0: 100_000, 1: 1_100_500},
        # 1106-1291 us: kernels 20 + 100 us, copies alone 8 + 2.5 + 1 us, gaps 1 + 32.5 + 5 + 15 us
        # (each next operation launched before the gap, or with no launch record: idle; the gaps
        # before kernels, 37.5 of 53.5 us, have their launch)
        "gpu_span_ns": 185_000, "gpu_busy_ns": 120_000, "gpu_copy_ns": 11_500,
        "gpu_host_wait_ns": 0, "gpu_idle_ns": 53_500, "gpu_launch_matched": 37_500 / 53_500,
        "gpu_timelines": [{"process": 0, "device": 0, "gpu_span_ns": 185_000, "gpu_busy_ns": 120_000,
                           "gpu_copy_ns": 11_500, "gpu_host_wait_ns": 0, "gpu_idle_ns": 53_500,
                           "gpu_launch_matched": 37_500 / 53_500}],
    }


def test_gzipped_kineto_and_a_bare_event_list(tmp_path: Path) -> None:
    packed = tmp_path / "t.json.gz"
    packed.write_bytes(gzip.compress(KINETO.read_bytes()))
    assert parse.summarize(packed) == parse.summarize(KINETO)
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(json.loads(KINETO.read_text())["traceEvents"]))
    assert parse.summarize(bare) == parse.summarize(KINETO)


@pytest.mark.parametrize(
    ("name", "content"),
    [("notes.txt", b"hello"), ("x.json", b'{"no": "events"}'), ("bad.json", b"{not json"),
     ("x.gz", gzip.compress(b"plain text"))],
)
def test_a_file_of_neither_format_is_bad_input(tmp_path: Path, name: str, content: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InputError, match=str(path)):
        parse.summarize(path)


def test_an_sqlite_file_without_nsys_tables_is_bad_input(tmp_path: Path) -> None:
    import sqlite3

    db = sqlite3.connect(tmp_path / "other.sqlite")
    db.execute("CREATE TABLE customers (id INTEGER)")
    db.close()
    with pytest.raises(InputError, match="without nsys tables"):
        parse.summarize(tmp_path / "other.sqlite")


def test_a_truncated_export_is_bad_input_and_a_path_with_uri_characters_is_read(tmp_path: Path) -> None:
    odd = tmp_path / "run #1?" / "rank%0.sqlite"  # characters a SQLite URI would misread
    odd.parent.mkdir()
    assert parse.summarize(modern_trace(odd)) == EXPECTED_MODERN
    whole = odd.read_bytes()
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InputError, match="unreadable SQLite"):
        parse.summarize(cut)


def test_cli_prints_json_keyed_by_file_and_exits_2_with_one_line(tmp_path: Path) -> None:
    trace = modern_trace(tmp_path / "r.sqlite")
    ok = subprocess.run([sys.executable, "-m", "multicard", "trace", "summarize", str(trace),
                         str(KINETO)], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0
    out = json.loads(ok.stdout)
    assert out[str(trace)]["cuda_launch_kernel_count"] == 3
    assert out[str(KINETO)]["format"] == "kineto-json"
    (tmp_path / "x.txt").write_text("nope")
    bad = subprocess.run([sys.executable, "-m", "multicard", "trace", "summarize",
                          str(tmp_path / "x.txt")], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_api_names() -> None:
    assert parse.api_name("cudaLaunchKernel_v7000") == "cudaLaunchKernel"
    assert parse.api_name("cudaLaunchKernel_ptsz_v7000") == "cudaLaunchKernel"
    assert parse.api_name("cudaMemcpyAsync_v10000") == "cudaMemcpyAsync"
    assert parse.api_name("cudaMemcpy_ptds") == "cudaMemcpy"
    assert parse.api_name("cudaLaunchKernelExC_v11060") == "cudaLaunchKernelExC"
