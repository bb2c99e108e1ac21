"""Lua scripts, kept in ``lua/`` folders beside the modules that run them.

Each file is the fast path of a rule the Python code states (its header says which):
the script does in one atomic call what would otherwise take a round trip per key. They
ship as package data (pyproject's ``package-data``), read once at import.
"""

from __future__ import annotations

from importlib import resources


def lua_script(package: str, name: str) -> str:
    """The text of ``{package}/lua/{name}``."""
    return resources.files(package).joinpath("lua", name).read_text(encoding="utf-8")
