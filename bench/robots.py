"""``python -m bench.robots``: what robots.txt costs the crawl.

Against a real redis-server and local origins on loopback (one per host, on addresses
127.0.3.1 onwards), with the worker's own ``RobotsGuard``, ``Fetcher`` and ``RedisPacer``:

- fetches per host: two workers (each its own Redis client and HTTP session) ask about
  200 URLs of each new host at once, then a third, as if restarted, asks again;
- the time a new host's first URL waits for its robots.txt (fetch, Redis, pacing slot),
  for one worker alone and for two at once;
- the cost of a check per URL once the host is known, for a typical file (about 20
  rules) and for one of 512 KiB (about 16,000 rules), and Protego's parse of each.

Writes ``bench/results/robots.md`` and ``.json``. About 20 seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from crawlctl.localstack.services import RedisServer
from image_crawler import contract as c
from image_crawler.lifecycle import cancel_and_wait
from test.harness.origin import Origin
from worker.download.fetch import Fetcher, new_session
from worker.download.netguard import AddressPolicy, parse_networks
from worker.politeness.pacing import RedisPacer
from worker.politeness.robots import RobotsGuard
from worker.politeness.robots_rules import RobotsRules
from worker.settings import FetchSettings, RobotsSettings

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "bench"
FETCH = FetchSettings()
LOOPBACK = AddressPolicy(parse_networks("127.0.0.0/8"))
TYPICAL = "\n".join(
    [
        "User-agent: *",
        *(f"Disallow: /private{i}/" for i in range(10)),
        "",
        "User-agent: image-crawler",
        *(f"Disallow: /p{i}/*.gif$" for i in range(8)),
        "Allow: /p0/ok",
        "Crawl-delay: 0",
        "",
    ]
)


def big_file(limit: int = c.ROBOTS_MAX_BYTES) -> str:
    lines = ["User-agent: *"]
    size, i = 14, 0
    while size < limit - 64:
        line = f"Disallow: /section-{i}/*/page-{i}.html$"
        lines.append(line)
        size += len(line) + 1
        i += 1
    return "\n".join(lines) + "\n"


class Worker:
    """One worker's robots.txt machinery: its own Redis client, session and pacer."""

    def __init__(self, redis_url: str) -> None:
        self.redis = Redis.from_url(redis_url, decode_responses=True)
        self.session = new_session(FETCH, LOOPBACK)
        self.pacer = RedisPacer(self.redis)
        self.guard = RobotsGuard(
            self.redis, Fetcher(self.session, FETCH, LOOPBACK), self.pacer, RobotsSettings()
        )
        self.task = asyncio.create_task(self.pacer.run())

    async def close(self) -> None:
        await cancel_and_wait([self.task])
        self.pacer.close()
        self.guard.close()
        await self.session.close()
        await self.redis.aclose()


async def first_answer_s(worker: Worker, url: str) -> float:
    started = time.perf_counter()
    await worker.guard.verdict(SOURCE, url)
    return time.perf_counter() - started


async def fetches_and_waits(redis_url: str, hosts: Sequence[Origin]) -> dict[str, Any]:
    workers = [Worker(redis_url) for _ in range(2)]
    try:
        await workers[0].redis.set(c.pace_rate_key(SOURCE), "10000", px=600_000)
        alone = [await first_answer_s(workers[0], h.url("/a.jpg")) for h in hosts[:10]]
        pairs = []
        for host in hosts[10:]:
            waits = await asyncio.gather(
                *(first_answer_s(w, host.url(f"/{i}.jpg")) for w in workers for i in range(200))
            )
            pairs.append(max(waits))
        restarted = Worker(redis_url)
        try:
            for host in hosts:
                await restarted.guard.verdict(SOURCE, host.url("/again.jpg"))
        finally:
            await restarted.close()
        fetches = [h.requests("/robots.txt") for h in hosts]
        return {
            "hosts": len(hosts),
            "robots_fetches_per_host": {"min": min(fetches), "max": max(fetches)},
            "fetches_after_restart": restarted.guard.fetches,
            "new_host_wait_ms_one_worker": _spread(alone),
            "new_host_wait_ms_two_workers_400_urls": _spread(pairs),
        }
    finally:
        for worker in workers:
            await worker.close()


def _spread(seconds: Sequence[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in seconds)
    return {"median": round(statistics.median(ms), 2), "max": round(ms[-1], 2)}


async def check_cost(redis_url: str, host: Origin, text: str, urls: int) -> dict[str, Any]:
    host.set_robots(text)
    worker = Worker(redis_url)
    try:
        await worker.redis.delete(c.robots_key(f"http://{host.host}:{host.port}"))
        await worker.redis.set(c.pace_rate_key(SOURCE), "10000", px=600_000)
        paths = [host.url(f"/section-{i % 997}/x/page-{i}.html") for i in range(urls)]
        await worker.guard.verdict(SOURCE, paths[0])
        started = time.perf_counter()
        for url in paths:
            await worker.guard.verdict(SOURCE, url)
        per_url_us = (time.perf_counter() - started) / urls * 1e6
    finally:
        await worker.close()
    parse_started = time.perf_counter()
    rules = RobotsRules.parse(text, "image-crawler")
    rules.allows(paths[0])  # Protego finishes its rule set on first use
    parse_ms = (time.perf_counter() - parse_started) * 1000
    return {
        "bytes": len(text.encode()),
        "rules": text.count("\nDisallow") + text.count("\nAllow"),
        "check_us_per_url": round(per_url_us, 1),
        "parse_ms": round(parse_ms, 1),
    }


async def measure(redis_url: str) -> dict[str, Any]:
    hosts = [Origin(host=f"127.0.3.{i}").start() for i in range(1, 31)]
    try:
        for host in hosts:
            host.set_robots(TYPICAL)
        report = {"fetches": await fetches_and_waits(redis_url, hosts)}
        report["typical"] = await check_cost(redis_url, hosts[0], TYPICAL, 20_000)
        report["big"] = await check_cost(redis_url, hosts[-1], big_file(), 2_000)
        return report
    finally:
        for host in hosts:
            host.stop()


def render(report: dict[str, Any], when: str) -> str:
    f, typical, big = report["fetches"], report["typical"], report["big"]
    one, two = f["new_host_wait_ms_one_worker"], f["new_host_wait_ms_two_workers_400_urls"]
    lines = [
        "# robots.txt: what it costs",
        "",
        f"`python -m bench.robots`, {when}, {platform.machine()}, Python "
        f"{platform.python_version()}; a real redis-server, local origins on loopback.",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| robots.txt fetches per host, 2 workers asking 200 URLs each at once, then a "
        f"restarted worker ({f['hosts']} hosts) | {f['robots_fetches_per_host']['min']}-"
        f"{f['robots_fetches_per_host']['max']} (restarted worker: "
        f"{f['fetches_after_restart']}) |",
        f"| a new host's first URL waits for its robots.txt, one worker | median "
        f"{one['median']} ms, max {one['max']} ms |",
        f"| the same, 2 workers x 200 URLs at once (the last answered) | median "
        f"{two['median']} ms, max {two['max']} ms |",
        f"| check per URL, known host, typical file ({typical['rules']} rules, "
        f"{typical['bytes']} B) | {typical['check_us_per_url']} us |",
        f"| check per URL, known host, 512 KiB file ({big['rules']} rules) | "
        f"{big['check_us_per_url']} us |",
        f"| parse, typical / 512 KiB file (once per host and worker a day) | "
        f"{typical['parse_ms']} ms / {big['parse_ms']} ms |",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "robots.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(log_dir=tmp).start()
        try:
            report = asyncio.run(measure(redis.url))
        finally:
            redis.stop()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    args.out.write_text(json.dumps({"when": when, **report}, indent=1) + "\n")
    markdown = render(report, when)
    args.out.with_suffix(".md").write_text(markdown)
    print(markdown)


if __name__ == "__main__":
    main()
