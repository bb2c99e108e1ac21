"""The backlog: its rule (a table), its measurement against the broker, its Redis hash,
and the loop through Kafka and Redis outages.

Records are produced in batches of several, as the splitter produces them: tansu's
in-memory storage answers ListOffsets with the start of a partition's last batch (see
``crawl_monitor.backlog``), and the measurement must still find the end.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Mapping

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError
from redis.asyncio import Redis
from structlog.testing import capture_logs

from crawl_monitor.backlog import (
    Backlog,
    BacklogMonitor,
    KafkaOffsets,
    PartitionOffsets,
    backlog_by_source,
    partition_backlog,
    write_backlog,
)
from image_crawler import contract as c
from image_crawler.contract import crawl_eta_s, eta_s
from test.harness.processes import commit
from test.harness.services import create_topics, free_port, wait_for


@pytest.mark.parametrize(
    ("start", "end", "committed", "backlog"),
    [
        (0, 0, None, 0),  # an empty partition
        (0, 10, None, 10),  # nothing committed: from the log start
        (4, 10, None, 6),
        (0, 10, 3, 7),
        (0, 10, 10, 0),  # everything taken
        (5, 10, 2, 5),  # committed below the log start: 2-4 are gone, 5-9 wait
        (0, 10, 12, 0),  # past the end (tansu's short end offsets): never negative
    ],
)
def test_partition_backlog(start, end, committed, backlog):
    assert partition_backlog(PartitionOffsets(start, end, committed)) == backlog


def test_backlog_by_source_sums_partitions_of_source_topics_only():
    offsets = {
        TopicPartition("urls.flickr", 0): PartitionOffsets(0, 10, 4),
        TopicPartition("urls.flickr", 1): PartitionOffsets(0, 7, None),
        TopicPartition("urls.met", 0): PartitionOffsets(0, 3, 3),
        TopicPartition(c.INBOUND_TOPIC, 0): PartitionOffsets(0, 99, None),
    }
    assert backlog_by_source(offsets) == {"flickr": 13, "met": 0}


@pytest.mark.parametrize(
    ("backlog", "rate_rps", "expected_s"),
    [(0, 0.0, 0.0), (0, 5.0, 0.0), (10, 0.0, math.inf), (10, 0.5, 20.0), (300, 200.0, 1.5)],
)
def test_eta(backlog, rate_rps, expected_s):
    assert eta_s(backlog, rate_rps) == expected_s


@pytest.mark.parametrize(
    ("backlog", "rates", "expected_s"),
    [
        ({}, {}, 0.0),
        ({"a": 10, "b": 30}, {"a": 1.0, "b": 10.0}, 10.0),  # in parallel: the longest
        ({"a": 10, "halted": 5}, {"a": 2.0, "halted": 0.0}, 5.0),  # a halt waits outside
        ({"halted": 5}, {"a": 2.0, "halted": 0.0}, math.inf),  # only it is left
        ({"unknown": 5}, {"a": 2.0}, 0.0),  # not crawled until known
    ],
)
def test_crawl_eta(backlog, rates, expected_s):
    assert crawl_eta_s(backlog, rates) == expected_s


# --- against the broker ----------------------------------------------------------------------


async def produce_batched(bootstrap: str, counts: Mapping[TopicPartition, int]) -> None:
    """``counts`` records into each partition, a partition's records in one batch."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=50)
    await producer.start()
    try:
        for tp, count in counts.items():
            sent = [
                await producer.send(tp.topic, b"%d" % i, partition=tp.partition)
                for i in range(count)
            ]
            await asyncio.gather(*sent)
    finally:
        await producer.stop()


@pytest.fixture
async def admin(kafka) -> AsyncIterator[AIOKafkaAdminClient]:
    client = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    await client.start()
    try:
        yield client
    finally:
        await client.close()


A0, A1 = TopicPartition("urls.a", 0), TopicPartition("urls.a", 1)
B0, EMPTY0 = TopicPartition("urls.b", 0), TopicPartition("urls.empty", 0)


async def seed_topics(bootstrap: str) -> None:
    """urls.a: 5 and 3 records, 2 of the first taken by the workers; urls.b: 4, all
    taken; urls.empty: none; inbound_images: 2 (not a source's queue). Another group's
    offsets do not count."""
    await create_topics(bootstrap, ["urls.a"], partitions=2)
    await create_topics(bootstrap, ["urls.b", "urls.empty", c.INBOUND_TOPIC], partitions=1)
    inbound = TopicPartition(c.INBOUND_TOPIC, 0)
    await produce_batched(bootstrap, {A0: 5, A1: 3, B0: 4, inbound: 2})
    await commit(bootstrap, c.WORKER_GROUP, {A0: 2, B0: 4})
    await commit(bootstrap, c.SPLITTER_GROUP, {A1: 3, inbound: 2})


async def test_offsets_and_backlog_from_the_broker(kafka, admin):
    await seed_topics(kafka.bootstrap)
    offsets = await KafkaOffsets(admin).read()
    assert offsets == {
        A0: PartitionOffsets(start=0, end=5, committed=2),
        A1: PartitionOffsets(start=0, end=3, committed=None),
        B0: PartitionOffsets(start=0, end=4, committed=4),
        EMPTY0: PartitionOffsets(start=0, end=0, committed=None),
    }
    assert backlog_by_source(offsets) == {"a": 6, "b": 0, "empty": 0}


async def test_the_monitor_writes_the_hash_and_keeps_the_latest(kafka, admin, redis):
    await seed_topics(kafka.bootstrap)
    await redis.hset(c.BACKLOG_HASH, mapping={"gone": 7, "a": 1})  # a topic deleted since
    monitor = BacklogMonitor(KafkaOffsets(admin), redis, 0.05, clock=lambda: 1_700_000_000.5)
    stop, started = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(monitor.run(stop, started))
    try:
        assert monitor.latest is None  # waits for Kafka's clients to start
        started.set()
        await wait_for(
            lambda: _hash_is(redis, {"a": "6", "b": "0", "empty": "0"}), 10, what="the hash"
        )
        assert await redis.get(c.BACKLOG_AT) == "1700000000.500"
        assert monitor.latest == Backlog({"a": 6, "b": 0, "empty": 0}, 1_700_000_000.5)
        assert monitor.latest.total == 6
        assert monitor.measured_at_monotonic is not None

        # The workers take urls.a's URLs: the next period sees it.
        await commit(kafka.bootstrap, c.WORKER_GROUP, {A0: 5, A1: 3})
        await wait_for(lambda: _hash_is(redis, {"a": "0", "b": "0", "empty": "0"}), 10)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


async def _hash_is(redis: Redis, expected: dict[str, str]) -> bool:
    return await redis.hgetall(c.BACKLOG_HASH) == expected


async def test_write_backlog_with_no_topic_empties_the_hash(redis):
    await redis.hset(c.BACKLOG_HASH, mapping={"gone": 7})
    await write_backlog(redis, Backlog({}, 12.0))
    assert await redis.exists(c.BACKLOG_HASH) == 0
    assert await redis.get(c.BACKLOG_AT) == "12.000"


async def test_one_measurement_with_1000_sources(kafka, admin, record_property):
    """1,000 topics of 4 partitions, half of them partly taken: the measurement's
    duration (printed with ``pytest -s`` and recorded, not asserted) and its result."""
    names = [c.source_topic(f"site{i:04d}") for i in range(1000)]
    for start in range(0, len(names), 250):
        await create_topics(kafka.bootstrap, names[start : start + 250], partitions=4)
    # One record in each of partitions 0-2 (the fourth is empty).
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    await producer.start()
    try:
        sent = [await producer.send(n, b"u", partition=p) for n in names for p in range(3)]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
    await commit(kafka.bootstrap, c.WORKER_GROUP, {TopicPartition(n, 0): 1 for n in names[:500]})
    reader = KafkaOffsets(admin)
    await reader.read()  # connections made
    durations = []
    for _ in range(3):
        started, cpu = time.perf_counter(), time.process_time()
        offsets = await reader.read()
        durations.append((time.perf_counter() - started, time.process_time() - cpu))
    backlog = backlog_by_source(offsets)
    assert len(offsets) == 4000
    assert sum(backlog.values()) == 3000 - 500
    wall_s, cpu_s = min(durations)
    print(f"\n1,000 topics, 4,000 partitions: {wall_s * 1000:.0f} ms, {cpu_s * 1000:.0f} ms CPU")
    record_property("measure_s", wall_s)
    record_property("measure_cpu_s", cpu_s)


class FlakyKafka:
    """An ``OffsetsReader`` that is away for its first ``failures`` reads."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.reads = 0

    async def read(self) -> Mapping[TopicPartition, PartitionOffsets]:
        self.reads += 1
        if self.reads <= self.failures:
            raise KafkaConnectionError("broker away")
        return {TopicPartition("urls.a", 0): PartitionOffsets(0, 9, 4)}


async def test_kafka_and_redis_outages_are_logged_and_retried():
    # Redis: nothing listens there.
    away = Redis(port=free_port(), socket_connect_timeout=1)
    try:
        kafka = FlakyKafka(failures=2)
        monitor = BacklogMonitor(kafka, away, 0.02)
        stop, started = asyncio.Event(), asyncio.Event()
        started.set()
        with capture_logs() as logs:
            task = asyncio.create_task(monitor.run(stop, started))
            try:
                await wait_for(lambda: monitor.latest is not None, 10, what="a measurement")
                await wait_for(lambda: [e for e in logs if e["event"] == "redis_unavailable"], 10)
            finally:
                stop.set()
                await asyncio.wait_for(task, 5)
        unavailable = [e for e in logs if e["event"] == "kafka_unavailable"]
        assert len(unavailable) == 2
        assert {e["op"] for e in unavailable} == {"measure_backlog"}
        # Measured though Redis is away: /metrics and the log still have it.
        assert monitor.latest is not None
        assert monitor.latest.sources == {"a": 5}
        assert not [e for e in logs if e["event"] == "backlog_error"]
    finally:
        await away.aclose()
