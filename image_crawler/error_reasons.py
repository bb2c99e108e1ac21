"""Which per-status error counters exist (``resize_errors:{source}:{status}``), without a
walk over the keyspace.

`image-crawler status` shows each source's errors by reason, and used to find their
counters with SCAN: a walk over every key, cheap with a few thousand keys, 9 s with a
million hosts' (each host keeps two: its pacing hash and its robots.txt). The workers'
stats flush now adds each counter's name to ``ERROR_REASONS_SET`` in the call that
increments it (worker/stats.py), so a reader asks that set. Counters written before the
set was kept (by an older version) are added by ``index_reasons``: one SCAN, after which
``ERROR_REASONS_COMPLETE`` says the set is whole. The monitor runs it as it starts, and
``reason_keys`` when it finds the set not whole yet (it has to SCAN then anyway), so that
the next reader does not.

A counter deleted by hand stays in the set, and reads as absent.
"""

from __future__ import annotations

import contextlib
from typing import Final

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from image_crawler.contract import ERROR_REASONS_COMPLETE, ERROR_REASONS_SET, RESIZE_ERRORS

# Every per-status error counter; source names and statuses hold no ':'.
REASON_KEYS_MATCH: Final = f"{RESIZE_ERRORS}:*:*"
# Keys SCAN looks at per call: each call holds Redis for about that many keys' walk.
SCAN_COUNT: Final = 1000
# Members added per SADD: one command's arguments stay small.
_ADDED_PER_CALL: Final = 1000


async def scan_reason_keys(redis: aioredis.Redis) -> list[str]:
    """Every ``resize_errors:{source}:{status}`` key, found with SCAN (a step of
    ``SCAN_COUNT`` keys a call, so that Redis serves others between steps)."""
    keys = [key async for key in redis.scan_iter(match=REASON_KEYS_MATCH, count=SCAN_COUNT)]
    return list(dict.fromkeys(keys))  # SCAN may return a key twice


async def _add(redis: aioredis.Redis, keys: list[str]) -> None:
    async with redis.pipeline(transaction=False) as pipe:
        for first in range(0, len(keys), _ADDED_PER_CALL):
            pipe.sadd(ERROR_REASONS_SET, *keys[first : first + _ADDED_PER_CALL])
        # Last: the set is whole only once it holds every counter found.
        pipe.set(ERROR_REASONS_COMPLETE, "1")
        await pipe.execute()


async def index_reasons(redis: aioredis.Redis) -> list[str]:
    """Add every counter SCAN finds to ``ERROR_REASONS_SET`` and mark it whole; returns
    them. Counters a worker creates meanwhile are added by the worker itself. Raises
    ``RedisError``."""
    keys = await scan_reason_keys(redis)
    await _add(redis, keys)
    return keys


async def reason_keys(redis: aioredis.Redis) -> list[str]:
    """The per-status error counters' names (sorted): from ``ERROR_REASONS_SET`` when it
    is whole, else found with SCAN and then added to it for the next reader (a Redis that
    refuses the write, a read-only replica or a user without write rights, is left as it
    is). Raises ``RedisError``."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.exists(ERROR_REASONS_COMPLETE)
        pipe.smembers(ERROR_REASONS_SET)
        complete, members = await pipe.execute(raise_on_error=False)
    if isinstance(complete, Exception):
        raise complete
    # A set key of another type (written by hand) is no index: SCAN.
    if complete and not isinstance(members, Exception):
        return sorted(str(member) for member in members)
    keys = await scan_reason_keys(redis)
    with contextlib.suppress(ResponseError):  # READONLY, NOPERM: the read is whole anyway
        await _add(redis, keys)
    return sorted(keys)
