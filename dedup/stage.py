"""The stage's loop: read a batch of ``image_metadata_updates``, place its images, sync
the journal, publish a placement per image to ``image_duplicates``, commit.

That order is what makes a crash cost nothing but time: no placement is published before
the canonicals it rests on are on disk, and no input is committed before its placements
are acknowledged; after a crash the input is read again from the commit and placed again
with the same answers (dedup/placement.py). A journal that cannot be written stops the
stage (exit 1): carrying on, it would publish answers that a restart forgets.

EXIF messages (the topic's other kind) are passed over; a message that is not a
resolution message is logged (``unparseable``) and counted, never a stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Protocol

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from dedup.journal import Journal
from dedup.metrics import CANONICALS, PLACED, UNPARSEABLE
from dedup.placement import Image, Placement, Placer
from image_crawler.contract import (
    DUPLICATES_TOPIC,
    DuplicateMessage,
    MalformedMessage,
    ResolutionMessage,
)
from image_crawler.logs import get_logger

log = get_logger("dedup")

POLL_TIMEOUT_MS = 500


class Consumer(Protocol):
    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = ..., max_records: int | None = ...
    ) -> Mapping[TopicPartition, list[Any]]: ...

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None: ...


class Producer(Protocol):
    async def send(self, topic: str, value: bytes, key: bytes | None = ...) -> Any: ...


class Stage:
    def __init__(
        self, consumer: Consumer, producer: Producer, journal: Journal, placer: Placer
    ) -> None:
        self._consumer = consumer
        self._producer = producer
        self._journal = journal
        self._placer = placer
        self.placed: dict[str, int] = {"exact": 0, "near": 0, "unique": 0}
        self.unparseable = 0

    async def run(self, stop: asyncio.Event, batch_size: int) -> None:
        while not stop.is_set():
            batches = await self._consumer.getmany(
                timeout_ms=POLL_TIMEOUT_MS, max_records=batch_size
            )
            if batches:
                await self.handle(batches)

    async def handle(self, batches: Mapping[TopicPartition, list[Any]]) -> list[Placement]:
        images = [i for i in (self._image(r) for rs in batches.values() for r in rs) if i]
        placements = self._placer.place(images)
        self._journal.append(self._placer.index)
        sent = [
            await self._producer.send(
                DUPLICATES_TOPIC, _message(p).to_json(), key=p.identifier.encode()
            )
            for p in placements
        ]
        await asyncio.gather(*sent)
        for placement in placements:
            self.placed[placement.kind] += 1
            PLACED.labels(placement.source, placement.kind).inc()
        CANONICALS.set(len(self._placer.index))
        await self._commit({tp: records[-1].offset + 1 for tp, records in batches.items()})
        return placements

    def _image(self, record: Any) -> Image | None:
        try:
            message = ResolutionMessage.from_json(record.value)
        except KeyError:
            if b'"exif"' in record.value:
                return None  # the image's EXIF message
            self._unparseable(record, "not a resolution message")
            return None
        except (MalformedMessage, TypeError) as e:
            self._unparseable(record, str(e))
            return None
        return Image(
            message.identifier,
            message.source or "",
            message.width,
            message.height,
            message.sha256,
            message.phash,
        )

    def _unparseable(self, record: Any, error: str) -> None:
        self.unparseable += 1
        UNPARSEABLE.inc()
        log.warning(
            "unparseable",
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            error=error,
        )

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        try:
            await self._consumer.commit(offsets)
        except KafkaError as e:
            # Placed again from the older commit, with the same answers.
            log.warning("commit_failed", error=type(e).__name__, partitions=len(offsets))


def _message(placement: Placement) -> DuplicateMessage:
    # A source of "" is one an older worker did not name.
    return DuplicateMessage(
        placement.identifier,
        placement.source or None,
        placement.kind,
        placement.duplicate_of,
        placement.duplicate_of_source or None,
        placement.distance,
    )
