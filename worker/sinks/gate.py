"""Hold new requests while an image could not be finished: the store or broker failing
or not answering.

An image fetched while S3 or the broker is away waits in memory for it, and if its worker
dies meanwhile, it is requested again by the next owner of its message: an S3 outage of a
minute let a worker fetch some hundred images at its sources' rates that a SIGKILL then
cost twice (a fault campaign's 1.09 requests per image). So the pipeline asks the gate
before each request, and the gate is closed while any call that finishing an image needs
(a thumbnail's put, a message's publish) is failing and being retried, or has had no
answer for ``STALL_AFTER_S``. Only calls already made open it again: the calls in hand
keep trying (worker.pipeline's ``_reliably``), and the first of them to end lets the
requests go on, so a gate can never hold the requests that would be needed to open it.

Closed, the gate logs ``requests_held`` (with the operation that holds them) once, and
``requests_resumed`` with how long they were held.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Iterator

from image_crawler.logs import get_logger
from worker.sinks.base import STALL_AFTER_S

log = get_logger(__name__)


class FinishGate:
    def __init__(
        self, *, stall_after_s: float = STALL_AFTER_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._stall_after_s = stall_after_s
        self._clock = clock
        self._ids = itertools.count()
        # Calls in hand, oldest first (a dict keeps insertion order): id -> (start, op).
        self._calls: dict[int, tuple[float, str]] = {}
        self._failing: dict[int, str] = {}
        self._ended: asyncio.Event | None = None  # made by the first waiter
        self._held_since: float | None = None

    @contextlib.contextmanager
    def call(self, op: str) -> Iterator[Callable[[], None]]:
        """Watch one call for its whole life, retries included; the function it yields
        marks the call failing (it retries until it succeeds or is given up)."""
        token = next(self._ids)
        self._calls[token] = (self._clock(), op)

        def failed() -> None:
            self._failing[token] = op

        try:
            yield failed
        finally:
            del self._calls[token]
            self._failing.pop(token, None)
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
        return None

    async def wait_open(self) -> None:
        """Return at once when nothing holds requests, else once that is so."""
        op = self.holding()
        if op is None:
            return
        if self._held_since is None:
            self._held_since = self._clock()
            log.warning("requests_held", op=op)
        while op is not None:
            if self._ended is None:
                self._ended = asyncio.Event()
            await self._ended.wait()
            op = self.holding()
        if self._held_since is not None:
            held_s = round(self._clock() - self._held_since, 2)
            self._held_since = None
            log.info("requests_resumed", held_s=held_s)
