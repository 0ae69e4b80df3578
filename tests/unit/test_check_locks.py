"""requirements/check_locks.py: pins read from a hashed lock, the wheel pip would pick for an
image's platform, and the verdict from an index page (PEP 691 JSON) served on 127.0.0.1."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.helpers import ROOT

_spec = importlib.util.spec_from_file_location("check_locks", ROOT / "requirements" / "check_locks.py")
assert _spec is not None and _spec.loader is not None
check_locks = sys.modules["check_locks"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_locks)
A, B, C, D = ("a" * 64, "b" * 64, "c" * 64, "d" * 64)


def test_pins_with_comments_continuations_and_extras() -> None:
    text = (f"# header\nFoo_Bar==1.2.0 \\\n    --hash=sha256:{A} \\\n    --hash=sha256:{B}\n"
            f"    # via baz\nuvicorn[standard]==0.30.1 \\\n    --hash=sha256:{C}\n")
    assert check_locks.read_pins(text) == [
        check_locks.Pin("foo-bar", "1.2.0", frozenset({A, B})),
        check_locks.Pin("uvicorn", "0.30.1", frozenset({C}))]


def page(*files: tuple[str, str]) -> list[dict[str, Any]]:
    return [{"filename": name, "hashes": {"sha256": sha}} for name, sha in files]


FILES = page(("pkg-1.0-cp312-cp312-manylinux_2_17_x86_64.whl", A),
             ("pkg-1.0-cp312-cp312-manylinux_2_28_x86_64.whl", B),
             ("pkg-1.0-cp311-cp311-manylinux_2_28_x86_64.whl", C),
             ("pkg-1.0-py3-none-any.whl", D), ("pkg-1.0.tar.gz", "e" * 64),
             ("pkg-1.1-cp312-cp312-manylinux_2_28_x86_64.whl", "f" * 64))


@pytest.mark.parametrize(("python", "glibc", "expected"), [
    ("3.12", 39, B),  # the newest manylinux tag a glibc 2.39 accepts ranks first
    ("3.12", 27, A),  # glibc 2.27 cannot run a manylinux_2_28 wheel
    ("3.11", 39, C),
    ("3.13", 39, D),  # no cp313 wheel: the pure-Python one
])
def test_the_wheel_pip_would_pick(python: str, glibc: int, expected: str) -> None:
    released = check_locks.release_files(FILES, "1.0")
    assert len(released) == 5  # 1.1's wheel is another release
    chosen = check_locks.chosen_wheel(released, check_locks.target_tags(python, glibc))
    assert chosen is not None and chosen[1] == expected


def test_verdicts_name_what_is_wrong() -> None:
    tags = check_locks.target_tags("3.12", 39)
    pin = check_locks.Pin("pkg", "1.0", frozenset({B, "e" * 64}))
    assert check_locks.judge(pin, FILES, tags) is None
    assert "manylinux_2_28_x86_64.whl's sha256 is not in the lock" in check_locks.judge(
        check_locks.Pin("pkg", "1.0", frozenset({A})), FILES, tags)
    assert "1 hash(es) of no file of the release (999999999999...)" in check_locks.judge(
        check_locks.Pin("pkg", "1.0", frozenset({B, "9" * 64})), FILES, tags)
    assert "no such release" in check_locks.judge(check_locks.Pin("pkg", "2.0", frozenset({B})), FILES, tags)
    only_windows = page(("pkg-1.0-cp312-cp312-win_amd64.whl", A), ("pkg-1.0.tar.gz", B))
    assert "no wheel for this platform" in check_locks.judge(
        check_locks.Pin("pkg", "1.0", frozenset({A, B})), only_windows, tags)


@pytest.fixture
def index() -> Iterator[tuple[str, dict[str, list[dict[str, Any]]]]]:
    """A PEP 691 index on 127.0.0.1: {project: files}, filled by the test."""
    projects: dict[str, list[dict[str, Any]]] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            name = self.path.strip("/").rsplit("/", 1)[-1]
            if self.headers.get("Accept") != check_locks.SIMPLE_JSON or name not in projects:
                self.send_error(404)
                return
            body = json.dumps({"meta": {"api-version": "1.1"}, "files": projects[name]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", check_locks.SIMPLE_JSON)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple", projects
    server.shutdown()
    server.server_close()


def test_a_lock_checked_against_a_served_index(index: tuple[str, dict[str, list[dict[str, Any]]]],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    url, projects = index
    lock = "requirements/uv.txt"
    (pin,) = check_locks.read_pins((ROOT / lock).read_text())
    first, *others = sorted(pin.hashes)
    linux = f"uv-{pin.version}-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    macs = [(f"uv-{pin.version}-py3-none-macosx_10_{k}_x86_64.whl", sha) for k, sha in enumerate(others)]
    projects["uv"] = page((linux, first), *macs)
    assert check_locks.main(["--registry", url, lock]) == 0
    said = capsys.readouterr().out
    assert "uv.txt: 1 pins, the file of each for Python 3.10 on glibc 2.35 has its hash" in said
    projects["uv"][0]["hashes"]["sha256"] = "0" * 64  # the registry now serves another file
    assert check_locks.main(["--registry", url, lock]) == 1
    assert "uv.txt: FAILED (uv==0.13.9: uv-0.13.9-py3-none-manylinux_2_17" in capsys.readouterr().out
    del projects["uv"]
    assert check_locks.main(["--registry", url, lock]) == 1
    assert "no such release on the registry" in capsys.readouterr().out


def test_an_unknown_lock_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert check_locks.main(["requirements/nothing.txt"]) == 2
    assert capsys.readouterr().err.startswith("check_locks: unknown lock requirements/nothing.txt")
