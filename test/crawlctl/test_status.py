"""The status view: one round trip reads every source, and the table shows it."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from rich.console import Console

from crawlctl.commands.status import (
    CrawlStatus,
    SourceStatus,
    next_slot_text,
    parse_status,
    paused_by_server,
    read_status,
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


async def test_read_status_gathers_every_source_in_one_round_trip(
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
    assert commands == ["EVAL"]
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
    assert commands == ["EVAL"]
    robots = {
        s.name: (s.robots_disallowed, s.robots_exempt, s.crawl_delay_s) for s in status.sources
    }
    assert robots == {
        "flickr": (12, False, 10.0),
        "met": (3, True, 5.0),
        "nasa": (0, False, None),
        "typo": (0, True, None),  # exempt but no source has the name: shown, to be noticed
    }


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
    sources = {}
    for name in {*inbound, *halted, *temp_halted, *exempt, *rates}:
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
            "crawl_delay": await ask("GET", c.crawl_delay_key(name)),
        }
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
        "totals": totals,
        "now": [str(seconds), str(microseconds)],
    }
    return parse_status(json.dumps(answer))


def commands(*each: tuple[Any, ...]) -> Callable[[Redis], Awaitable[None]]:
    async def run(redis: Redis) -> None:
        for command in each:
            await redis.execute_command(*command)

    return run


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
    ],
)
async def test_the_lua_read_answers_as_the_plain_read_of_the_same_keys(
    redis: Redis, setup: Callable[[Redis], Awaitable[None]]
) -> None:
    await setup(redis)
    fast = await read_status(redis)
    plain = await read_plainly(redis)

    # Each read takes Redis's clock itself, a moment apart: the next slot may differ by it.
    def untimed(status: CrawlStatus) -> CrawlStatus:
        return dataclasses.replace(
            status,
            sources=tuple(dataclasses.replace(s, next_slot_in_s=None) for s in status.sources),
        )

    assert untimed(fast) == untimed(plain)
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
    assert re.search(r"running\s+-$", row(text, "nasa")[0].rstrip())
    assert row(text, "typo")[0].rstrip().endswith("exempt")
    assert "robots: URLs its robots.txt disallowed, its Crawl-delay; exempt: " in text
