"""The package keeps its pipeline order (tools/import_graph.py): no cycle, no import of a later
stage, few top-level modules, no long function; and the checker finds each of those it is shown."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers import ROOT

TOOL = ROOT / "tools" / "import_graph.py"
# the image binds tests/ beside an installed tree that has no tools/
pytestmark = pytest.mark.skipif(not TOOL.is_file(), reason="no tools/ here (the image ships none)")


@pytest.fixture(scope="module")
def graph() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def package(root: Path, files: dict[str, str]) -> Path:
    """A package named multicard under root/src, with the given modules."""
    top = root / "src" / "multicard"
    for name, text in {"__init__.py": "", **files}.items():
        (top / name).parent.mkdir(parents=True, exist_ok=True)
        (top / name).write_text(text)
    return top


def test_the_package_keeps_its_pipeline_order(graph: ModuleType) -> None:
    assert graph.problems() == []
    assert len(graph.top_level()) <= graph.MAX_TOP_LEVEL


def test_every_module_is_in_a_stage(graph: ModuleType) -> None:
    stages = {graph.layer(name) for name in graph.graph()}
    assert stages == set(range(len(graph.LAYERS)))  # and no stage is empty


def test_a_cycle_inside_a_stage_is_named(graph: ModuleType, tmp_path: Path) -> None:
    top = package(tmp_path, {"measure/__init__.py": "", "measure/a.py": "from multicard.measure import b\n",
                             "measure/b.py": "def f() -> None:\n    from multicard.measure import a\n"})
    found = graph.problems(top)
    assert len(found) == 1 and found[0].startswith("import cycle: ")
    loop = found[0].removeprefix("import cycle: ").split(" -> ")
    assert {"multicard.measure.a", "multicard.measure.b"} <= set(loop)


def test_an_import_of_a_later_stage_is_named_even_a_deferred_one(graph: ModuleType, tmp_path: Path) -> None:
    top = package(tmp_path, {"plan/__init__.py": "", "judge/__init__.py": "",
                             "judge/stats.py": "X = 1\n",
                             "plan/spec.py": "def f() -> int:\n"
                                             "    from multicard.judge.stats import X\n    return X\n"})
    assert graph.problems(top) == ["multicard.plan.spec imports multicard.judge.stats, a later stage"]


def test_too_many_top_level_modules_and_one_in_no_stage_are_named(graph: ModuleType, tmp_path: Path) -> None:
    top = package(tmp_path, {"errors.py": "", **{f"m{i}.py": "" for i in range(11)}})
    found = graph.problems(top)
    names = sorted(f"m{i}" for i in range(11))
    assert found[:11] == [f"multicard.{m}: in no stage of LAYERS (tools/import_graph.py)" for m in names]
    assert found[11:] == ["13 top-level modules (at most 12): __init__.py, errors.py, "
                          + ", ".join(f"{m}.py" for m in names)]


def test_a_long_function_is_named_unless_it_is_the_parser_table(graph: ModuleType, tmp_path: Path) -> None:
    top = package(tmp_path, {"cli.py": "def main() -> None:\n" + "    x = 1\n" * 80,
                             "errors.py": "def build_parser() -> None:\n" + "    x = 1\n" * 79})
    assert graph.problems(top) == ["multicard.cli.main: 81 lines (at most 80)"]
    (top / "cli.py").write_text("def build_parser() -> None:\n" + "    x = 1\n" * 200)
    assert graph.problems(top) == []  # multicard.cli.build_parser, the one allowed
