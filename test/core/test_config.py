"""Reading settings: renamed variables keep working under their old names, METRICS_PORT is
a port or a range of ports, and docs/configuration.md is true to the code both ways: it
lists every variable our programs read and nothing else, says which program reads each,
and gives the code's defaults, units and old names."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import importlib.util
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from structlog.testing import capture_logs

from crawl_monitor.settings import MonitorSettings
from crawlctl.commands import download, up
from crawlctl.connections import kafka_settings, redis_settings
from crawlctl.localstack.disk import disk_reserve_bytes
from crawlctl.localstack.stack import StackSettings, crawler_env, monitor_metrics_port
from dedup.settings import DedupSettings
from image_crawler import healthcheck
from image_crawler.config import (
    RENAMED,
    ConfigError,
    DeprecatedSetting,
    MetricsSettings,
    deprecated_settings,
    env_float,
    env_name,
    env_optional,
    log_deprecated,
)
from test.harness.processes import CrawlerProcess
from test.harness.services import free_port
from worker.settings import DEFAULT_USER_AGENT, WorkerSettings

ROOT = Path(__file__).resolve().parents[2]

SETTINGS: dict[str, Callable[[Mapping[str, str]], Any]] = {
    "worker": WorkerSettings.from_env,
    "monitor": MonitorSettings.from_env,
    "dedup": DedupSettings.from_env,
}


class RecordingEnv(dict[str, str]):
    """An environment that remembers every variable looked up in it."""

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        super().__init__(values or {})
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return super().__contains__(key)


def names_read(program: str) -> set[str]:
    """Every variable ``program`` looks up, old names included."""
    if program == "image-crawler":
        return cli_names_read()
    if program == "healthcheck":
        return healthcheck_names_read()
    env = RecordingEnv()
    SETTINGS[program](env)
    return env.read


# A value each renamed setting accepts, other than its default.
VALUES = {"PACE_RATE_TTL_MS": "2500", "KAFKA_MAX_POLL_INTERVAL_S": "600"}


def renamed_reads() -> list[tuple[str, str, str]]:
    """(process, new name, old name) for every renamed variable a process reads."""
    return [
        (process, new, old)
        for process in SETTINGS
        for new, old in RENAMED.items()
        if new in names_read(process)
    ]


# --- the readers ------------------------------------------------------------------------


def test_every_renamed_variable_is_read_by_a_process():
    assert {new for _, new, _ in renamed_reads()} == set(RENAMED)


def test_the_old_name_is_read_when_the_new_one_is_unset_or_empty():
    assert env_float({"SHUTDOWN_GRACE_SECONDS": "3"}, "SHUTDOWN_GRACE_S", 30.0) == 3.0
    assert (
        env_float(
            {"SHUTDOWN_GRACE_SECONDS": "3", "SHUTDOWN_GRACE_S": " "}, "SHUTDOWN_GRACE_S", 30.0
        )
        == 3.0
    )
    assert env_optional({"TOKEN_TTL_MS": "1200"}, "PACE_RATE_TTL_MS") == "1200"
    assert env_float({}, "SHUTDOWN_GRACE_S", 30.0) == 30.0


def test_the_new_name_wins():
    env = {"SHUTDOWN_GRACE_S": "5", "SHUTDOWN_GRACE_SECONDS": "3"}
    assert env_float(env, "SHUTDOWN_GRACE_S", 30.0) == 5.0
    assert env_name(env, "SHUTDOWN_GRACE_S") == "SHUTDOWN_GRACE_S"
    assert env_name({"SHUTDOWN_GRACE_SECONDS": "3"}, "SHUTDOWN_GRACE_S") == "SHUTDOWN_GRACE_SECONDS"
    assert env_name({}, "SHUTDOWN_GRACE_S") == "SHUTDOWN_GRACE_S"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"SHUTDOWN_GRACE_SECONDS": "soon"}, "SHUTDOWN_GRACE_SECONDS"),
        ({"SHUTDOWN_GRACE_S": "soon"}, "SHUTDOWN_GRACE_S"),
        # The new name is the one read, so it is the one named.
        ({"SHUTDOWN_GRACE_S": "soon", "SHUTDOWN_GRACE_SECONDS": "3"}, "SHUTDOWN_GRACE_S"),
        ({"SHUTDOWN_GRACE_SECONDS": "-1"}, "SHUTDOWN_GRACE_SECONDS"),
    ],
)
def test_a_bad_value_names_the_variable_that_was_set(env, named):
    with pytest.raises(ConfigError, match=rf"^{named} must be"):
        env_float(env, "SHUTDOWN_GRACE_S", 30.0)


def test_a_rule_across_settings_names_the_variables_that_were_set():
    env = {"SHUTDOWN_GRACE_SECONDS": "10", "KAFKA_MAX_POLL_INTERVAL_SECONDS": "6"}
    with pytest.raises(
        ConfigError,
        match=r"^SHUTDOWN_GRACE_SECONDS \(10\) .* KAFKA_MAX_POLL_INTERVAL_SECONDS \(6\)",
    ):
        WorkerSettings.from_env(env)
    with pytest.raises(
        ConfigError, match=r"^SHUTDOWN_GRACE_S \(10\) .* KAFKA_MAX_POLL_INTERVAL_S \(6\)"
    ):
        WorkerSettings.from_env({"SHUTDOWN_GRACE_S": "10", "KAFKA_MAX_POLL_INTERVAL_S": "6"})


def test_deprecated_names_are_reported_once_each():
    assert deprecated_settings({}) == ()
    assert deprecated_settings({"SHUTDOWN_GRACE_S": "3"}) == ()
    assert deprecated_settings({"SHUTDOWN_GRACE_SECONDS": "3", "TOKEN_TTL_MS": ""}) == (
        DeprecatedSetting("SHUTDOWN_GRACE_SECONDS", "SHUTDOWN_GRACE_S"),
    )
    both = {"SHUTDOWN_GRACE_SECONDS": "3", "SHUTDOWN_GRACE_S": "3"}
    assert deprecated_settings(both) == (
        DeprecatedSetting("SHUTDOWN_GRACE_SECONDS", "SHUTDOWN_GRACE_S", ignored=False),
    )
    differ = {"SHUTDOWN_GRACE_SECONDS": "3", "SHUTDOWN_GRACE_S": "5"}
    assert deprecated_settings(differ) == (
        DeprecatedSetting("SHUTDOWN_GRACE_SECONDS", "SHUTDOWN_GRACE_S", ignored=True),
    )


def test_deprecated_names_are_logged_as_events():
    with capture_logs() as logs:
        log_deprecated(
            (
                DeprecatedSetting("LOG_FREQUENCY_SECONDS", "LOG_FREQUENCY_S"),
                DeprecatedSetting("SHUTDOWN_GRACE_SECONDS", "SHUTDOWN_GRACE_S", ignored=True),
            )
        )
    assert logs == [
        {
            "event": "deprecated_setting",
            "log_level": "warning",
            "name": "LOG_FREQUENCY_SECONDS",
            "use": "LOG_FREQUENCY_S",
        },
        {
            "event": "deprecated_setting",
            "log_level": "warning",
            "name": "SHUTDOWN_GRACE_SECONDS",
            "use": "SHUTDOWN_GRACE_S",
            "ignored": True,
        },
    ]


# --- METRICS_PORT -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "port", "port_last"),
    [
        ("", None, None),
        ("  ", None, None),
        ("9101", 9101, None),
        (" 9101 ", 9101, None),
        ("0", 0, None),
        ("65535", 65535, None),
        ("9101-9103", 9101, 9103),
        ("1-65535", 1, 65535),
        # A range of one port is that port.
        ("9101-9101", 9101, None),
    ],
)
def test_metrics_port_is_a_port_or_a_range(raw, port, port_last):
    settings = MetricsSettings.from_env({"METRICS_PORT": raw})
    assert (settings.port, settings.port_last) == (port, port_last)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("http", "must be a port .* or a range of ports FIRST-LAST"),
        ("-1", "must be a port"),
        ("9101:9103", "must be a port"),
        ("9101-", "must be a port"),
        ("9101-9103-9105", "must be a port"),
        ("9101 - 9103", "must be a port"),
        ("1e3", "must be a port"),
        ("70000", "must be at most 65535"),
        ("9101-70000", "must be at most 65535"),
        ("0-3", "a range starts at port 1 or above"),
        ("0-0", "a range starts at port 1 or above"),
        ("9103-9101", "a range runs from its lower port to its higher"),
    ],
)
def test_a_bad_metrics_port_is_named_with_its_value(raw, why):
    with pytest.raises(ConfigError, match=rf"^METRICS_PORT:? {why}.*, got {re.escape(repr(raw))}$"):
        MetricsSettings.from_env({"METRICS_PORT": raw})


# --- both processes' settings -----------------------------------------------------------


@pytest.mark.parametrize(("process", "new", "old"), renamed_reads())
def test_an_old_name_still_sets_its_setting_and_is_reported(process, new, old):
    from_env = SETTINGS[process]
    value = VALUES.get(new, "2")
    expected = from_env({new: value})
    assert expected != from_env({})
    settings = from_env({old: value})
    assert settings == expected
    assert settings.deprecated == (DeprecatedSetting(old, new),)
    assert from_env({new: value}).deprecated == ()
    both = from_env({new: value, old: "3"})
    assert both == expected
    assert both.deprecated == (DeprecatedSetting(old, new, ignored=True),)


def test_a_process_logs_a_deprecated_name_once_at_start(tmp_path):
    env = {
        "KAFKA_HOSTS": f"127.0.0.1:{free_port()}",
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "LOG_FREQUENCY_SECONDS": "7",
    }
    monitor = CrawlerProcess("crawl_monitor", env, tmp_path / "monitor.log")
    try:
        event = monitor.wait_for_event("deprecated_setting", 30)
        assert (event["name"], event["use"]) == ("LOG_FREQUENCY_SECONDS", "LOG_FREQUENCY_S")
        assert event["level"] == "warning"
        assert len(monitor.events("deprecated_setting")) == 1
    finally:
        monitor.stop()


# --- docs/configuration.md ----------------------------------------------------------------
#
# The page's main table has a row per variable, or per group of variables sharing a
# meaning: variable | default | unit | read by | meaning | deprecated name. What each column
# claims is checked against the code, both ways where there are two: every variable the
# code reads is documented as read by what reads it, and every documented variable is read
# by what the page says reads it.

PAGE = ROOT / "docs" / "configuration.md"
COLUMNS = ("variable", "default", "unit", "read by", "meaning", "deprecated name")
# What `read by` may name: our programs, whose reading is recorded (``names_read``)...
PROGRAMS = ("worker", "monitor", "dedup", "image-crawler", "healthcheck")
# ...and the libraries that read variables themselves, with the process each runs in.
LIBRARIES = {"botocore": "worker"}
NONE = "—"


@dataclasses.dataclass(frozen=True)
class Variable:
    """One variable of the main table. ``default`` is its default when the cell gives it as
    a plain value (``3000``, not "unset" or "CPU count"); ``default_cell`` is the cell."""

    name: str
    default: str | None
    default_cell: str
    unit: str
    read_by: frozenset[str]
    deprecated: str | None


def page_tables(text: str) -> dict[tuple[str, ...], list[list[str]]]:
    """Each table of the page by its header row: its rows of cells."""
    tables: dict[tuple[str, ...], list[list[str]]] = {}
    header: tuple[str, ...] = ()
    rows: list[list[str]] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            rows = None
            continue
        cells = row_cells(line)
        if rows is None:
            header = tuple(cells)
            rows = tables.setdefault(header, [])
        elif not set("".join(cells)) <= {"-", " "}:
            assert len(cells) == len(header), f"{len(cells)} cells, not {len(header)}: {line}"
            rows.append(cells)
    return tables


def row_cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split(" | ")]


def quoted(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def per_name(cell: str, names: list[str]) -> dict[str, str]:
    """A cell of plain values, one per name (`` `10`, `30` ``), by name; else empty."""
    values = quoted(cell)
    if re.fullmatch(r"`[^`{]+`(, `[^`{]+`)*", cell) and len(values) == len(names):
        return dict(zip(names, values, strict=True))
    return {}


def variables(text: str | None = None) -> dict[str, Variable]:
    """The main table's variables by name: of the page, or of ``text`` (a page edited)."""
    tables = page_tables(PAGE.read_text() if text is None else text)
    assert COLUMNS in tables, f"docs/configuration.md has no table with the columns {COLUMNS}"
    found: dict[str, Variable] = {}
    for cells in tables[COLUMNS]:
        row = dict(zip(COLUMNS, cells, strict=True))
        names = quoted(row["variable"])
        assert re.fullmatch(r"`[A-Z][A-Z0-9_]*`(, `[A-Z][A-Z0-9_]*`)*", row["variable"]), row
        read_by = frozenset(row["read by"].split(", "))
        assert read_by <= {*PROGRAMS, *LIBRARIES}, f"{names}: read by {row['read by']!r}"
        old = row["deprecated name"]
        deprecated = {} if old == NONE else per_name(old, names)
        assert deprecated or old == NONE, f"{names}: deprecated name {old!r}"
        defaults = per_name(row["default"], names)
        for name in names:
            assert name not in found, f"{name} has two rows"
            found[name] = Variable(
                name=name,
                default=defaults.get(name),
                default_cell=row["default"],
                unit=row["unit"],
                read_by=read_by,
                deprecated=deprecated.get(name),
            )
    return found


def deprecated_table(text: str | None = None) -> dict[str, str]:
    """The table of deprecated names: old name -> the one to use."""
    rows = page_tables(PAGE.read_text() if text is None else text)[("deprecated name", "use")]
    return {quoted(old)[0]: quoted(new)[0] for old, new in rows}


# --- what reads the environment -----------------------------------------------------------


def cli_names_read() -> set[str]:
    """The variables image-crawler reads: every subcommand's Kafka and Redis connection,
    from ``os.environ`` (here a recording), and what ``up`` reads before starting a local
    crawl (``LocalStack.start`` hands ``os.environ`` to ``crawler_env``,
    ``monitor_metrics_port`` and ``disk_reserve_bytes``)."""
    env = RecordingEnv()
    with mock.patch.object(os, "environ", env):
        kafka_settings(argparse.Namespace(kafka=None))
        redis_settings(argparse.Namespace(redis=None))
        up._sources_file(None)
        download._s3_settings()
    crawler_env(StackSettings(Path("data"), Path("thumbnails")), "kafka:9092", "redis://r", env)
    monitor_metrics_port(env)
    disk_reserve_bytes(env)
    return env.read


def healthcheck_names_read() -> set[str]:
    """The variables the containers' health check reads, asking a port nothing listens on
    (so that it reads everything it would read before asking)."""
    env = RecordingEnv({"METRICS_PORT": str(free_port())})
    assert healthcheck.check(env) is not None
    return env.read


def unlike_the_code(
    program: str, documented: Mapping[str, Variable], read: set[str]
) -> tuple[set[str], set[str]]:
    """(variables ``program`` reads that the page does not say it reads, variables the page
    says it reads that it does not). Old names are left out: the settings read every one
    of them (for ``deprecated_setting``), and the page has them in their own column."""
    read = read - set(RENAMED.values())
    said = {name for name, variable in documented.items() if program in variable.read_by}
    return read - said, said - read


# Where the code may touch the process environment: each such function is one of the
# readers recorded above (the program named), or hands a copy of it to a child process
# (None), which reads it itself.
ENVIRONMENT_USERS: dict[str, str | None] = {
    "worker/settings.py:WorkerSettings.from_env": "worker",
    "crawl_monitor/settings.py:MonitorSettings.from_env": "monitor",
    "dedup/settings.py:DedupSettings.from_env": "dedup",
    "image_crawler/healthcheck.py:main": "healthcheck",
    "crawlctl/connections.py:kafka_settings": "image-crawler",
    "crawlctl/connections.py:redis_settings": "image-crawler",
    "crawlctl/commands/up.py:_sources_file": "image-crawler",
    "crawlctl/commands/download.py:_s3_settings": "image-crawler",
    "crawlctl/localstack/stack.py:LocalStack.start": "image-crawler",
    "crawlctl/localstack/stack.py:LocalStack._start_crawlers": "image-crawler",
    "crawlctl/localstack/processes.py:ModuleProcess.start": None,
    "crawlctl/localstack/services.py:KafkaBroker._env": None,
    "crawlctl/localstack/objects.py:ObjectStore._env": None,
}
PACKAGES = ("image_crawler", "worker", "crawl_monitor", "crawlctl", "dedup")
_ENVIRONMENT = {"environ", "environb", "getenv", "getenvb"}


class _EnvironmentUses(ast.NodeVisitor):
    """The functions (``Class.method``) of one module that use ``os.environ`` or
    ``os.getenv``; ``<module>`` for its top level."""

    def __init__(self) -> None:
        self.scope: list[str] = []
        self.found: set[str] = set()

    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Attribute(self, node: ast.Attribute) -> None:
        uses = isinstance(node.value, ast.Name) and node.value.id == "os"
        if uses and node.attr in _ENVIRONMENT:
            self.found.add(".".join(self.scope) or "<module>")
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module == "os" and {alias.name for alias in node.names} & _ENVIRONMENT:
            self.found.add("from os import")


def environment_users(root: Path, packages: tuple[str, ...] = PACKAGES) -> set[str]:
    """``path:function`` of every use of the process environment in ``packages``."""
    found = set()
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            uses = _EnvironmentUses()
            uses.visit(ast.parse(path.read_text(), str(path)))
            found |= {f"{path.relative_to(root).as_posix()}:{where}" for where in uses.found}
    return found


@functools.cache
def library_source(library: str) -> str:
    """The Python source of an installed library, every file of it."""
    spec = importlib.util.find_spec(library)
    assert spec is not None and spec.submodule_search_locations, library
    folder = Path(next(iter(spec.submodule_search_locations)))
    return "\n".join(path.read_text(errors="replace") for path in sorted(folder.rglob("*.py")))


def not_in_their_library(documented: Mapping[str, Variable]) -> set[str]:
    """Variables said to be read by a library whose source has no string of their name."""
    return {
        name
        for name, variable in documented.items()
        for library in variable.read_by & set(LIBRARIES)
        if not re.search(rf"""(['"]){re.escape(name)}\1""", library_source(library))
    }


def readers_in(process: str, variable: Variable) -> bool:
    """Whether ``process`` reads ``variable``, itself or through a library it runs."""
    return any(LIBRARIES.get(reader, reader) == process for reader in variable.read_by)


# --- the checks -----------------------------------------------------------------------------


@pytest.mark.parametrize("program", PROGRAMS)
def test_docs_say_what_each_program_reads(program):
    """For each of our programs, the variables docs/configuration.md says it reads (`read
    by`) are exactly those it looks up in a recording environment: a variable read but
    undocumented, or documented as read by a program that does not read it, fails."""
    read = names_read(program)
    assert "METRICS_PORT" in read  # the recording sees the readers
    assert unlike_the_code(program, variables(), read) == (set(), set())


def test_every_documented_variable_is_read():
    """Every variable of the page is read by one of our programs or by the library the page
    names, and every variable our programs read is on the page: the issue's both ways."""
    documented = variables()
    ours = set().union(*(names_read(program) for program in PROGRAMS)) - set(RENAMED.values())
    by_libraries = {name for name, v in documented.items() if v.read_by & set(LIBRARIES)}
    assert set(documented) == ours | by_libraries
    assert len(documented) > 60


def test_library_variables_are_in_the_librarys_source():
    """A variable the page says a library reads (botocore's credential chain: the AWS keys)
    is a string in that library's installed source, so that a misspelt name fails."""
    documented = variables()
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= {
        name for name, v in documented.items() if "botocore" in v.read_by
    }
    assert not_in_their_library(documented) == set()


def test_the_code_touches_the_environment_only_where_the_recordings_look():
    """The recorded readers are all there is: every function of ours that uses
    ``os.environ`` (or ``os.getenv``) is one ``names_read`` calls, or one that hands a copy
    to a child process. A new reader elsewhere fails until it is recorded too."""
    assert environment_users(ROOT) == set(ENVIRONMENT_USERS)
    assert set(ENVIRONMENT_USERS.values()) - {None} == set(PROGRAMS)


def test_the_environment_scan_sees_a_new_reader(tmp_path):
    module = tmp_path / "pkg" / "sub" / "mod.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "import os\n"
        "class A:\n"
        "    def f(self):\n"
        "        return os.getenv('X')\n"
        "TOP = os.environ.get('Y')\n"
        "def g(environ):\n"
        "    return environ.get('Z')\n"
    )
    (tmp_path / "pkg" / "other.py").write_text("from os import environ\n")
    assert environment_users(tmp_path, ("pkg",)) == {
        "pkg/sub/mod.py:A.f",
        "pkg/sub/mod.py:<module>",
        "pkg/other.py:from os import",
    }


def test_a_program_reading_a_renamed_variable_reads_its_old_name_too():
    for program in PROGRAMS:
        read = names_read(program)
        assert {RENAMED[name] for name in read & set(RENAMED)} <= read, program


def deprecated_column(documented: Mapping[str, Variable]) -> dict[str, str]:
    """The main table's `deprecated name` column: old name -> variable."""
    return {v.deprecated: name for name, v in documented.items() if v.deprecated}


def test_docs_give_every_deprecated_name():
    """The `deprecated name` column and the table of deprecated names both give exactly the
    old names ``RENAMED`` still reads, each with its new name; no old name has a row."""
    renamed = {old: new for new, old in RENAMED.items()}
    documented = variables()
    assert deprecated_column(documented) == renamed
    assert deprecated_table() == renamed
    assert not set(documented) & set(renamed)


# The page's rule: a name ends in its unit. Longest suffix first: `_PER_S` is a rate a
# second (BACKOFF_INCREASE_SHARE_PER_S), not a number of seconds.
SUFFIX_UNITS = (
    ("_PER_S", "per second"),
    ("_RPS", "requests per second"),
    ("_BYTES", "bytes"),
    ("_MS", "milliseconds"),
    ("_S", "seconds"),
)
# Names whose unit is one of the rule's although they do not end in it.
UNSUFFIXED_UNITS = {"MAX_BYTES_IN_FLIGHT": "bytes"}


def wrong_units(documented: Mapping[str, Variable]) -> list[str]:
    """Variables whose `unit` breaks the suffix rule, either way: a suffix with another
    unit, or a unit of the rule without its suffix (``UNSUFFIXED_UNITS`` aside)."""
    wrong = []
    for name, variable in documented.items():
        rule = next((unit for suffix, unit in SUFFIX_UNITS if name.endswith(suffix)), None)
        if rule is None:
            of_the_rule = variable.unit.endswith("per second") or variable.unit in {
                unit for _, unit in SUFFIX_UNITS
            }
            right = not of_the_rule or UNSUFFIXED_UNITS.get(name) == variable.unit
        elif rule == "per second":
            right = variable.unit.endswith(rule)
        else:
            right = variable.unit == rule
        if not right or not variable.unit:
            wrong.append(name)
    return sorted(wrong)


def test_units_follow_the_names():
    """Each variable's `unit` is the one its name's suffix says (`_S` seconds, `_MS`
    milliseconds, `_BYTES` bytes, `_RPS` requests per second), and no other name has one
    of those units."""
    documented = variables()
    suffixed = [n for n in documented if any(n.endswith(s) for s, _ in SUFFIX_UNITS)]
    assert len(suffixed) >= 25
    assert wrong_units(documented) == []


def wrong_defaults(documented: Mapping[str, Variable]) -> list[str]:
    """Variables whose documented plain default, set, changes the settings of a process
    that reads them: then it is not the code's default."""
    wrong = []
    for name, variable in documented.items():
        if variable.default is None:
            continue
        for process in sorted(variable.read_by & set(SETTINGS)):
            from_env = SETTINGS[process]
            if from_env({name: variable.default}) != from_env({}):
                wrong.append(name)
    return wrong


def test_docs_defaults_are_the_codes():
    """Setting a variable to its documented default changes nothing in the processes that
    read it. Every plain default is checked so (each is read by the worker or the
    monitor); the others are words ("unset", "CPU count")."""
    documented = variables()
    plain = {name for name, v in documented.items() if v.default is not None}
    assert {"MAX_TASKS", "SHUTDOWN_GRACE_S", "LOG_FREQUENCY_S", "FETCH_READ_TIMEOUT_S"} <= plain
    assert all(documented[name].read_by & set(SETTINGS) for name in plain)
    assert wrong_defaults(documented) == []


def test_docs_default_user_agent_is_the_codes():
    (template,) = quoted(variables()["USER_AGENT"].default_cell)
    pattern = re.escape(template).replace(re.escape("{version}"), r"\S+")
    assert re.fullmatch(pattern, DEFAULT_USER_AGENT)


@pytest.mark.parametrize("process", sorted(SETTINGS))
def test_an_empty_variable_is_an_unset_one(process):
    """The page's first paragraph, for every variable (and old name) ``process`` reads."""
    from_env = SETTINGS[process]
    names = [name for name, v in variables().items() if process in v.read_by]
    names += [RENAMED[name] for name in names if name in RENAMED]
    assert len(names) > 10  # the page's table was read
    assert [name for name in names if from_env({name: ""}) != from_env({})] == []


# --- each check can fail --------------------------------------------------------------------


def row_line(text: str, name: str) -> str:
    """The main table's line whose `variable` cell names ``name``."""
    (line,) = [
        line
        for line in text.splitlines()
        if line.startswith("| `") and name in quoted(row_cells(line)[0])
    ]
    return line


def with_cell(text: str, name: str, column: str, value: str) -> str:
    """``text`` with the `column` cell of ``name``'s row set to ``value``."""
    line = row_line(text, name)
    cells = row_cells(line)
    cells[COLUMNS.index(column)] = value
    return text.replace(line, "| " + " | ".join(cells) + " |")


def test_the_read_by_check_sees_a_missing_an_extra_and_a_misattributed_variable():
    page = PAGE.read_text()
    text = page.replace(row_line(page, "MAX_TASKS") + "\n", "")
    extra = "| `NOT_A_SETTING` | `1` | count | worker | nothing reads it | — |"
    text = text.replace(row_line(text, "KAFKA_HOSTS"), row_line(text, "KAFKA_HOSTS") + "\n" + extra)
    text = with_cell(text, "REDIS_TIMEOUT_S", "read by", "worker")
    text = with_cell(text, "SOURCES_FILE", "read by", "monitor")
    documented = variables(text)
    assert unlike_the_code("worker", documented, names_read("worker")) == (
        {"MAX_TASKS"},
        {"NOT_A_SETTING", "REDIS_TIMEOUT_S"},
    )
    assert unlike_the_code("monitor", documented, names_read("monitor")) == (
        {"REDIS_TIMEOUT_S"},
        set(),
    )
    read = names_read("image-crawler")
    assert unlike_the_code("image-crawler", documented, read) == ({"SOURCES_FILE"}, set())


def test_the_other_checks_see_a_wrong_cell():
    page = PAGE.read_text()
    misspelt = page.replace("`AWS_SECRET_ACCESS_KEY`", "`AWS_SECRET_ACCES_KEY`")
    assert not_in_their_library(variables(misspelt)) == {"AWS_SECRET_ACCES_KEY"}
    text = with_cell(page, "SHUTDOWN_GRACE_S", "unit", "milliseconds")
    text = with_cell(text, "MAX_TASKS", "unit", "seconds")
    text = with_cell(text, "MAX_BODY_BYTES", "unit", "count")
    assert wrong_units(variables(text)) == ["MAX_BODY_BYTES", "MAX_TASKS", "SHUTDOWN_GRACE_S"]
    text = with_cell(page, "MAX_TASKS", "default", "`3001`")
    text = with_cell(text, "LEADER_LEASE_MS", "default", "`3000`")  # the same: no change
    assert wrong_defaults(variables(text)) == ["MAX_TASKS"]
    text = with_cell(page, "LOG_FREQUENCY_S", "deprecated name", NONE)
    assert set(deprecated_column(variables(text))) == set(RENAMED.values()) - {
        "LOG_FREQUENCY_SECONDS"
    }
    with pytest.raises(AssertionError, match="read by 'workers'"):
        variables(with_cell(page, "MAX_TASKS", "read by", "workers"))


def test_a_worker_skips_copies_for_10_minutes_and_is_a_dynamic_member_unless_told():
    default = WorkerSettings.from_env({})
    assert (default.copy_window_s, default.kafka_group_instance_id) == (600, None)
    assert default.kafka_session_timeout_s == 10
    told = WorkerSettings.from_env(
        {
            "COPY_WINDOW_S": "0",
            "KAFKA_GROUP_INSTANCE_ID": "worker-0",
            "KAFKA_SESSION_TIMEOUT_S": "45",
        }
    )
    assert (told.copy_window_s, told.kafka_group_instance_id) == (0, "worker-0")
    assert told.kafka_session_timeout_s == 45
