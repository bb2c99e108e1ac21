"""How long ``image-crawler status`` takes with a million hosts known (issue 38, point 4).

Run from the repository root with the local stack installed (``pip install -e
'.[local]'``): ``python scripts/status_million_hosts.py`` (about 5 minutes of filling on
2 cores, and 0.75 GB of Redis); ``--hosts 100000`` for a quicker look, ``--json FILE`` to
keep the figures.

It starts a redis-server of its own on a free loopback port (the local stack's, as
``image-crawler up`` does) and fills it as a crawl of ``--hosts`` hosts leaves it, with the
crawler's own code wherever it writes:

- the index of the error counters made whole, as the monitor does as it starts
  (``image_crawler.error_reasons``);
- every host asked about once by the workers' pacing script (``pacing_acquire.lua``,
  through the same call ``RedisPacer`` makes, a thousand hosts a call): its hash
  ``pace_host:{source}:{host}`` and its member of ``host_index:{source}``; one host in a
  hundred then reports a failure, and one in a thousand six in a row (backed off and
  halted hosts, as a crawl has some);
- every host's robots.txt entry (``robots:https://{host}:443``, ``RobotsEntry`` as the
  robots cache writes it, with a small file for one host in four);
- each source's outcomes by status through the workers' stats flush (``RedisStats``), so
  that the error counters, their index, windows and last-50 lists are there too;
- the monitor's record of each source's rate (``crawl_rates``, ``pace_rate:``) and its
  backlog hash, and eight workers' DNS reports (``dns_workers``, as ``DnsReporter``
  writes them).

The hosts are spread over ``--sources`` sources of equal size (``web0`` ... ): ``status
--hosts web0`` then looks at one source of ``hosts / sources`` hosts. Each command is run
``--runs`` times as an operator runs it (a new process: Python's start and imports
included), and its read alone in this process (``read_status``, ``read_source_hosts``);
the median and the slowest are reported, with Redis' keys and memory and the machine's
load average (other work on the machine slows every figure).

``--redis URL --no-fill`` measures a Redis filled by an earlier run, with whatever
checkout is first on ``PYTHONPATH``: the fill's imports are made by the fill alone, so
that an older checkout, which lacks them, can be measured on the same data.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from crawlctl.localstack.services import RedisServer
from crawlctl.status.hosts import read_source_hosts
from crawlctl.status.model import read_status

# Hosts asked about in one call of the pacing script, as a busy worker's ask holds.
HOSTS_A_CALL = 1000
# A source's rate: high enough that its own pace never holds its hosts' first slots.
SOURCE_RPS = 100_000.0
ROBOTS_TEXT = "User-agent: *\nDisallow: /private/\nCrawl-delay: 1\n"
# Each source's outcomes, as a crawl's mix of them.
OUTCOMES = {
    "200": 400,
    "404": 60,
    "403": 10,
    "500": 8,
    "503": 12,
    "DnsError": 25,
    "HostUnavailable": 4,
    "RobotsDisallowed": 9,
    "Timeout": 7,
    "UnidentifiedImageError": 3,
}
WORKERS = 8


def host_name(source: int, i: int) -> str:
    return f"img{i}.site{source}-{i % 997}.example"


async def ask(redis: aioredis.Redis, source: str, hosts: list[str], report: Any) -> None:
    """One call of the pacing script, as ``RedisPacer._ask`` makes it."""
    from worker.politeness.pacing import _ACQUIRE_SCRIPT, RedisPacer

    pacer = RedisPacer(redis)
    document = [[source, [[host, 1, report.to_list()] for host in hosts]]]
    await redis.eval(_ACQUIRE_SCRIPT, 0, pacer._config, json.dumps(document))


async def fill_hosts(redis: aioredis.Redis, source_i: int, count: int) -> None:
    from worker.politeness.hosts import NO_REPORT

    source = f"web{source_i}"
    names = [host_name(source_i, i) for i in range(count)]
    for first in range(0, count, HOSTS_A_CALL):
        await ask(redis, source, names[first : first + HOSTS_A_CALL], NO_REPORT)
    failed = NO_REPORT.add("500")
    # A failure for one host in a hundred (backed off, paced), six in a row for one in a
    # thousand (halted by its breaker).
    await ask(redis, source, names[::100], failed)
    for _ in range(5):
        failed = failed.add("500")
        await ask(redis, source, names[::1000], failed)


async def fill_robots(redis: aioredis.Redis, source_i: int, count: int) -> None:
    from image_crawler.contract import robots_key
    from worker.politeness.robots import RobotsEntry

    now = time.time()
    async with redis.pipeline(transaction=False) as pipe:
        for i in range(count):
            text = ROBOTS_TEXT if i % 4 == 0 else None
            entry = RobotsEntry("200" if text else "404", text, now, now + 86400)
            origin = f"https://{host_name(source_i, i)}:443"
            pipe.set(robots_key(origin), entry.to_json(), px=86_400_000)
            if len(pipe) >= 10_000:
                await pipe.execute()
        await pipe.execute()


async def fill_outcomes(redis: aioredis.Redis, sources: list[str]) -> None:
    from worker.stats import RedisStats

    stats = RedisStats(redis)
    flusher = asyncio.create_task(stats.run())
    try:
        await asyncio.gather(
            *(
                stats.record(source, status, host=host_name(0, n))
                for source in sources
                for status, times in OUTCOMES.items()
                for n in range(times)
            )
        )
    finally:
        flusher.cancel()


async def fill_monitor(redis: aioredis.Redis, sources: list[str]) -> None:
    from image_crawler import contract as c
    from image_crawler.error_reasons import index_reasons

    await index_reasons(redis)  # as the monitor does as it starts
    for source in sources:
        info = c.PacingInfo(SOURCE_RPS, SOURCE_RPS, "computed", c.PACE_CONFIGURED, "at its rate")
        await redis.hset(c.RATES_HASH, source, info.to_json())
        await redis.set(c.pace_rate_key(source), repr(SOURCE_RPS))
        await redis.sadd(c.INBOUND_SOURCES_SET, source)
        await redis.hset(c.BACKLOG_HASH, source, 12345)
    await redis.set(c.BACKLOG_AT, repr(time.time()))


async def fill_dns(redis: aioredis.Redis, hosts: int) -> None:
    """Eight workers' DNS reports, as ``DnsReporter`` writes them."""
    from image_crawler.dns_stats import DnsReport, figures, write_report

    each = hosts // WORKERS
    for i in range(WORKERS):
        failures = {"nxdomain": each // 50, "timeout": each // 1000}
        report = figures(each, 3 * each, failures, min(each, 100_000))
        await write_report(redis, DnsReport(f"worker-{i}:{1000 + i}", report, time.time()))


async def fill(redis: aioredis.Redis, hosts: int, sources: int) -> None:
    names = [f"web{i}" for i in range(sources)]
    await fill_monitor(redis, names)
    started = time.monotonic()
    for i in range(sources):
        each = hosts // sources
        await fill_hosts(redis, i, each)
        await fill_robots(redis, i, each)
        done = (i + 1) * each
        rate = done / (time.monotonic() - started)
        print(f"filled {done:,} hosts ({rate:,.0f} hosts/s)", file=sys.stderr)
    await fill_outcomes(redis, names)
    await fill_dns(redis, hosts)


def command_times(url: str, args: list[str], runs: int) -> dict[str, Any]:
    """``image-crawler status ARGS`` run ``runs`` times, each in a new process (s)."""
    times = []
    lines = 0
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "crawlctl", "status", "--redis", url, *args],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        times.append(time.perf_counter() - started)
        lines = len(done.stdout.splitlines())
    return {"median_s": statistics.median(times), "max_s": max(times), "lines": lines}


async def read_times(read: Callable[[], Awaitable[object]], runs: int) -> dict[str, float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        await read()
        times.append(time.perf_counter() - started)
    return {"median_s": statistics.median(times), "max_s": max(times)}


async def measure(url: str, runs: int) -> dict[str, Any]:
    redis = aioredis.from_url(url, decode_responses=True)
    try:
        figures: dict[str, Any] = {
            "keys": await redis.dbsize(),
            "redis_used_bytes": (await redis.info("memory"))["used_memory"],
            "load_average": os.getloadavg(),
            "read_status": await read_times(lambda: read_status(redis), runs),
            "read_source_hosts": await read_times(
                lambda: read_source_hosts(redis, "web0", 10), runs
            ),
        }
    finally:
        await redis.aclose()
    for name, args in {
        "status --once": ["--once"],
        "status --json": ["--json"],
        "status --hosts web0": ["--hosts", "web0"],
        "status --hosts web0 --json": ["--hosts", "web0", "--json"],
    }.items():
        figures[name] = command_times(url, args, runs)
    return figures


def run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    if not args.no_fill:
        asyncio.run(fill_at(url, args.hosts, args.sources))
    return asyncio.run(measure(url, args.runs))


async def fill_at(url: str, hosts: int, sources: int) -> None:
    redis = aioredis.from_url(url, decode_responses=True)
    try:
        await fill(redis, hosts, sources)
    finally:
        await redis.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=1_000_000, help="hosts known")
    parser.add_argument("--sources", type=int, default=10, help="sources they belong to")
    parser.add_argument("--runs", type=int, default=5, help="times each command is run")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the figures here")
    parser.add_argument(
        "--redis", metavar="URL", help="fill and measure this Redis instead of one of its own"
    )
    parser.add_argument(
        "--no-fill", action="store_true", help="measure --redis as it is (filled by a run before)"
    )
    args = parser.parse_args()
    figures: dict[str, Any] = {"hosts": args.hosts, "sources": args.sources}
    if args.redis:
        figures |= run(args.redis, args)
    else:
        with tempfile.TemporaryDirectory() as folder, RedisServer(log_dir=folder).start() as server:
            figures |= run(server.url, args)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
