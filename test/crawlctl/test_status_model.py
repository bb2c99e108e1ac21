"""The status model: one round trip reads every source, ``parse_status`` decodes its
answer, and the backlog's ETA, the totals and the order of the sources derive from it."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from crawlctl.status.model import (
    ETA_DRAINING,
    ETA_EMPTY,
    ETA_HALTED,
    ETA_STOPPED,
    ETA_UNKNOWN,
    CrawlStatus,
    Eta,
    SourceStatus,
    Totals,
    eta,
    host_totals,
    parse_status,
    read_status,
    reasons_by_source,
    rechecks_by_source,
    sort_sources,
    totals,
)
from image_crawler import contract as c
from image_crawler.error_reasons import SCAN_COUNT
from image_crawler.host_index import HostCounts

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


def record_commands(redis: Redis, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the commands ``redis`` sends from now on, in order."""
    commands: list[str] = []
    execute = redis.execute_command

    async def counting(*args: Any, **options: Any) -> Any:
        commands.append(str(args[0]))
        return await execute(*args, **options)

    monkeypatch.setattr(redis, "execute_command", counting)
    return commands


@pytest.mark.timing("asserts a slot seeded at now is read as under 1 s away")
async def test_read_status_gathers_every_source_in_one_scan_and_one_script(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    await seed(redis)
    commands = record_commands(redis, monkeypatch)
    status = await read_status(redis)
    # The error counters' keys, then every value, then the host counts.
    assert commands == ["SCAN", "EVAL", "EVAL"]
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


async def seed_host_index(redis: Redis, source: str) -> None:
    """A host index for ``source``: three hosts asked about lately (at its pace, paced,
    backed off), one halted long ago (not active, so not counted)."""
    now = await redis_now(redis)
    await redis.zadd(
        c.host_index_key(source),
        {
            "a.example": c.host_index_score(c.HOST_AT_PACE, now - 1),
            "b.example": c.host_index_score(c.HOST_PACED, now - 2),
            "c.example": c.host_index_score(c.HOST_BACKED_OFF, now - 30),
            "d.example": c.host_index_score(c.HOST_HALTED, now - 120),
        },
    )


async def test_read_status_counts_the_hosts_of_the_sources_with_a_host_index(
    redis: Redis,
) -> None:
    await seed(redis)
    await seed_host_index(redis, "busy")
    await redis.zadd(c.host_index_key("nowhere"), {"x": 0.0})  # no source: not read
    status = await read_status(redis)
    hosts = {s.name: s.hosts for s in status.sources}
    assert hosts == {
        "broken": None,
        "busy": HostCounts(at_pace=1, paced=1, backed_off=1),
        "flickr": None,
        "met": None,
        "phylopic": None,
    }
    assert host_totals(status.sources) == HostCounts(1, 1, 1, 0)
    assert host_totals([]) is None
    assert sort_sources(status.sources, "hosts")[0].name == "busy"


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
    commands = record_commands(redis, monkeypatch)
    status = await read_status(redis)
    assert commands == ["SCAN", "EVAL", "EVAL"]
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
    assert [str(args[0]) for args in calls] == ["SCAN", "EVAL", "EVAL"]
    # The SCAN finds the error counters only; the script reads the re-checks' hash (the
    # second counts the hosts).
    scan, script, _ = calls
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
    placements = await ask("HGETALL", c.PLACEMENTS_HASH, absent={})
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
        "placements": [item for pair in placements.items() for item in pair],
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
        pytest.param(
            commands(
                ("SADD", c.INBOUND_SOURCES_SET, "flickr", "odd"),
                ("HSET", c.PLACEMENTS_HASH, c.placements_field("flickr", "near"), "3"),
                ("HSET", c.PLACEMENTS_HASH, c.placements_field("flickr", "unique"), "40"),
                ("HSET", c.PLACEMENTS_HASH, c.placements_field("odd", "teapot"), "3"),
                ("HSET", c.PLACEMENTS_HASH, c.placements_field("odd", "exact"), "many"),
                ("HSET", c.PLACEMENTS_HASH, c.placements_field("nowhere", "exact"), "2"),
                ("HSET", c.PLACEMENTS_HASH, c.placements_field("", "exact"), "1"),
            ),
            id="placements",
        ),
        pytest.param(
            commands(("SADD", c.INBOUND_SOURCES_SET, "a"), ("SET", c.PLACEMENTS_HASH, "x")),
            id="placements-wrong-type",
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


# --- backlog, ETA and errors by reason ---------------------------------------------------


@pytest.mark.timing("asserts the backlog age is read within 2 s of its seeding (7 <= age < 9)")
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
    keys = await redis.dbsize()
    commands = record_commands(redis, monkeypatch)
    status = await read_status(redis)
    # Written by hand, with no index of the counters: found with SCAN. Redis answers others
    # between the steps: none walks more than SCAN_COUNT keys.
    assert commands[-2:] == ["EVAL", "EVAL"] and set(commands[:-2]) == {"SCAN"}
    assert len(commands) - 2 >= keys // SCAN_COUNT
    assert len(status.sources) == 1000
    assert all(len(s.errors_by_reason) == 10 for s in status.sources)
    assert status.errors_by_reason["RobotsDisallowed"] == 10 * 1000
    assert sort_sources(status.sources, "backlog")[0].name == "source0999"
    # What the SCAN found is now their index: the next read walks no key.
    commands.clear()
    assert await read_status(redis) == status
    assert commands == ["EVAL", "EVAL"]


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
