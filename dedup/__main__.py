"""``python -m dedup``: the deduplication stage (issue 54).

Reads every partition of ``image_metadata_updates`` (assigned, not shared in a group: one
index must see every image, so a crawl runs one stage) and places each image in a cluster
of the same photograph (dedup/placement.py), publishing one message per image to
``image_duplicates``. Its state is the journal in ``DEDUP_STATE_DIR`` (dedup/journal.py),
read back at start; its input offsets are committed as group ``deduplication``. A journal
that is empty while offsets are committed (the folder lost) reads the topic again from
its start, so that the clusters are rebuilt rather than started again half way.

The placements per source and kind go to Redis too (dedup/counts.py), for operators;
Redis away never stops the stage.

SIGTERM or SIGINT ends the batch in hand (placed, synced, published, committed), then the
clients stop and the process exits 0; a journal that cannot be written exits 1.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from dedup.journal import Journal
from dedup.metrics import CANONICALS, REGISTRY
from dedup.placement import Placer
from dedup.settings import DedupSettings
from dedup.stage import Stage
from image_crawler.contract import DEDUP_GROUP, METADATA_TOPIC
from image_crawler.lifecycle import serve, start_kafka_clients
from image_crawler.logs import get_logger
from image_crawler.metrics import serving
from image_crawler.retry import sleep_unless_stopped

log = get_logger("dedup")

TOPIC_WAIT_S = 1.0


async def run(settings: DedupSettings, stop: asyncio.Event) -> int:
    journal = Journal(settings.state_dir)
    index = journal.load(settings.radius)
    CANONICALS.set(len(index))
    async with contextlib.AsyncExitStack() as stack:
        metrics = settings.metrics
        await stack.enter_async_context(
            serving(metrics.port, metrics.host, REGISTRY, port_last=metrics.port_last)
        )
        consumer = AIOKafkaConsumer(
            **settings.kafka.client_options(),
            group_id=DEDUP_GROUP,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        stack.push_async_callback(consumer.stop)
        producer = AIOKafkaProducer(**settings.kafka.producer_options(), acks="all")
        stack.push_async_callback(producer.stop)
        starts = [("consumer", consumer.start), ("producer", producer.start)]
        if not await start_kafka_clients(starts, stop):
            return 0
        admin = AIOKafkaAdminClient(**settings.kafka.client_options())
        await admin.start()
        try:
            partitions = await _partitions(admin, stop)
        finally:
            await admin.close()
        if partitions is None:
            return 0
        consumer.assign(partitions)
        if len(index) == 0 and any(await _committed(consumer, partitions)):
            log.warning("journal_empty_offsets_committed", action="reading the topic again")
            await consumer.seek_to_beginning(*partitions)
        redis = settings.redis.client(
            socket_timeout=settings.redis_timeout_s,
            socket_connect_timeout=settings.redis_timeout_s,
        )
        stack.push_async_callback(redis.aclose)
        stage = Stage(consumer, producer, journal, Placer(index), redis)
        log.info(
            "dedup_started",
            canonicals=len(index),
            radius=settings.radius,
            partitions=len(partitions),
            state_dir=str(settings.state_dir),
        )
        try:
            await stage.run(stop, settings.batch_size)
        except OSError:
            log.exception("journal_write_failed")
            return 1
        log.info("dedup_stopped", placed=stage.placed, unparseable=stage.unparseable)
    return 0


async def _partitions(
    admin: AIOKafkaAdminClient, stop: asyncio.Event
) -> list[TopicPartition] | None:
    """Every partition of the input topic, once it exists (the workers create it).

    Asked of an admin client: a consumer's ``partitions_for_topic`` knows only the topics
    of its own metadata, which on Apache Kafka never gains one created after it started
    (the compose stack's dedup starts before any image is crawled)."""
    while not stop.is_set():
        found = [
            TopicPartition(METADATA_TOPIC, p["partition"])
            # Every topic's, not the one by name: a broker that creates the topics it is
            # asked about would create this one with its default partitions.
            for topic in await admin.describe_topics()
            if topic["topic"] == METADATA_TOPIC and not topic["error_code"]
            for p in topic["partitions"]
        ]
        if found:
            return sorted(found)
        log.info("waiting_for_topic", topic=METADATA_TOPIC)
        await sleep_unless_stopped(stop, TOPIC_WAIT_S)
    return None


async def _committed(consumer: AIOKafkaConsumer, partitions: list[TopicPartition]) -> list[bool]:
    return [(await consumer.committed(tp)) is not None for tp in partitions]


def main() -> None:
    serve("dedup", DedupSettings.from_env, run)


if __name__ == "__main__":
    main()
