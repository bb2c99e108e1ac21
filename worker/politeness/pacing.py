"""Pacing: when each request to a source may start, agreed by every worker through Redis.

A generic cell rate algorithm (GCRA). The monitor keeps ``pace_rate:{source}`` at the
source's rate; each source has one theoretical arrival time, ``pace_next:{source}``, the
earliest Unix time at which its next request may start. Granting a request moves it on
by ``1 / rate``; a source that was idle starts from Redis' ``TIME``, never from the past,
so nothing is caught up in a burst. Requests start one every ``1 / rate`` seconds, from
whichever worker they come.

A worker asks for all its waiting requests of every due source in one script call, and
is granted the slots that fall within ``horizon_s`` of now, each with its start time: it
starts each request at its slot, and asks again when the next slot comes within the
horizon. Granting a little ahead is what keeps a backlogged source at its full rate (an
ask that reaches Redis after the slot it was meant for would otherwise push every later
slot back by the delay); it is also how long a request granted before a halt or a
Retry-After may still start.

A slot is a time, not a token: one that the worker reaches more than half an interval
late (its event loop was busy) is given up, and its request asks again. Started late, it
would land next to the following slot, granted to this worker or another, and two
requests would go out together. Lateness under ``MIN_LATENESS_S`` is never a reason:
above 250 requests/s the interval nears the event loop's own timing, and slots a few
microseconds late would all be given up; nor is the time before the answer was read
(a slot already past then is started at once).
Slot times are placed on the worker's clock at the middle of the ask's round trip,
which is within half of it of Redis' own clock.

A source's ``crawl_delay:{source}`` (its hosts' robots.txt Crawl-delay, see
worker/politeness/robots.py) is the shortest interval between its requests, whatever the
rate: the monitor lowers the rate to match within a loop, but the script obeys it from the
moment a worker notes it.

Fail closed: without a rate (no monitor: the key expired; a halted source: "0") nothing
is granted, and the worker asks again after ``no_rate_retry_s``. A server's Retry-After
pushes ``pace_next`` forward (``pause``), which holds every worker's requests to that
source until then.

The rule is stated in Python by ``pacing_interval_s``, ``gcra_grant`` and ``paused_next``;
the Lua scripts in ``lua/`` are its fast path (one atomic call for every asking source),
and test/worker/test_lua_twins.py holds both to the same answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
from collections import Counter, deque
from collections.abc import Awaitable
from typing import Any, Final, Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from image_crawler.contract import (
    CRAWL_DELAY_PREFIX,
    PACE_NEXT_PREFIX,
    PACE_RATE_PREFIX,
    pace_next_key,
)
from image_crawler.logs import get_logger
from image_crawler.lua import lua_script
from image_crawler.retry import Backoff
from worker.sinks.base import Outage

log = get_logger(__name__)

_ACQUIRE_SCRIPT: Final = lua_script("worker.politeness", "pacing_acquire.lua")

_PAUSE_SCRIPT: Final = lua_script("worker.politeness", "pacing_pause.lua")


# Slots this late or less are always started (see the module's docstring).
MIN_LATENESS_S: Final = 0.002

# Without Redis no request starts: asked again soon, as it is mostly a brief blip (a
# failover, a restart), and no more often than this once it lasts.
REDIS_RETRY_BASE_S: Final = 0.1
REDIS_RETRY_CAP_S: Final = 5.0


def pacing_interval_s(rate: float | None, crawl_delay_s: float | None) -> float | None:
    """Seconds between a source's slots: ``1 / rate``, or its Crawl-delay if that is longer.

    None when there is no rate to pace by (absent or not a number, 0 for a halted source,
    negative, infinite): nothing is granted. A Crawl-delay that is absent or not a finite
    number is ignored.
    """
    if rate is None or not 0 < rate < math.inf:
        return None
    interval_s = 1 / rate
    if crawl_delay_s is not None and interval_s < crawl_delay_s < math.inf:
        return crawl_delay_s
    return interval_s


@dataclasses.dataclass(frozen=True, slots=True)
class Grant:
    """The slots one ask is granted (their start times, Unix s, in order) and the source's
    next slot afterwards, ``next_at`` (its theoretical arrival time)."""

    slots: tuple[float, ...]
    next_at: float


def gcra_grant(
    now: float, next_at: float | None, interval_s: float, horizon_s: float, wanted: int
) -> Grant:
    """The slots a source with ``wanted`` requests waiting is granted at ``now`` (Unix s).

    Slots run from the source's next slot ``next_at`` (from ``now`` when it is absent, not
    a number or past: an idle source catches nothing up), one every ``interval_s``, and
    only those that start within ``horizon_s`` of now (one exactly at the horizon is
    granted). The next slot moves past each slot granted; it is stored only when one is.
    """
    tat = next_at if next_at is not None and next_at >= now else now
    slots: list[float] = []
    while len(slots) < wanted and tat <= now + horizon_s:
        slots.append(tat)
        tat += interval_s
    return Grant(tuple(slots), tat)


def paused_next(now: float, next_at: float | None, delay_s: float) -> float:
    """A source's next slot once nothing may start for ``delay_s`` from ``now`` (Unix s):
    ``now + delay_s``, unless its next slot ``next_at`` is later already (absent or not a
    number counts as never set)."""
    until = now + delay_s
    current = 0.0 if next_at is None or math.isnan(next_at) else next_at
    return until if until > current else current


class Pacer(Protocol):
    def acquire(self, source: str) -> Awaitable[None]:
        """Resolves when a request to ``source`` may start. Cancelling it gives the slot
        to the source's next waiting request, if any."""
        ...

    async def pause(self, source: str, delay_s: float) -> None:
        """No request to ``source`` starts, from any worker, for ``delay_s`` seconds."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class PacingSettings:
    # Slots are granted up to this far ahead of Redis' clock.
    horizon_s: float = 0.05
    # A source without a rate (no monitor, halted, unknown) is asked about again this often.
    no_rate_retry_s: float = 0.5
    # The longest a worker waits before asking again about a source with waiting
    # requests: a slow source's rate may have gone up meanwhile.
    max_wait_s: float = 1.0


class RedisPacer:
    """Takes slots for every waiting request, one script call per wake-up.

    ``run()`` must be running (as a task) for ``acquire`` to make progress.
    """

    def __init__(self, redis: aioredis.Redis, settings: PacingSettings = PacingSettings()) -> None:
        self._redis = redis
        self._settings = settings
        self._acquire_script = redis.register_script(_ACQUIRE_SCRIPT)
        self._pause_script = redis.register_script(_PAUSE_SCRIPT)
        # Requests waiting for a slot, per source, oldest first.
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {}
        # Slots granted and not yet reached, per source: their requests are not asked for.
        self._promised: Counter[str] = Counter()
        # Source -> loop time before which asking Redis again is pointless.
        self._next_ask: dict[str, float] = {}
        self._wake = asyncio.Event()
        self.asks = 0

    def acquire(self, source: str) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(source, deque()).append(future)
        self._wake.set()
        return future

    async def pause(self, source: str, delay_s: float) -> None:
        """Push ``source``'s next slot at least ``delay_s`` away, for every worker.

        Raises ``RedisError`` when Redis is away; this worker holds the source back
        anyway.
        """
        loop_now = asyncio.get_running_loop().time()
        self._next_ask[source] = max(
            self._next_ask.get(source, 0.0), loop_now + delay_s - self._settings.horizon_s
        )
        await self._pause_script(keys=[pace_next_key(source)], args=[repr(float(delay_s))])

    async def run(self) -> None:
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
            # Sources due within a fraction of the horizon are asked together.
            due, soonest = self._due(loop.time() + self._settings.horizon_s / 5)
            if not due:
                await self._sleep_until(soonest)
                continue
            sent = loop.time()
            try:
                answers = await self._ask(due)
            except RedisError as e:
                # Fail closed: without Redis nobody gets a slot.
                outage.report(error=repr(e))
                await asyncio.sleep(retry.next_s())
                continue
            retry.reset()
            outage.end()
            # Redis' clock read "now" somewhere in the round trip: its middle is the best
            # guess, within half the round trip.
            self._apply(due, answers, (sent + loop.time()) / 2)

    def _due(self, horizon: float) -> tuple[dict[str, int], float | None]:
        """The sources to ask about now, with how many slots each, and the loop time at
        which the next of the others is due (None: none is waiting)."""
        due: dict[str, int] = {}
        soonest: float | None = None
        for source, waiters in list(self._waiters.items()):
            while waiters and waiters[0].done():  # cancelled while waiting
                waiters.popleft()
            promised = self._promised[source]
            wanted = sum(1 for f in waiters if not f.done()) - promised
            if wanted <= 0:
                if not waiters and promised <= 0:
                    del self._waiters[source]
                    del self._promised[source]
                continue
            next_ask = self._next_ask.get(source, 0.0)
            if next_ask <= horizon:
                due[source] = wanted
            elif soonest is None or next_ask < soonest:
                soonest = next_ask
        return due, soonest

    async def _sleep_until(self, soonest: float | None) -> None:
        self._wake.clear()
        timeout = None
        if soonest is not None:
            timeout = max(0.0, soonest - asyncio.get_running_loop().time())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    async def _ask(self, due: dict[str, int]) -> list[Any]:
        self.asks += 1
        raw = await self._acquire_script(
            args=[
                PACE_RATE_PREFIX,
                PACE_NEXT_PREFIX,
                repr(self._settings.horizon_s),
                json.dumps([[source, wanted] for source, wanted in due.items()]),
                CRAWL_DELAY_PREFIX,
            ]
        )
        answers = json.loads(raw)
        # cjson writes an empty array as {}: one answer per ask either way.
        return answers if isinstance(answers, list) else []

    def _apply(self, due: dict[str, int], answers: list[Any], redis_now: float) -> None:
        """Start or schedule each granted slot; ``redis_now`` is the loop time at which
        Redis ran the script."""
        loop = asyncio.get_running_loop()
        settings = self._settings
        now = loop.time()
        for source, answer in zip(due, answers, strict=False):
            if not answer:
                self._next_ask[source] = redis_now + settings.no_rate_retry_s
                continue
            next_s, slots, interval_s = answer
            for offset in slots if isinstance(slots, list) else ():
                slot = redis_now + offset
                if slot <= now:
                    # Past before this worker could know of it (the script's own run, its
                    # reply): started at once, or a source whose interval is shorter than
                    # a round trip would never start a request.
                    self._start_oldest(source)
                else:
                    self._promised[source] += 1
                    loop.call_at(slot, self._grant, source, slot, interval_s)
            self._next_ask[source] = redis_now + min(max(float(next_s), 0.0), settings.max_wait_s)

    def _grant(self, source: str, slot: float, interval_s: float) -> None:
        """The promised slot at loop time ``slot`` has come: start a request in it,
        unless it came too late."""
        if self._promised[source] > 0:
            self._promised[source] -= 1
        late_s = asyncio.get_running_loop().time() - slot
        if late_s > MIN_LATENESS_S and late_s > interval_s / 2:
            self._wake.set()  # its request asks again
            return
        self._start_oldest(source)

    def _start_oldest(self, source: str) -> None:
        """Start the oldest live request of ``source`` (a slot outlives a cancelled one)."""
        waiters = self._waiters.get(source, deque())
        while waiters:
            future = waiters.popleft()
            if not future.done():
                future.set_result(None)
                return

    def close(self) -> None:
        """Cancel every waiting request."""
        for waiters in self._waiters.values():
            for future in waiters:
                future.cancel()
        self._waiters.clear()
        self._promised.clear()
