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
the loops that retry Redis (the pacer's asks, the statistics' flushes) and the pipeline's
retries of a store or broker that fails. An outage that names its ``dependency`` is also
counted in ``DependencyStates`` (the metrics ``crawler_dependency_up`` and
``crawler_dependency_outages_total``, and ``/healthz``): several parts watch the same
service, and one service's overlapping outages are one outage there.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from image_crawler.logs import get_logger
from worker.metrics import DEPENDENCY_OUTAGES, DEPENDENCY_UP

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


class DependencyStates:
    """Which dependencies are away now, and since when, over every ``Outage`` naming them.

    A dependency is away from the start of the first of its ongoing outages to the end of
    the last one. Each time it goes away ``crawler_dependency_outages_total`` counts one,
    and ``crawler_dependency_up`` is 0 until it is back. Times are ``clock``'s (seconds).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._ongoing: Counter[str] = Counter()
        self._since: dict[str, float] = {}

    def known(self, *dependencies: str) -> None:
        """Export ``dependencies`` before any outage: up, and none counted yet (a counter
        that appears only at its first increment hides that increment from ``rate()``)."""
        for dependency in dependencies:
            DEPENDENCY_OUTAGES.labels(dependency)
            if dependency not in self._since:
                DEPENDENCY_UP.labels(dependency).set(1)

    def began(self, dependency: str, ago_s: float = 0.0) -> None:
        """An outage of ``dependency`` began ``ago_s`` seconds ago."""
        since = self._clock() - ago_s
        self._ongoing[dependency] += 1
        if self._ongoing[dependency] == 1:
            self._since[dependency] = since
            DEPENDENCY_UP.labels(dependency).set(0)
            DEPENDENCY_OUTAGES.labels(dependency).inc()
        else:
            self._since[dependency] = min(self._since[dependency], since)

    def ended(self, dependency: str) -> None:
        """One outage of ``dependency`` ended; it is back once none is ongoing."""
        self._ongoing[dependency] -= 1
        if self._ongoing[dependency] <= 0:
            del self._ongoing[dependency]
            self._since.pop(dependency, None)
            DEPENDENCY_UP.labels(dependency).set(1)

    def away_s(self) -> dict[str, float]:
        """The dependencies away now, with how long each has been away (seconds)."""
        now = self._clock()
        return {dependency: now - since for dependency, since in self._since.items()}


# The process's dependencies: its metrics are the process's too.
DEPENDENCY_STATES = DependencyStates()


class Outage:
    """One service's outage, as two log events: ``unavailable`` (a warning) each time the
    caller reports a failure, and ``recovered`` (info) once when it ends, both with how
    long the service has been away (``unavailable_s``). ``context`` goes on both.

    With a ``dependency`` (kafka, redis, s3, local_store), the outage is also counted in
    ``states`` (the process's ``DEPENDENCY_STATES`` by default).
    """

    def __init__(
        self,
        unavailable: str,
        recovered: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        dependency: str | None = None,
        states: DependencyStates | None = None,
        **context: object,
    ) -> None:
        self.unavailable = unavailable
        self.recovered = recovered
        self._clock = clock
        self._dependency = dependency
        self._states = DEPENDENCY_STATES if states is None else states
        self._context = context
        self._since: float | None = None

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def begin(self, since: float | None = None) -> None:
        """The service is away since ``since`` (clock time; default now), unless an
        outage is already ongoing."""
        if self._since is None:
            now = self._clock()
            self._since = now if since is None else since
            if self._dependency is not None:
                self._states.began(self._dependency, ago_s=now - self._since)

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
        if self._dependency is not None:
            self._states.ended(self._dependency)
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
            "dependency_unavailable",
            "dependency_recovered",
            clock=clock,
            dependency=service,
            service=service,
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
