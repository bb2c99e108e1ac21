"""The workers' pacer (GCRA per host within its source, in one Lua script) against the
real redis-server.

Slot arithmetic is checked on Redis' side (``pace_next:`` is exact: it moves by 1/rate a
grant), the spacing the pacers keep on the loop's clock, loosely; the windows seen at an
origin with real workers are checked in test_pacing_crawl.py. The source-level tests use
hosts that start at their ceiling (``FAST_START``); the slow start has tests of its own.
"""

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis
from redis.exceptions import RedisError
from structlog.testing import capture_logs

from image_crawler import contract as c
from image_crawler.lifecycle import cancel_and_wait
from test.harness.fakes import FlakyRedis
from test.harness.services import wait_for
from test.harness.windows import max_in_window
from worker.politeness.hosts import DELAY_SHARE, HostKey, HostSettings
from worker.politeness.pacing import (
    MAX_LATE_IN_ROW,
    HostWaits,
    PacingSettings,
    RedisPacer,
    late_limit,
    redis_loop_time,
)

SOURCE = "example"
KEY = HostKey(SOURCE, "images.example.org")
FAST_START = HostSettings(start_rps=1e9)


async def redis_now(redis: Redis) -> float:
    seconds, micros = await redis.time()
    return seconds + micros / 1e6


@pytest.fixture
async def pacers(redis_url):
    """Two pacers on their own clients: two workers' worth."""
    made: list[tuple[RedisPacer, asyncio.Task[None], Redis]] = []

    def make(hosts: HostSettings = FAST_START) -> RedisPacer:
        client = Redis.from_url(redis_url, decode_responses=True)
        pacer = RedisPacer(client, PacingSettings(no_rate_retry_s=0.05), hosts)
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
    waiting = pacer.acquire(KEY)
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
    waiting = pacer.acquire(KEY)
    await wait_for(lambda: pacer.asks >= 2, 5, what="two asks")
    assert not waiting.done()


async def test_keys_of_the_wrong_type_are_survived(redis, pacers):
    pacer = pacers()
    await redis.sadd(c.pace_rate_key("odd"), "x")
    await redis.sadd(c.pace_next_key(SOURCE), "x")
    await redis.sadd(c.pace_host_key(SOURCE, KEY.host), "x")
    await redis.set(c.pace_rate_key(SOURCE), "50")
    odd = pacer.acquire(HostKey("odd", "h"))
    await asyncio.wait_for(pacer.acquire(KEY), 5)  # pace_next overwritten
    assert not odd.done()


@pytest.mark.timing("asserts the span of 20 pacing grants to ±40 ms and grants per 0.2 s window")
async def test_two_pacers_share_one_slot_every_interval(redis, pacers):
    rate = 20.0
    first, second = pacers(), pacers()
    start = await redis_now(redis) + 0.3
    await redis.set(c.pace_next_key(SOURCE), f"{start:.6f}")
    await redis.set(c.pace_rate_key(SOURCE), repr(rate))
    futures = [pacer.acquire(KEY) for _ in range(10) for pacer in (first, second)]
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


@pytest.mark.timing("asserts the span of 6 pacing grants to ±40 ms")
@pytest.mark.parametrize("delay", ["0.25", "not a number", "-1", "inf", "nan"])
async def test_a_crawl_delay_is_the_shortest_interval_whatever_the_rate(redis, pacers, delay):
    first, second = pacers(), pacers()
    await redis.set(c.pace_rate_key(SOURCE), "100")
    far = await redis_now(redis) + 600
    await redis.hset(
        c.pace_host_key(SOURCE, KEY.host), mapping={"delay": delay, "delay_until": f"{far:.6f}"}
    )
    futures = [pacer.acquire(KEY) for _ in range(3) for pacer in (first, second)]
    times = granted_at(futures)
    await asyncio.wait_for(asyncio.gather(*futures), 10)
    # Slots come the delay over DELAY_SHARE apart; anything but a delay is not one.
    interval = 0.25 / DELAY_SHARE if delay == "0.25" else 0.01
    assert max(times) - min(times) == pytest.approx(5 * interval, abs=0.04)


@pytest.mark.timing("asserts the gaps between pacing grants (first to ±50 ms) and one late slot")
async def test_a_slot_of_a_crawl_delay_reached_late_is_given_up(redis, pacers):
    # The worker's loop is busy over the second slot: started then, it would leave 0.38 s
    # before the third, under the host's delay of 0.5 s.
    pacer = pacers()
    await redis.set(c.pace_rate_key(SOURCE), "100")
    far = await redis_now(redis) + 600
    await redis.hset(
        c.pace_host_key(SOURCE, KEY.host), mapping={"delay": "0.5", "delay_until": f"{far:.6f}"}
    )
    late_before = REGISTRY.get_sample_value("crawler_pacing_slots_late_total") or 0.0
    futures = [pacer.acquire(KEY) for _ in range(3)]
    times = granted_at(futures)
    await asyncio.wait_for(futures[0], 5)
    # Once the second slot is promised, the loop is held until 0.15 s past it: later than
    # 5 % of the interval, not half of it.
    await wait_for(lambda: pacer._promised[KEY] > 0, 5, what="the second slot promised")
    held_s = times[0] + 0.5 / DELAY_SHARE + 0.15 - asyncio.get_running_loop().time()
    time.sleep(max(0.0, held_s))  # noqa: ASYNC251 (a busy loop is the point)
    await asyncio.wait_for(asyncio.gather(*futures), 10)
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert min(gaps) >= 0.5, gaps
    assert gaps[0] == pytest.approx(2 * 0.5 / DELAY_SHARE, abs=0.05), gaps  # the next slot's
    assert REGISTRY.get_sample_value("crawler_pacing_slots_late_total") == late_before + 1


class StallingRedis(FlakyRedis):
    """Each script's answer is read ``stall_s`` late, the event loop blocked meanwhile (a
    worker starved of CPU while Redis answered) while ``stalling``."""

    def __init__(self, redis: Redis, stall_s: float) -> None:
        super().__init__(redis)
        self.away = False
        self.stall_s = stall_s
        self.stalling = True

    async def evalsha(self, *args: Any) -> Any:
        answer = await super().evalsha(*args)
        if self.stalling:
            time.sleep(self.stall_s)  # noqa: ASYNC251 (a blocked loop is the point)
        return answer


@contextlib.asynccontextmanager
async def running_pacer(
    redis: Any, stall_s: float
) -> AsyncIterator[tuple[StallingRedis, RedisPacer]]:
    """A pacer running on ``StallingRedis``: its loop blocked ``stall_s`` after each answer."""
    stalling = StallingRedis(redis, stall_s=stall_s)
    pacer = RedisPacer(stalling, PacingSettings(no_rate_retry_s=0.05), FAST_START)  # type: ignore[arg-type]
    task = asyncio.create_task(pacer.run())
    try:
        yield stalling, pacer
    finally:
        await cancel_and_wait([task])
        pacer.close()


async def test_a_slot_already_past_when_its_answer_is_read_late_is_given_up(redis):
    # Found by the fault campaign (chaos): workers whose loops stalled while their answers
    # came started their past slots of a source at 10/s together, 3 requests in 36 ms.
    async with running_pacer(redis, stall_s=0.3) as (stalling, pacer):
        await redis.set(c.pace_rate_key(SOURCE), "10")
        late_before = REGISTRY.get_sample_value("crawler_pacing_slots_late_total") or 0.0
        waiting = pacer.acquire(KEY)
        await wait_for(
            lambda: REGISTRY.get_sample_value("crawler_pacing_slots_late_total") > late_before,
            5,
            what="a slot given up",
        )
        assert not waiting.done()
        stalling.stalling = False
        await asyncio.wait_for(waiting, 5)  # its request asked again and had a slot


async def test_a_worker_always_late_still_starts_one_slot_in_four(redis):
    # A loop that lags past the late limit at every answer (a worker starved of CPU):
    # every slot comes due as it is read. Giving them all up, the host would get no
    # request at all; after three in a row, the fourth starts.
    async with running_pacer(redis, stall_s=0.15) as (_, pacer):
        await redis.set(c.pace_rate_key(SOURCE), "10")
        late_before = REGISTRY.get_sample_value("crawler_pacing_slots_late_total") or 0.0
        with capture_logs() as logs:
            await asyncio.wait_for(pacer.acquire(KEY), 10)
        late = REGISTRY.get_sample_value("crawler_pacing_slots_late_total") - late_before
        assert late == MAX_LATE_IN_ROW
        (started,) = [e for e in logs if e["event"] == "slot_started_late"]
        assert (started["source"], started["host"]) == (KEY.source, KEY.host)
        assert started["late_ms"] > 0


async def _take_slot_as_the_pipeline_does(pacer: RedisPacer, busy_s: float) -> int:
    """Asks for a slot until ``started_late`` lets the request go, as
    ``Pipeline._take_slot`` does, the loop busy for ``busy_s`` each time the request is
    granted (before it resumes); answers how many slots it took."""
    for taken in range(1, 4 * (MAX_LATE_IN_ROW + 1) + 1):
        granted = pacer.acquire(KEY)
        assert await asyncio.wait_for(granted, 10) is None
        time.sleep(busy_s)  # noqa: ASYNC251 (a busy loop is the point)
        if not pacer.started_late(granted):
            return taken
    return taken


async def test_a_request_of_an_always_late_worker_starts_with_the_fourth_slot(redis):
    # The slot that the grant starts late after three given up is not given up again as
    # its request resumes (the long tail's benchmark: requests asked again for minutes).
    async with running_pacer(redis, stall_s=0.15) as (_, pacer):
        await redis.set(c.pace_rate_key(SOURCE), "10")
        late_before = REGISTRY.get_sample_value("crawler_pacing_slots_late_total") or 0.0
        assert await _take_slot_as_the_pipeline_does(pacer, 0.15) == 1
        late = REGISTRY.get_sample_value("crawler_pacing_slots_late_total") - late_before
        assert late == MAX_LATE_IN_ROW


@pytest.mark.timing("needs every slot's grant resolved within the 5 ms late limit at 10/s")
async def test_a_request_resumed_late_after_every_slot_starts_with_the_fourth(redis, pacers):
    # Each slot on time, each request resumed past the late limit: the slots given up as
    # they resume are counted in a row too, although each grant was on time.
    pacer = pacers()
    await redis.set(c.pace_rate_key(SOURCE), "10")
    assert await _take_slot_as_the_pipeline_does(pacer, 0.15) == MAX_LATE_IN_ROW + 1


@pytest.mark.timing("asserts the span of 5 pacing grants is at least 4 intervals - 40 ms")
async def test_an_idle_source_starts_from_now_without_catching_up(redis, pacers):
    rate = 10.0
    pacer = pacers()
    before = await redis_now(redis)
    await redis.set(c.pace_next_key(SOURCE), f"{before - 60:.6f}")  # idle for a minute
    await redis.set(c.pace_rate_key(SOURCE), repr(rate))
    futures = [pacer.acquire(KEY) for _ in range(5)]
    times = granted_at(futures)
    await asyncio.wait_for(asyncio.gather(*futures), 10)
    after = await redis_now(redis)
    next_slot = float(await redis.get(c.pace_next_key(SOURCE)))
    assert before + 5 / rate <= next_slot <= after + 1 / rate
    assert max(times) - min(times) >= 4 / rate - 0.04


@pytest.mark.timing("asserts the first grant comes at least the pause (less the horizon) after it")
async def test_a_pause_holds_every_pacer_until_it_ends(redis, pacers):
    first, second = pacers(), pacers()
    await redis.set(c.pace_rate_key(SOURCE), "50")
    await asyncio.wait_for(second.acquire(KEY), 5)
    loop = asyncio.get_running_loop()
    paused_at = loop.time()
    await first.pause(KEY, 1.0)
    held = [pacer.acquire(KEY) for pacer in (first, second)]
    times = granted_at(held)
    await asyncio.wait_for(asyncio.gather(*held), 5)
    # Granted from the pause's end (less the pacing horizon, at most), not before.
    assert min(times) - paused_at >= 1.0 - PacingSettings().horizon_s - 0.01
    # A shorter pause than the one in force changes nothing.
    host = c.pace_host_key(SOURCE, KEY.host)
    await redis.hset(host, "next", f"{await redis_now(redis) + 30:.6f}")
    await first.pause(KEY, 1.0)
    assert float(await redis.hget(host, "next")) > await redis_now(redis) + 25


@pytest.mark.timing("asserts the grant comes at least the 2 s pause (less the horizon) after it")
async def test_a_pause_redis_missed_reaches_it_when_it_is_back_before_any_other_slot(redis, pacers):
    # Found by the fault campaign (chaos): a 429 answered while Redis was restarting was
    # held by its own worker only, and the others sent requests inside its Retry-After.
    flaky = FlakyRedis(redis)
    heard = RedisPacer(flaky, PacingSettings(no_rate_retry_s=0.05), FAST_START)  # type: ignore[arg-type]
    task = asyncio.create_task(heard.run())
    try:
        await redis.set(c.pace_rate_key(SOURCE), "50")
        loop = asyncio.get_running_loop()
        paused_at = loop.time()
        with pytest.raises(RedisError):
            await heard.pause(KEY, 2.0)
        refused = flaky.refused
        await wait_for(lambda: flaky.refused >= refused + 2, 5, what="the pause sent again")
        flaky.away = False
        host = c.pace_host_key(SOURCE, KEY.host)
        await wait_for(lambda: redis.hget(host, "next"), 2, what="the pause in Redis")
        other = pacers()
        times = granted_at([granted := other.acquire(KEY)])
        await asyncio.wait_for(granted, 5)
        # What was left of the pause, from Redis' return: nothing before its end.
        assert times[0] - paused_at >= 2.0 - PacingSettings().horizon_s - 0.01
    finally:
        await cancel_and_wait([task])
        heard.close()


@pytest.mark.timing("asserts the next slot is granted within 1 s")
async def test_a_cancelled_request_gives_its_slot_to_the_next(redis, pacers):
    pacer = pacers()
    await redis.set(c.pace_rate_key(SOURCE), "5")
    await asyncio.wait_for(pacer.acquire(KEY), 5)
    cancelled, kept = pacer.acquire(KEY), pacer.acquire(KEY)
    await wait_for(lambda: pacer.asks >= 2, 5, what="a second ask")
    cancelled.cancel()
    await asyncio.wait_for(kept, 1.0)  # the cancelled one's slot, ~0.2 s after the first


async def test_a_redis_that_is_away_grants_nothing_and_is_reported(redis, pacers):
    flaky = FlakyRedis(redis)
    pacer = RedisPacer(flaky, PacingSettings(no_rate_retry_s=0.05), FAST_START)  # type: ignore[arg-type]
    task = asyncio.create_task(pacer.run())
    try:
        await redis.set(c.pace_rate_key(SOURCE), "100")
        with capture_logs() as logs:
            waiting = pacer.acquire(KEY)
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
    futures = [pacer.acquire(HostKey(source, "h")) for source in sources for _ in range(3)]
    await asyncio.wait_for(asyncio.gather(*futures), 20)
    assert pacer.asks <= 20


# --- per host ------------------------------------------------------------------------------


@pytest.mark.timing(
    "asserts each host's span of grants to ±50 ms, all within 1.3 s, and grants per window"
)
async def test_each_host_is_paced_on_its_own_within_its_source(redis, pacers):
    first, second = pacers(), pacers()
    await redis.set(c.pace_rate_key(SOURCE), "40")
    await redis.set(c.host_rate_key(SOURCE), "5")  # any one host at most 5/s
    hosts = [HostKey(SOURCE, f"h{i}.example.org") for i in range(4)]
    futures = {key: [p.acquire(key) for p in (first, second) for _ in range(3)] for key in hosts}
    times = {key: granted_at(f) for key, f in futures.items()}
    await asyncio.wait_for(asyncio.gather(*(f for fs in futures.values() for f in fs)), 10)
    everything = sorted(t for ts in times.values() for t in ts)
    for key in hosts:  # each host at its own 5/s...
        assert max(times[key]) - min(times[key]) == pytest.approx(5 / 5, abs=0.05), key
    # ...and the four together four times as fast, within the source's 40/s.
    assert max(everything) - min(everything) < 1.3
    assert max_in_window(everything, 0.5) <= 40 * 0.5 + 1


async def test_a_crawl_delayed_or_halted_host_does_not_hold_back_another(redis, pacers):
    pacer = pacers()
    await redis.set(c.pace_rate_key(SOURCE), "20")
    delayed, halted, free = (HostKey(SOURCE, h) for h in ("slow.org", "halted.org", "free.org"))
    await pacer.note_crawl_delay(delayed, 30.0, 600.0)
    await redis.hset(c.pace_host_key(SOURCE, halted.host), "halt", "by hand")
    held = [pacer.acquire(delayed), pacer.acquire(halted)]
    await asyncio.wait_for(asyncio.gather(*(pacer.acquire(free) for _ in range(10))), 5)
    assert not any(f.done() for f in held)
    await redis.hdel(c.pace_host_key(SOURCE, halted.host), "halt")  # resumed
    await asyncio.wait_for(held[1], PacingSettings().operator_poll_s + 5)
    assert not held[0].done()


@pytest.mark.timing("asserts the second grant 1.0 ± 0.1 s after the first and 12 grants within 3 s")
async def test_a_new_host_starts_slowly_and_climbs_on_clean_answers(redis, pacers):
    pacer = pacers(HostSettings())
    await redis.set(c.pace_rate_key(SOURCE), "50")
    start = asyncio.get_running_loop().time()
    times: list[float] = []
    for _ in range(12):
        await asyncio.wait_for(pacer.acquire(KEY), 5)
        times.append(asyncio.get_running_loop().time())
        pacer.report(KEY, "200")
    # 1/s at first: the second request a second after the first...
    assert times[1] - times[0] == pytest.approx(1.0, abs=0.1)
    # ...then about 3/s, 9/s...: twelve requests in well under 3 s, not 12 s.
    assert times[-1] - start < 3.0
    assert float(await redis.hget(c.pace_host_key(SOURCE, KEY.host), "rate")) > 10


@pytest.mark.timing("asserts the second grant 1.0 ± 0.1 s after the first")
async def test_a_request_after_its_host_s_last_is_asked_about_once_when_its_slot_comes(
    redis, pacers
):
    # A new host's robots.txt, tdmrep.json and image come one after another, each once the
    # one before has its slot: the next one's ask waits for its slot (a second on at the
    # slow start) rather than going at once to be told when that is, and again then.
    pacer = pacers(HostSettings())
    await redis.set(c.pace_rate_key(SOURCE), "50")
    late_before = REGISTRY.get_sample_value("crawler_pacing_slots_late_total") or 0.0
    times: list[float] = []
    for _ in range(3):
        await asyncio.wait_for(pacer.acquire(KEY), 5)
        times.append(asyncio.get_running_loop().time())
        pacer.report(KEY, "200")
    assert times[1] - times[0] == pytest.approx(1.0, abs=0.1)  # paced as before
    late = (REGISTRY.get_sample_value("crawler_pacing_slots_late_total") or 0.0) - late_before
    # One ask a request (4 asks without the kept asks), and one more a slot missed.
    assert pacer.asks == 3 + late


async def test_a_failing_host_is_halted_then_given_up(redis, pacers):
    pacer = pacers()
    await redis.set(c.pace_rate_key(SOURCE), "50")
    # A source of several hosts: its failing host is halted on its own.
    await asyncio.wait_for(pacer.acquire(HostKey(SOURCE, "other.example.org")), 5)
    for _ in range(5):
        await asyncio.wait_for(pacer.acquire(KEY), 5)
        pacer.report(KEY, "500")
    waiting = pacer.acquire(KEY)
    host = c.pace_host_key(SOURCE, KEY.host)
    await wait_for(lambda: redis.hget(host, "until"), 5, what="a halt")
    assert not waiting.done()
    assert await redis.pttl(host) / 1000 > 30  # kept at least while halted
    # An hour of failures later (written by hand) its URLs end.
    await redis.hset(host, mapping={"gone": "1", "until": ""})
    assert await asyncio.wait_for(waiting, 40) == c.Status.HOST_UNAVAILABLE


async def test_the_only_host_of_a_source_is_left_to_the_source_s_breakers(redis, pacers):
    pacer = pacers()
    await redis.set(c.pace_rate_key(SOURCE), "50")
    for _ in range(8):
        await asyncio.wait_for(pacer.acquire(KEY), 5)
        pacer.report(KEY, "500")
    # Its failures were never counted: no streak, no halt, and it is still served.
    await asyncio.wait_for(pacer.acquire(KEY), 5)
    fields = await redis.hgetall(c.pace_host_key(SOURCE, KEY.host))
    assert fields and not fields.get("fails") and not fields.get("until")


async def test_a_deferrable_request_of_a_blocked_host_raises_host_waits(redis, pacers):
    pacer = pacers()
    await redis.set(c.pace_rate_key(SOURCE), "50")
    halted, paused = HostKey(SOURCE, "halted.org"), HostKey(SOURCE, "paused.org")
    await redis.hset(c.pace_host_key(SOURCE, halted.host), "halt", "by an operator")
    with pytest.raises(HostWaits) as waits:
        await asyncio.wait_for(pacer.acquire(halted, defer=True), 5)
    assert waits.value.key == halted and waits.value.wait_s > 0
    # One that cannot be deferred (a robots.txt fetch) waits on.
    waiting = pacer.acquire(halted)
    # A Retry-After further away than defer_after_s: the same.
    await asyncio.wait_for(pacer.acquire(paused), 5)
    await pacer.pause(paused, 60.0)
    with pytest.raises(HostWaits) as waits:
        await asyncio.wait_for(pacer.acquire(paused, defer=True), 5)
    assert 50 < waits.value.wait_s <= 60
    assert not waiting.done()
    # Its interval, as answered, is known to the scheduler.
    assert pacer.interval_of(paused) is not None and pacer.interval_of(HostKey("x", "y")) is None
    waiting.cancel()


def test_slots_are_placed_by_redis_clock_when_it_agrees_else_at_the_round_trip_s_middle():
    # Asked at loop time 100.0, answered at 100.3 (a loop busy meanwhile); the loop's
    # clock is the wall clock less 1,000,000 s.
    offset = 1_000_000.0
    assert redis_loop_time(100.0, 100.3, offset, offset + 100.01) == pytest.approx(100.01)
    # Clocks that disagree by more than the round trip, or no clock: the middle.
    assert redis_loop_time(100.0, 100.3, offset, offset + 101.0) == pytest.approx(100.15)
    assert redis_loop_time(100.0, 100.3, offset, None) == pytest.approx(100.15)


@pytest.mark.parametrize(
    ("interval_s", "limit_s"),
    [(2.0, 0.1), (0.5, 0.025), (0.125, 0.01), (0.02, 0.01), (0.005, 0.0025), (1e-5, 0.002)],
)
def test_a_slot_may_start_late_by_a_twentieth_of_its_interval_or_10_ms_at_most_half(
    interval_s, limit_s
):
    assert late_limit(interval_s) == pytest.approx(limit_s)


@pytest.mark.timing("needs the event loop to resume within the 5 ms late limit for the first slot")
async def test_a_request_its_loop_resumes_too_late_for_its_slot_gives_it_up(redis, pacers):
    # The fault campaign saw a worker's requests go out together after its loop was busy
    # between the slot and the request: the request checks when it resumes.
    pacer = pacers()
    await redis.set(c.pace_rate_key(SOURCE), "10")
    on_time = pacer.acquire(KEY)
    await asyncio.wait_for(on_time, 5)
    assert not pacer.started_late(on_time)
    held = pacer.acquire(KEY)
    await wait_for(held.done, 5, what="the next slot", interval_s=0.001)
    time.sleep(0.05)  # noqa: ASYNC251 (the loop busy after the slot, before the request)
    late_before = REGISTRY.get_sample_value("crawler_pacing_slots_late_total") or 0.0
    assert pacer.started_late(held)
    assert REGISTRY.get_sample_value("crawler_pacing_slots_late_total") == late_before + 1
    assert not pacer.started_late(held)  # once: its slot is forgotten
