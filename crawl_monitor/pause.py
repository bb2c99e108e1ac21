"""The whole crawl paused: ``crawl_paused`` in Redis, read every second.

While the key exists (``image-crawler up`` writes it when its disk runs short; an
operator may SET it), every monitor honours it: the leading regulator paces every known
source at 0, with the pause as the reason in ``crawl_rates`` (so workers start no
request, and ``status`` says why), and the splitter leaves ``inbound_images`` unread, as
splitting writes a second copy of every URL to the broker. Requests already granted
finish, and their outputs are published. The pause is lifted within a second of the
key's deletion. Changes are logged as ``crawl_paused`` (with the pause's fields) and
``crawl_pause_lifted`` (with how long it lasted).

While Redis is away the last pause read stays in force: the regulator can write no rate
then anyway.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from image_crawler.contract import CRAWL_PAUSED_KEY, CrawlPause
from image_crawler.logs import get_logger
from image_crawler.retry import sleep_unless_stopped

log = get_logger(__name__)

PAUSE_POLL_S = 1.0


class PauseWatch:
    """The pause in force (``current``, None while the crawl runs), from Redis."""

    def __init__(
        self,
        redis: aioredis.Redis,
        period_s: float = PAUSE_POLL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._redis = redis
        self._period_s = period_s
        self._clock = clock
        self.current: CrawlPause | None = None
        # Whether the key was read yet (until then, ``current`` is not known).
        self.read = False
        self._since: float | None = None

    @property
    def paused(self) -> bool:
        return self.current is not None

    async def poll(self) -> CrawlPause | None:
        """Read the key once and log a change. Raises ``RedisError``."""
        raw = await self._redis.get(CRAWL_PAUSED_KEY)
        pause = None if raw is None else CrawlPause.from_json(raw)
        self.observe(pause)
        self.read = True
        return pause

    def observe(self, pause: CrawlPause | None) -> None:
        """Take ``pause`` as the one in force, logging a change."""
        before, self.current = self.current, pause
        if pause is not None and before is None:
            self._since = self._clock()
            log.warning(
                "crawl_paused",
                reason=pause.reason,
                message=pause.message,
                path=pause.path,
                free_bytes=pause.free_bytes,
                needed_bytes=pause.needed_bytes,
            )
        elif pause is None and before is not None:
            paused_s = None if self._since is None else round(self._clock() - self._since, 1)
            log.info("crawl_pause_lifted", reason=before.reason, paused_s=paused_s)

    async def run(self, stop: asyncio.Event) -> None:
        """Poll every ``period_s`` until ``stop``."""
        while not stop.is_set():
            try:
                await self.poll()
            except RedisError as e:
                log.debug("redis_unavailable", op="read_pause", error=repr(e))
            await sleep_unless_stopped(stop, self._period_s)
