"""Outcome statistics in Redis, exactly as the contract's key table says.

Every outcome adds its status to the 60 s / 1 h / 12 h sliding windows (trimmed as they
go) and to the last-50 list, and bumps the success or failure counters, and
``backoff_signals:{source}`` when it was a backoff signal (in the same atomic flush as
the failure counter, which the monitor relies on: see crawl_monitor.store). ``record``
returns once its outcome is stored, so a caller may commit the message behind it.

Writes cost CPU per Redis command (redis-py packs each command and reads each reply in
Python): written one outcome at a time, ~8 commands each, they took ~13% of the worker
main process's CPU in a profile. So outcomes queue and are flushed at most every
``min_interval_s`` (0.2 s: at 50 images/s that is ten outcomes a flush; at once when
nothing was flushed for longer), and a flush writes per key, not per outcome: one ZADD
and one trim per window, one RPUSH and LTRIM per last-50 list, one INCRBY per counter.
Redis ends up in the same state either way. The breakers read the windows once a second,
so 0.2 s later is soon enough; a message is committed up to 0.2 s later too.

With many sources a flush still held ~9 commands per outcome (each outcome its own
source's keys): 139 us of the worker's CPU per outcome with 70 sources a flush, against
20 us with one. So a flush is one call of a Lua script (``_FLUSH_SCRIPT``) that runs
those commands inside Redis, with the batch as one JSON argument: 33 us per outcome with
70 sources, 15 us with one. The script also makes each flush atomic.

Counting is at least once. A write that timed out (Redis stopped answering) may still be
run by Redis when it comes back, before or after the retry: the counters and the last-50
list then count that batch twice, as they count a message twice that is processed again
after a worker crash. The windows, which the breakers read, do not: each outcome's
member ``"{status}:{time}"`` is fixed when it is recorded, so writing it again adds
nothing.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any, Final, Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from image_crawler.contract import (
    LAST_N_STATUSES,
    NUM_MALFORMED,
    NUM_RESIZED,
    RESIZE_ERRORS,
    STATUS_WINDOWS,
    Status,
    backoff_signals_key,
    last50_key,
    num_resized_key,
    resize_errors_key,
    window_member,
)
from image_crawler.logs import get_logger
from image_crawler.lua import lua_script

log = get_logger(__name__)


_FLUSH_SCRIPT: Final = lua_script("worker", "stats_flush.lua")

# (source or None for a malformed message, status, backoff signal, Unix time, resolved
# once stored)
_Outcome = tuple[str | None, str, bool, float, asyncio.Future[None]]


class StatsRecorder(Protocol):
    async def record(self, source: str, status: str, *, backoff: bool = False) -> None:
        """Store one outcome of ``source``; status "200" is a success, anything else not.
        ``backoff``: the response asked us to slow down (counted for the monitor)."""
        ...

    async def record_malformed(self) -> None: ...


class RedisStats:
    """Batches outcomes into pipelined writes; retries while Redis is away."""

    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        clock: Callable[[], float] = time.time,
        min_interval_s: float = 0.2,
    ) -> None:
        # EVALSHA; a Redis that forgot the script (restarted, flushed) is sent it again.
        self._flush_script = redis.register_script(_FLUSH_SCRIPT)
        self._clock = clock
        self._min_interval_s = min_interval_s
        self._pending: list[_Outcome] = []
        self._wake = asyncio.Event()
        self._last_time = 0.0

    async def record(self, source: str, status: str, *, backoff: bool = False) -> None:
        await self._enqueue(source, status, backoff)

    async def record_malformed(self) -> None:
        await self._enqueue(None, "", False)

    async def _enqueue(self, source: str | None, status: str, backoff: bool) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Stamped now, not when written: a batch written twice (a timed-out write that
        # Redis still ran, then the retry) adds the same window members, not new ones.
        self._pending.append((source, status, backoff, self._timestamp(), future))
        self._wake.set()
        await asyncio.shield(future)

    async def run(self) -> None:
        """Flush pending outcomes until cancelled."""
        backoff_s = 0.1
        last_flush_started = -math.inf
        while True:
            await self._wake.wait()
            # Outcomes that arrive soon after a flush wait for the interval to pass, to be
            # written together: fewer, larger flushes cost less CPU per outcome.
            delay_s = last_flush_started + self._min_interval_s - time.monotonic()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            self._wake.clear()
            batch, self._pending = self._pending, []
            last_flush_started = time.monotonic()
            failing_since: float | None = None
            while True:
                try:
                    await self._flush(batch)
                    backoff_s = 0.1
                    break
                except RedisError as e:
                    failing_since = failing_since or time.monotonic()
                    log.warning("redis_unavailable", op="record_stats", error=repr(e))
                    await asyncio.sleep(backoff_s)
                    backoff_s = min(backoff_s * 2, 5.0)
            if failing_since is not None:
                unavailable_s = round(time.monotonic() - failing_since, 1)
                log.info("redis_recovered", op="record_stats", unavailable_s=unavailable_s)
            for *_, future in batch:
                if not future.done():
                    future.set_result(None)

    def _timestamp(self) -> float:
        # Window members are "{status}:{time}"; strictly increasing times keep two equal
        # statuses of this process from collapsing into one sorted-set member. On the
        # microsecond grid, as the member shows 6 decimals: a Unix time's float is only
        # good to ~0.2 us, so two times 1 us apart off the grid could print the same.
        now = round(max(self._clock(), self._last_time + 1e-6), 6)
        self._last_time = now
        return now

    async def _flush(self, batch: list[_Outcome]) -> None:
        if not batch:
            return
        # window key -> [key, trim score, [score, member, ...]]. Each window is trimmed by
        # the batch's first time, not its newest, as when each outcome was written on its
        # own (a batch queued while Redis was away may span more than a window); and
        # before the ZADD, as that trim removed none of the batch's own members.
        windows: dict[str, list[Any]] = {}
        statuses: defaultdict[str, list[str]] = defaultdict(list)
        counts: Counter[str] = Counter()
        for source, status, backoff, now, _ in batch:
            if source is None:
                counts[NUM_MALFORMED] += 1
                continue
            score = repr(now)
            member = window_member(status, now)
            for prefix, window_s in STATUS_WINDOWS:
                key = f"{prefix}{source}"
                window = windows.get(key)
                if window is None:
                    window = windows[key] = [key, repr(now - window_s), []]
                window[2] += (score, member)
            statuses[source].append(status)
            if status == Status.OK:
                counts.update((NUM_RESIZED, num_resized_key(source)))
            else:
                keys = (RESIZE_ERRORS, resize_errors_key(source), resize_errors_key(source, status))
                counts.update(keys)
            if backoff:
                counts[backoff_signals_key(source)] += 1
        document = json.dumps(
            {
                "w": list(windows.values()),
                "l": [[last50_key(source), values] for source, values in statuses.items()],
                "c": counts,
            }
        )
        await self._flush_script(args=(document, LAST_N_STATUSES))
