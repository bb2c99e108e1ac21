"""The regulator's decision for one loop: what Redis holds in; writes and log events out.

Pure: ``plan_read`` says what a loop reads, ``decide`` turns what it read into the writes,
the log events and the snapshot, and both carry the regulator's ``Memory`` from one loop
to the next. Per source and loop:

- its configured rate is the computed one (from its image count) unless an operator
  override (``override_rate:``, or ``override-rate:``) holds a valid rate; overrides are
  read every loop, so a change applies within a second;
- while ``crawl_delay:{source}`` holds a delay (workers write the largest robots.txt
  Crawl-delay of the source's hosts, and list the source in ``crawl_delayed``), its
  configured rate is at most 1 / delay, override or not: the site asked. Not for a source
  in ``robots_exempt``. A member of ``crawl_delayed`` whose key expired leaves the set
  (the cap is lifted); a value that is not a delay is ignored and logged once;
- its effective rate follows its backoff signals (``adaptive``: cut when its server
  pushes back, climbing back while it answers well); a source in ``halted`` or
  ``temp_halted`` gets 0, and its effective rate waits, unchanged, until it is back;
- at a term's first loop (a monitor that took the lead, or started), its effective rate
  starts from the one the last leader published in ``crawl_rates`` when that is a recent
  cut (``takeover``), else at its configured rate; ``pacing_inherited`` counts what
  became of each source's record;
- the breakers trip on the 60 s window and the last 50 statuses (see ``breakers``),
  without the backoff statuses while the effective rate is above its floor; each trip
  logs one ``crawl_halted`` event;
- ``crawl_rates`` gets the fields whose ``PacingInfo`` changed, and is rewritten whole
  every ``RATES_REWRITE_LOOPS`` loops (so it comes back after Redis lost it).

Resuming after a permanent halt: the operator's procedure (``smembers halted``; ``set
override_rate:{source} N``; ``del statuslast50req:{source}``; ``srem halted {source}``)
leaves the 60 s window full of the errors that caused the halt, which would trip a
temporary halt again for up to a minute. So when a source that was in ``halted`` in the
previous loop is not any more, its ``status60s:`` window is deleted (the operator's
resume starts its error windows afresh), any temporary halt lifted, its effective rate
starts again at its configured rate, and ``crawl_resumed`` is logged; the source is paced
at its (possibly overridden) rate in that same loop. A resume made while no monitor was
running is not seen this way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final, Literal

from crawl_monitor.policy import breakers
from crawl_monitor.policy.adaptive import AdaptiveSettings, Pace, above_floor, hold, step
from crawl_monitor.policy.rates import (
    COMPUTED,
    CRAWL_DELAY,
    InvalidCrawlDelay,
    choose_rate,
    crawl_delay_why,
    parse_crawl_delay,
)
from crawl_monitor.policy.takeover import Outcome, counts, inherit
from crawl_monitor.store import EMPTY_SOURCE, ObservedState, SourceState, Writes
from image_crawler.contract import (
    OVERRIDE_RATE_ALIAS_PREFIX,
    OVERRIDE_RATE_PREFIX,
    PACE_BACKOFF,
    PACE_CONFIGURED,
    PACE_HALTED,
    PACE_RECOVERING,
    PacingInfo,
    crawl_delay_key,
)

# crawl_rates is rewritten whole every this many loops (so it comes back after Redis lost
# it); in between, only its changed fields are.
RATES_REWRITE_LOOPS: Final = 30

_SAWTOOTH: Final = frozenset({PACE_BACKOFF, PACE_RECOVERING})

HALTED_WHY: Final = "halted: an operator must resume it"
TEMP_HALTED_WHY: Final = (
    f"temporarily halted: more than {breakers.ERROR_SHARE_LIMIT:.0%} errors in the last minute"
)


@dataclasses.dataclass(frozen=True, slots=True)
class LogEvent:
    """A structlog event to emit once the loop's writes are applied."""

    level: Literal["info", "warning"]
    event: str
    fields: Mapping[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class RegulatorSnapshot:
    """What the last completed loop saw and decided (read by the monitoring log)."""

    # Configured rate (requests/s) of every known source: computed, or its override.
    rates: Mapping[str, float]
    # Pacing of every known source: its effective rate (0 while halted), and why.
    pacing: Mapping[str, PacingInfo]
    halted: frozenset[str]
    temp_halted: frozenset[str]
    # Histogram of each source's last 50 statuses (sources with none left out).
    last_statuses: Mapping[str, Mapping[str, int]]


@dataclasses.dataclass(frozen=True, slots=True)
class Memory:
    """What a leading regulator carries from one loop to the next. ``Memory()`` starts a
    term afresh, as a new process would."""

    loops: int = 0
    # ``halted`` as the last loop left it (None: no loop yet).
    halted: frozenset[str] | None = None
    # Each known source's adaptive rate.
    paces: Mapping[str, Pace] = dataclasses.field(default_factory=dict)
    # crawl_rates as last written (None: not yet, so the next loop writes it whole), and
    # how many loops ago it was written whole.
    pacing: Mapping[str, PacingInfo] | None = None
    loops_since_whole: int = 0
    # Each source's last full last-50 histogram, for the monitoring log.
    last_statuses: Mapping[str, Mapping[str, int]] = dataclasses.field(default_factory=dict)
    # The failure counters of the last read, of the sources whose window then held no
    # error: those of them whose counter has not moved are not read again (None: read
    # every source).
    quiet_counters: Mapping[str, str] | None = None
    # Override keys whose value was reported as ignored, and Redis errors reported, so
    # that each is logged once.
    reported_overrides: Mapping[str, str] = dataclasses.field(default_factory=dict)
    reported_key_errors: frozenset[str] = frozenset()
    # crawl_delay keys whose value was reported as ignored (logged once, likewise).
    reported_crawl_delays: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class ReadPlan:
    """What one loop reads."""

    sources: Sequence[str]
    # The sources whose whole last-50 histogram is read (None: every source).
    full_last_statuses: frozenset[str] | None
    failure_counters: Mapping[str, str] | None
    # Whether crawl_rates is read: at a term's first loop, to take over the last leader's
    # rates (``takeover``).
    published: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """One loop's outcome: apply ``writes``; once applied, emit ``events`` and keep
    ``snapshot`` and ``memory``."""

    writes: Writes
    events: tuple[LogEvent, ...]
    snapshot: RegulatorSnapshot
    memory: Memory


def plan_read(
    computed: Mapping[str, float], memory: Memory, full_last_statuses_every: int
) -> ReadPlan:
    """The read of the known sources (``computed``): the whole last-50 histograms of one
    source in ``full_last_statuses_every``, in turn (of every source at a term's first
    loop), the failure counters seen by the last loop, and at a term's first loop the
    rates the last leader published."""
    sources = sorted(computed)
    turn = memory.loops % full_last_statuses_every
    first = memory.loops == 0
    return ReadPlan(
        sources=sources,
        full_last_statuses=None if first else frozenset(sources[turn::full_last_statuses_every]),
        failure_counters=memory.quiet_counters,
        published=first,
    )


def decide(
    observed: ObservedState,
    computed: Mapping[str, float],
    memory: Memory,
    plan: ReadPlan,
    *,
    now_s: float,
    adaptive: AdaptiveSettings,
    paused_why: str | None = None,
) -> Decision:
    """One loop's decision (see the module's docstring).

    ``paused_why``: the whole crawl is paused (``crawl_paused``), for this reason: every
    source not halted is paced at 0 with it as its why, its adaptive rate held.

    ``observed`` is what ``plan`` read, ``computed`` each known source's computed rate
    (requests/s) and ``now_s`` the time of the read (Unix s). At a term's first loop
    (``memory.loops == 0``), ``observed.published`` (None: not read) seeds the sources'
    adaptive rates.
    """
    events: list[LogEvent] = []
    key_errors = _report_key_errors(observed, memory.reported_key_errors, events)
    delays = _crawl_delays(observed, memory.reported_crawl_delays, events)
    loop = _Loop.begin(observed, memory, delays.in_force, events, now_s=now_s, adaptive=adaptive)
    if paused_why is not None:
        loop = dataclasses.replace(loop, paused_why=paused_why)
    # Each source: its configured rate, the breakers' verdict on it, its pace.
    tally = _Tally()
    for source in plan.sources:
        _decide_source(loop, tally, source, computed[source])
    if loop.published is not None:
        events.append(_inherited(loop.inherited, adaptive))
    # Temporary halts of sources no longer known are lifted (they get no rate anyway).
    trips = _trips(tally.verdicts, observed.temp_halted - computed.keys())
    events += _halt_events(observed, tally.rates, loop.resumed, trips)
    whole = memory.pacing is None or memory.loops_since_whole + 1 >= RATES_REWRITE_LOOPS
    writes = _writes(loop, tally, trips, delays.gone, whole=whole)
    halted = observed.halted | trips.halt
    last_statuses = _last_statuses(plan, observed, memory.last_statuses)
    return Decision(
        writes=writes,
        events=tuple(events),
        snapshot=RegulatorSnapshot(
            rates=tally.rates,
            pacing=tally.pacing,
            halted=halted,
            temp_halted=(observed.temp_halted | trips.temp_halt) - trips.lift,
            # As of each source's last full read (full_last_statuses_every loops at most).
            last_statuses=last_statuses,
        ),
        memory=Memory(
            loops=memory.loops + 1,
            halted=halted,
            paces=tally.paces,
            pacing=tally.pacing,
            loops_since_whole=0 if whole else memory.loops_since_whole + 1,
            last_statuses=last_statuses,
            quiet_counters=_quiet_counters(observed),
            reported_overrides=loop.overrides.reported,
            reported_key_errors=key_errors,
            reported_crawl_delays=delays.bad,
        ),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Loop:
    """What deciding each source of one loop needs."""

    observed: ObservedState
    # Sources an operator resumed since the last loop (no longer in ``halted``).
    resumed: frozenset[str]
    paces_before: Mapping[str, Pace]
    pacing_before: Mapping[str, PacingInfo]
    # The robots.txt Crawl-delays in force (source -> delay, s).
    delays: Mapping[str, float]
    overrides: _Overrides
    # The loop's log events, in order: each source's are appended as it is decided.
    events: list[LogEvent]
    now_s: float
    adaptive: AdaptiveSettings
    # crawl_rates as the last leader left it, at a term's first loop (None: any other),
    # and what became of each known source's record, appended as it is decided.
    published: Mapping[str, str] | None = None
    inherited: list[Outcome] = dataclasses.field(default_factory=list)
    # The whole crawl is paused, for this reason (None: it runs).
    paused_why: str | None = None

    @classmethod
    def begin(
        cls,
        observed: ObservedState,
        memory: Memory,
        delays: Mapping[str, float],
        events: list[LogEvent],
        *,
        now_s: float,
        adaptive: AdaptiveSettings,
    ) -> _Loop:
        """The loop deciding on ``observed`` after the one ``memory`` remembers: the sources
        resumed since, their paces, and at a term's first loop the last leader's rates."""
        return cls(
            observed=observed,
            resumed=frozenset() if memory.halted is None else memory.halted - observed.halted,
            paces_before=memory.paces,
            pacing_before=memory.pacing or {},
            delays=delays,
            overrides=_Overrides(memory.reported_overrides, events),
            events=events,
            now_s=now_s,
            adaptive=adaptive,
            published=observed.published if memory.loops == 0 else None,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class _Tally:
    """The loop's decisions, filled in source by source (of every known source).

    Filled in place rather than gathered from a result object per source: a loop then
    keeps no new object per source alive, so thousands of sources do not wake the
    garbage collector every loop.
    """

    # Configured rate (requests/s): computed or overridden, capped by a Crawl-delay.
    rates: dict[str, float] = dataclasses.field(default_factory=dict)
    # The breakers' verdicts, of the sources Redis held something about (no other source
    # can trip or be lifted).
    verdicts: dict[str, breakers.BreakerDecision] = dataclasses.field(default_factory=dict)
    paces: dict[str, Pace] = dataclasses.field(default_factory=dict)
    # The rate for pace_rate:{source}: its effective rate, 0 while halted.
    pace_rates: dict[str, float] = dataclasses.field(default_factory=dict)
    pacing: dict[str, PacingInfo] = dataclasses.field(default_factory=dict)


def _decide_source(loop: _Loop, tally: _Tally, source: str, computed_rps: float) -> None:
    """One source: its configured rate, the breakers' verdict, then its pace."""
    observed = loop.observed
    state = observed.sources.get(source)
    resumed = source in loop.resumed
    before = None if resumed else loop.paces_before.get(source)
    delay_s = loop.delays.get(source) if loop.delays else None
    rate, origin = _configured_rate(computed_rps, state, delay_s, loop.overrides, source)
    tally.rates[source] = rate
    signals = observed.backoff_signals.get(source, 0)
    if loop.published is not None and before is None:
        # Before the breakers: whether its backoff statuses are excused depends on it.
        taken = inherit(loop.published.get(source), rate, signals, loop.now_s, loop.adaptive)
        loop.inherited.append(taken.outcome)
        before = taken.pace
    verdict = _judge(loop, source, state, before, rate)
    if verdict is not None:
        tally.verdicts[source] = verdict
    halt_why = _halt_why(source in observed.halted, verdict) or loop.paused_why
    if halt_why is not None:
        tally.paces[source] = hold(before, rate, signals, loop.now_s)
        tally.pace_rates[source] = 0.0
        tally.pacing[source] = PacingInfo(0.0, rate, origin, PACE_HALTED, halt_why)
        return
    pace = tally.paces[source] = step(before, rate, signals, loop.now_s, loop.adaptive)
    tally.pace_rates[source] = pace.effective_rps
    info = tally.pacing[source] = _pacing_info(
        pace, origin, before, loop.pacing_before.get(source), delay_s
    )
    if before is not None and _noteworthy(before.state, pace.state):
        loop.events.append(_pacing_changed(source, before, info))


def _judge(
    loop: _Loop, source: str, state: SourceState | None, before: Pace | None, rate_rps: float
) -> breakers.BreakerDecision | None:
    """The breakers' verdict on ``source``, at its configured rate ``rate_rps`` and last
    pace ``before``; None when Redis holds nothing about it (the common case)."""
    observed = loop.observed
    temp_halted = source in observed.temp_halted
    if state is None and not temp_halted:
        return None
    state = state or EMPTY_SOURCE
    return breakers.decide(
        # The operator's resume starts its error windows afresh.
        {} if source in loop.resumed else state.window,
        state.last_statuses,
        temp_halted=temp_halted,
        halted=source in observed.halted,
        backoff_excused=above_floor(before, rate_rps, loop.adaptive),
        hosts=state.hosts,
        failing_hosts=state.failing_hosts,
    )


def _halt_why(halted: bool, verdict: breakers.BreakerDecision | None) -> str | None:
    """Why a source gets no request this loop (None: it is paced)."""
    if halted or (verdict is not None and verdict.trips_permanent):
        return HALTED_WHY
    if verdict is not None and verdict.temp_halted:
        return TEMP_HALTED_WHY
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class _Trips:
    """The loop's changes to the halted sets."""

    halt: frozenset[str]
    temp_halt: frozenset[str]
    lift: frozenset[str]


def _trips(
    verdicts: Mapping[str, breakers.BreakerDecision], unknown_temp_halted: Collection[str]
) -> _Trips:
    """The breakers' transitions, and the lift of ``unknown_temp_halted``."""
    return _Trips(
        halt=frozenset(s for s, v in verdicts.items() if v.trips_permanent),
        temp_halt=frozenset(s for s, v in verdicts.items() if v.trips_temporary),
        lift=frozenset(s for s, v in verdicts.items() if v.lifts_temporary)
        | frozenset(unknown_temp_halted),
    )


def _writes(
    loop: _Loop, tally: _Tally, trips: _Trips, delays_gone: Collection[str], *, whole: bool
) -> Writes:
    """The loop's writes; crawl_rates gets its changed fields, or ``whole``."""
    before, pacing = loop.pacing_before, tally.pacing
    fields: Mapping[str, PacingInfo] = pacing
    gone: Collection[str] = ()
    if not whole:
        fields = {
            s: info for s, info in pacing.items() if info is not (b := before.get(s)) and info != b
        }
        gone = before.keys() - pacing.keys()
    return Writes(
        pace_rates=tally.pace_rates,
        pacing=fields,
        pacing_gone=gone,
        pacing_whole=whole,
        halt=trips.halt,
        temp_halt=trips.temp_halt,
        lift_temp_halt=trips.lift,
        clear_window=loop.resumed,
        forget_crawl_delayed=delays_gone,
    )


def _quiet_counters(observed: ObservedState) -> dict[str, str]:
    """The failure counters of the sources whose window held no error (nor a key error):
    the next loop skips those whose counter has not moved."""
    unquiet = {s for s, state in observed.sources.items() if state.window or state.errors}
    return {s: n for s, n in observed.failure_counters.items() if s not in unquiet}


def _configured_rate(
    computed_rps: float,
    state: SourceState | None,
    delay_s: float | None,
    overrides: _Overrides,
    source: str,
) -> tuple[float, str]:
    """A source's configured rate and its origin: computed or overridden, then capped at
    1 / ``delay_s`` (its robots.txt Crawl-delay in force, None: none)."""
    if state is None:
        rate, origin = computed_rps, COMPUTED
        overrides.check(source, {})
    else:
        choice = choose_rate(computed_rps, state.override, state.override_alias)
        overrides.check(source, choice.ignored)
        rate, origin = choice.rate_rps, choice.origin
    if delay_s is not None and 1.0 / delay_s < rate:
        return 1.0 / delay_s, CRAWL_DELAY
    return rate, origin


@dataclasses.dataclass(frozen=True, slots=True)
class _CrawlDelays:
    # The robots.txt Crawl-delays in force: source -> delay (s).
    in_force: dict[str, float]
    # crawl_delayed members whose key is gone (expired with their robots.txt files).
    gone: list[str]
    # Keys whose value is not a delay -> that value.
    bad: dict[str, str]


def _crawl_delays(
    observed: ObservedState, reported: Mapping[str, str], events: list[LogEvent]
) -> _CrawlDelays:
    """The crawl_delay keys read, sorted out; a value that is not a delay is logged once
    (until it changes or goes)."""
    delays = _CrawlDelays({}, [], {})
    for source, raw in observed.crawl_delays.items():
        if raw is None:
            delays.gone.append(source)  # the cap is lifted
        elif source not in observed.robots_exempt:  # the site's permission: no cap
            try:
                delays.in_force[source] = parse_crawl_delay(raw)
            except InvalidCrawlDelay:
                delays.bad[crawl_delay_key(source)] = raw
    for key in sorted(delays.bad):
        if reported.get(key) != delays.bad[key]:
            fields = {"key": key, "value": delays.bad[key], "reason": "not a number of seconds > 0"}
            events.append(LogEvent("warning", "crawl_delay_ignored", fields))
    return delays


def _pacing_info(
    pace: Pace,
    origin: str,
    before: Pace | None,
    info_before: PacingInfo | None,
    delay_s: float | None,
) -> PacingInfo:
    if (
        pace is before
        and info_before is not None
        and info_before.state == pace.state
        and info_before.origin == origin
    ):
        return info_before  # the common case: nothing new since the last loop
    rate = round(pace.effective_rps, 6)
    why = pace.why
    if origin == CRAWL_DELAY and delay_s is not None:
        capped = crawl_delay_why(delay_s)
        why = capped if pace.state == PACE_CONFIGURED else f"{why}; {capped}"
    # The step's time: a monitor that takes the lead judges the record's age by it.
    return PacingInfo(rate, pace.configured_rps, origin, pace.state, why, round(pace.at_s, 3))


def _noteworthy(before: str, after: str) -> bool:
    """Whether a change of pacing state is logged: all but the climbs and cuts of a
    source that keeps finding its server's capacity (those are in crawl_rates)."""
    return before != after and not (before in _SAWTOOTH and after in _SAWTOOTH)


def _pacing_changed(source: str, before: Pace, info: PacingInfo) -> LogEvent:
    return LogEvent(
        "info",
        "pacing_changed",
        {
            "source": source,
            "state": info.state,
            "previous_state": before.state,
            "rate_rps": info.rate_rps,
            "configured_rps": info.configured_rps,
            "why": info.why,
        },
    )


def _inherited(outcomes: Sequence[Outcome], adaptive: AdaptiveSettings) -> LogEvent:
    """The term's first loop: how many sources took their rate over from the last leader,
    and why the others start at their configured rate."""
    return LogEvent(
        "info",
        "pacing_inherited",
        {"sources": len(outcomes), **counts(outcomes), "max_age_s": adaptive.inherit_max_age_s},
    )


def _halt_events(
    observed: ObservedState, rates: Mapping[str, float], resumed: Collection[str], trips: _Trips
) -> list[LogEvent]:
    events = [
        LogEvent("info", "crawl_resumed", {"source": s, "rate_rps": rates.get(s)})
        for s in sorted(resumed)
    ]
    events += [_halted(s, "temporary", observed.of(s).window) for s in sorted(trips.temp_halt)]
    events += [_halted(s, "permanent", observed.of(s).last_statuses) for s in sorted(trips.halt)]
    events += [LogEvent("info", "temporary_halt_lifted", {"source": s}) for s in sorted(trips.lift)]
    return events


def _halted(source: str, halt_type: breakers.HaltType, histogram: Mapping[str, int]) -> LogEvent:
    return LogEvent(
        "warning",
        "crawl_halted",
        {
            "type": halt_type,
            "source": source,
            "msg": breakers.halt_message(source, halt_type, histogram),
        },
    )


def _last_statuses(
    plan: ReadPlan, observed: ObservedState, before: Mapping[str, Mapping[str, int]]
) -> dict[str, Mapping[str, int]]:
    """Each source's last full last-50 histogram, for the monitoring log."""
    kept = dict(before)
    for source in plan.sources if plan.full_last_statuses is None else plan.full_last_statuses:
        kept.pop(source, None)
    for source, state in observed.sources.items():
        if state.last_statuses:  # read in full, or all 50 failed (also in full)
            kept[source] = state.last_statuses
    for gone in kept.keys() - set(plan.sources):
        del kept[gone]
    return kept


def _report_key_errors(
    observed: ObservedState, reported: frozenset[str], events: list[LogEvent]
) -> frozenset[str]:
    new = [e for state in observed.sources.values() for e in state.errors if e not in reported]
    for error in dict.fromkeys(new):
        events.append(LogEvent("warning", "redis_key_unreadable", {"error": error}))
    return reported | frozenset(new) if new else reported


class _Overrides:
    """Logs each override value that is not a rate once (until it changes or goes)."""

    def __init__(self, reported: Mapping[str, str], events: list[LogEvent]) -> None:
        self.reported = dict(reported)
        self._events = events

    def check(self, source: str, ignored: Mapping[str, str]) -> None:
        reported = self.reported
        if not ignored and not reported:
            return
        for prefix in (OVERRIDE_RATE_PREFIX, OVERRIDE_RATE_ALIAS_PREFIX):
            key = f"{prefix}{source}"
            raw = ignored.get(prefix)
            if raw is None:
                reported.pop(key, None)
            elif reported.get(key) != raw:
                reported[key] = raw
                self._events.append(
                    LogEvent(
                        "warning",
                        "override_ignored",
                        {"key": key, "value": raw, "reason": "not a rate >= 0"},
                    )
                )
