"""The host index, counted (image_crawler/host_index.py): the rule as a table, and its
Lua fast path held to it on the suite's redis-server, Redis' clock pinned."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from image_crawler import contract as c
from image_crawler.host_index import (
    COUNTED,
    HostCounts,
    count_hosts,
    parse_host_counts,
    read_host_counts,
    script_args,
)
from image_crawler.lua import lua_script
from test.worker.test_lua_twins import NOW, pinned

ACTIVE_S = c.HOST_ACTIVE_S


def score(state: str, ago_s: float) -> float:
    return c.host_index_score(state, NOW - ago_s)


# host -> score: each state's hosts inside and outside the window, on its edges.
INDEX = {
    "a.example": score(c.HOST_AT_PACE, 0),
    "b.example": score(c.HOST_AT_PACE, ACTIVE_S),  # on the edge: in
    "c.example": score(c.HOST_AT_PACE, ACTIVE_S + 0.001),  # out
    "d.example": score(c.HOST_PACED, 12),
    "e.example": score(c.HOST_PACED, 500),
    "f.example": score(c.HOST_BACKED_OFF, 3),
    "g.example": score(c.HOST_HALTED, 59),
    "h.example": score(c.HOST_HALTED, 61),
    "future.example": score(c.HOST_HALTED, -30),  # a clock ahead: counted
    "junk.example": len(c.HOST_STATES) * c.HOST_INDEX_BAND + NOW,  # in no band
    "negative.example": -1.0,
}


def test_the_counts_of_an_index():
    counts = count_hosts(INDEX.values(), NOW)
    assert counts == HostCounts(at_pace=2, paced=1, backed_off=1, halted=2)
    assert counts.counted() == {"active": 6, "paced": 1, "backed_off": 1, "halted": 2}
    assert list(counts.counted()) == list(COUNTED)
    assert counts + HostCounts(1, 1, 1, 1) == HostCounts(3, 2, 2, 3)


async def test_the_script_counts_as_count_hosts_does(redis: Redis):
    await redis.zadd(c.host_index_key("web"), INDEX)
    await redis.zadd(c.host_index_key("one"), {"x.example": score(c.HOST_PACED, 1)})
    await redis.zadd(c.host_index_key("stale"), {"y.example": score(c.HOST_PACED, 600)})
    await redis.set(c.host_index_key("odd"), "not a sorted set")
    sources = ["web", "one", "stale", "odd", "none"]
    script = pinned(lua_script("image_crawler", "host_counts.lua"))
    counted = parse_host_counts(await redis.eval(script, 0, *script_args(sources)))
    assert counted == {
        "web": count_hosts(INDEX.values(), NOW),
        "one": HostCounts(paced=1),
        "stale": HostCounts(),  # an index whose hosts all went idle: all 0
    }


async def test_read_host_counts_reads_by_redis_clock(redis: Redis):
    seconds, micros = await redis.time()
    now = seconds + micros / 1e6
    await redis.zadd(
        c.host_index_key("web"),
        {
            "a.example": c.host_index_score(c.HOST_AT_PACE, now - 1),
            "b.example": c.host_index_score(c.HOST_HALTED, now - 2),
            "c.example": c.host_index_score(c.HOST_HALTED, now - 3600),
        },
    )
    assert await read_host_counts(redis, ["web", "other"]) == {"web": HostCounts(1, 0, 0, 1)}
    assert await read_host_counts(redis, []) == {}


@pytest.mark.parametrize(
    "payload", ['{"counts": {}}', '{"counts": []}', "[]", '{"counts": {"s": [1, 2]}}']
)
def test_odd_answers_read_as_no_counts(payload: str):
    assert parse_host_counts(payload) == {}
