"""Which read URLs run now, which wait for their host, and which are parked: pure policy.

A URL whose host cannot take it now must not hold what the source's other hosts need
(issue 36): a task slot, the read-ahead, or its partition's commit. So a URL runs as a
task (a slot of its source's fair share) only while its host has room for it, and
otherwise waits in its host's queue here, as the record's offset, bytes and host: no
task, no slot. What waits is bounded, and what cannot wait is *parked*: appended again to
the end of its source's topic, then counted as finished, so that the record's partition
commits past it and a crash loses nothing (the copy is in Kafka before the original is
committed).

- **Room.** A host runs at most ``running_cap`` URLs waiting for their slot: what it can
  start within ``lead_s`` at its interval (the pacer's last answer; a host never heard
  from at ``1 / start_rps``), at least one, at most the source's share. Once a URL's
  request has its slot (``slot_taken``) it no longer counts, however long its answer
  takes, and its host runs one more.
- **Blocked.** A host whose next slot is far (halted by its breaker or an operator, a long
  Retry-After) hands its running URLs back (``defer``): they wait at the head of its queue
  and the host gets no task until the pacer's wait is over.
- **Bounds.** A host's queue holds at most ``queue_cap`` URLs (``queue_s`` of its
  requests at its interval, at least the source's share), a source's queues at most its
  share of URLs together, and the worker's at most ``max_waiting``. A URL over its host's
  bound while another host of its source has work or was read in the last
  ``park_after_s``, or of a blocked host over any bound,
  is parked: its host is the bottleneck, and the source's other hosts need the reading
  to go on. Any other URL over a bound is not read yet (the scheduler gives it back to
  its partition and reads it again within ``hold_s``): the source is its own bottleneck.
- **Age.** A URL that has waited ``park_after_s`` is parked if its host is blocked, or if
  its source has another host with work: it then holds a commit the others' progress
  needs, and maybe the reading of URLs behind it. A source whose only busy host is merely
  slow keeps its URLs uncommitted instead (durable, and nothing else waits on them).

The scheduler (worker.scheduler) acts on what this decides: it starts, parks and gives
back; every call here is O(1) but ``stale`` (O(stale URLs)) and ``forget`` (O(queued)).
"""

from __future__ import annotations

import collections
import contextvars
import dataclasses
import heapq
import itertools
import math
from collections.abc import Callable, Collection, Iterator
from typing import Final, Generic, TypeVar

from worker.politeness.hosts import HostKey

# What the scheduler keeps of a record (its partition); opaque here.
P = TypeVar("P")

# Set by the scheduler in each URL's task: called once the URL's request has its slot.
SLOT_TAKEN: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "slot_taken", default=None
)


def slot_taken() -> None:
    """The running URL's request got its pacing slot (the pipeline calls this): its host
    may start its next URL, which would otherwise wait for this one's download."""
    hook = SLOT_TAKEN.get()
    if hook is not None:
        hook()


# What ``offer`` decides.
START: Final = "start"
QUEUED: Final = "queued"
PARK: Final = "park"
HOLD: Final = "hold"


@dataclasses.dataclass(frozen=True, slots=True)
class HostQueueSettings:
    """Times in seconds."""

    # A host runs what it can start within this long.
    lead_s: float = 2.0
    # A host's queue holds this long of its requests.
    queue_s: float = 30.0
    # A URL waiting this long is parked (when its source has another busy host).
    park_after_s: float = 60.0
    # URLs waiting in one worker, all sources together.
    max_waiting: int = 100_000
    # A partition given back for want of room to queue is read again after this long
    # (sooner once its source's queues are half empty).
    hold_s: float = 1.0
    # The interval of a host never heard from (the pacer's first rate: 1 request/s).
    unknown_interval_s: float = 1.0


@dataclasses.dataclass(slots=True, eq=False)
class Waiting(Generic[P]):
    """A read URL waiting for its host: its record (``partition``, ``offset``, ``value``),
    its host, and since when it waits (loop time)."""

    key: HostKey
    partition: P
    offset: int
    value: bytes | None
    since: float
    queued: bool = True
    # Bumped at each queueing: an entry of ``_by_age`` from an earlier turn is stale.
    turn: int = 0


class HostQueues(Generic[P]):
    """The waiting URLs of one worker, by host (see the module's docstring)."""

    def __init__(
        self,
        interval_of: Callable[[HostKey], float | None],
        settings: HostQueueSettings = HostQueueSettings(),
    ) -> None:
        self._interval_of = interval_of
        self._settings = settings
        self._queues: dict[HostKey, collections.deque[Waiting[P]]] = {}
        # URLs running per host: waiting for their slot (what a host's room counts), and
        # past it (downloading, processing).
        self._running: collections.Counter[HostKey] = collections.Counter()
        self._fetching: collections.Counter[HostKey] = collections.Counter()
        # Busy hosts (running or waiting) per source: whether a source has another.
        self._busy: dict[str, set[str]] = {}
        self._waiting_of: collections.Counter[str] = collections.Counter()
        self.waiting = 0
        # Per source: the host of the URL last read, and until when (loop time) the source
        # counts as having several hosts (another host's URL was read before then).
        self._seen: dict[str, tuple[str, float]] = {}
        # Blocked hosts: the loop time they may run again, and a heap of those times.
        self._blocked: dict[HostKey, float] = {}
        self._wakes: list[tuple[float, int, HostKey]] = []
        self._sequence = itertools.count()
        # Every queueing (time, turn, URL) in order: the oldest first, for ``stale``.
        self._by_age: collections.deque[tuple[float, int, Waiting[P]]] = collections.deque()

    # --- the bounds ----------------------------------------------------------------------
    def _interval(self, key: HostKey) -> float:
        interval = self._interval_of(key)
        if interval is None or not interval > 0:
            return self._settings.unknown_interval_s
        return interval

    def running_cap(self, key: HostKey, share: int) -> int:
        cap = math.ceil(self._settings.lead_s / self._interval(key))
        return max(1, min(cap, share))

    def queue_cap(self, key: HostKey, share: int) -> int:
        """``queue_s`` of the host's requests, and never fewer than the source's share (a
        host new or in slow start, its interval long yet, is not cut short: a source of
        one host then fills its share, as it always did, and is read no further)."""
        return max(share, math.ceil(self._settings.queue_s / self._interval(key)))

    def waiting_of(self, source: str) -> int:
        return self._waiting_of[source]

    def running_of(self, key: HostKey) -> int:
        return self._running[key]

    def crowded(self) -> bool:
        """More than half of ``max_waiting`` waits: held partitions stay held."""
        return self.waiting > self._settings.max_waiting // 2

    def has_other_host(self, key: HostKey) -> bool:
        """Whether ``key``'s source has another host with URLs running or waiting here."""
        busy = self._busy.get(key.source)
        return busy is not None and (len(busy) > 1 or key.host not in busy)

    # --- a new URL -----------------------------------------------------------------------
    def offer(self, entry: Waiting[P], share: int, now: float) -> str:
        """What to do with a URL just read: START it (then ``started``), or it was QUEUED
        here, or PARK it, or HOLD it (give it back to its partition, unread)."""
        key = entry.key
        several = self._note_host(key, now)
        queue = self._queues.get(key)
        if not queue and self._may_run(key, share, now):
            return START
        host_full = len(queue or ()) >= self.queue_cap(key, share)
        if host_full or self._crowded(key.source, share):
            # Parked if its host is the bottleneck and the source has others to read on
            # for (or its host is blocked); else read later: the source (one host, or
            # hosts that all have URLs waiting) is its own bottleneck.
            blocked = self._blocked.get(key, -math.inf) > now
            if blocked or (host_full and (several or self.has_other_host(key))):
                return PARK
            return HOLD
        self._enqueue(entry, now, front=False)
        return QUEUED

    def _note_host(self, key: HostKey, now: float) -> bool:
        """Note a URL of ``key`` read; whether its source had URLs of another host read
        in the last ``park_after_s`` (its reading then finds other hosts' URLs)."""
        seen = self._seen.get(key.source)
        if seen is None:
            self._seen[key.source] = (key.host, -math.inf)
            return False
        if seen[0] != key.host:
            self._seen[key.source] = (key.host, now + self._settings.park_after_s)
            return True
        return now < seen[1]

    def _crowded(self, source: str, share: int) -> bool:
        return self._waiting_of[source] >= share or self.waiting >= self._settings.max_waiting

    def _may_run(self, key: HostKey, share: int, now: float) -> bool:
        if key in self._blocked and self._blocked[key] > now:
            return False
        return self._running[key] < self.running_cap(key, share)

    def _enqueue(self, entry: Waiting[P], now: float, *, front: bool) -> None:
        key = entry.key
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = collections.deque()
            self._busy.setdefault(key.source, set()).add(key.host)
        if front:
            # Back in its place among the URLs of its partition that wait: in order.
            i = 0
            while (
                i < len(queue)
                and queue[i].partition == entry.partition
                and queue[i].offset < entry.offset
            ):
                i += 1
            queue.insert(i, entry)
        else:
            queue.append(entry)
        entry.queued = True
        entry.since = now
        entry.turn += 1
        self._by_age.append((now, entry.turn, entry))
        self.waiting += 1
        self._waiting_of[key.source] += 1

    # --- running URLs --------------------------------------------------------------------
    def started(self, key: HostKey) -> None:
        self._running[key] += 1
        self._busy.setdefault(key.source, set()).add(key.host)

    def _unrun(self, key: HostKey, granted: bool) -> None:
        counter = self._fetching if granted else self._running
        counter[key] -= 1
        if counter[key] <= 0:
            del counter[key]

    def granted(self, key: HostKey, share: int, now: float) -> list[Waiting[P]]:
        """A running URL of ``key`` got its request's slot: it no longer waits for its
        host (its download may take long, and the host's next URLs need not wait for
        it); the URLs of its host to start now (each ``started``)."""
        self._unrun(key, False)
        self._fetching[key] += 1
        return self.ready(key, share, now)

    def ended(
        self, key: HostKey, share: int, now: float, *, granted: bool = False
    ) -> list[Waiting[P]]:
        """A URL of ``key`` ended (``granted``: after its slot); the URLs of its host to
        start now (each ``started``)."""
        self._unrun(key, granted)
        ready = self.ready(key, share, now)
        self._forget_if_idle(key)
        return ready

    def defer(self, entry: Waiting[P], wait_s: float, now: float, *, granted: bool = False) -> None:
        """A running URL of a host that will not be served for ``wait_s`` ended: it comes
        back to the head of its host's queue (after the URLs of its partition read before
        it), and the host is blocked until then."""
        key = entry.key
        self._unrun(key, granted)
        until = now + max(0.0, wait_s)
        if self._blocked.get(key, -math.inf) < until:
            self._blocked[key] = until
            heapq.heappush(self._wakes, (until, next(self._sequence), key))
        self._enqueue(entry, now, front=True)

    def ready(self, key: HostKey, share: int, now: float) -> list[Waiting[P]]:
        """Take the queued URLs of ``key`` that may start now (each then ``started``)."""
        queue = self._queues.get(key)
        out: list[Waiting[P]] = []
        while queue and self._may_run(key, share, now):
            entry = self._take(queue)
            self.started(key)
            out.append(entry)
        return out

    def due(self, share: int, now: float) -> list[Waiting[P]]:
        """The URLs of hosts whose block ended by ``now`` that may start now."""
        out: list[Waiting[P]] = []
        wakes = self._wakes
        while wakes and wakes[0][0] <= now:
            until, _, key = heapq.heappop(wakes)
            if self._blocked.get(key) == until:
                del self._blocked[key]
                out += self.ready(key, share, now)
                self._forget_if_idle(key)
        return out

    def stale(self, now: float) -> list[Waiting[P]]:
        """Take the URLs to park for their age: waiting ``park_after_s`` or longer, with
        another host of their source busy or their own host blocked."""
        limit = now - self._settings.park_after_s
        out: list[Waiting[P]] = []
        kept: list[Waiting[P]] = []
        by_age = self._by_age
        while by_age and by_age[0][0] <= limit:
            _, turn, entry = by_age.popleft()
            if not entry.queued or entry.turn != turn:
                continue  # started, parked or queued again since
            key = entry.key
            if not self.has_other_host(key) and self._blocked.get(key, -math.inf) <= now:
                kept.append(entry)  # looked at again after another park_after_s
                continue
            queue = self._queues[entry.key]
            if queue[0] is entry:
                queue.popleft()
            else:
                queue.remove(entry)
            self._dequeued(entry)
            self._forget_if_idle(entry.key)
            out.append(entry)
        for entry in kept:
            by_age.append((now, entry.turn, entry))
        return out

    # --- bookkeeping ---------------------------------------------------------------------
    def _take(self, queue: collections.deque[Waiting[P]]) -> Waiting[P]:
        entry = queue.popleft()
        self._dequeued(entry)
        return entry

    def _dequeued(self, entry: Waiting[P]) -> None:
        entry.queued = False
        self.waiting -= 1
        source = entry.key.source
        self._waiting_of[source] -= 1
        if self._waiting_of[source] <= 0:
            del self._waiting_of[source]

    def _forget_if_idle(self, key: HostKey) -> None:
        """Forget a host with nothing running or waiting here (a block is forgotten when
        it ends, in ``due``)."""
        queue = self._queues.get(key)
        if queue:
            return
        if queue is not None:
            del self._queues[key]
        if self._running[key] > 0 or self._fetching[key] > 0:
            return
        busy = self._busy.get(key.source)
        if busy is not None:
            busy.discard(key.host)
            if not busy:
                del self._busy[key.source]

    def forget(self, partitions: Collection[P]) -> int:
        """Drop the queued URLs of ``partitions`` (revoked: their next owner reads them
        again); how many."""
        dropped = 0
        for key in list(self._queues):
            queue = self._queues[key]
            kept = collections.deque(e for e in queue if e.partition not in partitions)
            for entry in queue:
                if entry.partition in partitions:
                    self._dequeued(entry)
                    dropped += 1
            self._queues[key] = kept
            self._forget_if_idle(key)
        return dropped

    def __iter__(self) -> Iterator[Waiting[P]]:
        for queue in self._queues.values():
            yield from queue
