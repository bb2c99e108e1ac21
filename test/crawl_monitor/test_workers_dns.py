"""The monitor's reads of what the workers leave in Redis for operators: their DNS
reports (crawl_monitor/dns.py), and the index of the error counters it makes whole as it
starts (crawl_monitor/reasons.py)."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from structlog.testing import capture_logs

from crawl_monitor.dns import DnsReportsMonitor
from crawl_monitor.reasons import index_error_reasons
from image_crawler import contract as c
from image_crawler.dns_stats import DnsReport, figures
from test.harness.services import wait_for


async def test_the_reports_are_read_every_period(redis: Redis) -> None:
    monitor = DnsReportsMonitor(redis, interval_s=0.05)
    assert monitor.latest is None  # not read yet: the metrics leave them out
    stop = asyncio.Event()
    task = asyncio.create_task(monitor.run(stop))
    try:
        assert await wait_for(lambda: monitor.latest is not None, 10, what="a first read")
        assert monitor.latest == ()
        report = DnsReport("w:1", figures(3, 4, {"nxdomain": 1}, 2), 1_800_000_000.0)
        await redis.hset(c.DNS_WORKERS_HASH, report.worker, report.to_json())
        await wait_for(lambda: monitor.latest == (report,), 10, what="the report read")
    finally:
        stop.set()
        await task


async def test_the_index_is_made_whole_once_and_left_alone_after(redis: Redis) -> None:
    old = c.resize_errors_key("flickr", "404")
    await redis.set(old, 2)
    with capture_logs() as logs:
        await index_error_reasons(redis, asyncio.Event())
    assert await redis.smembers(c.ERROR_REASONS_SET) == {old}
    assert await redis.exists(c.ERROR_REASONS_COMPLETE)
    assert [e["counters"] for e in logs if e["event"] == "error_reasons_indexed"] == [1]
    # Whole already: nothing walked, nothing logged.
    await redis.set(c.resize_errors_key("met", "500"), 1)
    with capture_logs() as logs:
        await index_error_reasons(redis, asyncio.Event())
    assert logs == []
    assert await redis.smembers(c.ERROR_REASONS_SET) == {old}
