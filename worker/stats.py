"""Outcome statistics in Redis, exactly as the contract's key table says.

Every outcome adds its status to the 60 s / 1 h / 12 h sliding windows (trimmed as they
go) and to the last-50 list, and bumps the success or failure counters, and
``backoff_signals:{source}`` when it was a backoff signal (in the same atomic flush as
the failure counter, which the monitor relies on: see crawl_monitor.store). ``record``
returns once its outcome is stored, so a caller may commit the message behind it.

Writes cost CPU per Redis command (redis-py packs each command and reads each reply in
Python), so outcomes queue and are flushed together, at most every ``min_interval_s`` (at
once when nothing was flushed for longer), and a flush is one call of a Lua script
(``lua/stats_flush.lua``) that writes per key, not per outcome: one trim and one ZADD per
window, one RPUSH and LTRIM per last-N list, one INCRBY per counter, one SADD of the
per-status error counters' names to their index (image_crawler/error_reasons.py), the
batch going as one JSON argument. Redis ends up as if each outcome had been written on
its own, one command at a time: ``flush_commands`` states that rule, and
test/worker/test_lua_twins.py holds the script to it. The script also makes each flush
atomic. The breakers read the windows about once a second, so a flush that comes up to
``min_interval_s`` later is soon enough; a message is committed up to that much later
too.

Counting is at least once. A write that timed out (Redis stopped answering) may still be
run by Redis when it comes back, before or after the retry: the counters and the last-50
list then count that batch twice, as they count a message twice that is processed again
after a worker crash. The windows, which the breakers read, do not: each outcome's
member ``"{status}:{time}"`` is fixed when it is recorded, so writing it again adds
nothing.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple, Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from image_crawler.contract import (
    BACKOFF_STATUSES,
    ERROR_REASONS_SET,
    EXPECTED_STATUSES,
    LAST_N_STATUSES,
    NUM_MALFORMED,
    NUM_RESIZED,
    RECHECKS_HASH,
    RESIZE_ERRORS,
    SPREAD_HOSTS_KEPT,
    SPREAD_KEYS_TTL_S,
    STATUS_WINDOWS,
    Status,
    backoff_signals_key,
    error_hosts60s_key,
    hosts60s_key,
    last50_key,
    num_resized_key,
    rechecks_field,
    resize_errors_key,
    window_member,
)
from image_crawler.logs import get_logger
from image_crawler.lua import lua_script
from image_crawler.retry import Backoff
from worker.sinks.base import Outage

log = get_logger(__name__)


_FLUSH_SCRIPT: Final = lua_script("worker", "stats_flush.lua")

# The sets of hosts keep the last minute, as the breakers' window does.
SPREAD_WINDOW_S: Final = 60.0

# While Redis is away outcomes wait (their messages are not committed): asked again soon,
# as it is mostly a brief blip (a failover, a restart), and no more often than this once
# it lasts.
REDIS_RETRY_BASE_S: Final = 0.1
REDIS_RETRY_CAP_S: Final = 5.0


class QueuedOutcome(NamedTuple):
    """An outcome waiting to be written: its ``source`` (None for a malformed message),
    ``status``, whether it was a ``backoff`` signal, the Unix time it was recorded ``at``,
    and the future resolved once it is stored. With ``check`` set, it is a re-check's
    verdict instead (``status`` is then that verdict): counted in RECHECKS_HASH, outside
    the windows and the counters. ``host``: the host (politeness key) that answered, for
    the breakers' count of hosts (None: not known)."""

    source: str | None
    status: str
    backoff: bool
    at: float
    stored: asyncio.Future[None]
    check: bool = False
    host: str | None = None


# Successes: a 304 is the answer a re-check hopes for.
_SUCCESSES: Final = frozenset({Status.OK, Status.NOT_MODIFIED})


def counted_keys(source: str | None, status: str, backoff: bool) -> tuple[str, ...]:
    """The counters one outcome adds 1 to."""
    if source is None:
        return (NUM_MALFORMED,)
    if status in _SUCCESSES:
        keys: tuple[str, ...] = (NUM_RESIZED, num_resized_key(source))
    else:
        keys = (RESIZE_ERRORS, resize_errors_key(source), resize_errors_key(source, status))
    return (*keys, backoff_signals_key(source)) if backoff else keys


def host_error(status: str) -> bool:
    """An outcome that tells against its host, for the breakers' count of failing hosts:
    an error (not an expected status) other than a backoff status (a server asking for
    a lower rate, which its host's pace gives it)."""
    return status not in EXPECTED_STATUSES and status not in BACKOFF_STATUSES


def reason_key(source: str | None, status: str) -> str | None:
    """The per-status error counter one outcome adds 1 to, which goes into the index of
    those counters (ERROR_REASONS_SET, image_crawler/error_reasons.py); None: none."""
    if source is None or status in _SUCCESSES:
        return None
    return resize_errors_key(source, status)


def spread_keys(source: str, status: str, host: str | None) -> tuple[str, ...]:
    """The sorted sets of hosts one outcome with a known ``host`` goes into."""
    if host is None:
        return ()
    if host_error(status):
        return (hosts60s_key(source), error_hosts60s_key(source))
    return (hosts60s_key(source),)


def flush_commands(
    batch: Sequence[QueuedOutcome], last_n: int = LAST_N_STATUSES
) -> list[tuple[str, ...]]:
    """The writes of a flush, as the Redis commands that record each outcome of ``batch``
    in turn, one at a time: the rule ``lua/stats_flush.lua`` is the fast path of.

    An outcome adds its member ``"{status}:{time}"``, scored by its time, to each of its
    source's windows and its status to the source's last-N list (trimmed to the newest
    ``last_n``), its host (when known) to its source's sets of hosts (``spread_keys``:
    scored by its time, trimmed like a window of ``SPREAD_WINDOW_S`` and to the newest
    ``SPREAD_HOSTS_KEPT``, expiring ``SPREAD_KEYS_TTL_S`` later), adds 1 to each of
    its counters (``counted_keys``) and its per-status error counter's name to
    ERROR_REASONS_SET (``reason_key``); a re-check's
    verdict (``check``) only adds 1 to its field of RECHECKS_HASH. A window drops
    what fell out of it once a flush, just before the flush's first outcome of that
    window is added, by that outcome's time: a batch queued while Redis was away may span
    more than a window, and none of its own outcomes is dropped.
    """
    commands: list[tuple[str, ...]] = []
    trimmed: set[str] = set()
    for source, status, backoff, at, _, check, host in batch:
        if check:
            assert source is not None
            commands.append(("HINCRBY", RECHECKS_HASH, rechecks_field(source, status), "1"))
            continue
        if source is not None:
            for prefix, window_s in STATUS_WINDOWS:
                key = f"{prefix}{source}"
                if key not in trimmed:
                    trimmed.add(key)
                    commands.append(("ZREMRANGEBYSCORE", key, "-inf", repr(at - window_s)))
                commands.append(("ZADD", key, repr(at), window_member(status, at)))
            last = last50_key(source)
            commands += [("RPUSH", last, status), ("LTRIM", last, str(-last_n), "-1")]
            for key in spread_keys(source, status, host):
                if key not in trimmed:
                    trimmed.add(key)
                    commands.append(("ZREMRANGEBYSCORE", key, "-inf", repr(at - SPREAD_WINDOW_S)))
                commands += [
                    ("ZADD", key, repr(at), str(host)),
                    ("ZREMRANGEBYRANK", key, "0", str(-SPREAD_HOSTS_KEPT - 1)),
                    ("EXPIRE", key, str(SPREAD_KEYS_TTL_S)),
                ]
        commands += [("INCR", key) for key in counted_keys(source, status, backoff)]
        reason = reason_key(source, status)
        if reason is not None:
            commands.append(("SADD", ERROR_REASONS_SET, reason))
    return commands


class StatsRecorder(Protocol):
    async def record(
        self, source: str, status: str, *, backoff: bool = False, host: str | None = None
    ) -> None:
        """Store one outcome of ``source``; "200" and "304" are successes, anything else
        not.
        ``backoff``: the response asked us to slow down (counted for the monitor).
        ``host``: the host that answered (its politeness key), for the breakers."""
        ...

    async def record_malformed(self) -> None: ...

    async def record_check(self, source: str, check: str) -> None:
        """Count one re-check of ``source`` that found ``check`` (RECHECK_STATUSES)."""
        ...


class RedisStats:
    """Batches outcomes into pipelined writes; retries while Redis is away."""

    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        clock: Callable[[], float] = time.time,
        min_interval_s: float = 0.2,
    ) -> None:
        # EVALSHA; a Redis that forgot the script (restarted, flushed) is sent it again.
        self._flush_script = redis.register_script(_FLUSH_SCRIPT)
        self._clock = clock
        self._min_interval_s = min_interval_s
        self._pending: list[QueuedOutcome] = []
        self._wake = asyncio.Event()
        self._last_time = 0.0
        self._retry = Backoff(base_s=REDIS_RETRY_BASE_S, cap_s=REDIS_RETRY_CAP_S)
        self._outage = Outage(
            "redis_unavailable", "redis_recovered", dependency="redis", op="record_stats"
        )

    async def record(
        self, source: str, status: str, *, backoff: bool = False, host: str | None = None
    ) -> None:
        await self._enqueue(source, status, backoff, host=host)

    async def record_malformed(self) -> None:
        await self._enqueue(None, "", False)

    async def record_check(self, source: str, check: str) -> None:
        await self._enqueue(source, check, False, check=True)

    async def _enqueue(
        self,
        source: str | None,
        status: str,
        backoff: bool,
        *,
        check: bool = False,
        host: str | None = None,
    ) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Stamped now, not when written: a batch written twice (a timed-out write that
        # Redis still ran, then the retry) adds the same window members, not new ones.
        stamp = self._timestamp()
        self._pending.append(QueuedOutcome(source, status, backoff, stamp, future, check, host))
        self._wake.set()
        # Not shielded: a caller cancelled meanwhile cancels its own future, which ``run``
        # then leaves alone; its outcome is written all the same.
        await future

    async def run(self) -> None:
        """Flush pending outcomes until cancelled."""
        last_flush_started = -math.inf
        while True:
            await self._wake.wait()
            # Outcomes that arrive soon after a flush wait for the interval to pass, to be
            # written together: fewer, larger flushes cost less CPU per outcome.
            delay_s = last_flush_started + self._min_interval_s - time.monotonic()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            self._wake.clear()
            batch, self._pending = self._pending, []
            last_flush_started = time.monotonic()
            await self._store(batch)
            for outcome in batch:
                if not outcome.stored.done():
                    outcome.stored.set_result(None)

    async def _store(self, batch: list[QueuedOutcome]) -> None:
        """Flush ``batch`` until Redis takes it: while Redis is away, outcomes wait."""
        while True:
            try:
                await self._flush(batch)
            except RedisError as e:
                self._outage.report(error=repr(e))
                await asyncio.sleep(self._retry.next_s())
            else:
                self._retry.reset()
                self._outage.end()
                return

    def _timestamp(self) -> float:
        # Window members are "{status}:{time}"; strictly increasing times keep two equal
        # statuses of this process from collapsing into one sorted-set member. On the
        # microsecond grid, as the member shows 6 decimals: a Unix time's float is only
        # good to ~0.2 us, so two times 1 us apart off the grid could print the same.
        now = round(max(self._clock(), self._last_time + 1e-6), 6)
        self._last_time = now
        return now

    async def _flush(self, batch: list[QueuedOutcome]) -> None:
        """Write ``batch`` by ``flush_commands``' rule, grouped by key, in one script call."""
        if not batch:
            return
        # window key -> [key, trim score, [score, member, ...]]: each window trimmed by its
        # first outcome's time, before the ZADD (see flush_commands).
        windows: dict[str, list[Any]] = {}
        hosts: dict[str, list[Any]] = {}  # the same, for the sets of hosts
        statuses: defaultdict[str, list[str]] = defaultdict(list)
        counts: Counter[str] = Counter()
        reasons: set[str] = set()
        checks: Counter[str] = Counter()
        for source, status, backoff, now, _, check, host in batch:
            if check:
                assert source is not None
                checks[rechecks_field(source, status)] += 1
                continue
            counts.update(counted_keys(source, status, backoff))
            reason = reason_key(source, status)
            if reason is not None:
                reasons.add(reason)
            if source is None:
                continue
            score = repr(now)
            member = window_member(status, now)
            for prefix, window_s in STATUS_WINDOWS:
                key = f"{prefix}{source}"
                window = windows.get(key)
                if window is None:
                    window = windows[key] = [key, repr(now - window_s), []]
                window[2] += (score, member)
            for key in spread_keys(source, status, host):
                window = hosts.get(key)
                if window is None:
                    window = hosts[key] = [key, repr(now - SPREAD_WINDOW_S), []]
                window[2] += (score, host)
            statuses[source].append(status)
        document = json.dumps(
            {
                "w": list(windows.values()),
                "z": list(hosts.values()),
                "l": [[last50_key(source), values] for source, values in statuses.items()],
                "c": counts,
                "r": [ERROR_REASONS_SET, sorted(reasons)],
                "h": [[RECHECKS_HASH, checks]] if checks else [],
            }
        )
        await self._flush_script(
            args=(document, LAST_N_STATUSES, SPREAD_HOSTS_KEPT, SPREAD_KEYS_TTL_S)
        )
