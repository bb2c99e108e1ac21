"""The placement counts: each placement counted once, whatever is read again after a
crash; saved with the offsets they cover; copied to Redis as absolute values, and Redis
away neither stops the stage nor loses a count (dedup/counts.py)."""

from __future__ import annotations

import asyncio
import random

import fakeredis
from redis.exceptions import ConnectionError as RedisConnectionError

from dedup.counts import COUNTS, PlacementCounts, RedisCopy
from dedup.journal import Journal
from dedup.placement import Placer
from dedup.stage import Stage
from image_crawler import contract as c
from test.dedup.test_placement import corpus
from test.dedup.test_stage import TP, FakeConsumer, FakeProducer, records
from test.harness.services import wait_for


def by_kind(fields: dict[str, int]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for field, n in fields.items():
        kind = c.source_and_kind(field)[1]
        totals[kind] = totals.get(kind, 0) + n
    return totals


def test_an_offset_counted_is_not_counted_again_after_a_restart(tmp_path):
    counts = PlacementCounts(tmp_path)
    assert counts.count(0, 0, "flickr", "near") == "flickr:near"
    assert counts.count(0, 1, "flickr", "near") == "flickr:near"
    counts.counted_to(0, 2)
    counts.save()
    again = PlacementCounts(tmp_path)
    assert again.found and again.counts == {"flickr:near": 2}
    assert again.count(0, 1, "flickr", "near") is None  # read again from an older commit
    assert again.count(1, 1, "flickr", "near") == "flickr:near"  # another partition
    assert again.count(0, 2, "met", "unique") == "met:unique"
    assert again.counts == {"flickr:near": 3, "met:unique": 1}


def test_a_damaged_file_starts_the_counts_again_rather_than_stop(tmp_path):
    (tmp_path / COUNTS).write_text("{not json")
    counts = PlacementCounts(tmp_path)
    assert counts.counts == {} and counts.count(0, 0, "a", "exact") == "a:exact"


def stage(tmp_path, redis=None):
    journal = Journal(tmp_path / "state")
    consumer, producer = FakeConsumer(), FakeProducer()
    return Stage(consumer, producer, journal, Placer(journal.load(radius=4)), redis)


async def test_a_crash_before_the_commit_counts_each_placement_once(tmp_path):
    images = corpus(random.Random(5), 120)
    first = stage(tmp_path)
    await first.handle({TP: records(images[:60])})
    await first.handle({TP: records(images[60:], start=60)})
    counted = dict(first.counts.counts)
    assert sum(counted.values()) == 120 and by_kind(counted)["unique"] < 120
    # Restarted; the input read again from offset 0, then 20 new images.
    again = stage(tmp_path)
    more = corpus(random.Random(6), 20)
    await again.handle({TP: records(images)})
    assert again.counts.counts == counted
    await again.handle({TP: records(more, start=120)})
    assert sum(again.counts.counts.values()) == 140


async def test_the_counts_land_in_redis_as_absolute_values_and_survive_an_outage(tmp_path):
    redis = fakeredis.FakeAsyncRedis(decode_responses=True)
    s = stage(tmp_path, redis)
    assert s.redis_copy is not None
    images = corpus(random.Random(7), 60)
    await s.handle({TP: records(images[:30])})
    assert await s.redis_copy.write()
    assert await redis.hgetall(c.PLACEMENTS_HASH) == {f: str(n) for f, n in s.counts.counts.items()}

    async def away(*args, **kwargs):
        raise RedisConnectionError("Connection refused")

    # Redis away: the batch goes through, the write fails and keeps what it had to write.
    real = s.redis_copy._hset
    s.redis_copy._hset = away  # type: ignore[method-assign]
    await s.handle({TP: records(images[30:], start=30)})
    assert not await s.redis_copy.write()
    assert sum(s.counts.counts.values()) == 60
    await redis.flushall()  # and back empty
    s.redis_copy._hset = real  # type: ignore[method-assign]
    assert await s.redis_copy.write()
    assert await redis.hgetall(c.PLACEMENTS_HASH) == {f: str(n) for f, n in s.counts.counts.items()}
    # A restarted stage writes the same numbers, not more.
    again = stage(tmp_path, redis)
    await again.handle({TP: records(images)})
    assert again.redis_copy is not None and await again.redis_copy.write()
    assert sum(int(v) for v in (await redis.hgetall(c.PLACEMENTS_HASH)).values()) == 60
    await redis.aclose()


async def test_the_copy_task_writes_after_a_batch_and_once_more_at_the_stop(tmp_path):
    redis = fakeredis.FakeAsyncRedis(decode_responses=True)
    counts = PlacementCounts(tmp_path)
    copy = RedisCopy(redis, counts.counts)
    stop = asyncio.Event()
    task = asyncio.create_task(copy.run(stop))
    counts.count(0, 0, "a", "near")
    copy.changed(["a:near"])

    async def written() -> bool:
        return await redis.hget(c.PLACEMENTS_HASH, "a:near") == "1"

    await wait_for(written, 5, 0.01, "the first write")
    counts.count(0, 1, "a", "near")
    copy.changed(["a:near"])
    stop.set()
    await asyncio.wait_for(task, 5)
    assert await redis.hget(c.PLACEMENTS_HASH, "a:near") == "2"
    await redis.aclose()
