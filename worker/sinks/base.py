"""Where a worker's results go: thumbnails to a store, messages to a sink.

Each is one narrow seam with one adapter per service: thumbnails go to S3 (production,
``worker.sinks.s3``) or a local folder (the local stack of ``image-crawler up``,
``worker.sinks.local``), messages to Kafka (``worker.sinks.kafka``). Adapters turn the
failures of their service into ``DependencyError`` so the pipeline can wait and retry
instead of losing the URL.

A service that stops answering (a hung broker, a stalled S3 endpoint) raises nothing for
a long time: aiokafka and the S3 store wait up to their own request timeouts (40 s,
60 s), and cutting a call short would only send the same message twice. So the S3 and
Kafka adapters keep waiting, and ``Stalls`` makes the outage visible instead: one
``dependency_unavailable`` event once a call has had no answer for ``after_s``, and one
``dependency_recovered`` event (with how long it lasted) when the last stuck call ends.

``Outage`` is that pair of events for any service: ``Stalls`` reports with one, and so do
the loops that retry Redis (the pacer's asks, the statistics' flushes).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from image_crawler.logs import get_logger

log = get_logger(__name__)

T = TypeVar("T")

# A call without an answer for this long is reported as an outage of its service.
STALL_AFTER_S = 5.0
# While an outage lasts, a newly stuck call reports it again at most this often.
STALL_REPEAT_S = 30.0


class DependencyError(Exception):
    """A service the worker depends on failed; ``retriable`` says whether to try again."""

    def __init__(self, service: str, cause: BaseException, *, retriable: bool = True) -> None:
        super().__init__(f"{service}: {cause!r}")
        self.service = service
        self.retriable = retriable


class Outage:
    """One service's outage, as two log events: ``unavailable`` (a warning) each time the
    caller reports a failure, and ``recovered`` (info) once when it ends, both with how
    long the service has been away (``unavailable_s``). ``context`` goes on both."""

    def __init__(
        self,
        unavailable: str,
        recovered: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        **context: object,
    ) -> None:
        self.unavailable = unavailable
        self.recovered = recovered
        self._clock = clock
        self._context = context
        self._since: float | None = None

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def begin(self, since: float | None = None) -> None:
        """The service is away since ``since`` (clock time; default now), unless an
        outage is already ongoing."""
        if self._since is None:
            self._since = self._clock() if since is None else since

    def report(self, **fields: object) -> None:
        """Log ``unavailable`` with ``fields``; begins the outage if none is ongoing."""
        self.begin()
        assert self._since is not None
        lasted_s = round(self._clock() - self._since, 2)
        log.warning(self.unavailable, **self._context, **fields, unavailable_s=lasted_s)

    def end(self, **fields: object) -> None:
        """The service answers again: log ``recovered`` with ``fields``, if it was away."""
        if self._since is None:
            return
        lasted_s = round(self._clock() - self._since, 2)
        self._since = None
        log.info(self.recovered, **self._context, **fields, unavailable_s=lasted_s)


class Stalls:
    """Reports calls to one service that go unanswered for ``after_s`` (see the module doc).

    Only watches: the call runs to its own end (answer, error or the client's timeout);
    cancelling the watch cancels the call, as awaiting it directly would.
    """

    def __init__(
        self,
        service: str,
        *,
        after_s: float = STALL_AFTER_S,
        repeat_s: float = STALL_REPEAT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.service = service
        self._after_s = after_s
        self._repeat_s = repeat_s
        self._clock = clock
        self._stuck = 0
        self._stuck_total = 0
        self._reported_at = 0.0
        self._outage = Outage(
            "dependency_unavailable", "dependency_recovered", clock=clock, service=service
        )

    @property
    def stuck(self) -> int:
        """Calls waiting longer than ``after_s`` right now."""
        return self._stuck

    async def watch(self, op: str, call: Awaitable[T]) -> T:
        """Await ``call``; if it takes longer than ``after_s``, count it as stuck."""
        stuck = False

        def on_stall() -> None:
            nonlocal stuck
            stuck = True
            self._begin(op)

        # A timer, not a task: watching costs one timer handle per call.
        timer = asyncio.get_running_loop().call_later(self._after_s, on_stall)
        try:
            return await call
        finally:
            timer.cancel()
            if stuck:
                self._end()

    def _begin(self, op: str) -> None:
        now = self._clock()
        self._stuck += 1
        self._stuck_total += 1
        # The call started ``after_s`` ago: that is when the service stopped answering.
        self._outage.begin(since=now - self._after_s)
        if self._stuck == 1 or now - self._reported_at >= self._repeat_s:
            self._reported_at = now
            self._outage.report(
                op=op, error=f"no answer for {self._after_s:g} s", stuck_calls=self._stuck
            )

    def _end(self) -> None:
        self._stuck -= 1
        if self._stuck == 0:
            self._outage.end(stuck_calls=self._stuck_total)
            self._stuck_total = 0


class ThumbnailStore(Protocol):
    async def put(self, key: str, data: bytes) -> None:
        """Store ``data`` (a JPEG) under ``key``; storing twice is harmless."""
        ...


class MetadataSink(Protocol):
    async def publish(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        """Return once the broker has acknowledged the message."""
        ...
