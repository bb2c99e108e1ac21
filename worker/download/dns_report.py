"""The worker's DNS figures, written to Redis for operators (image_crawler/dns_stats.py).

The resolver's counts are in this worker's ``/metrics``; ``image-crawler status`` and the
monitor's dashboard read Redis instead, so ``DnsReporter`` writes them to the worker's
field of ``dns_workers`` every ``DNS_REPORT_EVERY_S``, and deletes it as the worker
stops. A report is one HSET and one HGETALL of a few fields a worker: nothing per host.
While Redis is away the reports wait (``redis_unavailable``, op ``report_dns``): they are
figures since the start, so the next one says all.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from image_crawler.contract import DNS_REPORT_EVERY_S
from image_crawler.dns_stats import (
    DnsFigures,
    DnsReport,
    delete_report,
    figures,
    worker_name,
    write_report,
)
from image_crawler.logs import get_logger
from worker.download.dns import CachingResolver
from worker.sinks.base import Outage

log = get_logger(__name__)

# The longest a stopping worker waits to delete its figures.
CLOSE_WAIT_S: Final = 2.0


class DnsReporter:
    """Writes ``resolver``'s figures as ``worker``'s (default: ``worker_name()``) every
    ``every_s`` while ``run`` runs; ``close`` deletes them. ``clock``: Unix time."""

    def __init__(
        self,
        redis: aioredis.Redis,
        resolver: CachingResolver,
        *,
        worker: str | None = None,
        every_s: float = DNS_REPORT_EVERY_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._redis = redis
        self._resolver = resolver
        self.worker = worker or worker_name()
        self._every_s = every_s
        self._clock = clock
        # Not a dependency's outage of its own: the pacer and the statistics watch Redis.
        self._outage = Outage("redis_unavailable", "redis_recovered", op="report_dns")

    def figures(self) -> DnsFigures:
        """The resolver's counts now."""
        counts = self._resolver.counts
        return figures(counts.queries, counts.hits, counts.failures, self._resolver.cached)

    async def report(self) -> None:
        """Write the figures now. Raises ``RedisError``."""
        await write_report(self._redis, DnsReport(self.worker, self.figures(), self._clock()))

    async def run(self) -> None:
        """Report at once, then every ``every_s``, until cancelled."""
        while True:
            try:
                await self.report()
            except RedisError as e:
                self._outage.report(error=repr(e))
            else:
                self._outage.end()
            await asyncio.sleep(self._every_s)

    async def close(self) -> None:
        """Delete this worker's figures (it stops), waiting ``CLOSE_WAIT_S`` at most: a
        Redis away (or not answering: the worker's client has no timeout of its own)
        leaves them, to be shown stale and forgotten later, rather than hold the stop."""
        try:
            async with asyncio.timeout(CLOSE_WAIT_S):
                await delete_report(self._redis, self.worker)
        except (RedisError, TimeoutError) as e:
            log.warning("redis_unavailable", op="delete_dns_report", error=repr(e))
