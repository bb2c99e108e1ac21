"""bench.host_state on a few hosts against a real redis-server: every per-host key kind is
counted, every key expires, the idle passes leave nothing a day later, and the worker's
structures hold the hosts seen (bounded where they are bounded)."""

from __future__ import annotations

from bench.host_state import measure_redis, measure_worker, render
from test.harness.services import RedisServer

HOSTS = 40
SEEN = 300
WARMUP = 20


async def test_a_few_hosts_are_counted_by_kind_and_leave_nothing_a_day_later(
    fresh_redis_server: RedisServer,
) -> None:
    report = await measure_redis(fresh_redis_server.url, HOSTS, concurrency=8)

    assert sum(report["robots_answers"].values()) == HOSTS
    kinds = report["by_kind"]
    # Every host leaves a robots.txt entry and pacing state while active.
    assert kinds["robots:"]["keys"] == HOSTS
    assert kinds["pace_host:"]["keys"] >= report["robots_answers"].get("allowed", 0)
    assert kinds["robots:"]["bytes_per_host"] > 0
    assert report["expiry"]["without_expiry"] == {}
    assert 86_000 < report["expiry"]["longest_ttl_s"] < 87_000
    # Eleven minutes idle: most pacing state is gone (a halted host's, or one kept with
    # its Crawl-delay, lives longer); robots.txt entries stay the day.
    eleven, day = report["idle"]
    assert eleven["by_kind"]["pace_host:"]["keys"] < kinds["pace_host:"]["keys"] / 2
    assert eleven["by_kind"]["robots:"]["keys"] == HOSTS
    assert day["keys_left"] == 0
    # used_memory itself moves by more than 40 hosts' keys (buffers grow and shrink): no
    # bound on it here, only that it was read.
    assert isinstance(report["redis_used_memory_bytes_per_host"], float)

    report["worker"] = await measure_worker(fresh_redis_server.url, SEEN, WARMUP)
    held = report["worker"]["structures"]
    assert held["dns_cache"] == SEEN + WARMUP
    assert held["latency_baselines"] == SEEN + WARMUP
    assert held["host_queues"] == 0  # every URL ended
    assert report["worker"]["traced"] is False
    assert f"{SEEN:,} hosts seen" in render(report, "now")
