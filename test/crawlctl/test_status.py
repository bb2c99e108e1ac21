"""The status view: one round trip reads every source, and the table shows it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from rich.console import Console

from crawlctl import cli
from crawlctl.console import EXIT_OK, EXIT_USAGE
from crawlctl.status.json_view import status_json
from crawlctl.status.model import (
    ETA_DRAINING,
    ETA_EMPTY,
    ETA_HALTED,
    ETA_STOPPED,
    ETA_UNKNOWN,
    SCAN_COUNT,
    CrawlStatus,
    Eta,
    SourceStatus,
    Totals,
    View,
    eta,
    parse_status,
    read_status,
    reasons_by_source,
    rechecks_by_source,
    sort_sources,
    source_eta,
    totals,
)
from crawlctl.status.terminal import (
    FittedTable,
    backlog_line,
    eta_cell,
    eta_text,
    next_slot_text,
    paused_by_server,
    robots_text,
    status_table,
)
from image_crawler import contract as c

FLICKR = c.PacingInfo(178.4, 178.4, "computed", c.PACE_CONFIGURED, "at its configured rate")
BUSY = c.PacingInfo(
    14.0, 50.0, "override_rate:", c.PACE_BACKOFF, "cut to 14/s: 3 backoff signals (503)"
)


async def redis_now(redis: Redis) -> float:
    seconds, microseconds = await redis.time()
    return seconds + microseconds / 1e6


async def seed(redis: Redis) -> None:
    await redis.sadd(c.INBOUND_SOURCES_SET, "flickr", "met", "busy")
    await redis.hset(
        c.RATES_HASH,
        mapping={
            "flickr": FLICKR.to_json(),
            "busy": BUSY.to_json(),
            "phylopic": "0.2",  # an older monitor's plain rate
        },
    )
    await redis.sadd(c.HALTED_SET, "broken")
    await redis.sadd(c.TEMP_HALTED_SET, "met")
    await redis.set(c.pace_rate_key("flickr"), "178.4", px=1500)
    await redis.set(c.pace_rate_key("busy"), "14", px=1500)
    await redis.set(c.pace_rate_key("broken"), "0")
    # busy's server answered 503 with Retry-After: 42; flickr is paced as usual.
    now = await redis_now(redis)
    await redis.set(c.pace_next_key("busy"), f"{now + 42:.6f}")
    await redis.set(c.pace_next_key("flickr"), f"{now + 0.004:.6f}")
    await redis.set(c.num_resized_key("flickr"), 13188)
    await redis.set(c.resize_errors_key("flickr"), 3)
    await redis.rpush(c.last50_key("flickr"), *(["200"] * 48 + ["500", "404"]))
    await redis.set("override_rate:met", "5")
    await redis.set("override_rate:busy", "50")
    await redis.set("override-rate:phylopic", "1")
    await redis.set(c.NUM_RESIZED, 13224)
    await redis.set(c.RESIZE_ERRORS, 9)
    await redis.set(c.NUM_SPLIT, 20000)
    await redis.set(c.NUM_MALFORMED, 2)


async def test_read_status_gathers_every_source_in_one_scan_and_one_script(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    await seed(redis)
    commands: list[str] = []
    execute = redis.execute_command

    async def counting(*args: Any, **options: Any) -> Any:
        commands.append(str(args[0]))
        return await execute(*args, **options)

    monkeypatch.setattr(redis, "execute_command", counting)
    status = await read_status(redis)
    assert commands == ["SCAN", "EVAL"]  # the error counters' keys, then every value
    by_name = {s.name: s for s in status.sources}
    assert list(by_name) == ["broken", "busy", "flickr", "met", "phylopic"]
    flickr = by_name["flickr"]
    assert flickr.next_slot_in_s is not None and abs(flickr.next_slot_in_s) < 1.0
    assert flickr == SourceStatus(
        name="flickr",
        rate_rps=178.4,
        pacing=FLICKR,
        pace_rate_rps=178.4,
        next_slot_in_s=flickr.next_slot_in_s,
        successes=13188,
        errors=3,
        last_statuses={"200": 48, "500": 1, "404": 1},
        halted=False,
        temp_halted=False,
        override=None,
    )
    busy = by_name["busy"]
    assert (busy.rate_rps, busy.pacing, busy.pace_rate_rps) == (14.0, BUSY, 14.0)
    # Seconds of Redis's clock, read in the same script: only the test's run time between
    # the SET and the read is lost.
    assert busy.next_slot_in_s is not None and 40 < busy.next_slot_in_s <= 42
    assert by_name["met"].temp_halted and by_name["met"].override == "5"
    assert by_name["met"].rate_rps is None  # the monitor has not rated it (yet)
    assert by_name["met"].pace_rate_rps is None and by_name["met"].next_slot_in_s is None
    assert by_name["broken"].halted and by_name["broken"].last_statuses == {}
    assert by_name["broken"].pace_rate_rps == 0.0
    phylopic = by_name["phylopic"]
    assert (phylopic.rate_rps, phylopic.pacing) == (0.2, None)  # a rate, no reason
    assert phylopic.override == "1"  # the alias spelling counts too
    assert (status.num_resized, status.resize_errors, status.num_split, status.num_malformed) == (
        13224,
        9,
        20000,
        2,
    )


async def test_an_empty_redis_and_keys_of_the_wrong_type_do_not_break_the_view(
    redis: Redis,
) -> None:
    empty = await read_status(redis)
    assert empty == CrawlStatus(
        sources=(), num_resized=0, resize_errors=0, num_split=0, num_malformed=0
    )
    await redis.sadd(c.INBOUND_SOURCES_SET, "odd")
    await redis.sadd(c.pace_rate_key("odd"), "not-a-string")  # WRONGTYPE for GET
    await redis.rpush(c.pace_next_key("odd"), "not-a-string")
    await redis.set(c.last50_key("odd"), "not-a-list")
    await redis.hset(c.RATES_HASH, "odd", '{"rate_rps": "fast"}')
    (odd,) = (await read_status(redis)).sources
    assert (odd.rate_rps, odd.pacing, odd.pace_rate_rps, odd.next_slot_in_s) == (
        None,
        None,
        None,
        None,
    )
    assert odd.last_statuses == {}


async def seed_robots(redis: Redis) -> None:
    await redis.sadd(c.INBOUND_SOURCES_SET, "flickr", "met", "nasa")
    await redis.set(c.resize_errors_key("flickr", c.Status.ROBOTS_DISALLOWED), 12)
    await redis.set(c.crawl_delay_key("flickr"), "10.0", ex=int(c.ROBOTS_CACHE_S))
    await redis.sadd(c.ROBOTS_EXEMPT_SET, "met", "typo")
    await redis.set(
        c.resize_errors_key("met", c.Status.ROBOTS_DISALLOWED), 3
    )  # before its exemption
    await redis.set(c.crawl_delay_key("met"), "5")  # left over: expires, binds nothing
    await redis.set(c.resize_errors_key("nasa", c.Status.NO_INDEX), 4)


async def seed_rechecks(redis: Redis) -> None:
    """Re-checks of flickr's and busy's earlier crawls, as the workers' stats flush
    counts them (the hash ``rechecks``, field ``{source}:{status}``)."""
    await redis.hset(
        c.RECHECKS_HASH,
        mapping={
            c.rechecks_field("flickr", c.CHECK_UNCHANGED): 12,
            c.rechecks_field("flickr", c.CHECK_CHANGED): 3,
            c.rechecks_field("flickr", c.CHECK_GONE): 1,
            c.rechecks_field("flickr", c.CHECK_FAILED): 0,  # none: not shown
            c.rechecks_field("busy", c.CHECK_FAILED): 2,
            c.rechecks_field("busy", c.CHECK_UNCHANGED): 40,
            c.rechecks_field("nowhere", c.CHECK_GONE): 5,  # a source in no set
        },
    )


async def seed_backlog(redis: Redis) -> None:
    """``seed`` plus a backlog measured 7 s ago, error reasons and lost URLs."""
    await seed(redis)
    await redis.hset(
        c.BACKLOG_HASH,
        mapping={"flickr": 2_055_000, "busy": 50_400, "met": 0, "broken": 300, "orphan": 12},
    )
    await redis.set(c.BACKLOG_AT, f"{await redis_now(redis) - 7:.3f}")
    await redis.set(c.resize_errors_key("flickr", "500"), 2)
    await redis.set(c.resize_errors_key("flickr", "404"), 1)
    await redis.set(c.resize_errors_key("busy", "503"), 40)
    await redis.set(c.resize_errors_key("busy", "Timeout"), 9)
    await redis.set(c.resize_errors_key("busy", "500"), 9)
    await redis.set(c.resize_errors_key("busy", "ConnectionError"), 1)
    await redis.set(c.urls_lost_key("busy"), 120)


async def test_read_status_reads_robots_keys_in_the_same_round_trip(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    await seed_robots(redis)
    commands: list[str] = []
    execute = redis.execute_command

    async def counting(*args: Any, **options: Any) -> Any:
        commands.append(str(args[0]))
        return await execute(*args, **options)

    monkeypatch.setattr(redis, "execute_command", counting)
    status = await read_status(redis)
    assert commands == ["SCAN", "EVAL"]
    robots = {
        s.name: (s.robots_disallowed, s.robots_exempt, s.crawl_delay_s) for s in status.sources
    }
    assert {s.name: s.no_index for s in status.sources if s.no_index} == {"nasa": 4}
    assert robots == {
        "flickr": (12, False, 10.0),
        "met": (3, True, 5.0),
        "nasa": (0, False, None),
        "typo": (0, True, None),  # exempt but no source has the name: shown, to be noticed
    }


async def test_read_status_reads_the_rechecks_in_the_same_script(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    await seed(redis)
    await seed_rechecks(redis)
    await redis.set(c.resize_errors_key("flickr", "404"), 1)
    calls: list[tuple[Any, ...]] = []
    execute = redis.execute_command

    async def counting(*args: Any, **options: Any) -> Any:
        calls.append(args)
        return await execute(*args, **options)

    monkeypatch.setattr(redis, "execute_command", counting)
    status = await read_status(redis)
    assert [str(args[0]) for args in calls] == ["SCAN", "EVAL"]
    # The SCAN finds the error counters only; the script reads the re-checks' hash.
    scan, script = calls
    assert scan[scan.index(b"MATCH") + 1] == f"{c.RESIZE_ERRORS}:*:*"
    assert script[2:4] == (1, c.resize_errors_key("flickr", "404"))
    by_name = {s.name: s for s in status.sources}
    # In the order of the contract's statuses, whatever the counts.
    assert list(by_name["flickr"].rechecks.items()) == [
        ("unchanged", 12),
        ("changed", 3),
        ("gone", 1),
    ]
    assert list(by_name["busy"].rechecks.items()) == [("unchanged", 40), ("failed", 2)]
    assert by_name["met"].rechecks == {} and by_name["flickr"].errors_by_reason == {"404": 1}
    # Every source's re-checks count in the crawl's, as for the errors by reason: "nowhere"
    # is in no set.
    assert "nowhere" not in by_name
    assert list(status.rechecks.items()) == [
        ("unchanged", 52),
        ("changed", 3),
        ("gone", 6),
        ("failed", 2),
    ]


# --- the Lua read against the rule it is the fast path of -------------------------------


async def read_plainly(redis: Redis) -> CrawlStatus:
    """The read that ``status.lua`` does in one call, one plain command at a time, with
    the keys spelt by the contract: the sources are the union of the sets and the rates'
    hash, and a key of the wrong type reads as absent."""

    async def ask(command: str, *args: Any, absent: Any = False) -> Any:
        try:
            reply = await redis.execute_command(command, *args)
        except ResponseError:  # WRONGTYPE
            return absent
        return absent if reply is None else reply

    def members(reply: Any) -> list[str]:
        return sorted(reply)

    halted = members(await ask("SMEMBERS", c.HALTED_SET, absent=set()))
    temp_halted = members(await ask("SMEMBERS", c.TEMP_HALTED_SET, absent=set()))
    exempt = members(await ask("SMEMBERS", c.ROBOTS_EXEMPT_SET, absent=set()))
    inbound = members(await ask("SMEMBERS", c.INBOUND_SOURCES_SET, absent=set()))
    rates = await ask("HGETALL", c.RATES_HASH, absent={})
    backlog = await ask("HGETALL", c.BACKLOG_HASH, absent={})
    sources = {}
    for name in {*inbound, *halted, *temp_halted, *exempt, *rates, *backlog}:
        sources[name] = {
            "rate": rates.get(name, False),
            "pace_rate": await ask("GET", c.pace_rate_key(name)),
            "pace_next": await ask("GET", c.pace_next_key(name)),
            "ok": await ask("GET", c.num_resized_key(name)),
            "errors": await ask("GET", c.resize_errors_key(name)),
            "last": await ask("LRANGE", c.last50_key(name), 0, -1, absent=[]),
            "override": await ask("GET", f"{c.OVERRIDE_RATE_PREFIX}{name}"),
            "alias": await ask("GET", f"{c.OVERRIDE_RATE_ALIAS_PREFIX}{name}"),
            "disallowed": await ask("GET", c.resize_errors_key(name, c.Status.ROBOTS_DISALLOWED)),
            "no_index": await ask("GET", c.resize_errors_key(name, c.Status.NO_INDEX)),
            "crawl_delay": await ask("GET", c.crawl_delay_key(name)),
            "backlog": backlog.get(name, False),
            "lost": await ask("GET", c.urls_lost_key(name)),
        }
    reason_keys = sorted(str(key) for key in await redis.keys(f"{c.RESIZE_ERRORS}:*:*"))
    reasons = [await ask("GET", key) for key in reason_keys]
    rechecks = await ask("HGETALL", c.RECHECKS_HASH, absent={})
    totals = {
        key: await ask("GET", key)
        for key in (c.NUM_RESIZED, c.RESIZE_ERRORS, c.NUM_SPLIT, c.NUM_MALFORMED)
    }
    seconds, microseconds = await redis.time()
    answer = {
        "sources": sources,
        "halted": halted,
        "temp_halted": temp_halted,
        "robots_exempt": exempt,
        "reasons": reasons,
        "rechecks": [item for pair in rechecks.items() for item in pair],
        "backlog_at": await ask("GET", c.BACKLOG_AT),
        "totals": totals,
        "now": [str(seconds), str(microseconds)],
    }
    return parse_status(json.dumps(answer), reason_keys)


def commands(*each: tuple[Any, ...]) -> Callable[[Redis], Awaitable[None]]:
    async def run(redis: Redis) -> None:
        for command in each:
            await redis.execute_command(*command)

    return run


rechecks_oddities = commands(
    ("SADD", c.INBOUND_SOURCES_SET, "odd"),
    ("HSET", c.RECHECKS_HASH, c.rechecks_field("odd", c.CHECK_GONE), "many"),
    ("HSET", c.RECHECKS_HASH, c.rechecks_field("odd", c.CHECK_CHANGED), "1.5"),
    ("HSET", c.RECHECKS_HASH, c.rechecks_field("odd", "teapot"), "3"),  # not a status
    ("HSET", c.RECHECKS_HASH, c.rechecks_field("odd", ""), "3"),  # no status
    ("HSET", c.RECHECKS_HASH, "odd", "3"),  # no status, nor source
    ("HSET", c.RECHECKS_HASH, c.rechecks_field("", c.CHECK_GONE), "3"),  # no source
    ("HSET", c.RECHECKS_HASH, c.rechecks_field("odd", c.CHECK_FAILED), "-1"),
    ("HSET", c.RECHECKS_HASH, c.rechecks_field("nowhere", c.CHECK_GONE), "4"),  # in no set
    ("SET", c.rechecks_field("odd", c.CHECK_UNCHANGED), "4"),  # a key, not a field
)


async def test_odd_rechecks_are_left_out(redis: Redis) -> None:
    await rechecks_oddities(redis)
    status = await read_status(redis)
    assert [(s.name, dict(s.rechecks)) for s in status.sources] == [("odd", {})]
    assert status.rechecks == {"gone": 4}  # nowhere's


async def test_a_rechecks_hash_of_another_type_reads_as_none(redis: Redis) -> None:
    await redis.sadd(c.INBOUND_SOURCES_SET, "flickr")
    await redis.set(c.num_resized_key("flickr"), 5)
    await redis.set(c.RECHECKS_HASH, "not-a-hash")
    status = await read_status(redis)
    assert [(s.name, s.successes, dict(s.rechecks)) for s in status.sources] == [("flickr", 5, {})]
    assert status.rechecks == {}


LATER = "4102444800.500000"  # a pace_next far ahead of any clock the test runs under


@pytest.mark.parametrize(
    "setup",
    [
        pytest.param(commands(), id="empty"),
        pytest.param(commands(("SADD", c.INBOUND_SOURCES_SET, "seen")), id="only-seen"),
        pytest.param(commands(("SADD", c.HALTED_SET, "broken")), id="halted"),
        pytest.param(
            commands(
                ("SADD", c.TEMP_HALTED_SET, "met"),
                ("SET", "override_rate:met", "5"),
                ("SET", "override-rate:met", "7"),
            ),
            id="temp-halted-with-override",
        ),
        pytest.param(
            commands(
                ("SADD", c.ROBOTS_EXEMPT_SET, "typo", "nasa"),
                ("SADD", c.INBOUND_SOURCES_SET, "nasa"),
                ("SET", c.crawl_delay_key("nasa"), "4"),
            ),
            id="exempt",
        ),
        pytest.param(
            commands(
                ("SADD", c.INBOUND_SOURCES_SET, "flickr"),
                ("SET", c.num_resized_key("flickr"), "13188"),
                ("SET", c.resize_errors_key("flickr"), "3"),
                ("SET", c.resize_errors_key("flickr", c.Status.ROBOTS_DISALLOWED), "2"),
                ("RPUSH", c.last50_key("flickr"), "200", "200", "503", "404"),
                ("SET", c.NUM_RESIZED, "13224"),
                ("SET", c.RESIZE_ERRORS, "9"),
                ("SET", c.NUM_SPLIT, "20000"),
                ("SET", c.NUM_MALFORMED, "2"),
            ),
            id="counters",
        ),
        pytest.param(
            commands(
                ("HSET", c.RATES_HASH, "flickr", FLICKR.to_json(), "busy", BUSY.to_json()),
                ("HSET", c.RATES_HASH, "phylopic", "0.2"),
                ("SET", c.pace_rate_key("flickr"), "178.4"),
                ("SET", c.pace_rate_key("busy"), "14"),
                ("SET", c.pace_next_key("busy"), LATER),
                ("SET", c.crawl_delay_key("busy"), "10.0"),
            ),
            id="rates",
        ),
        pytest.param(
            commands(
                ("SADD", c.INBOUND_SOURCES_SET, "odd"),
                ("SADD", c.pace_rate_key("odd"), "not-a-string"),
                ("RPUSH", c.pace_next_key("odd"), "not-a-string"),
                ("SET", c.last50_key("odd"), "not-a-list"),
                ("HSET", c.num_resized_key("odd"), "not", "a-string"),
                ("SET", c.NUM_SPLIT, "not-a-number"),
            ),
            id="wrong-types",
        ),
        pytest.param(seed, id="seeded"),
        pytest.param(seed_robots, id="seeded-robots"),
        pytest.param(seed_backlog, id="seeded-backlog"),
        pytest.param(seed_rechecks, id="seeded-rechecks"),
        pytest.param(rechecks_oddities, id="rechecks-oddities"),
        pytest.param(
            commands(
                ("SADD", c.INBOUND_SOURCES_SET, "odd"),
                ("SET", c.RECHECKS_HASH, "not-a-hash"),
            ),
            id="rechecks-wrong-type",
        ),
        pytest.param(
            commands(
                ("HSET", c.BACKLOG_HASH, "only-a-topic", "12", "odd", "lots"),
                ("SET", c.BACKLOG_AT, "1700000000.5"),
                ("SET", c.resize_errors_key("nowhere", "503"), "4"),  # a source in no set
                ("SET", c.resize_errors_key("odd", "500"), "many"),
                ("SADD", c.resize_errors_key("odd", "404"), "a-set"),
                ("SET", f"{c.RESIZE_ERRORS}:odd:", "3"),  # no status
                ("SET", c.urls_lost_key("odd"), "-2"),
            ),
            id="backlog-and-reasons-oddities",
        ),
        pytest.param(
            commands(("SET", c.BACKLOG_HASH, "not-a-hash"), ("SADD", c.BACKLOG_AT, "x")),
            id="backlog-wrong-types",
        ),
    ],
)
async def test_the_lua_read_answers_as_the_plain_read_of_the_same_keys(
    redis: Redis, setup: Callable[[Redis], Awaitable[None]]
) -> None:
    await setup(redis)
    fast = await read_status(redis)
    plain = await read_plainly(redis)

    # Each read takes Redis's clock itself, a moment apart: the next slot and the backlog's
    # age may differ by it.
    def untimed(status: CrawlStatus) -> CrawlStatus:
        return dataclasses.replace(
            status,
            sources=tuple(dataclasses.replace(s, next_slot_in_s=None) for s in status.sources),
            backlog_age_s=None,
        )

    assert untimed(fast) == untimed(plain)
    assert (fast.backlog_age_s is None) == (plain.backlog_age_s is None)
    if fast.backlog_age_s is not None and plain.backlog_age_s is not None:
        assert fast.backlog_age_s == pytest.approx(plain.backlog_age_s, abs=1.0)
    for a, b in zip(fast.sources, plain.sources, strict=True):
        assert (a.next_slot_in_s is None) == (b.next_slot_in_s is None), a.name
        if a.next_slot_in_s is not None and b.next_slot_in_s is not None:
            assert a.next_slot_in_s == pytest.approx(b.next_slot_in_s, abs=1.0), a.name


# --- parse_status: the script's answer, decoded ------------------------------------------

NOW = ["1700000000", "250000"]  # Redis's TIME: 1700000000.25


def payload(raw_source: dict[str, Any], now: Any = NOW) -> str:
    return json.dumps(
        {"sources": {"s": raw_source}, "halted": {}, "temp_halted": {}, "totals": {}, "now": now}
    )


def parsed(raw_source: dict[str, Any], now: Any = NOW) -> SourceStatus:
    (source,) = parse_status(payload(raw_source, now)).sources
    return source


def test_parse_status_copes_with_cjson_empty_tables() -> None:
    raw = json.dumps(
        {
            "sources": {"a": {"rate": False, "pace_rate": False, "last": {}, "ok": "2"}},
            "halted": {},
            "temp_halted": {},
            "totals": {"num_resized": False},
        }
    )
    status = parse_status(raw)
    assert status.sources[0].rate_rps is None and status.sources[0].successes == 2
    assert status.sources[0].next_slot_in_s is None
    assert status.num_resized == 0


@pytest.mark.parametrize(
    ("crawl_rates", "rate_rps", "pacing"),
    [
        (BUSY.to_json().decode(), 14.0, BUSY),
        ('{"rate_rps": "14", "configured_rps": 50, "origin": "computed", "state": "x", '
         '"why": ""}', 14.0, c.PacingInfo(14.0, 50.0, "computed", "x", "")),
        ("178.375", 178.375, None),  # an older monitor's plain rate: shown, no state
        ("0", 0.0, None),
        ('{"rate_rps": 14}', None, None),  # a record without its fields
        ('{"rate_rps": "fast", "configured_rps": 1, "origin": "", "state": "", "why": ""}',
         None, None),
        ("[1, 2]", None, None),
        ("fast", None, None),
        ("", None, None),
        (False, None, None),  # no field in crawl_rates
    ],
)  # fmt: skip
def test_crawl_rates_values_are_pacing_records_or_plain_rates(
    crawl_rates: Any, rate_rps: float | None, pacing: c.PacingInfo | None
) -> None:
    source = parsed({"rate": crawl_rates})
    assert (source.rate_rps, source.pacing) == (rate_rps, pacing)


@pytest.mark.parametrize(
    ("pace_rate", "expected"),
    [("14", 14.0), ("0", 0.0), ("0.1", 0.1), (False, None), ("x", None), ({}, None)],
)
def test_the_live_pace_rate(pace_rate: Any, expected: float | None) -> None:
    assert parsed({"pace_rate": pace_rate}).pace_rate_rps == expected


@pytest.mark.parametrize(
    ("pace_next", "now", "expected"),
    [
        ("1700000042.250000", NOW, 42.0),
        ("1700000000.000000", NOW, -0.25),  # passed: the next request may start now
        ("1700000000.250000", ["1700000000", "0"], 0.25),
        (False, NOW, None),  # no key: no request was paced lately
        ("soon", NOW, None),
        ("1700000042.25", None, None),  # no clock to compare with
        ("1700000042.25", ["1700000000"], None),
        ("1700000042.25", ["x", "0"], None),
    ],
)
def test_the_next_slot_is_pace_next_minus_redis_time(
    pace_next: Any, now: Any, expected: float | None
) -> None:
    got = parsed({"pace_next": pace_next}, now).next_slot_in_s
    assert got == (None if expected is None else pytest.approx(expected, abs=1e-6))


@pytest.mark.parametrize(
    ("next_slot_in_s", "rate_rps", "paused"),
    [
        (42.0, 14.0, True),
        (1.5, 14.0, True),  # 1/14 s apart and a 1 s margin: not pacing
        (1.0, 14.0, False),
        (9.0, 0.1, False),  # 0.1/s: one request every 10 s
        (11.5, 0.1, True),
        (42.0, None, False),  # no rate known: cannot tell
        (42.0, 0.0, False),
    ],
)
def test_a_pause_is_a_next_slot_further_than_pacing_puts_it(
    next_slot_in_s: float, rate_rps: float | None, paused: bool
) -> None:
    assert paused_by_server(next_slot_in_s, rate_rps) is paused


@pytest.mark.parametrize(
    ("source", "text"),
    [
        ({"rate": BUSY.to_json().decode(), "pace_next": "1700000042.250000"},
         "Retry-After: next request in 42 s"),
        ({"rate": BUSY.to_json().decode(), "pace_next": "1700000001.000000"}, None),
        ({"rate": BUSY.to_json().decode(), "pace_next": "1699999999.000000"}, None),
        ({"rate": BUSY.to_json().decode()}, None),
        ({"rate": "0.1", "pace_next": "1700000008.250000"}, "next request in 8.0 s"),
        ({"rate": "0.1", "pace_next": "1700000600.250000"},
         "Retry-After: next request in 10 min 0 s"),
        # Halted (effective 0): slots were at most the configured rate apart.
        ({"rate": c.PacingInfo(0, 0.5, "computed", c.PACE_HALTED, "").to_json().decode(),
          "pace_next": "1700000005.250000"}, "Retry-After: next request in 5.0 s"),
        ({"pace_next": "1700000005.250000"}, "next request in 5.0 s"),  # no rate at all
    ],
)  # fmt: skip
def test_next_slot_text(source: dict[str, Any], text: str | None) -> None:
    assert next_slot_text(parsed(source)) == text


@pytest.mark.parametrize(
    ("crawl_delay", "expected"),
    [("10", 10.0), ("0.5", 0.5), ("60.0", 60.0), (False, None), ("0", None), ("-1", None),
     ("nan", None), ("inf", None), ("soon", None), ({}, None)],
)  # fmt: skip
def test_a_crawl_delay_is_a_positive_finite_number_of_seconds(
    crawl_delay: Any, expected: float | None
) -> None:
    assert parsed({"crawl_delay": crawl_delay}).crawl_delay_s == expected


@pytest.mark.parametrize(
    ("disallowed", "expected"), [("12", 12), (False, None), ("x", None), ({}, None)]
)
def test_the_robots_disallowed_count(disallowed: Any, expected: int | None) -> None:
    assert parsed({"disallowed": disallowed}).robots_disallowed == (expected or 0)


def test_robots_exempt_comes_from_the_set() -> None:
    raw = json.dumps({"sources": {"a": {}, "b": {}}, "robots_exempt": ["b", "gone"], "now": NOW})
    assert [(s.name, s.robots_exempt) for s in parse_status(raw).sources] == [
        ("a", False),
        ("b", True),
    ]


@pytest.mark.parametrize(
    ("raw_source", "exempt", "text"),
    [
        ({}, False, "-"),
        ({"disallowed": "12"}, False, "12 disallowed"),
        ({"crawl_delay": "10"}, False, "delay 10 s"),
        ({"crawl_delay": "0.5", "disallowed": "1"}, False, "1 disallowed\ndelay 0.5 s"),
        ({}, True, "exempt"),
        # The monitor ignores an exempt source's delay: so does the view.
        ({"crawl_delay": "10", "disallowed": "3"}, True, "exempt\n3 disallowed"),
        ({"no_index": "4"}, False, "4 noindex"),
        ({"disallowed": "1", "no_index": "2"}, False, "1 disallowed\n2 noindex"),
    ],
)
def test_robots_text(raw_source: dict[str, Any], exempt: bool, text: str) -> None:
    raw = json.dumps(
        {"sources": {"s": raw_source}, "robots_exempt": ["s"] if exempt else [], "now": NOW}
    )
    (source,) = parse_status(raw).sources
    assert robots_text(source) == text


# --- the table -------------------------------------------------------------------------


def render(status: CrawlStatus, width: int = 160) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(status_table(status))
    return console.export_text()


def row(text: str, name: str) -> list[str]:
    """The lines of ``name``'s row: its first line and the ones under it."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(f"{name} "))
    rest = lines[first + 1 :]
    under = next((i for i, line in enumerate(rest) if not line.startswith(" ")), len(rest))
    return [lines[first], *rest[:under]]


async def test_the_table_shows_pacing_counters_histogram_and_state(redis: Redis) -> None:
    await seed(redis)
    text = render(await read_status(redis))
    flickr = row(text, "flickr")
    for cell in ("178 of 178", "178", "configured", "13188", "200=48 500=1 404=1", "running"):
        assert cell in flickr[0]
    assert "at its configured rate" in flickr[1]
    busy = row(text, "busy")
    assert "14 of 50" in busy[0] and "backoff" in busy[0] and "override 50/s" in busy[0]
    assert any(re.search(r"Retry-After: next request in 4[12] s", line) for line in busy), busy
    assert any("cut to 14/s: 3 backoff signals (503)" in line for line in busy)
    met = row(text, "met")
    assert "temp halted, override 5/s" in met[0]
    assert " - " in met[0] and "none" in met[0]  # no rate from the monitor, none paced
    phylopic = row(text, "phylopic")
    assert "0.2" in phylopic[0] and "unknown" in phylopic[0]
    broken = row(text, "broken")
    assert "halted" in broken[0]
    assert "total: 13224 resized, 9 errors, 20000 split, 2 malformed" in text


async def test_the_table_fits_100_columns(redis: Redis) -> None:
    await seed(redis)
    long_why = c.PacingInfo(
        0.1, 200.0, "computed", c.PACE_FLOOR, "held at its floor (0.1/s): " + "why " * 40
    )
    await redis.hset(c.RATES_HASH, "wikimedia_commons", long_why.to_json())
    text = render(await read_status(redis), width=100)
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 100
    # Names and counters whole; the long reason cut short on its own line.
    assert "wikimedia_commons" in text and "13188" in text
    wikimedia = row(text, "wikimedia_commons")
    assert "0.1 of 200" in wikimedia[0] and "floor" in wikimedia[0]
    assert wikimedia[1].rstrip().endswith("…") and len(wikimedia) == 2


async def test_the_table_has_a_robots_column(redis: Redis) -> None:
    await seed(redis)
    await seed_robots(redis)
    text = render(await read_status(redis))
    header = next(line for line in text.splitlines() if line.startswith("source "))
    assert header.rstrip().endswith("robots")
    flickr = row(text, "flickr")
    assert re.search(r"running\s+12 disallowed$", flickr[0].rstrip()), flickr
    assert flickr[1].rstrip().endswith("delay 10 s")
    met = row(text, "met")
    assert met[0].rstrip().endswith("exempt") and met[1].rstrip().endswith("3 disallowed")
    assert not any("delay" in line for line in met)
    assert re.search(r"running\s+4 noindex$", row(text, "nasa")[0].rstrip())
    assert row(text, "typo")[0].rstrip().endswith("exempt")
    assert "robots: URLs its robots.txt disallowed, images not to be indexed" in text


async def test_the_table_has_a_rechecks_column_only_when_there_are_any(redis: Redis) -> None:
    await seed(redis)
    before = render(await read_status(redis))
    assert "re-checks" not in before
    await seed_rechecks(redis)
    text = render(await read_status(redis), width=200)
    header = next(line for line in text.splitlines() if line.startswith("source "))
    assert re.search(r"\serrors\s+re-checks\s+last 50 statuses\s", header), header
    assert re.search(r"\s3\s+unchanged=12 changed=3 gone=1\s+200=48", row(text, "flickr")[0])
    assert re.search(r"\s0\s+unchanged=40 failed=2\s+-\s", row(text, "busy")[0])
    assert re.search(r"\s0\s+-\s+-\s+temp halted", row(text, "met")[0])
    assert (
        "re-checks: unchanged=52 changed=3 gone=6 failed=2 (images of earlier crawls asked again"
        in text
    )


# --- backlog, ETA and errors by reason ---------------------------------------------------


async def test_read_status_reads_the_backlog_the_reasons_and_the_lost_urls(redis: Redis) -> None:
    await seed_backlog(redis)
    status = await read_status(redis)
    by_name = {s.name: s for s in status.sources}
    assert {name: s.backlog for name, s in by_name.items()} == {
        "broken": 300,
        "busy": 50_400,
        "flickr": 2_055_000,
        "met": 0,
        "orphan": 12,  # in no set, but its topic has URLs waiting: shown
        "phylopic": None,  # not measured
    }
    assert by_name["flickr"].errors_by_reason == {"500": 2, "404": 1}
    # Most frequent first, ties by name.
    assert list(by_name["busy"].errors_by_reason.items()) == [
        ("503", 40),
        ("500", 9),
        ("Timeout", 9),
        ("ConnectionError", 1),
    ]
    assert by_name["busy"].urls_lost == 120 and by_name["flickr"].urls_lost == 0
    assert status.errors_by_reason == {
        "503": 40,
        "500": 11,
        "Timeout": 9,
        "404": 1,
        "ConnectionError": 1,
    }
    assert status.backlog_age_s is not None and 7 <= status.backlog_age_s < 9


async def test_a_thousand_sources_of_ten_reasons_are_read_in_scan_steps(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    reasons = ["404", "500", "503", "Timeout", "ConnectionError", "403", "429", "TooLarge",
               "UnidentifiedImageError", "RobotsDisallowed"]  # fmt: skip
    pipe = redis.pipeline(transaction=False)
    for i in range(1000):
        source = f"source{i:04d}"
        pipe.sadd(c.INBOUND_SOURCES_SET, source)
        pipe.hset(c.BACKLOG_HASH, source, i)
        pipe.set(c.resize_errors_key(source), 55)
        for n, reason in enumerate(reasons, start=1):
            pipe.set(c.resize_errors_key(source, reason), n)
        pipe.set(c.last50_key(source), "x")  # other keys the scan walks past
    await pipe.execute()
    commands: list[str] = []
    execute = redis.execute_command

    async def counting(*args: Any, **options: Any) -> Any:
        commands.append(str(args[0]))
        return await execute(*args, **options)

    monkeypatch.setattr(redis, "execute_command", counting)
    status = await read_status(redis)
    # Redis answers others between the steps: none walks more than SCAN_COUNT keys.
    assert commands[-1] == "EVAL" and set(commands[:-1]) == {"SCAN"}
    assert len(commands) - 1 >= (await redis.dbsize()) // SCAN_COUNT
    assert len(status.sources) == 1000
    assert all(len(s.errors_by_reason) == 10 for s in status.sources)
    assert status.errors_by_reason["RobotsDisallowed"] == 10 * 1000
    assert sort_sources(status.sources, "backlog")[0].name == "source0999"


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ({"resize_errors:a:503": "2", "resize_errors:a:404": "5"}, {"a": {"404": 5, "503": 2}}),
        ({"resize_errors:a:503": "0"}, {}),  # nothing to show
        ({"resize_errors:a:503": "x", "resize_errors:a:500": "-1"}, {}),
        ({"resize_errors:a:": "3", "resize_errors::503": "3", "other:a:503": "3"}, {}),
        ({"resize_errors:a:b:c": "3"}, {"a": {"b:c": 3}}),
    ],
)
def test_reasons_by_source(counts: dict[str, Any], expected: dict[str, dict[str, int]]) -> None:
    assert reasons_by_source(counts) == expected


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"a:gone": "2", "a:unchanged": "5", "b:failed": "1"},
            {"a": {"unchanged": 5, "gone": 2}, "b": {"failed": 1}},
        ),
        ({"a:gone": "0"}, {}),  # nothing to show
        ({"a:gone": "x", "a:changed": "-1", "a:failed": False, "a:unchanged": "1.5"}, {}),
        ({"a:": "3", ":gone": "3", "a:teapot": "3", "gone": "3", "": "3"}, {}),
        ({"a:gone:x": "3", "rechecks:a:gone:x": "3"}, {}),
    ],
)
def test_rechecks_by_source(fields: dict[str, Any], expected: dict[str, dict[str, int]]) -> None:
    found = rechecks_by_source(fields)
    assert found == expected
    assert all(list(s) == [x for x in c.RECHECK_STATUSES if x in s] for s in found.values())


@pytest.mark.parametrize(
    ("backlog", "rate_rps", "halted", "expected"),
    [
        (None, 10.0, False, Eta(None, ETA_UNKNOWN)),
        (0, 10.0, False, Eta(0.0, ETA_EMPTY)),
        (0, 0.0, True, Eta(0.0, ETA_EMPTY)),  # halted, but nothing waits
        (0, None, False, Eta(0.0, ETA_EMPTY)),
        (36_000, 10.0, False, Eta(3600.0, ETA_DRAINING)),
        (1, 0.2, False, Eta(5.0, ETA_DRAINING)),
        (5, 0.0, True, Eta(None, ETA_HALTED)),
        (5, 0.0, False, Eta(None, ETA_STOPPED)),
        (5, None, False, Eta(None, ETA_UNKNOWN)),
        (5, math.nan, False, Eta(None, ETA_UNKNOWN)),
        (5, -1.0, False, Eta(None, ETA_UNKNOWN)),
    ],
)
def test_eta_is_the_backlog_over_the_effective_rate(
    backlog: int | None, rate_rps: float | None, halted: bool, expected: Eta
) -> None:
    assert eta(backlog, rate_rps, halted=halted) == expected


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.2, "1s"),  # never "0s" while something waits
        (42.4, "42s"),
        (60, "1m"),
        (750, "12m30s"),
        (3599.6, "1h"),  # rounded into the next unit
        (3600, "1h"),
        (11_520, "3h12m"),
        (11_549, "3h12m"),
        (11_550, "3h13m"),
        (86_399.9, "1d"),
        (86_400 * 4, "4d"),
        (86_400 * 4 + 3 * 3600 + 59, "4d3h"),
        (86_400 * 4 + 3 * 3600 + 1800, "4d4h"),
        (86_400 * 9.99, "10d"),
        (86_400 * 10, "10d"),
        (86_400 * 27.5, "28d"),
    ],
)
def test_eta_text(seconds: float, text: str) -> None:
    assert eta_text(seconds) == text


def source(name: str, **fields: Any) -> SourceStatus:
    defaults: dict[str, Any] = {
        "rate_rps": None,
        "pacing": None,
        "pace_rate_rps": None,
        "next_slot_in_s": None,
        "successes": 0,
        "errors": 0,
        "last_statuses": {},
        "halted": False,
        "temp_halted": False,
        "override": None,
    }
    return SourceStatus(name=name, **{**defaults, **fields})


HALTED_PACING = c.PacingInfo(0.0, 5.0, "computed", c.PACE_HALTED, "in halted")


@pytest.mark.parametrize(
    ("fields", "cell"),
    [
        ({"backlog": 7200, "rate_rps": 2.0}, "1h"),
        ({"backlog": 0, "rate_rps": 2.0}, "—"),
        ({"backlog": 10, "rate_rps": 2.0, "halted": True}, "halted"),  # whatever rate was set
        ({"backlog": 10, "rate_rps": 2.0, "temp_halted": True}, "halted"),
        ({"backlog": 10, "rate_rps": 0.0, "pacing": HALTED_PACING}, "halted"),
        ({"backlog": 10, "rate_rps": 0.0}, "never"),  # an override of 0
        ({"backlog": 10}, "?"),  # no rate published
    ],
)
def test_a_sources_eta_cell(fields: dict[str, Any], cell: str) -> None:
    assert eta_cell(source_eta(source("s", **fields))) == cell


def test_totals_take_the_slowest_draining_source_and_count_the_stalled() -> None:
    sources = [
        source("fast", backlog=1000, rate_rps=100.0),
        source("slow", backlog=1000, rate_rps=0.5, pacing=c.PacingInfo(
            0.5, 2.0, "computed", c.PACE_BACKOFF, "cut")),
        source("halted", backlog=300, rate_rps=0.0, halted=True),
        source("stopped", backlog=20, rate_rps=0.0),
        source("new", backlog=5),
        source("unmeasured", rate_rps=3.0, urls_lost=4),
        source("empty", backlog=0, rate_rps=1.0, urls_lost=1),
    ]  # fmt: skip
    assert totals(sources) == Totals(
        backlog=2325,
        eta_s=2000.0,
        eta_source="slow",
        stalled_sources=2,
        stalled_backlog=320,
        unknown_sources=1,
        effective_rps=104.5,
        configured_rps=106.0,
        urls_lost=5,
    )
    assert totals([source("a", rate_rps=1.0)]).backlog is None  # nothing measured


SORTABLE = [
    source("b", backlog=10, rate_rps=1.0, errors=5, successes=1),
    source("a", backlog=10, rate_rps=10.0, errors=0, successes=9),
    source("c", backlog=None, rate_rps=None, errors=7, successes=0),
    source("d", backlog=3, rate_rps=0.0, halted=True, errors=1, successes=3),
    source("e", backlog=0, rate_rps=2.0, errors=1, successes=2),
]


@pytest.mark.parametrize(
    ("by", "order"),
    [
        ("name", "abcde"),
        ("backlog", "abdec"),  # largest first, ties by name, unmeasured last
        ("eta", "dbaec"),  # never first (10 s, 1 s, 0 s), unknown last
        ("rate", "aebdc"),
        ("errors", "cbdea"),
        ("successes", "adebc"),
    ],
)
def test_sort_sources(by: str, order: str) -> None:
    assert "".join(s.name for s in sort_sources(SORTABLE, by)) == order


@pytest.mark.parametrize(
    ("age_s", "fragment"),
    [
        (None, "backlog: not measured (backlog_measured_at is not set"),
        (7.0, "backlog: 20 URLs, measured 7.0 s ago; ETA 10s (the slowest source: b)"),
        (59.0, "measured 59 s ago; ETA"),
        (61.0, "measured 61 s ago (stale: is the monitor running?); ETA"),
        (3600.0, "measured 60 min 0 s ago (stale: is the monitor running?)"),
    ],
)
def test_the_backlog_line_says_how_old_the_measurement_is(
    age_s: float | None, fragment: str
) -> None:
    status = CrawlStatus(
        sources=tuple(SORTABLE[:2]),
        num_resized=0,
        resize_errors=0,
        num_split=0,
        num_malformed=0,
        backlog_age_s=age_s,
    )
    assert fragment in backlog_line(status, totals(status.sources))


def test_the_backlog_line_names_what_never_drains() -> None:
    status = CrawlStatus(tuple(SORTABLE), 0, 0, 0, 0, backlog_age_s=1.0)
    assert backlog_line(status, totals(status.sources)) == (
        "backlog: 23 URLs, measured 1.0 s ago; ETA 10s (the slowest source: b); 3 URLs of 1 "
        "source(s) at rate 0 (halted or stopped) never drain until resumed"
    )


def row_names(text: str) -> list[str]:
    """The sources of the rows, in order (the header and caption lines left out)."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("source "))
    return [m.group(1) for line in lines[header + 1 :] if (m := re.match(r"^(\S+)\s{2,}", line))]


async def test_the_table_shows_backlog_eta_reasons_and_lost_urls(redis: Redis) -> None:
    await seed_backlog(redis)
    text = render(await read_status(redis), width=200)
    header = next(line for line in text.splitlines() if line.startswith("source "))
    assert re.match(r"source\s+backlog\s+ETA\s+rate/s\s+pace_rate\s+pacing\s+ok\s+errors", header)
    flickr = row(text, "flickr")
    assert re.match(r"flickr\s+2055000\s+3h12m\s+178 of 178\s", flickr[0]), flickr
    assert "500=2 404=1" in flickr[1]
    busy = row(text, "busy")
    assert re.match(r"busy\s+50400\s+1h\s+14 of 50\s", busy[0]), busy
    assert re.match(r"\s+lost 120\s", busy[1]) and "503=40 500=9 Timeout=9" in busy[1]
    assert re.match(r"broken\s+300\s+halted\s", row(text, "broken")[0])
    assert re.match(r"met\s+0\s+—\s", row(text, "met")[0])
    assert re.match(r"orphan\s+12\s+\?\s", row(text, "orphan")[0])
    assert re.match(r"phylopic\s+0.2\s", row(text, "phylopic")[0])  # not measured: blank
    # The rows come by backlog, largest first.
    assert row_names(text) == ["flickr", "busy", "broken", "orphan", "met", "phylopic"]
    assert "backlog: 2105712 URLs, measured 7" in text
    assert "ETA 3h12m (the slowest source: flickr); 300 URLs of 1 source(s) at rate 0" in text
    assert "errors by reason: 503=40 500=11 Timeout=9 404=1 ConnectionError=1" in text
    assert "lost: 120 URLs deleted from urls.* topics before a worker read them" in text


async def test_top_shows_the_first_n_and_says_how_many_are_hidden(redis: Redis) -> None:
    await seed_backlog(redis)
    status = await read_status(redis)
    console = Console(width=200, record=True, color_system=None)
    console.print(status_table(status, sort="errors", top=2))
    text = console.export_text()
    assert row_names(text) == ["flickr", "broken"]  # 3 errors, then 0 each: by name
    assert "showing 2 of 6 sources by errors (4 more hidden: --top, --sort)" in text
    # The totals are the whole crawl's, not the rows'.
    assert "backlog: 2105712 URLs" in text


# --- a table that fits the terminal ------------------------------------------------------


def render_fitted(status: CrawlStatus, width: int) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(FittedTable(status))
    return console.export_text()


async def test_a_narrow_terminal_hides_the_least_useful_columns_not_words(redis: Redis) -> None:
    await seed_backlog(redis)
    await seed_robots(redis)
    long_why = c.PacingInfo(
        0.1, 200.0, "computed", c.PACE_FLOOR, "held at its floor: " + "why " * 40
    )
    await redis.hset(c.RATES_HASH, "wikimedia_commons", long_why.to_json())
    await redis.hset(c.BACKLOG_HASH, "wikimedia_commons", 123_456_789)
    status = await read_status(redis)

    wide = render_fitted(status, 200)
    assert "too narrow" not in wide and "last 50 statuses" in wide
    assert wide == render(status, width=200)  # as status_table draws it

    narrow = render_fitted(status, 100)
    assert "too narrow for: last 50 statuses, pace_rate, robots (a wider terminal or " in narrow
    header = next(line for line in narrow.splitlines() if line.startswith("source "))
    assert "pace_rate" not in header and "robots" not in header
    for width in range(100, 201, 10):
        text = render_fitted(status, width)
        assert max(len(line.rstrip()) for line in text.splitlines()) <= width
        # Every word whole: names, counts, states; only the reasons' lines are cut.
        wikimedia = row(text, "wikimedia_commons")
        assert re.match(
            r"wikimedia_commons\s+123456789\s+14289d\s+0.1 of 200\s+(none\s+)?floor\s", wikimedia[0]
        )
        assert re.search(r"\sconfigured\s+13188\s+3\s", row(text, "flickr")[0])
        assert {"backoff", "Retry-After:", "running,", "override", "50/s"} <= words(text, "busy")
        assert {"temp", "halted,", "override", "5/s"} <= words(text, "met")


async def test_a_narrow_terminal_hides_the_rechecks_after_the_last_50_statuses(
    redis: Redis,
) -> None:
    await seed_backlog(redis)
    await seed_robots(redis)
    await seed_rechecks(redis)
    status = await read_status(redis)
    wide = render_fitted(status, 220)
    assert "too narrow" not in wide and "unchanged=12 changed=3 gone=1" in row(wide, "flickr")[0]
    hidden = []
    for width in range(220, 79, -5):
        text = render_fitted(status, width)
        assert max(len(line.rstrip()) for line in text.splitlines()) <= width
        if match := re.search(r"too narrow for: ([^(]+) \(", text):
            hidden.append(match.group(1))
    order = "last 50 statuses, re-checks, pace_rate, robots"
    assert hidden and all(order.startswith(h) for h in hidden), hidden
    assert hidden[-1] == order
    # The crawl's re-checks stay in the caption.
    assert "re-checks: unchanged=52 changed=3 gone=6 failed=2" in render_fitted(status, 80)


def words(text: str, name: str) -> set[str]:
    return {word for line in row(text, name) for word in line.split()}


def many_sources(count: int) -> CrawlStatus:
    backoff = c.PacingInfo(1.5, 2.0, "computed", c.PACE_BACKOFF, "cut to 1.5/s: 3 signals (503)")
    return CrawlStatus(
        tuple(
            source(f"s{i:04d}", backlog=i * 10, rate_rps=1.5, pacing=backoff, errors=i)
            for i in range(count)
        ),
        0,
        0,
        0,
        0,
        backlog_age_s=3.0,
    )


@pytest.mark.parametrize("height", [12, 24, 50])
def test_the_live_table_shows_the_rows_that_leave_its_totals_on_the_screen(height: int) -> None:
    status = many_sources(1000)
    console = Console(width=120, height=height, record=True, color_system=None)
    console.print(FittedTable(status, fit_height=True))
    lines = console.export_text().splitlines()
    names = row_names("\n".join(lines))
    assert len(lines) <= height or len(names) == 1  # one row at least
    assert names == [f"s{i:04d}" for i in range(999, 999 - len(names), -1)]  # by backlog
    text = "\n".join(lines)
    assert "backlog: 4995000 URLs, measured 3.0 s ago" in text
    assert f"showing {len(names)} of 1000 sources by backlog" in text
    if height >= 24:
        assert len(names) >= (height - 14) // 2  # not needlessly few


def test_a_top_is_kept_in_the_live_table() -> None:
    console = Console(width=120, height=20, record=True, color_system=None)
    console.print(FittedTable(many_sources(100), View(top=30), fit_height=True))
    assert len(row_names(console.export_text())) == 30  # asked for: cropped by Live


def test_parse_status_pairs_the_counts_with_the_keys_it_gave_the_script() -> None:
    keys = ["resize_errors:a:503", "resize_errors:a:404", "resize_errors:b:503"]
    raw = json.dumps({"sources": {"a": {}, "b": {}}, "reasons": ["4", False, "1"], "now": NOW})
    status = parse_status(raw, keys)
    assert [dict(s.errors_by_reason) for s in status.sources] == [{"503": 4}, {"503": 1}]
    assert status.errors_by_reason == {"503": 5}
    # cjson's empty table, and an answer shorter than the keys: no count where none is.
    empty = parse_status(json.dumps({"sources": {"a": {}}, "reasons": {}}), keys)
    assert empty.errors_by_reason == {}
    short = parse_status(json.dumps({"sources": {"a": {}}, "reasons": ["2"]}), keys)
    assert short.errors_by_reason == {"503": 2}


def test_an_empty_status_fits_anywhere() -> None:
    empty = CrawlStatus((), 0, 0, 0, 0)
    text = render_fitted(empty, 80)
    assert "(no source yet)" in text and "backlog: not measured" in text


# --- --json --------------------------------------------------------------------------------


async def test_the_json_has_every_field_with_numbers_as_numbers(redis: Redis) -> None:
    await seed_backlog(redis)
    await seed_rechecks(redis)
    document = status_json(await read_status(redis))
    # Strict JSON: no NaN or Infinity anywhere (an endless ETA is null).
    document = json.loads(json.dumps(document, allow_nan=False))
    assert document["version"] == 1
    general = document["general"]
    assert set(general) == {
        "sources", "sources_shown", "sort", "successes", "errors", "split", "malformed",
        "effective_rps", "configured_rps", "backlog", "backlog_age_s", "backlog_stale",
        "eta_s", "eta_source", "stalled_sources", "stalled_backlog", "unknown_eta_sources",
        "errors_by_reason", "rechecks", "urls_lost",
    }  # fmt: skip
    assert general["sources"] == general["sources_shown"] == 6 and general["sort"] == "backlog"
    assert (general["successes"], general["errors"], general["split"]) == (13224, 9, 20000)
    assert general["backlog"] == 2_105_712 and 7 <= general["backlog_age_s"] < 9
    assert general["backlog_stale"] is False
    assert general["eta_s"] == pytest.approx(2_055_000 / 178.4)
    assert general["eta_source"] == "flickr"
    assert (general["stalled_sources"], general["stalled_backlog"]) == (1, 300)
    assert general["unknown_eta_sources"] == 1  # orphan: no rate
    assert general["errors_by_reason"] == {
        "503": 40, "500": 11, "Timeout": 9, "404": 1, "ConnectionError": 1}  # fmt: skip
    assert general["urls_lost"] == 120
    # Only the statuses there are, in the contract's order; "nowhere" counts too.
    assert list(general["rechecks"].items()) == [
        ("unchanged", 52),
        ("changed", 3),
        ("gone", 6),
        ("failed", 2),
    ]
    assert [s["name"] for s in document["sources"]] == [
        "flickr", "busy", "broken", "orphan", "met", "phylopic"]  # fmt: skip
    by_name = {s["name"]: s for s in document["sources"]}
    assert by_name["busy"] == {
        "name": "busy",
        "backlog": 50400,
        "eta_s": 3600.0,
        "eta_state": "draining",
        "effective_rps": 14.0,
        "configured_rps": 50.0,
        "rate_origin": "override_rate:",
        "pacing_state": "backoff",
        "pacing_why": "cut to 14/s: 3 backoff signals (503)",
        "pace_rate_rps": 14.0,
        "next_slot_in_s": by_name["busy"]["next_slot_in_s"],
        "successes": 0,
        "errors": 0,
        "errors_by_reason": {"503": 40, "500": 9, "Timeout": 9, "ConnectionError": 1},
        "rechecks": {"unchanged": 40, "failed": 2},
        "last_statuses": {},
        "urls_lost": 120,
        "halted": False,
        "temp_halted": False,
        "override_rps": 50.0,
        "robots_disallowed": 0,
        "no_index": 0,
        "robots_exempt": False,
        "crawl_delay_s": None,
    }
    assert 40 < by_name["busy"]["next_slot_in_s"] <= 42
    assert (by_name["broken"]["eta_s"], by_name["broken"]["eta_state"]) == (None, "halted")
    assert (by_name["met"]["eta_s"], by_name["met"]["eta_state"]) == (0.0, "empty")
    assert (by_name["orphan"]["eta_s"], by_name["orphan"]["eta_state"]) == (None, "unknown")
    phylopic = by_name["phylopic"]
    assert (phylopic["backlog"], phylopic["eta_state"], phylopic["configured_rps"]) == (
        None, "unknown", 0.2)  # fmt: skip
    assert phylopic["pacing_state"] is None  # an older monitor's plain rate
    assert phylopic["rechecks"] == {}
    assert list(by_name["flickr"]["rechecks"]) == ["unchanged", "changed", "gone"]


def test_the_json_of_an_unmeasured_crawl_says_so() -> None:
    general = status_json(CrawlStatus((source("a", rate_rps=1.0),), 0, 0, 0, 0))["general"]
    assert general["backlog"] is None and general["backlog_age_s"] is None
    assert general["backlog_stale"] is True and general["eta_s"] is None


def test_the_json_has_no_nan_or_infinity_whatever_redis_holds() -> None:
    raw = {
        "rate": json.dumps(
            {"rate_rps": "nan", "configured_rps": "inf", "origin": "", "state": "", "why": ""}
        ),
        "pace_rate": "inf",
        "pace_next": "inf",
        "override": "-inf",
        "backlog": "12",
    }
    document = status_json(parse_status(payload(raw)))
    (only,) = document["sources"]
    assert json.loads(json.dumps(document, allow_nan=False))["sources"] == [only]
    assert only["effective_rps"] is None and only["configured_rps"] is None
    assert only["pace_rate_rps"] is None and only["next_slot_in_s"] is None
    assert only["override_rps"] is None and only["eta_s"] is None


def test_the_json_follows_sort_and_top() -> None:
    document = status_json(CrawlStatus(tuple(SORTABLE), 0, 0, 0, 0), sort="eta", top=2)
    assert [s["name"] for s in document["sources"]] == ["d", "b"]
    assert (document["general"]["sources"], document["general"]["sources_shown"]) == (5, 2)


# --- the command ---------------------------------------------------------------------------


async def test_the_command_prints_json_sorted_and_cut(
    redis: Redis, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await seed_backlog(redis)
    argv = ["status", "--json", "--sort", "errors", "--top", "1", "--redis", redis_url]
    assert await asyncio.to_thread(cli.run, argv) == EXIT_OK
    document = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in document["sources"]] == ["flickr"]
    assert document["general"]["sources"] == 6


async def test_the_command_prints_the_table_once(
    redis: Redis,
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await seed_backlog(redis)
    monkeypatch.setenv("COLUMNS", "100")
    argv = ["status", "--once", "--top", "3", "--redis", redis_url]
    assert await asyncio.to_thread(cli.run, argv) == EXIT_OK
    text = capsys.readouterr().out
    assert row_names(text) == ["flickr", "busy", "broken"]
    assert "showing 3 of 6 sources by backlog (3 more hidden: --top, --sort)" in text
    assert max(len(line) for line in text.splitlines()) <= 100


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["status", "--top", "0"], "--top must be at least 1"),
        (["status", "--sort", "speed"], "invalid choice: 'speed'"),
    ],
)
def test_bad_options(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = cli.run(argv)
    except SystemExit as e:
        code = int(e.code or 0)
    assert code == EXIT_USAGE
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("sources", "eta_s", "fragment"),
    [
        ([source("a", backlog=0, rate_rps=1.0)], 0.0, "ETA —"),
        ([source("a", backlog=0, rate_rps=1.0), source("x", backlog=4)], 0.0, "ETA —; 1 source"),
        ([source("a", backlog=5, rate_rps=0.0, halted=True)], None, "ETA never; 5 URLs of 1"),
        ([source("a", backlog=5, rate_rps=0.0), source("b", backlog=10, rate_rps=5.0)], 2.0,
         "ETA 2s (the slowest source: b); 5 URLs of 1 source(s) at rate 0"),
    ],
)  # fmt: skip
def test_the_crawls_eta_leaves_out_what_never_drains(
    sources: list[SourceStatus], eta_s: float | None, fragment: str
) -> None:
    total = totals(sources)
    assert total.eta_s == eta_s
    status = CrawlStatus(tuple(sources), 0, 0, 0, 0, backlog_age_s=1.0)
    assert fragment in backlog_line(status, total)
