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

import pytest
from redis.asyncio import Redis

from image_crawler import contract as c
from image_crawler.lua import lua_script
from worker.politeness.pacing import gcra_grant, pacing_interval_s, paused_next
from worker.politeness.robots import noted_crawl_delay
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
    "worker/politeness/lua/pacing_acquire.lua": {"pacing_interval_s", "gcra_grant"},
    "worker/politeness/lua/pacing_pause.lua": {"paused_next"},
    "worker/politeness/lua/robots_note_delay.lua": {"noted_crawl_delay", "paused_next"},
    "worker/lua/stats_flush.lua": {"flush_commands"},
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


# --- pacing_acquire.lua: pacing_interval_s and gcra_grant ----------------------------------


@dataclasses.dataclass(frozen=True)
class Ask:
    rate: object = "10"
    crawl_delay: object = None
    next_at: object = None
    wanted: int = 3
    horizon_s: float = 0.05


ASKS = {
    "no rate": Ask(rate=None),
    "halted (rate 0)": Ask(rate="0"),
    "negative rate": Ask(rate="-3"),
    "rate not a number": Ask(rate="fast"),
    "empty rate": Ask(rate=""),
    "rate NaN": Ask(rate="nan"),
    "rate infinite": Ask(rate="inf"),
    "rate with a digit separator": Ask(rate="1_0"),
    "rate in hexadecimal": Ask(rate="0x10"),
    "rate with spaces": Ask(rate=" 2 "),
    "rate key of the wrong type": Ask(rate=WRONG_TYPE),
    "idle source": Ask(),
    "next slot past": Ask(next_at=at(-5.0)),
    "next slot now": Ask(next_at=at(0.0)),
    "next slot not a number": Ask(next_at="soon"),
    "next slot NaN": Ask(next_at="nan"),
    "next slot key of the wrong type": Ask(next_at=WRONG_TYPE),
    "next slot far ahead": Ask(next_at=at(30.0)),
    "backlog: the horizon limits": Ask(rate="1000", wanted=100),
    "backlog: the requests waiting limit": Ask(rate="1000", wanted=3),
    "nothing wanted": Ask(wanted=0),
    "crawl delay longer than 1/rate": Ask(crawl_delay="2", next_at=at(0.01)),
    "crawl delay shorter than 1/rate": Ask(rate="1", crawl_delay="0.5"),
    "crawl delay equal to 1/rate": Ask(rate="2", crawl_delay="0.5"),
    "crawl delay far longer, backlog": Ask(rate="1000", crawl_delay="0.02", wanted=10),
    "crawl delay not a number": Ask(rate="1000", crawl_delay="slow"),
    "crawl delay infinite": Ask(rate="1000", crawl_delay="inf"),
    "crawl delay NaN": Ask(rate="1000", crawl_delay="nan"),
    "crawl delay negative": Ask(rate="1000", crawl_delay="-1"),
    "crawl delay without a rate": Ask(rate=None, crawl_delay="2"),
    "next slot exactly at the horizon": Ask(rate="4", next_at=at(0.25), horizon_s=0.25),
    "next slot just past the horizon": Ask(rate="4", next_at=at(0.250001), horizon_s=0.25),
    "second slot exactly at the horizon": Ask(rate="4", next_at=at(0.0), horizon_s=0.25),
}


def acquire_twin(ask: Ask) -> tuple[Any, object, int | None]:
    """The answer the Python rule gives, the pace_next it leaves, and that key's expiry
    (ms; None: not written)."""
    interval_s = pacing_interval_s(read(ask.rate), read(ask.crawl_delay))
    if interval_s is None:
        return False, ask.next_at, None
    grant = gcra_grant(NOW, read(ask.next_at), interval_s, ask.horizon_s, ask.wanted)
    answer = [
        printed(grant.next_at - ask.horizon_s - NOW),
        [printed(slot - NOW) for slot in grant.slots],
        printed(interval_s),
    ]
    if not grant.slots:
        return answer, ask.next_at, None
    keep_ms = math.ceil((grant.next_at - NOW) * 1000) + 1000
    return answer, f"{grant.next_at:.6f}", keep_ms


async def run_acquire(redis: Redis, asks: dict[str, Ask]) -> list[Any]:
    for source, ask in asks.items():
        await store(redis, c.pace_rate_key(source), ask.rate)
        await store(redis, c.crawl_delay_key(source), ask.crawl_delay)
        await store(redis, c.pace_next_key(source), ask.next_at)
    (horizon_s,) = {ask.horizon_s for ask in asks.values()}
    raw = await redis.eval(
        pinned(lua_script("worker.politeness", "pacing_acquire.lua")),
        0,
        c.PACE_RATE_PREFIX,
        c.PACE_NEXT_PREFIX,
        repr(horizon_s),
        json.dumps([[source, ask.wanted] for source, ask in asks.items()]),
        c.CRAWL_DELAY_PREFIX,
    )
    answers = json.loads(raw)
    # cjson writes an empty array as {}.
    return [
        [a[0], a[1] if isinstance(a[1], list) else [], a[2]] if a else a
        for a in (answers if isinstance(answers, list) else [])
    ]


@pytest.mark.parametrize("case", list(ASKS))
async def test_acquire_grants_what_gcra_grant_grants(redis, case):
    ask = ASKS[case]
    (answer,) = await run_acquire(redis, {SOURCE: ask})
    expected, next_at, keep_ms = acquire_twin(ask)
    assert answer == expected
    if keep_ms is None:
        await assert_untouched(redis, c.pace_next_key(SOURCE), ask.next_at)
    else:
        assert await stored(redis, c.pace_next_key(SOURCE)) == next_at
        await assert_ttl(redis, c.pace_next_key(SOURCE), keep_ms)


async def test_acquire_answers_each_ask_of_one_call_as_on_its_own(redis):
    asks = {f"s{i}": ask for i, ask in enumerate(ASKS.values()) if ask.horizon_s == 0.05}
    answers = await run_acquire(redis, asks)
    assert answers == [acquire_twin(ask)[0] for ask in asks.values()]


def test_the_horizon_cases_sit_exactly_on_the_boundary():
    # Else they would test nothing: the arithmetic must land on the horizon exactly.
    assert float(at(0.25)) == NOW + 0.25
    assert gcra_grant(NOW, NOW + 0.25, 0.25, 0.25, 3).slots == (NOW + 0.25,)
    assert gcra_grant(NOW, NOW, 0.25, 0.25, 3).slots == (NOW, NOW + 0.25)


# --- pacing_pause.lua: paused_next ---------------------------------------------------------

PAUSES = {
    "no next slot": (None, 5.0),
    "next slot past": (at(-10.0), 5.0),
    "pause shorter than the next slot": (at(10.0), 5.0),
    "pause longer than the next slot": (at(1.0), 5.0),
    "pause ending exactly at the next slot": (at(5.0), 5.0),
    "next slot not a number": ("soon", 5.0),
    "next slot NaN": ("nan", 5.0),
    "next slot key of the wrong type": (WRONG_TYPE, 5.0),
    "a pause of nothing": (None, 0.0),
    "a pause of nothing, next slot ahead": (at(1.0), 0.0),
    "a long pause": (at(1.0), 3600.0),
    "a pause of a fraction": (at(0.001), 0.123456789),
}


@pytest.mark.parametrize("case", list(PAUSES))
async def test_pause_moves_the_next_slot_as_paused_next_does(redis, case):
    before, delay_s = PAUSES[case]
    key = c.pace_next_key(SOURCE)
    await store(redis, key, before)
    answer = await redis.eval(
        pinned(lua_script("worker.politeness", "pacing_pause.lua")), 1, key, repr(delay_s)
    )
    after = paused_next(NOW, read(before), delay_s)
    assert answer == f"{after - NOW:.14g}"  # Lua's tostring
    if not unchanged(read(before), after):
        assert await stored(redis, key) == f"{after:.6f}"
        await assert_ttl(redis, key, math.ceil((after - NOW) * 1000) + 1000)
    else:
        await assert_untouched(redis, key, before)


# --- robots_note_delay.lua: noted_crawl_delay ----------------------------------------------

KEEP_MS = 600_000
NOTES = {
    "first delay of the source": (None, 2.0, None),
    "a longer delay than the one in force": ("1", 2.0, None),
    "the same delay again": ("2", 2.0, at(1.0)),
    "a shorter delay than the one in force": ("5", 2.0, at(1.0)),
    "delay in force not a number": ("slow", 2.0, None),
    "delay in force NaN": ("nan", 2.0, at(1.0)),
    "delay key of the wrong type": (WRONG_TYPE, 2.0, None),
    "longer, next slot later still": ("1", 2.0, at(10.0)),
    "longer, next slot past": ("1", 2.0, at(-1.0)),
    "longer, next slot not a number": ("1", 2.0, "soon"),
    "longer, next slot exactly a delay away": ("1", 2.0, at(2.0)),
    "a fractional delay": ("0.25", 0.3, at(0.1)),
}


@pytest.mark.parametrize("case", list(NOTES))
async def test_note_delay_keeps_and_moves_as_noted_crawl_delay_does(redis, case):
    current, delay_s, next_before = NOTES[case]
    keys = [c.crawl_delay_key(SOURCE), c.CRAWL_DELAYED_SET, c.pace_next_key(SOURCE)]
    await store(redis, keys[0], current)
    await store(redis, keys[2], next_before)
    await redis.eval(
        pinned(lua_script("worker.politeness", "robots_note_delay.lua")),
        3,
        *keys,
        repr(delay_s),
        KEEP_MS,
        SOURCE,
    )
    note = noted_crawl_delay(NOW, read(current), delay_s, read(next_before))
    if note.written:
        assert await stored(redis, keys[0]) == repr(delay_s)
        await assert_ttl(redis, keys[0], KEEP_MS)
    else:
        await assert_untouched(redis, keys[0], current)
    assert read(await stored(redis, keys[0])) == note.crawl_delay_s
    assert await redis.smembers(c.CRAWL_DELAYED_SET) == {SOURCE}
    if note.next_at is not None and not unchanged(read(next_before), note.next_at):
        assert await stored(redis, keys[2]) == f"{note.next_at:.6f}"
        await assert_ttl(redis, keys[2], math.ceil(delay_s * 1000) + 1000)
    else:
        await assert_untouched(redis, keys[2], next_before)


async def test_note_delay_moves_the_next_slot_as_a_pause_of_the_delay_would(redis):
    # The two scripts share the rule paused_next: given the same keys, the same result.
    delay_s = 2.0
    for next_before in (None, at(-1.0), at(1.0), at(10.0), "soon"):
        await redis.flushdb()
        await store(redis, c.pace_next_key("noted"), next_before)
        await store(redis, c.pace_next_key("paused"), next_before)
        await redis.eval(
            pinned(lua_script("worker.politeness", "robots_note_delay.lua")),
            3,
            c.crawl_delay_key("noted"),
            c.CRAWL_DELAYED_SET,
            c.pace_next_key("noted"),
            repr(delay_s),
            KEEP_MS,
            "noted",
        )
        await redis.eval(
            pinned(lua_script("worker.politeness", "pacing_pause.lua")),
            1,
            c.pace_next_key("paused"),
            repr(delay_s),
        )
        noted = await stored(redis, c.pace_next_key("noted"))
        assert noted == await stored(redis, c.pace_next_key("paused")), next_before


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
        else:
            raise AssertionError(f"unexpected {kind} at {key}")
        state[key] = (kind, value)
    return state


async def test_a_flush_leaves_redis_as_flush_commands_one_at_a_time_do(redis, reference):
    now = [1_763_764_000.123456]  # a Unix time of today: 16 digits, more than Lua prints
    stats = RedisStats(redis, clock=lambda: now[0])
    loop = asyncio.get_running_loop()

    def outcome(
        source: str | None, status: str, backoff: bool = False, check: bool = False
    ) -> QueuedOutcome:
        stamp = stats._timestamp()
        return QueuedOutcome(source, status, backoff, stamp, loop.create_future(), check)

    first = []
    for i in range(70):
        first.append(outcome("a", ["200", "404", "500", "304"][i % 4]))
        if i % 4 == 3:  # the 304's re-check, counted outside the windows
            first.append(outcome("a", c.CHECK_UNCHANGED, check=True))
        if i % 10 == 3:
            first.append(outcome("b", "200" if i % 20 == 3 else "UnidentifiedImageError"))
        if i % 30 == 5:
            first += [outcome("c", "500"), outcome(None, "")]
    now[0] += 61  # the first batch leaves the 60 s windows
    second = [outcome("a", "200"), outcome("c", "503", backoff=True), outcome("a", "500")]
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
