"""The Lua scripts: each a file beside the module that runs it, headed by the Python rule
it is the fast path of, loaded by exactly one call, and shipped in the package."""

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from image_crawler.lua import lua_script

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("image_crawler", "worker", "crawl_monitor", "crawlctl", "dedup")
_CALL = re.compile(r'lua_script\("([\w.]+)", "([\w.]+)"\)')


def lua_files() -> set[str]:
    return {str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("lua/*.lua")}


def loaded() -> list[str]:
    calls = []
    for pkg in PACKAGES:
        for module in (ROOT / pkg).rglob("*.py"):
            found = _CALL.findall(module.read_text())
            calls += [f"{p.replace('.', '/')}/lua/{name}" for p, name in found]
    return calls


def test_every_script_is_loaded_once_and_every_load_has_its_file():
    calls = loaded()
    assert len(calls) == len(set(calls)), "a script loaded twice"
    assert set(calls) == lua_files()
    assert len(calls) >= 9


@pytest.mark.parametrize("path", sorted(lua_files()))
def test_each_script_names_the_rule_it_is_the_fast_path_of(path):
    package, name = path.rsplit("/lua/", 1)
    text = lua_script(package.replace("/", "."), name)
    assert text.startswith("-- The fast path of "), path
    assert "redis.call" in text


def test_the_built_package_ships_every_script(tmp_path, source_tree):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("image_crawler-*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".lua")}
    assert shipped == lua_files()
