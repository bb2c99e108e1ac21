import asyncio
import time

import pytest
from redis.asyncio import Redis
from structlog.testing import capture_logs

from image_crawler import contract as c
from image_crawler.lifecycle import cancel_and_wait
from test.harness.fakes import FlakyRedis
from test.harness.services import wait_for
from worker.stats import QueuedOutcome, RedisStats


@pytest.fixture
async def stats(redis):
    now = [1_000_000.0]
    stats = RedisStats(redis, clock=lambda: now[0], min_interval_s=0.0)
    stats.now = now
    task = asyncio.create_task(stats.run())
    yield stats
    await cancel_and_wait([task])


async def test_success_and_failures_are_counted_per_source_and_status(redis, stats):
    await asyncio.gather(
        stats.record("a", "200"),
        stats.record("a", "200"),
        stats.record("a", "404"),
        stats.record("b", "500"),
        stats.record("b", "UnidentifiedImageError"),
    )
    values = await redis.mget(
        c.NUM_RESIZED,
        c.num_resized_key("a"),
        c.RESIZE_ERRORS,
        c.resize_errors_key("a"),
        c.resize_errors_key("a", "404"),
        c.resize_errors_key("b"),
        c.resize_errors_key("b", "500"),
        c.resize_errors_key("b", "UnidentifiedImageError"),
        c.num_resized_key("b"),
    )
    assert values == ["2", "2", "3", "1", "1", "2", "1", "1", None]


async def test_windows_hold_status_and_time_and_are_trimmed(redis, stats):
    await stats.record("a", "500")
    stats.now[0] += 61
    await stats.record("a", "200")
    minute = await redis.zrange("status60s:a", 0, -1, withscores=True)
    assert [c.status_of_window_member(m) for m, _ in minute] == ["200"]
    assert minute[0][1] == pytest.approx(1_000_061.0)
    hour = await redis.zrange("status1hr:a", 0, -1)
    assert [c.status_of_window_member(m) for m in hour] == ["500", "200"]
    assert await redis.zcard("status12hr:a") == 2


async def test_equal_statuses_at_the_same_instant_are_all_kept(redis, stats):
    await asyncio.gather(*(stats.record("a", "200") for _ in range(20)))
    assert await redis.zcard("status60s:a") == 20


async def test_last_50_keeps_the_newest_50(redis, stats):
    for i in range(60):
        await stats.record("a", "200" if i < 55 else "500")
    last = await redis.lrange(c.last50_key("a"), 0, -1)
    assert len(last) == 50
    assert last[-5:] == ["500"] * 5


async def test_malformed_messages_are_counted(redis, stats):
    await stats.record_malformed()
    await stats.record_malformed()
    assert await redis.get(c.NUM_MALFORMED) == "2"


async def test_outcomes_wait_for_a_redis_that_was_away_and_are_counted_once(redis):
    flaky = FlakyRedis(redis)
    stats = RedisStats(flaky)
    task = asyncio.create_task(stats.run())
    try:
        with capture_logs() as logs:
            recorded = asyncio.create_task(stats.record("a", "200"))
            await wait_for(lambda: flaky.refused >= 2, 5, what="two refused attempts")
            assert not recorded.done()  # the caller may not commit yet
            flaky.away = False
            await asyncio.wait_for(recorded, 5)
    finally:
        await cancel_and_wait([task])
    events = [(e["event"], e["op"]) for e in logs]
    assert set(events[:-1]) == {("redis_unavailable", "record_stats")}
    assert events[-1] == ("redis_recovered", "record_stats")
    assert await redis.get(c.num_resized_key("a")) == "1"


async def test_a_batch_written_twice_adds_no_window_member_twice(redis, stats):
    # As when Redis runs a write that timed out, and then the retry.
    loop = asyncio.get_running_loop()
    batch = [
        QueuedOutcome("a", "500", False, stats._timestamp(), loop.create_future()) for _ in range(3)
    ]
    await stats._flush(batch)
    await stats._flush(batch)
    for prefix, _ in c.STATUS_WINDOWS:
        assert await redis.zcard(f"{prefix}a") == 3
    assert await redis.get(c.resize_errors_key("a")) == "6"  # counters: at least once


_STATS_COMMANDS = {
    "evalsha",
    "eval",
    "zremrangebyscore",
    "zadd",
    "rpush",
    "ltrim",
    "incrby",
    "incr",
    "sadd",
}


async def commands_run(redis: Redis) -> dict[str, int]:
    """Calls of each command since the last CONFIG RESETSTAT (scripts' commands too)."""
    stats = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


async def test_a_flush_is_one_script_call_that_writes_per_key_not_per_outcome(redis):
    stats = RedisStats(redis)
    task = asyncio.create_task(stats.run())
    try:
        await stats.record("warm", "200")  # the first flush loads the script
        await redis.config_resetstat()
        await asyncio.wait_for(
            asyncio.gather(*(stats.record("a", ["200", "404"][i % 2]) for i in range(20))), 5
        )
    finally:
        await cancel_and_wait([task])
    # One round trip; inside it, per window a trim and a ZADD, the last-50 RPUSH and
    # LTRIM, five INCRBYs (two success and three failure counters), and one SADD of the
    # per-status error counter's name to their index.
    run = {k: v for k, v in (await commands_run(redis)).items() if k in _STATS_COMMANDS}
    assert run == {
        "evalsha": 1,
        "zremrangebyscore": 3,
        "zadd": 3,
        "rpush": 1,
        "ltrim": 1,
        "incrby": 5,
        "sadd": 1,
    }
    assert await redis.zcard("status60s:a") == 20
    assert await redis.llen(c.last50_key("a")) == 20
    assert await redis.get(c.resize_errors_key("a", "404")) == "10"


async def test_a_redis_that_forgot_the_script_gets_it_again(redis):
    stats = RedisStats(redis, min_interval_s=0.0)
    task = asyncio.create_task(stats.run())
    try:
        await asyncio.wait_for(stats.record("a", "200"), 5)
        await redis.script_flush()  # as after a restart
        await asyncio.wait_for(stats.record("a", "500"), 5)
    finally:
        await cancel_and_wait([task])
    assert await redis.lrange(c.last50_key("a"), 0, -1) == ["200", "500"]


async def test_a_batch_too_long_for_one_lua_unpack_is_written_whole(redis):
    # As after Redis was away for a while: thousands of one source's outcomes at once.
    stats = RedisStats(redis)
    loop = asyncio.get_running_loop()
    batch = [
        QueuedOutcome("a", "200", False, stats._timestamp(), loop.create_future())
        for _ in range(5_001)
    ]
    await stats._flush(batch)
    assert await redis.zcard("status60s:a") == 5_001
    assert await redis.llen(c.last50_key("a")) == c.LAST_N_STATUSES
    assert await redis.get(c.num_resized_key("a")) == "5001"


@pytest.fixture
async def timed_stats(redis):
    """Stats flushing at most every 2 s; ``.flushes`` holds (start, outcomes) of each."""
    stats = RedisStats(redis, min_interval_s=2.0)
    stats.flushes = []
    flush = stats._flush

    async def timed_flush(batch):
        stats.flushes.append((time.monotonic(), len(batch)))
        await flush(batch)

    stats._flush = timed_flush
    task = asyncio.create_task(stats.run())
    yield stats
    await cancel_and_wait([task])


@pytest.mark.timing("asserts the first flush within 1 s and flushes at least 1.995 s apart")
async def test_outcomes_soon_after_a_flush_wait_for_the_interval_and_go_together(timed_stats):
    started = time.monotonic()
    await timed_stats.record("a", "200")
    assert time.monotonic() - started < 1.0  # nothing was flushed before: written at once
    await asyncio.wait_for(asyncio.gather(*(timed_stats.record("a", "404") for _ in range(10))), 5)
    assert [n for _, n in timed_stats.flushes] == [1, 10]
    (first_started, _), (second_started, _) = timed_stats.flushes
    assert second_started - first_started >= 2.0 - 0.005


@pytest.mark.timing("asserts an outcome is flushed within 1 s of record()")
async def test_an_outcome_after_a_quiet_interval_is_written_at_once(timed_stats):
    await timed_stats.record("a", "200")
    await wait_for(
        lambda: time.monotonic() - timed_stats.flushes[0][0] > 2.1, 5, what="a quiet interval"
    )
    started = time.monotonic()
    await timed_stats.record("a", "200")
    assert time.monotonic() - started < 1.0  # not held back for another interval
    assert [n for _, n in timed_stats.flushes] == [1, 1]


async def test_run_is_cancellable_while_it_waits_for_the_interval(redis):
    stats = RedisStats(redis, min_interval_s=60)
    task = asyncio.create_task(stats.run())
    waiting = None
    try:
        await asyncio.wait_for(stats.record("a", "200"), 5)
        waiting = asyncio.create_task(stats.record("a", "200"))
        await wait_for(lambda: stats._pending, 5, what="an outcome waiting for the interval")
        task.cancel()
        await asyncio.wait({task}, timeout=1)
        assert task.cancelled()
    finally:
        await cancel_and_wait([task, *([waiting] if waiting else [])])
