"""Reading settings: renamed variables keep working under their old names, METRICS_PORT is
a port or a range of ports, and README's Configuration section lists every variable the
processes read, with the code's defaults."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from crawl_monitor.settings import MonitorSettings
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
from worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

SETTINGS: dict[str, Callable[[Mapping[str, str]], Any]] = {
    "worker": WorkerSettings.from_env,
    "monitor": MonitorSettings.from_env,
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


def names_read(process: str) -> set[str]:
    env = RecordingEnv()
    SETTINGS[process](env)
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


# --- README's Configuration section -------------------------------------------------------


def configuration_tables() -> dict[str, list[list[str]]]:
    """Each table of the section by its header row's first cell: rows of cells."""
    section = re.search(r"^## Configuration\n(.*?)(?=^## |\Z)", README.read_text(), re.M | re.S)
    assert section, "README.md has no '## Configuration' section"
    tables: dict[str, list[list[str]]] = {}
    rows: list[list[str]] | None = None
    for line in section.group(1).splitlines():
        if not line.startswith("|"):
            rows = None
            continue
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        if rows is None:
            rows = tables.setdefault(cells[0], [])
        elif not set(cells[0]) <= {"-", " "}:
            rows.append(cells)
    return tables


def quoted(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def documented() -> tuple[set[str], dict[str, str]]:
    """The variables of the main table, and the deprecated table (old name -> new)."""
    tables = configuration_tables()
    variables = {name for row in tables["variable"] for name in quoted(row[0])}
    deprecated = {quoted(row[0])[0]: quoted(row[1])[0] for row in tables["deprecated name"]}
    return variables, deprecated


def test_readme_lists_the_deprecated_names():
    variables, deprecated = documented()
    assert deprecated == {old: new for new, old in RENAMED.items()}
    assert set(RENAMED) <= variables
    assert not variables & set(deprecated)


@pytest.mark.parametrize("process", sorted(SETTINGS))
def test_readme_lists_every_variable_a_process_reads(process):
    variables, deprecated = documented()
    read = names_read(process)
    assert "KAFKA_HOSTS" in read  # the recording sees the readers
    assert not read - variables - set(deprecated)


def documented_defaults() -> list[tuple[str, str]]:
    """(variable, default) where the default column is plain values, one per variable."""
    pairs = []
    for row in configuration_tables()["variable"]:
        names, defaults = quoted(row[0]), quoted(row[1])
        if re.fullmatch(r"`[^`{]+`(, `[^`{]+`)*", row[1]) and len(names) == len(defaults):
            pairs.extend(zip(names, defaults, strict=True))
    return pairs


def test_readme_defaults_are_checked():
    names = {name for name, _ in documented_defaults()}
    assert {"MAX_TASKS", "SHUTDOWN_GRACE_S", "LOG_FREQUENCY_S", "FETCH_READ_TIMEOUT_S"} <= names


@pytest.mark.parametrize(("name", "default"), documented_defaults())
def test_readme_defaults_are_the_codes(name, default):
    # Setting a variable to its documented default changes nothing, in either process.
    for from_env in SETTINGS.values():
        assert from_env({name: default}) == from_env({}), name
