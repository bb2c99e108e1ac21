"""The layout: one base (``image_crawler``) and three rooms on top of it (``worker``,
``crawl_monitor``, and ``crawlctl``, the operator's application). The base imports none
of the rooms, and no room imports another: every import runs down or stays in its room.
Shipped code imports neither the tests nor the benchmark."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BASE = "image_crawler"
ROOMS = ("worker", "crawl_monitor", "crawlctl")
OURS = (BASE, *ROOMS, "test", "bench")


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
