"""The regulator's loop, one tick at a time, against a real redis-server.

Each test drives ``Regulator.tick()`` itself (a controllable tick) and reads the keys a
worker would read (``pace_rate:{source}``). The wall clock of the 60 s window and of the
adaptive rate is injected where time must pass.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from structlog.testing import capture_logs

from crawl_monitor.policy.adaptive import AdaptiveSettings
from crawl_monitor.policy.decision import RATES_REWRITE_LOOPS
from crawl_monitor.regulator import Regulator, RegulatorSettings
from crawl_monitor.store import (
    READ_CHUNK,
    RedisRegulatorStore,
    WriteResult,
    Writes,
)
from image_crawler import contract as c
from image_crawler.lifecycle import cancel_and_wait
from test.harness.services import wait_for
from worker.stats import RedisStats


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def rates() -> dict[str, float]:
    return {}


@pytest.fixture
def regulator(redis: Redis, rates, clock) -> Regulator:
    return Regulator(RedisRegulatorStore(redis), lambda: rates, RegulatorSettings(), clock=clock)


async def rate(redis: Redis, source: str) -> float | None:
    """The rate a worker paces ``source`` at (None: no key, so no request)."""
    value = await redis.get(c.pace_rate_key(source))
    return None if value is None else float(value)


async def pacing(redis: Redis) -> dict[str, c.PacingInfo]:
    return {s: c.PacingInfo.from_json(v) for s, v in (await redis.hgetall(c.RATES_HASH)).items()}


async def add_statuses(redis: Redis, source: str, statuses: list[str], at: float) -> None:
    """Write statuses into the 60 s window and the last-50 list, as a worker does."""
    members = {c.window_member(s, at - i * 0.001): at - i * 0.001 for i, s in enumerate(statuses)}
    await redis.zadd(f"{c.STATUS_60S_PREFIX}{source}", members)
    await redis.rpush(c.last50_key(source), *statuses)
    await redis.ltrim(c.last50_key(source), -50, -1)


async def flush(redis: Redis, source: str, statuses: list[str], at: float) -> None:
    """Statuses as a worker's flush writes them: with the failure counter and the backoff
    signal counter bumped by their errors and backoff statuses."""
    await add_statuses(redis, source, statuses, at)
    await redis.incrby(
        c.resize_errors_key(source), sum(s not in c.EXPECTED_STATUSES for s in statuses)
    )
    await redis.incrby(
        c.backoff_signals_key(source), sum(s in c.BACKOFF_STATUSES for s in statuses)
    )


def events(logs, name, **fields):
    return [e for e in logs if e["event"] == name and all(e.get(k) == v for k, v in fields.items())]


def rotating_regulator(redis: Redis, sources: list[str], clock, every: int) -> Regulator:
    """A regulator of ``sources`` (2 requests/s each) reading one in ``every`` in full."""
    return Regulator(
        RedisRegulatorStore(redis),
        lambda: dict.fromkeys(sources, 2.0),
        RegulatorSettings(full_last_statuses_every=every),
        clock=clock,
    )


async def loops_until_halted(regulator: Regulator, source: str, loops: int, **fields) -> int | None:
    """The loop (1-based) whose tick logged ``source``'s crawl_halted, None within ``loops``."""
    with capture_logs() as logs:
        for loop in range(1, loops + 1):
            await regulator.tick()
            if events(logs, "crawl_halted", source=source, **fields):
                return loop
    return None


async def test_rates_over_several_seconds(redis, regulator, rates):
    rates.update({"slow": 0.2, "fast": 50.0, "odd": 0.59760418})
    for _ in range(3):
        await regulator.tick()
        for source, rps in rates.items():
            # The float itself, however small: workers space requests 1/rate apart.
            assert await redis.get(c.pace_rate_key(source)) == repr(rps)
            ttl_ms = await redis.pttl(c.pace_rate_key(source))
            assert 0 < ttl_ms <= 1500
    assert regulator.snapshot is not None
    assert regulator.snapshot.rates == rates
    # crawl_rates rounds to 6 decimals, for operators.
    paced = {s: p.rate_rps for s, p in regulator.snapshot.pacing.items()}
    assert paced == pytest.approx(rates, abs=1e-6)
    assert await redis.exists(*[c.tokens_key(s) for s in rates]) == 0  # the old buckets


async def test_unknown_sources_get_no_rate(redis, regulator, rates, clock):
    rates["known"] = 1.0
    await redis.sadd(c.INBOUND_SOURCES_SET, "known", "stranger")
    await regulator.tick()
    assert await rate(redis, "known") == 1
    assert await redis.exists(c.pace_rate_key("stranger")) == 0
    assert await pacing(redis) == {
        "known": c.PacingInfo(
            1.0, 1.0, "computed", c.PACE_CONFIGURED, "at its configured rate", round(clock.now, 3)
        )
    }


async def test_overrides_and_their_alias_apply_on_the_next_loop(redis, regulator, rates):
    rates["src"] = 3.0
    await regulator.tick()
    assert await rate(redis, "src") == 3
    await redis.set("override-rate:src", "10")
    await regulator.tick()
    assert await rate(redis, "src") == 10
    info = (await pacing(redis))["src"]  # what operators see
    assert (info.rate_rps, info.configured_rps, info.origin) == (10.0, 10.0, "override-rate:")
    await redis.set("override_rate:src", "5")
    await regulator.tick()
    assert await rate(redis, "src") == 5  # override_rate: beats override-rate:
    assert (await pacing(redis))["src"].origin == "override_rate:"
    with capture_logs() as logs:
        await redis.set("override_rate:src", "fast")
        await regulator.tick()
        assert await rate(redis, "src") == 10  # the bad one is ignored
        await regulator.tick()
        await redis.set("override-rate:src", "-1")
        await regulator.tick()
        assert await rate(redis, "src") == 3  # both bad: the computed rate
    ignored = events(logs, "override_ignored")
    assert [(e["key"], e["value"]) for e in ignored] == [
        ("override_rate:src", "fast"),
        ("override-rate:src", "-1"),
    ]  # each logged once, not every loop
    await redis.delete("override_rate:src", "override-rate:src")
    await regulator.tick()
    assert await rate(redis, "src") == 3


async def test_halted_sources_get_a_rate_of_0(redis, regulator, rates):
    rates.update({"stopped": 50.0, "paused": 50.0, "running": 50.0})
    for source in rates:
        await redis.set(c.pace_rate_key(source), 99)  # stale, no expiry
    await redis.sadd(c.HALTED_SET, "stopped")
    await redis.sadd(c.TEMP_HALTED_SET, "paused")
    # The window of "paused" is bad, so its temporary halt stays.
    await add_statuses(redis, "paused", ["500"] * 10, time.time())
    await regulator.tick()
    assert await redis.get(c.pace_rate_key("stopped")) == "0"
    assert await redis.get(c.pace_rate_key("paused")) == "0"
    assert await rate(redis, "running") == 50
    assert 0 < await redis.pttl(c.pace_rate_key("stopped")) <= 1500
    assert await redis.smembers(c.HALTED_SET) == {"stopped"}
    assert await redis.smembers(c.TEMP_HALTED_SET) == {"paused"}
    infos = await pacing(redis)
    assert {s: (i.rate_rps, i.configured_rps, i.state) for s, i in infos.items()} == {
        "stopped": (0.0, 50.0, c.PACE_HALTED),
        "paused": (0.0, 50.0, c.PACE_HALTED),
        "running": (50.0, 50.0, c.PACE_CONFIGURED),
    }


async def test_the_write_gives_no_rate_to_a_source_halted_since_the_read(redis):
    store = RedisRegulatorStore(redis)
    await redis.sadd(c.HALTED_SET, "late")
    assert await store.write(Writes(pace_rates={"late": 7.0, "other": 7.0}), 1500) == WriteResult(
        applied=True, paced=2
    )
    assert await redis.get(c.pace_rate_key("late")) == "0"
    assert await redis.get(c.pace_rate_key("other")) == "7.0"


async def test_temporary_halt_trips_once_and_lifts_when_healthy(redis, regulator, rates, clock):
    rates.update({"example": 50.0, "steady": 50.0})
    await add_statuses(redis, "example", ["500"] * 10 + ["200"] * 10, clock.now)
    await add_statuses(redis, "steady", ["200"] * 10 + ["404"] * 10, clock.now)
    with capture_logs() as logs:
        await regulator.tick()
        await regulator.tick()
    halted = events(logs, "crawl_halted")
    assert len(halted) == 1, halted  # one trip, not one per loop
    assert halted[0]["type"] == "temporary" and halted[0]["source"] == "example"
    assert halted[0]["msg"] == (
        'example tripped temporary halt. Response codes: {"200": 10, "500": 10}'
    )
    assert halted[0]["log_level"] == "warning"
    assert await redis.smembers(c.TEMP_HALTED_SET) == {"example"}
    assert await rate(redis, "example") == 0
    assert await rate(redis, "steady") == 50

    # Successes dilute the errors to 10 of 110 (9%): healthy again.
    await add_statuses(redis, "example", ["200"] * 90, clock.now + 1)
    with capture_logs() as logs:
        await regulator.tick()
    assert events(logs, "temporary_halt_lifted", source="example")
    assert not events(logs, "crawl_halted")
    assert await redis.smembers(c.TEMP_HALTED_SET) == set()
    assert await rate(redis, "example") == 50


async def test_a_temporary_halt_lifts_once_its_errors_leave_the_minute(
    redis, regulator, rates, clock
):
    rates["example"] = 50.0
    await add_statuses(redis, "example", ["500"] * 20, clock.now)
    await regulator.tick()
    assert await redis.smembers(c.TEMP_HALTED_SET) == {"example"}
    clock.now += 59.9
    await regulator.tick()
    assert await rate(redis, "example") == 0
    clock.now += 0.2  # the errors are now older than 60 s
    await regulator.tick()
    assert await redis.smembers(c.TEMP_HALTED_SET) == set()
    assert await rate(redis, "example") == 50


async def test_permanent_halt_then_resume_clears_the_minute_window(redis, regulator, rates, clock):
    rates["example"] = 0.5
    await add_statuses(redis, "example", ["500"] * 50, clock.now)
    with capture_logs() as logs:
        await regulator.tick()
        await regulator.tick()
    permanent = events(logs, "crawl_halted", type="permanent")
    assert len(permanent) == 1
    assert permanent[0]["source"] == "example"
    assert 'Response codes: {"500": 50}' in permanent[0]["msg"]
    assert await redis.smembers(c.HALTED_SET) == {"example"}
    assert await redis.get(c.pace_rate_key("example")) == "0"

    # The operator's procedure (the redis-cli run is in test_process.py).
    await redis.set("override_rate:example", "5")
    await redis.delete(c.last50_key("example"))
    await redis.srem(c.HALTED_SET, "example")
    with capture_logs() as logs:
        await regulator.tick()
        await regulator.tick()
    assert events(logs, "crawl_resumed", source="example")
    assert not events(logs, "crawl_halted")  # the old errors do not trip it again
    assert await redis.exists(f"{c.STATUS_60S_PREFIX}example") == 0
    assert await redis.smembers(c.TEMP_HALTED_SET) == set()
    assert await redis.smembers(c.HALTED_SET) == set()
    assert await rate(redis, "example") == 5


async def test_a_key_of_the_wrong_type_is_reported_not_fatal(redis, regulator, rates):
    rates.update({"odd": 4.0, "fine": 4.0})
    await redis.set(f"{c.STATUS_60S_PREFIX}odd", "not a sorted set")
    with capture_logs() as logs:
        await regulator.tick()
        await regulator.tick()
    assert len(events(logs, "redis_key_unreadable")) == 1
    assert await rate(redis, "odd") == 4
    assert await rate(redis, "fine") == 4


async def test_sources_that_leave_the_list_stop_getting_a_rate(redis, regulator, rates):
    rates.update({"stays": 2.0, "goes": 2.0})
    await redis.sadd(c.TEMP_HALTED_SET, "goes")
    await regulator.tick()
    del rates["goes"]
    await regulator.tick()
    assert await redis.smembers(c.TEMP_HALTED_SET) == set()
    # Its last rate is not renewed and expires; so does its crawl_rates field.
    assert set(await pacing(redis)) == {"stays"}
    await wait_for(
        lambda: _absent(redis, c.pace_rate_key("goes")), 3, what="the rate of 'goes' expired"
    )
    await regulator.tick()
    assert await rate(redis, "stays") == 2
    assert await rate(redis, "goes") is None


async def _absent(redis: Redis, key: str) -> bool:
    return not await redis.exists(key)


async def test_the_loop_fails_closed_while_redis_is_away(fresh_redis_server):
    client = Redis.from_url(
        fresh_redis_server.url, decode_responses=True, socket_timeout=1, socket_connect_timeout=1
    )
    regulator = Regulator(RedisRegulatorStore(client), lambda: {"src": 10.0})
    stop = asyncio.Event()
    with capture_logs() as logs:
        task = asyncio.create_task(regulator.run(stop))
        try:
            await wait_for(lambda: _value(client, "src", "10.0"), 5, what="first rate")
            fresh_redis_server.kill()
            await wait_for(
                lambda: events(logs, "redis_unavailable", op="regulate"), 5, what="a failed loop"
            )
            fresh_redis_server.restart()  # no persistence: the rate is gone
            # The client's pool may still hold a connection to the killed server: its
            # first use fails once, which is "not yet", not a failure of the regulator.
            stale = (RedisConnectionError,)
            await wait_for(
                lambda: _value(client, "src", "10.0"), 10, what="a rate again", ignore=stale
            )
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)
            await client.aclose()
    assert not events(logs, "regulator_error")


async def _value(redis: Redis, source: str, expected: str) -> bool:
    return await redis.get(c.pace_rate_key(source)) == expected


async def test_a_partial_read_brings_only_what_a_breaker_or_the_log_needs(redis, clock):
    now = clock.now
    await add_statuses(redis, "healthy", ["200"] * 50, now)
    await add_statuses(redis, "mixed", ["500"] * 30 + ["200"] * 20, now)  # newest: 200
    await add_statuses(redis, "failing", ["200"] + ["500"] * 50, now)  # last 50 all 500
    await add_statuses(redis, "erroring", ["200"] * 10 + ["404", "403"], now)
    store = RedisRegulatorStore(redis)
    sources = ["erroring", "failing", "healthy", "mixed"]
    observed = await store.read(sources, now - 60, full_last_statuses={"mixed"})
    # Windows without an error are left out; last-50 histograms only where asked for, or
    # where all 50 failed (the permanent breaker).
    assert set(observed.sources) == {"erroring", "failing", "mixed"}
    assert observed.of("erroring").window == {"200": 10, "404": 1, "403": 1}
    assert observed.of("erroring").last_statuses == {}
    assert observed.of("failing").last_statuses == {"500": 50}
    assert observed.of("mixed").last_statuses == {"500": 30, "200": 20}
    full = await store.read(sources, now - 60)
    assert full.of("healthy").last_statuses == {"200": 50}


async def test_a_window_without_errors_skips_the_last_50_check_until_the_rotation(redis, clock):
    # A window of expected statuses means the newest statuses are not 50 failures, so the
    # read skips that check; a last-50 list that disagrees (a worker whose clock is minutes
    # behind writes statuses the window never holds) is caught by the full-read rotation.
    sources = ["skewed", "healthy", "idle-failing"]
    regulator = rotating_regulator(redis, sources, clock, every=3)
    await regulator.tick()  # the first loop reads everything
    await add_statuses(redis, "healthy", ["200"] * 10 + ["404"], clock.now)
    await add_statuses(redis, "skewed", ["200"] * 10 + ["404"], clock.now)
    await redis.rpush(c.last50_key("skewed"), *["500"] * 50)
    await redis.rpush(c.last50_key("idle-failing"), *["ServerDisconnected"] * 50)  # empty window

    partial = await RedisRegulatorStore(redis).read(sources, clock.now - 60, full_last_statuses=())
    assert partial.of("skewed").last_statuses == {}
    assert partial.of("idle-failing").last_statuses == {"ServerDisconnected": 50}

    tripped_after = await loops_until_halted(regulator, "skewed", 3, type="permanent")
    assert tripped_after is not None  # within full_last_statuses_every loops
    assert await redis.smembers(c.HALTED_SET) == {"skewed", "idle-failing"}


async def test_a_failure_a_worker_records_is_weighed_on_the_next_loop(redis, clock):
    # Quiet sources (failure counter unchanged, window without an error) are not read;
    # a worker's flush bumps the counter with the failure, so the next loop reads them.
    sources = ["flaky", "dead", "calm"]
    regulator = rotating_regulator(redis, sources, clock, every=1000)  # no rotation to lean on
    stats = RedisStats(redis, clock=clock, min_interval_s=0.0)
    flushing = asyncio.create_task(stats.run())
    try:
        await asyncio.gather(*(stats.record(s, "200") for s in sources for _ in range(20)))
        await regulator.tick()
        await regulator.tick()  # every source quiet now
        assert await redis.smembers(c.TEMP_HALTED_SET) == set()
        await asyncio.gather(
            *(stats.record("flaky", "500") for _ in range(5)),
            *(stats.record("dead", "ServerDisconnected") for _ in range(50)),
        )
        with capture_logs() as logs:
            await regulator.tick()
    finally:
        await cancel_and_wait([flushing])
    assert events(logs, "crawl_halted", source="flaky", type="temporary")
    assert events(logs, "crawl_halted", source="dead", type="permanent")
    assert not events(logs, "crawl_halted", source="calm")
    assert await rate(redis, "flaky") == 0 and await rate(redis, "dead") == 0


async def test_a_source_whose_failure_counter_did_not_move_waits_for_its_turn(redis, clock):
    # Statuses written without the counter (not by a worker) are only seen when the
    # rotation reads the source in full: the proof that quiet sources are not read.
    regulator = rotating_regulator(redis, ["a", "b", "c"], clock, every=3)
    await regulator.tick()
    await add_statuses(redis, "a", ["500"] * 20, clock.now)
    tripped_after = await loops_until_halted(regulator, "a", 3)
    # Loop k reads sources[k % 3::3] in full: "a" (the first) at loop 3.
    assert tripped_after == 3


async def test_unreadable_keys_are_reported_with_their_own_source(redis, clock):
    await redis.set(f"{c.STATUS_60S_PREFIX}odd-window", "not a sorted set")
    await redis.set(c.last50_key("odd-list"), "not a list")  # its window is empty
    await add_statuses(redis, "fine", ["200"] * 3, clock.now)
    sources = ["odd-window", "odd-list", "fine"]
    observed = await RedisRegulatorStore(redis).read(sources, clock.now - 60, full_last_statuses=())
    errors = {s: observed.of(s).errors for s in sources}
    assert [len(e) for e in errors.values()] == [1, 1, 0]
    assert errors["odd-window"][0].startswith(f"{c.STATUS_60S_PREFIX}odd-window: WRONGTYPE")
    assert errors["odd-list"][0].startswith(f"{c.last50_key('odd-list')}: WRONGTYPE")


async def test_crawl_rates_holds_every_source_when_written_in_several_calls(
    redis, regulator, rates
):
    # The write script sets crawl_rates 1,000 fields a call: 2,500 sources take three.
    rates.update({f"site{i:04d}": 0.2 + i / 100 for i in range(2500)})
    await regulator.tick()
    assert {s: p.rate_rps for s, p in (await pacing(redis)).items()} == pytest.approx(rates)
    for i in range(1000, 2200):
        del rates[f"site{i:04d}"]
    await regulator.tick()  # fields deleted 1,000 a call too
    assert await redis.hlen(c.RATES_HASH) == 1300
    assert "site1000" not in await redis.hkeys(c.RATES_HASH)


async def test_crawl_rates_gets_changed_fields_and_comes_back_whole(redis, regulator, rates):
    rates.update({"calm": 2.0, "moved": 3.0})
    await regulator.tick()
    calm = await redis.hget(c.RATES_HASH, "calm")
    await redis.hset(c.RATES_HASH, "calm", "scribbled")  # not rewritten while unchanged...
    await redis.set(c.OVERRIDE_RATE_PREFIX + "moved", "4")
    await regulator.tick()
    assert await redis.hget(c.RATES_HASH, "calm") == "scribbled"
    assert c.PacingInfo.from_json(await redis.hget(c.RATES_HASH, "moved")).rate_rps == 4.0
    await redis.delete(c.RATES_HASH)  # ...nor after Redis lost it...
    for _ in range(RATES_REWRITE_LOOPS - 2):
        await regulator.tick()
    assert await redis.hlen(c.RATES_HASH) == 0
    await regulator.tick()  # ...until the whole rewrite
    assert await redis.hget(c.RATES_HASH, "calm") == calm
    assert await redis.hlen(c.RATES_HASH) == 2


async def test_windows_of_200s_and_expected_statuses_are_left_out_and_others_counted(redis, clock):
    # The read script decides "all 200" in one C-level count and only then walks the
    # members: every case on either side of that shortcut.
    now = clock.now
    await add_statuses(redis, "all-200", ["200"] * 40, now)
    await add_statuses(redis, "expected-only", ["200"] * 5 + ["404", "301", "NoRateToken"], now)
    await add_statuses(redis, "one-500", ["200"] * 7 + ["500"], now)
    await add_statuses(redis, "no-200", ["Timeout", "Blocked"], now)
    await add_statuses(redis, "2000-is-not-200", ["2000", "200"], now)
    await add_statuses(redis, "old-error", ["200"], now)
    await redis.zadd(
        f"{c.STATUS_60S_PREFIX}old-error", {c.window_member("500", now - 90): now - 90}
    )
    sources = ["all-200", "expected-only", "one-500", "no-200", "2000-is-not-200", "old-error"]
    observed = await RedisRegulatorStore(redis).read(sources, now - 60, full_last_statuses=())
    windows = {s: observed.of(s).window for s in sources}
    assert windows == {
        "all-200": {},
        "expected-only": {},
        "one-500": {"200": 7, "500": 1},
        "no-200": {"Timeout": 1, "Blocked": 1},
        "2000-is-not-200": {"2000": 1, "200": 1},
        "old-error": {},  # its error left the minute
    }


async def test_overrides_and_aliases_are_read_for_every_source_of_every_chunk(redis, clock):
    sources = [f"site{i:04d}" for i in range(1203)]  # three read chunks
    await redis.set(f"{c.OVERRIDE_RATE_PREFIX}site0000", "5")
    await redis.set(f"{c.OVERRIDE_RATE_ALIAS_PREFIX}site0600", "7")
    await redis.set(f"{c.OVERRIDE_RATE_PREFIX}site1202", "0.5")
    await redis.set(f"{c.OVERRIDE_RATE_ALIAS_PREFIX}site1202", "9")
    await redis.rpush(f"{c.OVERRIDE_RATE_PREFIX}site0001", "not a string")  # read as none
    observed = await RedisRegulatorStore(redis).read(sources, clock.now - 60)
    found = {
        s: (state.override, state.override_alias)
        for s, state in observed.sources.items()
        if state.override or state.override_alias
    }
    assert found == {"site0000": ("5", None), "site0600": (None, "7"), "site1202": ("0.5", "9")}


async def test_every_source_s_last_50_reaches_the_log_within_the_rotation(redis, clock):
    sources = [f"s{i}" for i in range(7)]
    for source in sources:
        await add_statuses(redis, source, ["200"] * 3, clock.now)
    regulator = rotating_regulator(redis, sources, clock, every=3)
    first = await regulator.tick()  # the first loop reads everything
    assert first is not None and set(first.last_statuses) == set(sources)
    await redis.rpush(c.last50_key("s4"), "404")
    seen = []
    for _ in range(3):
        snapshot = await regulator.tick()
        assert snapshot is not None and set(snapshot.last_statuses) == set(sources)
        seen.append(snapshot.last_statuses["s4"])
    assert seen[-1] == {"200": 3, "404": 1}  # refreshed within 3 loops


async def test_backoff_signals_are_read_for_every_source_of_every_chunk(redis, clock):
    sources = [f"site{i:04d}" for i in range(2 * READ_CHUNK + 3)]  # three read chunks
    await redis.set(c.backoff_signals_key("site0000"), 4)
    await redis.set(c.backoff_signals_key(sources[READ_CHUNK]), 7)
    await redis.set(c.backoff_signals_key(sources[-1]), 1)
    await redis.set(c.backoff_signals_key("site0001"), "many")  # as good as missing
    await redis.set(f"{c.OVERRIDE_RATE_PREFIX}{sources[-1]}", "2")  # the MGET's other keys
    await redis.incr(c.resize_errors_key(sources[-1]))
    observed = await RedisRegulatorStore(redis).read(sources, clock.now - 60)
    assert observed.backoff_signals == {"site0000": 4, sources[READ_CHUNK]: 7, sources[-1]: 1}
    assert observed.of(sources[-1]).override == "2"
    assert observed.failure_counters[sources[-1]] == "1"


async def test_a_source_whose_server_pushes_back_is_cut_and_climbs_back(redis, clock):
    regulator = Regulator(
        RedisRegulatorStore(redis), lambda: {"src": 50.0}, RegulatorSettings(), clock=clock
    )
    await regulator.tick()  # where counting starts
    # Workers saw 503s.
    await flush(redis, "src", ["200"] * 10 + ["503"] * 30, clock.now)
    clock.now += 1
    with capture_logs() as logs:
        await regulator.tick()
    assert await rate(redis, "src") == 35.0
    info = (await pacing(redis))["src"]
    assert (info.rate_rps, info.configured_rps, info.state) == (35.0, 50.0, c.PACE_BACKOFF)
    assert info.why == "30 backoff signals in the last second: cut to 0.7 x"
    (changed,) = events(logs, "pacing_changed")
    assert (changed["source"], changed["state"]) == ("src", c.PACE_BACKOFF)
    # Not breaker errors while the rate can still fall.
    assert await redis.smembers(c.TEMP_HALTED_SET) == set()
    for expected in (35.5, 36.0):
        clock.now += 1
        await regulator.tick()
        assert await rate(redis, "src") == pytest.approx(expected)
    assert (await pacing(redis))["src"].state == c.PACE_RECOVERING


async def test_a_source_that_keeps_pushing_back_at_its_floor_is_halted(redis, clock):
    settings = RegulatorSettings(adaptive=AdaptiveSettings(floor_rps=40.0))
    regulator = Regulator(RedisRegulatorStore(redis), lambda: {"src": 50.0}, settings, clock=clock)
    await regulator.tick()
    await flush(redis, "src", ["503"] * 20, clock.now)
    clock.now += 1
    await regulator.tick()  # cut to its floor: the 503s were still excused
    assert await rate(redis, "src") == 40.0
    assert (await pacing(redis))["src"].state == c.PACE_FLOOR
    assert await redis.smembers(c.TEMP_HALTED_SET) == set()
    clock.now += 1
    with capture_logs() as logs:
        await regulator.tick()  # at the floor they count
    (halted,) = events(logs, "crawl_halted", type="temporary")
    assert '"503": 20' in halted["msg"]
    assert await redis.get(c.pace_rate_key("src")) == "0"


async def set_crawl_delay(redis: Redis, source: str, delay: str, px: int | None = None) -> None:
    """As a worker records a robots.txt Crawl-delay: the key, then the set."""
    await redis.set(c.crawl_delay_key(source), delay, px=px or int(c.ROBOTS_CACHE_S * 1000))
    await redis.sadd(c.CRAWL_DELAYED_SET, source)


@pytest.mark.timing("needs the next tick within the 200 ms TTL of a crawl-delay key")
async def test_a_crawl_delay_caps_the_rate_until_its_key_goes(redis, regulator, rates, clock):
    rates.update({"src": 50.0, "other": 50.0})
    await regulator.tick()
    assert await rate(redis, "src") == 50
    await set_crawl_delay(redis, "src", "10")
    await regulator.tick()
    assert await rate(redis, "src") == 0.1  # one request every 10 s
    assert await rate(redis, "other") == 50
    assert (await pacing(redis))["src"] == c.PacingInfo(
        *(0.1, 0.1, "crawl_delay", c.PACE_CONFIGURED, "robots.txt Crawl-delay 10 s: at most 0.1/s"),
        round(clock.now, 3),
    )
    assert regulator.snapshot is not None and regulator.snapshot.rates["src"] == 0.1
    # An override does not lift it.
    await redis.set("override_rate:src", "20")
    await regulator.tick()
    assert await rate(redis, "src") == 0.1
    await redis.delete("override_rate:src")
    # Deleted (or expired, below): the cap is lifted, the member cleaned by the leader.
    await redis.delete(c.crawl_delay_key("src"))
    await regulator.tick()
    assert await rate(redis, "src") == 50
    assert (await pacing(redis))["src"].origin == "computed"
    assert await redis.smembers(c.CRAWL_DELAYED_SET) == set()
    await set_crawl_delay(redis, "src", "4", px=200)
    await regulator.tick()
    assert await rate(redis, "src") == 0.25
    await asyncio.sleep(0.3)
    await regulator.tick()
    assert await rate(redis, "src") == 50
    assert await redis.smembers(c.CRAWL_DELAYED_SET) == set()


async def test_a_robots_exempt_source_ignores_its_crawl_delay(redis, regulator, rates):
    rates["src"] = 50.0
    await set_crawl_delay(redis, "src", "10")
    await redis.sadd(c.ROBOTS_EXEMPT_SET, "src")
    await regulator.tick()
    assert await rate(redis, "src") == 50
    assert (await pacing(redis))["src"].origin == "computed"
    assert await redis.smembers(c.CRAWL_DELAYED_SET) == {"src"}  # its key expires by itself
    await redis.srem(c.ROBOTS_EXEMPT_SET, "src")
    await regulator.tick()
    assert await rate(redis, "src") == 0.1


async def test_a_crawl_delay_that_is_not_a_delay_is_ignored_and_logged_once(
    redis, regulator, rates
):
    rates["src"] = 50.0
    await set_crawl_delay(redis, "src", "soon")
    with capture_logs() as logs:
        for _ in range(3):
            await regulator.tick()
            assert await rate(redis, "src") == 50
    ignored = events(logs, "crawl_delay_ignored")
    assert [(e["key"], e["value"], e["log_level"]) for e in ignored] == [
        ("crawl_delay:src", "soon", "warning")
    ]
    assert await redis.smembers(c.CRAWL_DELAYED_SET) == {"src"}  # its key is still there


async def test_the_crawl_delayed_cleanup_spares_a_key_set_again_since_the_read(redis):
    store = RedisRegulatorStore(redis)
    await redis.sadd(c.CRAWL_DELAYED_SET, "back", "gone")
    observed = await store.read([], time.time() - 60)
    assert observed.crawl_delays == {"back": None, "gone": None}
    # A worker records a delay for "back" between the loop's read and its write.
    await redis.set(c.crawl_delay_key("back"), "5")
    await store.write(Writes(pace_rates={}, forget_crawl_delayed=["back", "gone"]), 1500)
    assert await redis.smembers(c.CRAWL_DELAYED_SET) == {"back"}


async def test_crawl_delays_are_read_in_the_same_round_trip_whatever_their_number(redis):
    store = RedisRegulatorStore(redis)
    members = [f"s{i}" for i in range(9_000)]  # more than one MGET of the script's
    await redis.mset({c.crawl_delay_key(s): str(1 + i % 7) for i, s in enumerate(members)})
    await redis.delete(c.crawl_delay_key("s8999"), c.crawl_delay_key("s0"))
    await redis.hset(c.crawl_delay_key("s0"), "delay", "3")  # not a string: as if missing
    await redis.sadd(c.CRAWL_DELAYED_SET, *members)
    await redis.sadd(c.ROBOTS_EXEMPT_SET, "s1", "elsewhere")
    await redis.script_flush()  # as after a restart: the scripts are loaded again
    observed = await store.read(["s1", "s2"], time.time() - 60)
    expected = {s: str(1 + i % 7) for i, s in enumerate(members)}
    expected.update({"s0": None, "s8999": None})
    assert observed.crawl_delays == expected
    assert observed.robots_exempt == {"s1", "elsewhere"}
    before = store.round_trips
    await store.read(["s1", "s2"], time.time() - 60)
    assert store.round_trips - before == 1


class RedisAway:
    """A store whose every read fails as when Redis is away; notes when each was tried."""

    def __init__(self) -> None:
        self.tries: list[float] = []

    async def read(self, *args, **kwargs):
        self.tries.append(time.monotonic())
        raise RedisConnectionError("away")


@pytest.mark.timing(
    "asserts the monotonic times of retries against the regulator's 50 ms tick grid"
)
async def test_while_redis_is_away_the_loop_backs_off_on_its_grid():
    period_s = 0.05
    store = RedisAway()
    regulator = Regulator(store, lambda: {"src": 1.0}, RegulatorSettings(period_s=period_s))
    stop = asyncio.Event()
    task = asyncio.create_task(regulator.run(stop))
    try:
        await wait_for(lambda: len(store.tries) >= 6, 10, what="six tries")
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
    since_first = [(t - store.tries[0]) / period_s for t in store.tries]
    # Each try on a tick of its own: never more often than once a period (the first try
    # may have started up to half a period late).
    assert all(periods >= i - 0.5 for i, periods in enumerate(since_first)), since_first
    # Backing off: after a 4th failure in a row, the next try skips at least 3 ticks.
    assert since_first[4] - since_first[3] >= 3, since_first
