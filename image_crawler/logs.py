"""structlog set up once per process: JSON lines on stdout, one event per line.

Events are snake_case names with their context as fields; ``time`` is the wall clock in
ISO-8601 UTC, as the contract's monitoring events carry it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog


def _rename_timestamp(
    _: Any, __: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    event_dict["time"] = event_dict.pop("timestamp")
    return event_dict


def configure_logging(level: str = "INFO") -> None:
    """Route structlog and stdlib logging to JSON lines on stdout."""
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _rename_timestamp,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stdout),
        cache_logger_on_first_use=True,
    )
    # Libraries (aiokafka, botocore) log through the standard library: keep only warnings.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
