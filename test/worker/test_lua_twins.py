"""Each of the worker's Lua scripts answers as the Python rule it is the fast path of.

The scripts run on the suite's redis-server as shipped, behind a prelude that pins Redis'
clock: a local ``redis`` answering ``TIME`` with a fixed time and passing every other call
to the real one, so that the Python rule can be given the same ``now``. Both sides then do
the same floating-point arithmetic, and are compared exactly, as the script prints its
numbers: cjson and ``tostring`` write 14 significant digits, stored times ``%.6f``.

A stored value reaches the Python rule as the script reads it (``lua_number``): Lua's
``tonumber``, which is C's ``strtod`` and not Python's ``float``. A key of the wrong type
reads as absent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import math
import re
from collections.abc import AsyncIterator
from typing import Any
from unittest.mock import ANY

import pytest
from redis.asyncio import Redis

from image_crawler import contract as c
from image_crawler.lua import lua_script
from worker.politeness.hosts import (
    CLEAN,
    FAILED,
    NO_REPORT,
    REFUSED,
    HostAnswer,
    HostAsk,
    HostReport,
    HostSettings,
    HostState,
    SourceRound,
    decide_source,
    fields_of,
    noted,
    round_robin_grant,
)
from worker.politeness.robots import ENTRY_VERSION, RobotsEntry, _entry_of, is_fresh
from worker.stats import QueuedOutcome, RedisStats, flush_commands

SOURCE = "twin"
WRONG_TYPE = object()  # a key holding a set, as if written by hand

# Redis' TIME as the scripts see it: seconds and microseconds. The half second makes
# now + 0.25 and now + 5 exact, for the cases that sit exactly on a boundary.
CLOCK = (1_763_764_000, 500_000)
NOW = CLOCK[0] + CLOCK[1] / 1_000_000  # as the scripts compute it


def pinned(script: str, clock: tuple[int, int] = CLOCK) -> str:
    """``script`` with Redis' clock pinned to ``clock`` (see the module's docstring)."""
    seconds, micros = clock
    prelude = (
        "local real_redis = redis\n"
        "local redis = setmetatable({call = function(command, ...)\n"
        f"  if command == 'TIME' then return {{'{seconds}', '{micros}'}} end\n"
        "  return real_redis.call(command, ...)\n"
        "end}, {__index = real_redis})\n"
    )
    return prelude + script


_HEX = re.compile(r"[+-]?0[xX][0-9a-fA-F]+(\.[0-9a-fA-F]*)?([pP][+-]?[0-9]+)?")


def lua_number(raw: object) -> float | None:
    """``type(raw) == 'string' and tonumber(raw)``: decimals, hexadecimals, "nan" and
    "inf", with spaces around; not Python's digit separators or non-ASCII digits."""
    if not isinstance(raw, str) or not raw.isascii() or "_" in raw:
        return None
    text = raw.strip()
    try:
        return float(text)
    except ValueError:
        return float.fromhex(text) if _HEX.fullmatch(text) else None


def printed(x: float) -> float:
    """``x`` as cjson prints it and ``json.loads`` reads it back (14 significant digits)."""
    return float(f"{x:.14g}")


def at(offset_s: float) -> str:
    """A time ``offset_s`` from the pinned now, stored as the scripts store times."""
    return f"{NOW + offset_s:.6f}"


async def store(redis: Redis, key: str, raw: object) -> None:
    if raw is WRONG_TYPE:
        await redis.sadd(key, "x")
    elif raw is not None:
        await redis.set(key, str(raw))


async def stored(redis: Redis, key: str) -> object:
    kind = await redis.type(key)
    if kind == "none":
        return None
    return await redis.get(key) if kind == "string" else WRONG_TYPE


def read(raw: object) -> float | None:
    return lua_number(raw) if raw is not WRONG_TYPE else None


def unchanged(before: float | None, after: float | None) -> bool:
    """Whether a rule left a stored time as it read it (NaN included)."""
    if before is None or after is None:
        return before is after
    return before == after or (math.isnan(before) and math.isnan(after))


async def assert_ttl(redis: Redis, key: str, expected_ms: int) -> None:
    pttl = await redis.pttl(key)
    assert expected_ms - 1000 < pttl <= expected_ms, (key, pttl, expected_ms)


async def assert_untouched(redis: Redis, key: str, before: object) -> None:
    """``key`` is as the test stored it: same value, still without an expiry."""
    assert await stored(redis, key) == before
    assert await redis.pttl(key) == (-2 if before is None else -1)


# --- the headers ---------------------------------------------------------------------------

WORKER_SCRIPTS = {
    "worker/politeness/lua/pacing_acquire.lua": {"decide_source"},
    "worker/politeness/lua/host_note.lua": {"noted"},
    "worker/lua/stats_flush.lua": {"flush_commands"},
    "worker/politeness/lua/robots_claim.lua": {"_entry_of", "is_fresh"},
}
# "name (path.py)" or "name and name (path.py)", anywhere in the header.
_NAMED = re.compile(r"(\w+(?: and \w+)*) \(([\w/]+)\.py\)")


@pytest.mark.parametrize(("path", "rules"), sorted(WORKER_SCRIPTS.items()))
def test_each_header_names_the_python_functions_it_is_the_fast_path_of(path, rules):
    package, name = path.rsplit("/lua/", 1)
    header = " ".join(
        line.removeprefix("--").strip()
        for line in lua_script(package.replace("/", "."), name).splitlines()
        if line.startswith("--")
    )
    assert header.startswith("The fast path of ")
    named = {
        (function, module.replace("/", "."))
        for functions, module in _NAMED.findall(header)
        for function in functions.split(" and ")
    }
    for function, module in named:
        assert callable(getattr(importlib.import_module(module), function)), (function, module)
    assert {function for function, _ in named} == rules, header


# --- pacing_acquire.lua: decide_source -----------------------------------------------------

HOST_SETTINGS = HostSettings()
CAPPED = dataclasses.replace(HostSettings(), max_host_rps=4.0)
DEEPER = dataclasses.replace(HostSettings(), slow_start_exit_factor=0.5)


@dataclasses.dataclass(frozen=True)
class HostCase:
    """One host of an ask: its hash as stored (WRONG_TYPE: a set), what is reported of
    it, and how many slots it wants."""

    fields: dict[str, str] | object = dataclasses.field(default_factory=dict)
    report: HostReport = NO_REPORT
    wanted: int = 1


def times(**offsets: float) -> dict[str, str]:
    return {name: at(offset) for name, offset in offsets.items()}


def failed(n: int, *, last: int = FAILED) -> HostReport:
    return HostReport(0, 0, 0, n, last)


HOSTS: dict[str, HostCase] = {
    "new": HostCase(),
    "new, three wanted": HostCase(wanted=3),
    "known at 20/s": HostCase({"rate": "20", **times(next=0.01, climb=-1)}, wanted=5),
    "known, next past": HostCase({"rate": "5", **times(next=-3, climb=-1)}, wanted=2),
    "slow start, 3 clean": HostCase(
        {"rate": "2", "ss": "1", **times(climb=-1)}, HostReport(3, 0, 0, 0, CLEAN)
    ),
    "slow start reaches the ceiling": HostCase(
        {"rate": "9", "ss": "1"}, HostReport(40, 0, 0, 0, CLEAN), 4
    ),
    "a signal ends the slow start": HostCase(
        {"rate": "8", "ss": "1"}, HostReport(2, 1, 1, 0, REFUSED)
    ),
    "a signal within the cooldown": HostCase(
        {"rate": "8", **times(cut=-0.5)}, HostReport(0, 1, 1, 0, REFUSED)
    ),
    "climbs back": HostCase({"rate": "3", **times(cut=-20, climb=-2)}, HostReport(4, 0, 0, 0, 1)),
    "climbs back after a long gap": HostCase(
        {"rate": "3", **times(cut=-60, climb=-30)}, HostReport(1, 0, 0, 0, 1)
    ),
    "refused at the floor": HostCase(
        {"rate": "0.1", "fails": "4", **times(cut=-5, since=-30)}, HostReport(0, 1, 1, 0, REFUSED)
    ),
    "five failures halt it": HostCase({"rate": "10"}, failed(5)),
    "a failure after a halt": HostCase(
        {"rate": "10", "fails": "4", "halts": "2", **times(until=-1, since=-200)}, failed(1)
    ),
    "halted": HostCase({"rate": "10", **times(until=12.5, since=-100)}),
    "failing for an hour": HostCase({"rate": "10", "fails": "2", **times(since=-3601)}, failed(1)),
    "gone": HostCase({"rate": "10", **times(gone=-5, since=-4000)}),
    "a clean answer ends the streak": HostCase(
        {"rate": "10", "fails": "3", "halts": "1", **times(since=-50)},
        HostReport(1, 0, 0, 2, CLEAN),
    ),
    "halted by an operator": HostCase({"rate": "10", "halt": "asked by its webmaster"}),
    "an operator's rate": HostCase({"override": "0.5", **times(next=-1)}, wanted=3),
    "a Crawl-delay in force": HostCase(
        {"rate": "10", "delay": "2", **times(delay_until=100, next=0.02)}, wanted=2
    ),
    "a Crawl-delay lapsed": HostCase(
        {"rate": "10", "delay": "2", **times(delay_until=-1)}, wanted=2
    ),
    "its expiry due": HostCase({"rate": "10", **times(exp=100)}),
    "its expiry not due": HostCase({"rate": "10", **times(exp=500)}),
    "junk": HostCase({"rate": "fast", "next": "soon", "fails": "many", "ss": "yes"}, wanted=2),
    "not a hash": HostCase(WRONG_TYPE),
    # Its member of the host index: written 3 s ago, as it is (not due), or as something
    # else, or 10 s ago, or in the future (due).
    "indexed 3 s ago": HostCase({"rate": "10", "why": "pace", "seen": at(-3)}),
    "indexed 3 s ago as cut": HostCase({"rate": "10", "why": "cut", "seen": at(-3)}),
    "indexed 10 s ago": HostCase({"rate": "10", "why": "pace", "seen": at(-10)}),
    "indexed in the future": HostCase({"rate": "10", "why": "pace", "seen": at(5)}),
    "indexed, junk": HostCase({"rate": "10", "why": "pace", "seen": "soon"}),
    "indexed 3 s ago as cut, reporting": HostCase(
        {"rate": "10", "why": "cut", "seen": at(-3)}, HostReport(1, 0, 0, 0, CLEAN)
    ),
    "cut, climbing back, indexed": HostCase(
        {"rate": "3", "why": "cut", "seen": at(-9.5), **times(cut=-20, climb=-2)}
    ),
}


@dataclasses.dataclass(frozen=True)
class SourceCase:
    rate: object = "10"
    host_rate: object = None
    next_at: object = None
    hosts: tuple[str, ...] = ()
    settings: HostSettings = HOST_SETTINGS
    # The source's host index as stored: host -> score (WRONG_TYPE: a set).
    index: dict[str, float] | object = dataclasses.field(default_factory=dict)


# Members of other hosts: idle for longer than idle_s in two bands, and recent.
IDLE_S = HOST_SETTINGS.idle_s
INDEXED = {
    "idle.example": c.host_index_score(c.HOST_AT_PACE, NOW - IDLE_S - 1),
    "just.example": c.host_index_score(c.HOST_AT_PACE, NOW - IDLE_S + 0.5),
    "idle-halted.example": c.host_index_score(c.HOST_HALTED, NOW - IDLE_S - 100),
    "idle-paced.example": c.host_index_score(c.HOST_PACED, NOW - IDLE_S - 100),
    "recent.example": c.host_index_score(c.HOST_BACKED_OFF, NOW - 5),
}


SOURCES: dict[str, SourceCase] = {
    **{f"10/s, {name}": SourceCase(hosts=(name,)) for name in HOSTS},
    **{f"0.5/s, {name}": SourceCase(rate="0.5", hosts=(name,)) for name in list(HOSTS)[:6]},
    "no rate": SourceCase(rate=None, hosts=("new",)),
    "halted source": SourceCase(rate="0", hosts=("known at 20/s",)),
    "rate not a number": SourceCase(rate="fast", hosts=("new",)),
    "host_rate 2": SourceCase(host_rate="2", hosts=("known at 20/s", "new")),
    "host_rate junk": SourceCase(host_rate="x", hosts=("known at 20/s",)),
    "MAX_HOST_RATE 4": SourceCase(hosts=("known at 20/s",), settings=CAPPED),
    "a slow start ended deeper": SourceCase(
        hosts=("a signal ends the slow start", "a signal within the cooldown"), settings=DEEPER
    ),
    "source next ahead": SourceCase(next_at=at(0.03), hosts=("known at 20/s",)),
    "source next junk": SourceCase(next_at="soon", hosts=("new",)),
    "three hosts share the source": SourceCase(
        rate="100", hosts=("known at 20/s", "new, three wanted", "known, next past")
    ),
    "a blocked host beside a free one": SourceCase(hosts=("halted", "known, next past")),
    # The first host takes the one slot at 10/s; the others are read for being halted
    # (reached before the slot went) and for their report.
    "an index trimmed in the bands written": SourceCase(
        hosts=("halted", "known at 20/s", "indexed 3 s ago as cut, reporting"), index=INDEXED
    ),
    # Unread: reached once the source had no slot left, with nothing to report.
    "hosts left unread": SourceCase(
        hosts=("known, next past", "new", "halted", "junk", "climbs back", "not a hash")
    ),
    "an index not due": SourceCase(hosts=("indexed 3 s ago",), index=INDEXED),
    "an index not a sorted set": SourceCase(hosts=("new",), index=WRONG_TYPE),
    "an index not a sorted set, not due": SourceCase(hosts=("indexed 3 s ago",), index=WRONG_TYPE),
    "no rate, an index": SourceCase(rate=None, hosts=("new",), index=INDEXED),
}


async def seed(redis: Redis, source: str, case: SourceCase) -> None:
    if case.index is WRONG_TYPE:
        await redis.sadd(c.host_index_key(source), "x")
    elif case.index:
        assert isinstance(case.index, dict)
        await redis.zadd(c.host_index_key(source), case.index)
    await store(redis, c.pace_rate_key(source), case.rate)
    await store(redis, c.host_rate_key(source), case.host_rate)
    await store(redis, c.pace_next_key(source), case.next_at)
    for host in case.hosts:
        fields = HOSTS[host].fields
        key = c.pace_host_key(source, host)
        if fields is WRONG_TYPE:
            await redis.sadd(key, "x")
        elif fields:
            assert isinstance(fields, dict)
            await redis.hset(key, mapping=fields)


def acquire_twin(case: SourceCase) -> SourceRound | None:
    rate = read(case.rate)
    if rate is None or math.isnan(rate) or not 0 < rate < math.inf:
        return None
    host_rate = read(case.host_rate)
    hosts = []
    for name in case.hosts:
        host = HOSTS[name]
        fields = host.fields if isinstance(host.fields, dict) else {}
        hosts.append((HostState.from_hash(fields), host.report, host.wanted))
    return decide_source(NOW, rate, host_rate, read(case.next_at), hosts, HORIZON_S, case.settings)


HORIZON_S = 0.05


async def run_acquire(redis: Redis, cases: dict[str, SourceCase]) -> list[Any]:
    (settings,) = {case.settings for case in cases.values()}
    config = {
        "rp": c.PACE_RATE_PREFIX,
        "np": c.PACE_NEXT_PREFIX,
        "hp": c.PACE_HOST_PREFIX,
        "cp": c.HOST_RATE_PREFIX,
        "h": HORIZON_S,
        "s": settings.to_json_obj(),
    }
    asks = [
        [source, [[h, HOSTS[h].wanted, HOSTS[h].report.to_list()] for h in case.hosts]]
        for source, case in cases.items()
    ]
    raw = await redis.eval(
        pinned(lua_script("worker.politeness", "pacing_acquire.lua")),
        0,
        json.dumps(config),
        json.dumps(asks),
    )
    answers = json.loads(raw)["a"]
    # cjson writes an empty array as {}.
    return [
        [[a[0], a[1] or [], *a[2:]] for a in answer] if isinstance(answer, list) else answer
        for answer in (answers if isinstance(answers, list) else [])
    ]


def as_printed(answer: HostAnswer) -> list[Any]:
    return [
        printed(answer.next_s),
        [printed(t) for t in answer.slots],
        printed(answer.interval_s),
        answer.flag,
    ]


async def assert_host_written(redis: Redis, key: str, state: HostState, before: object) -> None:
    written = {k: v for k, v in (await redis.hgetall(key)).items() if v}
    assert written == {k: v for k, v in fields_of(state).items() if v}, key
    pttl = await redis.pttl(key)
    if state.expires is None:
        assert pttl == -1 or (pttl == -2 and not written), (key, pttl)
    elif isinstance(before, dict) and f"{state.expires:.6f}" == before.get("exp"):
        assert pttl == -1, (key, pttl)  # not renewed (the test stored it without one)
    else:
        await assert_ttl(redis, key, math.ceil((state.expires - NOW) * 1000))


async def index_of(redis: Redis, source: str) -> dict[str, float] | object:
    key = c.host_index_key(source)
    if await redis.type(key) not in ("zset", "none"):
        return WRONG_TYPE
    return dict(await redis.zrange(key, 0, -1, withscores=True))


async def assert_index_written(
    redis: Redis, source: str, case: SourceCase, twin: SourceRound | None
) -> None:
    """The source's host index is as stored, with each host's score ``twin`` wrote
    (ZADD, as the script prints it) and the ranges it trimmed removed, and expires
    ``idle_s`` after the write; untouched without a write."""
    key = c.host_index_key(source)
    scores = twin.indexed if twin is not None else (None,) * len(case.hosts)
    written = {
        h: float(f"{v:.3f}") for h, v in zip(case.hosts, scores, strict=True) if v is not None
    }
    if not written:
        assert await index_of(redis, source) == (case.index or {})
        assert await redis.pttl(key) == (-2 if not case.index else -1)
        return
    assert twin is not None
    expected = {**(case.index if isinstance(case.index, dict) else {}), **written}
    for trim in twin.trimmed:
        expected = {h: v for h, v in expected.items() if not trim.low <= v < trim.high}
    assert await index_of(redis, source) == expected
    await assert_ttl(redis, key, math.ceil(case.settings.idle_s * 1000))


@pytest.mark.parametrize("case", list(SOURCES), ids=list(SOURCES))
async def test_acquire_decides_as_decide_source_does(redis, case):
    source = "twin"
    await seed(redis, source, SOURCES[case])
    (answer,) = await run_acquire(redis, {source: SOURCES[case]})
    twin = acquire_twin(SOURCES[case])
    await assert_index_written(redis, source, SOURCES[case], twin)
    if twin is None:
        assert answer is False
        for host in SOURCES[case].hosts:
            fields = HOSTS[host].fields
            if isinstance(fields, dict):
                assert await redis.hgetall(c.pace_host_key(source, host)) == fields
        return
    assert answer == [as_printed(a) for a in twin.answers]
    for host, state, unread in zip(SOURCES[case].hosts, twin.states, twin.unread, strict=True):
        key = c.pace_host_key(source, host)
        if unread:  # not read, so not written either
            fields = HOSTS[host].fields
            if fields is WRONG_TYPE:
                assert await redis.type(key) == "set"
            else:
                assert await redis.hgetall(key) == fields
            continue
        await assert_host_written(redis, key, state, HOSTS[host].fields)
    next_key = c.pace_next_key(source)
    if twin.source_next is not None:
        assert await stored(redis, next_key) == f"{twin.source_next:.6f}"
        await assert_ttl(redis, next_key, math.ceil((twin.source_next - NOW) * 1000) + 1000)
    else:
        await assert_untouched(redis, next_key, SOURCES[case].next_at)


async def test_acquire_answers_each_source_of_one_call_as_on_its_own(redis):
    cases = {
        f"s{i}": case for i, case in enumerate(SOURCES.values()) if case.settings is HOST_SETTINGS
    }
    for source, case in cases.items():
        await seed(redis, source, case)
    answers = await run_acquire(redis, cases)
    expected = []
    for case in cases.values():
        twin = acquire_twin(case)
        expected.append(False if twin is None else [as_printed(a) for a in twin.answers])
    assert answers == expected


async def test_the_index_holds_each_host_once_in_its_state_s_band(redis):
    case = SOURCES["an index trimmed in the bands written"]
    await seed(redis, "twin", case)
    await run_acquire(redis, {"twin": case})
    index = await index_of(redis, "twin")
    assert isinstance(index, dict)
    entries = {host: c.HostIndexEntry.of(score) for host, score in index.items()}
    assert {host: entry.state for host, entry in entries.items()} == {
        "known at 20/s": c.HOST_AT_PACE,  # 20/s, capped at its source's 10/s
        "halted": c.HOST_HALTED,
        "indexed 3 s ago as cut, reporting": c.HOST_AT_PACE,  # back at its source's pace
        # Other hosts: idle ones are gone from the bands written (at pace, halted) only.
        "just.example": c.HOST_AT_PACE,
        "idle-paced.example": c.HOST_PACED,
        "recent.example": c.HOST_BACKED_OFF,
    }
    assert entries["halted"].asked_at_s == pytest.approx(NOW, abs=0.001)
    fields = await redis.hgetall(c.pace_host_key("twin", "halted"))
    assert (fields["why"], fields["seen"]) == ("halt", f"{NOW:.3f}")


async def test_a_source_s_index_takes_a_thousand_hosts_and_more_in_one_ask(redis):
    hosts = [f"h{i}.example" for i in range(2500)]
    config = {"rp": c.PACE_RATE_PREFIX, "np": c.PACE_NEXT_PREFIX, "hp": c.PACE_HOST_PREFIX}
    config |= {"cp": c.HOST_RATE_PREFIX, "h": HORIZON_S, "s": HOST_SETTINGS.to_json_obj()}
    await redis.set(c.pace_rate_key("many"), "1000000")  # a slot for each within the horizon
    asks = [["many", [[h, 1, NO_REPORT.to_list()] for h in hosts]]]
    script = pinned(lua_script("worker.politeness", "pacing_acquire.lua"))
    await redis.eval(script, 0, json.dumps(config), json.dumps(asks))
    index = await index_of(redis, "many")
    assert isinstance(index, dict) and sorted(index) == sorted(hosts)
    # New hosts start slowly: each paced below its source's rate.
    assert set(index.values()) == {float(f"{c.host_index_score(c.HOST_PACED, NOW):.3f}")}


def test_a_host_and_its_source_share_slots_in_turn():
    asks = [HostAsk(None, 0.01, 3), HostAsk(None, 0.01, 3)]
    granted = round_robin_grant(NOW, None, 0.02, asks, 0.05)
    # One slot per host per pass, each at the source's pace (50/s) within the horizon.
    assert granted.slots == ((NOW, NOW + 0.04), (NOW + 0.02,))


# --- host_note.lua: noted ------------------------------------------------------------------

NOTES = {
    "a Retry-After on a new host": ({}, 2.0, None),
    "a Retry-After shorter than the next slot": (times(next=5), 2.0, None),
    "a Retry-After on a kept host": ({"halt": "x", **times(next=1)}, 3.0, None),
    "a new Crawl-delay": (times(next=0.2), 0.0, 3.0),
    "a shorter Crawl-delay": ({"delay": "5", **times(delay_until=100, next=0.5)}, 0.0, 2.0),
    "a longer Crawl-delay": ({"delay": "1", **times(delay_until=100, next=0.5)}, 0.0, 4.0),
    "a Crawl-delay after one lapsed": ({"delay": "9", **times(delay_until=-1)}, 0.0, 2.0),
    "junk": ({"next": "soon", "delay": "x"}, 1.0, 2.0),
    "not a hash": (WRONG_TYPE, 1.0, None),
}
KEEP_S = 600.0


@pytest.mark.parametrize("case", list(NOTES), ids=list(NOTES))
async def test_note_moves_and_keeps_as_noted_does(redis, case):
    fields, pause_s, delay_s = NOTES[case]
    key = c.pace_host_key("twin", "host")
    if fields is WRONG_TYPE:
        await redis.sadd(key, "x")
    elif fields:
        await redis.hset(key, mapping=fields)
    answer = await redis.eval(
        pinned(lua_script("worker.politeness", "host_note.lua")),
        1,
        key,
        repr(pause_s),
        "" if delay_s is None else repr(delay_s),
        repr(KEEP_S),
        repr(HOST_SETTINGS.idle_s),
    )
    before = HostState.from_hash(fields if isinstance(fields, dict) else {})
    after = noted(before, NOW, pause_s, delay_s, KEEP_S, HOST_SETTINGS.idle_s)
    written = {k: v for k, v in (await redis.hgetall(key)).items() if v}
    assert written == {k: v for k, v in fields_of(after).items() if v}
    next_at = after.next_at if after.next_at is not None else NOW
    assert float(answer) == pytest.approx(next_at - NOW, abs=1e-6)
    if after.expires is not None and after.expires != before.expires:
        await assert_ttl(redis, key, math.ceil((after.expires - NOW) * 1000))


# --- stats_flush.lua: flush_commands -------------------------------------------------------


@pytest.fixture
async def reference(redis_url: str) -> AsyncIterator[Redis]:
    """Another database of the same server (FLUSHALL before the test emptied it too)."""
    # The URL names database 0, and a URL's database wins over from_url's db argument.
    client = Redis.from_url(redis_url.rsplit("/", 1)[0] + "/1", decode_responses=True)
    assert client.connection_pool.connection_kwargs["db"] == 1
    try:
        yield client
    finally:
        await client.flushdb()
        await client.aclose()


async def dump(redis: Redis) -> dict[str, tuple[str, Any]]:
    state = {}
    async for key in redis.scan_iter():
        kind = await redis.type(key)
        if kind == "string":
            value = await redis.get(key)
        elif kind == "list":
            value = await redis.lrange(key, 0, -1)
        elif kind == "zset":
            value = await redis.zrange(key, 0, -1, withscores=True)
        elif kind == "hash":
            value = await redis.hgetall(key)
        elif kind == "set":
            value = sorted(await redis.smembers(key))
        else:
            raise AssertionError(f"unexpected {kind} at {key}")
        state[key] = (kind, value)
    return state


async def test_a_flush_leaves_redis_as_flush_commands_one_at_a_time_do(redis, reference):
    now = [1_763_764_000.123456]  # a Unix time of today: 16 digits, more than Lua prints
    stats = RedisStats(redis, clock=lambda: now[0])
    loop = asyncio.get_running_loop()

    def outcome(
        source: str | None,
        status: str,
        backoff: bool = False,
        check: bool = False,
        host: str | None = None,
    ) -> QueuedOutcome:
        stamp = stats._timestamp()
        future = loop.create_future()
        return QueuedOutcome(source, status, backoff, stamp, future, check, host)

    first = []
    for i in range(70):
        # Some outcomes without a host (an older worker's): in no set of hosts.
        host = f"h{i % 7}.example" if i % 9 else None
        first.append(outcome("a", ["200", "404", "500", "304"][i % 4], host=host))
        if i % 4 == 3:  # the 304's re-check, counted outside the windows
            first.append(outcome("a", c.CHECK_UNCHANGED, check=True))
        if i % 10 == 3:
            first.append(outcome("b", "200" if i % 20 == 3 else "UnidentifiedImageError"))
        if i % 30 == 5:
            first += [outcome("c", "500"), outcome(None, "")]
    now[0] += 61  # the first batch leaves the 60 s windows
    second = [outcome("a", "200", host="h1.example"), outcome("c", "503", backoff=True)]
    second += [outcome("a", "500", host="h2.example"), outcome("c", "503", host="x")]
    second += [outcome("a", "200", backoff=True), outcome("a", "429", backoff=True)]
    now[0] += 3601  # within the batch: each window trimmed by its first outcome's time
    second += [outcome("a", "404"), outcome("b", "200"), outcome(None, "")]
    second += [outcome("a", c.CHECK_GONE, check=True), outcome("b", c.CHECK_CHANGED, check=True)]
    for batch in (first, second):
        await stats._flush(batch)
        for command in flush_commands(batch):
            await reference.execute_command(*command)
        assert await dump(redis) == await dump(reference)
    state = await dump(redis)
    assert len(state[c.last50_key("a")][1]) == 50
    assert len(state["status60s:a"][1]) == 5  # the 70 of the first batch were trimmed
    assert state[c.NUM_MALFORMED] == ("string", "4")
    assert state[c.backoff_signals_key("a")] == ("string", "2")
    assert state[c.backoff_signals_key("c")] == ("string", "1")
    assert state[c.RECHECKS_HASH] == (
        "hash",
        {
            c.rechecks_field("a", c.CHECK_UNCHANGED): "17",
            c.rechecks_field("a", c.CHECK_GONE): "1",
            c.rechecks_field("b", c.CHECK_CHANGED): "1",
        },
    )
    assert state[c.num_resized_key("a")] == ("string", "37")  # 200s and 304s
    # Every per-status error counter is in their index; no success, no re-check is.
    assert state[c.ERROR_REASONS_SET] == (
        "set",
        sorted(
            c.resize_errors_key(source, status)
            for source, status in [
                ("a", "404"),
                ("a", "500"),
                ("a", "429"),
                ("b", "UnidentifiedImageError"),
                ("c", "500"),
                ("c", "503"),
            ]
        ),
    )
    # The first batch's hosts left the minute; a 503 tells nothing against its host.
    assert state[c.hosts60s_key("a")][1] == [("h1.example", ANY), ("h2.example", ANY)]
    assert state[c.error_hosts60s_key("a")][1] == [("h2.example", ANY)]
    assert state[c.hosts60s_key("c")][1] == [("x", ANY)]
    assert c.error_hosts60s_key("c") not in state
    assert 0 < await redis.ttl(c.hosts60s_key("a")) <= c.SPREAD_KEYS_TTL_S
    assert 0 < await reference.ttl(c.hosts60s_key("a")) <= c.SPREAD_KEYS_TTL_S


async def test_a_source_s_set_of_hosts_keeps_its_newest_members_only(redis, reference):
    stats = RedisStats(redis)
    loop = asyncio.get_running_loop()
    batch = [
        QueuedOutcome(
            "a", "500", False, stats._timestamp(), loop.create_future(), host=f"h{i}.example"
        )
        for i in range(c.SPREAD_HOSTS_KEPT + 300)
    ]
    await stats._flush(batch)
    async with reference.pipeline(transaction=False) as pipe:
        for command in flush_commands(batch):
            pipe.execute_command(*command)
        await pipe.execute()
    assert await dump(redis) == await dump(reference)
    kept = await redis.zrange(c.error_hosts60s_key("a"), 0, -1)
    assert len(kept) == c.SPREAD_HOSTS_KEPT and kept[0] == "h300.example"


async def test_a_flush_of_a_batch_over_lua_s_unpack_limit_is_the_same_too(redis, reference):
    stats = RedisStats(redis)
    loop = asyncio.get_running_loop()
    batch = [
        QueuedOutcome(
            "a", ["200", "500"][i % 2], i % 7 == 0, stats._timestamp(), loop.create_future()
        )
        for i in range(2_500)
    ]
    await stats._flush(batch)
    async with reference.pipeline(transaction=False) as pipe:
        for command in flush_commands(batch):
            pipe.execute_command(*command)
        await pipe.execute()
    assert await dump(redis) == await dump(reference)


# --- robots_claim.lua: _entry_of and is_fresh ---------------------------------------------

TOKEN = "image-crawler"
CLAIM_NOW = 1_700_000_000.25


def _entry(**changes: Any) -> str:
    fields = {
        "status": "200",
        "text": "User-agent: *\nDisallow: /a\n",
        "fetched_at": CLAIM_NOW - 60,
    }
    return RobotsEntry(**{**fields, "expires_at": CLAIM_NOW + 60, **changes}).to_json()


CLAIM_CASES = {
    "fresh": _entry(),
    "fresh, decided for us": _entry(token=TOKEN),
    "fresh, decided for another token": _entry(token="other-bot"),
    "expired": _entry(expires_at=CLAIM_NOW - 0.001),
    "expires now": _entry(expires_at=CLAIM_NOW),
    "unavailable, asked again later": _entry(status="503", text=None, unavailable_since=CLAIM_NOW),
    "fresh, compressed": _entry(text="User-agent: *\n" + "Disallow: /a\n" * 200),
    "the format before v": json.dumps(
        {"status": "200", "text": "", "fetched_at": CLAIM_NOW, "expires_at": CLAIM_NOW + 1}
    ),
    "the format before v, expired": json.dumps(
        {"status": "200", "text": "", "fetched_at": CLAIM_NOW, "expires_at": CLAIM_NOW - 1}
    ),
    "a newer version": _entry().replace('"v":2', '"v":3'),
    "not JSON": "User-agent: *",
    "a JSON list": "[1, 2]",
    "none": None,
}


@pytest.mark.parametrize("case", sorted(CLAIM_CASES))
async def test_claim_takes_the_lock_when_is_fresh_says_no(redis, case):
    raw = CLAIM_CASES[case]
    key, lock = c.robots_key(f"http://{case}"), c.robots_lock_key(f"http://{case}")
    if raw is not None:
        await redis.set(key, raw)
    script = lua_script("worker.politeness", "robots_claim.lua")
    args = [repr(CLAIM_NOW), TOKEN, ENTRY_VERSION, "me", 5000]
    read, state = await redis.eval(script, 2, key, lock, *args)
    assert read == raw
    fresh = is_fresh(_entry_of(raw, TOKEN), CLAIM_NOW)
    assert state == (0 if fresh else 2)
    assert (await redis.get(lock)) == (None if fresh else "me")
    if not fresh:  # and taken, another worker is told so
        assert (await redis.eval(script, 2, key, lock, *args))[1] == 1
