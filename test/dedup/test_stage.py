"""The stage's loop with fake clients: what it publishes and commits, what it passes over,
and that a crash between any two steps costs no answer (dedup/stage.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest
from aiokafka import TopicPartition

from dedup.journal import Journal
from dedup.placement import Placer
from dedup.settings import DedupSettings
from dedup.stage import Stage
from image_crawler import contract as c
from image_crawler.config import ConfigError
from test.dedup.test_placement import corpus

TP = TopicPartition(c.METADATA_TOPIC, 0)


@dataclasses.dataclass
class Record:
    topic: str
    partition: int
    offset: int
    value: bytes


class FakeConsumer:
    def __init__(self) -> None:
        self.commits: list[dict[TopicPartition, int]] = []

    async def getmany(self, *partitions, timeout_ms=0, max_records=None):
        return {}

    async def commit(self, offsets):
        self.commits.append(dict(offsets))


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []

    async def send(self, topic, value, key=None):
        self.sent.append((topic, key, value))
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def resolution(image) -> bytes:
    """The resolution message a worker would publish of ``image``."""
    message = c.ResolutionMessage(
        image.identifier,
        image.width,
        image.height,
        1000,
        90,
        sha256=image.sha256,
        phash=image.phash,
        source=image.source,
    )
    return message.to_json()


def records(images, start=0):
    return [
        Record(c.METADATA_TOPIC, 0, start + n, resolution(image)) for n, image in enumerate(images)
    ]


def stage(tmp_path):
    journal = Journal(tmp_path / "state")
    consumer, producer = FakeConsumer(), FakeProducer()
    return Stage(consumer, producer, journal, Placer(journal.load(radius=4))), consumer, producer


def published(producer):
    return [c.DuplicateMessage.from_json(value) for _topic, _key, value in producer.sent]


async def test_each_image_is_published_once_keyed_by_it_and_the_batch_committed(tmp_path):
    images = corpus(random.Random(1), 50)
    batch = records(images)
    exif = c.ExifMessage(images[0].identifier, {"0x13b": "Ann"}).to_json()
    batch.insert(3, Record(c.METADATA_TOPIC, 0, 3, exif))
    batch.insert(5, Record(c.METADATA_TOPIC, 0, 5, b"{not json"))
    batch.insert(6, Record(c.METADATA_TOPIC, 0, 6, b'{"identifier": "x"}'))
    for n, record in enumerate(batch):
        record.offset = n
    s, consumer, producer = stage(tmp_path)
    await s.handle({TP: batch})
    out = published(producer)
    assert [m.identifier for m in out] == [i.identifier for i in images]
    assert [key for _t, key, _v in producer.sent] == [i.identifier.encode() for i in images]
    assert {t for t, _k, _v in producer.sent} == {c.DUPLICATES_TOPIC}
    assert consumer.commits == [{TP: len(batch)}]
    assert s.unparseable == 2
    assert sum(s.placed.values()) == 50 and s.placed["near"] + s.placed["exact"] > 0
    near = next(m for m in out if m.kind == "near")
    assert (near.source, near.duplicate_of_source) == ("museum", "museum")


async def test_a_crash_after_publishing_and_before_the_commit_gives_the_same_answers(tmp_path):
    images = corpus(random.Random(2), 120)
    first, _consumer, producer = stage(tmp_path)
    await first.handle({TP: records(images[:60])})
    await first.handle({TP: records(images[60:], start=60)})
    # Restarted from the journal, the input read again from an older commit.
    again, _consumer, replayed = stage(tmp_path)
    await again.handle({TP: records(images)})
    assert published(replayed) == published(producer)


async def test_a_journal_that_cannot_be_written_publishes_and_commits_nothing(
    tmp_path, monkeypatch
):
    s, consumer, producer = stage(tmp_path)

    def full(index):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(s._journal, "append", full)
    with pytest.raises(OSError):
        await s.handle({TP: records(corpus(random.Random(3), 10))})
    assert producer.sent == [] and consumer.commits == []


def test_a_radius_past_10_bits_is_refused_with_its_name():
    assert DedupSettings.from_env({"DEDUP_RADIUS": "6"}).radius == 6
    with pytest.raises(ConfigError, match="DEDUP_RADIUS"):
        DedupSettings.from_env({"DEDUP_RADIUS": "11"})
