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

A revoke lets the requests on the wire end for a while (``revoke_wait_s``); those still
running then are marked in the same set, member ``{offset}:r{until}`` (``until`` in Unix
milliseconds): the partition's next owner holds such a message back until its old owner
ends it (finished: the marker gives way to the finished member, and it is skipped;
given up: the marker goes, and it runs) or ``until`` has passed, when the old owner has
given it up. A worker that does not know markers reads them as members not its own.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable, Mapping
from typing import Final, Literal, NamedTuple, cast

from aiokafka import TopicPartition
from redis import asyncio as aioredis

from image_crawler import contract

# A partition's set outlives its last write by this long: a URL may wait days for its
# host, and a set expired meanwhile costs only the work redone.
FINISHED_TTL_S: Final = 14 * 24 * 3600


def fingerprint(value: bytes | None) -> int:
    """The CRC-32 of a message's value (0 for none)."""
    return zlib.crc32(value or b"")


FINISHED: Final = "finished"
RUNNING: Final = "running"
State = Literal["finished", "running"]


def _member(offset: int, crc: int) -> str:
    return f"{offset}:{crc:08x}"


def _running_member(offset: int, until_ms: int) -> str:
    return f"{offset}:r{until_ms}"


def _parsed(member: bytes | str) -> tuple[int, State, int] | None:
    """(offset, FINISHED, crc) or (offset, RUNNING, until in Unix ms)."""
    text = member.decode() if isinstance(member, bytes) else member
    offset, _, rest = text.partition(":")
    try:
        if rest.startswith("r"):
            return int(offset), RUNNING, int(rest[1:])
        return int(offset), FINISHED, int(rest, 16)
    except ValueError:
        return None  # not ours (a hand-written member): ignored


class Loaded(NamedTuple):
    """Per partition: the offsets finished past its commit and their CRCs, and those still
    running at its old owner's revoke and until when (Unix seconds) it may end them."""

    finished: dict[TopicPartition, dict[int, int]]
    running: dict[TopicPartition, dict[int, float]]


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

    async def load(self, partitions: Iterable[TopicPartition]) -> Loaded:
        """What the partitions' previous owners finished, and what they were still
        running (markers whose time has passed left out; partitions with none, too)."""
        tps = list(partitions)
        async with self._redis.pipeline(transaction=False) as pipe:
            for tp in tps:
                pipe.zrange(contract.finished_key(tp.topic, tp.partition), 0, -1)
            replies = await pipe.execute()
        loaded = Loaded({}, {})
        now_ms = time.time() * 1000
        for tp, members in zip(tps, replies, strict=True):
            for offset, state, number in filter(None, map(_parsed, members)):
                if state == FINISHED:
                    loaded.finished.setdefault(tp, {})[offset] = number
                elif number > now_ms:
                    loaded.running.setdefault(tp, {})[offset] = number / 1000
        return loaded

    async def mark_running(
        self, running: Mapping[TopicPartition, Iterable[int]], until_ms: int
    ) -> None:
        """Mark offsets still running at a revoke, to be ended by ``until_ms``."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for tp, offsets in running.items():
                mapping = {_running_member(o, until_ms): o for o in offsets}
                if mapping:
                    key = contract.finished_key(tp.topic, tp.partition)
                    pipe.zadd(key, mapping)
                    pipe.expire(key, self._ttl_s)
            await pipe.execute()

    async def settle(self, tp: TopicPartition, offset: int, until_ms: int, crc: int | None) -> None:
        """A message marked running ended here: finished (its ``crc``), or given up (None).
        One transaction: its next owner sees the marker or the finished member, never
        neither (it would run a message finished here)."""
        key = contract.finished_key(tp.topic, tp.partition)
        async with self._redis.pipeline(transaction=True) as pipe:
            if crc is not None:
                pipe.zadd(key, {_member(offset, crc): offset})
            pipe.zrem(key, _running_member(offset, until_ms))
            pipe.expire(key, self._ttl_s)
            await pipe.execute()

    async def state(self, tp: TopicPartition, offset: int, crc: int) -> State | None:
        """Whether the message at ``offset`` (whose CRC is ``crc``) is finished, or still
        running at a previous owner (a marker whose time has not passed), or neither."""
        key = contract.finished_key(tp.topic, tp.partition)
        members = cast("list[bytes]", await self._redis.zrangebyscore(key, offset, offset))
        now_ms = time.time() * 1000
        found = [p for m in members if (p := _parsed(m)) is not None]
        if (offset, FINISHED, crc) in found:
            return FINISHED
        if any(state == RUNNING and number > now_ms for _, state, number in found):
            return RUNNING
        return None
