"""The workers' pacer (GCRA in one Lua script) against the real redis-server.

Slot arithmetic is checked on Redis' side (``pace_next:`` is exact: it moves by 1/rate a
grant), the spacing the pacers keep on the loop's clock, loosely; the windows seen at an
origin with real workers are checked in test_pacing_crawl.py.
"""

import asyncio

import pytest
from redis.asyncio import Redis
from structlog.testing import capture_logs

from image_crawler import contract as c
from image_crawler.lifecycle import cancel_and_wait
from test.harness.fakes import FlakyRedis
from test.harness.services import wait_for
from test.harness.windows import max_in_window
from worker.politeness.pacing import PacingSettings, RedisPacer

SOURCE = "example"


async def redis_now(redis: Redis) -> float:
    seconds, micros = await redis.time()
    return seconds + micros / 1e6


@pytest.fixture
async def pacers(redis_url):
    """Two pacers on their own clients: two workers' worth."""
    made: list[tuple[RedisPacer, asyncio.Task[None], Redis]] = []

    def make() -> RedisPacer:
        client = Redis.from_url(redis_url, decode_responses=True)
        pacer = RedisPacer(client, PacingSettings(no_rate_retry_s=0.05))
        made.append((pacer, asyncio.create_task(pacer.run()), client))
        return pacer

    yield make
    for pacer, task, client in made:
        await cancel_and_wait([task])
        pacer.close()
        await client.aclose()


def granted_at(futures: list[asyncio.Future[None]]) -> list[float]:
    """Resolves into the loop times at which each future completes, as they do."""
    loop = asyncio.get_running_loop()
    times: list[float] = []
    for future in futures:
        future.add_done_callback(lambda _: times.append(loop.time()))
    return times


async def test_a_source_without_a_rate_gets_no_slot_until_it_has_one(redis, pacers):
    pacer = pacers()
    waiting = pacer.acquire(SOURCE)
    await wait_for(lambda: pacer.asks >= 3, 5, what="three asks")
    assert not waiting.done()
    await redis.set(c.pace_rate_key(SOURCE), "0")  # a halted source
    asks = pacer.asks
    await wait_for(lambda: pacer.asks >= asks + 2, 5, what="two more asks")
    assert not waiting.done()
    await redis.set(c.pace_rate_key(SOURCE), "2")
    await asyncio.wait_for(waiting, 5)


@pytest.mark.parametrize("value", ["nan", "inf", "-3", "fast", ""])
async def test_a_rate_that_is_not_one_grants_nothing(redis, pacers, value):
    pacer = pacers()
    await redis.set(c.pace_rate_key(SOURCE), value)
    waiting = pacer.acquire(SOURCE)
    await wait_for(lambda: pacer.asks >= 2, 5, what="two asks")
    assert not waiting.done()


async def test_keys_of_the_wrong_type_are_survived(redis, pacers):
    pacer = pacers()
    await redis.sadd(c.pace_rate_key("odd"), "x")
    await redis.sadd(c.pace_next_key(SOURCE), "x")
    await redis.set(c.pace_rate_key(SOURCE), "50")
    odd = pacer.acquire("odd")
    await asyncio.wait_for(pacer.acquire(SOURCE), 5)  # pace_next overwritten
    assert not odd.done()


async def test_two_pacers_share_one_slot_every_interval(redis, pacers):
    rate = 20.0
    first, second = pacers(), pacers()
    start = await redis_now(redis) + 0.3
    await redis.set(c.pace_next_key(SOURCE), f"{start:.6f}")
    await redis.set(c.pace_rate_key(SOURCE), repr(rate))
    futures = [pacer.acquire(SOURCE) for _ in range(10) for pacer in (first, second)]
    times = granted_at(futures)
    await asyncio.wait_for(asyncio.gather(*futures), 10)
    # Redis' arithmetic is exact: 20 grants moved the next slot 20 intervals on, whoever
    # asked and however the asks were batched.
    assert float(await redis.get(c.pace_next_key(SOURCE))) == pytest.approx(
        start + 20 / rate, abs=2e-6
    )
    # On the loop's clock: the 20 slots span 19 intervals, never a burst.
    assert max(times) - min(times) == pytest.approx(19 / rate, abs=0.04)
    assert max_in_window(times, 0.2) <= rate * 0.2 + 1
    assert first.asks + second.asks >= 10  # slots come a horizon at a time, not all at once


@pytest.mark.parametrize("delay", ["0.25", "not a number", "-1", "inf", "nan"])
async def test_a_crawl_delay_is_the_shortest_interval_whatever_the_rate(redis, pacers, delay):
    first, second = pacers(), pacers()
    await redis.set(c.pace_rate_key(SOURCE), "100")
    await redis.set(c.crawl_delay_key(SOURCE), delay)
    futures = [pacer.acquire(SOURCE) for _ in range(3) for pacer in (first, second)]
    times = granted_at(futures)
    await asyncio.wait_for(asyncio.gather(*futures), 10)
    interval = 0.25 if delay == "0.25" else 0.01  # anything but a delay is not one
    assert max(times) - min(times) == pytest.approx(5 * interval, abs=0.04)


async def test_an_idle_source_starts_from_now_without_catching_up(redis, pacers):
    rate = 10.0
    pacer = pacers()
    before = await redis_now(redis)
    await redis.set(c.pace_next_key(SOURCE), f"{before - 60:.6f}")  # idle for a minute
    await redis.set(c.pace_rate_key(SOURCE), repr(rate))
    futures = [pacer.acquire(SOURCE) for _ in range(5)]
    times = granted_at(futures)
    await asyncio.wait_for(asyncio.gather(*futures), 10)
    after = await redis_now(redis)
    next_slot = float(await redis.get(c.pace_next_key(SOURCE)))
    assert before + 5 / rate <= next_slot <= after + 1 / rate
    assert max(times) - min(times) >= 4 / rate - 0.04


async def test_a_pause_holds_every_pacer_until_it_ends(redis, pacers):
    first, second = pacers(), pacers()
    await redis.set(c.pace_rate_key(SOURCE), "50")
    await asyncio.wait_for(second.acquire(SOURCE), 5)
    loop = asyncio.get_running_loop()
    paused_at = loop.time()
    await first.pause(SOURCE, 1.0)
    held = [pacer.acquire(SOURCE) for pacer in (first, second)]
    times = granted_at(held)
    await asyncio.wait_for(asyncio.gather(*held), 5)
    # Granted from the pause's end (less the pacing horizon, at most), not before.
    assert min(times) - paused_at >= 1.0 - PacingSettings().horizon_s - 0.01
    # A shorter pause than the one in force changes nothing.
    await redis.set(c.pace_next_key(SOURCE), f"{await redis_now(redis) + 30:.6f}")
    await first.pause(SOURCE, 1.0)
    assert float(await redis.get(c.pace_next_key(SOURCE))) > await redis_now(redis) + 25


async def test_a_cancelled_request_gives_its_slot_to_the_next(redis, pacers):
    pacer = pacers()
    await redis.set(c.pace_rate_key(SOURCE), "5")
    await asyncio.wait_for(pacer.acquire(SOURCE), 5)
    cancelled, kept = pacer.acquire(SOURCE), pacer.acquire(SOURCE)
    await wait_for(lambda: pacer.asks >= 2, 5, what="a second ask")
    cancelled.cancel()
    await asyncio.wait_for(kept, 1.0)  # the cancelled one's slot, ~0.2 s after the first


async def test_a_redis_that_is_away_grants_nothing_and_is_reported(redis, pacers):
    flaky = FlakyRedis(redis)
    pacer = RedisPacer(flaky, PacingSettings(no_rate_retry_s=0.05))  # type: ignore[arg-type]
    task = asyncio.create_task(pacer.run())
    try:
        await redis.set(c.pace_rate_key(SOURCE), "100")
        with capture_logs() as logs:
            waiting = pacer.acquire(SOURCE)
            await wait_for(lambda: flaky.refused >= 2, 5, what="refused asks")
            assert not waiting.done()
            flaky.away = False
            await asyncio.wait_for(waiting, 10)
        events = [e["event"] for e in logs]
        assert "redis_unavailable" in events and "redis_recovered" in events
    finally:
        await cancel_and_wait([task])
        pacer.close()


async def test_a_rate_beyond_the_event_loop_s_resolution_still_grants_every_request(redis, pacers):
    # 100,000/s on each of 1,000 sources: slots 10 us apart, and an answer that takes
    # milliseconds to come and to handle. Slots already past by then are started, not
    # given up (which left every request asking for ever).
    pacer = pacers()
    sources = [f"s{i}" for i in range(1000)]
    async with redis.pipeline(transaction=False) as pipe:
        for source in sources:
            pipe.set(c.pace_rate_key(source), "100000")
        await pipe.execute()
    futures = [pacer.acquire(source) for source in sources for _ in range(3)]
    await asyncio.wait_for(asyncio.gather(*futures), 20)
    assert pacer.asks <= 20
