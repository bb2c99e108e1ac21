"""Operator actions on a running crawl: ``image-crawler halt``, ``resume``, ``override``
and ``robots-exempt``.

Each is a few Redis commands in one transaction (MULTI/EXEC), the same ones an operator
would type into redis-cli (docs/operating.md); each returns what it did, as redis-cli
lines with a note where a command changed nothing, for the command to print.
The monitor reads the keys every second, so an action takes effect within a second;
``halt`` also sets the source's pace rate to 0 itself, so that workers stop within their
pacing horizon (about 0.05 s) instead of at the monitor's next loop. Every command acts on
the sources it is given even when nothing in Redis knows them, and then names them on
stderr: an unknown name is most likely a typo.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
from collections.abc import Awaitable, Callable, Sequence

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from crawlctl.connections import redis_client, redis_option, redis_settings
from crawlctl.console import (
    EXIT_OK,
    EXIT_UNAVAILABLE,
    Subcommands,
    UsageError,
    error,
    note,
    out,
)
from image_crawler.config import RedisSettings
from image_crawler.contract import (
    HALTED_SET,
    INBOUND_SOURCES_SET,
    RATES_HASH,
    ROBOTS_EXEMPT_SET,
    STATUS_60S_PREFIX,
    TEMP_HALTED_SET,
    is_valid_source_name,
    last50_key,
    override_alias_key,
    override_key,
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


def _rate_text(rate: float) -> str:
    return f"{rate:g}"


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
    """The documented resume procedure (docs/operating.md), done right, in one transaction.

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


# --- the commands -------------------------------------------------------------------------

# An action on a client, once its arguments are checked.
Action = Callable[[aioredis.Redis], Awaitable[list[Done]]]


def register(subcommands: Subcommands) -> None:
    _add_halt(subcommands)
    _add_resume(subcommands)
    _add_override(subcommands)
    _add_robots_exempt(subcommands)


def _add_halt(subcommands: Subcommands) -> None:
    halt_parser = subcommands.add_parser(
        "halt",
        parents=[redis_option()],
        help="halt a source now (SADD halted; SET pace_rate:SOURCE 0)",
        description=(
            "Halt SOURCE until an operator resumes it: add it to the halted set (the "
            "monitor then paces it at 0) and SET pace_rate:SOURCE 0 so that workers stop "
            "within their pacing horizon (about 0.05 s) instead of at the monitor's next "
            "loop; also SET currtokens:SOURCE 0 for workers older than pacing (a rolling "
            "upgrade). One transaction."
        ),
    )
    halt_parser.add_argument("source", metavar="SOURCE")
    halt_parser.set_defaults(run=_run_halt)


def _add_resume(subcommands: Subcommands) -> None:
    resume_parser = subcommands.add_parser(
        "resume",
        parents=[redis_option()],
        help="resume a halted source (clears its error windows)",
        description=(
            "Resume SOURCE: with --rate, SET override_rate:SOURCE first; then DEL "
            "statuslast50req:SOURCE and status60s:SOURCE (so the old errors do not trip a "
            "breaker again), SREM halted and SREM temp_halted, in one transaction. The "
            "monitor paces it again within a second."
        ),
    )
    resume_parser.add_argument("source", metavar="SOURCE")
    resume_parser.add_argument("--rate", metavar="R", help="requests/s to crawl it at from now on")
    resume_parser.set_defaults(run=_run_resume)


def _add_override(subcommands: Subcommands) -> None:
    override_parser = subcommands.add_parser(
        "override",
        parents=[redis_option()],
        help="set (or --clear) a source's rate override",
        description=(
            "SET override_rate:SOURCE RATE (requests/s, > 0): within a second it is the "
            "source's configured rate instead of the computed one (the effective rate stays "
            "below it while the source's server pushes back). --clear deletes "
            "override_rate:SOURCE and override-rate:SOURCE."
        ),
    )
    override_parser.add_argument("source", metavar="SOURCE")
    override_parser.add_argument("rate", nargs="?", metavar="RATE", help="requests/s, > 0")
    override_parser.add_argument("--clear", action="store_true", help="remove the override")
    override_parser.set_defaults(run=_run_override)


def _add_robots_exempt(subcommands: Subcommands) -> None:
    exempt = subcommands.add_parser(
        "robots-exempt",
        parents=[redis_option()],
        help="stop obeying robots.txt for sources (--remove: obey it again); list them",
        description=(
            "Exempt each SOURCE from robots.txt (SADD robots_exempt SOURCE): workers stop "
            "obeying it for the source's URLs, so none is refused as RobotsDisallowed and "
            "no Crawl-delay caps the source's rate (pacing, backoff and the breakers still "
            "apply). With --remove, obey robots.txt for them again (SREM robots_exempt "
            "SOURCE). With no SOURCE, or --list, print the exempt sources, one a line. "
            "Exempt a source only when its sites have given you permission to crawl what "
            "their robots.txt disallows: having that permission is the operator's "
            "responsibility, not the crawler's."
        ),
    )
    exempt.add_argument(
        "sources", nargs="*", metavar="SOURCE", help="source names, as messages spell them"
    )
    exempt.add_argument(
        "--remove", action="store_true", help="obey robots.txt for the SOURCEs again"
    )
    exempt.add_argument("--list", action="store_true", help="list the exempt sources (default)")
    exempt.set_defaults(run=_run_robots_exempt)


def _run_halt(args: argparse.Namespace) -> int:
    source = _source(args.source)
    return _operate(args, [source], lambda redis: halt(redis, source))


def _run_resume(args: argparse.Namespace) -> int:
    rate = _rate(args.rate) if args.rate is not None else None
    source = _source(args.source)
    return _operate(args, [source], lambda redis: resume(redis, source, rate))


def _run_override(args: argparse.Namespace) -> int:
    if args.clear:
        if args.rate is not None:
            raise UsageError("give either RATE or --clear, not both")
        source = _source(args.source)
        return _operate(args, [source], lambda redis: clear_override(redis, source))
    if args.rate is None:
        raise UsageError("give a RATE (requests/s), or --clear")
    rate = _rate(args.rate)
    source = _source(args.source)
    return _operate(args, [source], lambda redis: override(redis, source, rate))


def _run_robots_exempt(args: argparse.Namespace) -> int:
    if args.list and (args.remove or args.sources):
        raise UsageError("--list takes no SOURCE and no --remove")
    if args.remove and not args.sources:
        raise UsageError("--remove needs the SOURCEs to obey robots.txt for again")
    sources = list(dict.fromkeys(_source(raw) for raw in args.sources))
    if not sources:
        return asyncio.run(_list_robots_exempt(redis_settings(args)))
    action = robots_obey if args.remove else robots_exempt
    return _operate(args, sources, lambda redis: action(redis, sources))


def _source(raw: str) -> str:
    try:
        return source_name(raw)
    except InvalidArgument as e:
        raise UsageError(str(e)) from None


def _rate(raw: str) -> float:
    try:
        return parse_rate(raw)
    except InvalidArgument as e:
        raise UsageError(str(e)) from None


def _operate(args: argparse.Namespace, sources: list[str], action: Action) -> int:
    """Run ``action`` on the Redis that ``args`` name and print what it did; then name
    those of ``sources`` that nothing in Redis knows."""
    settings = redis_settings(args)

    async def run() -> int:
        redis = redis_client(settings)
        try:
            unknown_sources = await unknown(redis, sources)
            done = await action(redis)
        except RedisError as e:
            error(f"Redis at {settings.redacted_url}: {e}")
            return EXIT_UNAVAILABLE
        finally:
            await redis.aclose()
        for line in done:
            out(str(line))
        for source in unknown_sources:
            note(
                f"note: {source!r} is not a source the monitor rates or the splitter has "
                "seen (yet); check the name"
            )
        return EXIT_OK

    return asyncio.run(run())


async def _list_robots_exempt(settings: RedisSettings) -> int:
    redis = redis_client(settings)
    try:
        exempt = await robots_exempted(redis)
    except RedisError as e:
        error(f"Redis at {settings.redacted_url}: {e}")
        return EXIT_UNAVAILABLE
    finally:
        await redis.aclose()
    # One name a line on stdout, for scripts; the sentence for people goes to stderr.
    for source in exempt:
        out(source)
    if not exempt:
        note("no source is robots-exempt: robots.txt is obeyed for every source")
    return EXIT_OK
