"""From the crawl's output messages to each row's ending (pure).

A row ends with its resolution message on ``image_metadata_updates`` (and, when that
says ``has_exif``, its EXIF message too: the two come in either order on one partition),
a ``link_rot`` message, or a ``crawl_errors`` message of its identifier. Messages of
other crawls (another run, or anything else on a shared cluster) are not ours and are
passed over; so are those of a message that could not be parsed (the rows were checked
before they were sent).

With ``--dedup``, an image's row ends once its placement on ``image_duplicates`` has come
too (the deduplication stage places every resolution message; either may come first),
and a ``Keeper`` says whether its cluster kept another row: in ``exact`` mode a cluster
is the images of one sha256, in ``near`` mode also those within the stage's radius.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any, Final

from crawlctl.dataset.layout import Duplicate, Ending
from image_crawler.contract import (
    CRAWL_ERRORS_TOPIC,
    DUPLICATES_TOPIC,
    LINK_ROT_TOPIC,
    METADATA_TOPIC,
    MalformedMessage,
    ResolutionMessage,
    Status,
)

OUTCOME_TOPICS = (METADATA_TOPIC, LINK_ROT_TOPIC, CRAWL_ERRORS_TOPIC)
DEDUP_MODES: Final = ("exact", "near")
# The placements each mode counts as a duplicate.
_COUNTED: Final = {"exact": frozenset({"exact"}), "near": frozenset({"exact", "near"})}


def outcome_topics(dedup: str | None) -> tuple[str, ...]:
    return OUTCOME_TOPICS if dedup is None else (*OUTCOME_TOPICS, DUPLICATES_TOPIC)


class Keeper:
    """Which row each cluster keeps: the cluster's canonical (the first image the stage
    saw of it) when that is a row of this run; when it is an image of another crawl (a
    shared cluster), the first of this run's rows placed in it, which ``kept`` remembers
    (the run saves it beside its endings, so a rerun keeps the same row)."""

    def __init__(
        self,
        mode: str,
        key_of: Callable[[object], str | None],
        kept: Mapping[str, str] | None = None,
    ) -> None:
        self._counted = _COUNTED[mode]
        self._key_of = key_of
        self.kept: dict[str, str] = dict(kept or {})

    def duplicate(self, key: str, placement: Mapping[str, Any]) -> Duplicate | None:
        """The row ``key``'s cluster keeps, if another; ``placement`` is its message."""
        kind = placement.get("kind")
        canonical = placement.get("duplicate_of")
        if kind not in self._counted or not isinstance(canonical, str):
            return None
        distance = placement.get("distance")
        distance = distance if isinstance(distance, int) else 0
        kept = self._key_of(canonical)
        if kept is None:  # another crawl's image: this run keeps its first row of it
            kept = self.kept.setdefault(canonical, key)
        return None if kept == key else Duplicate(kept, str(kind), distance)


class Joiner:
    """Joins each row's messages into its ``Ending``; ``key_of`` gives a message's row key
    from its identifier (None: not ours)."""

    def __init__(
        self, key_of: Callable[[object], str | None], keeper: Keeper | None = None
    ) -> None:
        self._key_of = key_of
        self._keeper = keeper
        # A resolution waiting for its EXIF, and an EXIF that came first.
        self._resolutions: dict[str, ResolutionMessage] = {}
        self._exif: dict[str, dict[str, Any]] = {}
        # With a keeper: an image's ending waiting for its placement, and a placement
        # that came first.
        self._unplaced: dict[str, Ending] = {}
        self._placements: dict[str, dict[str, Any]] = {}

    @property
    def waiting(self) -> int:
        """Half-joined rows (one message of two seen, or of three)."""
        return len(self._resolutions) + len(self._exif) + len(self._unplaced)

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
            joined = self._metadata(key, message)
            return joined if joined is None else self._placed(*joined)
        if topic == DUPLICATES_TOPIC and self._keeper is not None:
            # A placement read again after its row ended waits here for good: rare (the
            # stage's replay after a crash), and a few bytes each.
            ending = self._unplaced.pop(key, None)
            if ending is None:
                self._placements[key] = message
                return None
            return key, self._kept(key, ending, message)
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

    def _placed(self, key: str, ending: Ending) -> tuple[str, Ending] | None:
        """An image's ending, once its placement has come (without a keeper: now)."""
        if self._keeper is None:
            return key, ending
        placement = self._placements.pop(key, None)
        if placement is None:
            self._unplaced[key] = ending
            return None
        return key, self._kept(key, ending, placement)

    def _kept(self, key: str, ending: Ending, placement: Mapping[str, Any]) -> Ending:
        assert self._keeper is not None
        duplicate = self._keeper.duplicate(key, placement)
        return ending if duplicate is None else dataclasses.replace(ending, duplicate=duplicate)
