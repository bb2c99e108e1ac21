"""Each source's hosts, counted for ``/metrics`` and the dashboard: how many are active,
and of them how many are paced below the source's rate, backed off and halted.

The counts come from the host indexes the workers' pacing script keeps
(``image_crawler.host_index``): one call for every known source, a ZCOUNT per state of
each source that has an index, every ``LOG_FREQUENCY_S`` (as the backlog is measured), not
every second. Nothing here loops over hosts: a source's counts cost O(log hosts). The
latest reading stays in memory for the scrape; Redis away: ``redis_unavailable`` is
logged, the latest reading stays, and the next period tries again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from image_crawler.host_index import HostCounts, read_host_counts
from image_crawler.logs import get_logger
from image_crawler.retry import sleep_unless_stopped

log = get_logger(__name__)


class HostCountsMonitor:
    """Counts the hosts of the sources ``sources()`` names every ``interval_s``;
    ``latest`` is the last reading (sources without a host index left out; None: none
    yet)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        sources: Callable[[], Collection[str]],
        interval_s: float,
    ) -> None:
        self._redis = redis
        self._sources = sources
        self._interval_s = interval_s
        self.latest: Mapping[str, HostCounts] | None = None

    async def count(self) -> Mapping[str, HostCounts]:
        """Read every source's counts and keep them as ``latest``. Raises
        ``RedisError``."""
        self.latest = await read_host_counts(self._redis, sorted(self._sources()))
        return self.latest

    async def run(self, stop: asyncio.Event) -> None:
        """Count every ``interval_s`` until ``stop``."""
        while not stop.is_set():
            started = time.monotonic()
            try:
                await self.count()
            except RedisError as e:
                log.warning("redis_unavailable", op="count_hosts", error=repr(e))
            except Exception:
                log.exception("host_counts_error")
            if await sleep_unless_stopped(stop, started + self._interval_s - time.monotonic()):
                return
