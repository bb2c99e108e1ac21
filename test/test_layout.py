"""The layout: one base (``image_crawler``) and three rooms on top of it (``worker``,
``crawl_monitor``, and ``crawlctl``, the operator's application). The base imports none
of the rooms, and no room imports another: every import runs down or stays in its room.
Shipped code imports neither the tests nor the benchmark.

Within a package, no two modules import each other, directly or round a longer circle;
and no function of the shipped packages is longer than ``MAX_FUNCTION_LINES``."""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Mapping
from pathlib import Path
from textwrap import indent

import pytest

ROOT = Path(__file__).resolve().parent.parent
BASE = "image_crawler"
ROOMS = ("worker", "crawl_monitor", "crawlctl", "dedup")
OURS = (BASE, *ROOMS, "test", "bench", "chaos")
MAX_FUNCTION_LINES = 60


def imported(path: Path) -> set[str]:
    """The top-level packages of ours that ``path`` imports, anywhere in the module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found |= {name.split(".")[0] for name in names} & set(OURS)
    return found


def allowed(package: str) -> set[str]:
    return {BASE} if package == BASE else {BASE, package}


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", [BASE, *ROOMS])
def test_imports_run_down_to_the_base_or_stay_in_their_room(package):
    wrong = {
        str(path.relative_to(ROOT)): sorted(imported(path) - allowed(package))
        for path in modules(package)
    }
    assert {path: names for path, names in wrong.items() if names} == {}


def test_the_check_sees_an_upward_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from worker.pipeline import Pipeline\n")
    assert imported(module) - allowed(BASE) == {"worker"}


def test_every_package_folder_is_a_package():
    for package in (BASE, *ROOMS):
        for folder in [ROOT / package, *(p.parent for p in modules(package))]:
            if folder.name not in {"__pycache__"}:
                assert (folder / "__init__.py").exists(), folder


# --- no long functions -------------------------------------------------------------------


def function_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's length: from def to last line, without the docstring, decorators not
    counted."""
    assert function.end_lineno is not None
    lines = function.end_lineno - function.lineno + 1
    first = function.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        assert first.end_lineno is not None
        lines -= first.end_lineno - first.lineno + 1
    return lines


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``path:line name (N lines)`` of each function or method of ``path`` (nested ones
    too) longer than ``limit``."""
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return [
        f"{shown}:{node.lineno} {node.name} ({lines} lines)"
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (lines := function_lines(node)) > limit
    ]


@pytest.mark.parametrize("package", [BASE, *ROOMS])
def test_no_function_is_longer_than_the_limit(package):
    found = [found for path in modules(package) for found in long_functions(path)]
    assert not found, f"over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(found)


def test_the_check_sees_a_long_function(tmp_path):
    # ``fits`` is as long as allowed only without its docstring and decorator;
    # ``too_long`` (a method) one line longer.
    body = "".join(f"x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))
    source = (
        f"@decorator\ndef fits():\n"
        f'    """Long.\n\n    Its docstring is not counted.\n    """\n{indent(body, " " * 4)}\n\n'
        f"class C:\n    async def too_long(self):\n{indent(body, ' ' * 8)}        return x0\n"
    )
    module = tmp_path / "m.py"
    module.write_text(source)
    line = source.splitlines().index("    async def too_long(self):") + 1
    assert long_functions(module) == [f"{module}:{line} too_long ({MAX_FUNCTION_LINES + 1} lines)"]


# --- no import circles -------------------------------------------------------------------


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(paths: list[Path], root: Path = ROOT) -> dict[str, set[str]]:
    """Which of the modules at ``paths`` each of them imports: every import, at the top,
    under ``TYPE_CHECKING`` or inside a function. An import names the module it reads
    (``from a.b import c`` reads ``a.b.c`` when that is a module, else ``a.b``), not the
    packages around it."""
    names = {module_name(path, root): path for path in paths}
    graph: dict[str, set[str]] = {name: set() for name in names}
    for name, path in names.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                # Relative (``from .a import b``): from the package ``level`` - 1 up.
                base = package[: len(package) - node.level + 1] if node.level else []
                base = ".".join([*base, *([node.module] if node.module else [])])
                targets = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in names:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """A circle of modules that import one another, as ``[a, b, ..., a]`` (``a`` imports
    ``b``) from its first module by name; none when there is none. graphlib finds one
    circle at a time: mend it, and the next shows."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        # graphlib lists each module before the modules that import it.
        circle = error.args[1][:-1][::-1]
        first = circle.index(min(circle))
        circle = circle[first:] + circle[:first]
        return [[*circle, circle[0]]]
    return []


@pytest.mark.parametrize("package", [BASE, *ROOMS])
def test_no_modules_import_one_another_in_a_circle(package):
    circles = [" -> ".join(circle) for circle in cycles(import_graph(modules(package)))]
    assert not circles, "modules that import one another:\n" + "\n".join(circles)


def test_the_cycle_finder_sees_a_circle(tmp_path):
    package = tmp_path / "p"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from p.b import B\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p import c\n"
    )
    (package / "c.py").write_text("def f():\n    from .a import A\n")
    (package / "d.py").write_text("import p.a\n")  # into the circle, not part of it
    graph = import_graph(sorted(package.rglob("*.py")), tmp_path)
    assert graph["p.d"] == {"p.a"}
    assert cycles(graph) == [["p.a", "p.b", "p.c", "p.a"]]
    assert cycles({**graph, "p.c": set()}) == []
