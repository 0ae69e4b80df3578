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


def page(*files: tuple[str, str], requires: str | None = None) -> list[dict[str, Any]]:
    return [{"filename": name, "hashes": {"sha256": sha}, "requires-python": requires}
            for name, sha in files]


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
    candidates = check_locks.installable(released, python, check_locks.target_tags(python, glibc))
    assert candidates[0].sha256 == expected and all(f.tags for f in candidates)  # never the sdist


def test_legacy_manylinux_aliases_rank_with_their_glibc() -> None:
    tags = check_locks.manylinux(35)
    assert tags.index("manylinux2014_x86_64") == tags.index("manylinux_2_17_x86_64") + 1
    assert tags.index("manylinux1_x86_64") == tags.index("manylinux_2_5_x86_64") + 1
    assert tags[0] == "manylinux_2_35_x86_64" and tags[-1] == "linux_x86_64"


def test_verdicts_name_what_is_wrong() -> None:
    tags = check_locks.target_tags("3.12", 39)
    pin = check_locks.Pin("pkg", "1.0", frozenset({B, "e" * 64}))
    assert check_locks.judge(pin, FILES, "3.12", tags) is None
    stray = check_locks.Pin("pkg", "1.0", frozenset({B, "9" * 64}))
    assert "1 hash(es) of no file of the release (9999999999" in check_locks.judge(stray, FILES, "3.12", tags)
    missing = check_locks.Pin("pkg", "2.0", frozenset({B}))
    assert "no such release" in check_locks.judge(missing, FILES, "3.12", tags)
    only_windows = page(("pkg-1.0-cp312-cp312-win_amd64.whl", A), ("pkg-1.0.tar.gz", B))
    assert "no wheel for Python 3.12 on this platform" in check_locks.judge(
        check_locks.Pin("pkg", "1.0", frozenset({A, B})), only_windows, "3.12", tags)
    assert "manylinux_2_28_x86_64.whl's sha256 is not in the lock" in check_locks.judge(
        check_locks.Pin("pkg", "1.0", frozenset({C})), FILES, "3.12", tags)


def test_pip_takes_an_allowed_hash_over_a_better_tag() -> None:
    # with --require-hashes pip installs the manylinux_2_17 wheel whose hash the lock holds,
    # though the manylinux_2_28 one ranks higher for glibc 2.39
    pin = check_locks.Pin("pkg", "1.0", frozenset({A}))
    assert check_locks.judge(pin, FILES, "3.12", check_locks.target_tags("3.12", 39)) is None


def test_a_release_that_excludes_the_python_is_not_installable() -> None:
    pure = page(("old-2.0-py3-none-any.whl", A), requires=">=3.8,<3.11")
    tags = check_locks.target_tags("3.12", 39)
    assert "no wheel for Python 3.12" in check_locks.judge(check_locks.Pin("old", "2.0", frozenset({A})),
                                                          pure, "3.12", tags)
    assert check_locks.judge(check_locks.Pin("old", "2.0", frozenset({A})), pure, "3.10",
                             check_locks.target_tags("3.10", 35)) is None


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
            files = projects[name]
            body = (files.encode() if isinstance(files, str)  # an HTML-only index
                    else json.dumps({"meta": {"api-version": "1.1"}, "files": files}).encode())
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
    assert "uv.txt: 1 pins, the file of each for Python 3.10 on glibc 2.35 (x86_64) has its hash" in said
    projects["uv"][0]["hashes"]["sha256"] = "0" * 64  # the registry now serves another file
    assert check_locks.main(["--registry", url, lock]) == 1
    said = capsys.readouterr().out
    assert f"uv.txt: FAILED (x86_64: uv=={pin.version}: {linux}'s sha256 is not in the lock" in said
    del projects["uv"]
    assert check_locks.main(["--registry", url, lock]) == 1
    assert "no such release on the registry" in capsys.readouterr().out
    projects["uv"] = "<html>an index without PEP 691</html>"  # type: ignore[assignment]
    assert check_locks.main(["--registry", url, lock]) == 1
    assert "is not a PEP 691 JSON page" in capsys.readouterr().out


def test_an_unknown_lock_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert check_locks.main(["requirements/nothing.txt"]) == 2
    assert capsys.readouterr().err.startswith("check_locks: unknown lock requirements/nothing.txt")


def test_arm64_tags_have_only_the_aliases_defined_for_it() -> None:
    tags = check_locks.manylinux(28, "aarch64")
    assert tags[0] == "manylinux_2_28_aarch64" and "manylinux2014_aarch64" in tags
    assert not any("manylinux1" in tag or "manylinux2010" in tag or "x86_64" in tag for tag in tags)
    assert check_locks.LOCKS["requirements/container.txt"].arches == ("x86_64", "aarch64")
