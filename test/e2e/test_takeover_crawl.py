"""A take-over keeps the cut, as the server sees it: two real monitors (``python -m
crawl_monitor``) and a real worker crawl a source configured at 50 requests/s whose
server takes 20/s and answers 503 beyond. While the leader is finding that capacity (its
published rate cut below it), it is SIGKILLed; the standby takes the lease once it
expires and resumes from the rate the leader published, not from 50/s.

Measured at the origin (its request log and its 503s, monotonic times in this process)
from 5 s before the kill to 30 s after the first request under the new leader: the
requests in any 1 s window (at most 22) and the share of 503s (at most 5%). A new leader
starting at the configured 50/s shows both: ~50 requests in its first second, and a
burst of 503s until its cuts (0.7 a second) bring the rate back under 20/s.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from datetime import datetime

import pytest
from redis.asyncio import Redis

from image_crawler import contract as c
from test.harness.crawl import Capacity, Crawl, sources_file, tiny_jpeg
from test.harness.origin import Origin
from test.harness.processes import CrawlerProcess
from test.harness.services import wait_for
from test.harness.windows import max_in_window
from worker.politeness.hosts import HostState

LIMITED, CONFIGURED_RPS, CAPACITY_RPS = "limited", 50.0, 20.0
# The targets, across the take-over: requests in any 1 s, and the share of 503s.
BURST_LIMIT, REFUSED_SHARE_LIMIT = 22, 0.05
# The leader is killed once its discovery has been under way this long (the first
# seconds at 50/s are the discovery's own burst, not the take-over's)...
DISCOVERING_FOR_S = 15.0
# ...and the measured stretch runs from this long before the kill...
BEFORE_KILL_S = 5.0
# ...to this long after the first request under the new leader.
AFTER_RESUME_S = 30.0
# The old leader's last pace_rate outlives it by at most its TTL (1.5 s): a request after
# this is paced by the new leader.
OLD_RATE_GONE_S = 1.6


def request_times(origin: Origin, since: float = -math.inf) -> list[float]:
    prefix = f"/{LIMITED}/"
    return sorted(t for t, path in origin.request_log if path.startswith(prefix) and t >= since)


def per_second(times: Sequence[float], start: float, end: float) -> list[int]:
    counts = [0] * max(0, math.ceil(end - start))
    for t in times:
        if start <= t < end:
            counts[int(t - start)] += 1
    return counts


async def published(redis: Redis) -> c.PacingInfo | None:
    raw = await redis.hget(c.RATES_HASH, LIMITED)
    return None if raw is None else c.PacingInfo.from_json(raw)


async def host_state(redis: Redis) -> HostState:
    fields = await redis.hgetall(c.pace_host_key(LIMITED, "127.0.0.1"))
    return HostState.from_hash(
        {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in fields.items()
        }
    )


async def cut_below_capacity(redis: Redis, since: float) -> HostState | None:
    """The host's state once it has been discovering for a while and holds a rate cut
    below the server's capacity (None until then). The cut is the host's, in its pacing
    hash, which no monitor writes: a take-over cannot lose it."""
    if time.monotonic() < since + DISCOVERING_FOR_S:
        return None
    state = await host_state(redis)
    if state.rate is None or state.cut_at is None or state.rate >= CAPACITY_RPS:
        return None
    return state


@pytest.mark.timing(
    "asserts requests per 1 s window and the 503 share at the origin across the take-over"
)
@pytest.mark.timeout(300)
async def test_a_take_over_during_capacity_discovery_keeps_the_cut(
    kafka, redis, redis_url, origin, tmp_path
):
    server = Capacity(tiny_jpeg(), CAPACITY_RPS)
    # More than the run takes (~70 s at 20/s at most), so there is a backlog throughout.
    urls = [origin.add_handler(f"/{LIMITED}/{i}.jpg", server) for i in range(3000)]
    crawl = Crawl(kafka, redis_url, tmp_path)
    standby = None
    try:
        await crawl.queue(redis, LIMITED, CONFIGURED_RPS, urls)
        await crawl.start(redis, [LIMITED], workers=1)
        leader = crawl.monitor
        assert leader is not None
        token = (await asyncio.to_thread(leader.wait_for_event, "leadership_acquired", 20))["token"]
        # A second monitor as Crawl.start ran the first: same environment, same sources.
        env = {
            **kafka.env,
            "REDIS_URL": redis_url,
            "SOURCES_FILE": sources_file(tmp_path, **{LIMITED: 10**6}),
        }
        standby = CrawlerProcess("crawl_monitor", env, tmp_path / "standby.log")
        standing_by = await asyncio.to_thread(standby.wait_for_event, "leadership_standby", 30)
        assert standing_by["holder"] == token

        await wait_for(lambda: request_times(origin), 30, what="the first request")
        started = request_times(origin)[0]
        at_kill = await wait_for(
            lambda: cut_below_capacity(redis, started),
            DISCOVERING_FOR_S + 60,
            interval_s=0.1,
            what=f"the published rate cut below {CAPACITY_RPS:g}/s",
        )
        leader.process.kill()
        killed_at, killed_wall = time.monotonic(), time.time()
        leader.wait(10)

        taken = await asyncio.to_thread(standby.wait_for_event, "leadership_acquired", 20)
        resumed = await wait_for(
            lambda: request_times(origin, since=killed_at + OLD_RATE_GONE_S),
            20,
            interval_s=0.05,
            what="requests under the new leader",
        )
        resumed_at = resumed[0]
        at_resume = await host_state(redis)
        await wait_for(
            lambda: time.monotonic() >= resumed_at + AFTER_RESUME_S,
            AFTER_RESUME_S + 10,
            interval_s=0.2,
            what=f"{AFTER_RESUME_S:g} s under the new leader",
        )
        start, end = killed_at - BEFORE_KILL_S, resumed_at + AFTER_RESUME_S

        times = [t for t in request_times(origin) if start <= t < end]
        refused = [t for t in server.refused if start <= t < end]
        busiest = max_in_window(times, 1.0)
        share = len(refused) / len(times)
        first_second = [t for t in times if resumed_at <= t < resumed_at + 1.0]
        lease_taken_s = datetime.fromisoformat(taken["time"]).timestamp() - killed_wall
        print(
            f"\nleader killed at a host rate of {at_kill.rate:.2f}/s, "
            f"{killed_at - started:.1f} s into discovery; lease taken {lease_taken_s:.2f} s "
            f"and requests again {resumed_at - killed_at:.2f} s after the kill; "
            f"the host's rate then: {at_resume.rate}"
        )
        print(
            f"from {BEFORE_KILL_S:g} s before the kill to {AFTER_RESUME_S:g} s after the "
            f"resumption: {len(times)} requests, {len(refused)} refused ({share:.2%}); "
            f"busiest 1 s window {busiest} (limit {BURST_LIMIT}); "
            f"{len(first_second)} in the new leader's first second"
        )
        print("requests per second:", per_second(times, start, end))
        print("503s per second:    ", per_second(refused, start, end))
        pacing = standby.events("pacing_inherited")
        print("pacing_inherited:", pacing[-1] if pacing else None)

        assert busiest <= BURST_LIMIT
        assert share <= REFUSED_SHARE_LIMIT
        # It went on from the cut, and no breaker took the 503s for errors.
        assert at_resume.rate is not None and at_resume.rate < CAPACITY_RPS
        assert not [e for e in crawl.events("crawl_halted") if e.get("source") == LIMITED]
        assert not standby.events("crawl_halted") and not standby.events("loop_crashed")
        (inherited,) = pacing
        assert inherited["sources"] == 1
    finally:
        crawl.stop()
        if standby is not None:
            standby.stop()
