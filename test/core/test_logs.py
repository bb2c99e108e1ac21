"""Logs as the processes write them: one JSON object per line on stdout, ours and the
libraries' alike. Each case runs in a fresh interpreter, as ``python -m worker`` would
(logging's configuration is process-wide state)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from datetime import datetime
from typing import Any

import pytest

RUN_TIMEOUT_S = 60


def run(body: str, level: str = "INFO") -> list[dict[str, Any]]:
    """Run ``body`` after ``configure_logging(level)``; stdout's lines, each parsed as
    JSON (one that is not fails the test). Nothing may reach stderr."""
    script = (
        "import asyncio, gc, logging\n"
        "from image_crawler.logs import configure_logging, get_logger\n"
        f"configure_logging({level!r})\n" + textwrap.dedent(body)
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert all(isinstance(event, dict) for event in events)
    return events


def utc(value: str) -> datetime:
    parsed = datetime.fromisoformat(value)
    offset = parsed.utcoffset()
    assert offset is not None and offset.total_seconds() == 0, value
    return parsed


def test_a_library_warning_is_one_json_line_like_ours() -> None:
    library, ours = run(
        """
        logging.getLogger("aiokafka").warning("x %s", 1)
        get_logger("worker.pipeline").warning("ours", source="example")
        """
    )
    assert library.keys() == {"time", "level", "event", "logger"}
    assert (library["event"], library["level"], library["logger"]) == ("x 1", "warning", "aiokafka")
    # The fields both kinds share are written the same way.
    assert {"time", "level", "event"} <= ours.keys()
    assert ours["level"] == "warning"
    assert utc(library["time"]) <= utc(ours["time"])
    assert library["time"].endswith("Z") == ours["time"].endswith("Z")


@pytest.mark.parametrize(
    ("level", "kept"),
    [
        # Libraries stay at WARNING however verbose ours are...
        ("DEBUG", ["ours debug", "ours info", "lib warning", "lib error"]),
        ("INFO", ["ours info", "lib warning", "lib error"]),
        # ...and are no more verbose than ours.
        ("ERROR", ["lib error"]),
    ],
)
def test_log_level_governs_ours_and_libraries_keep_warnings(level: str, kept: list[str]) -> None:
    events = run(
        """
        log = get_logger("crawl_monitor.regulator")
        log.debug("ours debug")
        log.info("ours info")
        for name in ("botocore.credentials", "aiohttp.client", "aiokafka.conn"):
            logging.getLogger(name).debug("lib debug")
            logging.getLogger(name).info("lib info")
        logging.getLogger("aiokafka.conn").warning("lib warning")
        logging.getLogger("botocore").error("lib error")
        """,
        level,
    )
    assert [event["event"] for event in events] == kept


def test_a_library_exception_is_formatted_into_the_line() -> None:
    (event,) = run(
        """
        try:
            {}["missing"]
        except KeyError:
            logging.getLogger("aiohttp.server").exception("Error handling request")
        """
    )
    assert event["event"] == "Error handling request"
    assert event["level"] == "error"
    assert event["exception"].startswith("Traceback (most recent call last):")
    assert "KeyError: 'missing'" in event["exception"]


def test_asyncios_own_report_of_a_lost_task_exception_is_json() -> None:
    # A real library path: asyncio logs an unretrieved task exception when the task is
    # collected, through the "asyncio" logger with the traceback; its message has a line
    # break, escaped inside the one JSON line.
    (event,) = run(
        """
        async def fail():
            raise RuntimeError("lost")

        async def main():
            task = asyncio.ensure_future(fail())
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            del task
            gc.collect()

        asyncio.run(main())
        """
    )
    assert event["logger"] == "asyncio"
    assert event["level"] == "error"
    assert event["event"].startswith("Task exception was never retrieved\nfuture: <Task")
    assert "RuntimeError: lost" in event["exception"]


def test_configuring_twice_does_not_repeat_lines() -> None:
    events = run(
        """
        configure_logging("INFO")
        logging.getLogger("aiokafka").warning("once")
        """
    )
    assert [event["event"] for event in events] == ["once"]


def test_an_event_that_cannot_be_written_is_dropped_and_counted_not_raised():
    # stdout on /dev/full: every write fails with ENOSPC, as on a full disk.
    script = (
        "from image_crawler.logs import configure_logging, dropped_lines, get_logger\n"
        "configure_logging('INFO')\n"
        "log = get_logger('t')\n"
        "log.warning('disk_full', free_bytes=0)\n"
        "log.info('still_here')\n"
        "import sys; sys.stderr.write(f'dropped {dropped_lines()}')\n"
    )
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-c", script],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    assert result.stderr.endswith("dropped 2")
