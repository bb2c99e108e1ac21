"""Pacing: when each request to a host may start, agreed by every worker through Redis.

A generic cell rate algorithm (GCRA) on two levels. The monitor keeps
``pace_rate:{source}`` at the source's rate; the source has one theoretical arrival time,
``pace_next:{source}``, and so has each of its hosts, in its hash
``pace_host:{source}:{host}`` (worker/politeness/hosts.py says what else the hash holds:
the host's adaptive rate, Crawl-delay and breaker). A request to a host starts only in a
slot of both: at the later of the two next slots, which each move on past it, by
``1 / rate`` for the source and by the host's interval for the host. The source's rate is
the ceiling of all its hosts together; each host is paced, backed off and halted on its
own. An idle source or host starts from Redis' ``TIME``, never from the past, so nothing
is caught up in a burst.

A worker asks for all its waiting requests of every due host in one script call
(``lua/pacing_acquire.lua``), with what it saw of each host's answers since it last
asked (``report``: they move the host's rate and breaker there, at no extra round trip),
and is granted the slots that fall within ``horizon_s`` of now, each with its start
time: it starts each request at its slot, and asks again when the next slot comes within
the horizon. Hosts of one source share its slots in turn, one per pass. Granting a
little ahead is what keeps a backlogged source at its full rate (an ask that reaches
Redis after the slot it was meant for would otherwise push every later slot back by the
delay); it is also how long a request granted before a halt or a Retry-After may still
start. Which hosts to ask about is kept in a heap of due times, so that a wake-up costs
what is due, not what waits.

A slot is a time, not a token: one that the worker reaches late (its event loop was
busy) by more than ``late_limit`` of its interval is given up, and its request asks
again. Started late, it would land next to the following slot, granted to this worker
or another, and two requests would go out together. The limit is ``LATE_SHARE`` (5 %)
of the interval or ``LATE_FLOOR_S`` (10 ms, a busy loop's ordinary lag) when that is
more, never more than half the interval, and never under ``MIN_LATENESS_S``: above
250 requests/s the interval nears the event loop's own timing, and slots a few
microseconds late would all be given up. A host asking a Crawl-delay, or paced at 2/s
or slower, thus gets its requests no closer than 95 % of its interval (and a
Crawl-delay's interval is the delay over 0.95, hosts.py); one at 8/s no closer than
115 ms. Half an interval, the limit before, let a host at 8/s get two requests 63 ms
apart, and the fault campaign's windows of 0.1 s (a bound of one request at 8/s) saw it.
Nor, for intervals under ``PAST_JUDGED_FROM_S`` (50 requests/s and faster), is the time
before the answer was read (a slot already past then is started at once, or a host whose
interval is shorter than a round trip would never start a request); a longer interval's
slot is judged by it too. Otherwise workers whose loops stalled while their answers came
start their past slots together: the fault campaign, on two cores starved by a dozen
processes, saw three requests of a source at 10/s within 36 ms.
Slot times are placed on the worker's clock by Redis' own clock when the two agree within
the ask's round trip, else at the middle of the round trip (``redis_loop_time``).

Fail closed: without a rate (no monitor: the key expired; a halted source: "0") nothing
is granted, and the worker asks again after ``no_rate_retry_s``. A server's Retry-After
pushes the host's next slot forward (``pause``), which holds every worker's requests to
that host until then. A host halted by its breaker is asked about again when its halt
ends, one an operator halted every ``operator_poll_s``; the requests of a host given up
(``HostUnavailable``) end with that status.

The rule is stated in Python by worker/politeness/hosts.py (``decide_source``,
``noted``); the Lua scripts in ``lua/`` are its fast path, and
test/worker/test_lua_twins.py holds both to the same answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import itertools
import json
import math
import time
import weakref
from collections import Counter, deque
from collections.abc import Awaitable
from typing import Any, Final, Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from image_crawler.contract import (
    HOST_RATE_PREFIX,
    PACE_HOST_PREFIX,
    PACE_NEXT_PREFIX,
    PACE_RATE_PREFIX,
    Status,
    pace_host_key,
)
from image_crawler.lifecycle import cancel_and_wait
from image_crawler.logs import get_logger
from image_crawler.lua import lua_script
from image_crawler.retry import Backoff
from worker.metrics import SLOTS_LATE
from worker.politeness.hosts import (
    DELAY_SHARE,
    FAILED,
    FLAG_GONE,
    FLAG_HALTED,
    FLAG_OPERATOR,
    NO_REPORT,
    HostKey,
    HostReport,
    HostSettings,
    answer_kind,
)
from worker.sinks.base import Outage

log = get_logger(__name__)

_ACQUIRE_SCRIPT: Final = lua_script("worker.politeness", "pacing_acquire.lua")

_NOTE_SCRIPT: Final = lua_script("worker.politeness", "host_note.lua")


DEFAULT_HOSTS: Final = HostSettings()

# Hosts whose interval is remembered (about 100 bytes each).
INTERVALS_KEPT: Final = 100_000

# Slots this late or less are always started; a slot later than LATE_SHARE of its
# interval, or LATE_FLOOR_S when that is more, but at most half of it, is given up (see
# the module's docstring and ``late_limit``).
MIN_LATENESS_S: Final = 0.002
LATE_FLOOR_S: Final = 0.01
# From this interval on, a slot already past when its answer is read is judged too.
PAST_JUDGED_FROM_S: Final = 0.02
# After this many slots of a host given up in a row for lateness, the next starts late.
MAX_LATE_IN_ROW: Final = 3
LATE_SHARE: Final = 1 - DELAY_SHARE


def late_limit(interval_s: float) -> float:
    """How late a slot of a host paced ``interval_s`` apart may still be started."""
    return max(MIN_LATENESS_S, min(interval_s / 2, max(interval_s * LATE_SHARE, LATE_FLOOR_S)))


def redis_loop_time(
    sent: float, received: float, wall_offset: float, redis_unix: float | None
) -> float:
    """The loop time at which Redis ran the script, asked at loop time ``sent`` and
    answered at ``received``: Redis' own clock (``redis_unix``) on this loop's clock
    (``time.time() - loop.time()`` is ``wall_offset``) when that falls within the round
    trip, as it does when both clocks agree (one machine, or NTP's few milliseconds on
    a round trip longer than that); else the round trip's middle, within half of it.

    The middle alone errs by up to half the round trip: a worker whose loop was busy when
    its answer came (a long round trip) placed its slots late while another placed the
    neighbouring ones right."""
    if redis_unix is not None:
        on_loop = redis_unix - wall_offset
        if sent <= on_loop <= received:
            return on_loop
    return (sent + received) / 2


# Without Redis no request starts: asked again soon, as it is mostly a brief blip (a
# failover, a restart), and no more often than this once it lasts.
REDIS_RETRY_BASE_S: Final = 0.1
REDIS_RETRY_CAP_S: Final = 5.0


class HostWaits(Exception):
    """A request's host will not be served for ``wait_s`` (halted by its breaker or an
    operator, or its next slot is further than ``PacingSettings.defer_after_s``): its URL
    gives its task slot back and waits in its host's queue (worker.host_queues)."""

    def __init__(self, key: HostKey, wait_s: float) -> None:
        super().__init__(f"{key.source}:{key.host} waits {wait_s:.1f} s")
        self.key = key
        self.wait_s = wait_s


class Pacer(Protocol):
    def acquire(self, key: HostKey, *, defer: bool = False) -> Awaitable[str | None]:
        """Resolves when a request to ``key``'s host may start (None), or with the status
        its URL ends with instead (``HostUnavailable``: the host was given up). With
        ``defer``, raises ``HostWaits`` instead of waiting long for a blocked host.
        Cancelling it gives the slot to the host's next waiting request, if any."""
        ...

    def interval_of(self, key: HostKey) -> float | None:
        """The host's interval between requests as last answered (None: not known)."""
        ...

    def started_late(self, granted: Awaitable[str | None]) -> bool:
        """Whether the request ``granted`` (an ``acquire`` that resolved to None) resumes
        too late for its slot: it is then given up, and the request asks again."""
        ...

    def report(self, key: HostKey, status: str, *, signal: bool = False) -> None:
        """Note an answer of ``key``'s host (``signal``: a backoff signal, such as an
        answer much slower than usual); it moves the host's rate and breaker."""
        ...

    async def pause(self, key: HostKey, delay_s: float) -> None:
        """No request to ``key``'s host starts, from any worker, for ``delay_s``
        seconds."""
        ...

    async def note_crawl_delay(self, key: HostKey, delay_s: float, keep_s: float) -> None:
        """The host's robots.txt Crawl-delay is ``delay_s``, for ``keep_s`` seconds."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class PacingSettings:
    # Slots are granted up to this far ahead of Redis' clock.
    horizon_s: float = 0.05
    # A source without a rate (no monitor, halted, unknown) is asked about again this often.
    no_rate_retry_s: float = 0.5
    # The longest a worker waits before asking again about a host with waiting
    # requests: a slow host's rate may have gone up meanwhile.
    max_wait_s: float = 1.0
    # A host halted by its breaker is asked about when its halt ends, and at least this
    # often (an operator may resume it); one an operator halted, this often.
    halt_poll_s: float = 30.0
    operator_poll_s: float = 5.0
    # Reports of hosts nobody asks about are sent on their own after at most this long.
    report_every_s: float = 1.0
    # A request asked with ``defer`` whose host's next slot is further than this raises
    # HostWaits rather than wait.
    defer_after_s: float = 10.0
    # A source this worker saw no second host of for this long is a one-host source: its
    # host's failures are left to the source's breakers (see ``RedisPacer.report``).
    one_host_s: float = 600.0


class RedisPacer:
    """Takes slots for every waiting request, one script call per wake-up.

    ``run()`` must be running (as a task) for ``acquire`` to make progress.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        settings: PacingSettings = PacingSettings(),
        hosts: HostSettings = DEFAULT_HOSTS,
    ) -> None:
        self._redis = redis
        self._settings = settings
        self._hosts = hosts
        self._acquire_script = redis.register_script(_ACQUIRE_SCRIPT)
        self._note_script = redis.register_script(_NOTE_SCRIPT)
        self._config = _script_config(settings, hosts)
        # Requests waiting for a slot, per host, oldest first.
        self._waiters: dict[HostKey, deque[asyncio.Future[str | None]]] = {}
        # Slots granted and not yet reached, per host: their requests are not asked for.
        self._promised: Counter[HostKey] = Counter()
        # Host -> loop time before which asking Redis again is pointless; and of the idle
        # hosts', kept until it comes (``_forget_if_idle``), (loop time, host) in order.
        self._next_ask: dict[HostKey, float] = {}
        self._kept_asks: deque[tuple[float, HostKey]] = deque()
        # Hosts to ask about at the next call (an ordered set), and the others' due times
        # (a heap of (loop time, sequence, host); ``_due_at`` the time a host is in it for).
        self._ready: dict[HostKey, None] = {}
        self._timers: list[tuple[float, int, HostKey]] = []
        self._due_at: dict[HostKey, float] = {}
        self._sequence = itertools.count()
        # Requests started, until they resume: their slot's loop time and interval.
        self._slots_of: weakref.WeakKeyDictionary[
            asyncio.Future[str | None], tuple[float, float, HostKey]
        ] = weakref.WeakKeyDictionary()
        # Slots given up for lateness in a row, per host (``_give_up``).
        self._late_in_row: Counter[HostKey] = Counter()
        # Requests resumed too late, in a row, per host (``started_late``): apart, as an
        # on-time slot resets the count above; kept while the host is idle between asks.
        self._late_resumes: Counter[HostKey] = Counter()
        # Pauses (Retry-After) Redis was away for: host -> loop time they end.
        self._unsent_pauses: dict[HostKey, float] = {}
        self._pauses_unsent = asyncio.Event()
        # Answers seen since each host was last asked about, and since when some wait.
        self._reports: dict[HostKey, HostReport] = {}
        self._reports_since: float | None = None
        # Requests that raise HostWaits rather than wait long, and each host's interval as
        # last answered.
        self._deferrable: set[asyncio.Future[str | None]] = set()
        self._intervals: dict[HostKey, float] = {}
        # When each host waiting here was last granted a slot (loop time): the hosts of a
        # source are asked about least recently served first.
        self._granted_at: dict[HostKey, float] = {}
        # Per source: the host last asked for, and the loop time until which the source
        # counts as having several hosts (another host was asked for before then).
        self._hosts_of: dict[str, tuple[str, float]] = {}
        self._wake = asyncio.Event()
        self.asks = 0

    def acquire(self, key: HostKey, *, defer: bool = False) -> asyncio.Future[str | None]:
        loop = asyncio.get_running_loop()
        seen = self._hosts_of.get(key.source)
        if seen is None or seen[0] != key.host:
            several_until = -math.inf if seen is None else loop.time() + self._settings.one_host_s
            self._hosts_of[key.source] = (key.host, several_until)
        future: asyncio.Future[str | None] = loop.create_future()
        if defer:
            # A host known to be blocked for long (halted, a long Retry-After) is not
            # asked about before then: its request need not wait to learn it.
            wait_s = self._next_ask.get(key, 0.0) - loop.time()
            if wait_s > self._settings.defer_after_s:
                future.set_exception(HostWaits(key, wait_s))
                return future
            self._deferrable.add(future)
            future.add_done_callback(self._deferrable.discard)
        self._waiters.setdefault(key, deque()).append(future)
        self._schedule(key)
        return future

    def interval_of(self, key: HostKey) -> float | None:
        return self._intervals.get(key)

    def report(self, key: HostKey, status: str, *, signal: bool = False) -> None:
        """Add an answer to what the host's next ask reports.

        The failures of a source's only host are not reported: a host never halts its
        source, and a source of one host keeps the source's breakers (its error window
        and last 50 statuses, crawl_monitor.policy.breakers), which a host halted first
        would keep from ever seeing enough failures to trip. Only this worker's view
        counts ("only": no other host asked for in ``one_host_s``); a host of a source
        with several hosts is halted by its own breaker.
        """
        if answer_kind(status) == FAILED and self._one_host(key):
            return
        self._reports[key] = self._reports.get(key, NO_REPORT).add(status, signal=signal)
        if self._reports_since is None:
            self._reports_since = asyncio.get_running_loop().time()
            self._wake.set()

    def _one_host(self, key: HostKey) -> bool:
        seen = self._hosts_of.get(key.source)
        if seen is None:
            return True
        return seen[0] == key.host and asyncio.get_running_loop().time() >= seen[1]

    async def pause(self, key: HostKey, delay_s: float) -> None:
        """Push ``key``'s next slot at least ``delay_s`` away, for every worker.

        Raises ``RedisError`` when Redis is away; this worker holds the host back anyway,
        and sends what is left of the pause as soon as Redis answers again
        (``_resend_pauses``): the other workers must not take the host's slots meanwhile.
        """
        self._hold(key, delay_s)
        try:
            await self._send_pause(key, delay_s)
        except RedisError:
            until = asyncio.get_running_loop().time() + delay_s
            self._unsent_pauses[key] = max(until, self._unsent_pauses.get(key, until))
            self._pauses_unsent.set()
            raise

    async def _send_pause(self, key: HostKey, delay_s: float) -> None:
        await self._note_script(
            keys=[pace_host_key(key.source, key.host)],
            args=[repr(float(delay_s)), "", "0", repr(self._hosts.idle_s)],
        )

    async def _resend_pauses(self) -> None:
        """Send the pauses Redis missed, what is left of each, retrying every
        ``REDIS_RETRY_BASE_S`` (not the asks' backoff of up to ``REDIS_RETRY_CAP_S``), so
        that this worker, which heard the server's Retry-After, is among the first to
        reach Redis when it is back, before the others are granted the host's slots."""
        loop = asyncio.get_running_loop()
        while True:
            await self._pauses_unsent.wait()
            for key, until in list(self._unsent_pauses.items()):
                left_s = until - loop.time()
                try:
                    if left_s > 0:
                        await self._send_pause(key, left_s)
                except RedisError:
                    await asyncio.sleep(REDIS_RETRY_BASE_S)
                    break
                if self._unsent_pauses.get(key) == until:
                    del self._unsent_pauses[key]
            else:
                if not self._unsent_pauses:
                    self._pauses_unsent.clear()

    async def note_crawl_delay(self, key: HostKey, delay_s: float, keep_s: float) -> None:
        """Raises ``RedisError`` when Redis is away."""
        self._hold(key, 0.0)
        await self._note_script(
            keys=[pace_host_key(key.source, key.host)],
            args=["0", repr(float(delay_s)), repr(float(keep_s)), repr(self._hosts.idle_s)],
        )
        # Its waiting requests ask again, with the delay in force.
        self._ready.pop(key, None)
        self._next_ask.pop(key, None)
        self._schedule(key)

    def _hold(self, key: HostKey, delay_s: float) -> None:
        loop_now = asyncio.get_running_loop().time()
        until = loop_now + delay_s - self._settings.horizon_s
        if until > self._next_ask.get(key, 0.0):
            self._next_ask[key] = until
            self._ready.pop(key, None)
            self._schedule(key)

    # --- which hosts to ask about ----------------------------------------------------------
    def _schedule(self, key: HostKey) -> None:
        """Have ``key`` asked about when it is next due (at once if it is now)."""
        if key in self._ready:
            return
        loop = asyncio.get_running_loop()
        at = self._next_ask.get(key, 0.0)
        if at <= loop.time() + self._settings.horizon_s / 5:
            self._ready[key] = None
            self._wake.set()
            return
        if self._due_at.get(key, float("inf")) <= at:
            return
        self._due_at[key] = at
        heapq.heappush(self._timers, (at, next(self._sequence), key))
        if self._timers[0][2] is key:
            self._wake.set()

    def _promote(self, horizon: float) -> None:
        """Move the hosts due by loop time ``horizon`` from the heap to the ready set."""
        timers = self._timers
        while timers and timers[0][0] <= horizon:
            at, _, key = heapq.heappop(timers)
            if self._due_at.get(key) == at:
                del self._due_at[key]
                self._ready[key] = None

    def _wanted(self, key: HostKey) -> int:
        waiters = self._waiters.get(key)
        if not waiters:
            return 0
        while waiters and waiters[0].done():  # cancelled while waiting
            waiters.popleft()
        return sum(1 for f in waiters if not f.done()) - self._promised[key]

    def _collect(self, now: float) -> dict[str, dict[str, tuple[HostKey, int, HostReport]]]:
        """The asks of the next call, by source and host: the ready hosts that want
        slots, with their reports, and every other report once they are due."""
        asks: dict[str, dict[str, tuple[HostKey, int, HostReport]]] = {}
        ready, self._ready = self._ready, {}
        # The script shares a source's slots among its asking hosts in the order asked,
        # one per host per pass, and often has one slot to give (at 50/s, one falls
        # within the horizon): in the order they became due, a host always due first
        # would take every slot. Least recently granted first, each gets its turn.
        granted_at = self._granted_at
        for key in sorted(ready, key=lambda k: granted_at.get(k, -math.inf)):
            wanted = self._wanted(key)
            if wanted <= 0:
                self._forget_if_idle(key)
                continue
            report = self._reports.pop(key, NO_REPORT)
            asks.setdefault(key.source, {})[key.host] = (key, wanted, report)
        since = self._reports_since
        if self._reports and since is not None and now - since >= self._settings.report_every_s:
            for key, report in self._reports.items():
                hosts = asks.setdefault(key.source, {})
                if key.host not in hosts:
                    hosts[key.host] = (key, 0, report)
            self._reports = {}
        if not self._reports:
            self._reports_since = None
        return asks

    def _forget_if_idle(self, key: HostKey) -> None:
        waiters = self._waiters.get(key)
        if waiters:
            return
        if self._promised[key] <= 0 and key not in self._due_at:
            self._waiters.pop(key, None)
            self._promised.pop(key, None)
            self._granted_at.pop(key, None)
            self._late_in_row.pop(key, None)
            # A host's next ask is kept until it comes (at most ``max_wait_s``): a request
            # that follows its host's last one (a new host's tdmrep.json its robots.txt,
            # its image that) is then asked about when its slot comes, not at once to be
            # told when that is, an ask more. ``_drop_kept_asks`` forgets it then.
            next_ask = self._next_ask.get(key)
            now = asyncio.get_running_loop().time()
            if next_ask is not None and now < next_ask <= now + self._settings.max_wait_s:
                self._kept_asks.append((next_ask, key))
            else:
                self._next_ask.pop(key, None)

    def _drop_kept_asks(self, now: float) -> None:
        """Forget the kept next asks of hosts still idle once they have come."""
        kept = self._kept_asks
        while kept and kept[0][0] <= now:
            at, key = kept.popleft()
            if self._next_ask.get(key) == at and key not in self._waiters:
                del self._next_ask[key]

    # --- the loop ------------------------------------------------------------------------
    async def run(self) -> None:
        resender = asyncio.create_task(self._resend_pauses())
        try:
            await self._ask_for_slots()
        finally:
            await cancel_and_wait([resender])

    async def _ask_for_slots(self) -> None:
        loop = asyncio.get_running_loop()
        retry = Backoff(base_s=REDIS_RETRY_BASE_S, cap_s=REDIS_RETRY_CAP_S)
        outage = Outage(
            "redis_unavailable",
            "redis_recovered",
            clock=loop.time,
            dependency="redis",
            op="take_slots",
        )
        while True:
            now = loop.time()
            self._drop_kept_asks(now)
            # Hosts due within a fraction of the horizon are asked together.
            self._promote(now + self._settings.horizon_s / 5)
            asks = self._collect(now)
            if not asks:
                await self._sleep()
                continue
            sent = loop.time()
            try:
                answers, redis_unix = await self._ask(asks)
            except RedisError as e:
                # Fail closed: without Redis nobody gets a slot. The hosts asked about are
                # asked about again, with their reports.
                outage.report(error=repr(e))
                self._retry_later(asks)
                await asyncio.sleep(retry.next_s())
                continue
            retry.reset()
            outage.end()
            received = loop.time()
            wall_offset = time.time() - received
            self._apply(asks, answers, redis_loop_time(sent, received, wall_offset, redis_unix))

    async def _sleep(self) -> None:
        self._wake.clear()
        loop = asyncio.get_running_loop()
        wake_at = self._timers[0][0] - self._settings.horizon_s / 5 if self._timers else None
        if self._reports_since is not None:
            flush_at = self._reports_since + self._settings.report_every_s
            wake_at = flush_at if wake_at is None or flush_at < wake_at else wake_at
        timeout = None if wake_at is None else max(0.0, wake_at - loop.time())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    def _retry_later(self, asks: dict[str, dict[str, tuple[HostKey, int, HostReport]]]) -> None:
        for hosts in asks.values():
            for key, _, report in hosts.values():
                if report:
                    merged = self._reports.get(key, NO_REPORT)
                    self._reports[key] = _merged(report, merged)
                self._ready[key] = None
        if self._reports and self._reports_since is None:
            self._reports_since = asyncio.get_running_loop().time()

    async def _ask(
        self, asks: dict[str, dict[str, tuple[HostKey, int, HostReport]]]
    ) -> tuple[list[Any], float | None]:
        """The script's answers, one per source asked about, and Redis' clock then (Unix
        s; None if unreadable)."""
        self.asks += 1
        document = [
            [
                source,
                [[host, wanted, report.to_list()] for host, (_, wanted, report) in hosts.items()],
            ]
            for source, hosts in asks.items()
        ]
        raw = await self._acquire_script(args=[self._config, json.dumps(document)])
        reply = json.loads(raw)
        answers = reply.get("a")
        try:
            redis_unix: float | None = float(reply.get("t"))
        except (TypeError, ValueError):
            redis_unix = None
        # cjson writes an empty array as {}: one answer per ask either way.
        return (answers if isinstance(answers, list) else []), redis_unix

    def _apply(
        self,
        asks: dict[str, dict[str, tuple[HostKey, int, HostReport]]],
        answers: list[Any],
        redis_now: float,
    ) -> None:
        """Start or schedule each granted slot; ``redis_now`` is the loop time at which
        Redis ran the script."""
        settings = self._settings
        for hosts, answer in zip(asks.values(), answers, strict=False):
            if not answer:  # the source has no rate
                for key, _, _ in hosts.values():
                    self._asked(key, redis_now + settings.no_rate_retry_s)
                continue
            for (key, _, _), host_answer in zip(hosts.values(), answer, strict=False):
                self._apply_host(key, host_answer, redis_now)

    def _apply_host(self, key: HostKey, answer: Any, redis_now: float) -> None:
        settings = self._settings
        next_s, slots, interval_s, flag = answer
        if flag == FLAG_GONE:
            self._end_all(key, Status.HOST_UNAVAILABLE)
            self._asked(key, redis_now + settings.max_wait_s)
            return
        if flag == FLAG_HALTED:
            wait_s = min(max(float(next_s), 0.0), settings.halt_poll_s)
            self._defer(key, wait_s, keep=0)
            self._asked(key, redis_now + wait_s)
            return
        if flag == FLAG_OPERATOR:
            self._defer(key, settings.operator_poll_s, keep=0)
            self._asked(key, redis_now + settings.operator_poll_s)
            return
        interval = float(interval_s)
        if interval > 0:  # not read this time (UNREAD): nothing new
            self._note_interval(key, interval)
        loop = asyncio.get_running_loop()
        now = loop.time()
        if slots:
            self._granted_at[key] = now
        for offset in slots if isinstance(slots, list) else ():
            slot = redis_now + offset
            if slot <= now:
                # Past before this worker could know of it (the script's own run, its
                # reply): see the module's docstring.
                self._grant(key, slot, interval, promised=False)
            else:
                self._promised[key] += 1
                loop.call_at(slot, self._grant, key, slot, interval)
        if float(next_s) > settings.defer_after_s:
            self._defer(key, float(next_s), keep=self._promised[key])
        # Asked again when its next slot comes within the horizon, as the script answered,
        # plus the head start hosts are promoted by (_promote, a fifth of the horizon):
        # asked that much early, the script would grant nothing, and the host be asked
        # again at once, over and over (measured: 20 empty asks a slot at 50/s).
        wait_s = max(float(next_s), 0.0) + settings.horizon_s / 5
        self._asked(key, redis_now + min(wait_s, settings.max_wait_s))

    def _note_interval(self, key: HostKey, interval_s: float) -> None:
        """Remember ``key``'s interval, the most recently answered ``INTERVALS_KEPT``
        hosts' (a host between two requests is idle here, and its scheduler still needs
        it)."""
        intervals = self._intervals
        intervals.pop(key, None)
        intervals[key] = interval_s
        if len(intervals) > INTERVALS_KEPT:
            for old in list(itertools.islice(intervals, len(intervals) - INTERVALS_KEPT // 2)):
                del intervals[old]

    def _defer(self, key: HostKey, wait_s: float, *, keep: int) -> None:
        """Raise ``HostWaits`` in the deferrable requests of ``key`` but the ``keep``
        oldest live ones (the slots promised to them)."""
        waiters = self._waiters.get(key)
        if not waiters or not self._deferrable:
            return
        kept: deque[asyncio.Future[str | None]] = deque()
        for future in waiters:
            if future.done():
                continue
            if keep > 0 or future not in self._deferrable:
                keep -= 1
                kept.append(future)
            else:
                future.set_exception(HostWaits(key, wait_s))
        self._waiters[key] = kept

    def _asked(self, key: HostKey, next_ask: float) -> None:
        """``key`` was asked about: not again before loop time ``next_ask``; scheduled
        then if it still wants slots."""
        self._next_ask[key] = next_ask
        if self._wanted(key) > 0:
            self._schedule(key)
        else:
            self._forget_if_idle(key)

    def _grant(self, key: HostKey, slot: float, interval_s: float, promised: bool = True) -> None:
        """The slot at loop time ``slot`` has come: start a request in it, unless it
        came too late."""
        if promised and self._promised[key] > 0:
            self._promised[key] -= 1
        late_s = asyncio.get_running_loop().time() - slot
        judged = promised or interval_s >= PAST_JUDGED_FROM_S
        forced = False
        if judged and late_s > late_limit(interval_s):
            if self._give_up(key, late_s):
                self._schedule(key)  # its request asks again
                return
            forced = True  # started late on purpose: not judged again as it resumes
        else:
            self._late_in_row.pop(key, None)
        started = self._start_oldest(key)
        if started is not None and not forced:
            self._slots_of[started] = (slot, interval_s, key)

    def _give_up(self, key: HostKey, late_s: float, counts: Counter[HostKey] | None = None) -> bool:
        """Whether to give up a late slot of ``key``: yes, but for the slot after
        ``MAX_LATE_IN_ROW`` given up in a row, which starts late. A worker whose loop lags
        more than the late limit all the time (starved of CPU) would otherwise never
        start a request of a host whose slots all come due as it asks (seen: a host at
        1/s paced on for 18 minutes, its slots taken and given up, no request made)."""
        in_row = self._late_in_row if counts is None else counts
        if in_row[key] >= MAX_LATE_IN_ROW:
            in_row.pop(key, None)
            # Logged: such a request may come closer to the host's next one than its
            # interval (the fault campaign's pacing windows are matched against these).
            log.info(
                "slot_started_late",
                source=key.source,
                host=key.host,
                late_ms=round(late_s * 1000, 1),
            )
            return False
        in_row[key] += 1
        SLOTS_LATE.inc()
        return True

    def _start_oldest(self, key: HostKey) -> asyncio.Future[str | None] | None:
        """Start the oldest live request of ``key`` (a slot outlives a cancelled one)."""
        waiters = self._waiters.get(key)
        while waiters:
            future = waiters.popleft()
            if not future.done():
                future.set_result(None)
                return future
        return None

    def started_late(self, granted: Awaitable[str | None]) -> bool:
        """Whether the request ``granted`` resumes later than its slot allows. Its
        future resolved at its slot, but the request runs only once the event loop gets
        round to it: a loop busy meanwhile (a batch of records read, an answer decoded)
        would send it late, next to the following slot. The fault campaign saw a worker's
        requests of two sources go out together, 19 and 24 ms apart at 5 and 10/s."""
        started = self._slots_of.pop(granted, None)  # type: ignore[call-overload]
        if started is None:
            return False
        slot, interval_s, key = started
        late_s = asyncio.get_running_loop().time() - slot
        if late_s > late_limit(interval_s):
            return self._give_up(key, late_s, self._late_resumes)
        self._late_resumes.pop(key, None)
        return False

    def _end_all(self, key: HostKey, status: str) -> None:
        for future in self._waiters.pop(key, ()):
            if not future.done():
                future.set_result(status)

    def close(self) -> None:
        """Cancel every waiting request."""
        for waiters in self._waiters.values():
            for future in waiters:
                future.cancel()
        self._waiters.clear()
        self._promised.clear()


def _script_config(settings: PacingSettings, hosts: HostSettings) -> str:
    """ARGV[1] of ``lua/pacing_acquire.lua``: the key prefixes and the rule's parameters."""
    return json.dumps(
        {
            "rp": PACE_RATE_PREFIX,
            "np": PACE_NEXT_PREFIX,
            "hp": PACE_HOST_PREFIX,
            "cp": HOST_RATE_PREFIX,
            "h": settings.horizon_s,
            "s": hosts.to_json_obj(),
        }
    )


def _merged(first: HostReport, then: HostReport) -> HostReport:
    """Two reports of one host, ``first`` before ``then``."""
    return HostReport(
        first.clean + then.clean,
        first.signals + then.signals,
        first.refused + then.refused,
        first.failed + then.failed,
        then.last or first.last,
    )
