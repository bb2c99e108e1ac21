"""``python -m bench.host_state``: what a host costs, in Redis and in a worker (issue 38,
point 2).

Against a real redis-server started on a free loopback port (the local stack's, as
``image-crawler up`` starts it), ``--hosts`` distinct host names (20,000 by default)
each go through the worker's own per-host code, as a worker meets a new host whose one
image it crawls; nothing leaves the machine (the files are served by a fake fetcher):

- its name resolved by the worker's ``CachingResolver`` (a fake c-ares client answers);
- its robots.txt and tdmrep.json asked for by ``RobotsGuard.check``, each on a pacing
  slot of ``RedisPacer`` (the pacing script writes ``pace_host:`` and ``host_index:``),
  the answer one of a realistic mix (test/harness/robots_mix.py: real files of popular
  sites, in the shares of file / no rules / 4xx / 5xx Common Crawl measured over the top
  2 million sites; one host in a hundred has a tdmrep.json), written to ``robots:`` by
  the guard itself;
- its image: queued in ``HostQueues``, its slot taken from ``RedisPacer``, its answer
  time given to ``LatencyWatch`` and its status reported to the pacer (a 500 for one host
  in fifty; six in a row, which halt it by its breaker, for one in a thousand).

Then it reports Redis' memory per host (``INFO memory`` used_memory before and after,
over the hosts) and by key kind (``MEMORY USAGE`` of a sample of each kind's keys, times
their count; a sorted set's member as its key's usage over its members), checks that
every per-host key expires, and measures what is left once the hosts are idle by moving
every key's expiry earlier (``PEXPIRE`` by its ``PTTL`` less the idle time, ``DEL`` when
that is past): 11 minutes idle (pacing state gone) and a day and 2 minutes (robots.txt
entries gone). The worker's side: this process's RSS and ``tracemalloc``'s traced memory
after the hosts, against after a warm-up of ``--warmup`` hosts.

Then ``--seen`` hosts (1,000,000 by default) pass through the worker's per-host
structures without Redis. Writes ``bench/results/host-state.md`` and ``.json``. On 2
cores shared with other runs: about 340 hosts/s through Redis, 17,000 hosts/s seen
(4,600 with ``--trace``); the defaults take about 3 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import gc
import json
import os
import platform
import resource
import tempfile
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from redis.asyncio import Redis

from crawlctl.localstack.services import RedisServer
from image_crawler import contract as c
from image_crawler.config import RedisSettings
from image_crawler.lifecycle import cancel_and_wait
from image_crawler.logs import configure_logging
from test.harness.robots_mix import (
    CLIENT_ERROR,
    MIX,
    SERVER_ERROR,
    TDMREP_FILE,
    files,
    has_tdmrep,
    host_outcome,
)
from worker.download.dns import CachingResolver
from worker.download.fetch import FetchResult
from worker.host_queues import START, HostQueues, Waiting
from worker.politeness.hosts import HostKey, HostSettings
from worker.politeness.latency import LatencyWatch
from worker.politeness.pacing import HostWaits, PacingSettings, RedisPacer
from worker.politeness.robots import Robots, RobotsEntry, RobotsGuard
from worker.politeness.robots_rules import decided_rules
from worker.settings import RobotsSettings

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "web"
# The source's rate: high enough that it never holds a host's first slots back.
SOURCE_RPS = 1_000_000
# The per-host key kinds, by prefix, and the sorted sets whose members are per host.
KINDS = ("pace_host:", "robots:", "robots_lock:")
SETS = (c.host_index_key(SOURCE), c.hosts60s_key(SOURCE), c.error_hosts60s_key(SOURCE))
SAMPLED_KEYS = 3000
# As the worker builds its client (worker/__main__.py): a bounded pool, waited for.
POOL_SIZE = 256
# Idle times after which what is left is measured: the pacing state's expiry (10 minutes
# idle) passed, and the robots.txt cache's day.
IDLE_S = (11 * 60.0, 86_400.0 + 120.0)


def host_name(i: int) -> str:
    return f"img{i}.site{i % 997}.example"


def index_of(host: str) -> int:
    return int(host.split(".", 1)[0].removeprefix("img"))


class MixFetcher:
    """Serves every host's robots.txt and tdmrep.json from the mix, with no network."""

    def __init__(self) -> None:
        self._tdmrep = TDMREP_FILE.encode()

    async def fetch_text(self, url: str, max_bytes: int, max_redirects: int) -> FetchResult:
        host, _, path = url.removeprefix("https://").partition("/")
        i = index_of(host.partition(":")[0])
        if path == "robots.txt":
            outcome, text = host_outcome(i)
            if outcome == CLIENT_ERROR:
                return FetchResult("404")
            if outcome == SERVER_ERROR:
                return FetchResult("503")
            return FetchResult("200", body=text.encode(), response_s=0.01)
        if has_tdmrep(i):
            return FetchResult("200", body=self._tdmrep, response_s=0.01)
        return FetchResult("404")


class OneAddress:
    """A c-ares client that answers every name with one address, at once."""

    async def getaddrinfo(self, host: str, family: int = 0, *, type: int = 0) -> Any:
        node = SimpleNamespace(ttl=300, family=2, addr=(b"192.0.2.1", 0))
        return SimpleNamespace(nodes=[node], cnames=[])

    async def close(self) -> None:
        pass


class Worker:
    """The per-host machinery of one worker process, driven for one image per host."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        # A new host starts fast and Crawl-delays are capped short, so that a million hosts
        # go through in minutes: the state each leaves is the same (its hash holds its
        # rate, slow start and delay whatever their values).
        self.pacer = RedisPacer(redis, PacingSettings(), HostSettings(start_rps=1000.0))
        robots = RobotsSettings(max_crawl_delay_s=0.01)
        self.guard = RobotsGuard(redis, MixFetcher(), self.pacer, robots)
        self.resolver = CachingResolver(dns=OneAddress)
        self.queues: HostQueues[int] = HostQueues(self.pacer.interval_of)
        self.latency = LatencyWatch()
        self.outcomes: dict[str, int] = {}

    async def host(self, i: int) -> None:
        name = host_name(i)
        await self.resolver.resolve(name, 443)
        answer = await self.guard.check(SOURCE, f"https://{name}/images/{i}.jpg")
        self.outcomes[answer.value] = self.outcomes.get(answer.value, 0) + 1
        if answer is not Robots.ALLOWED:
            return
        key = HostKey(SOURCE, name)
        now = asyncio.get_running_loop().time()
        entry = Waiting(key, 0, i, None, now)
        if self.queues.offer(entry, 100, now) == START:
            self.queues.started(key)
        await self.pacer.acquire(key)
        self.queues.granted(key, 100, now)
        self.latency.observe(key, 0.05)
        failures = 6 if i % 1000 == 1 else 1 if i % 50 == 1 else 0
        for _ in range(failures):
            self.pacer.report(key, "500")
        if failures:  # the reports go with the host's next ask, which may halt it
            with contextlib.suppress(HostWaits):
                await self.pacer.acquire(key, defer=True)
        else:
            self.pacer.report(key, "200")
        self.queues.ended(key, 100, now, granted=True)

    def close(self) -> None:
        self.pacer.close()
        self.guard.close()


async def drive(worker: Worker, first: int, last: int, concurrency: int) -> float:
    """Hosts ``first`` to ``last - 1`` through ``worker``, ``concurrency`` at once; the
    time it took (s)."""
    started = time.monotonic()
    pending: set[asyncio.Task[None]] = set()
    for i in range(first, last):
        pending.add(asyncio.create_task(worker.host(i)))
        if len(pending) >= concurrency:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        if i % 100_000 == 0 and i > first:
            print(f"  {i:,} hosts, {time.monotonic() - started:.0f} s", flush=True)
    await asyncio.gather(*pending)
    return time.monotonic() - started


async def see(worker: Worker, first: int, last: int) -> None:
    """Hosts ``first`` to ``last - 1`` as they pass through the worker's in-memory
    structures, without Redis: a name resolved, a URL queued, started and ended, an
    answer time, an interval noted as the pacer notes each host it asked about, and the
    host's robots.txt kept parsed as the guard keeps it (the hosts that stay parsed, the
    last ``local_hosts``, each from its own parse; the others from their file's)."""
    guard, now = worker.guard, time.time()
    templates: dict[str, Any] = {}
    keep_from = last - guard._settings.local_hosts
    for i in range(first, last):
        name = host_name(i)
        await worker.resolver.resolve(name, 443)
        key = HostKey(SOURCE, name)
        entry = Waiting(key, 0, i, None, 0.0)
        if worker.queues.offer(entry, 100, 0.0) == START:
            worker.queues.started(key)
        worker.queues.granted(key, 100, 0.0)
        worker.queues.ended(key, 100, 0.0, granted=True)
        worker.latency.observe(key, 0.05)
        worker.pacer._note_interval(key, 0.001)
        outcome, text = host_outcome(i)
        known = templates.get(text) if i < keep_from else None
        if known is None:
            decided = None if outcome == CLIENT_ERROR else decided_rules(text, "image-crawler")
            known = guard._parsed(RobotsEntry("200", decided, now, now + 86_400, token="t"))
            templates.setdefault(text, known)
        guard._remember(f"https://{name}:443", known)
        if i % 100_000 == 0 and i > first:
            print(f"  {i:,} hosts seen", flush=True)


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker_sizes(worker: Worker) -> dict[str, int]:
    """How many hosts each per-host structure of the worker holds now."""
    pacer, queues = worker.pacer, worker.queues
    return {
        "dns_cache": worker.resolver.cached,
        "robots_known": len(worker.guard._known),
        "pacer_intervals": len(pacer._intervals),
        "pacer_other": sum(
            len(m)
            for m in (
                pacer._waiters,
                pacer._next_ask,
                pacer._due_at,
                pacer._granted_at,
                pacer._promised,
                pacer._late_in_row,
                pacer._reports,
            )
        ),
        "latency_baselines": len(worker.latency),
        "host_queues": len(queues._queues)
        + len(queues._running)
        + len(queues._fetching)
        + len(queues._blocked),
    }


async def used_memory(redis: Redis) -> int:
    return int((await redis.info("memory"))["used_memory"])


async def open_pool(redis: Redis, size: int) -> None:
    """Opens the client's ``size`` connections before the baseline is taken: Redis counts
    some 50 KB for each (its buffers; measured, 256 connections: +12.8 MB), a cost of
    the connections, not of the hosts (the first figures, at 3,000 hosts, counted them
    as 1,513 bytes a host)."""
    await asyncio.gather(*(redis.execute_command("PING") for _ in range(size)))


async def key_costs(redis: Redis, hosts: int) -> dict[str, Any]:
    """Each per-host kind: how many keys, their mean ``MEMORY USAGE`` (sampled), bytes per
    host; and each per-host sorted set's usage per host."""
    kinds: dict[str, Any] = {}
    for prefix in KINDS:
        count, sample = 0, list[str]()
        async for key in redis.scan_iter(match=f"{prefix}*", count=10_000):
            count += 1
            if len(sample) < SAMPLED_KEYS:
                sample.append(key)
        sizes = [await redis.memory_usage(k) or 0 for k in sample]
        mean = sum(sizes) / len(sizes) if sizes else 0.0
        kinds[prefix] = {
            "keys": count,
            "mean_bytes": round(mean, 1),
            "bytes_per_host": round(mean * count / hosts, 1),
        }
    for key in SETS:
        members = await redis.zcard(key)
        usage = await redis.memory_usage(key, samples=0) or 0
        kinds[key] = {
            "keys": members,
            "mean_bytes": round(usage / members, 1) if members else 0,
            "bytes_per_host": round(usage / hosts, 1),
        }
    return kinds


async def expiry_check(redis: Redis) -> dict[str, Any]:
    """Every key's time to live: how many have none (they never expire), by prefix."""
    without: dict[str, int] = {}
    longest_s = 0.0
    keys = 0
    batch: list[str] = []

    async def check(batch: list[str]) -> None:
        nonlocal longest_s
        async with redis.pipeline(transaction=False) as pipe:
            for key in batch:
                pipe.pttl(key)
            for key, ttl in zip(batch, await pipe.execute(), strict=True):
                if ttl == -1:
                    kind = key.split(":", 1)[0] + ":"
                    without[kind] = without.get(kind, 0) + 1
                longest_s = max(longest_s, ttl / 1000)

    async for key in redis.scan_iter(count=10_000):
        keys += 1
        batch.append(key)
        if len(batch) >= 10_000:
            await check(batch)
            batch = []
    await check(batch)
    return {"keys": keys, "without_expiry": without, "longest_ttl_s": round(longest_s)}


async def advance(redis: Redis, idle_s: float) -> int:
    """Move every key's expiry ``idle_s`` earlier, deleting those that would have
    expired by then (as Redis would have after ``idle_s`` of nobody writing them);
    how many were deleted."""
    deleted = 0
    keys = [k async for k in redis.scan_iter(count=10_000)]
    for first in range(0, len(keys), 10_000):
        batch = keys[first : first + 10_000]
        async with redis.pipeline(transaction=False) as pipe:
            for key in batch:
                pipe.pttl(key)
            ttls = await pipe.execute()
        async with redis.pipeline(transaction=False) as pipe:
            for key, ttl in zip(batch, ttls, strict=True):
                if ttl < 0:
                    continue
                left = ttl - int(idle_s * 1000)
                if left <= 0:
                    pipe.unlink(key)
                    deleted += 1
                else:
                    pipe.pexpire(key, left)
            await pipe.execute()
    return deleted


async def measure_redis(redis_url: str, hosts: int, concurrency: int) -> dict[str, Any]:
    """``hosts`` hosts through the worker's real per-host path (Redis included): Redis'
    bytes per host, by kind, active and idle."""
    redis = RedisSettings(url=redis_url).client(decode_responses=True, pool_size=POOL_SIZE)
    await redis.set(c.pace_rate_key(SOURCE), str(SOURCE_RPS), px=3_600_000)
    worker = Worker(redis)
    runner = asyncio.create_task(worker.pacer.run())
    try:
        await open_pool(redis, POOL_SIZE)
        before = await used_memory(redis)
        took_s = await drive(worker, 0, hosts, concurrency)
    finally:
        await cancel_and_wait([runner])
        worker.close()
    active = await used_memory(redis)
    report = {
        "hosts": hosts,
        "took_s": round(took_s, 1),
        "hosts_per_s": round(hosts / took_s),
        "robots_answers": worker.outcomes,
        "mix": dict(MIX),
        "redis_used_memory_bytes_per_host": round((active - before) / hosts, 1),
        "by_kind": await key_costs(redis, hosts),
        "expiry": await expiry_check(redis),
    }
    idle: list[dict[str, Any]] = []
    for idle_s in IDLE_S:
        deleted = await advance(redis, idle_s - (idle[-1]["idle_s"] if idle else 0))
        left = await used_memory(redis)
        idle.append(
            {
                "idle_s": idle_s,
                "keys_deleted": deleted,
                "keys_left": await redis.dbsize(),
                "bytes_per_host": round((left - before) / hosts, 1),
                "by_kind": await key_costs(redis, hosts),
            }
        )
    report["idle"] = idle
    await redis.aclose()
    return report


async def measure_worker(
    redis_url: str, seen: int, warmup: int, trace: bool = False
) -> dict[str, Any]:
    """A worker's memory growth for ``seen`` hosts through its per-host structures. With
    ``trace``, also what ``tracemalloc`` traces; its own tables then swell the RSS (at
    150,000 hosts: +201 MiB traced, +69 MiB not) and it slows the run nearly fourfold,
    so the RSS figure is taken without it."""
    redis = RedisSettings(url=redis_url).client(decode_responses=True)
    worker = Worker(redis)
    files()  # the mix, read before the baseline
    await see(worker, 10_000_000, 10_000_000 + warmup)
    gc.collect()
    rss_before = rss_bytes()
    if trace:
        tracemalloc.start()
    started = time.monotonic()
    await see(worker, 0, seen)
    took_s = time.monotonic() - started
    gc.collect()
    traced, traced_peak = 0, 0
    if trace:
        traced, traced_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    rss_after = rss_bytes()
    worker.close()
    await redis.aclose()
    return {
        "hosts_seen": seen,
        "took_s": round(took_s, 1),
        "traced": trace,
        "rss_mib": round((rss_after - rss_before) / 2**20, 1),
        "traced_mib": round(traced / 2**20, 1),
        "traced_peak_mib": round(traced_peak / 2**20, 1),
        "structures": worker_sizes(worker),
        "maxrss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def render(report: dict[str, Any], when: str) -> str:
    hosts, w = report["hosts"], report["worker"]
    lines = [
        "# What a host costs (python -m bench.host_state)",
        "",
        f"{when}, {platform.machine()}, {os.cpu_count()} CPUs; {hosts:,} hosts through the "
        f"worker's own code in {report['took_s']} s ({report['hosts_per_s']:,} hosts/s); "
        f"robots.txt answers: {report['robots_answers']}.",
        "",
        "| Redis, bytes per host | active | "
        + " | ".join(f"idle {i['idle_s'] / 60:.0f} min" for i in report["idle"])
        + " |",
        "| --- | --- | " + " | ".join("---" for _ in report["idle"]) + " |",
        f"| used_memory (INFO memory), all keys | {report['redis_used_memory_bytes_per_host']} | "
        + " | ".join(str(i["bytes_per_host"]) for i in report["idle"])
        + " |",
    ]
    for kind, cost in report["by_kind"].items():
        after = [i["by_kind"][kind]["bytes_per_host"] for i in report["idle"]]
        lines.append(
            f"| `{kind}` ({cost['keys']:,} keys or members, {cost['mean_bytes']} B each) | "
            f"{cost['bytes_per_host']} | " + " | ".join(str(a) for a in after) + " |"
        )
    expiry = report["expiry"]
    lines += [
        "",
        f"Keys without an expiry: {expiry['without_expiry'] or 'none'} of {expiry['keys']:,}; "
        f"longest time to live {expiry['longest_ttl_s']:,} s.",
        "",
        f"Worker, growth for {w['hosts_seen']:,} hosts seen (in {w['took_s']} s): RSS "
        f"{w['rss_mib']} MiB"
        + (
            f" (tracemalloc's own tables included), tracemalloc {w['traced_mib']} MiB "
            f"(peak {w['traced_peak_mib']} MiB)"
            if w.get("traced")
            else " (tracemalloc off)"
        )
        + f"; hosts held: {w['structures']}.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=20_000, help="through Redis")
    parser.add_argument("--seen", type=int, default=1_000_000, help="through a worker")
    parser.add_argument("--warmup", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument(
        "--trace", action="store_true", help="also trace the worker's allocations (slower)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "host-state.json")
    args = parser.parse_args()
    configure_logging("ERROR")  # a line per host's robots.txt would be most of the work
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(log_dir=tmp).start()
        try:
            report = asyncio.run(measure_redis(redis.url, args.hosts, args.concurrency))
            report["worker"] = asyncio.run(
                measure_worker(redis.url, args.seen, args.warmup, args.trace)
            )
        finally:
            redis.stop()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    args.out.write_text(json.dumps({"when": when, **report}, indent=1) + "\n")
    markdown = render(report, when)
    args.out.with_suffix(".md").write_text(markdown)
    print(markdown)


if __name__ == "__main__":
    main()
