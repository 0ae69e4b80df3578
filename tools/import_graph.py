"""The package's import graph, checked against its pipeline order.

    python tools/import_graph.py          # the layers, each module's imports, and any problem
    python tools/import_graph.py --check  # problems only; exit 1 if there is one

The stages of src/multicard/ import only from themselves and from the stages before them
(LAYERS, first to last). Every import counts, a function's lazy import and a type-checking one
included: an import that is only deferred is still a dependency. Checked here: no import cycle
(graphlib), no import of a later stage, at most MAX_TOP_LEVEL modules beside the packages, and no
function longer than MAX_FUNCTION_LINES except the CLI's parser table.

Not counted: a module named in a command line (`-m multicard.run.node_step` in plan/launch.py is
a process started, not an import), and a package's __init__ that a submodule's import runs
(the stages' __init__ files hold only a docstring).
"""

from __future__ import annotations

import argparse
import ast
import graphlib
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "multicard"

# (stage, what it holds): a module of multicard.<stage> belongs to it; the first and the last are
# the top-level modules named
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("multicard", "multicard.errors", "multicard.integrity")),
    ("hooks", ()),
    ("measure", ()),
    ("profiling", ()),
    ("data", ()),
    ("loaders", ()),
    ("plan", ()),
    ("workloads", ()),
    ("judge", ()),
    ("run", ()),
    ("publish", ()),
    ("entry", ("multicard.cli", "multicard.__main__", "multicard.first_evidence")),
)
MAX_TOP_LEVEL = 12  # modules directly in src/multicard/, __init__ and __main__ included
MAX_FUNCTION_LINES = 80
LONG_ALLOWED = {"multicard.cli.build_parser"}  # the CLI's parser table: one entry per subcommand


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `name` imports (`from a import b` names a.b where b is one)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found |= {full} if full in known else {base} if base in known else set()
    return found - {name}


def graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    found = modules(root)
    return {name: imported(name, path, set(found)) for name, path in found.items()}


def layer(name: str) -> int | None:
    """The index in LAYERS of the stage `name` belongs to; None for none."""
    for index, (stage, named) in enumerate(LAYERS):
        if name in named or name.startswith(f"multicard.{stage}.") or name == f"multicard.{stage}":
            return index
    return None


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    try:
        graphlib.TopologicalSorter(edges).prepare()
    except graphlib.CycleError as error:
        return list(error.args[1])
    return None


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, targets in edges.items() for b in targets
                  if None not in (layer(a), layer(b)) and layer(b) > layer(a))  # type: ignore[operator]


def top_level(root: Path = PACKAGE) -> list[str]:
    return sorted(p.name for p in root.glob("*.py"))


def long_functions(root: Path = PACKAGE, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    found = []
    for name, path in modules(root).items():
        for node, qualified in _functions(ast.parse(path.read_text()), name):
            lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            if lines > limit and qualified not in LONG_ALLOWED:
                found.append((qualified, lines))
    return sorted(found)


def _functions(tree: ast.AST, prefix: str) -> Iterator[tuple[ast.AST, str]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            qualified = f"{prefix}.{node.name}"
            if not isinstance(node, ast.ClassDef):
                yield node, qualified
            yield from _functions(node, qualified)


def problems(root: Path = PACKAGE) -> list[str]:
    edges = graph(root)
    found = [f"{name}: in no stage of LAYERS (tools/import_graph.py)" for name in sorted(edges)
             if layer(name) is None]
    found += [f"{a} imports {b}, a later stage" for a, b in upward(edges)]
    if (loop := cycle(edges)) is not None:
        found.append("import cycle: " + " -> ".join(loop))
    if len(top := top_level(root)) > MAX_TOP_LEVEL:
        found.append(f"{len(top)} top-level modules (at most {MAX_TOP_LEVEL}): {', '.join(top)}")
    found += [f"{name}: {lines} lines (at most {MAX_FUNCTION_LINES})" for name, lines in long_functions(root)]
    return found


def describe(root: Path = PACKAGE) -> str:
    edges = graph(root)
    lines = []
    for index, (stage, _) in enumerate(LAYERS):
        members = sorted(n for n in edges if layer(n) == index)
        lines.append(f"{index:2} {stage}: {len(members)} module(s)")
        lines += [f"     {n.removeprefix('multicard.')} <- "
                  + ", ".join(sorted(d.removeprefix("multicard.") for d in edges[n])) for n in members]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="print only the problems")
    args = parser.parse_args(argv)
    if not args.check:
        print(describe())
    found = problems()
    for line in found:
        print(f"import_graph: {line}", file=sys.stderr)
    if not found:
        print(f"import_graph: {len(modules())} modules, no cycle, no upward import, "
              f"{len(top_level())} top-level modules, no function over {MAX_FUNCTION_LINES} lines "
              f"but {', '.join(sorted(LONG_ALLOWED))}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
