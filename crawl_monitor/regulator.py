"""The rate regulator: every second, set each known source's pace and run its circuit
breakers.

One loop (``tick``) reads the state of every known source in one round trip, decides in
Python (``decision``: the rates, the adaptive rate and the breakers) and writes every
rate and halt in one more. Each source's rate is SET into ``pace_rate:{source}`` with a
short expiry (``pace_rate_ttl_ms``), so that when the monitor dies or cannot reach Redis no
source keeps a rate for long: crawling fails closed. Workers pace their requests by it
(one every ``1/rate`` seconds, see ``image_crawler.contract``).

Leadership: with a ``LeaderLease`` (as ``python -m crawl_monitor`` always runs), only the
monitor holding ``monitor_leader`` sets rates and runs breakers: two monitors deciding at
once would each cut and raise rates on their own and trip the same breakers twice. The
leader renews the lease in its write (no extra round trip); a write made after the lease
was lost writes nothing, and the monitor becomes a standby. A standby only tries to take
the lease, once a loop, and sets rates from the loop after it took it, with a new term's
memory: its adaptive rates start from the cuts the last leader published in
``crawl_rates`` (``policy.takeover``; read in the term's first loop, logged as
``pacing_inherited``), not from the configured rates. Changes are logged as
``leadership_acquired``, ``leadership_standby`` (another monitor leads),
``leadership_lost`` and ``leadership_released`` (on a clean stop, so that a standby
takes over on its next loop instead of after the lease's expiry).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping

from redis.exceptions import RedisError

from crawl_monitor.policy.adaptive import AdaptiveSettings
from crawl_monitor.policy.breakers import WINDOW_S
from crawl_monitor.policy.decision import Decision, Memory, RegulatorSnapshot, decide, plan_read
from crawl_monitor.policy.rates import next_tick_at
from crawl_monitor.settings import MonitorSettings
from crawl_monitor.store import LeaderLease, RegulatorStore
from image_crawler.contract import CrawlPause
from image_crawler.logs import get_logger
from image_crawler.retry import Backoff, sleep_unless_stopped

log = get_logger(__name__)

# The longest wait between two loops while Redis is away: rates come back at most this
# long after Redis does.
MAX_BACKOFF_S = 8.0


@dataclasses.dataclass(frozen=True, slots=True)
class RegulatorSettings:
    period_s: float = 1.0
    # Expiry of each pace_rate SET: it must outlive one period.
    pace_rate_ttl_ms: int = MonitorSettings().pace_rate_ttl_ms
    window_s: float = WINDOW_S
    # Each loop reads the whole last-50 histogram of one in this many sources (in turn,
    # so each is at most this many loops old in the monitoring log); of the others Redis
    # says only whether all 50 failed (the permanent breaker), which a healthy source
    # answers at its newest status. A source whose 60 s window holds statuses and no
    # error is not even asked: its newest statuses are in that window. A list that
    # disagrees (written by a worker whose clock is over a minute behind) is caught at
    # the source's turn, so a permanent trip may wait this many loops. Between turns, a
    # source whose window held no error at the last loop and whose failure counter
    # (resize_errors:{source}, bumped in the same flush as the failure) has not moved is
    # not read at all. Statuses written without the counter (not by a worker) wait for
    # the turn.
    full_last_statuses_every: int = 5
    adaptive: AdaptiveSettings = dataclasses.field(default_factory=AdaptiveSettings)


class Regulator:
    """Sets rates and runs breakers for the sources ``computed_rates()`` returns."""

    def __init__(
        self,
        store: RegulatorStore,
        computed_rates: Callable[[], Mapping[str, float]],
        settings: RegulatorSettings = RegulatorSettings(),
        *,
        lease: LeaderLease | None = None,
        clock: Callable[[], float] = time.time,
        observe_loop: Callable[[float], None] = lambda _: None,
        paused: Callable[[], CrawlPause | None] = lambda: None,
    ) -> None:
        self._store = store
        # None: this regulator leads unconditionally (one monitor, tests, the bench).
        self._lease = lease
        self._leading = lease is None
        self._holder_seen: str | None = None
        self._computed_rates = computed_rates
        self._settings = settings
        # Wall clock: window scores are Unix times written by every worker host.
        self._clock = clock
        self._memory = Memory()
        # Called with each loop's duration (s), failed or not (the metrics' histogram).
        self._observe_loop = observe_loop
        # The pause of the whole crawl in force (crawl_paused), None while it runs.
        self._paused = paused
        self.snapshot: RegulatorSnapshot | None = None
        # time.monotonic() when the last loop that raised nothing ended (None: none yet).
        self.completed_at: float | None = None

    @property
    def leading(self) -> bool:
        """True while this regulator holds the lease (or runs without one)."""
        return self._leading

    async def tick(self) -> RegulatorSnapshot | None:
        """One loop: read, decide, write; None when another monitor leads.

        Raises ``RedisError`` when Redis is away.
        """
        if self._lease is not None and not self._leading:
            await self._stand_by(self._lease)
            return None
        settings = self._settings
        computed = dict(self._computed_rates())
        plan = plan_read(computed, self._memory, settings.full_last_statuses_every)
        now_s = self._clock()
        observed = await self._store.read(
            plan.sources,
            now_s - settings.window_s,
            full_last_statuses=plan.full_last_statuses,
            failure_counters=plan.failure_counters,
            published=plan.published,
        )
        pause = self._paused()
        decision = decide(
            observed,
            computed,
            self._memory,
            plan,
            now_s=now_s,
            adaptive=settings.adaptive,
            paused_why=None if pause is None else f"crawl paused: {pause.message}",
        )
        written = await self._store.write(decision.writes, settings.pace_rate_ttl_ms, self._lease)
        if not written.applied:
            self._lose_lease(written.holder)
            return None
        return self._keep(decision)

    def _keep(self, decision: Decision) -> RegulatorSnapshot:
        """A written decision: its memory kept and its events logged (a failed write is
        decided again)."""
        self._memory = decision.memory
        for event in decision.events:
            getattr(log, event.level)(event.event, **event.fields)
        self.snapshot = decision.snapshot
        return decision.snapshot

    def _lose_lease(self, holder: str | None) -> None:
        """Another monitor leads (this one stalled past the lease): nothing was written."""
        self._leading = False
        self._holder_seen = holder
        self.snapshot = None
        log.warning(
            "leadership_lost", token=self._lease.token if self._lease else None, holder=holder
        )

    async def _stand_by(self, lease: LeaderLease) -> None:
        """Take the lease if it is free; setting rates starts on the next loop."""
        holder = await self._store.acquire(lease)
        if holder == lease.token:
            self._leading = True
            # A new term, as a new process would start it: nothing carried in memory from
            # an old term, the cuts are taken over from crawl_rates at its first loop.
            self._memory = Memory()
            log.info("leadership_acquired", token=lease.token, lease_ms=lease.ttl_ms)
        elif holder != self._holder_seen:
            log.info("leadership_standby", token=lease.token, holder=holder)
        self._holder_seen = holder

    async def release(self) -> None:
        """Give the lease up (on a clean stop), if this regulator holds it."""
        if self._lease is None or not self._leading:
            return
        self._leading = False
        try:
            released = await self._store.release(self._lease)
        except RedisError as e:
            # It expires by itself: a standby takes over one lease TTL later.
            log.warning("redis_unavailable", op="release_leadership", error=repr(e))
            return
        if released:
            log.info("leadership_released", token=self._lease.token)

    async def run(self, stop: asyncio.Event) -> None:
        """Tick on a fixed grid of ``period_s`` (monotonic clock) until ``stop`` is set,
        then release the lease.

        While Redis is away no rate is renewed (they expire: fail closed); attempts back
        off (``image_crawler.retry.Backoff``, from one period up to ``MAX_BACKOFF_S``),
        still on the grid, so never more often than once a period. Any other error is
        logged with its traceback and the loop goes on.
        """
        period_s = self._settings.period_s
        backoff = Backoff(base_s=period_s, cap_s=max(period_s, MAX_BACKOFF_S))
        origin = time.monotonic()
        while not stop.is_set():
            started = time.monotonic()
            try:
                await self.tick()
            except RedisError as e:
                wait_s = backoff.next_s()
                log.warning(
                    "redis_unavailable", op="regulate", error=repr(e), failures=backoff.failures
                )
            except Exception:
                wait_s = backoff.next_s()
                log.exception("regulator_error", failures=backoff.failures)
            else:
                backoff.reset()
                wait_s = 0.0
                self.completed_at = time.monotonic()
            took_s = time.monotonic() - started
            self._observe_loop(took_s)
            if took_s > period_s:
                log.warning("regulator_slow", took_s=round(took_s, 3), period_s=period_s)
            # The next tick of the grid, skipping those within ``wait_s - period_s`` from
            # now (none after a success or a single failure).
            skip_s = max(0.0, wait_s - period_s)
            wake_at = next_tick_at(origin, time.monotonic() + skip_s, period_s)
            await sleep_unless_stopped(stop, wake_at - time.monotonic())
        await self.release()
