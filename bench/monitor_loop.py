"""The monitor's loop with 1,000 and 10,000 sources, through ``bench.regulator``.

``bench.regulator.measure_loop`` seeds the sources (every one busy: a full last-50
list and a busy 60 s window) and times the regulator's loop, with a second of traffic
before each loop (every source a new status, one in ten a failure); it is used as is for
the durations. It reports no CPU, so after it the same regulator loop runs again on the
keys it seeded, with the same traffic, timed with ``time.process_time`` (this process:
the monitor's share) and psutil (redis-server's share). The largest size is measured
once more with every source failing between loops: the worst case, reported, not a
target.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from bench.procstats import ProcessTree
from bench.regulator import FAILING_EVERY, LoopMeasurement, add_traffic, measure_loop
from crawl_monitor.policy.rates import compute_crawl_rate
from crawl_monitor.regulator import Regulator, RegulatorSettings
from crawl_monitor.store import RedisRegulatorStore
from crawlctl.localstack.services import RedisServer


async def measure_monitor(sizes: list[int], log_dir: Path, loops: int = 5) -> list[dict[str, Any]]:
    """One fresh redis-server; for each size, the loop's duration and CPU (and its version)."""
    results = []
    with RedisServer(log_dir=log_dir / "monitor-redis") as server:
        assert server.pid is not None
        redis_tree = ProcessTree(server.pid)
        redis = aioredis.from_url(server.url, decode_responses=True)
        try:
            # Lua's cost per redis.call, most of the loop, differs between versions.
            version = (await redis.info("server")).get("redis_version", "?")
            # Each size as the target counts it, then the largest with every source failing.
            cases = [(n, FAILING_EVERY) for n in sizes] + ([(max(sizes), 1)] if sizes else [])
            for n, failing_every in cases:
                measured = await measure_loop(redis, n, loops=loops, failing_every=failing_every)
                cpu = await _loop_cpu(redis, measured, redis_tree, loops)
                results.append(
                    {
                        "sources": n,
                        "failing_every": failing_every,
                        "redis_version": version,
                        "loop_s_median": measured.median_s,
                        "loop_s_slowest": measured.slowest_s,
                        "loop_s_first": measured.first_s,
                        "round_trips_per_loop": measured.round_trips_per_loop,
                        **cpu,
                    }
                )
                await redis.flushall()
        finally:
            await redis.aclose()
    return results


async def _loop_cpu(
    redis: aioredis.Redis, measured: LoopMeasurement, redis_tree: ProcessTree, loops: int
) -> dict[str, float]:
    rates = {name: compute_crawl_rate(n) for name, n in measured.seeded.image_counts.items()}
    regulator = Regulator(RedisRegulatorStore(redis), lambda: rates, RegulatorSettings())
    await regulator.tick()  # loads the scripts, as measure_loop's first loop does
    cpu, wall = [], []
    # redis-server's CPU is read in clock ticks (10 ms) around each loop (not the traffic
    # between loops), summed, then divided.
    server_cpu = 0.0
    for loop in range(1, loops + 1):
        await add_traffic(redis, measured.seeded, loop, measured.failing_every)
        server_before = redis_tree.cpu_seconds()
        cpu_before, wall_before = time.process_time(), time.perf_counter()
        await regulator.tick()
        cpu.append(time.process_time() - cpu_before)
        wall.append(time.perf_counter() - wall_before)
        server_cpu += redis_tree.cpu_seconds() - server_before
    return {
        "loop_cpu_s_median": statistics.median(cpu),
        "loop_wall_s_median_of_cpu_loops": statistics.median(wall),
        "redis_server_cpu_s_per_loop": server_cpu / loops,
    }
