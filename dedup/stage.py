"""The stage's loop: read a batch of ``image_metadata_updates``, place its images, sync
the journal, publish a placement per image to ``image_duplicates``, commit.

That order is what makes a crash cost nothing but time: no placement is published before
the canonicals it rests on are on disk, and no input is committed before its placements
are acknowledged; after a crash the input is read again from the commit and placed again
with the same answers (dedup/placement.py). A journal that cannot be written stops the
stage (exit 1): carrying on, it would publish answers that a restart forgets.

EXIF messages (the topic's other kind) are passed over; a message that is not a
resolution message is logged (``unparseable``) and counted, never a stop.

The placements are counted per source and kind once each (dedup/counts.py), saved with
the journal, and copied to Redis by a task of their own that Redis being away never
stops, nor the stage with it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any, Protocol

import redis.asyncio as aioredis
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from dedup.counts import PlacementCounts, RedisCopy
from dedup.journal import Journal
from dedup.metrics import CANONICALS, PLACED, UNPARSEABLE
from dedup.placement import Image, Placement, Placer
from image_crawler.contract import (
    DUPLICATES_TOPIC,
    DuplicateMessage,
    MalformedMessage,
    ResolutionMessage,
    placements_field,
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
    """The loop; with ``redis``, the placement counts are copied to PLACEMENTS_HASH."""

    def __init__(
        self,
        consumer: Consumer,
        producer: Producer,
        journal: Journal,
        placer: Placer,
        redis: aioredis.Redis | None = None,
    ) -> None:
        self._consumer = consumer
        self._producer = producer
        self._journal = journal
        self._placer = placer
        self.placed: dict[str, int] = {"exact": 0, "near": 0, "unique": 0}
        self.unparseable = 0
        self.counts = PlacementCounts(journal.folder)
        if not self.counts.found and len(placer.index):
            # A journal older than the counts: what it placed is not in them.
            log.warning("placement_counts_started", canonicals=len(placer.index))
        self.redis_copy = RedisCopy(redis, self.counts.counts) if redis is not None else None

    async def run(self, stop: asyncio.Event, batch_size: int) -> None:
        copying = self._copying(stop)
        try:
            while not stop.is_set():
                batches = await self._consumer.getmany(
                    timeout_ms=POLL_TIMEOUT_MS, max_records=batch_size
                )
                if batches:
                    await self.handle(batches)
        finally:
            if copying is not None:
                await _ended(copying, stop)

    def _copying(self, stop: asyncio.Event) -> asyncio.Task[None] | None:
        if self.redis_copy is None:
            return None
        return asyncio.create_task(self.redis_copy.run(stop), name="placement-counts")

    async def handle(self, batches: Mapping[TopicPartition, list[Any]]) -> list[Placement]:
        read = [
            (tp.partition, record.offset, image)
            for tp, records in batches.items()
            for record in records
            if (image := self._image(record)) is not None
        ]
        placements = self._placer.place([image for _p, _o, image in read])
        self._journal.append(self._placer.index)
        counted = self._count(read, placements, batches)
        sent = [
            await self._producer.send(
                DUPLICATES_TOPIC, _message(p).to_json(), key=p.identifier.encode()
            )
            for p in placements
        ]
        await asyncio.gather(*sent)
        for placement in placements:
            self.placed[placement.kind] += 1
        for placement in counted:
            PLACED.labels(placement.source, placement.kind).inc()
        CANONICALS.set(len(self._placer.index))
        await self._commit({tp: records[-1].offset + 1 for tp, records in batches.items()})
        if self.redis_copy is not None and counted:
            self.redis_copy.changed({placements_field(p.source, p.kind) for p in counted})
        return placements

    def _count(
        self,
        read: list[tuple[int, int, Image]],
        placements: list[Placement],
        batches: Mapping[TopicPartition, list[Any]],
    ) -> list[Placement]:
        """Count the placements not counted before, and save the counts (synced, before
        any is published: see dedup/counts.py); the placements counted."""
        counted = [
            placement
            for (partition, offset, _image), placement in zip(read, placements, strict=True)
            if self.counts.count(partition, offset, placement.source, placement.kind)
        ]
        for tp, records in batches.items():
            self.counts.counted_to(tp.partition, records[-1].offset + 1)
        # Nothing counted, nothing to keep: what a crash makes the stage read again
        # counts nothing (passed over, or counted before).
        if counted:
            self.counts.save()
        return counted

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


async def _ended(copying: asyncio.Task[None], stop: asyncio.Event) -> None:
    """The copy's task ended: after its last write when the stage stops, cancelled when
    the stage fails (its journal unwritable)."""
    if not stop.is_set():
        copying.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await copying


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
