"""Token buckets in Redis: a worker may only request a URL once it holds a token.

The monitor SETs ``currtokens:{source}`` to the source's rate every second; a worker takes
a token by decrementing it and may request only when the result is >= 0. Waiting requests
of one source are served together: ``DECRBY n`` is atomic and equivalent to ``n`` DECRs
(the i-th of them succeeds when ``result + n - i >= 0``), so a worker takes exactly the
tokens it can use in one round trip per source, all sources in one pipeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from image_crawler.contract import tokens_key
from image_crawler.logs import get_logger

log = get_logger(__name__)


class TokenBucket(Protocol):
    def acquire(self, source: str) -> Awaitable[None]:
        """Resolves once a token of ``source`` was taken. Cancelling it gives nothing back."""
        ...


def tokens_granted(requested: int, result: int) -> int:
    """How many of ``requested`` DECRs succeeded, given the value DECRBY returned."""
    return max(0, min(requested, result + requested))


class RedisTokenBucket:
    """Takes tokens for every waiting request, one pipelined round trip per attempt.

    ``run()`` must be running (as a task) for ``acquire`` to make progress.
    """

    def __init__(self, redis: aioredis.Redis, *, retry_s: float = 1.0) -> None:
        self._redis = redis
        self._retry_s = retry_s
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {}
        # Source -> monotonic time before which its bucket is known to be empty.
        self._empty_until: dict[str, float] = {}
        self._wake = asyncio.Event()

    def acquire(self, source: str) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(source, deque()).append(future)
        self._wake.set()
        return future

    def waiting(self, source: str) -> int:
        return sum(1 for f in self._waiters.get(source, ()) if not f.done())

    async def run(self) -> None:
        backoff_s = 0.1
        failing_since: float | None = None
        while True:
            due = self._due_sources(time.monotonic())
            if not due:
                await self._sleep_until_due()
                continue
            try:
                await self._take(due)
            except RedisError as e:
                # Fail closed: without Redis nobody gets a token.
                failing_since = failing_since or time.monotonic()
                log.warning("redis_unavailable", op="take_tokens", error=repr(e))
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 5.0)
                continue
            backoff_s = 0.1
            if failing_since is not None:
                unavailable_s = round(time.monotonic() - failing_since, 1)
                log.info("redis_recovered", op="take_tokens", unavailable_s=unavailable_s)
                failing_since = None

    def _due_sources(self, now: float) -> dict[str, int]:
        due: dict[str, int] = {}
        for source, waiters in list(self._waiters.items()):
            while waiters and waiters[0].done():  # cancelled while waiting
                waiters.popleft()
            live = sum(1 for f in waiters if not f.done())
            if not live:
                del self._waiters[source]
                self._empty_until.pop(source, None)
            elif self._empty_until.get(source, 0.0) <= now:
                due[source] = live
        return due

    async def _sleep_until_due(self) -> None:
        self._wake.clear()
        timeout = None
        if self._waiters:
            soonest = min(self._empty_until.get(s, 0.0) for s in self._waiters)
            timeout = max(0.0, soonest - time.monotonic())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    async def _take(self, due: dict[str, int]) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            for source, count in due.items():
                pipe.decrby(tokens_key(source), count)
            results = await pipe.execute()
        now = time.monotonic()
        for (source, requested), result in zip(due.items(), results, strict=True):
            granted = tokens_granted(requested, int(result))
            waiters = self._waiters.get(source, deque())
            while granted and waiters:
                future = waiters.popleft()
                if not future.done():
                    future.set_result(None)
                    granted -= 1
            if waiters:
                self._empty_until[source] = now + self._retry_s

    def close(self) -> None:
        """Cancel every waiting request."""
        for waiters in self._waiters.values():
            for future in waiters:
                future.cancel()
        self._waiters.clear()
