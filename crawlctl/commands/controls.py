"""Operator actions on a running crawl: ``image-crawler halt``, ``resume``, ``override``
and ``robots-exempt``; with ``--host``, ``halt``, ``resume`` and ``override`` act on one host
of a source (its hash ``pace_host:{source}:{host}``, read by the workers' pacing script at
their next ask about the host: within ``operator_poll_s``, 5 s, while URLs wait for it).

Each is a few Redis commands in one transaction (MULTI/EXEC), the same ones an operator
would type into redis-cli (docs/operating.md); each returns what it did, as redis-cli
lines with a note where a command changed nothing, for the command to print.
The monitor reads the keys every second, so an action takes effect within a second;
``halt`` also sets the source's pace rate to 0 itself, so that workers stop within their
pacing horizon (about 0.05 s) instead of at the monitor's next loop. Every command acts on
the sources it is given even when nothing in Redis knows them, and then names them on
stderr: an unknown name is most likely a typo; so is a host no worker has asked about
(no hash), which is halted or overridden anyway (it takes effect with its first URL).
Resuming a host, or clearing its override, reads its hash first (a round trip before the
transaction): a hash left with no operator's field is given an idle host's expiry again.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from yarl import URL

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
    HOST_BREAKER_FIELDS,
    HOST_EXPIRES_FIELD,
    HOST_HALT_FIELD,
    HOST_IDLE_S,
    HOST_OVERRIDE_FIELD,
    INBOUND_SOURCES_SET,
    RATES_HASH,
    ROBOTS_EXEMPT_SET,
    STATUS_60S_PREFIX,
    TEMP_HALTED_SET,
    is_valid_source_name,
    last50_key,
    override_alias_key,
    override_key,
    pace_host_key,
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


def host_name(raw: str) -> str:
    """A host as the workers' pacing keys spell it (worker/politeness/hosts.py's
    ``host_of``): lower-cased, without a trailing dot, an IPv6 address without brackets;
    a URL gives its host, a port is left out. ``InvalidArgument`` if there is none."""
    text = raw.strip()
    if "://" in text:
        try:
            text = URL(text).host or ""
        except (ValueError, TypeError):
            text = ""
    elif text.startswith("[") and "]" in text:
        text = text[1 : text.index("]")]
    elif text.count(":") == 1 and text.rpartition(":")[2].isdigit():
        text = text.rpartition(":")[0]
    host = text.lower().rstrip(".")
    if not host or any(ch.isspace() or ch in "/?#@[]" for ch in host):
        raise InvalidArgument(
            f"not a host: {raw!r} (a host name such as images.example.org, or a URL)"
        )
    return host


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


# --- one host --------------------------------------------------------------------------


def _quoted(text: str) -> str:
    # As redis-cli takes an argument with spaces.
    return json.dumps(text, ensure_ascii=False)


async def halt_host(redis: aioredis.Redis, source: str, host: str, reason: str) -> list[Done]:
    """Halt one host of ``source`` until ``resume``: HSET its ``halt`` (``reason``) and
    keep its hash for good (PERSIST, ``exp`` ""), in one transaction."""
    key = pace_host_key(source, host)
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hget(key, HOST_HALT_FIELD)
        pipe.hset(key, mapping={HOST_HALT_FIELD: reason, HOST_EXPIRES_FIELD: ""})
        pipe.persist(key)
        before, _, _ = await pipe.execute()
    return [
        Done(
            f'HSET {key} {HOST_HALT_FIELD} {_quoted(reason)} {HOST_EXPIRES_FIELD} ""',
            f"it was already halted: {before}"
            if before
            else "no request to the host until it is resumed",
        ),
        Done(f"PERSIST {key}", "kept for good while an operator's field is in it"),
    ]


async def override_host(redis: aioredis.Redis, source: str, host: str, rate: float) -> list[Done]:
    """Set one host's rate (requests/s, under its source's) and keep its hash for good."""
    key = pace_host_key(source, host)
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(key, mapping={HOST_OVERRIDE_FIELD: _rate_text(rate), HOST_EXPIRES_FIELD: ""})
        pipe.persist(key)
        await pipe.execute()
    return [
        Done(
            f'HSET {key} {HOST_OVERRIDE_FIELD} {_rate_text(rate)} {HOST_EXPIRES_FIELD} ""',
            "requests/s, never above the source's rate",
        ),
        Done(f"PERSIST {key}", "kept for good while an operator's field is in it"),
    ]


async def resume_host(
    redis: aioredis.Redis, source: str, host: str, rate: float | None = None
) -> list[Done]:
    """Resume one host: HDEL its ``halt`` and its breaker's fields (failures, halts, given
    up), after setting its ``override`` to ``rate`` if given. A hash left without an
    operator's field expires again (``_let_expire``)."""
    removed = (HOST_HALT_FIELD, *HOST_BREAKER_FIELDS)
    done = await override_host(redis, source, host, rate) if rate is not None else []
    return done + await _remove(redis, pace_host_key(source, host), removed, _resumed_note)


async def clear_host_override(redis: aioredis.Redis, source: str, host: str) -> list[Done]:
    """Drop one host's ``override``: its ceiling is its source's again (or host_rate)."""
    key = pace_host_key(source, host)
    return await _remove(redis, key, (HOST_OVERRIDE_FIELD,), _cleared_note)


def _resumed_note(before: Mapping[str, str]) -> str:
    halt, gone, until = before.get(HOST_HALT_FIELD), before.get("gone"), before.get("until")
    if halt:
        return f"it was halted by an operator: {halt}"
    if gone:
        return "it had been given up (its URLs ended as HostUnavailable)"
    if until or before.get("fails"):
        return "its breaker's failures and halts are cleared"
    return "it was not halted"


def _cleared_note(before: Mapping[str, str]) -> str:
    rate = before.get(HOST_OVERRIDE_FIELD)
    return f"it was {rate} requests/s" if rate else "there was none"


async def _remove(
    redis: aioredis.Redis,
    key: str,
    fields: Sequence[str],
    note: Callable[[Mapping[str, str]], str],
) -> list[Done]:
    """HDEL ``fields`` of the hash ``key``, and have it expire as an idle host's when no
    operator's field is left in it."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hgetall(key)
        pipe.time()
        before, (seconds, micros) = await pipe.execute()
    done = [Done(f"HDEL {key} {' '.join(fields)}", note(before))]
    left = {name: value for name, value in before.items() if name not in fields}
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hdel(key, *fields)
        if left and not left.get(HOST_HALT_FIELD) and not left.get(HOST_OVERRIDE_FIELD):
            ttl_ms = _idle_ttl_ms(left, seconds + micros / 1e6)
            pipe.hset(key, HOST_EXPIRES_FIELD, "")
            pipe.pexpire(key, ttl_ms)
            done += [
                Done(f'HSET {key} {HOST_EXPIRES_FIELD} ""', "renewed at the host's next ask"),
                Done(f"PEXPIRE {key} {ttl_ms}", "forgotten if it stays idle until then"),
            ]
        await pipe.execute()
    return done


def _idle_ttl_ms(fields: Mapping[str, str], now: float) -> int:
    """How long a host's hash with no operator's field is kept from ``now``: an idle
    host's time (HOST_IDLE_S), or longer while its Crawl-delay is in force."""
    keep_s = HOST_IDLE_S
    try:
        delay_until = float(fields.get("delay_until") or "nan")
    except ValueError:
        delay_until = math.nan
    if delay_until - now > keep_s:
        keep_s = delay_until - now
    return math.ceil(keep_s * 1000)


def default_reason(now: datetime | None = None) -> str:
    """What ``halt --host`` writes without ``--reason``: who halted it, and when."""
    at = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"halted with image-crawler halt at {at}"


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
        help="halt a source now (SADD halted; SET pace_rate:SOURCE 0), or one of its hosts",
        description=(
            "Halt SOURCE until an operator resumes it: add it to the halted set (the "
            "monitor then paces it at 0) and SET pace_rate:SOURCE 0 so that workers stop "
            "within their pacing horizon (about 0.05 s) instead of at the monitor's next "
            "loop; also SET currtokens:SOURCE 0 for workers older than pacing (a rolling "
            "upgrade). One transaction. With --host, halt that host of SOURCE only: HSET "
            'pace_host:SOURCE:HOST halt REASON exp "" and PERSIST it (kept for good); '
            "workers stop asking for it at their next ask about it (within 5 s)."
        ),
    )
    halt_parser.add_argument("source", metavar="SOURCE")
    _host_option(halt_parser)
    halt_parser.add_argument(
        "--reason", metavar="TEXT", help="with --host: why, kept in its halt field"
    )
    halt_parser.set_defaults(run=_run_halt)


def _host_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host",
        metavar="HOST",
        help=(
            "act on this host of SOURCE only (its name or a URL; under PACING_KEY=domain, "
            "its registered domain)"
        ),
    )


def _add_resume(subcommands: Subcommands) -> None:
    resume_parser = subcommands.add_parser(
        "resume",
        parents=[redis_option()],
        help="resume a halted source (clears its error windows), or one of its hosts",
        description=(
            "Resume SOURCE: with --rate, SET override_rate:SOURCE first; then DEL "
            "statuslast50req:SOURCE and status60s:SOURCE (so the old errors do not trip a "
            "breaker again), SREM halted and SREM temp_halted, in one transaction. The "
            "monitor paces it again within a second. With --host, resume that host of "
            "SOURCE: HDEL pace_host:SOURCE:HOST halt fails since until halts gone (an "
            "operator's halt, its breaker's halts, a host given up), after HSET override "
            "RATE with --rate; a hash left with no operator's field expires again."
        ),
    )
    resume_parser.add_argument("source", metavar="SOURCE")
    _host_option(resume_parser)
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
            "override_rate:SOURCE and override-rate:SOURCE. With --host, the rate of that "
            'host of SOURCE: HSET pace_host:SOURCE:HOST override RATE exp "" and PERSIST '
            "it (never above the source's rate; its Crawl-delay still applies); --clear "
            "HDELs it."
        ),
    )
    override_parser.add_argument("source", metavar="SOURCE")
    _host_option(override_parser)
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
    if args.host is None:
        if args.reason is not None:
            raise UsageError("--reason goes with --host (a source's halt has no reason)")
        return _operate(args, [source], lambda redis: halt(redis, source))
    host = _host(args.host)
    reason = args.reason.strip() if args.reason and args.reason.strip() else default_reason()
    return _operate(args, [source], lambda redis: halt_host(redis, source, host, reason), host)


def _run_resume(args: argparse.Namespace) -> int:
    rate = _rate(args.rate) if args.rate is not None else None
    source = _source(args.source)
    if args.host is None:
        return _operate(args, [source], lambda redis: resume(redis, source, rate))
    host = _host(args.host)
    return _operate(args, [source], lambda redis: resume_host(redis, source, host, rate), host)


def _run_override(args: argparse.Namespace) -> int:
    if args.clear and args.rate is not None:
        raise UsageError("give either RATE or --clear, not both")
    if not args.clear and args.rate is None:
        raise UsageError("give a RATE (requests/s), or --clear")
    rate = _rate(args.rate) if args.rate is not None else None
    source = _source(args.source)
    host = _host(args.host) if args.host is not None else None
    return _operate(args, [source], _override_action(source, host, rate), host)


def _override_action(source: str, host: str | None, rate: float | None) -> Action:
    if host is not None:
        if rate is None:
            return lambda redis: clear_host_override(redis, source, host)
        return lambda redis: override_host(redis, source, host, rate)
    if rate is None:
        return lambda redis: clear_override(redis, source)
    return lambda redis: override(redis, source, rate)


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


def _host(raw: str) -> str:
    try:
        return host_name(raw)
    except InvalidArgument as e:
        raise UsageError(str(e)) from None


def _operate(
    args: argparse.Namespace, sources: list[str], action: Action, host: str | None = None
) -> int:
    """Run ``action`` on the Redis that ``args`` name and print what it did; then name
    those of ``sources`` that nothing in Redis knows, and ``host`` (of the one source)
    when no worker has asked about it (it has no hash)."""
    settings = redis_settings(args)

    async def run() -> int:
        redis = redis_client(settings)
        try:
            unknown_sources = await unknown(redis, sources)
            known_host = host is None or await redis.exists(pace_host_key(sources[0], host))
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
        if not known_host:
            note(
                f"note: {host!r} is not a host of {sources[0]!r} that a worker has asked "
                f"about lately (no {pace_host_key(sources[0], str(host))}); check the name "
                "(the URL's lower-cased host, or its registered domain under "
                "PACING_KEY=domain)"
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
