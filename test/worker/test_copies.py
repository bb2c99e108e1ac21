"""The digests of messages crawled lately, in Redis (worker.copies)."""

from __future__ import annotations

import time

from aiokafka import TopicPartition

from image_crawler.contract import crawled_key
from worker.copies import CrawledLedger, digest

A0 = TopicPartition("urls.a", 0)
A1 = TopicPartition("urls.a", 1)


async def test_a_digest_recorded_is_seen_in_its_partition_only(fake_redis):
    ledger = CrawledLedger(fake_redis, window_s=600)
    one, two, other = digest(b"one"), digest(b"two"), digest(b"other")
    await ledger.record({A0: [one, two]})
    assert await ledger.seen({A0: [one, other, two], A1: [one]}) == {A0: {one, two}}
    assert await ledger.seen({A0: []}) == {}


async def test_digests_older_than_the_window_are_not_seen_and_go_at_the_next_write(fake_redis):
    ledger = CrawledLedger(fake_redis, window_s=600)
    old, new = digest(b"old"), digest(b"new")
    key = crawled_key(A0.topic, A0.partition)
    await fake_redis.zadd(key, {old: int((time.time() - 601) * 1000)})
    assert await ledger.seen({A0: [old]}) == {}
    await ledger.record({A0: [new]})
    assert await fake_redis.zrange(key, 0, -1) == [new]
    assert 0 < await fake_redis.pttl(key) <= 600_000


def test_a_digest_is_of_the_whole_message():
    assert digest(b'{"uuid": "u", "attempts": 0}') != digest(b'{"uuid": "u", "attempts": 1}')
    assert len(digest(None)) == 16 and digest(None) == digest(b"")
