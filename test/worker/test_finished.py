"""The finished offsets past the commit, on a real redis-server: written, read, trimmed at
the commit, expiring, and only ever matching the message that was finished."""

from __future__ import annotations

import time

from aiokafka import TopicPartition
from redis.asyncio import Redis

from image_crawler.contract import finished_key
from worker.finished import FINISHED, FINISHED_TTL_S, RUNNING, FinishedLedger, Loaded, fingerprint

A = TopicPartition("urls.a", 0)
B = TopicPartition("urls.b", 3)


async def test_offsets_written_are_read_back_with_their_fingerprints(redis: Redis) -> None:
    ledger = FinishedLedger(redis)
    await ledger.record({A: [(5, fingerprint(b"five")), (7, fingerprint(b"seven"))], B: []})
    await ledger.record({A: [(9, fingerprint(None))], B: [(2, fingerprint(b"two"))]})
    loaded = await ledger.load([A, B, TopicPartition("urls.c", 0)])
    assert loaded.finished == {
        A: {5: fingerprint(b"five"), 7: fingerprint(b"seven"), 9: fingerprint(b"")},
        B: {2: fingerprint(b"two")},
    }
    assert loaded.running == {}
    assert 0 < await redis.ttl(finished_key("urls.a", 0)) <= FINISHED_TTL_S


async def test_a_commit_trims_what_it_passed_and_a_stranger_member_is_ignored(
    redis: Redis,
) -> None:
    ledger = FinishedLedger(redis)
    await ledger.record({A: [(o, o) for o in (3, 4, 8, 9)], B: [(1, 1)]})
    await redis.zadd(finished_key("urls.a", 0), {"by hand": 10})
    await ledger.trim({A: 8})  # the next to read is 8: 8 itself stays
    assert await ledger.load([A, B]) == Loaded({A: {8: 8, 9: 9}, B: {1: 1}}, {})
    await ledger.trim({A: 11, B: 2})
    assert await ledger.load([A, B]) == Loaded({}, {})
    assert await redis.exists(finished_key("urls.b", 3)) == 0  # an empty set is no key


async def test_a_message_marked_running_is_so_until_it_ends_or_its_time_passes(
    redis: Redis,
) -> None:
    ledger = FinishedLedger(redis)
    until_ms = int((time.time() + 60) * 1000)
    await ledger.mark_running({A: [4, 6]}, until_ms)
    await ledger.mark_running({B: [1]}, int((time.time() - 1) * 1000))  # its time has passed
    await ledger.record({A: [(5, 5)]})
    loaded = await ledger.load([A, B])
    assert loaded == Loaded({A: {5: 5}}, {A: {4: until_ms / 1000, 6: until_ms / 1000}})
    assert await ledger.state(A, 4, 44) == RUNNING
    assert await ledger.state(B, 1, 11) is None
    assert await ledger.state(A, 5, 5) == FINISHED
    assert await ledger.state(A, 5, 55) is None  # another message at that offset
    # Offset 4 ends finished, 6 is given up: the first is finished to its next owner, the
    # second neither finished nor running, and runs.
    await ledger.settle(A, 4, until_ms, 44)
    await ledger.settle(A, 6, until_ms, None)
    assert (await ledger.state(A, 4, 44), await ledger.state(A, 6, 66)) == (FINISHED, None)
    assert await ledger.load([A]) == Loaded({A: {4: 44, 5: 5}}, {})
    # A commit past them trims markers as it trims the finished.
    await ledger.mark_running({A: [7]}, until_ms)
    await ledger.trim({A: 8})
    assert await redis.exists(finished_key("urls.a", 0)) == 0


def test_a_fingerprint_tells_one_message_from_another() -> None:
    assert fingerprint(b'{"url": "http://a/1"}') != fingerprint(b'{"url": "http://a/2"}')
    assert fingerprint(None) == fingerprint(b"")
