"""The leader lease (``monitor_leader``): only its holder sets rates and runs breakers.

Two regulators share one real redis-server, each with its own lease token, and the test
drives their loops one tick at a time. Lease expiries are short here (real Redis
expiries, waited for as conditions).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from structlog.testing import capture_logs

from crawl_monitor.regulator import Regulator, RegulatorSettings
from crawl_monitor.store import LeaderLease, RedisRegulatorStore, new_lease_token
from image_crawler import contract as c
from test.harness.services import wait_for

LEASE_MS = 400


def regulator_with_lease(redis: Redis, name: str, ttl_ms: int = LEASE_MS) -> Regulator:
    lease = LeaderLease(token=f"{name}:{new_lease_token()}", ttl_ms=ttl_ms)
    rates = {"src": 10.0, "halting": 10.0}
    return Regulator(RedisRegulatorStore(redis), lambda: rates, RegulatorSettings(), lease=lease)


def events(logs, name, **fields):
    return [e for e in logs if e["event"] == name and all(e.get(k) == v for k, v in fields.items())]


async def rate(redis: Redis, source: str = "src") -> str | None:
    return await redis.get(c.pace_rate_key(source))


async def lease_gone(redis: Redis) -> bool:
    return not await redis.exists(c.MONITOR_LEADER_KEY)


@pytest.mark.timing(
    "asserts the lease's PTTL within 100 ms of renewal; needs ticks within a 400 ms lease"
)
async def test_only_the_holder_sets_rates_and_a_standby_takes_over_after_the_expiry(redis):
    first = regulator_with_lease(redis, "first")
    second = regulator_with_lease(redis, "second")
    with capture_logs() as logs:
        # The loop that takes the lease writes nothing: rates are set from the next one.
        assert await first.tick() is None
        assert first.leading
        assert await rate(redis) is None
        (acquired,) = events(logs, "leadership_acquired")
        assert acquired["token"].startswith("first:")
        assert await redis.get(c.MONITOR_LEADER_KEY) == acquired["token"]

        assert await second.tick() is None
        assert not second.leading
        (standby,) = events(logs, "leadership_standby")
        assert standby["holder"] == acquired["token"]
        assert standby["token"].startswith("second:")

        snapshot = await first.tick()
        assert snapshot is not None and snapshot.pacing["src"].rate_rps == 10
        assert await rate(redis) == "10.0"
        # Renewed by the write itself: the whole TTL again.
        assert LEASE_MS - 100 < await redis.pttl(c.MONITOR_LEADER_KEY) <= LEASE_MS

        # A standby writes nothing, and says so once per holder.
        await redis.set(c.pace_rate_key("src"), 3)
        await redis.rpush(c.last50_key("halting"), *["500"] * c.LAST_N_STATUSES)
        assert await second.tick() is None
        assert await rate(redis) == "3"
        assert await redis.smembers(c.HALTED_SET) == set()
        assert len(events(logs, "leadership_standby")) == 1

        # The leader stops renewing (stalled or dead): once its lease expires, the
        # standby takes it, and sets rates from its next loop on.
        await wait_for(lambda: lease_gone(redis), 5, interval_s=0.01, what="lease expiry")
        assert await second.tick() is None
        assert second.leading
        assert await rate(redis) == "3"
        assert len(events(logs, "leadership_acquired")) == 2
        await second.tick()
        assert await rate(redis) == "10.0"
        assert await redis.smembers(c.HALTED_SET) == {"halting"}
        (halted,) = events(logs, "crawl_halted")  # the new leader runs the breakers
        assert (halted["source"], halted["type"]) == ("halting", "permanent")

        # The stalled leader wakes up: its write is refused whole, and it stands by.
        await redis.set(c.pace_rate_key("src"), 3)
        assert await first.tick() is None
        assert not first.leading
        assert await rate(redis) == "3"
        (lost,) = events(logs, "leadership_lost")
        assert lost["holder"] == await redis.get(c.MONITOR_LEADER_KEY)
        assert lost["holder"].startswith("second:")
        assert len(events(logs, "crawl_halted")) == 1


async def test_a_clean_stop_releases_the_lease_and_only_its_own(redis):
    first = regulator_with_lease(redis, "first", ttl_ms=60_000)
    second = regulator_with_lease(redis, "second", ttl_ms=60_000)
    stop = asyncio.Event()
    with capture_logs() as logs:
        task = asyncio.create_task(first.run(stop))
        try:
            await wait_for(lambda: rate(redis), 5, what="first rate")
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)
        assert events(logs, "leadership_released")
        assert await lease_gone(redis)
        # Released: the standby takes it on its next loop, not a minute later.
        await second.tick()
        assert second.leading
        # A regulator that does not hold the lease cannot release it.
        await first.release()
        await second.tick()
        assert second.leading and await redis.exists(c.MONITOR_LEADER_KEY)
    assert not events(logs, "leadership_lost")


async def test_a_standby_costs_one_round_trip_and_the_leader_none_extra(redis):
    store = RedisRegulatorStore(redis)
    lease = LeaderLease(token=new_lease_token(), ttl_ms=LEASE_MS)
    leader = Regulator(store, lambda: {"src": 1.0}, lease=lease)
    await redis.set(c.MONITOR_LEADER_KEY, "another monitor", px=60_000)
    before = store.round_trips
    await leader.tick()
    assert store.round_trips - before == 1
    await redis.delete(c.MONITOR_LEADER_KEY)
    await leader.tick()  # takes the lease
    before = store.round_trips
    await leader.tick()
    assert store.round_trips - before == 2  # one read, one write (renewal included)


async def test_a_redis_restart_loses_the_lease_and_the_monitor_takes_it_again(
    fresh_redis_server,
):
    client = Redis.from_url(
        fresh_redis_server.url, decode_responses=True, socket_timeout=1, socket_connect_timeout=1
    )
    regulator = regulator_with_lease(client, "only", ttl_ms=3000)
    stop = asyncio.Event()
    with capture_logs() as logs:
        task = asyncio.create_task(regulator.run(stop))
        try:
            await wait_for(lambda: rate(client), 5, what="first rate")
            fresh_redis_server.kill()
            fresh_redis_server.restart()  # no persistence: lease and rates are gone
            stale = (RedisConnectionError,)
            await wait_for(lambda: events(logs, "leadership_lost"), 10, what="lease lost")
            await wait_for(lambda: rate(client), 10, what="a rate again", ignore=stale)
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)
            await client.aclose()
    (lost,) = events(logs, "leadership_lost")
    assert lost["holder"] is None
    assert len(events(logs, "leadership_acquired")) == 2
    assert not events(logs, "regulator_error")


class Clock:
    """The wall clock the regulators read, moved by the test."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def paced_at(redis: Redis, source: str = "src") -> float:
    value = await rate(redis, source)
    assert value is not None, f"no pace_rate:{source}"
    return float(value)


@pytest.mark.timing("needs the 400 ms lease to outlast four ticks and their redis writes")
async def test_a_take_over_or_a_restart_keeps_the_cut(redis):
    clock = Clock()

    def monitor(name: str) -> Regulator:
        lease = LeaderLease(token=f"{name}:{new_lease_token()}", ttl_ms=LEASE_MS)
        store = RedisRegulatorStore(redis)
        return Regulator(
            store, lambda: {"src": 50.0}, RegulatorSettings(), lease=lease, clock=clock
        )

    first, second = monitor("first"), monitor("second")
    with capture_logs() as logs:
        await first.tick()  # takes the lease
        await first.tick()
        assert await paced_at(redis) == 50.0
        # Its server pushes back: cut twice, 50 -> 35 -> 24.5.
        for signals in (4, 9):
            await redis.set(c.backoff_signals_key("src"), signals)
            clock.now += 1
            await first.tick()
        assert await paced_at(redis) == pytest.approx(24.5)
        assert await second.tick() is None  # standing by

        # The leader dies (it stops renewing); the standby takes the lease once it expires,
        # and its first rate is the cut, not the configured 50/s.
        await wait_for(lambda: lease_gone(redis), 5, interval_s=0.01, what="lease expiry")
        await redis.set(c.backoff_signals_key("src"), 12)  # in flight at the death: not new
        clock.now += 4
        assert await second.tick() is None and second.leading
        clock.now += 1
        await second.tick()
        assert await paced_at(redis) == pytest.approx(24.5)
        # (The first leader's term started with nothing published: its source was new.)
        assert [
            (e["sources"], e["new"], e["inherited"]) for e in events(logs, "pacing_inherited")
        ] == [
            (1, 1, 0),
            (1, 0, 1),
        ]
        # From there it climbs (+0.5/s a second) and cuts (x 0.7) as the first would have.
        clock.now += 2
        await second.tick()
        assert await paced_at(redis) == pytest.approx(25.5)
        await redis.set(c.backoff_signals_key("src"), 13)
        clock.now += 1
        await second.tick()
        assert await paced_at(redis) == pytest.approx(25.5 * 0.7)

        # A clean stop, and a monitor started afresh (a restart): the cut again.
        await second.release()
        restarted = monitor("restarted")
        await restarted.tick()
        clock.now += 1
        await restarted.tick()
        assert await paced_at(redis) == pytest.approx(25.5 * 0.7)
        assert len(events(logs, "pacing_inherited", inherited=1)) == 2
