"""The regulator's Redis seam: one round trip to read a loop's state, one to write it.

With thousands of sources, one command per source and key is too slow even pipelined
(redis-py spends ~1 s encoding and parsing 50,000 commands). So each direction is a
single Lua script call whose argument and answer are one JSON document each: Redis
walks the sources, Python parses one string. The scripts only gather and apply; every
decision is made in Python. Key prefixes come from ``image_crawler.contract``.

Reading is one pipeline of script calls, ``READ_CHUNK`` sources each, so that a long
read never holds Redis for long, and one more for the robots.txt crawl delays (the
``crawl_delayed`` and ``robots_exempt`` sets and the members' ``crawl_delay:`` keys);
each call is a consistent snapshot of what it reads, writing is one atomic script. Keys
are built inside the scripts, which is fine for a single Redis server (not for Redis
Cluster).

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
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final, Protocol

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from image_crawler.contract import (
    BACKOFF_SIGNALS_PREFIX,
    CRAWL_DELAY_PREFIX,
    CRAWL_DELAYED_SET,
    EXPECTED_STATUSES,
    HALTED_SET,
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
)

# KEYS: halted, temp_halted.
# ARGV: JSON list of sources, window start (Unix s), then the key prefixes of the 60 s
# window, the last-N list, both override keys, N, the JSON list of sources whose full
# last-N histogram is wanted ("*": all; the others get one only when their last N
# statuses all failed), the JSON list of expected statuses, the prefix of the failure
# counters, the JSON list of each source's failure counter as last seen ("" when it
# was missing, null when not known; the whole argument "": none known), and the prefix of
# the backoff signal counters.
# A source whose counter is as last seen, and not asked in full, is not read: workers
# bump the counter in the same atomic flush that adds a failure to the window and the
# last-N list, so neither holds a failure the caller has not seen.
# Answers JSON {"h": halted, "t": temp_halted, "c": [each source's failure counter, ""
# when missing], "b": {source: backoff signal counter, of the sources that have one},
# "s": {source: {"w": window histogram (only when it holds an error),
# "l": last-N histogram, "o": override, "a": alias, "x": [errors]}}}, sources with
# nothing to report left out. A key of the wrong type is reported in "x", not fatal.
_READ_SCRIPT: Final = """
local sources = cjson.decode(ARGV[1])
local since = ARGV[2]
local window_prefix, last_prefix = ARGV[3], ARGV[4]
local override_prefix, alias_prefix = ARGV[5], ARGV[6]
local n = tonumber(ARGV[7])
local full_all, full_for = ARGV[8] == '*', {}
if not full_all then
  for _, source in ipairs(cjson.decode(ARGV[8])) do full_for[source] = true end
end
local expected = {}
for _, status in ipairs(cjson.decode(ARGV[9])) do expected[status] = true end
local counter_prefix = ARGV[10]
local seen_counters = ARGV[11] ~= '' and cjson.decode(ARGV[11]) or nil
local backoff_prefix = ARGV[12]
local pcall_redis, find, sub = redis.pcall, string.find, string.sub

-- Keys of the current source that could not be read (e.g. of the wrong type).
local problems = {}
local function call(command, key, ...)
  local reply = pcall_redis(command, key, ...)
  if type(reply) == 'table' and reply.err then
    problems[#problems + 1] = key .. ': ' .. reply.err
    return nil
  end
  return reply
end

-- Status -> count, and whether any status is not an expected one.
local function histogram(items, strip_time)
  local counts, failed = {}, false
  for i = 1, #items do
    local status = items[i]
    if strip_time then
      local colon = find(status, ':', 1, true)
      if colon then status = sub(status, 1, colon - 1) end
    end
    counts[status] = (counts[status] or 0) + 1
    if not expected[status] then failed = true end
  end
  return counts, failed
end

-- A last-N histogram; most lists hold one status only, counted without a table walk.
local function list_histogram(items)
  local first = items[1]
  if first == nil then return nil end
  for i = 2, #items do
    if items[i] ~= first then return (histogram(items, false)) end
  end
  return {[first] = #items}
end

-- Whether the last n statuses are n failures: newest first, so a healthy source
-- answers at its first status.
local function all_failed(key)
  local newest = call('LINDEX', key, -1)
  if not newest or expected[newest] then return false end
  if not pcall_redis('LINDEX', key, -n) then return false end  -- fewer than n
  for i = -2, -n, -1 do
    if expected[pcall_redis('LINDEX', key, i)] then return false end
  end
  return true
end

-- The overrides, failure counters and backoff signal counters of every source in one
-- MGET (a key missing or not a string is false): one call instead of one per source.
-- 4 keys a source: READ_CHUNK keeps them under unpack's limit.
local mget_keys = {}
for i, source in ipairs(sources) do
  local k = 4 * i
  mget_keys[k - 3] = override_prefix .. source
  mget_keys[k - 2] = alias_prefix .. source
  mget_keys[k - 1] = counter_prefix .. source
  mget_keys[k] = backoff_prefix .. source
end
local values = #mget_keys > 0 and redis.call('MGET', unpack(mget_keys)) or {}

local found, counters, backoff = {}, {}, {}
for i, source in ipairs(sources) do
  local entry = nil
  local k = 4 * i
  local counter = values[k - 1] or ''
  counters[i] = counter
  if values[k] then backoff[source] = values[k] end
  local full = full_all or full_for[source]
  -- No failure since the caller last looked (and not asked in full): nothing a breaker
  -- acts on can have changed, so neither key is read. Busy, healthy sources end here.
  if full or seen_counters == nil or seen_counters[i] ~= counter then
    -- A window of expected statuses only, and at least one, means the newest statuses
    -- are not 50 failures: the permanent breaker's check is skipped (below).
    local healthy = false
    local window = call('ZRANGEBYSCORE', window_prefix .. source, since, '+inf')
    if window and #window > 0 then
      -- Most windows are all "200:{time}": one 4-byte compare a member (interned, so no
      -- new string). A window without an error can neither trip nor keep a temporary
      -- halt: it is left out, and with it most busy sources' whole entry.
      healthy = true
      for j = 1, #window do
        if sub(window[j], 1, 4) ~= '200:' then healthy = false break end
      end
      if not healthy then
        local counts, failed = histogram(window, true)
        if failed then entry = {w = counts} else healthy = true end
      end
    end
    local last_key = last_prefix .. source
    if full or (not healthy and all_failed(last_key)) then
      local last = call('LRANGE', last_key, -n, -1)
      if last then
        local counts = list_histogram(last)
        if counts then
          entry = entry or {}
          entry.l = counts
        end
      end
    end
  end
  local override, alias = values[k - 3], values[k - 2]
  if override or alias or #problems > 0 then
    entry = entry or {}
    if override then entry.o = override end
    if alias then entry.a = alias end
    if #problems > 0 then
      entry.x = problems
      problems = {}
    end
  end
  if entry then found[source] = entry end
end
return cjson.encode({
  h = redis.call('SMEMBERS', KEYS[1]),
  t = redis.call('SMEMBERS', KEYS[2]),
  c = counters,
  b = backoff,
  s = found,
})
"""

# KEYS: crawl_delayed, robots_exempt. ARGV: the crawl_delay key prefix.
# Answers JSON {"d": {crawl_delayed member: its crawl_delay value, false when the key is
# missing or not a string}, "e": robots_exempt members}: the members' keys in one MGET,
# without a round trip in between; JSON, as the read script, because redis-py parses one
# string several times faster than thousands of replies. Once a loop, in the read's
# pipeline.
_DELAYS_SCRIPT: Final = """
local members = redis.call('SMEMBERS', KEYS[1])
local delays = {}
if #members > 0 then
  local keys = {}
  for i, source in ipairs(members) do keys[i] = ARGV[1] .. source end
  -- unpack's limit is 8,000 values: MGET in slices.
  for i = 1, #keys, 4000 do
    local values = redis.call('MGET', unpack(keys, i, math.min(i + 3999, #keys)))
    for j = 1, #values do delays[members[i + j - 1]] = values[j] end
  end
end
return cjson.encode({d = delays, e = redis.call('SMEMBERS', KEYS[2])})
"""

# KEYS: halted, temp_halted, crawl_rates, monitor_leader.
# ARGV: JSON plan {"pace": {source: "rate"}, "rates": {source: PacingInfo JSON},
# "rates_whole": bool, "rates_gone": [...], "halt": [...], "temp_halt": [...],
# "lift": [...], "clear_window": [...], "forget_delayed": [...]}, the pace_rate TTL (ms),
# the pace_rate prefix, the window prefix, the writer's lease token ("" when it runs
# without a lease), the lease's TTL (ms) and the crawl_delay prefix; KEYS[5]: crawl_delayed.
# A source in `halted` when this runs gets "0" whatever the plan says. A source of
# "forget_delayed" leaves crawl_delayed only if its crawl_delay key is still missing: a
# worker may have set it (and SADDed) since the read.
# crawl_rates gets the fields of "rates" and loses those of "rates_gone"; with
# "rates_whole" it is replaced by "rates". Answers {1, pace_rate keys set}, or {0, holder}
# with nothing written when the lease is not the writer's (holder "" when nobody holds
# it); the writer's lease is renewed first.
_WRITE_SCRIPT: Final = """
local plan = cjson.decode(ARGV[1])
local ttl, pace_prefix, window_prefix = ARGV[2], ARGV[3], ARGV[4]
local token, lease_ms = ARGV[5], ARGV[6]
if token ~= '' then
  local holder = redis.call('GET', KEYS[4])
  if holder ~= token then return {0, holder or ''} end
  redis.call('PEXPIRE', KEYS[4], lease_ms)
end
for _, source in ipairs(plan.halt) do redis.call('SADD', KEYS[1], source) end
for _, source in ipairs(plan.temp_halt) do redis.call('SADD', KEYS[2], source) end
for _, source in ipairs(plan.lift) do redis.call('SREM', KEYS[2], source) end
for _, source in ipairs(plan.clear_window) do redis.call('DEL', window_prefix .. source) end
for _, source in ipairs(plan.forget_delayed) do
  if redis.call('EXISTS', ARGV[7] .. source) == 0 then redis.call('SREM', KEYS[5], source) end
end
if plan.rates_whole then redis.call('DEL', KEYS[3]) end
-- A thousand fields a call: one HSET per source costs far more, and unpack has a limit.
local fields, count = {}, 0
for source, info in pairs(plan.rates) do
  fields[count + 1], fields[count + 2] = source, info
  count = count + 2
  if count == 2000 then
    redis.call('HSET', KEYS[3], unpack(fields, 1, count))
    count = 0
  end
end
if count > 0 then redis.call('HSET', KEYS[3], unpack(fields, 1, count)) end
local gone = plan.rates_gone
for i = 1, #gone, 1000 do
  redis.call('HDEL', KEYS[3], unpack(gone, i, math.min(i + 999, #gone)))
end
local halted = {}
for _, source in ipairs(redis.call('SMEMBERS', KEYS[1])) do halted[source] = true end
local set = 0
for source, rate in pairs(plan.pace) do
  if halted[source] then rate = '0' end
  redis.call('SET', pace_prefix .. source, rate, 'PX', ttl)
  set = set + 1
end
return {1, set}
"""

# KEYS: monitor_leader. ARGV: token, lease TTL (ms). Takes the lease when nobody holds it;
# answers the holder afterwards (the token itself when taken, or already held).
_ACQUIRE_SCRIPT: Final = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return ARGV[1] end
return redis.call('GET', KEYS[1])
"""

# KEYS: monitor_leader. ARGV: token. Deletes the lease only if it is the token's.
_RELEASE_SCRIPT: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


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
    ) -> ObservedState: ...

    async def write(
        self, writes: Writes, token_ttl_ms: int, lease: LeaderLease | None = None
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
    ) -> ObservedState:
        """Halted sets, 60 s windows, last-50 lists, overrides, failure counters and
        backoff signal counters of ``sources``.

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
        calls = [
            [
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
                ""
                if failure_counters is None
                else json.dumps([failure_counters.get(s) for s in chunk]),
                BACKOFF_SIGNALS_PREFIX,
            ]
            for chunk in chunks or [[]]
        ]
        keys = [HALTED_SET, TEMP_HALTED_SET]
        try:
            *answers, delays = await self._read_chunks(keys, calls)
        except NoScriptError:
            # A restarted or flushed Redis forgot the scripts: load them, read again.
            self.round_trips += 1
            await self._redis.script_load(_READ_SCRIPT)
            await self._redis.script_load(_DELAYS_SCRIPT)
            *answers, delays = await self._read_chunks(keys, calls)
        observed = [
            decode_observed(raw, chunk) for raw, chunk in zip(answers, chunks or [[]], strict=True)
        ]
        crawl_delays, robots_exempt = decode_delays(delays)
        # The halted sets come from the last chunk read: the newest of the snapshots.
        return ObservedState(
            halted=observed[-1].halted,
            temp_halted=observed[-1].temp_halted,
            sources={s: state for part in observed for s, state in part.sources.items()},
            failure_counters={s: n for part in observed for s, n in part.failure_counters.items()},
            backoff_signals={s: n for part in observed for s, n in part.backoff_signals.items()},
            crawl_delays=crawl_delays,
            robots_exempt=robots_exempt,
        )

    async def _read_chunks(self, keys: list[str], calls: list[list[Any]]) -> list[Any]:
        """The read scripts' answers, then the crawl delays' (``_DELAYS_SCRIPT``)."""
        # EVALSHA by hand: redis-py's pipelined Script objects add a SCRIPT EXISTS
        # round trip to every execute.
        self.round_trips += 1
        async with self._redis.pipeline(transaction=False) as pipe:
            for args in calls:
                pipe.evalsha(self._read.sha, len(keys), *keys, *args)
            pipe.evalsha(
                self._read_delays.sha, 2, CRAWL_DELAYED_SET, ROBOTS_EXEMPT_SET, CRAWL_DELAY_PREFIX
            )
            return list(await pipe.execute())

    async def write(
        self, writes: Writes, token_ttl_ms: int, lease: LeaderLease | None = None
    ) -> WriteResult:
        """Apply ``writes``; every ``pace_rate:`` key is SET with an expiry of
        ``token_ttl_ms``, to ``"0"`` for a source in ``halted`` whatever ``writes`` says.

        With a ``lease``, only while its token holds the lease, which is renewed for
        ``lease.ttl_ms`` in the same atomic call; otherwise nothing is written.
        """
        plan = {
            # "0", not "0.0": what operators type, and what `image-crawler halt` writes.
            "pace": {s: repr(r) if r > 0.0 else "0" for s, r in writes.pace_rates.items()},
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
                token_ttl_ms,
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
