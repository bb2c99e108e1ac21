"""structlog set up once per process: JSON lines on stdout, one event per line.

Events are snake_case names with their context as fields; ``time`` is the wall clock in
ISO-8601 UTC, as the contract's monitoring events carry it.

Libraries (aiokafka, botocore, aiohttp, asyncio) log through the standard library; their
records are rendered by the same processors into the same JSON lines on stdout, with
``time``, ``level`` and ``event`` (the formatted message) like ours, plus ``logger`` (the
library's logger name) and ``exception`` (the traceback) when there is one.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

# Below this, library records are dropped whatever LOG_LEVEL says: at INFO and DEBUG
# aiokafka and botocore describe every request, which would drown our events.
LIBRARY_MIN_LEVEL = logging.WARNING


def _rename_timestamp(
    _: Any, __: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    event_dict["time"] = event_dict.pop("timestamp")
    return event_dict


def _shared_processors() -> list[Any]:
    """What our events and library records both go through before rendering."""
    return [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _rename_timestamp,
        structlog.processors.format_exc_info,
    ]


class _LineLogger(structlog.PrintLogger):
    """Our events' writer: a line that cannot be written (the disk under a redirected
    stdout is full, ENOSPC; a closed pipe) is dropped and counted in ``dropped_lines``,
    never raised into the code that logs. A process handling a full disk would otherwise
    die of the very event that reports it (seen: ``up``'s monitor and worker exited, their
    logs cut mid-line, when a disk was filled to its last byte)."""

    dropped_lines = 0

    def msg(self, message: str) -> None:
        try:
            super().msg(message)
        except OSError:
            _LineLogger.dropped_lines += 1

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


def dropped_lines() -> int:
    """Log lines this process could not write (see ``_LineLogger``)."""
    return _LineLogger.dropped_lines


class _LibraryHandler(logging.StreamHandler[TextIO]):
    """The root logger's handler; a class of its own so that a second
    ``configure_logging`` replaces it instead of adding another."""


def configure_logging(level: str = "INFO") -> None:
    """Route structlog and stdlib logging to JSON lines on stdout.

    ``level`` (LOG_LEVEL) filters our events; library records are kept from
    ``LIBRARY_MIN_LEVEL`` (WARNING) up, or from ``level`` when that is higher.
    """
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            *_shared_processors(),
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=lambda *_: _LineLogger(sys.stdout),
        cache_logger_on_first_use=True,
    )
    handler = _LibraryHandler(sys.stdout)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *_shared_processors()],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.JSONRenderer(),
            ],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _LibraryHandler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(max(LIBRARY_MIN_LEVEL, numeric))


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
