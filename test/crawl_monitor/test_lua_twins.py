"""Each Lua script of the regulator's store against the Python rule it is the fast path of
(``PlainRegulatorStore``, one command per key), on the same Redis contents, against a real
redis-server: the same answers, and the same Redis afterwards.

- ``read.lua`` and ``delays.lua``: ``RedisRegulatorStore.read`` and
  ``PlainRegulatorStore.read`` return equal ``ObservedState`` values, on a table of
  source states and on random ones;
- ``write.lua``: a ``Writes`` applied by either store leaves the same keys, values and
  expiries, and the same ``WriteResult``;
- ``lease_acquire.lua``, ``lease_release.lua``: the same answers and the same lease.
"""

from __future__ import annotations

import importlib
import random
import re
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from crawl_monitor.policy import breakers
from crawl_monitor.store import (
    READ_CHUNK,
    LeaderLease,
    ObservedState,
    PlainRegulatorStore,
    RedisRegulatorStore,
    Writes,
)
from image_crawler import contract as c
from image_crawler.lua import lua_script
from test.harness.services import wait_for

NOW = time.time()
WINDOW_START = NOW - 60


async def window(redis: Redis, source: str, statuses: list[str], at: float = NOW) -> None:
    members = {c.window_member(s, at - i * 0.001): at - i * 0.001 for i, s in enumerate(statuses)}
    await redis.zadd(f"{c.STATUS_60S_PREFIX}{source}", members)


async def last(redis: Redis, source: str, statuses: list[str]) -> None:
    await redis.rpush(c.last50_key(source), *statuses)


async def expired(redis: Redis, *keys: str) -> None:
    """Set ``keys`` to expire at once, and wait until they have."""
    for key in keys:
        await redis.set(key, "1", px=1)
    await wait_for(lambda: _none_exist(redis, keys), 2, 0.005, what="the keys expired")


async def _none_exist(redis: Redis, keys: Collection[str]) -> bool:
    return await redis.exists(*keys) == 0


async def seed_table(redis: Redis) -> list[str]:
    """A table of source states, each source named after its case; the sources."""
    await window(redis, "all-200", ["200"] * 20)
    await last(redis, "all-200", ["200"] * 20)
    await window(redis, "expected-only", ["200", "404", "301", "RobotsDisallowed"])
    await window(redis, "one-error", ["200"] * 9 + ["500"])
    await last(redis, "one-error", ["200"] * 9 + ["500"])
    await window(redis, "old-error", ["200"])
    await window(redis, "old-error", ["500"], at=NOW - 90)
    await last(redis, "fifty-failures", ["500"] * 50)
    await last(redis, "fifty-failures-healthy-window", ["500"] * 50)
    await window(redis, "fifty-failures-healthy-window", ["200"] * 3)
    await last(redis, "fifty-failures-bad-window", ["Timeout"] * 50)
    await window(redis, "fifty-failures-bad-window", ["Timeout"] * 3)
    await last(redis, "forty-nine-failures", ["500"] * 49)
    await last(redis, "fifty-then-a-200", ["500"] * 50 + ["200"])
    await last(redis, "a-200-then-fifty", ["200"] + ["ServerDisconnected"] * 50)
    await last(redis, "a-200-then-forty-nine", ["200"] + ["ServerDisconnected"] * 49)
    await last(redis, "backoff-statuses", ["503"] * 30 + ["429"] * 20)
    await last(redis, "mixed", ["500"] * 30 + ["200"] * 20)
    await window(redis, "mixed", ["500"] * 3 + ["200"] * 2)
    await redis.set(f"{c.STATUS_60S_PREFIX}window-wrong-type", "not a sorted set")
    await last(redis, "window-wrong-type", ["500"] * 50)
    await redis.hset(c.last50_key("list-wrong-type"), "a", "b")
    await redis.set(f"{c.STATUS_60S_PREFIX}both-wrong-type", "x")
    await redis.sadd(c.last50_key("both-wrong-type"), "x")
    await redis.set(f"{c.OVERRIDE_RATE_PREFIX}override", "5")
    await redis.set(f"{c.OVERRIDE_RATE_PREFIX}override-not-a-rate", "fast")
    await redis.rpush(f"{c.OVERRIDE_RATE_PREFIX}override-not-a-string", "5")
    await redis.set(f"{c.OVERRIDE_RATE_PREFIX}override-empty", "")
    await redis.set(f"{c.OVERRIDE_RATE_ALIAS_PREFIX}alias", "7")
    await redis.set(f"{c.OVERRIDE_RATE_PREFIX}both-overrides", "0.5")
    await redis.set(f"{c.OVERRIDE_RATE_ALIAS_PREFIX}both-overrides", "9")
    await redis.set(c.resize_errors_key("counted"), "3")
    await window(redis, "counted", ["500"] * 3)
    await redis.hset(c.resize_errors_key("counter-wrong-type"), "a", "b")
    await redis.set(c.backoff_signals_key("signalled"), "4")
    await redis.set(c.backoff_signals_key("signals-not-a-number"), "many")
    await redis.set(c.backoff_signals_key("signals-empty"), "")
    await redis.sadd(c.backoff_signals_key("signals-wrong-type"), "4")
    await window(redis, "expired", ["500"] * 10)
    # The hosts of a source with errors: counted in the window only.
    await window(redis, "many-hosts", ["500"] * 3 + ["200"] * 5)
    await redis.zadd(c.hosts60s_key("many-hosts"), {"a": NOW, "b": NOW, "old": NOW - 90})
    await redis.zadd(c.error_hosts60s_key("many-hosts"), {"a": NOW, "old": NOW - 90})
    await redis.zadd(c.hosts60s_key("all-200"), {"a": NOW})
    await window(redis, "hosts-wrong-type", ["500"] * 3)
    await redis.set(c.hosts60s_key("hosts-wrong-type"), "x")
    await redis.sadd(c.HALTED_SET, "fifty-failures", "no-longer-known")
    await redis.sadd(c.TEMP_HALTED_SET, "one-error", "elsewhere")
    await redis.set(c.crawl_delay_key("override"), "2")
    await redis.set(c.crawl_delay_key("delay-not-a-delay"), "soon")
    await redis.set(c.crawl_delay_key("not-a-source"), "3")
    await redis.hset(c.crawl_delay_key("delay-wrong-type"), "a", "1")
    await redis.sadd(
        c.CRAWL_DELAYED_SET,
        *["override", "delay-not-a-delay", "not-a-source", "delay-wrong-type", "delay-gone"],
    )
    await redis.sadd(c.ROBOTS_EXEMPT_SET, "alias", "nobody")
    await expired(
        redis,
        f"{c.STATUS_60S_PREFIX}expired",
        c.last50_key("expired"),
        f"{c.OVERRIDE_RATE_PREFIX}expired",
        c.resize_errors_key("expired"),
        c.backoff_signals_key("expired"),
        c.crawl_delay_key("expired"),
    )
    await redis.sadd(c.CRAWL_DELAYED_SET, "expired")
    keys = await redis.keys("*")
    known = {k.split(":", 1)[1] for k in keys if ":" in k and not k.startswith("crawl_delay:")}
    return sorted(known | {"nothing-in-redis"})


async def both_read(
    redis: Redis,
    sources: list[str],
    *,
    full: Collection[str] | None = None,
    counters: Mapping[str, str] | None = None,
    published: bool = False,
) -> ObservedState:
    """The fast read and the plain one, asserted equal; the reading."""
    fast = await RedisRegulatorStore(redis).read(
        sources,
        WINDOW_START,
        full_last_statuses=full,
        failure_counters=counters,
        published=published,
    )
    plain = await PlainRegulatorStore(redis).read(
        sources,
        WINDOW_START,
        full_last_statuses=full,
        failure_counters=counters,
        published=published,
    )
    assert fast == plain
    return fast


async def test_the_read_of_a_table_of_source_states(redis):
    sources = await seed_table(redis)
    first = await both_read(redis, sources)
    # The table covers both sides of every rule of the read.
    assert first.of("all-200").window == {} and first.of("all-200").last_statuses == {"200": 20}
    assert first.of("one-error").window == {"200": 9, "500": 1}
    assert first.of("old-error").window == {}
    assert (first.of("many-hosts").hosts, first.of("many-hosts").failing_hosts) == (2, 1)
    assert first.of("all-200").hosts == 1  # read with its histogram, asked in full
    assert len(first.of("hosts-wrong-type").errors) == 1
    assert [len(first.of(s).errors) for s in ("window-wrong-type", "both-wrong-type")] == [1, 2]
    assert first.of("override-empty").override == ""
    assert first.backoff_signals == {"signalled": 4}
    assert first.crawl_delays["delay-wrong-type"] is None
    assert first.crawl_delays["expired"] is None
    assert "nothing-in-redis" not in first.sources and "expired" not in first.sources

    partial = await both_read(redis, sources, full=())
    assert set(partial.sources) >= {
        "fifty-failures",
        "fifty-failures-bad-window",
        "a-200-then-fifty",
        "window-wrong-type",
        "backoff-statuses",
    }
    assert partial.of("fifty-failures-healthy-window").last_statuses == {}
    assert "all-200" not in partial.sources  # nothing a breaker acts on: no count read
    assert partial.of("forty-nine-failures").last_statuses == {}
    assert partial.of("fifty-then-a-200").last_statuses == {}
    assert partial.of("a-200-then-forty-nine").last_statuses == {}
    await both_read(redis, sources, full={"mixed", "fifty-failures-healthy-window", "gone"})

    # The counters the first read answered: only a source whose counter moved is read.
    await both_read(redis, sources, full=(), counters=first.failure_counters)
    moved = {**first.failure_counters, "counted": "2", "mixed": "", "all-200": "9"}
    del moved["one-error"]  # not known: read
    quiet = await both_read(redis, sources, full={"fifty-failures"}, counters=moved)
    assert quiet.of("counted").window == {"500": 3}
    assert quiet.of("fifty-failures").last_statuses == {"500": 50}
    assert quiet.of("a-200-then-fifty").last_statuses == {}  # not moved, not read


async def test_the_read_of_no_source(redis):
    await seed_table(redis)
    empty = await both_read(redis, [])
    assert empty.sources == {} and empty.failure_counters == {}
    assert empty.halted == {"fifty-failures", "no-longer-known"}


STATUSES = ["200", "200", "200", "404", "301", "500", "503", "429", "Timeout", "Blocked"]


async def seed_random(redis: Redis, rng: random.Random, n_sources: int) -> list[str]:
    sources = [f"s{i:04d}" for i in range(n_sources)]
    async with redis.pipeline(transaction=False) as pipe:
        for source in sources:
            kind = rng.choice(["healthy", "failing", "mixed", "absent", "wrong"])
            statuses = {
                "healthy": ["200"],
                "failing": ["500", "Timeout", "503"],
                "mixed": STATUSES,
                "absent": [],
                "wrong": [],
            }[kind]
            if statuses:
                n = rng.choice([1, 5, 49, 50, 60])
                listed = [rng.choice(statuses) for _ in range(n)]
                pipe.rpush(c.last50_key(source), *listed)
                ages = [rng.uniform(0, 120) for _ in range(rng.randint(0, 12))]
                members = {
                    c.window_member(rng.choice(statuses), NOW - age): NOW - age for age in ages
                }
                if members:
                    pipe.zadd(f"{c.STATUS_60S_PREFIX}{source}", members)
            elif kind == "wrong":
                pipe.set(rng.choice([f"{c.STATUS_60S_PREFIX}{source}", c.last50_key(source)]), "x")
            for key, values in [
                (f"{c.OVERRIDE_RATE_PREFIX}{source}", ["3", "x", "0", ""]),
                (f"{c.OVERRIDE_RATE_ALIAS_PREFIX}{source}", ["7", "-1"]),
                (c.resize_errors_key(source), ["0", "1", "2"]),
                (c.backoff_signals_key(source), ["1", "12", "many"]),
                (c.crawl_delay_key(source), ["2", "0.5", "soon"]),
            ]:
                if rng.random() < 0.3:
                    pipe.set(key, rng.choice(values))
                elif rng.random() < 0.05:
                    pipe.sadd(key, "not a string")
            if rng.random() < 0.2:
                pipe.sadd(c.CRAWL_DELAYED_SET, source)
            for key in (c.HALTED_SET, c.TEMP_HALTED_SET, c.ROBOTS_EXEMPT_SET):
                if rng.random() < 0.1:
                    pipe.sadd(key, source)
        await pipe.execute()
    return sources


@pytest.mark.parametrize("seed", range(12))
async def test_the_read_of_random_source_states(redis, seed):
    rng = random.Random(seed)
    sources = await seed_random(redis, rng, 60)
    first = await both_read(redis, sources)
    full = set(rng.sample(sources, 10))
    counters = {s: n for s, n in first.failure_counters.items() if rng.random() < 0.8}
    counters.update({s: "7" for s in rng.sample(sources, 5)})
    await both_read(redis, sources, full=full)
    await both_read(redis, sources, full=full, counters=counters)
    await both_read(redis, [*rng.sample(sources, 20), "unknown"], full=(), counters=counters)


async def test_the_read_of_several_chunks(redis):
    sources = await seed_random(redis, random.Random(99), 2 * READ_CHUNK + 3)
    first = await both_read(redis, sources, full=())
    await both_read(redis, sources, full=set(sources[::7]), counters=first.failure_counters)


async def test_the_crawl_delays_of_more_members_than_one_mget_of_the_script(redis):
    members = [f"m{i}" for i in range(4_100)]
    await redis.mset({c.crawl_delay_key(s): str(i % 9) for i, s in enumerate(members[:-7])})
    await redis.sadd(c.CRAWL_DELAYED_SET, *members)
    read = await both_read(redis, ["m1"])
    assert len(read.crawl_delays) == len(members)


@pytest.mark.parametrize("seed", range(6))
async def test_a_partial_read_returns_every_list_the_permanent_breaker_trips_on(redis, seed):
    # The read chooses which last-N histograms to send, by the permanent breaker's own
    # rule: whatever it leaves out, the breaker would not trip on.
    sources = await seed_random(redis, random.Random(seed), 80)
    full = await both_read(redis, sources)
    partial = await both_read(redis, sources, full=())
    for source in sources:
        seen = full.of(source)
        if seen.errors or not breakers.every_request_failed(seen.last_statuses):
            continue
        # A window of statuses without an error says its newest statuses did not all
        # fail: the list is not looked at (a worker writes both in one flush).
        window_key = f"{c.STATUS_60S_PREFIX}{source}"
        if seen.window or not await redis.zcount(window_key, WINDOW_START, "+inf"):
            assert partial.of(source).last_statuses == seen.last_statuses, source


async def test_a_key_of_the_wrong_type_for_a_set_fails_both_reads(redis):
    await redis.set(c.HALTED_SET, "not a set")
    for store in (RedisRegulatorStore(redis), PlainRegulatorStore(redis)):
        for published in (False, True):
            with pytest.raises(ResponseError):
                await store.read(["a"], WINDOW_START, published=published)


async def test_a_term_s_first_read_brings_what_the_last_leader_published(redis):
    records = {"a": '{"rate_rps": 17.2}', "unknown": "scribbled", "": "?"}
    await redis.hset(c.RATES_HASH, mapping=records)
    for store in (RedisRegulatorStore(redis), PlainRegulatorStore(redis)):
        read = await store.read(["a", "b"], WINDOW_START, published=True)
        # As written, every field: judging them is the decision's business.
        assert read.published == records
        assert (await store.read(["a"], WINDOW_START)).published is None
    # Scripts forgotten (a restarted Redis): loaded again, and the hash read with them.
    await redis.script_flush()
    read = await RedisRegulatorStore(redis).read(["a"], WINDOW_START, published=True)
    assert read.published == records
    # Missing, or not a hash (an operator's mistake): nothing published, and the read
    # goes on, lest a new leader never take over.
    await redis.delete(c.RATES_HASH)
    assert (await both_read(redis, ["a"], published=True)).published == {}
    await redis.set(c.RATES_HASH, "not a hash")
    await redis.set(c.backoff_signals_key("a"), 3)
    read = await both_read(redis, ["a"], published=True)
    assert (read.published, read.backoff_signals) == ({}, {"a": 3})


# --- write.lua --------------------------------------------------------------------------


async def dump(redis: Redis) -> dict[str, tuple[str, Any, int]]:
    """Every key: its type, its value and its PTTL (-1: no expiry)."""
    state: dict[str, tuple[str, Any, int]] = {}
    for key in sorted(await redis.keys("*")):
        kind = await redis.type(key)
        value: Any
        if kind == "string":
            value = await redis.get(key)
        elif kind == "set":
            value = sorted(await redis.smembers(key))
        elif kind == "hash":
            value = await redis.hgetall(key)
        elif kind == "list":
            value = await redis.lrange(key, 0, -1)
        else:
            value = await redis.zrange(key, 0, -1, withscores=True)
        state[key] = (kind, value, await redis.pttl(key))
    return state


def assert_same_redis(one: dict[str, tuple[str, Any, int]], other: dict[str, tuple[str, Any, int]]):
    """The same keys, types and values; the same expiries, give or take the time the
    plain store's many round trips take."""
    assert {k: v[:2] for k, v in one.items()} == {k: v[:2] for k, v in other.items()}
    for key, (_, _, ttl_ms) in one.items():
        other_ttl_ms = other[key][2]
        assert (ttl_ms < 0) == (other_ttl_ms < 0), key
        assert abs(ttl_ms - other_ttl_ms) < TTL_SLACK_MS, key


# Expiries long enough that no key written by the plain store expires before it is
# compared, and far enough apart from each other to tell them apart.
TOKEN_TTL_MS = 600_000
TTL_SLACK_MS = 30_000


Seed = Callable[[Redis], Awaitable[None]]


async def both_write(
    redis: Redis, seed: Seed, writes: Writes, lease: LeaderLease | None = None
) -> dict[str, tuple[str, Any, int]]:
    """``writes`` applied to ``seed``'s Redis by each store, asserted to leave the same
    Redis and answer the same; Redis afterwards."""
    results, after = [], []
    for store in (RedisRegulatorStore(redis), PlainRegulatorStore(redis)):
        await redis.flushdb()
        await seed(redis)
        results.append(await store.write(writes, TOKEN_TTL_MS, lease))
        after.append(await dump(redis))
    assert results[0] == results[1]
    assert_same_redis(*after)
    return after[0]


def info(rate_rps: float, state: str = c.PACE_CONFIGURED) -> c.PacingInfo:
    return c.PacingInfo(rate_rps, rate_rps, "computed", state, "at its configured rate")


async def seed_for_writes(redis: Redis) -> None:
    await redis.sadd(c.HALTED_SET, "halted", "halted-since-the-read")
    await redis.sadd(c.TEMP_HALTED_SET, "paused", "lifted")
    await window(redis, "resumed", ["500"] * 5)
    await window(redis, "kept", ["500"] * 5)
    await redis.hset(c.RATES_HASH, mapping={"gone": "{}", "kept": "{}", "old": "{}"})
    await redis.set(c.crawl_delay_key("back"), "5", px=3 * TOKEN_TTL_MS)
    await redis.sadd(c.CRAWL_DELAYED_SET, "back", "gone", "stays")
    await redis.set(c.pace_rate_key("stale"), "9")


WRITES = [
    pytest.param(Writes(pace_rates={}), id="nothing"),
    pytest.param(
        Writes(
            pace_rates={"a": 2.5, "halted-since-the-read": 7.0, "stopped": 0.0, "tiny": 1e-9},
            pacing={"a": info(2.5), "stopped": info(0.0, c.PACE_STOPPED)},
            pacing_gone=["gone", "never-there"],
            halt=["new-halt"],
            temp_halt=["new-pause", "paused"],
            lift_temp_halt=["lifted", "never-paused"],
            clear_window=["resumed", "no-window"],
            forget_crawl_delayed=["back", "gone", "not-a-member"],
        ),
        id="every-kind",
    ),
    pytest.param(
        Writes(
            pace_rates={"a": 1.0, "halted": 3.0},
            pacing={"a": info(1.0), "halted": info(3.0)},
            pacing_whole=True,
        ),
        id="crawl-rates-whole",
    ),
    pytest.param(
        Writes(
            pace_rates={f"s{i}": i / 7 for i in range(2_500)},
            pacing={f"s{i}": info(i / 7) for i in range(2_500)},
            pacing_gone=[f"old{i}" for i in range(1_200)],
        ),
        id="more-fields-than-one-call-of-the-script",
    ),
]


@pytest.mark.parametrize("writes", WRITES)
async def test_a_write_without_a_lease(redis, writes):
    await both_write(redis, seed_for_writes, writes)


LEASE = LeaderLease(token="me:1:ab", ttl_ms=2 * TOKEN_TTL_MS)


def held_by(token: str | None) -> Seed:
    async def seed(redis: Redis) -> None:
        await seed_for_writes(redis)
        if token is not None:
            await redis.set(LEASE.key, token, px=3 * LEASE.ttl_ms)

    return seed


@pytest.mark.parametrize(
    ("holder", "applied"), [("me:1:ab", True), ("other:2:cd", False), (None, False)]
)
async def test_a_write_under_a_lease(redis, holder, applied):
    writes = WRITES[1].values[0]
    after = await both_write(redis, held_by(holder), writes, LEASE)
    assert (c.pace_rate_key("a") in after) is applied
    if holder == LEASE.token:  # renewed (it was set to expire later)
        assert abs(after[LEASE.key][2] - LEASE.ttl_ms) < TTL_SLACK_MS


# --- lease_acquire.lua, lease_release.lua -----------------------------------------------


@pytest.mark.parametrize("holder", ["me:1:ab", "other:2:cd", None])
async def test_acquire_and_release(redis, holder):
    seed = held_by(holder)
    for operation in ("acquire", "release"):
        answers, after = [], []
        for store in (RedisRegulatorStore(redis), PlainRegulatorStore(redis)):
            await redis.flushdb()
            await seed(redis)
            answers.append(await getattr(store, operation)(LEASE))
            after.append(await dump(redis))
        assert answers[0] == answers[1], operation
        assert_same_redis(*after)


# --- The headers --------------------------------------------------------------------------

_HEADER = re.compile(r"-- The fast path of ([\w.]+?)(?:'s [\w ]+)? \((crawl_monitor/[\w/]+)\.py\)")


@pytest.mark.parametrize(
    "name", ["read.lua", "delays.lua", "write.lua", "lease_acquire.lua", "lease_release.lua"]
)
def test_each_script_names_the_python_rule_it_is_held_to(name):
    match = _HEADER.match(lua_script("crawl_monitor", name).splitlines()[0])
    assert match is not None, name
    rule: Any = importlib.import_module(match[2].replace("/", "."))
    for attribute in match[1].split("."):
        rule = getattr(rule, attribute)
    assert rule.__qualname__.startswith(PlainRegulatorStore.__name__)
