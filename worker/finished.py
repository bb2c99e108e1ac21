"""Finished work past the commit, kept in Redis, so that a rebalance does not do it again.

A worker commits a partition only up to its oldest unfinished message, and after every
rebalance each partition is read again from its commit (aiokafka's eager protocol rewinds
even the partitions that come back to the same worker). Everything finished past a slow
or waiting URL would be fetched again. So at each commit the worker also writes, for each
partition, the offsets it finished past the offset it commits, and whoever is assigned
the partition next reads them and counts those messages finished without running them,
as StormCrawler and Heritrix consult a status per URL and Confluent's Parallel Consumer
reads the commit's metadata (which tansu returns empty, so Redis it is).

One sorted set a partition (``contract.finished_key``): member ``{offset}:{crc32}``,
score the offset. The CRC is of the message's value: a message is skipped only if the
one read at that offset is the one that was finished, so a topic deleted and made again
(its offsets from 0 anew) never has a URL skipped unseen. Entries below the committed
offset are removed after each commit; the key expires FINISHED_TTL_S after its last
write, so that a partition no worker owns any more leaves nothing behind. Losing the set
(Redis flushed, away, expired) costs work done again, never a URL.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from typing import Final

from aiokafka import TopicPartition
from redis import asyncio as aioredis

from image_crawler import contract

# A partition's set outlives its last write by this long: a URL may wait days for its
# host, and a set expired meanwhile costs only the work redone.
FINISHED_TTL_S: Final = 14 * 24 * 3600


def fingerprint(value: bytes | None) -> int:
    """The CRC-32 of a message's value (0 for none)."""
    return zlib.crc32(value or b"")


def _member(offset: int, crc: int) -> str:
    return f"{offset}:{crc:08x}"


def _parsed(member: bytes | str) -> tuple[int, int] | None:
    text = member.decode() if isinstance(member, bytes) else member
    offset, _, crc = text.partition(":")
    try:
        return int(offset), int(crc, 16)
    except ValueError:
        return None  # not ours (a hand-written member): ignored


class FinishedLedger:
    """Reads and writes the finished offsets of partitions. Every method raises
    ``RedisError``; the scheduler carries on without them."""

    def __init__(self, redis: aioredis.Redis, ttl_s: int = FINISHED_TTL_S) -> None:
        self._redis = redis
        self._ttl_s = ttl_s

    async def record(self, finished: Mapping[TopicPartition, Iterable[tuple[int, int]]]) -> None:
        """Add (offset, crc) pairs, one round trip for all partitions."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for tp, entries in finished.items():
                mapping = {_member(o, crc): o for o, crc in entries}
                if mapping:
                    key = contract.finished_key(tp.topic, tp.partition)
                    pipe.zadd(key, mapping)
                    pipe.expire(key, self._ttl_s)
            await pipe.execute()

    async def trim(self, committed: Mapping[TopicPartition, int]) -> None:
        """Drop the entries below each partition's committed offset."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for tp, offset in committed.items():
                pipe.zremrangebyscore(
                    contract.finished_key(tp.topic, tp.partition), "-inf", f"({offset}"
                )
            await pipe.execute()

    async def load(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, dict[int, int]]:
        """Each partition's finished offsets and their CRCs (partitions with none left out)."""
        tps = list(partitions)
        async with self._redis.pipeline(transaction=False) as pipe:
            for tp in tps:
                pipe.zrange(contract.finished_key(tp.topic, tp.partition), 0, -1)
            replies = await pipe.execute()
        loaded: dict[TopicPartition, dict[int, int]] = {}
        for tp, members in zip(tps, replies, strict=True):
            pairs = [p for m in members if (p := _parsed(m)) is not None]
            if pairs:
                loaded[tp] = dict(pairs)
        return loaded
