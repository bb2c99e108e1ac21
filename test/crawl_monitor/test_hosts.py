"""The monitor's host counts (crawl_monitor/hosts.py) against the suite's redis-server:
every known source's counts in one call, kept for the scrape, and the loop's period."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from structlog.testing import capture_logs

from crawl_monitor.hosts import HostCountsMonitor
from image_crawler import contract as c
from image_crawler.host_index import HostCounts
from test.harness.services import free_port, wait_for


async def redis_now(redis: Redis) -> float:
    seconds, micros = await redis.time()
    return seconds + micros / 1e6


async def test_the_known_sources_are_counted_from_their_host_indexes(redis: Redis) -> None:
    now = await redis_now(redis)
    await redis.zadd(
        c.host_index_key("web"),
        {
            "a.example": c.host_index_score(c.HOST_AT_PACE, now - 2),
            "b.example": c.host_index_score(c.HOST_PACED, now - 5),
            "c.example": c.host_index_score(c.HOST_HALTED, now - 20),
            "idle.example": c.host_index_score(c.HOST_HALTED, now - 300),
        },
    )
    # A source that is not known is not counted, whatever its index holds.
    await redis.zadd(c.host_index_key("stranger"), {"x": c.host_index_score(c.HOST_PACED, now)})
    known = {"web", "quiet"}
    monitor = HostCountsMonitor(redis, lambda: known, 0.05)
    assert monitor.latest is None
    assert await monitor.count() == {"web": HostCounts(at_pace=1, paced=1, halted=1)}
    assert monitor.latest == {"web": HostCounts(at_pace=1, paced=1, halted=1)}


async def test_the_loop_counts_every_period_and_stops(redis: Redis) -> None:
    monitor = HostCountsMonitor(redis, lambda: ["web"], 0.05)
    stop = asyncio.Event()
    task = asyncio.create_task(monitor.run(stop))
    try:
        await wait_for(lambda: monitor.latest == {}, 5, what="a first count")
        now = await redis_now(redis)
        await redis.zadd(c.host_index_key("web"), {"a": c.host_index_score(c.HOST_PACED, now)})
        await wait_for(lambda: monitor.latest == {"web": HostCounts(paced=1)}, 5)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


async def test_redis_away_keeps_the_latest_reading_and_says_so() -> None:
    # No retries: redis-py's default backoff (up to 1 + 2 + 4 s, jittered) would let a
    # count begun just before the stop outlast the wait for the loop to end (a failure
    # seen once in five runs); what is tested is the loop's answer to a failed count.
    away = Redis(
        host="127.0.0.1", port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    monitor = HostCountsMonitor(away, lambda: ["web"], 0.05)
    monitor.latest = {"web": HostCounts(halted=2)}
    stop = asyncio.Event()
    with capture_logs() as logs:
        task = asyncio.create_task(monitor.run(stop))
        await wait_for(lambda: [e for e in logs if e["event"] == "redis_unavailable"], 5)
        stop.set()
        await asyncio.wait_for(task, 5)
    await away.aclose()
    assert monitor.latest == {"web": HostCounts(halted=2)}
    assert logs[0]["op"] == "count_hosts"
