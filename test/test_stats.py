import asyncio

import pytest
from structlog.testing import capture_logs

from image_crawler import contract as c
from image_crawler.tasks import cancel_and_wait
from test.fakes import FlakyRedis
from test.services import wait_for
from worker.stats import RedisStats


@pytest.fixture
async def stats(fake_redis):
    now = [1_000_000.0]
    stats = RedisStats(fake_redis, clock=lambda: now[0])
    stats.now = now
    task = asyncio.create_task(stats.run())
    yield stats
    await cancel_and_wait([task])


async def test_success_and_failures_are_counted_per_source_and_status(fake_redis, stats):
    await asyncio.gather(
        stats.record("a", "200"),
        stats.record("a", "200"),
        stats.record("a", "404"),
        stats.record("b", "500"),
        stats.record("b", "UnidentifiedImageError"),
    )
    values = await fake_redis.mget(
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


async def test_windows_hold_status_and_time_and_are_trimmed(fake_redis, stats):
    await stats.record("a", "500")
    stats.now[0] += 61
    await stats.record("a", "200")
    minute = await fake_redis.zrange("status60s:a", 0, -1, withscores=True)
    assert [c.status_of_window_member(m) for m, _ in minute] == ["200"]
    assert minute[0][1] == pytest.approx(1_000_061.0)
    hour = await fake_redis.zrange("status1hr:a", 0, -1)
    assert [c.status_of_window_member(m) for m in hour] == ["500", "200"]
    assert await fake_redis.zcard("status12hr:a") == 2


async def test_equal_statuses_at_the_same_instant_are_all_kept(fake_redis, stats):
    await asyncio.gather(*(stats.record("a", "200") for _ in range(20)))
    assert await fake_redis.zcard("status60s:a") == 20


async def test_last_50_keeps_the_newest_50(fake_redis, stats):
    for i in range(60):
        await stats.record("a", "200" if i < 55 else "500")
    last = await fake_redis.lrange(c.last50_key("a"), 0, -1)
    assert len(last) == 50
    assert last[-5:] == ["500"] * 5


async def test_malformed_messages_are_counted(fake_redis, stats):
    await stats.record_malformed()
    await stats.record_malformed()
    assert await fake_redis.get(c.NUM_MALFORMED) == "2"


async def test_outcomes_wait_for_a_redis_that_was_away_and_are_counted_once(fake_redis):
    flaky = FlakyRedis(fake_redis)
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
    assert await fake_redis.get(c.num_resized_key("a")) == "1"


async def test_a_batch_written_twice_adds_no_window_member_twice(fake_redis, stats):
    # As when Redis runs a write that timed out, and then the retry.
    loop = asyncio.get_running_loop()
    batch = [("a", "500", stats._timestamp(), loop.create_future()) for _ in range(3)]
    await stats._flush(batch)
    await stats._flush(batch)
    for prefix, _ in c.STATUS_WINDOWS:
        assert await fake_redis.zcard(f"{prefix}a") == 3
    assert await fake_redis.get(c.resize_errors_key("a")) == "6"  # counters: at least once
