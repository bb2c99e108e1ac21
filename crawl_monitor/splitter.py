"""The splitter: ``inbound_images`` into one queue per source, ``urls.{source}``.

Each message loses its ``source`` field (the topic says it), keeps ``attempts``, and is
keyed by its uuid. Work goes in batches: fetch up to ``batch_size`` messages, produce
them all (acks=all), wait for every acknowledgement, record the batch's sources and
counts in Redis in one round trip, and only then commit the inbound offsets. A crash at
any point re-splits at most one batch (at least once, never lost).

A message that cannot be parsed, lacks a field, or names a source that cannot be part of
a Kafka topic name is logged (``malformed_message``), counted (``num_malformed``) and
dead-lettered to ``crawl_errors``; it never stops the messages behind it.

A source's topic is created (``SOURCE_TOPIC_PARTITIONS`` partitions) the first time the
splitter sees the source, since a production cluster may not auto-create topics, with
``retention.ms`` = ``URL_TOPIC_RETENTION_MS`` (-1 by default: a backlog may wait longer
than any broker default, and a URL the broker deletes unread is one the crawl never
ends) and ``retention.bytes`` = -1. A topic that already exists keeps its own settings;
the splitter reads them once and logs ``topic_retention_finite`` when they can delete
sooner than configured (a topic made by an older version, or auto-created by the broker
with its defaults). When the
cluster refuses the name itself (``InvalidTopicError``: e.g. ``urls.a_b`` once
``urls.a.b`` exists, whose metric names collide), that batch's messages of the source are
dead-lettered like malformed ones instead of being sent again forever, which would stop
the partition; the topic is asked for again when the source comes back. Other failures
only log ``topic_create_failed``: producing may still work.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import InvalidTopicError, KafkaError
from redis.exceptions import RedisError

from crawl_monitor.settings import MonitorSettings
from image_crawler.contract import (
    CRAWL_ERRORS_TOPIC,
    INBOUND_SOURCES_SET,
    INBOUND_TOPIC,
    MAX_SOURCE_NAME_LENGTH,
    NUM_MALFORMED,
    NUM_SPLIT,
    URL_TOPIC_RETENTION_MS,
    InboundImage,
    MalformedMessage,
    SourceTask,
    UnparseableMessage,
    is_valid_source_name,
    source_topic,
)
from image_crawler.logs import get_logger
from image_crawler.retry import Backoff, sleep_unless_stopped

log = get_logger(__name__)

# Kafka's error code for "topic already exists".
TOPIC_ALREADY_EXISTS: Final = 36
# The topic settings that delete records, and the value that never does.
RETENTION_MS: Final = "retention.ms"
RETENTION_BYTES: Final = "retention.bytes"
UNLIMITED: Final = -1
# Waits between tries while Kafka or Redis is away (image_crawler.retry.Backoff).
MIN_BACKOFF_S: Final = 0.1
MAX_BACKOFF_S: Final = 5.0


@dataclasses.dataclass(frozen=True, slots=True)
class Split:
    """A message bound for its source's queue."""

    source: str
    task: SourceTask


@dataclasses.dataclass(frozen=True, slots=True)
class Rejected:
    """A message that cannot be split, and why."""

    error: str


def route(raw: bytes | None) -> Split | Rejected:
    """Where one ``inbound_images`` message goes. Source names are lower-cased."""
    try:
        message = InboundImage.from_json(raw or b"")
    except MalformedMessage as e:
        return Rejected(str(e))
    # Checked before lower-casing: str.lower() turns some non-ASCII letters into ASCII
    # ones (the Kelvin sign into "k"), and such a name is not the source it looks like.
    if not is_valid_source_name(message.source):
        return Rejected(
            f"source {message.source[:100]!r} cannot name a Kafka topic (at most "
            f"{MAX_SOURCE_NAME_LENGTH} of a-z A-Z 0-9 . _ -)"
        )
    return Split(message.source.lower(), message.to_source_task())


def deletes_sooner(retention_ms: int | None, configured_ms: int) -> bool:
    """Whether a topic's ``retention.ms`` (None: not reported) deletes records sooner
    than ``configured_ms``; -1 (or any negative) is never."""
    if retention_ms is None or retention_ms < 0:
        return False
    return configured_ms < 0 or retention_ms < configured_ms


class TopicCreator:
    """Creates ``urls.{source}`` topics once per process; an existing topic is fine, and
    its retention is checked once (see the module docstring)."""

    def __init__(
        self,
        admin: AIOKafkaAdminClient,
        *,
        partitions: int,
        replication_factor: int,
        retention_ms: int = URL_TOPIC_RETENTION_MS,
    ) -> None:
        self._admin = admin
        self._partitions = partitions
        self._replication_factor = replication_factor
        self._retention_ms = retention_ms
        self._configs = {RETENTION_MS: str(retention_ms), RETENTION_BYTES: str(UNLIMITED)}
        self._known: set[str] = set()

    async def ensure(self, topics: Iterable[str]) -> Mapping[str, str]:
        """Create the topics not seen before; answers those refused for good, with why.

        Raises ``KafkaError`` when Kafka is away.
        """
        missing = sorted(set(topics) - self._known)
        if not missing:
            return {}
        response = await self._admin.create_topics(
            [
                NewTopic(
                    name, self._partitions, self._replication_factor, topic_configs=self._configs
                )
                for name in missing
            ]
        )
        failed: dict[str, int] = {}
        refused: dict[str, str] = {}
        existing: list[str] = []
        for entry in getattr(response, "topic_errors", ()):
            topic, code = entry[0], entry[1]
            if code == TOPIC_ALREADY_EXISTS:
                existing.append(topic)
            elif code != 0:
                failed[topic] = code
                # Only a name Kafka will never accept is final. Not, say, a missing
                # CreateTopics permission: Kafka answers that for existing topics too,
                # which producing still reaches.
                if code == InvalidTopicError.errno:
                    message = entry[2] if len(entry) > 2 and entry[2] else ""
                    refused[topic] = f"InvalidTopicError: {message}".rstrip(": ")
            else:
                log.info(
                    "topic_created",
                    topic=topic,
                    partitions=self._partitions,
                    retention_ms=self._retention_ms,
                )
        if failed:
            # Producing may still work (an existing topic, auto-creation), and the next
            # batch asks again. A refused topic is asked for again when its source is.
            log.warning("topic_create_failed", errors=failed, refused=sorted(refused))
        self._known.update(t for t in missing if t not in failed)
        if existing:
            await self._check_retention(existing)
        return refused

    async def _check_retention(self, topics: Sequence[str]) -> None:
        """Log ``topic_retention_finite`` for each topic whose settings delete records
        sooner than configured. Only a warning: the topic is the operator's to change,
        and reading its settings may fail (not allowed, not supported) without harm."""
        try:
            # Every setting, not the two: tansu 0.6 cannot decode a request that names
            # the settings it wants (and drops the connection).
            responses = await self._admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic) for topic in topics]
            )
        except KafkaError as e:
            log.warning("topic_config_unreadable", topics=len(topics), error=repr(e))
            return
        for response in responses:
            for resource in getattr(response, "resources", ()):
                code, topic, entries = resource[0], resource[3], resource[4]
                if code != 0:
                    log.warning("topic_config_unreadable", topic=topic, error_code=code)
                    continue
                values = {entry[0]: _as_int(entry[1]) for entry in entries}
                retention_ms = values.get(RETENTION_MS)
                retention_bytes = values.get(RETENTION_BYTES)
                if deletes_sooner(retention_ms, self._retention_ms) or (
                    retention_bytes is not None and retention_bytes >= 0
                ):
                    log.warning(
                        "topic_retention_finite",
                        topic=topic,
                        retention_ms=retention_ms,
                        retention_bytes=retention_bytes,
                        configured_retention_ms=self._retention_ms,
                    )


class Splitter:
    """Runs the batches; see the module docstring."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer,
        redis: aioredis.Redis,
        topics: TopicCreator,
        *,
        batch_size: int = MonitorSettings().splitter_batch_size,
        poll_timeout_s: float = 0.5,
        paused: Callable[[], bool] = lambda: False,
    ) -> None:
        self._consumer = consumer
        # The whole crawl is paused (crawl_paused): inbound_images is left unread.
        self._paused = paused
        self._holding = False
        self._producer = producer
        self._redis = redis
        self._topics = topics
        self._batch_size = batch_size
        self._poll_timeout_s = poll_timeout_s
        self.split = 0
        self.malformed = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Split until ``stop`` is set; the batch in hand is finished and committed first."""
        backoff = Backoff(base_s=MIN_BACKOFF_S, cap_s=MAX_BACKOFF_S)
        while not stop.is_set():
            batch: Mapping[TopicPartition, Sequence[Any]] = {}
            try:
                self._hold_while_paused()
                batch = await self._consumer.getmany(
                    timeout_ms=int(self._poll_timeout_s * 1000), max_records=self._batch_size
                )
                if batch:
                    await self.split_batch(batch, stop)
                backoff.reset()
            except KafkaError as e:
                log.warning("kafka_unavailable", op="split", error=repr(e))
                self._rewind(batch)
                await sleep_unless_stopped(stop, backoff.next_s())
            except Exception:
                log.exception("splitter_error")
                self._rewind(batch)
                await sleep_unless_stopped(stop, backoff.next_s())

    def _hold_while_paused(self) -> None:
        """While the crawl is paused, every assigned partition is paused (polling goes on,
        so the consumer keeps its place in the group and reads nothing); resumed after."""
        consumer = self._consumer
        if self._paused():
            # Again each poll: partitions assigned by a rebalance meanwhile start unpaused.
            consumer.pause(*consumer.assignment())
            self._holding = True
        elif self._holding:
            consumer.resume(*consumer.assignment())
            self._holding = False

    async def split_batch(
        self, batch: Mapping[TopicPartition, Sequence[Any]], stop: asyncio.Event
    ) -> None:
        """Produce, acknowledge, count, commit one batch of ``inbound_images`` records."""
        routed = [
            (tp, record, route(record.value)) for tp, records in batch.items() for record in records
        ]
        sources = sorted({r.source for _, _, r in routed if isinstance(r, Split)})
        refused = await self._topics.ensure(source_topic(s) for s in sources)
        if refused:
            routed = [(tp, record, _unless_refused(r, refused)) for tp, record, r in routed]
            sources = sorted({r.source for _, _, r in routed if isinstance(r, Split)})

        await self._produce(routed)

        split = sum(1 for _, _, r in routed if isinstance(r, Split))
        malformed = len(routed) - split
        if not await self._count(sources, split, malformed, stop):
            # Stopping while Redis is away: not committed, so split again next time.
            return
        self.split += split
        self.malformed += malformed
        offsets = {tp: records[-1].offset + 1 for tp, records in batch.items() if records}
        try:
            await self._consumer.commit(offsets)
        except KafkaError as e:
            # E.g. a rebalance took the partitions: their next owner splits them again.
            log.warning("commit_failed", error=repr(e), partitions=len(offsets))
            return
        log.debug("batch_split", split=split, malformed=malformed, sources=len(sources))

    async def _produce(
        self, routed: Sequence[tuple[TopicPartition, Any, Split | Rejected]]
    ) -> None:
        """Send each message to its source's queue, or dead-letter it; return once Kafka
        has acknowledged them all (raises the first failure: the batch is sent again)."""
        acks = []
        for tp, record, result in routed:
            if isinstance(result, Split):
                value = result.task.to_json()
                acks.append(
                    await self._producer.send(
                        source_topic(result.source), value, key=result.task.uuid.encode()
                    )
                )
            else:
                log.warning(
                    "malformed_message",
                    topic=tp.topic,
                    partition=tp.partition,
                    offset=record.offset,
                    error=result.error,
                )
                dead_letter = UnparseableMessage.from_raw(record.value, result.error, INBOUND_TOPIC)
                acks.append(await self._producer.send(CRAWL_ERRORS_TOPIC, dead_letter.to_json()))
        # Every acknowledgement settles before deciding: one failure sends the batch again.
        for outcome in await asyncio.gather(*acks, return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome

    async def _count(
        self, sources: Sequence[str], split: int, malformed: int, stop: asyncio.Event
    ) -> bool:
        """Record the batch in Redis (retrying while Redis is away); False if stopped first."""
        backoff = Backoff(base_s=MIN_BACKOFF_S, cap_s=MAX_BACKOFF_S)
        while True:
            try:
                async with self._redis.pipeline(transaction=False) as pipe:
                    if sources:
                        pipe.sadd(INBOUND_SOURCES_SET, *sources)
                    if split:
                        pipe.incrby(NUM_SPLIT, split)
                    if malformed:
                        pipe.incrby(NUM_MALFORMED, malformed)
                    await pipe.execute()
                return True
            except RedisError as e:
                log.warning("redis_unavailable", op="record_split", error=repr(e))
                if stop.is_set():
                    return False
                await sleep_unless_stopped(stop, backoff.next_s())

    def _rewind(self, batch: Mapping[TopicPartition, Sequence[Any]]) -> None:
        """Fetch an unfinished batch again (its partitions that are still ours)."""
        assigned = self._consumer.assignment()
        for tp, records in batch.items():
            if records and tp in assigned:
                self._consumer.seek(tp, records[0].offset)


def _as_int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _unless_refused(result: Split | Rejected, refused: Mapping[str, str]) -> Split | Rejected:
    if isinstance(result, Split):
        reason = refused.get(source_topic(result.source))
        if reason is not None:
            return Rejected(f"topic {source_topic(result.source)!r} refused by Kafka: {reason}")
    return result
