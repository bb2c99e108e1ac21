"""The index of the per-status error counters (image_crawler/error_reasons.py): read from
the set once it is whole, found with SCAN (and the set made whole) until then, counters
written meanwhile by the workers kept."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from image_crawler import contract as c
from image_crawler.error_reasons import index_reasons, reason_keys

OLD = [c.resize_errors_key("flickr", "404"), c.resize_errors_key("met", "DnsError")]


def record_commands(redis: Redis, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    commands: list[str] = []
    execute = redis.execute_command

    async def counting(*args: Any, **options: Any) -> Any:
        commands.append(str(args[0]))
        return await execute(*args, **options)

    monkeypatch.setattr(redis, "execute_command", counting)
    return commands


async def test_counters_of_an_older_crawl_are_found_once_then_read_from_the_index(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in OLD:
        await redis.set(key, 3)
    await redis.set(c.resize_errors_key("flickr"), 6)  # a source's total: no reason
    # A worker of this version counted one more meanwhile: in the set, not yet whole.
    new = c.resize_errors_key("flickr", "500")
    await redis.set(new, 1)
    await redis.sadd(c.ERROR_REASONS_SET, new)
    commands = record_commands(redis, monkeypatch)
    assert await reason_keys(redis) == sorted([*OLD, new])
    assert "SCAN" in commands
    assert await redis.smembers(c.ERROR_REASONS_SET) == {*OLD, new}
    assert await redis.exists(c.ERROR_REASONS_COMPLETE)
    commands.clear()
    assert await reason_keys(redis) == sorted([*OLD, new])
    assert "SCAN" not in commands


async def test_once_whole_the_index_is_all_that_is_read(redis: Redis) -> None:
    await index_reasons(redis)  # an empty Redis: whole at once
    assert await redis.exists(c.ERROR_REASONS_COMPLETE)
    # Not in the index: a key written by hand is not looked for any more.
    await redis.set(c.resize_errors_key("flickr", "404"), 3)
    assert await reason_keys(redis) == []
    await redis.sadd(c.ERROR_REASONS_SET, c.resize_errors_key("flickr", "404"))
    assert await reason_keys(redis) == [c.resize_errors_key("flickr", "404")]


async def test_an_index_key_of_another_type_is_no_index(redis: Redis) -> None:
    await redis.set(OLD[0], 1)
    await redis.set(c.ERROR_REASONS_COMPLETE, "1")
    await redis.set(c.ERROR_REASONS_SET, "in the way")
    assert await reason_keys(redis) == [OLD[0]]
