"""Hold new requests while an image could not be finished: the store or broker failing
or not answering.

An image fetched while S3 or the broker is away waits in memory for it, and if its worker
dies meanwhile, it is requested again by the next owner of its message: an S3 outage of a
minute let a worker fetch some hundred images at its sources' rates that a SIGKILL then
cost twice (a fault campaign's 1.09 requests per image). So the pipeline asks the gate
before each request, and the gate is closed while any call that finishing an image needs
(a thumbnail's put, a message's publish) is failing and being retried, or has had no
answer for ``STALL_AFTER_S``.

A call that ends without an answer (its task cancelled: a revoked partition's URL given
up, a stop) leaves the service as it found it, away, so the gate stays closed after it:
while no call is in hand, it lets one request through at a time (a probe, every
``PROBE_S`` at most), and opens once a call succeeds. So it never waits on a request it
holds, and a worker whose stuck calls all end does not fetch for another
``STALL_AFTER_S`` before noticing again.

Closed, the gate logs ``requests_held`` (with the operation that holds them) once, and
``requests_resumed`` with how long they were held.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Final

from image_crawler.logs import get_logger
from worker.sinks.base import STALL_AFTER_S, DependencyError

log = get_logger(__name__)

# While the service is away and no call is in hand, one request this often at most.
PROBE_S: Final = 2.0


class FinishGate:
    def __init__(
        self,
        *,
        stall_after_s: float = STALL_AFTER_S,
        probe_s: float = PROBE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stall_after_s = stall_after_s
        self._probe_s = probe_s
        self._clock = clock
        self._ids = itertools.count()
        # Calls in hand, oldest first (a dict keeps insertion order): id -> (start, op).
        self._calls: dict[int, tuple[float, str]] = {}
        self._failing: dict[int, str] = {}
        self._away: str | None = None  # a failing or stuck call ended unanswered
        self._probed_at = -float("inf")
        self._ended: asyncio.Event | None = None  # made by the first waiter
        self._held_since: float | None = None

    @contextlib.contextmanager
    def call(self, op: str) -> Iterator[Callable[[], None]]:
        """Watch one call for its whole life, retries included; the function it yields
        marks the call failing (it retries until it succeeds or is given up)."""
        token = next(self._ids)
        started = self._clock()
        self._calls[token] = (started, op)

        def failed() -> None:
            self._failing[token] = op

        answered = False
        try:
            yield failed
            answered = True
        except DependencyError as e:
            answered = not e.retriable  # a refusal is an answer: the service is there
            raise
        finally:
            del self._calls[token]
            troubled = self._failing.pop(token, None) is not None
            if answered:
                self._away = None
            elif troubled or self._clock() - started >= self._stall_after_s:
                self._away = op
            if self._ended is not None:
                self._ended.set()
                self._ended = None

    def holding(self) -> str | None:
        """The operation that holds requests now, or None."""
        if self._failing:
            return next(iter(self._failing.values()))
        if self._calls:
            started, op = next(iter(self._calls.values()))
            if self._clock() - started >= self._stall_after_s:
                return op
            return self._away  # away: the calls in hand say when it is back
        if self._away is not None and self._clock() - self._probed_at < self._probe_s:
            return self._away
        return None

    async def wait_open(self) -> None:
        """Return at once when nothing holds requests, else once that is so (or, the
        service away and no call in hand, as the one probe)."""
        op = self.holding()
        if op is None:
            self._probe_if_away()
            return
        if self._held_since is None:
            self._held_since = self._clock()
            log.warning("requests_held", op=op)
        while op is not None:
            if self._ended is None:
                self._ended = asyncio.Event()
            with contextlib.suppress(TimeoutError):  # a probe may be due by then
                async with asyncio.timeout(self._probe_s):
                    await self._ended.wait()
            op = self.holding()
        if self._probe_if_away():
            return
        if self._held_since is not None:
            held_s = round(self._clock() - self._held_since, 2)
            self._held_since = None
            log.info("requests_resumed", held_s=held_s)

    def _probe_if_away(self) -> bool:
        if self._away is None:
            return False
        self._probed_at = self._clock()
        return True
