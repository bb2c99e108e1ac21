"""From the crawl's output messages to each row's ending (pure).

A row ends with its resolution message on ``image_metadata_updates`` (and, when that
says ``has_exif``, its EXIF message too: the two come in either order on one partition),
a ``link_rot`` message, or a ``crawl_errors`` message of its identifier. Messages of
other crawls (another run, or anything else on a shared cluster) are not ours and are
passed over; so are those of a message that could not be parsed (the rows were checked
before they were sent).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from crawlctl.dataset.layout import Ending
from image_crawler.contract import (
    CRAWL_ERRORS_TOPIC,
    LINK_ROT_TOPIC,
    METADATA_TOPIC,
    MalformedMessage,
    ResolutionMessage,
    Status,
)

OUTCOME_TOPICS = (METADATA_TOPIC, LINK_ROT_TOPIC, CRAWL_ERRORS_TOPIC)


class Joiner:
    """Joins each row's messages into its ``Ending``; ``key_of`` gives a message's row key
    from its identifier (None: not ours)."""

    def __init__(self, key_of: Callable[[object], str | None]) -> None:
        self._key_of = key_of
        # A resolution waiting for its EXIF, and an EXIF that came first.
        self._resolutions: dict[str, ResolutionMessage] = {}
        self._exif: dict[str, dict[str, Any]] = {}

    @property
    def waiting(self) -> int:
        """Half-joined rows (one message of two seen)."""
        return len(self._resolutions) + len(self._exif)

    def add(self, topic: str, value: bytes | None) -> tuple[str, Ending] | None:
        """One message: (key, ending) when it ends a row, else None."""
        try:
            message = json.loads(value or b"")
        except ValueError:
            return None
        if not isinstance(message, dict):
            return None
        key = self._key_of(message.get("identifier"))
        if key is None:
            return None
        if topic == METADATA_TOPIC:
            return self._metadata(key, message)
        if topic == LINK_ROT_TOPIC:
            return key, Ending(Status.NOT_FOUND)
        if topic == CRAWL_ERRORS_TOPIC:
            directives = message.get("directives") or ()
            detail = ", ".join(map(str, directives)) or None
            return key, Ending(str(message.get("status") or Status.INTERNAL_ERROR), detail=detail)
        return None

    def _metadata(self, key: str, message: dict[str, Any]) -> tuple[str, Ending] | None:
        if "exif" in message:
            exif = message["exif"] if isinstance(message["exif"], dict) else {}
            resolution = self._resolutions.pop(key, None)
            if resolution is None:
                self._exif[key] = exif
                return None
            return key, Ending(Status.OK, resolution, exif)
        try:
            resolution = ResolutionMessage.from_json(json.dumps(message))
        except (KeyError, TypeError, MalformedMessage):
            return None
        earlier = self._exif.pop(key, None)
        if resolution.has_exif and earlier is None:
            self._resolutions[key] = resolution
            return None
        return key, Ending(Status.OK, resolution, earlier)
