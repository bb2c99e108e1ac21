"""The splitter of ``python -m crawl_monitor`` against a real broker and redis-server."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import types
from collections import Counter

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaTimeoutError
from redis.asyncio import Redis
from structlog.testing import capture_logs

from crawl_monitor.splitter import (
    TOPIC_ALREADY_EXISTS,
    Rejected,
    Split,
    Splitter,
    TopicCreator,
    route,
)
from image_crawler import contract as c
from test.harness.processes import CrawlerProcess, committed_offset
from test.harness.services import create_topics, produce, read_records, wait_for


def inbound(url: str, uuid: str, source: str, **extra) -> bytes:
    return json.dumps({"url": url, "uuid": uuid, "source": source, **extra}).encode()


def test_route_table():
    assert route(inbound("http://a/1.jpg", "u1", "Flickr")) == Split(
        "flickr", c.SourceTask("http://a/1.jpg", "u1")
    )
    assert route(inbound("http://a/1.jpg", "u1", "met", attempts=1)) == Split(
        "met", c.SourceTask("http://a/1.jpg", "u1", attempts=1)
    )
    # A re-check keeps what the earlier crawl saw.
    assert route(inbound("http://a/1.jpg", "u1", "met", etag='"e"', sha256="a" * 64)) == Split(
        "met", c.SourceTask("http://a/1.jpg", "u1", earlier=c.Earlier(etag='"e"', sha256="a" * 64))
    )
    for raw in [
        None,
        b"",
        b"{not json",
        b"[1, 2]",
        b'"flickr"',
        b'{"url": "http://a/1.jpg", "source": "flickr"}',
        inbound("", "u1", "flickr"),
        inbound("http://a/1.jpg", "u1", "flickr", etag='"e"\r\nX-Evil: 1'),
        inbound("http://a/1.jpg", "u1", ""),
        inbound("http://a/1.jpg", "u1", "two words"),
        inbound("http://a/1.jpg", "u1", "a/b"),
        inbound("http://a/1.jpg", "u1", "x" * 300),
        inbound("http://a/1.jpg", "u1", "flickr", attempts=-1),
        inbound("http://a/1.jpg", "u1", "flickr", attempts="1"),
        inbound("http://a/1.jpg", "u1", "flickr", attempts=True),
        b"42",
        b"null",
        b"\xff\xfe{",
        b'{"uuid": "u1", "source": "flickr"}',
        b'{"url": "http://a/1.jpg", "uuid": "u1"}',
        inbound("http://a/1.jpg", "u1", "   "),
        inbound("http://a/1.jpg", 7, "flickr"),
        inbound("http://a/1.jpg", "u1", ["flickr"]),
        inbound("http://a/1.jpg", "u1", "x" * (c.MAX_SOURCE_NAME_LENGTH + 1)),
        inbound("http://a/1.jpg", "u1", "mus\u00e9e"),
        inbound("http://a/1.jpg", "u1", "a\nb"),
        inbound("http://a/1.jpg", "u1", "a\u0000b"),
        # Lower-cased, the Kelvin sign would be "k": a different source's queue.
        inbound("http://a/1.jpg", "u1", "\u212a"),
        inbound("http://a/1.jpg", "u1", "\u0130stanbul"),
    ]:
        assert isinstance(route(raw), Rejected), raw
    # The longest name that still makes a legal topic name.
    assert isinstance(route(inbound("u", "i", "x" * c.MAX_SOURCE_NAME_LENGTH)), Split)
    # Dots alone are legal in a topic name once prefixed ("urls.."; Kafka refuses only
    # "." and ".." as whole names), so such a source is split like any other.
    assert route(inbound("u", "i", "..")) == Split("..", c.SourceTask("u", "i"))
    # Surrounding blanks are not part of the name.
    assert route(inbound("u", "i", " Met ")) == Split("met", c.SourceTask("u", "i"))


async def end_offsets(bootstrap: str, topic: str, messages: int) -> dict[int, int]:
    """Each partition's next offset, from reading the topic's ``messages`` messages.

    (tansu answers ListOffsets with a wrong latest offset, so it is not asked.)
    """
    records = await read_records(bootstrap, topic, min_messages=messages)
    assert len(records) == messages
    ends: dict[int, int] = {}
    for record in records:
        ends[record.partition] = max(ends.get(record.partition, 0), record.offset + 1)
    return ends


async def partition_count(bootstrap: str, topic: str) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        await consumer.topics()  # refresh the metadata
        return len(consumer.partitions_for_topic(topic) or ())
    finally:
        await consumer.stop()


async def all_committed(bootstrap: str, ends: dict[int, int]) -> bool:
    for partition, end in ends.items():
        if await committed_offset(bootstrap, c.SPLITTER_GROUP, c.INBOUND_TOPIC, partition) != end:
            return False
    return True


async def test_split_messages_counters_dead_letters_and_commits(kafka, redis, redis_url, tmp_path):
    await create_topics(kafka.bootstrap, [c.INBOUND_TOPIC], partitions=2)
    good = [
        inbound("http://f/1.jpg", "f1", "Flickr"),
        inbound("http://f/2.jpg", "f2", "FLICKR", attempts=1),
        inbound("http://f/3.jpg", "f3", "flickr"),
        inbound("http://m/1.jpg", "m1", "MET"),
        inbound("http://x/1.jpg", "x1", "Museum.Of_Things-2"),
    ]
    bad = [
        b"not json {",
        b"[1, 2, 3]",
        b'{"url": "http://f/4.jpg", "source": "flickr"}',
        inbound("http://f/5.jpg", "", "flickr"),
        inbound("http://f/6.jpg", "s1", "two words"),
        inbound("http://f/7.jpg", "s2", "a/b"),
        inbound("http://f/8.jpg", "s3", "y" * 300),
    ]
    mixed = [good[0], bad[0], good[1], bad[1], bad[2], good[2], bad[3], good[3]]
    mixed += [bad[4], bad[5], good[4], bad[6]]
    await produce(kafka.bootstrap, c.INBOUND_TOPIC, mixed)
    ends = await end_offsets(kafka.bootstrap, c.INBOUND_TOPIC, len(mixed))
    assert sum(ends.values()) == len(mixed)

    env = {
        **kafka.env,
        "REDIS_URL": redis_url,
        "SOURCE_TOPIC_PARTITIONS": "2",
        "SPLITTER_BATCH_SIZE": "3",
        "LOG_FREQUENCY_S": "1",
    }
    monitor = CrawlerProcess("crawl_monitor", env, tmp_path / "monitor.log")
    try:
        await wait_for(
            lambda: all_committed(kafka.bootstrap, ends), 60, what="inbound offsets committed"
        )
        # Only now does the test touch the per-source topics (a consumer asking for a
        # topic makes tansu create it with 4 partitions): the splitter made them, with
        # its own partition count.
        for topic in ["urls.flickr", "urls.met", "urls.museum.of_things-2"]:
            assert await partition_count(kafka.bootstrap, topic) == 2, topic
        assert sorted(e["topic"] for e in monitor.events("topic_created")) == [
            "urls.flickr",
            "urls.met",
            "urls.museum.of_things-2",
        ]

        flickr = await read_records(kafka.bootstrap, "urls.flickr", min_messages=3)
        assert sorted((r.key, json.loads(r.value)) for r in flickr) == [
            (b"f1", {"url": "http://f/1.jpg", "uuid": "f1"}),
            (b"f2", {"url": "http://f/2.jpg", "uuid": "f2", "attempts": 1}),
            (b"f3", {"url": "http://f/3.jpg", "uuid": "f3"}),
        ]
        (met,) = await read_records(kafka.bootstrap, "urls.met", min_messages=1)
        assert (met.key, json.loads(met.value)) == (b"m1", {"url": "http://m/1.jpg", "uuid": "m1"})
        (things,) = await read_records(kafka.bootstrap, "urls.museum.of_things-2", min_messages=1)
        assert json.loads(things.value)["uuid"] == "x1"

        dead = await read_records(
            kafka.bootstrap, c.CRAWL_ERRORS_TOPIC, min_messages=len(bad), timeout_s=30
        )
        letters = [c.UnparseableMessage.from_json(r.value) for r in dead]
        assert sorted(letter.raw for letter in letters) == sorted(raw.decode() for raw in bad)
        assert {letter.topic for letter in letters} == {c.INBOUND_TOPIC}
        assert all(letter.error for letter in letters)

        assert await redis.smembers(c.INBOUND_SOURCES_SET) == {
            "flickr",
            "met",
            "museum.of_things-2",
        }
        assert await redis.get(c.NUM_SPLIT) == str(len(good))
        assert await redis.get(c.NUM_MALFORMED) == str(len(bad))
        malformed = monitor.events("malformed_message")
        assert len(malformed) == len(bad)
        assert Counter(e["topic"] for e in malformed) == {c.INBOUND_TOPIC: len(bad)}

        # The splitter keeps going: a retry arrives later and is split too.
        await produce(
            kafka.bootstrap, c.INBOUND_TOPIC, [inbound("http://m/2.jpg", "m2", "met", attempts=1)]
        )
        met = await read_records(kafka.bootstrap, "urls.met", min_messages=2)
        assert {json.loads(r.value)["uuid"] for r in met} == {"m1", "m2"}
        ends = await end_offsets(kafka.bootstrap, c.INBOUND_TOPIC, len(mixed) + 1)
        await wait_for(lambda: all_committed(kafka.bootstrap, ends), 30, what="commit of m2")
        assert await redis.get(c.NUM_SPLIT) == str(len(good) + 1)

        monitor.signal(signal.SIGTERM)
        assert await asyncio.to_thread(monitor.wait, 30) == 0, monitor.tail()
        (stopped,) = monitor.events("splitter_stopped")
        assert stopped["split"] == len(good) + 1
        assert stopped["malformed"] == len(bad)
        assert monitor.events("monitor_stopped")
        assert not monitor.events("splitter_error")
        assert not monitor.events("loop_crashed")
    finally:
        monitor.stop()


# --- the commit protocol, in-process: fake Kafka clients, real Redis ------------------------


@dataclasses.dataclass
class Record:
    offset: int
    value: bytes | None


class FakeConsumer:
    """The slice of AIOKafkaConsumer the splitter uses, over in-memory partitions."""

    def __init__(self, partitions: dict[TopicPartition, list[bytes]]) -> None:
        self.log = partitions
        self.position = dict.fromkeys(partitions, 0)
        self.committed: dict[TopicPartition, int] = {}
        self.seeks: list[tuple[TopicPartition, int]] = []

    async def getmany(self, timeout_ms=0, max_records=None):
        batch, budget = {}, max_records or 1_000_000
        for tp, values in self.log.items():
            start = self.position[tp]
            taken = values[start : start + budget]
            if taken:
                batch[tp] = [Record(start + i, v) for i, v in enumerate(taken)]
                self.position[tp] += len(taken)
                budget -= len(taken)
            if not budget:
                break
        if not batch:
            await asyncio.sleep(timeout_ms / 1000)
        return batch

    def assignment(self):
        return set(self.log)

    def seek(self, tp, offset):
        self.seeks.append((tp, offset))
        self.position[tp] = offset

    async def commit(self, offsets):
        self.committed.update(offsets)


class FakeProducer:
    """Acknowledges sends once ``acks`` is set; the first ``failures`` acks fail."""

    def __init__(self, journal: list[str], failures: int = 0) -> None:
        self.journal = journal
        self.sent: list[tuple[str, bytes | None, bytes]] = []
        self.acks = asyncio.Event()
        self.acks.set()
        self.failures = failures

    async def send(self, topic, value, key=None):
        self.journal.append(f"send {topic}")
        self.sent.append((topic, key, value))
        ack = asyncio.get_running_loop().create_future()
        fail = self.failures > 0
        self.failures -= fail

        async def settle():
            await self.acks.wait()
            if fail:
                ack.set_exception(KafkaTimeoutError())
            else:
                ack.set_result(None)

        self._settling = asyncio.create_task(settle())
        return ack


class FakeTopics:
    def __init__(self, journal: list[str], refused: dict[str, str] | None = None) -> None:
        self.journal = journal
        self.refused = refused or {}

    async def ensure(self, topics):
        topics = list(topics)
        for topic in topics:
            self.journal.append(f"create {topic}")
        return {t: self.refused[t] for t in topics if t in self.refused}


INBOUND = [TopicPartition(c.INBOUND_TOPIC, 0), TopicPartition(c.INBOUND_TOPIC, 1)]


def two_partitions() -> dict[TopicPartition, list[bytes]]:
    return {
        INBOUND[0]: [inbound("http://a/1", "a1", "A"), b"junk", inbound("http://b/1", "b1", "b")],
        INBOUND[1]: [inbound("http://a/2", "a2", "a"), inbound("http://a/3", "a3", "a")],
    }


def run_splitter(consumer, producer, topics, redis, stop) -> asyncio.Task[None]:
    splitter = Splitter(consumer, producer, redis, topics, batch_size=100, poll_timeout_s=0.01)
    return asyncio.create_task(splitter.run(stop))


async def test_a_batch_is_committed_after_its_acks_and_counts(redis):
    journal: list[str] = []
    consumer, producer = FakeConsumer(two_partitions()), FakeProducer(journal)
    producer.acks.clear()
    stop = asyncio.Event()
    task = run_splitter(consumer, producer, FakeTopics(journal), redis, stop)
    try:
        await wait_for(lambda: len(producer.sent) == 5, 5, what="every message sent")
        assert consumer.committed == {}
        assert await redis.get(c.NUM_SPLIT) is None  # not before the acks
        producer.acks.set()
        await wait_for(lambda: consumer.committed == {INBOUND[0]: 3, INBOUND[1]: 2}, 5)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
    # Each topic is created before anything is sent to it.
    assert journal.index("create urls.a") < journal.index("send urls.a")
    assert journal.index("create urls.b") < journal.index("send urls.b")
    assert sorted(t for t, _, _ in producer.sent) == [
        c.CRAWL_ERRORS_TOPIC,
        "urls.a",
        "urls.a",
        "urls.a",
        "urls.b",
    ]
    assert await redis.smembers(c.INBOUND_SOURCES_SET) == {"a", "b"}
    assert await redis.get(c.NUM_SPLIT) == "4"
    assert await redis.get(c.NUM_MALFORMED) == "1"


async def test_a_failed_ack_sends_the_batch_again(redis):
    journal: list[str] = []
    consumer, producer = FakeConsumer(two_partitions()), FakeProducer(journal, failures=1)
    stop = asyncio.Event()
    with capture_logs() as logs:
        task = run_splitter(consumer, producer, FakeTopics(journal), redis, stop)
        try:
            await wait_for(lambda: consumer.committed == {INBOUND[0]: 3, INBOUND[1]: 2}, 5)
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)
    assert [e["event"] for e in logs if e["log_level"] == "warning"].count("kafka_unavailable") == 1
    assert set(consumer.seeks) == {(INBOUND[0], 0), (INBOUND[1], 0)}
    assert len(producer.sent) == 10  # at least once: the whole batch again
    assert await redis.get(c.NUM_SPLIT) == "4"  # counted once, when acknowledged


async def test_no_commit_while_redis_is_away(fresh_redis_server):
    redis = Redis.from_url(
        fresh_redis_server.url, decode_responses=True, socket_timeout=1, socket_connect_timeout=1
    )
    journal: list[str] = []
    consumer, producer = FakeConsumer(two_partitions()), FakeProducer(journal)
    stop = asyncio.Event()
    fresh_redis_server.kill()
    with capture_logs() as logs:
        task = run_splitter(consumer, producer, FakeTopics(journal), redis, stop)
        try:
            await wait_for(lambda: [e for e in logs if e["event"] == "redis_unavailable"], 5)
            assert consumer.committed == {}
            fresh_redis_server.restart()
            await wait_for(lambda: consumer.committed == {INBOUND[0]: 3, INBOUND[1]: 2}, 10)
            assert await redis.smembers(c.INBOUND_SOURCES_SET) == {"a", "b"}

            # Stopping while Redis is away leaves the batch uncommitted (split again later).
            fresh_redis_server.kill()
            consumer.log[INBOUND[1]].append(inbound("http://c/1", "c1", "c"))
            seen = len(logs)
            await wait_for(lambda: [e for e in logs[seen:] if e["event"] == "redis_unavailable"], 5)
            stop.set()
            await asyncio.wait_for(task, 5)
            assert consumer.committed == {INBOUND[0]: 3, INBOUND[1]: 2}
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)
            await redis.aclose()


async def test_a_topic_kafka_refuses_for_good_dead_letters_its_messages(redis):
    # E.g. a real cluster refusing "urls.a_b" because "urls.a.b" exists (their metric
    # names collide): sending would fail forever and stop the partition.
    journal: list[str] = []
    consumer, producer = FakeConsumer(two_partitions()), FakeProducer(journal)
    refused = {"urls.b": "InvalidTopicError: collides with existing topic"}
    stop = asyncio.Event()
    with capture_logs() as logs:
        task = run_splitter(consumer, producer, FakeTopics(journal, refused), redis, stop)
        try:
            await wait_for(lambda: consumer.committed == {INBOUND[0]: 3, INBOUND[1]: 2}, 5)
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)
    assert sorted(t for t, _, _ in producer.sent) == [
        c.CRAWL_ERRORS_TOPIC,
        c.CRAWL_ERRORS_TOPIC,
        "urls.a",
        "urls.a",
        "urls.a",
    ]
    letters = [
        c.UnparseableMessage.from_json(v) for t, _, v in producer.sent if t == c.CRAWL_ERRORS_TOPIC
    ]
    (refusal,) = [letter for letter in letters if "refused" in letter.error]
    assert "urls.b" in refusal.error and "collides" in refusal.error
    assert c.InboundImage.from_json(refusal.raw).uuid == "b1"
    assert await redis.get(c.NUM_SPLIT) == "3"
    assert await redis.get(c.NUM_MALFORMED) == "2"
    assert await redis.smembers(c.INBOUND_SOURCES_SET) == {"a"}
    assert len([e for e in logs if e["event"] == "malformed_message"]) == 2


class FakeAdmin:
    """Answers CreateTopics with the given error code per topic (0 when not listed), and
    DescribeConfigs with the given settings per topic (an int: that error code)."""

    def __init__(self, codes: dict[str, int], configs=None, describe_error=None) -> None:
        self.codes = codes
        self.configs: dict[str, dict[str, str] | int] = configs or {}
        self.describe_error = describe_error
        self.asked: list[list[str]] = []
        self.topic_configs: dict[str, dict[str, str]] = {}
        self.described: list[tuple[str, object]] = []

    async def create_topics(self, new_topics):
        names = [t.name for t in new_topics]
        self.asked.append(names)
        self.topic_configs.update({t.name: t.topic_configs for t in new_topics})
        return types.SimpleNamespace(
            topic_errors=[(n, self.codes.get(n, 0), f"code {self.codes.get(n, 0)}") for n in names]
        )

    async def describe_configs(self, resources):
        if self.describe_error is not None:
            raise self.describe_error
        self.described += [(r.name, r.configs) for r in resources]
        answers = []
        for r in resources:
            configs = self.configs.get(r.name, {})
            if isinstance(configs, int):
                answers.append((configs, "refused", 2, r.name, []))
            else:
                entries = [(k, v, False, 1, False, []) for k, v in configs.items()]
                answers.append((0, None, 2, r.name, entries))
        return [types.SimpleNamespace(resources=answers)]


async def test_only_a_name_kafka_refuses_is_final():
    admin = FakeAdmin(
        {
            "urls.a_b": 17,  # InvalidTopicError: collides with urls.a.b
            "urls.locked": 29,  # TopicAuthorizationFailed: may exist, producing may work
            "urls.old": 36,  # TopicAlreadyExists
            "urls.busy": 41,  # NotController: retriable
        }
    )
    creator = TopicCreator(admin, partitions=2, replication_factor=1)
    topics = ["urls.a_b", "urls.locked", "urls.old", "urls.busy", "urls.new"]
    with capture_logs() as logs:
        refused = await creator.ensure(topics)
    assert refused == {"urls.a_b": "InvalidTopicError: code 17"}
    (failed,) = [e for e in logs if e["event"] == "topic_create_failed"]
    assert failed["errors"] == {"urls.a_b": 17, "urls.locked": 29, "urls.busy": 41}
    assert [e["topic"] for e in logs if e["event"] == "topic_created"] == ["urls.new"]
    # Created or existing topics are not asked for again; the others are.
    await creator.ensure(topics)
    assert admin.asked[-1] == ["urls.a_b", "urls.busy", "urls.locked"]


def creator(admin: FakeAdmin, **retention_ms: int) -> TopicCreator:
    return TopicCreator(admin, partitions=2, replication_factor=1, **retention_ms)


async def test_topics_are_created_with_the_configured_retention():
    admin = FakeAdmin({})
    await creator(admin).ensure(["urls.a"])
    # The default never deletes: neither by age nor by size.
    assert admin.topic_configs["urls.a"] == {"retention.ms": "-1", "retention.bytes": "-1"}
    with capture_logs() as logs:
        await creator(admin, retention_ms=86_400_000).ensure(["urls.b"])
    assert admin.topic_configs["urls.b"] == {"retention.ms": "86400000", "retention.bytes": "-1"}
    (created,) = [e for e in logs if e["event"] == "topic_created"]
    assert (created["topic"], created["retention_ms"]) == ("urls.b", 86_400_000)
    assert admin.described == []  # nothing existed: nothing to check


@pytest.mark.parametrize(
    ("configured_ms", "existing", "warned"),
    [
        (-1, {"retention.ms": "604800000"}, True),  # Apache Kafka's default, 7 days
        (-1, {"retention.ms": "-1"}, False),
        (-1, {"retention.ms": "-1", "retention.bytes": "1073741824"}, True),
        (-1, {}, False),  # not reported (tansu reports only what was set): nothing to say
        (86_400_000, {"retention.ms": "604800000"}, False),  # keeps longer than asked
        (604_800_000, {"retention.ms": "86400000"}, True),
    ],
)
async def test_an_existing_topic_that_deletes_sooner_is_a_warning(configured_ms, existing, warned):
    admin = FakeAdmin({"urls.old": TOPIC_ALREADY_EXISTS}, {"urls.old": existing})
    topics = creator(admin, retention_ms=configured_ms)
    with capture_logs() as logs:
        assert await topics.ensure(["urls.old"]) == {}
    assert admin.described == [("urls.old", None)]  # every setting
    found = [e for e in logs if e["event"] == "topic_retention_finite"]
    assert bool(found) == warned
    if warned:
        (event,) = found
        assert event["topic"] == "urls.old" and event["log_level"] == "warning"
        assert event["configured_retention_ms"] == configured_ms
        assert event["retention_ms"] == int(existing["retention.ms"])
    # Checked once per process, like the creation.
    await topics.ensure(["urls.old"])
    assert len(admin.described) == 1


async def test_settings_that_cannot_be_read_are_logged_and_splitting_goes_on():
    admin = FakeAdmin(
        {"urls.x": TOPIC_ALREADY_EXISTS, "urls.y": TOPIC_ALREADY_EXISTS},
        {"urls.x": 29},  # TopicAuthorizationFailed
    )
    with capture_logs() as logs:
        assert await creator(admin).ensure(["urls.x", "urls.y"]) == {}
    unreadable = [e for e in logs if e["event"] == "topic_config_unreadable"]
    assert [(e["topic"], e["error_code"]) for e in unreadable] == [("urls.x", 29)]

    admin = FakeAdmin({"urls.z": TOPIC_ALREADY_EXISTS}, describe_error=KafkaTimeoutError())
    with capture_logs() as logs:
        assert await creator(admin).ensure(["urls.z"]) == {}
    assert [e["event"] for e in logs] == ["topic_config_unreadable"]
