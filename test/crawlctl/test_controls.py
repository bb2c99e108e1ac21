"""Operator actions against a real redis-server: the keys they change, and what they say."""

from __future__ import annotations

import time

import pytest
from redis.asyncio import Redis

from crawlctl.commands import controls
from image_crawler import contract as c


async def seed_a_tripped_source(redis: Redis, source: str) -> None:
    now = time.time()
    await redis.sadd(c.HALTED_SET, source)
    await redis.sadd(c.TEMP_HALTED_SET, source)
    await redis.rpush(c.last50_key(source), *["500"] * 50)
    await redis.zadd(
        f"{c.STATUS_60S_PREFIX}{source}",
        {c.window_member("500", now - i): now - i for i in range(5)},
    )
    await redis.zadd(f"{c.STATUS_1HR_PREFIX}{source}", {c.window_member("500", now): now})
    await redis.set(c.pace_rate_key(source), "0", px=1500)  # the monitor paces it at 0


async def test_halt_adds_to_halted_and_sets_the_pace_rate_to_0(redis: Redis) -> None:
    await redis.set(c.pace_rate_key("flickr"), "178.4", px=1500)
    await redis.set(c.tokens_key("flickr"), 180)
    done = await controls.halt(redis, "flickr")
    assert await redis.smembers(c.HALTED_SET) == {"flickr"}
    assert await redis.get(c.pace_rate_key("flickr")) == "0"
    # Until the monitor writes "0" with its own expiry; without a monitor "0" stays.
    assert await redis.ttl(c.pace_rate_key("flickr")) == -1
    assert await redis.get(c.tokens_key("flickr")) == "0"  # for workers older than pacing
    assert [str(d) for d in done] == [
        "SADD halted flickr  (the monitor paces it at 0 until it is resumed)",
        "SET pace_rate:flickr 0  (workers stop within their pacing horizon, ~0.05 s)",
        "SET currtokens:flickr 0  (the same for workers older than pacing)",
    ]
    again = await controls.halt(redis, "flickr")
    assert str(again[0]) == "SADD halted flickr  (it was already halted)"


async def test_resume_is_the_readme_procedure_done_right(redis: Redis) -> None:
    await seed_a_tripped_source(redis, "example")
    await seed_a_tripped_source(redis, "other")
    done = await controls.resume(redis, "example", rate=5.0)
    assert [d.command for d in done] == [
        "SET override_rate:example 5",
        "DEL statuslast50req:example",
        "DEL status60s:example",
        "SREM halted example",
        "SREM temp_halted example",
    ]
    assert all(not d.note for d in done[1:])
    assert await redis.get("override_rate:example") == "5"
    assert await redis.exists(c.last50_key("example"), f"{c.STATUS_60S_PREFIX}example") == 0
    assert not await redis.sismember(c.HALTED_SET, "example")
    assert not await redis.sismember(c.TEMP_HALTED_SET, "example")
    # Only what the procedure names: the longer windows stay for the record.
    assert await redis.zcard(f"{c.STATUS_1HR_PREFIX}example") == 1
    # Other sources are untouched.
    assert await redis.sismember(c.HALTED_SET, "other")
    assert await redis.llen(c.last50_key("other")) == 50


async def test_resume_without_rate_leaves_the_override_and_says_what_was_not_there(
    redis: Redis,
) -> None:
    await redis.set("override_rate:quiet", "3")
    done = await controls.resume(redis, "quiet")
    assert await redis.get("override_rate:quiet") == "3"
    assert [d.note for d in done] == [
        "it was empty",
        "it was empty",
        "it was not halted",
        "it was not temporarily halted",
    ]


async def test_override_and_clear(redis: Redis) -> None:
    done = await controls.override(redis, "met", 12.5)
    assert await redis.get("override_rate:met") == "12.5"
    assert [d.command for d in done] == ["SET override_rate:met 12.5"]
    await redis.set("override-rate:met", "9")  # the original system's spelling
    done = await controls.clear_override(redis, "met")
    assert await redis.exists("override_rate:met", "override-rate:met") == 0
    assert [str(d) for d in done] == ["DEL override_rate:met", "DEL override-rate:met"]
    done = await controls.clear_override(redis, "met")
    assert all(d.note == "there was none" for d in done)


@pytest.mark.parametrize(
    ("raw", "name"), [("flickr", "flickr"), (" Flickr ", "flickr"), ("a.b_c-d", "a.b_c-d")]
)
def test_source_names_are_lower_cased(raw: str, name: str) -> None:
    assert controls.source_name(raw) == name


@pytest.mark.parametrize("raw", ["", "a b", "a/b", "x" * 300])
def test_impossible_source_names_are_refused(raw: str) -> None:
    with pytest.raises(controls.InvalidArgument, match="not a source name"):
        controls.source_name(raw)


@pytest.mark.parametrize(("raw", "rate"), [("5", 5.0), ("0.2", 0.2), ("1e3", 1000.0)])
def test_rates(raw: str, rate: float) -> None:
    assert controls.parse_rate(raw) == rate


@pytest.mark.parametrize("raw", ["0", "-1", "nan", "inf", "fast", ""])
def test_bad_rates(raw: str) -> None:
    with pytest.raises(controls.InvalidArgument, match="RATE must be a number"):
        controls.parse_rate(raw)


# --- robots-exempt ----------------------------------------------------------------------


async def test_robots_exempt_adds_and_says_what_changed(redis: Redis) -> None:
    await redis.sadd(c.ROBOTS_EXEMPT_SET, "met")
    done = await controls.robots_exempt(redis, ["flickr", "met"])
    assert await redis.smembers(c.ROBOTS_EXEMPT_SET) == {"flickr", "met"}
    assert [str(d) for d in done] == [
        "SADD robots_exempt flickr  (robots.txt is no longer obeyed for flickr)",
        "SADD robots_exempt met  (it was already exempt: robots.txt was not obeyed for met)",
    ]


async def test_robots_obey_removes_and_says_what_changed(redis: Redis) -> None:
    await redis.sadd(c.ROBOTS_EXEMPT_SET, "flickr", "met")
    done = await controls.robots_obey(redis, ["flickr", "nasa"])
    assert await redis.smembers(c.ROBOTS_EXEMPT_SET) == {"met"}
    assert [str(d) for d in done] == [
        "SREM robots_exempt flickr  (robots.txt is obeyed again for flickr)",
        "SREM robots_exempt nasa  (it was not exempt: robots.txt was already obeyed for nasa)",
    ]


async def test_robots_exempted_lists_sorted(redis: Redis) -> None:
    assert await controls.robots_exempted(redis) == []
    await redis.sadd(c.ROBOTS_EXEMPT_SET, "nasa", "flickr", "met")
    assert await controls.robots_exempted(redis) == ["flickr", "met", "nasa"]


async def test_unknown_names_the_sources_nothing_knows(redis: Redis) -> None:
    await redis.hset(c.RATES_HASH, "rated", "2.0")
    await redis.sadd(c.INBOUND_SOURCES_SET, "seen")
    await redis.sadd(c.HALTED_SET, "halted")
    # Being exempt does not make a name known: exempting a typo is what the note is for.
    await redis.sadd(c.ROBOTS_EXEMPT_SET, "typo")
    names = ["rated", "typo", "seen", "halted", "other"]
    assert await controls.unknown(redis, names) == ["typo", "other"]
    assert await controls.unknown(redis, []) == []
