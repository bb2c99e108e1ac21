"""The workers' DNS in ``image-crawler status``: each worker's figures and their sum, the
URLs ended as DnsError, in the table's caption and in ``--json``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis.asyncio import Redis

from crawlctl.status.json_view import status_json
from crawlctl.status.model import CrawlStatus, read_status
from crawlctl.status.terminal import DNS_WORKERS_SHOWN, dns_lines
from image_crawler import contract as c
from image_crawler.dns_stats import DnsReport, figures, write_report
from test.crawlctl.test_status_terminal import render


async def redis_now(redis: Redis) -> float:
    seconds, microseconds = await redis.time()
    return seconds + microseconds / 1e6


async def seed_dns(redis: Redis) -> float:
    """Two workers reporting, one that stopped 5 minutes ago, 48 URLs ended as DnsError."""
    now = await redis_now(redis)
    reports = [
        DnsReport("worker-b:31", figures(2500, 27500, {"nxdomain": 40, "timeout": 3}, 2600), now),
        DnsReport("worker-a:12", figures(1500, 8500, {"nxdomain": 10}, 1400), now - 4),
        DnsReport("worker-c:77", figures(900, 100, {"servfail": 9}, 800), now - 300),
    ]
    for report in reports:
        await write_report(redis, report)
    await redis.sadd(c.INBOUND_SOURCES_SET, "web", "met")
    await redis.set(c.resize_errors_key("web", c.Status.DNS_ERROR), 40)
    await redis.set(c.resize_errors_key("met", c.Status.DNS_ERROR), 8)
    await redis.set(c.resize_errors_key("met", "404"), 3)
    return now


async def test_status_reads_every_workers_report_and_sums_those_reporting(redis: Redis) -> None:
    await seed_dns(redis)
    status = await read_status(redis)
    assert [r.worker for r in status.dns_reports] == ["worker-a:12", "worker-b:31", "worker-c:77"]
    assert status.now_s is not None
    assert [r.stale(status.now_s) for r in status.dns_reports] == [False, False, True]
    # worker-c stopped reporting: left out of the sum.
    assert status.dns == figures(4000, 36000, {"nxdomain": 50, "timeout": 3}, 4000)
    assert status.dns_errors == 48


async def test_the_caption_has_the_sum_then_each_worker(redis: Redis) -> None:
    await seed_dns(redis)
    status = await read_status(redis)
    assert dns_lines(status) == [
        "dns: 2 worker(s) reporting: 4000 queries, 90.0% of 40000 lookups from cache, "
        "4000 names cached, 53 failed (nxdomain 50, timeout 3); 48 URLs ended as DnsError",
        "  worker-a:12: 1500 queries, 85.0% of 10000 lookups from cache, 1400 names "
        "cached, 10 failed (nxdomain 10) (4 s ago)",
        "  worker-b:31: 2500 queries, 91.7% of 30000 lookups from cache, 2600 names "
        "cached, 43 failed (nxdomain 40, timeout 3) (0 s ago)",
        "  worker-c:77: 900 queries, 10.0% of 1000 lookups from cache, 800 names cached, "
        "9 failed (servfail 9) (stale: last report 5m ago)",
    ]
    text = render(status, width=200)
    assert "dns: 2 worker(s) reporting: 4000 queries" in text
    assert "worker-c:77: 900 queries" in text


def status_of(reports: list[DnsReport], dns_errors: int = 0) -> CrawlStatus:
    reasons = {c.Status.DNS_ERROR: dns_errors} if dns_errors else {}
    return CrawlStatus((), 0, 0, 0, 0, errors_by_reason=reasons, dns_reports=tuple(reports),
                       now_s=1_800_000_000.0)  # fmt: skip


ONE = DnsReport("w:1", figures(10, 0, {}, 10), 1_800_000_000.0 - 2)


@pytest.mark.parametrize(
    ("reports", "dns_errors", "lines"),
    [
        ([], 0, []),  # no worker reports, nothing ended: nothing to say
        (
            [],
            5,
            ["dns: no worker reported in the last 60 s; 5 URLs ended as DnsError"],
        ),
        (
            [ONE],
            0,  # one worker: its figures are the sum
            ["dns: 1 worker(s) reporting: 10 queries, 0.0% of 10 lookups from cache, "
             "10 names cached, none failed"],
        ),
        (
            [DnsReport("w:1", figures(0, 0, {}, 0), 1_800_000_000.0 - 61)],
            0,
            ["dns: no worker reported in the last 60 s (1 stopped reporting)"],
        ),
    ],
)  # fmt: skip
def test_the_caption_says_little_when_there_is_little(
    reports: list[DnsReport], dns_errors: int, lines: list[str]
) -> None:
    assert dns_lines(status_of(reports, dns_errors)) == lines


def test_many_workers_show_a_few_lines_and_say_how_many_more() -> None:
    reports = [DnsReport(f"w:{i:02d}", figures(1, 1, {}, 1), 1_800_000_000.0) for i in range(20)]
    lines = dns_lines(status_of(reports))
    assert len(lines) == 1 + DNS_WORKERS_SHOWN + 1
    assert lines[-1] == f"  and {20 - DNS_WORKERS_SHOWN} more workers (--json has them)"


@pytest.mark.timing("asserts report ages in seconds within a few seconds of when they were seeded")
async def test_the_json_has_the_sum_and_every_worker(redis: Redis) -> None:
    await seed_dns(redis)
    document: dict[str, Any] = json.loads(
        json.dumps(status_json(await read_status(redis)), allow_nan=False)
    )
    assert document["general"]["dns"] == {
        "workers": 2,
        "queries": 4000,
        "cache_hits": 36000,
        "lookups": 40000,
        "hit_ratio": 0.9,
        "failures": {"nxdomain": 50, "timeout": 3},
        "failed": 53,
        "names_cached": 4000,
    }
    assert document["general"]["dns_errors"] == 48
    workers = document["dns_workers"]
    assert [(w["worker"], w["stale"]) for w in workers] == [
        ("worker-a:12", False), ("worker-b:31", False), ("worker-c:77", True)]  # fmt: skip
    assert 3.5 < workers[0]["age_s"] < 10 and 299 < workers[2]["age_s"] < 310
    assert workers[2] == {
        "worker": "worker-c:77",
        "age_s": workers[2]["age_s"],
        "stale": True,
        "queries": 900,
        "cache_hits": 100,
        "lookups": 1000,
        "hit_ratio": 0.1,
        "failures": {"servfail": 9},
        "failed": 9,
        "names_cached": 800,
    }
