"""The regulator's Redis seam: one round trip to read a loop's state, one to write it.

With thousands of sources, one command per source and key is too slow even pipelined:
encoding the commands and parsing their replies alone would take much of a loop. So each
direction is a single Lua script call whose argument and answer are one JSON document
each: Redis walks the sources, Python parses one string. The scripts only gather and
apply; every decision is made in Python. ``PlainRegulatorStore`` states what each script
does in plain commands, one per key, and a test holds the scripts to it. Key prefixes
come from ``image_crawler.contract``.

Reading is one pipeline of script calls, ``READ_CHUNK`` sources each, so that a long
read never holds Redis for long, and one more for the robots.txt crawl delays (the
``crawl_delayed`` and ``robots_exempt`` sets and the members' ``crawl_delay:`` keys),
and at a term's first loop an ``HGETALL`` of ``crawl_rates`` (the rates the last leader
published, which a new leader takes over); each call is a consistent snapshot of what it
reads, writing is one atomic script. Keys are built inside the scripts, which is fine for
a single Redis server (not for Redis Cluster).

Leadership rides in the write script: it applies a loop's writes only while the
monitor's ``LeaderLease`` token is the one in ``monitor_leader``, and renews the lease in
the same call, so a leader spends no extra round trip on it and a monitor that lost the
lease (stalled past its expiry) can never write over the new leader. A standby's only
round trip is ``acquire``; ``release`` gives the lease up on a clean stop.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import socket
from collections import Counter
from collections.abc import Awaitable, Collection, Mapping, Sequence
from typing import Any, Final, Protocol

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, ResponseError

from crawl_monitor.policy import breakers
from image_crawler.contract import (
    BACKOFF_SIGNALS_PREFIX,
    CRAWL_DELAY_PREFIX,
    CRAWL_DELAYED_SET,
    ERROR_HOSTS_60S_PREFIX,
    EXPECTED_STATUSES,
    HALTED_SET,
    HOSTS_60S_PREFIX,
    LAST_50_PREFIX,
    LAST_N_STATUSES,
    MONITOR_LEADER_KEY,
    OVERRIDE_RATE_ALIAS_PREFIX,
    OVERRIDE_RATE_PREFIX,
    PACE_RATE_PREFIX,
    RATES_HASH,
    RESIZE_ERRORS,
    ROBOTS_EXEMPT_SET,
    STATUS_60S_PREFIX,
    TEMP_HALTED_SET,
    PacingInfo,
    backoff_signals_key,
    crawl_delay_key,
    error_hosts60s_key,
    hosts60s_key,
    last50_key,
    override_alias_key,
    override_key,
    pace_rate_key,
    resize_errors_key,
)
from image_crawler.lua import lua_script

_READ_SCRIPT: Final = lua_script("crawl_monitor", "read.lua")

_DELAYS_SCRIPT: Final = lua_script("crawl_monitor", "delays.lua")

_WRITE_SCRIPT: Final = lua_script("crawl_monitor", "write.lua")

_ACQUIRE_SCRIPT: Final = lua_script("crawl_monitor", "lease_acquire.lua")

_RELEASE_SCRIPT: Final = lua_script("crawl_monitor", "lease_release.lua")


@dataclasses.dataclass(frozen=True, slots=True)
class LeaderLease:
    """A monitor's claim to lead: its ``token`` in ``key`` for ``ttl_ms`` at a time."""

    token: str
    ttl_ms: int
    key: str = MONITOR_LEADER_KEY


def new_lease_token() -> str:
    """A token naming this process for operators (``redis-cli get monitor_leader``)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclasses.dataclass(frozen=True, slots=True)
class WriteResult:
    """What a write did: applied (and ``paced`` pace_rate keys set), or refused for want of
    the lease."""

    applied: bool
    paced: int = 0
    # Who holds the lease when the write was refused (None: nobody).
    holder: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class SourceState:
    """What Redis holds about one source (histograms map status -> count).

    ``window`` is empty when the 60 s window holds no error (nothing a breaker acts on).
    """

    window: Mapping[str, int] = dataclasses.field(default_factory=dict)
    last_statuses: Mapping[str, int] = dataclasses.field(default_factory=dict)
    override: str | None = None
    override_alias: str | None = None
    # Keys that could not be read (e.g. of the wrong type), with Redis' error.
    errors: tuple[str, ...] = ()
    # With a histogram: how many hosts the window's outcomes came from, and how many of
    # them failed (``hosts60s:``, ``error_hosts60s:``; 0 when no worker said).
    hosts: int = 0
    failing_hosts: int = 0


EMPTY_SOURCE: Final = SourceState()


@dataclasses.dataclass(frozen=True, slots=True)
class ObservedState:
    """One consistent reading of the halted sets and every requested source."""

    halted: frozenset[str]
    temp_halted: frozenset[str]
    sources: Mapping[str, SourceState]
    # Every requested source's failure counter (resize_errors:{source}), "" when missing.
    failure_counters: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # The backoff signal counter (backoff_signals:{source}) of the requested sources that
    # have one holding an integer.
    backoff_signals: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # Every member of crawl_delayed (known source or not) with its crawl_delay:{source}
    # value as written, None when the key is missing (expired) or not a string.
    crawl_delays: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    robots_exempt: frozenset[str] = frozenset()
    # crawl_rates as read, source -> value (None: not asked for; empty when the key is
    # missing or not a hash).
    published: Mapping[str, str] | None = None

    def of(self, source: str) -> SourceState:
        return self.sources.get(source, EMPTY_SOURCE)


@dataclasses.dataclass(frozen=True, slots=True)
class Writes:
    """One loop's decisions, applied together."""

    # The rate (requests/s) of every known source for pace_rate:{source}: its effective
    # rate, 0 while it is halted.
    pace_rates: Mapping[str, float]
    # crawl_rates fields to set (the changed ones), and to delete.
    pacing: Mapping[str, PacingInfo] = dataclasses.field(default_factory=dict)
    pacing_gone: Collection[str] = ()
    # Replace crawl_rates whole with ``pacing``.
    pacing_whole: bool = False
    halt: Collection[str] = ()
    temp_halt: Collection[str] = ()
    lift_temp_halt: Collection[str] = ()
    clear_window: Collection[str] = ()
    # Members of crawl_delayed whose crawl_delay key was missing: SREMed if it still is.
    forget_crawl_delayed: Collection[str] = ()


class RegulatorStore(Protocol):
    async def read(
        self,
        sources: Sequence[str],
        window_start_s: float,
        *,
        full_last_statuses: Collection[str] | None = None,
        failure_counters: Mapping[str, str] | None = None,
        published: bool = False,
    ) -> ObservedState: ...

    async def write(
        self, writes: Writes, pace_rate_ttl_ms: int, lease: LeaderLease | None = None
    ) -> WriteResult: ...

    async def acquire(self, lease: LeaderLease) -> str | None: ...

    async def release(self, lease: LeaderLease) -> bool: ...


def _text(value: Any) -> str:
    # Replies are str with decode_responses, bytes without it.
    if isinstance(value, bytes):
        return value.decode()
    return "" if value is None else str(value)


def _histogram(value: Any) -> dict[str, int]:
    # The script writes status -> integer count, and leaves empty histograms out.
    return value if isinstance(value, dict) else {}


def _members(value: Any) -> frozenset[str]:
    # An empty set comes back as {} (cjson cannot tell an empty list from an empty object).
    return frozenset(value) if isinstance(value, list) else frozenset()


def _host_counts(value: Any) -> dict[str, int]:
    if not isinstance(value, list) or len(value) != 2:
        return {}
    return {"hosts": int(value[0]), "failing_hosts": int(value[1])}


def decode_observed(raw: str | bytes, sources_asked: Sequence[str]) -> ObservedState:
    """The read script's JSON answer, for ``sources_asked``, as an ``ObservedState``."""
    document = json.loads(raw)
    sources: dict[str, SourceState] = {}
    entries = document.get("s")
    if isinstance(entries, dict):
        for source, entry in entries.items():
            sources[source] = SourceState(
                window=_histogram(entry.get("w")),
                last_statuses=_histogram(entry.get("l")),
                override=entry.get("o"),
                override_alias=entry.get("a"),
                errors=tuple(entry.get("x") or ()),
                **_host_counts(entry.get("n")),
            )
    counters = document.get("c")
    backoff = document.get("b")
    return ObservedState(
        halted=_members(document.get("h")),
        temp_halted=_members(document.get("t")),
        sources=sources,
        # One counter per source asked (an empty list comes back as {}, like the sets).
        failure_counters=dict(zip(sources_asked, counters, strict=True))
        if isinstance(counters, list)
        else {},
        backoff_signals=_integers(backoff) if isinstance(backoff, dict) else {},
    )


def decode_delays(raw: str | bytes) -> tuple[dict[str, str | None], frozenset[str]]:
    """The delays script's JSON answer: each crawl_delayed member's crawl_delay value
    (None: missing), and the robots_exempt members."""
    document = json.loads(raw)
    delays = document.get("d")
    return (
        # An empty set's {} is an empty object too.
        {s: v if isinstance(v, str) else None for s, v in delays.items()}
        if isinstance(delays, dict)
        else {},
        _members(document.get("e")),
    )


def _integers(values: Mapping[str, Any]) -> dict[str, int]:
    # A counter an operator overwrote with something else is as good as missing.
    counters = {}
    for source, value in values.items():
        try:
            counters[source] = int(value)
        except (TypeError, ValueError):
            continue
    return counters


_EXPECTED_JSON: Final = json.dumps(sorted(EXPECTED_STATUSES))

# Sources per read-script call: small enough that workers' commands are served between
# calls, large enough that the calls' own cost does not add up.
# At most 1,999: the script passes 4 keys a source to one MGET through Lua's unpack,
# whose limit is 8,000 values.
READ_CHUNK: Final = 500


def pace_value(rate_rps: float) -> str:
    """A ``pace_rate:`` value: the rate's repr, or "0" (not "0.0": what operators type,
    and what ``image-crawler halt`` writes)."""
    return repr(rate_rps) if rate_rps > 0.0 else "0"


def _read_args(
    chunk: Sequence[str],
    window_start_s: float,
    full_last_statuses: Collection[str] | None,
    failure_counters: Mapping[str, str] | None,
) -> list[Any]:
    """The read script's ARGV for ``chunk`` (see its header)."""
    return [
        json.dumps(list(chunk)),
        repr(window_start_s),
        STATUS_60S_PREFIX,
        LAST_50_PREFIX,
        OVERRIDE_RATE_PREFIX,
        OVERRIDE_RATE_ALIAS_PREFIX,
        LAST_N_STATUSES,
        "*"
        if full_last_statuses is None
        else json.dumps([s for s in chunk if s in full_last_statuses]),
        _EXPECTED_JSON,
        f"{RESIZE_ERRORS}:",
        "" if failure_counters is None else json.dumps([failure_counters.get(s) for s in chunk]),
        BACKOFF_SIGNALS_PREFIX,
        HOSTS_60S_PREFIX,
        ERROR_HOSTS_60S_PREFIX,
    ]


def decode_published(value: Any) -> dict[str, str]:
    """An ``HGETALL crawl_rates`` answer as str -> str; a ``ResponseError`` (the key is not
    a hash) as nothing published: the new leader's first write replaces it whole."""
    if not isinstance(value, dict):
        return {}
    return {_text(field): _text(record) for field, record in value.items()}


def _merged(
    parts: Sequence[ObservedState],
    crawl_delays: Mapping[str, str | None],
    robots_exempt: frozenset[str],
    published: Mapping[str, str] | None = None,
) -> ObservedState:
    """The chunks' readings, the crawl delays and what was published as one reading."""
    # The halted sets come from the last chunk read: the newest of the snapshots.
    return ObservedState(
        halted=parts[-1].halted,
        temp_halted=parts[-1].temp_halted,
        sources={s: state for part in parts for s, state in part.sources.items()},
        failure_counters={s: n for part in parts for s, n in part.failure_counters.items()},
        backoff_signals={s: n for part in parts for s, n in part.backoff_signals.items()},
        crawl_delays=crawl_delays,
        robots_exempt=robots_exempt,
        published=published,
    )


class RedisRegulatorStore:
    """The real ``RegulatorStore``; counts its round trips (``round_trips``)."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._read = redis.register_script(_READ_SCRIPT)
        self._read_delays = redis.register_script(_DELAYS_SCRIPT)
        self._write = redis.register_script(_WRITE_SCRIPT)
        self._acquire = redis.register_script(_ACQUIRE_SCRIPT)
        self._release = redis.register_script(_RELEASE_SCRIPT)
        self.round_trips = 0
        # Each source's PacingInfo as last encoded: the decision hands the same object
        # over while a source's pacing has not changed, and a whole rewrite of crawl_rates
        # then costs no encoding.
        self._encoded: dict[str, tuple[PacingInfo, str]] = {}

    async def read(
        self,
        sources: Sequence[str],
        window_start_s: float,
        *,
        full_last_statuses: Collection[str] | None = None,
        failure_counters: Mapping[str, str] | None = None,
        published: bool = False,
    ) -> ObservedState:
        """Halted sets, 60 s windows, last-50 lists, overrides, failure counters and
        backoff signal counters of ``sources``, the crawl delays, and with ``published``
        crawl_rates: what ``PlainRegulatorStore.read`` answers (its docstring states the
        rule in full).

        The last-50 histogram of every source, or with ``full_last_statuses`` only of
        those sources and of the ones whose last 50 statuses all failed (what the
        permanent breaker needs).

        ``failure_counters`` are the counters as an earlier read answered them: a source
        whose counter has not moved since, and not in ``full_last_statuses``, has neither
        its window nor its last-50 list read (its ``SourceState`` has no histogram). The
        caller passes them only for sources whose window held no error at that read.

        One round trip: a pipeline of one script call per ``READ_CHUNK`` sources, so that
        Redis serves other clients (workers pacing their requests) between chunks instead of
        being held by one long script.
        """
        chunks = [sources[i : i + READ_CHUNK] for i in range(0, len(sources), READ_CHUNK)]
        chunks = chunks or [[]]
        calls = [
            _read_args(chunk, window_start_s, full_last_statuses, failure_counters)
            for chunk in chunks
        ]
        try:
            answers = await self._read_chunks(calls, published=published)
        except NoScriptError:
            # A restarted or flushed Redis forgot the scripts: load them, read again.
            self.round_trips += 1
            await self._redis.script_load(_READ_SCRIPT)
            await self._redis.script_load(_DELAYS_SCRIPT)
            answers = await self._read_chunks(calls, published=published)
        rates = decode_published(answers.pop()) if published else None
        *chunk_answers, delays = answers
        return _merged(
            [decode_observed(raw, chunk) for raw, chunk in zip(chunk_answers, chunks, strict=True)],
            *decode_delays(delays),
            rates,
        )

    async def _read_chunks(self, calls: list[list[Any]], *, published: bool) -> list[Any]:
        """The read scripts' answers, then the crawl delays' (``_DELAYS_SCRIPT``), then
        with ``published`` crawl_rates (a ``ResponseError`` in its place when it is not a
        hash; any other error is raised)."""
        # EVALSHA by hand: redis-py's pipelined Script objects add a SCRIPT EXISTS
        # round trip to every execute.
        self.round_trips += 1
        keys = [HALTED_SET, TEMP_HALTED_SET]
        async with self._redis.pipeline(transaction=False) as pipe:
            for args in calls:
                pipe.evalsha(self._read.sha, len(keys), *keys, *args)
            pipe.evalsha(
                self._read_delays.sha, 2, CRAWL_DELAYED_SET, ROBOTS_EXEMPT_SET, CRAWL_DELAY_PREFIX
            )
            if published:
                pipe.hgetall(RATES_HASH)
            answers = list(await pipe.execute(raise_on_error=False))
        # As execute() would have raised them, but for crawl_rates of the wrong type,
        # which must not stop a new leader from ever taking over.
        for answer in answers[:-1] if published else answers:
            if isinstance(answer, Exception):
                raise answer
        return answers

    async def write(
        self, writes: Writes, pace_rate_ttl_ms: int, lease: LeaderLease | None = None
    ) -> WriteResult:
        """Apply ``writes``; every ``pace_rate:`` key is SET with an expiry of
        ``pace_rate_ttl_ms``, to ``"0"`` for a source in ``halted`` whatever ``writes`` says.

        With a ``lease``, only while its token holds the lease, which is renewed for
        ``lease.ttl_ms`` in the same atomic call; otherwise nothing is written.
        """
        plan = {
            "pace": {s: pace_value(r) for s, r in writes.pace_rates.items()},
            "rates": self._encode_pacing(writes.pacing, whole=writes.pacing_whole),
            "rates_whole": writes.pacing_whole,
            "rates_gone": sorted(writes.pacing_gone),
            "halt": sorted(writes.halt),
            "temp_halt": sorted(writes.temp_halt),
            "lift": sorted(writes.lift_temp_halt),
            "clear_window": sorted(writes.clear_window),
            "forget_delayed": sorted(writes.forget_crawl_delayed),
        }
        applied, value = await self._call(
            self._write,
            [
                HALTED_SET,
                TEMP_HALTED_SET,
                RATES_HASH,
                MONITOR_LEADER_KEY if lease is None else lease.key,
                CRAWL_DELAYED_SET,
            ],
            [
                json.dumps(plan),
                pace_rate_ttl_ms,
                PACE_RATE_PREFIX,
                STATUS_60S_PREFIX,
                "" if lease is None else lease.token,
                0 if lease is None else lease.ttl_ms,
                CRAWL_DELAY_PREFIX,
            ],
        )
        if int(applied):
            return WriteResult(applied=True, paced=int(value))
        return WriteResult(applied=False, holder=_text(value) or None)

    def _encode_pacing(self, pacing: Mapping[str, PacingInfo], *, whole: bool) -> dict[str, str]:
        encoded = self._encoded
        fields = {}
        for source, info in pacing.items():
            known = encoded.get(source)
            if known is not None and known[0] is info:
                fields[source] = known[1]
            else:
                text = info.to_json().decode()
                encoded[source] = (info, text)
                fields[source] = text
        if whole and len(encoded) > len(fields):
            for gone in encoded.keys() - fields.keys():
                del encoded[gone]
        return fields

    async def acquire(self, lease: LeaderLease) -> str | None:
        """Take the lease if nobody holds it; the holder afterwards (None: nobody)."""
        holder = await self._call(self._acquire, [lease.key], [lease.token, lease.ttl_ms])
        return _text(holder) or None

    async def release(self, lease: LeaderLease) -> bool:
        """Give the lease up if ``lease`` holds it (a standby takes it on its next loop)."""
        return bool(await self._call(self._release, [lease.key], [lease.token]))

    async def _call(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        # EVALSHA; redis-py loads the script and retries once after NOSCRIPT.
        self.round_trips += 1
        return await script(keys=keys, args=args)


class PlainRegulatorStore:
    """What each script of ``RedisRegulatorStore`` does, in plain commands, one per key.

    The rules the scripts are the fast path of, written to be read: a test holds each
    script to the same answers and the same writes. Neither atomic nor fast (a round
    trip per key), so not for a loop.
    """

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis

    async def read(
        self,
        sources: Sequence[str],
        window_start_s: float,
        *,
        full_last_statuses: Collection[str] | None = None,
        failure_counters: Mapping[str, str] | None = None,
        published: bool = False,
    ) -> ObservedState:
        """The read (``read.lua`` for the sources, ``delays.lua`` for the crawl delays,
        and with ``published`` every field of ``crawl_rates``, nothing when it is not a
        hash).

        Every source's override, its alias, failure counter and backoff signal counter (a
        key missing or not a string counts as missing). Its 60 s window and its last-N
        list are read when it is asked in full (``full_last_statuses``, None: all) or its
        failure counter is not the one in ``failure_counters`` (None: read all): workers
        bump the counter in the flush that adds a failure to both, so an unmoved counter
        means nothing a breaker acts on has changed. Of what is read, the window's
        histogram is kept only when it holds an error; the last-N histogram when asked in
        full, or when its N statuses all failed (``breakers.every_request_failed``,
        what the permanent breaker needs), and not even looked at when the window holds
        statuses and no error (its newest statuses are in that window). A key of the
        wrong type is reported in ``SourceState.errors``, not fatal. Sources with nothing
        to report are left out of ``sources``.
        """
        states: dict[str, SourceState] = {}
        counters: dict[str, str] = {}
        signals: dict[str, str] = {}
        for source in sources:
            counter = await self._string(resize_errors_key(source))
            counters[source] = counter or ""
            signal = await self._string(backoff_signals_key(source))
            if signal is not None:
                signals[source] = signal
            moved = failure_counters is None or failure_counters.get(source) != counters[source]
            full = full_last_statuses is None or source in full_last_statuses
            state = await self._source(source, window_start_s, full=full, read=full or moved)
            if state is not None:
                states[source] = state
        delayed = sorted(_text(m) for m in await self._redis.smembers(CRAWL_DELAYED_SET))
        return ObservedState(
            halted=await self._members(HALTED_SET),
            temp_halted=await self._members(TEMP_HALTED_SET),
            sources=states,
            failure_counters=counters,
            backoff_signals=_integers(signals),
            crawl_delays={m: await self._string(crawl_delay_key(m)) for m in delayed},
            robots_exempt=await self._members(ROBOTS_EXEMPT_SET),
            published=await self._published() if published else None,
        )

    async def _published(self) -> dict[str, str]:
        try:
            return decode_published(await self._redis.hgetall(RATES_HASH))
        except ResponseError:
            return {}

    async def _source(
        self, source: str, window_start_s: float, *, full: bool, read: bool
    ) -> SourceState | None:
        errors: list[str] = []
        window: dict[str, int] = {}
        last: dict[str, int] = {}
        if read:
            key = f"{STATUS_60S_PREFIX}{source}"
            members = await _checked(
                errors, key, self._redis.zrangebyscore(key, window_start_s, "+inf")
            )
            statuses = Counter(_text(m).partition(":")[0] for m in members)
            if breakers.count_errors(statuses):
                window = dict(statuses)
            healthy = bool(statuses) and not window
            if full or not healthy:
                key = last50_key(source)
                listed = await _checked(errors, key, self._redis.lrange(key, -LAST_N_STATUSES, -1))
                counts = Counter(_text(status) for status in listed)
                if counts and (full or breakers.every_request_failed(counts)):
                    last = dict(counts)
        hosts = failing = 0
        if window or last:
            hosts = await self._count(errors, hosts60s_key(source), window_start_s)
            failing = await self._count(errors, error_hosts60s_key(source), window_start_s)
        override = await self._string(override_key(source))
        alias = await self._string(override_alias_key(source))
        if not (window or last or errors) and override is None and alias is None:
            return None
        return SourceState(window, last, override, alias, tuple(errors), hosts, failing)

    async def _count(self, errors: list[str], key: str, since: float) -> int:
        """Members of a sorted set scored ``since`` or later; 0, and the error noted, when
        the key is of the wrong type."""
        try:
            return int(await self._redis.zcount(key, since, "+inf"))
        except ResponseError as e:
            errors.append(f"{key}: {e}")
            return 0

    async def _string(self, key: str) -> str | None:
        """A string key's value; None when it is missing or not a string."""
        try:
            value = await self._redis.get(key)
        except ResponseError:
            return None
        return None if value is None else _text(value)

    async def _members(self, key: str) -> frozenset[str]:
        return frozenset(_text(m) for m in await self._redis.smembers(key))

    async def write(
        self, writes: Writes, pace_rate_ttl_ms: int, lease: LeaderLease | None = None
    ) -> WriteResult:
        """The write (``write.lua``): with a ``lease``, nothing unless its token holds the
        lease, which is renewed first. Then the halted sets, the windows cleared, the
        crawl_delayed members whose key is still missing removed, crawl_rates (replaced
        with ``pacing_whole``), and last every ``pace_rate:`` key with an expiry of
        ``pace_rate_ttl_ms``, to "0" for a source in ``halted`` whatever ``writes`` says."""
        redis = self._redis
        if lease is not None and lease.token:
            holder = await redis.get(lease.key)
            if holder is None or _text(holder) != lease.token:
                return WriteResult(applied=False, holder=_text(holder) or None)
            await redis.pexpire(lease.key, lease.ttl_ms)
        for source in writes.halt:
            await redis.sadd(HALTED_SET, source)
        for source in writes.temp_halt:
            await redis.sadd(TEMP_HALTED_SET, source)
        for source in writes.lift_temp_halt:
            await redis.srem(TEMP_HALTED_SET, source)
        for source in writes.clear_window:
            await redis.delete(f"{STATUS_60S_PREFIX}{source}")
        for source in writes.forget_crawl_delayed:
            if not await redis.exists(crawl_delay_key(source)):
                await redis.srem(CRAWL_DELAYED_SET, source)
        if writes.pacing_whole:
            await redis.delete(RATES_HASH)
        for source, info in writes.pacing.items():
            await redis.hset(RATES_HASH, source, info.to_json().decode())
        for source in writes.pacing_gone:
            await redis.hdel(RATES_HASH, source)
        halted = await self._members(HALTED_SET)
        for source, rate_rps in writes.pace_rates.items():
            value = "0" if source in halted else pace_value(rate_rps)
            await redis.set(pace_rate_key(source), value, px=pace_rate_ttl_ms)
        return WriteResult(applied=True, paced=len(writes.pace_rates))

    async def acquire(self, lease: LeaderLease) -> str | None:
        """Take the lease (``lease_acquire.lua``) if nobody holds it; the holder
        afterwards (None: nobody)."""
        if await self._redis.set(lease.key, lease.token, nx=True, px=lease.ttl_ms):
            return lease.token
        return _text(await self._redis.get(lease.key)) or None

    async def release(self, lease: LeaderLease) -> bool:
        """Give the lease up (``lease_release.lua``) if ``lease`` holds it."""
        if _text(await self._redis.get(lease.key)) != lease.token:
            return False
        return bool(await self._redis.delete(lease.key))


async def _checked(errors: list[str], key: str, reading: Awaitable[Any]) -> list[Any]:
    """What ``reading`` of ``key`` answers; nothing, and the error noted, when the key is
    of the wrong type."""
    try:
        return list(await reading)
    except ResponseError as e:
        errors.append(f"{key}: {e}")
        return []
