"""The status view: one round trip reads every source, and the table shows it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis.asyncio import Redis
from rich.console import Console

from image_crawler import contract as c
from image_crawler.status import CrawlStatus, SourceStatus, parse_status, read_status, status_table


async def seed(redis: Redis) -> None:
    await redis.sadd(c.INBOUND_SOURCES_SET, "flickr", "met")
    await redis.hset(c.RATES_HASH, mapping={"flickr": "178.4", "phylopic": "0.2"})
    await redis.sadd(c.HALTED_SET, "broken")
    await redis.sadd(c.TEMP_HALTED_SET, "met")
    await redis.set(c.tokens_key("flickr"), 178)
    await redis.set(c.num_resized_key("flickr"), 13188)
    await redis.set(c.resize_errors_key("flickr"), 3)
    await redis.rpush(c.last50_key("flickr"), *(["200"] * 48 + ["500", "404"]))
    await redis.set("override_rate:met", "5")
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
    assert list(by_name) == ["broken", "flickr", "met", "phylopic"]
    assert by_name["flickr"] == SourceStatus(
        name="flickr",
        rate_rps=178.4,
        tokens=178,
        successes=13188,
        errors=3,
        last_statuses={"200": 48, "500": 1, "404": 1},
        halted=False,
        temp_halted=False,
        override=None,
    )
    assert by_name["met"].temp_halted and by_name["met"].override == "5"
    assert by_name["met"].rate_rps is None  # the monitor has not rated it (yet)
    assert by_name["broken"].halted and by_name["broken"].last_statuses == {}
    assert by_name["phylopic"].override == "1"  # the alias spelling counts too
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
    await redis.sadd(c.tokens_key("odd"), "not-a-string")  # WRONGTYPE for GET
    await redis.set(c.last50_key("odd"), "not-a-list")
    (odd,) = (await read_status(redis)).sources
    assert odd.tokens is None and odd.last_statuses == {}


def test_parse_status_copes_with_cjson_empty_tables() -> None:
    payload = json.dumps(
        {
            "sources": {"a": {"rate": False, "tokens": False, "last": {}, "ok": "2"}},
            "halted": {},
            "temp_halted": {},
            "totals": {"num_resized": False},
        }
    )
    status = parse_status(payload)
    assert status.sources[0].rate_rps is None and status.sources[0].successes == 2
    assert status.num_resized == 0


def render(status: CrawlStatus) -> str:
    console = Console(width=160, record=True, color_system=None)
    console.print(status_table(status))
    return console.export_text()


async def test_the_table_shows_rates_tokens_counters_histogram_and_state(redis: Redis) -> None:
    await seed(redis)
    text = render(await read_status(redis))
    flickr = next(line for line in text.splitlines() if "flickr" in line)
    for cell in ("178", "13188", "200=48 500=1 404=1", "running"):
        assert cell in flickr
    met = next(line for line in text.splitlines() if " met " in line)
    assert "temp halted, override 5/s" in met
    assert " - " in met  # no rate from the monitor: "-"
    broken = next(line for line in text.splitlines() if "broken" in line)
    assert "halted" in broken
    assert "total: 13224 resized, 9 errors, 20000 split, 2 malformed" in text
