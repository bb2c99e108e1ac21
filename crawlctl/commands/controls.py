"""Operator actions on a running crawl: halt, resume, override a source's rate, exempt a
source from robots.txt.

Each is a few Redis commands in one transaction (MULTI/EXEC), the same ones an operator
would type into redis-cli (``README.md``, "Operating a crawl"); each returns what it did,
as redis-cli lines with a note where a command changed nothing, for the CLI to print.
The monitor reads the keys every second, so an action takes effect within a second;
``halt`` also sets the source's pace rate to 0 itself, so that workers stop within their
pacing horizon (about 0.05 s) instead of at the monitor's next loop.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import redis.asyncio as aioredis

from image_crawler.contract import (
    HALTED_SET,
    INBOUND_SOURCES_SET,
    OVERRIDE_RATE_ALIAS_PREFIX,
    OVERRIDE_RATE_PREFIX,
    RATES_HASH,
    ROBOTS_EXEMPT_SET,
    STATUS_60S_PREFIX,
    TEMP_HALTED_SET,
    is_valid_source_name,
    last50_key,
    pace_rate_key,
    tokens_key,
)


class InvalidArgument(ValueError):
    """An operator's argument (source name, rate) that no action can use."""


@dataclasses.dataclass(frozen=True, slots=True)
class Done:
    """One command that was run, as redis-cli shows it, and what it changed."""

    command: str
    note: str = ""

    def __str__(self) -> str:
        return f"{self.command}  ({self.note})" if self.note else self.command


def source_name(raw: str) -> str:
    """The source as Redis keys spell it (lower-case); ``InvalidArgument`` if impossible."""
    name = raw.strip().lower()
    if not is_valid_source_name(name):
        raise InvalidArgument(
            f"not a source name: {raw!r} (letters, digits, '.', '_' and '-' only)"
        )
    return name


def parse_rate(raw: str) -> float:
    """A rate in requests/s: a finite number > 0; ``InvalidArgument`` otherwise."""
    try:
        rate = float(raw)
    except ValueError:
        raise InvalidArgument(
            f"RATE must be a number of requests per second, got {raw!r}"
        ) from None
    if not math.isfinite(rate) or rate <= 0:
        raise InvalidArgument(
            f"RATE must be a number > 0, got {raw!r} (to stop a source, halt it instead)"
        )
    return rate


def override_key(source: str) -> str:
    return f"{OVERRIDE_RATE_PREFIX}{source}"


def override_alias_key(source: str) -> str:
    return f"{OVERRIDE_RATE_ALIAS_PREFIX}{source}"


def _rate_text(rate: float) -> str:
    return f"{rate:g}"


async def is_known(redis: aioredis.Redis, source: str) -> bool:
    """True when the monitor rates ``source`` or the splitter has seen it."""
    return not await unknown(redis, [source])


async def unknown(redis: aioredis.Redis, sources: Sequence[str]) -> list[str]:
    """Those of ``sources`` that the monitor does not rate, the splitter has not seen and
    no one halted; one round trip for all of them."""
    async with redis.pipeline(transaction=False) as pipe:
        for source in sources:
            pipe.hexists(RATES_HASH, source)
            pipe.sismember(INBOUND_SOURCES_SET, source)
            pipe.sismember(HALTED_SET, source)
        results = await pipe.execute()
    return [s for i, s in enumerate(sources) if not any(results[3 * i : 3 * i + 3])]


async def halt(redis: aioredis.Redis, source: str) -> list[Done]:
    """Halt ``source`` until ``resume``: SADD ``halted``, and SET its pace rate (and, for
    workers older than pacing, its token bucket) to 0 so that workers stop at once."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.sadd(HALTED_SET, source)
        # No expiry: the monitor's next loop writes "0" with its own, and without a
        # monitor a "0" that stays says the same as an expired key (no request).
        pipe.set(pace_rate_key(source), 0)
        pipe.set(tokens_key(source), 0)
        added, _, _ = await pipe.execute()
    return [
        Done(
            f"SADD {HALTED_SET} {source}",
            "the monitor paces it at 0 until it is resumed" if added else "it was already halted",
        ),
        Done(f"SET {pace_rate_key(source)} 0", "workers stop within their pacing horizon, ~0.05 s"),
        Done(f"SET {tokens_key(source)} 0", "the same for workers older than pacing"),
    ]


async def resume(redis: aioredis.Redis, source: str, rate: float | None = None) -> list[Done]:
    """The README's resume procedure, done right, in one transaction.

    With ``rate``, first SET ``override_rate:{source}`` (as the procedure does). Then
    clear the last-50 statuses and the 60-second window (or the errors that caused the
    halt would trip the temporary breaker again), and remove the source from both halted
    sets. The monitor paces it again (SETs its ``pace_rate:``) within a second.
    """
    async with redis.pipeline(transaction=True) as pipe:
        if rate is not None:
            pipe.set(override_key(source), _rate_text(rate))
        pipe.delete(last50_key(source))
        pipe.delete(f"{STATUS_60S_PREFIX}{source}")
        pipe.srem(HALTED_SET, source)
        pipe.srem(TEMP_HALTED_SET, source)
        results = await pipe.execute()
    done: list[Done] = []
    if rate is not None:
        done.append(Done(f"SET {override_key(source)} {_rate_text(rate)}", "requests/s"))
        results = results[1:]
    cleared_last50, cleared_window, was_halted, was_temp_halted = results
    done += [
        Done(f"DEL {last50_key(source)}", "" if cleared_last50 else "it was empty"),
        Done(f"DEL {STATUS_60S_PREFIX}{source}", "" if cleared_window else "it was empty"),
        Done(f"SREM {HALTED_SET} {source}", "" if was_halted else "it was not halted"),
        Done(
            f"SREM {TEMP_HALTED_SET} {source}",
            "" if was_temp_halted else "it was not temporarily halted",
        ),
    ]
    return done


async def override(redis: aioredis.Redis, source: str, rate: float) -> list[Done]:
    """Set the operator's rate for ``source`` (requests/s); it beats the computed one."""
    await redis.set(override_key(source), _rate_text(rate))
    return [Done(f"SET {override_key(source)} {_rate_text(rate)}", "requests/s")]


async def clear_override(redis: aioredis.Redis, source: str) -> list[Done]:
    """Drop both spellings of the override: the computed rate applies again."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.delete(override_key(source))
        pipe.delete(override_alias_key(source))
        deleted, deleted_alias = await pipe.execute()
    return [
        Done(f"DEL {override_key(source)}", "" if deleted else "there was none"),
        Done(f"DEL {override_alias_key(source)}", "" if deleted_alias else "there was none"),
    ]


async def robots_exempt(redis: aioredis.Redis, sources: Sequence[str]) -> list[Done]:
    """Add ``sources`` to ``robots_exempt``: their workers stop obeying robots.txt (the
    operator has the sites' permission). One transaction."""
    async with redis.pipeline(transaction=True) as pipe:
        for source in sources:
            pipe.sadd(ROBOTS_EXEMPT_SET, source)
        added = await pipe.execute()
    return [
        Done(
            f"SADD {ROBOTS_EXEMPT_SET} {source}",
            f"robots.txt is no longer obeyed for {source}"
            if was_added
            else f"it was already exempt: robots.txt was not obeyed for {source}",
        )
        for source, was_added in zip(sources, added, strict=True)
    ]


async def robots_obey(redis: aioredis.Redis, sources: Sequence[str]) -> list[Done]:
    """Remove ``sources`` from ``robots_exempt``: robots.txt applies to them again."""
    async with redis.pipeline(transaction=True) as pipe:
        for source in sources:
            pipe.srem(ROBOTS_EXEMPT_SET, source)
        removed = await pipe.execute()
    return [
        Done(
            f"SREM {ROBOTS_EXEMPT_SET} {source}",
            f"robots.txt is obeyed again for {source}"
            if was_removed
            else f"it was not exempt: robots.txt was already obeyed for {source}",
        )
        for source, was_removed in zip(sources, removed, strict=True)
    ]


async def robots_exempted(redis: aioredis.Redis) -> list[str]:
    """The sources whose robots.txt is not obeyed, sorted."""
    members = await redis.smembers(ROBOTS_EXEMPT_SET)
    # Bytes unless the client decodes responses (the CLI's does).
    return sorted(m.decode() if isinstance(m, bytes) else m for m in members)
