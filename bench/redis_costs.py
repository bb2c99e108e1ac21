"""What a crawl cost Redis: the commands it ran and the memory it kept, over a window.

``RedisReadings.read`` reads redis-server's ``INFO commandstats`` (every command it ran, by
name, those that scripts call included: a pacing script's HGETALL counts as one HGETALL
and its EVALSHA as one more), ``INFO memory`` and ``DBSIZE``; ``redis_window`` is what
changed between two readings, per image. Calls inside scripts are counted because they
are Redis' work; the round trips a worker waits for are the commands it sends itself
(EVALSHA, GET, SET...), which the table shows by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis

# The INFO commandstats field prefix of each command ("cmdstat_get").
_PREFIX = "cmdstat_"


class RedisReadings:
    """Readings of one redis-server through one connection (so that no connection's
    handshake falls inside a window): ``read()`` answers calls by command,
    ``used_memory`` (bytes) and the number of keys, now."""

    def __init__(self, url: str) -> None:
        self._client = aioredis.from_url(url, decode_responses=True)

    async def read(self) -> dict[str, Any]:
        commands = await self._client.info("commandstats")
        memory = await self._client.info("memory")
        keys = await self._client.dbsize()
        return {
            "calls": {
                name.removeprefix(_PREFIX): int(stats["calls"])
                for name, stats in commands.items()
                if isinstance(stats, Mapping)
            },
            "used_memory": int(memory["used_memory"]),
            "keys": int(keys),
        }

    async def aclose(self) -> None:
        await self._client.aclose()


def redis_window(
    before: Mapping[str, Any], after: Mapping[str, Any], images: int, top: int = 12
) -> dict[str, Any]:
    """What Redis ran and kept between two ``RedisReadings.read``s: commands (all, and the
    ``top`` commands by calls, each with its calls per image), memory and keys before and
    after. The readings' own INFO and DBSIZE commands are left out."""
    was, now = before.get("calls", {}), after.get("calls", {})
    # The first reading's own commands (a command's stats count it once it has run).
    ours = {"info": 2, "dbsize": 1}
    calls = {name: now.get(name, 0) - was.get(name, 0) - ours.get(name, 0) for name in {*was, *now}}
    calls = {name: n for name, n in calls.items() if n > 0}
    total = sum(calls.values())
    ordered = sorted(calls.items(), key=lambda item: (-item[1], item[0]))

    def per_image(n: float) -> float | None:
        return n / images if images else None

    memory_before, memory_after = before.get("used_memory"), after.get("used_memory")
    grown = (
        memory_after - memory_before
        if memory_before is not None and memory_after is not None
        else None
    )
    return {
        "commands": total,
        "commands_per_image": per_image(total),
        "top": {name: {"calls": n, "per_image": per_image(n)} for name, n in ordered[:top]},
        "used_memory_before": memory_before,
        "used_memory_after": memory_after,
        "used_memory_grown": grown,
        "keys_before": before.get("keys"),
        "keys_after": after.get("keys"),
    }
