"""``up``'s own log: JSON lines in ``DATA/logs/up.log``, one event a line.

The crawler's processes log to their own files; ``up`` itself speaks to its operator on
stderr, and records here the events a script or a test looks for (``disk_full``,
``disk_space_recovered``), in the processes' shape: ``event``, ``level``, ``time`` and
the event's fields. A line that cannot be written (the disk is full: the very event
being logged) is dropped and counted, never raised: the log must not stop ``up``.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from crawlctl.localstack.files import append_whole

UP_LOG_NAME: Final = "up.log"


class EventLog:
    """Appends events to ``path``; ``dropped`` counts the lines that could not be."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.dropped = 0

    def write(self, event: str, level: str = "info", **fields: Any) -> None:
        record = {**fields, "event": event, "level": level, "time": _now_iso()}
        line = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError:
            self.dropped += 1
            return
        try:
            append_whole(fd, line)
        except OSError:
            self.dropped += 1
        finally:
            os.close(fd)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")
