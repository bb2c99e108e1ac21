"""The worker's DNS figures in Redis (worker/download/dns_report.py): its resolver's counts
written to its field of ``dns_workers``, again every period, through a Redis outage, and
deleted as it stops; the ``crawler_dns_names_cached`` gauge beside the resolver's
counters."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from types import SimpleNamespace
from typing import Any

import pycares
import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis
from structlog.testing import capture_logs

from image_crawler import contract as c
from image_crawler.dns_stats import DNS_FAILURE_KINDS, DnsReport, figures, read_reports
from test.harness.services import RedisServer, wait_for
from test.worker.test_dns import answer, make
from worker.__main__ import _export_gauges
from worker.download import dns
from worker.download.dns_report import CLOSE_WAIT_S, DnsReporter
from worker.settings import WorkerSettings

NAMES = {
    "a.example": answer("93.184.216.34"),
    "b.example": answer("93.184.216.35"),
    "slow.example": pycares.errno.ARES_ETIMEOUT,
}


async def looked_up(resolver: Any) -> None:
    """Two names twice each, one that does not exist, one whose resolver times out."""
    for name in (
        "a.example",
        "b.example",
        "a.example",
        "b.example",
        "gone.example",
        "slow.example",
    ):
        with contextlib.suppress(dns.DnsLookupError):
            await resolver.resolve(name)


def test_the_kinds_shared_with_operators_are_the_resolvers() -> None:
    assert DNS_FAILURE_KINDS == dns.FAILURE_KINDS


async def test_a_report_is_the_resolvers_counts_and_goes_with_its_worker(redis: Redis) -> None:
    resolver, _, _ = make(NAMES)
    await looked_up(resolver)
    reporter = DnsReporter(redis, resolver, worker="w1:7", clock=lambda: 1_800_000_000.5)
    await reporter.report()
    assert await read_reports(redis) == (
        DnsReport(
            "w1:7",
            figures(4, 2, {"nxdomain": 1, "timeout": 1}, resolver.cached),
            1_800_000_000.5,
        ),
    )
    assert resolver.cached == 4  # two answers, two remembered failures
    # The JSON an operator reads with redis-cli hget dns_workers w1:7.
    assert json.loads(await redis.hget(c.DNS_WORKERS_HASH, "w1:7")) == {
        "queries": 4,
        "hits": 2,
        "failures": {"nxdomain": 1, "timeout": 1},
        "cached": 4,
        "at": 1_800_000_000.5,
    }
    await reporter.close()
    assert await redis.exists(c.DNS_WORKERS_HASH) == 0


async def test_a_report_forgets_workers_long_gone_and_leaves_the_rest(redis: Redis) -> None:
    now = 1_800_000_000.0
    gone = DnsReport("gone:1", figures(5, 5, {}, 5), now - c.DNS_FORGET_S - 1)
    stale = DnsReport("stale:2", figures(5, 5, {}, 5), now - c.DNS_STALE_S - 1)
    for report in (gone, stale):
        await redis.hset(c.DNS_WORKERS_HASH, report.worker, report.to_json())
    await redis.hset(c.DNS_WORKERS_HASH, "by-hand", "not a report")
    resolver, _, _ = make(NAMES)
    await DnsReporter(redis, resolver, worker="w1:7", clock=lambda: now).report()
    assert set(await redis.hkeys(c.DNS_WORKERS_HASH)) == {"stale:2", "by-hand", "w1:7"}
    # Readers leave out what is no report.
    assert [r.worker for r in await read_reports(redis)] == ["stale:2", "w1:7"]


async def test_the_reporter_reports_every_period_and_rides_out_redis_refusing(
    redis: Redis,
) -> None:
    resolver, _, _ = make(NAMES)
    reporter = DnsReporter(redis, resolver, worker="w1:7", every_s=0.05)

    async def reported_queries() -> int | None:
        reports = await read_reports(redis)
        return reports[0].figures.queries if reports else None

    task = asyncio.create_task(reporter.run())
    try:
        first = await wait_for(lambda: read_reports(redis), 10, what="the first report")
        assert first[0].figures == figures(0, 0, {}, 0)
        # Lookups since: the next report says them.
        await looked_up(resolver)
        await wait_for(lambda: _equals(reported_queries, 4), 10, what="a later report")
        # A key of another type in its place: Redis refuses each report, which is logged,
        # and the loop goes on.
        with capture_logs() as logs:
            await redis.delete(c.DNS_WORKERS_HASH)
            await redis.set(c.DNS_WORKERS_HASH, "in the way")
            await wait_for(
                lambda: any(e["event"] == "redis_unavailable" for e in logs),
                10,
                what="a refused report logged",
            )
            await redis.delete(c.DNS_WORKERS_HASH)
            await wait_for(lambda: _equals(reported_queries, 4), 10, what="reports again")
            # The report is in Redis before the reporter, which may still be forgetting old
            # ones, sees its write succeed and logs the recovery: wait for it, too.
            await wait_for(
                lambda: any(
                    e["event"] == "redis_recovered" and e["op"] == "report_dns" for e in logs
                ),
                10,
                what="the recovery logged",
            )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await reporter.close()


@pytest.mark.timing("asserts close() takes under CLOSE_WAIT_S + 2 s against a stopped redis")
async def test_a_stopping_worker_does_not_wait_on_a_redis_that_does_not_answer(
    fresh_redis_server: RedisServer,
) -> None:
    client = Redis.from_url(fresh_redis_server.url, decode_responses=True)
    resolver, _, _ = make(NAMES)
    reporter = DnsReporter(client, resolver, worker="w1:7")
    try:
        await reporter.report()
        fresh_redis_server.pause()  # SIGSTOP: the worker's client has no timeout of its own
        with capture_logs() as logs:
            started = time.monotonic()
            await asyncio.wait_for(reporter.close(), 30)
        assert time.monotonic() - started < CLOSE_WAIT_S + 2
        (away,) = [e for e in logs if e["event"] == "redis_unavailable"]
        assert away["op"] == "delete_dns_report"
    finally:
        fresh_redis_server.resume()
        await client.aclose()


async def _equals(read: Any, expected: Any) -> bool:
    return await read() == expected


async def test_the_names_cached_gauge_reads_the_resolver_at_each_scrape(redis: Redis) -> None:
    resolver, _, _ = make(NAMES)
    parts = SimpleNamespace(
        processor=SimpleNamespace(queued=0), dns=DnsReporter(redis, resolver, worker="w")
    )
    _export_gauges(WorkerSettings.from_env({}), SimpleNamespace(in_flight=0), parts)  # type: ignore[arg-type]
    assert REGISTRY.get_sample_value("crawler_dns_names_cached") == 0
    await looked_up(resolver)
    assert REGISTRY.get_sample_value("crawler_dns_names_cached") == 4
