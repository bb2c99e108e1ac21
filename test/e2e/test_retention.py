"""Nothing expires unseen, against the real broker: the monitor creates the per-source
queues with a retention that never deletes them, and a worker whose committed offset the
broker's log start has overtaken says how many URLs were lost, and counts them.

tansu applies no retention and has no DeleteRecords; the worker test moves the log start
through tansu's own storage instead (test/harness/retention_broker.py), which the broker
then reports and serves exactly as a Kafka broker does once retention has run.
"""

from __future__ import annotations

import signal
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from image_crawler import contract as c
from test.harness.crawl import RATE, worker_env
from test.harness.processes import CrawlerProcess, committed_offset
from test.harness.retention_broker import S3StoredBroker
from test.harness.services import create_bucket, produce, read_topic, wait_for

WEEK_MS = 7 * 24 * 3600 * 1000


async def topic_configs(bootstrap: str, topics: list[str]) -> dict[str, dict[str, str]]:
    """The settings the broker reports for each topic (tansu: only those set)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, t) for t in topics]
        )
    finally:
        await admin.close()
    return {
        resource[3]: {entry[0]: entry[1] for entry in resource[4]}
        for response in responses
        for resource in response.resources
    }


async def test_the_monitor_creates_queues_that_never_expire_and_flags_those_that_do(
    kafka, redis_url, tmp_path
):
    # A queue made before, by an older version or by the broker with its defaults.
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic("urls.old", 1, 1, topic_configs={"retention.ms": str(WEEK_MS)})]
        )
    finally:
        await admin.close()
    inbound = [
        c.InboundImage(url=f"http://{s}/1.jpg", uuid=f"{s}-1", source=s).to_json()
        for s in ("kept", "old")
    ]
    await produce(kafka.bootstrap, c.INBOUND_TOPIC, inbound)

    env = {**kafka.env, "REDIS_URL": redis_url, "SOURCE_TOPIC_PARTITIONS": "1"}
    monitor = CrawlerProcess("crawl_monitor", env, tmp_path / "monitor.log")
    try:
        created = monitor.wait_for_event("topic_created", 60)
        assert (created["topic"], created["retention_ms"]) == ("urls.kept", -1)
        flagged = monitor.wait_for_event("topic_retention_finite", 30)
        assert flagged["topic"] == "urls.old"
        assert (flagged["retention_ms"], flagged["configured_retention_ms"]) == (WEEK_MS, -1)
        # What the broker itself says about the queues (tansu answers DescribeConfigs with
        # the settings a topic was created with).
        configs = await topic_configs(kafka.bootstrap, ["urls.kept", "urls.old"])
        assert configs["urls.kept"] == {"retention.ms": "-1", "retention.bytes": "-1"}
        assert configs["urls.old"] == {"retention.ms": str(WEEK_MS)}  # left as it was
        assert len(monitor.events("topic_retention_finite")) == 1
        monitor.signal(signal.SIGTERM)
        assert monitor.wait(60) == 0
    finally:
        monitor.stop()


async def test_url_topic_retention_ms_is_the_operators_choice(kafka, redis_url, tmp_path):
    day_ms = 24 * 3600 * 1000
    inbound = c.InboundImage(url="http://d/1.jpg", uuid="d-1", source="daily").to_json()
    await produce(kafka.bootstrap, c.INBOUND_TOPIC, [inbound])
    env = {
        **kafka.env,
        "REDIS_URL": redis_url,
        "SOURCE_TOPIC_PARTITIONS": "1",
        "URL_TOPIC_RETENTION_MS": str(day_ms),
    }
    monitor = CrawlerProcess("crawl_monitor", env, tmp_path / "monitor.log")
    try:
        created = monitor.wait_for_event("topic_created", 60)
        assert (created["topic"], created["retention_ms"]) == ("urls.daily", day_ms)
        configs = await topic_configs(kafka.bootstrap, ["urls.daily"])
        assert configs["urls.daily"] == {"retention.ms": str(day_ms), "retention.bytes": "-1"}
    finally:
        monitor.stop()


async def produce_one_batch_each(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """One send at a time: each record its own batch, so any offset can be a log start."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value, partition=0)
    finally:
        await producer.stop()


async def commit_as_the_workers(bootstrap: str, tp: TopicPartition, offset: int) -> None:
    committer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=c.WORKER_GROUP, enable_auto_commit=False
    )
    await committer.start()
    try:
        committer.assign([tp])
        await committer.commit({tp: offset})
    finally:
        await committer.stop()


async def log_start(bootstrap: str, tp: TopicPartition) -> int:
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await reader.start()
    try:
        return (await reader.beginning_offsets([tp]))[tp]
    finally:
        await reader.stop()


async def test_a_worker_behind_the_log_start_logs_and_counts_the_urls_lost(
    redis, redis_url, s3_server, s3_bucket, origin, tmp_path: Path
):
    create_bucket(s3_server.endpoint_url, "tansu-retention")
    broker = S3StoredBroker(s3_server, "tansu-retention", log_dir=tmp_path / "kafka").start()
    source, tp = "expiring", TopicPartition("urls.expiring", 0)
    try:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(tp.topic, 1, 1)])
        finally:
            await admin.close()
        # Every URL answers 404: each one the worker reads ends in link_rot.
        tasks = [
            c.SourceTask(url=origin.url(f"/gone/{i}.jpg"), uuid=f"u{i}").to_json()
            for i in range(10)
        ]
        await produce_one_batch_each(broker.bootstrap, tp.topic, tasks)
        # The workers had read 0..2; then the broker deleted 0..6, the unread 3..6 with them.
        await commit_as_the_workers(broker.bootstrap, tp, 3)
        assert await committed_offset(broker.bootstrap, c.WORKER_GROUP, tp.topic) == 3
        assert broker.delete_records_before(tp.topic, 0, 7) == 7
        assert await log_start(broker.bootstrap, tp) == 7

        await redis.set(c.pace_rate_key(source), repr(RATE))
        await redis.sadd(c.INBOUND_SOURCES_SET, source)
        env = worker_env(broker, redis_url, s3_server, s3_bucket)
        worker = CrawlerProcess("worker", env, tmp_path / "worker.log")
        try:
            lost = worker.wait_for_event("urls_lost", 90)
            assert lost["level"] == "warning"
            assert (lost["source"], lost["topic"], lost["partition"]) == (source, tp.topic, 0)
            assert (lost["count"], lost["committed"], lost["log_start"]) == (4, 3, 7)

            async def counted() -> bool:
                return await redis.get(c.urls_lost_key(source)) == "4"

            await wait_for(counted, 10, what="urls_lost:expiring counted")
            # The rest of the queue is crawled, and committed past.
            rotten = await read_topic(broker.bootstrap, c.LINK_ROT_TOPIC, min_messages=3)
            assert sorted(c.LinkRotMessage.from_json(m).identifier for m in rotten) == [
                "u7",
                "u8",
                "u9",
            ]

            async def all_committed() -> bool:
                return await committed_offset(broker.bootstrap, c.WORKER_GROUP, tp.topic) == 10

            await wait_for(all_committed, 30, what="the queue committed to its end")
            worker.signal(signal.SIGTERM)
            assert worker.wait(60) == 0
            assert len(worker.events("urls_lost")) == 1
        finally:
            worker.stop()
    finally:
        broker.stop()


async def test_records_deleted_while_a_worker_waits_are_counted_when_it_reads_on(
    redis, redis_url, s3_server, s3_bucket, origin, tmp_path: Path
):
    create_bucket(s3_server.endpoint_url, "tansu-retention-drift")
    broker = S3StoredBroker(s3_server, "tansu-retention-drift", log_dir=tmp_path / "kafka")
    broker.start()
    source, tp = "drifting", TopicPartition("urls.drifting", 0)
    try:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(tp.topic, 1, 1)])
        finally:
            await admin.close()
        tasks = [
            c.SourceTask(url=origin.url(f"/gone/{i}.jpg"), uuid=f"d{i}").to_json()
            for i in range(10)
        ]
        await produce_one_batch_each(broker.bootstrap, tp.topic, tasks)
        # No pacing rate yet: the worker takes its one slot's worth (MAX_TASKS 4 gives a
        # source at most a quarter: 1), the first URL, and waits for a token.
        await redis.sadd(c.INBOUND_SOURCES_SET, source)
        env = worker_env(broker, redis_url, s3_server, s3_bucket, MAX_TASKS=4, LOG_LEVEL="DEBUG")
        worker = CrawlerProcess("worker", env, tmp_path / "worker.log")
        try:
            started = worker.wait_for_event("task_started", 90)
            assert (started["source"], started["offset"]) == (source, 0)
            # Meanwhile the broker deletes 0..5: 1..5 were never read.
            assert broker.delete_records_before(tp.topic, 0, 6) == 6
            await redis.set(c.pace_rate_key(source), repr(RATE))

            lost = worker.wait_for_event("urls_lost", 60)
            assert (lost["source"], lost["topic"], lost["partition"]) == (source, tp.topic, 0)
            assert (lost["count"], lost["position"], lost["log_start"]) == (5, 1, 6)

            async def counted() -> bool:
                return await redis.get(c.urls_lost_key(source)) == "5"

            await wait_for(counted, 10, what="urls_lost:drifting counted")
            rotten = await read_topic(broker.bootstrap, c.LINK_ROT_TOPIC, min_messages=5)
            assert sorted(c.LinkRotMessage.from_json(m).identifier for m in rotten) == [
                "d0",
                "d6",
                "d7",
                "d8",
                "d9",
            ]
            worker.signal(signal.SIGTERM)
            assert worker.wait(60) == 0
            assert len(worker.events("urls_lost")) == 1
        finally:
            worker.stop()
    finally:
        broker.stop()
