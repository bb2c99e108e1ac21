"""The README and the documentation site: the README stays short and starts with the two
commands for a fresh machine, CI runs the README's test command, and the site in
``docs/`` builds with ``mkdocs build --strict`` (a broken link, a missing anchor or a page
left out of the navigation fails it), with every link of the README leading somewhere."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250


def code_blocks(path: Path) -> list[str]:
    """The fenced code blocks of a Markdown file, in order, without their fences."""
    return re.findall(r"^```[^\n]*\n(.*?)^```$", path.read_text(), re.M | re.S)


def two_commands(path: Path) -> tuple[str, str]:
    demo, tests = code_blocks(path)[:2]
    return demo.strip(), tests.strip()


def build(docs: Path, config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=docs.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = build(DOCS, ROOT / "mkdocs.yml", out)
    assert built.returncode == 0, built.stderr
    return out


def test_the_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; the rest goes in docs/"


def test_the_readme_starts_with_the_two_commands() -> None:
    demo, tests = two_commands(README)
    assert demo.endswith("image-crawler demo") and "pip install" in demo
    assert tests.endswith("python -m pytest") and "'.[test]'" in tests
    # Nothing but prose before them.
    before = README.read_text().split(demo)[0]
    assert "```" in before and before.count("```") == 1


def test_ci_runs_the_readmes_test_command() -> None:
    _, tests = two_commands(README)
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in ci, f".ci/run does not run the README's test command: {tests}"


def test_getting_started_gives_the_same_two_commands() -> None:
    assert two_commands(DOCS / "getting-started.md") == two_commands(README)


def test_ci_and_make_build_the_site_strictly() -> None:
    assert re.search(r"^[^#\n]*mkdocs build --strict", (ROOT / ".ci" / "run").read_text(), re.M)
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^docs:\n\t.*mkdocs serve", makefile, re.M)


def test_the_site_builds_strictly(site: Path) -> None:
    pages = {p.stem for p in DOCS.glob("*.md")}
    built = {p.parent.name for p in site.glob("*/index.html")}
    assert pages - {"index"} <= built
    assert (site / "index.html").exists()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs)
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = docs / "development.md"
    page.write_text(page.read_text() + "\n[gone](operating.md#no-such-heading)\n")

    built = build(docs, tmp_path / "mkdocs.yml", tmp_path / "site")

    assert built.returncode != 0
    assert "no-such-heading" in built.stderr


def anchors(html: str) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', html))


def test_every_link_of_the_readme_leads_somewhere(site: Path) -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert any(link.startswith("docs/") for link in local)
    for link in local:
        path, _, anchor = link.partition("#")
        assert (ROOT / path).exists(), link
        if anchor:
            assert path.startswith("docs/") and path.endswith(".md"), link
            stem = Path(path).stem
            html = site / ("index.html" if stem == "index" else f"{stem}/index.html")
            assert anchor in anchors(html.read_text()), link
