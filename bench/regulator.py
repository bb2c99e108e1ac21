"""How long one regulator loop takes with many sources, against a real Redis.

``measure_loop(redis, n_sources)`` seeds ``n_sources`` sources (every one with a full
last-50 list and a busy 60 s window, some halted, one failing, one overridden), runs the
regulator's loop a few times and reports the duration and Redis round trips of a loop.
Between loops every source gets a new status, as a worker records it: one in
``failing_every`` (other ones each loop) a failure, which makes the next loop read its
window (``failing_every=1``: every source, the worst case), and one in ``backoff_every``
a 503, a backoff signal that cuts its rate. The regulator's clock advances one period a
loop, so cuts and climbs happen as they would a second apart. It overwrites keys of the
``bench-*`` sources only (and their membership of ``crawl_delayed``). ``crawl_delayed``
sources get a robots.txt Crawl-delay of ``CRAWL_DELAY_S`` (a cap of 0.5/s). From a shell::

    REDIS_URL=redis://127.0.0.1:6379/0 python -m bench.regulator 1000 10000 \\
        --crawl-delayed 100
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import time
from typing import Final

import redis.asyncio as aioredis

from crawl_monitor.policy.decision import RegulatorSnapshot
from crawl_monitor.policy.rates import compute_crawl_rate
from crawl_monitor.regulator import Regulator, RegulatorSettings
from crawl_monitor.store import RedisRegulatorStore
from image_crawler.contract import (
    CRAWL_DELAYED_SET,
    HALTED_SET,
    LAST_N_STATUSES,
    OVERRIDE_RATE_PREFIX,
    STATUS_60S_PREFIX,
    TEMP_HALTED_SET,
    Status,
    backoff_signals_key,
    crawl_delay_key,
    last50_key,
    resize_errors_key,
    window_member,
)
from image_crawler.logs import configure_logging

WINDOW_SAMPLES: Final = 20
SEED_CHUNK: Final = 500
# One source in this many fails between two loops (a 404: counted, but trips nothing).
FAILING_EVERY: Final = 10
# One source in this many answers a 503 between two loops (a backoff signal).
BACKOFF_EVERY: Final = 20
# The robots.txt Crawl-delay of the crawl-delayed sources: a cap of 0.5/s.
CRAWL_DELAY_S: Final = 2.0


def bench_source(i: int) -> str:
    return f"bench-{i:06d}"


def bench_image_count(i: int) -> int:
    # Rates from 0.2/s up to ~100/s, most with a fractional part.
    return 5_000 + i * 25_013


@dataclasses.dataclass(frozen=True, slots=True)
class BenchSources:
    """Which of the seeded sources were set up to be special."""

    image_counts: dict[str, int]
    halted: frozenset[str]
    failing: str  # 50 failures in a row: trips the permanent halt
    erroring: str  # errors in its 60 s window: trips the temporary halt
    overridden: str
    override_rps: float
    # Sources with a crawl_delay key of CRAWL_DELAY_S (listed in crawl_delayed).
    crawl_delayed: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True, slots=True)
class LoopMeasurement:
    sources: int
    loops: int
    failing_every: int
    backoff_every: int
    # Median and slowest loop and round trips per loop, the first loop (which loads the
    # scripts) excluded.
    median_s: float
    slowest_s: float
    first_s: float
    round_trips_per_loop: float
    snapshot: RegulatorSnapshot
    seeded: BenchSources


async def seed(
    redis: aioredis.Redis,
    n_sources: int,
    now_s: float,
    *,
    busy_every: int = 1,
    crawl_delayed: int = 0,
) -> BenchSources:
    """Write the bench sources' statuses, halts, override and crawl delays.

    Every ``busy_every``-th source (and the special ones) has statuses: a full last-50
    list and ``WINDOW_SAMPLES`` statuses in its 60 s window; the others have none.
    ``crawl_delayed`` sources, spread among the others, have a crawl delay.
    """
    names = [bench_source(i) for i in range(n_sources)]
    halted = frozenset(names[i] for i in range(0, n_sources, 100))
    failing = names[1]
    erroring = names[2]
    overridden = names[3]
    await redis.delete(HALTED_SET, TEMP_HALTED_SET)
    for start in range(0, n_sources, SEED_CHUNK):
        async with redis.pipeline(transaction=False) as pipe:
            for i, name in enumerate(names[start : start + SEED_CHUNK], start):
                pipe.delete(
                    last50_key(name),
                    f"{STATUS_60S_PREFIX}{name}",
                    backoff_signals_key(name),
                    crawl_delay_key(name),
                )
                if i % busy_every and name not in (failing, erroring):
                    continue
                status = "500" if name == failing else "200"
                pipe.rpush(last50_key(name), *[status] * 50)
                window_status = "500" if name == erroring else "200"
                pipe.zadd(
                    f"{STATUS_60S_PREFIX}{name}",
                    {
                        window_member(window_status, now_s - k): now_s - k
                        for k in range(WINDOW_SAMPLES)
                    },
                )
            await pipe.execute()
    await redis.sadd(HALTED_SET, *halted)
    await redis.set(f"{OVERRIDE_RATE_PREFIX}{overridden}", "7.5")
    delayed = await _seed_crawl_delays(redis, names, crawl_delayed)
    return BenchSources(
        image_counts={name: bench_image_count(i) for i, name in enumerate(names)},
        halted=halted,
        failing=failing,
        erroring=erroring,
        overridden=overridden,
        override_rps=7.5,
        crawl_delayed=delayed,
    )


async def _seed_crawl_delays(redis: aioredis.Redis, names: list[str], count: int) -> frozenset[str]:
    # Offset 5: not one of the special sources (1-3); spread: none halted (every 100th)
    # while fewer than a fifth of them.
    step = max(1, len(names) // count) if count else 1
    delayed = frozenset(names[5 + k * step] for k in range(count) if 5 + k * step < len(names))
    if names:
        await redis.srem(CRAWL_DELAYED_SET, *names)
    if delayed:
        await redis.mset({crawl_delay_key(name): repr(CRAWL_DELAY_S) for name in delayed})
        await redis.sadd(CRAWL_DELAYED_SET, *delayed)
    return delayed


async def add_traffic(
    redis: aioredis.Redis,
    seeded: BenchSources,
    loop: int,
    failing_every: int = FAILING_EVERY,
    *,
    backoff_every: int = BACKOFF_EVERY,
) -> None:
    """A second of traffic: a new status for every source but the failing and erroring
    ones, written as a worker's flush writes it (window, last-50 list, the failure counter
    for a failure and the backoff signal counter for a backoff status): a 404 for one in
    ``failing_every``, else a 503 for one in ``backoff_every`` (0: none), others each
    ``loop``."""
    now_s = time.time()
    names = list(seeded.image_counts)
    for start in range(0, len(names), SEED_CHUNK):
        async with redis.pipeline(transaction=False) as pipe:
            for i, name in enumerate(names[start : start + SEED_CHUNK], start):
                if name in (seeded.failing, seeded.erroring):
                    continue
                status: str = Status.OK
                if (i + loop) % failing_every == 0:
                    status = Status.NOT_FOUND
                elif backoff_every and (i + loop) % backoff_every == 1:
                    status = Status.SERVICE_UNAVAILABLE
                pipe.zadd(f"{STATUS_60S_PREFIX}{name}", {window_member(status, now_s): now_s})
                pipe.rpush(last50_key(name), status)
                pipe.ltrim(last50_key(name), -LAST_N_STATUSES, -1)
                if status != Status.OK:
                    pipe.incr(resize_errors_key(name))
                if status == Status.SERVICE_UNAVAILABLE:
                    pipe.incr(backoff_signals_key(name))
            await pipe.execute()


async def measure_loop(
    redis: aioredis.Redis,
    n_sources: int,
    *,
    loops: int = 5,
    busy_every: int = 1,
    failing_every: int = FAILING_EVERY,
    backoff_every: int = BACKOFF_EVERY,
    crawl_delayed: int = 0,
) -> LoopMeasurement:
    """Seed ``n_sources`` sources and time ``loops`` regulator loops, with a second of
    traffic (``add_traffic``, not timed) before each but the first.

    By default every source is busy (see ``seed``), one in ``failing_every`` failed and
    one in ``backoff_every`` was asked to slow down since the last loop; ``crawl_delayed``
    sources have a robots.txt Crawl-delay.
    """
    started_s = time.time()
    seeded = await seed(
        redis, n_sources, started_s, busy_every=busy_every, crawl_delayed=crawl_delayed
    )
    rates = {name: compute_crawl_rate(n) for name, n in seeded.image_counts.items()}
    store = RedisRegulatorStore(redis)
    settings = RegulatorSettings()
    loop = 0
    regulator = Regulator(
        store, lambda: rates, settings, clock=lambda: started_s + loop * settings.period_s
    )
    durations = []
    round_trips = []
    snapshot = None
    for loop in range(loops):
        if loop:
            await add_traffic(redis, seeded, loop, failing_every, backoff_every=backoff_every)
        started, before = time.perf_counter(), store.round_trips
        snapshot = await regulator.tick()
        durations.append(time.perf_counter() - started)
        round_trips.append(store.round_trips - before)
    assert snapshot is not None
    steady = durations[1:] or durations
    steady_round_trips = round_trips[1:] or round_trips
    return LoopMeasurement(
        sources=n_sources,
        loops=loops,
        failing_every=failing_every,
        backoff_every=backoff_every,
        median_s=statistics.median(steady),
        slowest_s=max(steady),
        first_s=durations[0],
        round_trips_per_loop=sum(steady_round_trips) / len(steady_round_trips),
        snapshot=snapshot,
        seeded=seeded,
    )


async def _bench(url: str, sizes: list[int], crawl_delayed: int) -> None:
    # As the monitor logs, but only warnings: the bench's churn of pacing changes would
    # drown the figures.
    configure_logging("WARNING")
    redis = aioredis.from_url(url, decode_responses=True)
    try:
        for n, busy_every in [(size, b) for size in sizes for b in (1, 10, size)]:
            m = await measure_loop(redis, n, busy_every=busy_every, crawl_delayed=crawl_delayed)
            print(
                f"{n:>6} sources, 1 in {busy_every} busy, 1 in {m.failing_every} failing, "
                f"1 in {m.backoff_every} backing off, {len(m.seeded.crawl_delayed)} "
                "crawl-delayed: median "
                f"{m.median_s * 1000:.1f} ms, slowest "
                f"{m.slowest_s * 1000:.1f} ms, first {m.first_s * 1000:.1f} ms, "
                f"{m.round_trips_per_loop:g} round trips per loop"
            )
    finally:
        await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description="Time the regulator's loop (see the module).")
    parser.add_argument("sizes", nargs="*", type=int, default=[1000, 10000])
    parser.add_argument(
        "--crawl-delayed", type=int, default=0, help="sources with a robots.txt Crawl-delay"
    )
    args = parser.parse_args()
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    asyncio.run(_bench(url, args.sizes, args.crawl_delayed))


if __name__ == "__main__":
    main()
