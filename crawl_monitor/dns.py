"""The workers' DNS figures, read for ``/metrics`` and the dashboard: each worker's
queries, cache hits, failures by kind and names cached, as it last wrote them to
``dns_workers`` (``image_crawler.dns_stats``).

One HGETALL of a few fields a worker, every ``LOG_FREQUENCY_S`` (as the host counts are
read): nothing per host. The latest reading stays in memory for the scrape; Redis away:
``redis_unavailable`` is logged, the latest reading stays, and the next period tries
again.
"""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from image_crawler.dns_stats import DnsReport, read_reports
from image_crawler.logs import get_logger
from image_crawler.retry import sleep_unless_stopped

log = get_logger(__name__)


class DnsReportsMonitor:
    """Reads the workers' reports every ``interval_s``; ``latest`` is the last reading
    (None: none yet)."""

    def __init__(self, redis: aioredis.Redis, interval_s: float) -> None:
        self._redis = redis
        self._interval_s = interval_s
        self.latest: tuple[DnsReport, ...] | None = None

    async def read(self) -> tuple[DnsReport, ...]:
        """Read every worker's report and keep them as ``latest``. Raises ``RedisError``."""
        self.latest = await read_reports(self._redis)
        return self.latest

    async def run(self, stop: asyncio.Event) -> None:
        """Read every ``interval_s`` until ``stop``."""
        while not stop.is_set():
            started = time.monotonic()
            try:
                await self.read()
            except RedisError as e:
                log.warning("redis_unavailable", op="read_dns_reports", error=repr(e))
            except Exception:
                log.exception("dns_reports_error")
            if await sleep_unless_stopped(stop, started + self._interval_s - time.monotonic()):
                return
