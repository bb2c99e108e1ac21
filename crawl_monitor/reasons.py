"""The index of the per-status error counters, made whole once as the monitor starts
(``image_crawler.error_reasons``): a crawl that began under an older version has counters
its workers never named in ``error_reasons``, and ``image-crawler status`` would otherwise
walk the whole keyspace (a SCAN) to find them until it makes the index whole itself.

One SCAN in steps of ``SCAN_COUNT`` keys (Redis answers others between them), only when
``error_reasons_complete`` is missing; retried while Redis is away, then done.
"""

from __future__ import annotations

import asyncio
from typing import Final

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from image_crawler.contract import ERROR_REASONS_COMPLETE
from image_crawler.error_reasons import index_reasons
from image_crawler.logs import get_logger
from image_crawler.retry import Backoff, sleep_unless_stopped

log = get_logger(__name__)

# Redis away at the start: asked again soon, and no more often than this.
RETRY_BASE_S: Final = 1.0
RETRY_CAP_S: Final = 30.0


async def index_error_reasons(redis: aioredis.Redis, stop: asyncio.Event) -> None:
    """Make the index whole unless it is, retrying until done or ``stop``."""
    retry = Backoff(base_s=RETRY_BASE_S, cap_s=RETRY_CAP_S)
    while not stop.is_set():
        try:
            if await redis.exists(ERROR_REASONS_COMPLETE):
                return
            keys = await index_reasons(redis)
        except RedisError as e:
            log.warning("redis_unavailable", op="index_error_reasons", error=repr(e))
            await sleep_unless_stopped(stop, retry.next_s())
            continue
        log.info("error_reasons_indexed", counters=len(keys))
        return
