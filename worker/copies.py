"""Copies of a message crawled a short while ago, skipped: a queue can hold one twice.

A worker queue (``urls.{source}``) may hold the same message at two offsets. A send the
broker stored but did not acknowledge in time (a paused broker, a lost connection) fails
at the sender, which sends it again: the splitter sends its whole batch again, the
producer of ``inbound_images`` its messages, and the broker stores both (tansu has no
idempotent producer; Apache Kafka's would drop a retry of aiokafka's own, never the
splitter's batch sent again). A monitor killed between its sends and its commit splits
its last batch again. In a fault campaign (seed 20261128, 1,838 uuids) the queues held
2,339 records: 413 uuids at two to seven offsets, every copy byte for byte the first,
written 0-231 s after it; they were most of the images the campaign requested twice.
Neither the commit nor the finished ledger (worker.finished) knows a copy: it is at
another offset.

So the worker writes, for each partition, a 64-bit BLAKE2b digest (in hex) of every
message it crawled to its end (published or dead-lettered; not one parked, which is a
copy still to be crawled) in a sorted set scored by the time, at each commit; and a
message read whose digest is there, written less than ``window_s`` ago, is counted
finished without being fetched. Copies are keyed as their first (the uuid), so they share
its partition: one set a partition, asked once per poll for every record it returned.
The scheduler also skips a copy of a message it read and has not ended yet (in the same
poll, or waiting for its host), as its first is bound to end (or be read again from the
commit, which cannot pass it); not one of a message being parked, whose copy is the one
to crawl and may be read before the broker acknowledges it.

A message sent twice on purpose is the same message: a feed that gives a uuid twice
within the window has it crawled once. A re-queued retry carries one more attempt, a
re-check its validators: neither is a copy of the message before it. Losing the set
(Redis flushed, away) costs the copies crawled again, never a URL. A message whose digest
is another's of its partition within the window would be skipped: with 20,000 digests
there, 1 message in 10^15 (20,000 / 2^64).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping, Sequence

from aiokafka import TopicPartition
from redis import asyncio as aioredis

from image_crawler import contract


def digest(value: bytes | None) -> str:
    """The 8-byte BLAKE2b digest of a message's value, in hex (as redis-cli shows it)."""
    return hashlib.blake2b(value or b"", digest_size=8).hexdigest()


class CrawledLedger:
    """Reads and writes the digests of the messages crawled lately, per partition. Every
    method raises ``RedisError``; the scheduler carries on without them."""

    def __init__(self, redis: aioredis.Redis, window_s: float) -> None:
        self._redis = redis
        self.window_s = window_s

    async def record(self, crawled: Mapping[TopicPartition, Iterable[str]]) -> None:
        """Add digests (scored now), and drop those older than the window; one round trip."""
        now_ms = int(time.time() * 1000)
        window_ms = int(self.window_s * 1000)
        async with self._redis.pipeline(transaction=False) as pipe:
            for tp, digests in crawled.items():
                mapping = dict.fromkeys(digests, now_ms)
                if mapping:
                    key = contract.crawled_key(tp.topic, tp.partition)
                    pipe.zadd(key, mapping)
                    pipe.zremrangebyscore(key, "-inf", f"({now_ms - window_ms}")
                    pipe.pexpire(key, window_ms)
            await pipe.execute()

    async def seen(
        self, read: Mapping[TopicPartition, Sequence[str]]
    ) -> dict[TopicPartition, set[str]]:
        """Which of the digests read were crawled within the window, per partition (those
        with none left out); one round trip."""
        tps = [tp for tp, digests in read.items() if digests]
        if not tps:
            return {}
        async with self._redis.pipeline(transaction=False) as pipe:
            for tp in tps:
                pipe.zmscore(contract.crawled_key(tp.topic, tp.partition), list(read[tp]))
            replies = await pipe.execute()
        since_ms = (time.time() - self.window_s) * 1000
        seen: dict[TopicPartition, set[str]] = {}
        for tp, scores in zip(tps, replies, strict=True):
            pairs = zip(read[tp], scores, strict=True)
            found = {d for d, score in pairs if score is not None and score >= since_ms}
            if found:
                seen[tp] = found
        return seen
