"""The finished offsets past the commit, on a real redis-server: written, read, trimmed at
the commit, expiring, and only ever matching the message that was finished."""

from __future__ import annotations

from aiokafka import TopicPartition
from redis.asyncio import Redis

from image_crawler.contract import finished_key
from worker.finished import FINISHED_TTL_S, FinishedLedger, fingerprint

A = TopicPartition("urls.a", 0)
B = TopicPartition("urls.b", 3)


async def test_offsets_written_are_read_back_with_their_fingerprints(redis: Redis) -> None:
    ledger = FinishedLedger(redis)
    await ledger.record({A: [(5, fingerprint(b"five")), (7, fingerprint(b"seven"))], B: []})
    await ledger.record({A: [(9, fingerprint(None))], B: [(2, fingerprint(b"two"))]})
    loaded = await ledger.load([A, B, TopicPartition("urls.c", 0)])
    assert loaded == {
        A: {5: fingerprint(b"five"), 7: fingerprint(b"seven"), 9: fingerprint(b"")},
        B: {2: fingerprint(b"two")},
    }
    assert 0 < await redis.ttl(finished_key("urls.a", 0)) <= FINISHED_TTL_S


async def test_a_commit_trims_what_it_passed_and_a_stranger_member_is_ignored(
    redis: Redis,
) -> None:
    ledger = FinishedLedger(redis)
    await ledger.record({A: [(o, o) for o in (3, 4, 8, 9)], B: [(1, 1)]})
    await redis.zadd(finished_key("urls.a", 0), {"by hand": 10})
    await ledger.trim({A: 8})  # the next to read is 8: 8 itself stays
    assert await ledger.load([A, B]) == {A: {8: 8, 9: 9}, B: {1: 1}}
    await ledger.trim({A: 11, B: 2})
    assert await ledger.load([A, B]) == {}
    assert await redis.exists(finished_key("urls.b", 3)) == 0  # an empty set is no key


def test_a_fingerprint_tells_one_message_from_another() -> None:
    assert fingerprint(b'{"url": "http://a/1"}') != fingerprint(b'{"url": "http://a/2"}')
    assert fingerprint(None) == fingerprint(b"")
