"""In-memory stand-ins for the worker's seams, for unit tests of pure logic."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from typing import Any

from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from yarl import URL

from image_crawler.contract import Status
from worker.download.fetch import FetchResult
from worker.politeness.hosts import HostKey
from worker.politeness.pacing import HostWaits
from worker.sinks.base import DependencyError


class FakePacer:
    """Grants slots of the sources in ``granted``; others wait forever. Records the
    sources of its slots and pauses, and every report; the hosts in ``gone`` answer
    ``HostUnavailable``, those in ``halted`` raise ``HostWaits`` for a deferrable one."""

    def __init__(self, granted: set[str] | None = None) -> None:
        self.granted = granted
        self.gone: set[str] = set()
        # Hosts whose deferrable requests raise HostWaits, with the wait.
        self.halted: dict[str, float] = {}
        self.taken: list[str] = []
        self.keys: list[HostKey] = []
        self.waiting: list[asyncio.Future[str | None]] = []
        self.pauses: list[tuple[str, float]] = []
        self.paused_keys: list[HostKey] = []
        self.reports: list[tuple[HostKey, str, bool]] = []
        self.crawl_delays: list[tuple[HostKey, float]] = []

    async def pause(self, key: HostKey, delay_s: float) -> None:
        self.pauses.append((key.source, delay_s))
        self.paused_keys.append(key)

    async def note_crawl_delay(self, key: HostKey, delay_s: float, keep_s: float) -> None:
        self.crawl_delays.append((key, delay_s))

    def report(self, key: HostKey, status: str, *, signal: bool = False) -> None:
        self.reports.append((key, status, signal))

    def interval_of(self, key: HostKey) -> float | None:
        return None

    def started_late(self, granted: Any) -> bool:
        return False

    def acquire(self, key: HostKey, *, defer: bool = False) -> asyncio.Future[str | None]:
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        if defer and key.host in self.halted:
            future.set_exception(HostWaits(key, self.halted[key.host]))
        elif key.host in self.gone:
            future.set_result(Status.HOST_UNAVAILABLE)
        elif self.granted is None or key.source in self.granted:
            self.taken.append(key.source)
            self.keys.append(key)
            future.set_result(None)
        else:
            self.waiting.append(future)
        return future

    def grant_all(self) -> None:
        for future in self.waiting:
            if not future.done():
                future.set_result(None)


class FakeReservation:
    def __init__(self, fetcher: FakeFetcher) -> None:
        self._fetcher = fetcher

    def release(self) -> None:
        self._fetcher.released += 1


class FakeFetcher:
    """Answers each URL with its result, or with its list of results in turn (the last
    one again once they run out); unknown URLs 404."""

    def __init__(self, results: dict[str, FetchResult | list[FetchResult]]) -> None:
        self.results = results
        # Budget reservations taken, and given back (by a fetch, or unused).
        self.reserved = 0
        self.released = 0
        # URL -> the redirect hops it goes through (each asked of ``permit`` first).
        self.hops: dict[str, list[str]] = {}
        self.requests: list[str] = []
        # The conditions (request headers) each request carried, None for none.
        self.conditions: list[Any] = []

    async def reserve(self) -> FakeReservation:
        self.reserved += 1
        return FakeReservation(self)

    async def fetch(
        self, url: str, permit: object = None, conditions: Any = None, reserved: Any = None
    ) -> FetchResult:
        if reserved is not None:
            reserved.release()  # the fetch's from then on
        self.requests.append(url)
        self.conditions.append(conditions)
        for hop in self.hops.get(url, ()):
            refused = await permit(URL(hop)) if callable(permit) else None
            if refused is not None:
                return FetchResult(refused, detail=hop)
        result = self.results.get(url, FetchResult("404"))
        if isinstance(result, list):
            tries = self.requests.count(url)
            return result[min(tries, len(result)) - 1]
        return result


class FakeStore:
    def __init__(self, failures: int = 0) -> None:
        self.objects: dict[str, bytes] = {}
        self.failures = failures

    async def put(self, key: str, data: bytes) -> None:
        if self.failures:
            self.failures -= 1
            raise DependencyError("s3", ConnectionError("S3 is away"))
        self.objects[key] = data


class FakeSink:
    def __init__(self) -> None:
        self.messages: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.keys: dict[str, list[bytes | None]] = defaultdict(list)

    async def publish(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self.messages[topic].append(json.loads(value))
        self.keys[topic].append(key)


class FakeStats:
    def __init__(self) -> None:
        self.outcomes: list[tuple[str, str]] = []
        # The host each outcome was recorded with, in the same order.
        self.hosts: list[str | None] = []
        # The outcomes recorded as backoff signals.
        self.signals: list[tuple[str, str]] = []
        self.malformed = 0
        # Re-checks' verdicts, (source, "unchanged" | "changed" | "gone" | "failed").
        self.checks: list[tuple[str, str]] = []

    async def record(
        self, source: str, status: str, *, backoff: bool = False, host: str | None = None
    ) -> None:
        self.outcomes.append((source, status))
        self.hosts.append(host)
        if backoff:
            self.signals.append((source, status))

    async def record_malformed(self) -> None:
        self.malformed += 1

    async def record_check(self, source: str, check: str) -> None:
        self.checks.append((source, check))


class FlakyRedis:
    """A Redis client whose pipelines and script calls fail with ``ConnectionError``
    while ``away``.

    Wraps a real (or fake) async client; only ``pipeline()`` and ``evalsha()`` (the
    pacer's and the statistics' scripts) are affected, as those use nothing else but
    ``script_load()``.
    """

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self.connection_pool = redis.connection_pool  # for register_script's encoding
        self.away = True
        self.refused = 0

    def pipeline(self, transaction: bool = True) -> Any:
        pipe = self._redis.pipeline(transaction=transaction)
        if self.away:

            async def refuse() -> list[Any]:
                self.refused += 1
                raise RedisConnectionError("Redis is away")

            pipe.execute = refuse
        return pipe

    async def evalsha(self, *args: Any) -> Any:
        if self.away:
            self.refused += 1
            raise RedisConnectionError("Redis is away")
        return await self._redis.evalsha(*args)

    async def script_load(self, script: str) -> Any:
        return await self._redis.script_load(script)

    def register_script(self, script: str) -> AsyncScript:
        # Its calls come back through evalsha() here, so they fail while away.
        return AsyncScript(self, script)  # type: ignore[arg-type]
