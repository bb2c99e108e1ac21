"""The rate regulator: every second, refill each known source's token bucket and run its
circuit breakers.

One loop (``tick``) reads the state of every known source in one round trip, decides in
Python (``rates``, ``breakers``) and writes every bucket and halt in one more. Buckets are
SET with a short expiry (``token_ttl_ms``), so that when the monitor dies or cannot reach
Redis no source keeps a token for long: crawling fails closed.

Per source and second:

- the rate is the computed one (from its image count) unless an operator override
  (``override_rate:``, or ``override-rate:``) holds a valid rate; overrides are read
  every loop, so a change applies within a second;
- a source in ``halted`` or ``temp_halted`` gets a bucket of 0; others get their
  ``TokenSchedule``'s share of the second;
- the breakers trip on the 60 s window and the last 50 statuses (see ``breakers``); each
  trip logs one ``crawl_halted`` event.

Resuming after a permanent halt: the operator's procedure (``smembers halted``; ``set
override_rate:{source} N``; ``del statuslast50req:{source}``; ``srem halted {source}``)
leaves the 60 s window full of the errors that caused the halt, which would trip a
temporary halt again for up to a minute. So when a source that was in ``halted`` in the
previous loop is not any more, the regulator deletes its ``status60s:`` window (the
operator's resume starts its error windows afresh), lifts any temporary halt, and logs
``crawl_resumed``; the source gets tokens at its (possibly overridden) rate in that same
loop. A resume made while no monitor was running is not seen this way.

Leadership: with a ``LeaderLease`` (as ``python -m crawl_monitor`` always runs), only the
monitor holding ``monitor_leader`` refills and runs breakers: the bucket is SET, not
added to, but two refillers at different phases of the second would still double a
source's rate. The leader renews the lease in its write (no extra round trip); a write
made after the lease was lost writes nothing, and the monitor becomes a standby. A
standby only tries to take the lease, once a loop, and refills from the loop after it
took it: so the new leader's first refill comes at least a full period after the last
leader's last one (which could have been just before the lease expired or was
released), and a take-over does not double the rate either. Changes are logged as
``leadership_acquired``, ``leadership_standby`` (another monitor leads),
``leadership_lost`` and ``leadership_released`` (on a clean stop, so that a standby
takes over on its next loop instead of after the lease's expiry).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping

from redis.exceptions import RedisError

from crawl_monitor.breakers import WINDOW_S, BreakerDecision, HaltType, decide, halt_message
from crawl_monitor.rates import TokenSchedule, choose_rate, next_tick_at
from crawl_monitor.store import (
    EMPTY_SOURCE,
    LeaderLease,
    ObservedState,
    RegulatorStore,
    Writes,
)
from image_crawler.contract import OVERRIDE_RATE_ALIAS_PREFIX, OVERRIDE_RATE_PREFIX
from image_crawler.logs import get_logger

log = get_logger(__name__)

MAX_BACKOFF_S = 8.0
# crawl_rates is rewritten when a rate changes, and every this many loops in any case
# (so it comes back after Redis lost it) without rewriting thousands of fields a second.
RATES_REWRITE_LOOPS = 30


@dataclasses.dataclass(frozen=True, slots=True)
class RegulatorSettings:
    period_s: float = 1.0
    token_ttl_ms: int = 1500
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
    # not read at all (the bench's loop with 10,000 busy sources: 199-224 ms instead of
    # 250-265). Statuses written without the counter (not by a worker) wait for the turn.
    full_last_statuses_every: int = 5


@dataclasses.dataclass(frozen=True, slots=True)
class RegulatorSnapshot:
    """What the last completed loop saw and decided (read by the monitoring log)."""

    # Effective rate (requests/s) of every known source, overrides applied.
    rates: Mapping[str, float]
    # Bucket value given to each known source this second.
    tokens: Mapping[str, int]
    halted: frozenset[str]
    temp_halted: frozenset[str]
    # Histogram of each source's last 50 statuses (sources with none left out).
    last_statuses: Mapping[str, Mapping[str, int]]


class Regulator:
    """Refills buckets and runs breakers for the sources ``computed_rates()`` returns."""

    def __init__(
        self,
        store: RegulatorStore,
        computed_rates: Callable[[], Mapping[str, float]],
        settings: RegulatorSettings = RegulatorSettings(),
        *,
        lease: LeaderLease | None = None,
        clock: Callable[[], float] = time.time,
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
        self._schedules: dict[str, TokenSchedule] = {}
        self._previously_halted: frozenset[str] | None = None
        self._reported_overrides: dict[str, str] = {}
        self._reported_key_errors: set[str] = set()
        self._written_rates: dict[str, float] | None = None
        self._loops_since_rates_written = 0
        self._loops = 0
        self._last_statuses: dict[str, Mapping[str, int]] = {}
        # The failure counters of the last read, of the sources whose window then held no
        # error: those of them whose counter has not moved are not read again (None: read
        # every source).
        self._quiet_counters: dict[str, str] | None = None
        self.snapshot: RegulatorSnapshot | None = None

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
        computed = dict(self._computed_rates())
        sources = sorted(computed)
        every = self._settings.full_last_statuses_every
        turn = self._loops % every
        full = None if self._loops == 0 else set(sources[turn::every])
        self._loops += 1
        observed = await self._store.read(
            sources,
            self._clock() - self._settings.window_s,
            full_last_statuses=full,
            failure_counters=self._quiet_counters,
        )
        unquiet = {s for s, state in observed.sources.items() if state.window or state.errors}
        self._quiet_counters = {
            s: n for s, n in observed.failure_counters.items() if s not in unquiet
        }
        self._report_key_errors(observed)
        self._remember_last_statuses(sources, full, observed)

        resumed: frozenset[str] = frozenset()
        if self._previously_halted is not None:
            resumed = self._previously_halted - observed.halted

        rates: dict[str, float] = {}
        tokens: dict[str, int] = {}
        # Only of the sources Redis said something about: the others cannot change.
        decisions: dict[str, BreakerDecision] = {}
        states, halted, temp_halted = observed.sources, observed.halted, observed.temp_halted
        schedules, period_s = self._schedules, self._settings.period_s
        for source in sources:
            state = states.get(source)
            if state is None and source not in temp_halted:
                # Nothing in Redis about it (the common case): no override, no trip.
                rate = computed[source]
                if self._reported_overrides:
                    self._report_override(source, {})
                stopped = source in halted
            else:
                state = state or EMPTY_SOURCE
                choice = choose_rate(computed[source], state.override, state.override_alias)
                self._report_override(source, choice.ignored)
                rate = choice.rate_rps
                decision = decisions[source] = decide(
                    {} if source in resumed else state.window,
                    state.last_statuses,
                    temp_halted=source in temp_halted,
                    halted=source in halted,
                )
                stopped = source in halted or decision.trips_permanent or decision.temp_halted
            rates[source] = rate
            schedule = schedules.get(source)
            if schedule is None:
                schedule = schedules[source] = TokenSchedule()
            if stopped:
                schedule.reset()
                tokens[source] = 0
            else:
                tokens[source] = schedule.next_refill(rate, period_s)
        for gone in self._schedules.keys() - computed.keys():
            del self._schedules[gone]

        halt = {s for s, d in decisions.items() if d.trips_permanent}
        temp_halt = {s for s, d in decisions.items() if d.trips_temporary}
        lift = {s for s, d in decisions.items() if d.lifts_temporary}
        # Temporary halts of sources no longer known (they get no tokens anyway).
        lift |= observed.temp_halted - computed.keys()
        rewrite_rates = (
            rates != self._written_rates or self._loops_since_rates_written >= RATES_REWRITE_LOOPS
        )
        written = await self._store.write(
            Writes(
                tokens=tokens,
                rates=rates if rewrite_rates else None,
                halt=halt,
                temp_halt=temp_halt,
                lift_temp_halt=lift,
                clear_window=resumed,
            ),
            self._settings.token_ttl_ms,
            self._lease,
        )
        if not written.applied:
            # Another monitor leads (this one stalled past the lease): nothing was written.
            self._leading = False
            self._holder_seen = written.holder
            self.snapshot = None
            log.warning(
                "leadership_lost",
                token=self._lease.token if self._lease else None,
                holder=written.holder,
            )
            return None

        if rewrite_rates:
            self._written_rates, self._loops_since_rates_written = rates, 0
        else:
            self._loops_since_rates_written += 1
        # Reported only once written: a failed write is decided (and reported) again.
        for source in sorted(resumed):
            log.info("crawl_resumed", source=source, rate_rps=rates.get(source))
        for source in sorted(temp_halt):
            self._report_halt(source, "temporary", observed.of(source).window)
        for source in sorted(halt):
            self._report_halt(source, "permanent", observed.of(source).last_statuses)
        for source in sorted(lift):
            log.info("temporary_halt_lifted", source=source)

        halted_now = observed.halted | halt
        self._previously_halted = halted_now
        self.snapshot = RegulatorSnapshot(
            rates=rates,
            tokens=tokens,
            halted=halted_now,
            temp_halted=(observed.temp_halted | temp_halt) - lift,
            # As of each source's last full read (full_last_statuses_every loops at most).
            last_statuses=dict(self._last_statuses),
        )
        return self.snapshot

    def _remember_last_statuses(
        self, sources: list[str], full: set[str] | None, observed: ObservedState
    ) -> None:
        """Keep each source's last full last-50 histogram, for the monitoring log."""
        read_in_full = sources if full is None else full
        for source in read_in_full:
            self._last_statuses.pop(source, None)
        for source, state in observed.sources.items():
            if state.last_statuses:  # read in full, or all 50 failed (also in full)
                self._last_statuses[source] = state.last_statuses
        for gone in self._last_statuses.keys() - set(sources):
            del self._last_statuses[gone]

    async def _stand_by(self, lease: LeaderLease) -> None:
        """Take the lease if it is free; refilling starts on the next loop."""
        holder = await self._store.acquire(lease)
        if holder == lease.token:
            self._leading = True
            # Start afresh, as a new process would: nothing carried from an old term.
            self._schedules.clear()
            self._previously_halted = None
            self._written_rates = None
            self._quiet_counters = None
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

    @staticmethod
    def _report_halt(source: str, halt_type: HaltType, histogram: Mapping[str, int]) -> None:
        log.warning(
            "crawl_halted",
            type=halt_type,
            source=source,
            msg=halt_message(source, halt_type, histogram),
        )

    def _report_override(self, source: str, ignored: Mapping[str, str]) -> None:
        if not ignored and not self._reported_overrides:
            return
        for prefix in (OVERRIDE_RATE_PREFIX, OVERRIDE_RATE_ALIAS_PREFIX):
            key = f"{prefix}{source}"
            raw = ignored.get(prefix)
            if raw is None:
                self._reported_overrides.pop(key, None)
            elif self._reported_overrides.get(key) != raw:
                self._reported_overrides[key] = raw
                log.warning("override_ignored", key=key, value=raw, reason="not a rate >= 0")

    def _report_key_errors(self, observed: ObservedState) -> None:
        for state in observed.sources.values():
            for error in state.errors:
                if error not in self._reported_key_errors:
                    self._reported_key_errors.add(error)
                    log.warning("redis_key_unreadable", error=error)

    async def run(self, stop: asyncio.Event) -> None:
        """Tick on a fixed grid of ``period_s`` (monotonic clock) until ``stop`` is set,
        then release the lease.

        While Redis is away no bucket is refilled (they expire: fail closed); attempts back
        off up to ``MAX_BACKOFF_S``. Any other error is logged with its traceback and the
        loop goes on.
        """
        period_s = self._settings.period_s
        origin = time.monotonic()
        failures = 0
        while not stop.is_set():
            started = time.monotonic()
            try:
                await self.tick()
            except RedisError as e:
                failures += 1
                log.warning("redis_unavailable", op="regulate", error=repr(e), failures=failures)
            except Exception:
                failures += 1
                log.exception("regulator_error", failures=failures)
            else:
                failures = 0
            took_s = time.monotonic() - started
            if took_s > period_s:
                log.warning("regulator_slow", took_s=round(took_s, 3), period_s=period_s)
            # Normally the next tick of the grid; after failures, a tick 1, 2, 4, 8 s away.
            backoff_s = min(period_s * 2 ** (failures - 1), MAX_BACKOFF_S) if failures else 0.0
            skip_s = max(0.0, backoff_s - period_s)
            wake_at = next_tick_at(origin, time.monotonic() + skip_s, period_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, wake_at - time.monotonic()))
        await self.release()
