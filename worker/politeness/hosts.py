"""Hosts: the unit of politeness inside a source. Pure, no I/O.

A URL's politeness key (``HostKey``) is its source and its host: the lower-cased host
name, or under ``PACING_KEY=domain`` its registered domain by the Public Suffix List
(``publicsuffixlist``, whose wheel ships the list: nothing is downloaded at run time).
Each key is paced on its own, and its source's rate stays the ceiling of all its hosts
together: a request starts only in a slot of both (see worker/politeness/pacing.py).

Everything polite that used to be per source is per host, decided where requests are
made, in the pacing script (``lua/pacing_acquire.lua``), from what each worker reports
of its answers (``HostReport``) when it next asks for slots. A host's state is one Redis
hash, ``pace_host:{source}:{host}`` (``HostState``), which expires once the host has been
idle for ``idle_s`` (longer while it is halted): nothing loops over hosts.

- **Rate.** A host's ceiling is its source's rate, capped by ``host_rate:{source}`` (or
  ``MAX_HOST_RATE``), or its own ``override`` field. A host never heard from starts at
  ``start_rps`` (or its ceiling, if lower) and, while its answers are clean, gains
  ``slow_start_gain`` requests/s per clean answer: its rate grows by that factor every
  second it is used at its rate (about 7 times a second with the default gain of 2), until
  its ceiling or its first backoff signal. A backoff signal (429, 503, a timeout, an answer
  much slower than the host's usual) ends the slow start (cutting the rate to
  ``slow_start_exit_factor``), and later ones cut it to ``decrease_factor`` of itself,
  at most once per ``cooldown_s`` and never below the
  floor; without signals it climbs back by ``max(increase_share_per_s x its rate,
  min_increase_rps_per_s)`` per second of clean answers, counting at most
  ``climb_gap_s`` since its last answer. Relative to the host's own rate, not its
  ceiling: a host that takes 5/s under a source of 100/s would otherwise climb 1/s a
  second and be refused every few seconds; and a host that got no answer for a while
  (idle, or starved of its source's slots) does not come back near its ceiling.
- **Crawl-delay.** The host's robots.txt Crawl-delay (``delay``, until ``delay_until``)
  is the shortest interval between its requests, whatever its rate. Its slots come
  ``delay / DELAY_SHARE`` apart: a worker starts a slot of so long an interval at most
  a twentieth of it late (worker/politeness/pacing.py, ``late_limit``), so that two
  requests still leave at least the delay apart.
- **Breaker.** A host whose server fails (``host_failure``: a 5xx other than 503, a
  dropped or refused connection, a timeout at the floor, ...) ``halt_after`` times in a
  row is halted on its own for ``halt_base_s``, doubled at each halt in a row up to
  ``halt_max_s``; after a halt one request probes it, and one more failure halts it
  again. A clean answer ends the streak. A host failing for ``give_up_s`` since its
  streak began is given up: its URLs end as ``HostUnavailable``. Backoff statuses are not
  failures while the host's rate can still fall (as for a source, crawl_monitor.policy.
  breakers), and count as failures at its floor.
- **Operators** halt a host with its ``halt`` field and set its rate with ``override``;
  a hash holding either never expires. Resuming removes ``halt`` and the breaker's
  fields.
- **What operators see.** Each ask also says why the host is paced as it is
  (``host_why``: at its source's pace, or paced below it by its slow start, Crawl-delay,
  ceiling or a climb, backed off after a cut, or halted) and keeps its source's host index
  (``host_index:{source}``, image_crawler/contract.py) up to date: the host's member is
  written at once when its state changes, else once per ``index_refresh_s`` while it is
  asked about; what was written stays in the hash (``why``, ``seen``).

``host_step`` and ``round_robin_grant`` state the rule; the Lua script is its fast path,
and test/worker/test_lua_twins.py holds both to the same answers.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Final

from yarl import URL

from image_crawler.contract import (
    BACKOFF_STATUSES,
    HOST_IDLE_S,
    HOST_INDEX_BAND,
    HOST_INDEX_PREFIX,
    HOST_WHY,
    WHY_BREAKER,
    WHY_CAP,
    WHY_CLIMB,
    WHY_CRAWL_DELAY,
    WHY_CUT,
    WHY_GONE,
    WHY_OPERATOR,
    WHY_PACE,
    WHY_SLOW_START,
    Status,
    host_index_score,
)

PACING_KEYS: Final = ("host", "domain")

# Loops and asks read the wall clock a hair apart: a cut one cooldown after the last one
# must not be deferred by that hair (as crawl_monitor.policy.adaptive).
COOLDOWN_SLACK_S: Final = 0.05

# A Crawl-delay's slots are the delay over this apart (see the module's docstring).
DELAY_SHARE: Final = 0.95


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class HostKey:
    """The unit of politeness: a source and one of its hosts (or registered domains)."""

    source: str
    host: str


@functools.cache
def _suffixes() -> object:
    from publicsuffixlist import PublicSuffixList  # loaded only under PACING_KEY=domain

    return PublicSuffixList()


def registered_domain(host: str) -> str:
    """``host``'s registered domain by the Public Suffix List (``images.example.co.uk``
    -> ``example.co.uk``); the host itself when it has none (an address, a public
    suffix, a name under no known suffix)."""
    if not host or host[0] == "[" or host.replace(".", "").isdigit():
        return host
    domain = _suffixes().privatesuffix(host)  # type: ignore[attr-defined]
    return domain if isinstance(domain, str) else host


def host_of(url: str | URL, pacing_key: str = "host") -> str:
    """The politeness host of ``url``: its lower-cased host name (``registered_domain``
    of it under ``pacing_key="domain"``); "" when it has none (the fetcher refuses such a
    URL without a request)."""
    try:
        host = (url if isinstance(url, URL) else URL(url)).host
    except (ValueError, TypeError):
        return ""
    if not host:
        return ""
    host = host.lower().rstrip(".")
    return registered_domain(host) if pacing_key == "domain" else host


def key_of(source: str, url: str | URL, pacing_key: str = "host") -> HostKey:
    return HostKey(source, host_of(url, pacing_key))


# --- what a worker reports ----------------------------------------------------------

# How an answer counts for its host: clean, a refusal (a backoff status), or a failure.
CLEAN: Final = 1
REFUSED: Final = 2
FAILED: Final = 3

# The server's own failures (its answer is not about the URL): they halt the host.
_NETWORK_FAILURES: Final = frozenset(
    {
        Status.SERVER_DISCONNECTED,
        Status.CONNECTION_ERROR,
        Status.BAD_RESPONSE,
        Status.PAYLOAD_ERROR,
        Status.CLIENT_ERROR,
    }
)


def host_failure(status: str) -> bool:
    """True for a status that says the host's server is failing, not that the URL is bad:
    a 5xx, or no answer (a dropped, refused or broken connection). Backoff statuses
    (429, 503, timeouts) are refusals, counted as failures only at the host's floor."""
    if status in BACKOFF_STATUSES:
        return False
    if status in _NETWORK_FAILURES:
        return True
    return len(status) == 3 and status.isdigit() and status[0] == "5"


def answer_kind(status: str) -> int:
    if status in BACKOFF_STATUSES:
        return REFUSED
    return FAILED if host_failure(status) else CLEAN


@dataclasses.dataclass(frozen=True, slots=True)
class HostReport:
    """What one worker saw of a host since it last asked for it: clean answers
    (``clean``), backoff signals (``signals``: refusals and answers much slower than
    usual), refusals (``refused``: backoff statuses), failures (``failed``), and how the
    last answer counted (``last``: 0 none, CLEAN, REFUSED or FAILED)."""

    clean: int = 0
    signals: int = 0
    refused: int = 0
    failed: int = 0
    last: int = 0

    def add(self, status: str, *, signal: bool = False) -> HostReport:
        kind = answer_kind(status)
        return HostReport(
            self.clean + (kind == CLEAN),
            self.signals + (signal or kind == REFUSED),
            self.refused + (kind == REFUSED),
            self.failed + (kind == FAILED),
            kind,
        )

    def __bool__(self) -> bool:
        return self.last != 0 or self.signals > 0

    def to_list(self) -> list[int]:
        return [self.clean, self.signals, self.refused, self.failed, self.last]


NO_REPORT: Final = HostReport()


# --- the state -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class HostSettings:
    """The per-host rule's parameters (see the module's docstring); rates in
    requests/s, times in seconds."""

    start_rps: float = 1.0
    slow_start_gain: float = 2.0
    floor_rps: float = 0.1
    decrease_factor: float = 0.7
    slow_start_exit_factor: float = 0.7
    increase_share_per_s: float = 0.02
    min_increase_rps_per_s: float = 0.01
    # The longest stretch one climb counts: a host that got no answer for longer (idle,
    # or starved of its source's slots) climbs as if it had been used this long only.
    climb_gap_s: float = 2.0
    cooldown_s: float = 1.0
    halt_after: int = 5
    halt_base_s: float = 30.0
    halt_max_s: float = 900.0
    give_up_s: float = 3600.0
    idle_s: float = HOST_IDLE_S
    # A host's member of its source's host index is written again after this long while
    # it is asked about (at once when its state changes).
    index_refresh_s: float = 10.0
    # MAX_HOST_RATE: every host's ceiling (None: the source's rate).
    max_host_rps: float | None = None
    # PACING_KEY: what a URL is paced by inside its source, "host" or "domain".
    pacing_key: str = "host"

    def to_json_obj(self) -> dict[str, float | str]:
        """The parameters as the script reads them (a missing ceiling as -1), with the
        host index's key prefix."""
        return {
            "start": self.start_rps,
            "gain": self.slow_start_gain,
            "floor": self.floor_rps,
            "dec": self.decrease_factor,
            "exit": self.slow_start_exit_factor,
            "share": self.increase_share_per_s,
            "inc": self.min_increase_rps_per_s,
            "gap": self.climb_gap_s,
            "cool": self.cooldown_s,
            "after": self.halt_after,
            "base": self.halt_base_s,
            "max": self.halt_max_s,
            "giveup": self.give_up_s,
            "idle": self.idle_s,
            "cap": -1.0 if self.max_host_rps is None else self.max_host_rps,
            "refresh": self.index_refresh_s,
            "ix": HOST_INDEX_PREFIX,
        }


# The hash's fields (short: a million hosts' worth of them).
F_NEXT: Final = "next"  # the host's next slot (Unix s)
F_RATE: Final = "rate"  # its adaptive rate (requests/s); absent: never heard from
F_SLOW: Final = "ss"  # "1" while in slow start
F_CUT: Final = "cut"  # when its rate was last cut
F_CLIMB: Final = "climb"  # when it last climbed (or was cut)
F_DELAY: Final = "delay"  # robots.txt Crawl-delay (s)...
F_DELAY_UNTIL: Final = "delay_until"  # ...in force until then
F_FAILS: Final = "fails"  # failures in a row
F_SINCE: Final = "since"  # when the streak began
F_UNTIL: Final = "until"  # halted by its breaker until then
F_HALTS: Final = "halts"  # halts in a row
F_GONE: Final = "gone"  # given up at (its URLs end as HostUnavailable)
F_HALT: Final = "halt"  # an operator's halt (any text: why)
F_OVERRIDE: Final = "override"  # an operator's rate for the host
F_EXPIRES: Final = "exp"  # the expiry last set (Unix s; "" while kept for good)
F_LAST: Final = "last"  # the last answer's kind, for operators
F_WHY: Final = "why"  # why it is paced as it is (contract.HOST_WHY), as last indexed
F_SEEN: Final = "seen"  # when its host index member was last written (Unix s)


@dataclasses.dataclass(frozen=True, slots=True)
class HostState:
    """One host's hash, parsed: absent fields (and "") are None."""

    next_at: float | None = None
    rate: float | None = None
    slow: bool = False
    cut_at: float | None = None
    climb_at: float | None = None
    delay_s: float | None = None
    delay_until: float | None = None
    fails: int = 0
    since: float | None = None
    until: float | None = None
    halts: int = 0
    gone: float | None = None
    halt: str | None = None
    override: float | None = None
    expires: float | None = None
    last: int = 0
    why: str | None = None
    seen: float | None = None

    @classmethod
    def from_hash(cls, fields: Mapping[str, str]) -> HostState:
        """As the script reads the hash: a field that is not a number reads as absent."""
        num = functools.partial(_number, fields)
        halt = fields.get(F_HALT)
        return cls(
            next_at=num(F_NEXT),
            rate=num(F_RATE),
            slow=fields.get(F_SLOW) == "1",
            cut_at=num(F_CUT),
            climb_at=num(F_CLIMB),
            delay_s=num(F_DELAY),
            delay_until=num(F_DELAY_UNTIL),
            fails=int(num(F_FAILS) or 0),
            since=num(F_SINCE),
            until=num(F_UNTIL),
            halts=int(num(F_HALTS) or 0),
            gone=num(F_GONE),
            halt=halt if halt else None,
            override=num(F_OVERRIDE),
            expires=num(F_EXPIRES),
            last=int(num(F_LAST) or 0),
            why=fields.get(F_WHY) or None,
            seen=num(F_SEEN),
        )

    @property
    def kept(self) -> bool:
        """An operator's field is set: the hash is kept for good."""
        return self.halt is not None or self.override is not None


def _number(fields: Mapping[str, str], name: str) -> float | None:
    raw = fields.get(name)
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return None if math.isnan(value) else value


# --- the rule ---------------------------------------------------------------------------


def ceiling_rps(
    source_rps: float, host_rate_rps: float | None, override: float | None, s: HostSettings
) -> float:
    """A host's ceiling: the source's rate, capped by the host's ``override`` or else by
    ``host_rate:{source}`` (``host_rate_rps``) or else ``MAX_HOST_RATE``. A cap that is
    not a positive number is ignored."""
    cap = override if override is not None else host_rate_rps
    if cap is None or not cap > 0:
        cap = s.max_host_rps
    return cap if cap is not None and 0 < cap < source_rps else source_rps


def floor_of(ceiling: float, s: HostSettings) -> float:
    return s.floor_rps if s.floor_rps < ceiling else ceiling


def host_step(
    state: HostState, report: HostReport, ceiling: float, now: float, s: HostSettings
) -> HostState:
    """A host's state after ``report`` at ``now`` (Unix s), under its ``ceiling``: its
    adaptive rate and its breaker (see the module's docstring)."""
    if state.rate is None:
        start = s.start_rps if s.start_rps < ceiling else ceiling
        state = dataclasses.replace(state, rate=start, slow=True, climb_at=now)
    assert state.rate is not None
    rate = state.rate if state.rate < ceiling else ceiling
    floor = floor_of(ceiling, s)
    at_floor = rate <= floor
    slow, cut_at, climb_at = state.slow, state.cut_at, state.climb_at
    if report.signals > 0:
        # The signal that ends a slow start may cut deeper (slow_start_exit_factor): the
        # rate grew up to 7-fold a second until it was reported. Halving it (as TCP
        # does) left a host refused early in its slow start (at 1/s) at 0.5/s, then
        # 2.5 minutes climbing back: kept at 0.7 until the climb is smarter.
        factor = s.slow_start_exit_factor if slow else s.decrease_factor
        slow = False
        if cut_at is None or now - cut_at >= s.cooldown_s - COOLDOWN_SLACK_S:
            cut = rate * factor
            rate = cut if cut > floor else floor
            cut_at = now
        climb_at = now
    elif report.clean > 0:
        if slow:
            rate = rate + s.slow_start_gain * report.clean
        else:
            share = s.increase_share_per_s * rate
            increase = share if share > s.min_increase_rps_per_s else s.min_increase_rps_per_s
            elapsed = now - climb_at if climb_at is not None and now > climb_at else 0.0
            elapsed = elapsed if elapsed < s.climb_gap_s else s.climb_gap_s
            rate = rate + increase * elapsed
        if rate >= ceiling:
            rate, slow = ceiling, False
        climb_at = now
    state = dataclasses.replace(state, rate=rate, slow=slow, cut_at=cut_at, climb_at=climb_at)
    return _breaker(state, report, at_floor, now, s)


def _breaker(
    state: HostState, report: HostReport, at_floor: bool, now: float, s: HostSettings
) -> HostState:
    failed = report.failed + (report.refused if at_floor else 0)
    last = report.last if report.last else state.last
    if report.last == CLEAN:
        return dataclasses.replace(state, fails=0, since=None, halts=0, last=last)
    if failed == 0:
        return dataclasses.replace(state, last=last)
    fails, halts, until = state.fails + failed, state.halts, state.until
    since = state.since if state.since is not None else now
    if fails >= s.halt_after:
        halt_s = s.halt_base_s * 2.0**halts
        until = now + (halt_s if halt_s < s.halt_max_s else s.halt_max_s)
        halts, fails = halts + 1, s.halt_after - 1
    gone = state.gone
    if gone is None and now - since >= s.give_up_s:
        gone = now
    return dataclasses.replace(
        state, fails=fails, since=since, until=until, halts=halts, gone=gone, last=last
    )


def host_interval(state: HostState, ceiling: float, now: float) -> float:
    """Seconds between the host's slots: ``1 / rate`` (its rate capped by its ceiling),
    or its Crawl-delay while in force and longer."""
    rate = state.rate if state.rate is not None and state.rate < ceiling else ceiling
    interval = 1 / rate
    delay = state.delay_s
    if (
        delay is not None
        and delay > interval
        and delay < math.inf
        and state.delay_until is not None
        and state.delay_until > now
    ):
        return delay / DELAY_SHARE
    return interval


# Why a host gets no slot now (the script's flags).
FLAG_GONE: Final = "g"  # given up: its URLs end as HostUnavailable
FLAG_HALTED: Final = "h"  # halted by its breaker until its ``until``
FLAG_OPERATOR: Final = "m"  # halted by an operator


def blocked(state: HostState, now: float) -> str:
    """Why the host gets no slot now ("" when it may get one)."""
    if state.halt is not None:
        return FLAG_OPERATOR
    if state.gone is not None:
        return FLAG_GONE
    if state.until is not None and state.until > now:
        return FLAG_HALTED
    return ""


@dataclasses.dataclass(frozen=True, slots=True)
class HostAsk:
    """One host's part of a round: its next slot, its interval, and how many slots it
    wants."""

    next_at: float | None
    interval_s: float
    wanted: int


@dataclasses.dataclass(frozen=True, slots=True)
class Round:
    """What a round of grants gave: the source's next slot, and each host's slots and
    next slot, in the order asked."""

    source_next: float
    slots: tuple[tuple[float, ...], ...]
    host_next: tuple[float, ...]


def round_robin_grant(
    now: float,
    source_next: float | None,
    source_interval_s: float,
    asks: Sequence[HostAsk],
    horizon_s: float,
) -> Round:
    """Slots for several hosts of one source at ``now``: one slot per host per pass, in
    the order asked, each at the later of the source's and the host's next slot, and
    only within ``horizon_s`` of now. A slot moves both past itself: requests to the
    source start one per ``source_interval_s`` at most, and to a host one per its
    interval. An idle source or host catches nothing up (a next slot in the past, absent
    or not a number counts as now)."""
    src = _from(now, source_next)
    host_next = [_from(now, a.next_at) for a in asks]
    slots: list[list[float]] = [[] for _ in asks]
    limit = now + horizon_s
    open_ = [i for i, a in enumerate(asks) if a.wanted > 0]
    while open_:
        still = []
        for i in open_:
            at = src if src > host_next[i] else host_next[i]
            if at > limit:
                continue
            slots[i].append(at)
            src = at + source_interval_s
            host_next[i] = at + asks[i].interval_s
            if len(slots[i]) < asks[i].wanted:
                still.append(i)
        open_ = still
    return Round(src, tuple(tuple(s) for s in slots), tuple(host_next))


def _from(now: float, next_at: float | None) -> float:
    return next_at if next_at is not None and next_at >= now else now


def expiry(state: HostState, now: float, s: HostSettings) -> float | None:
    """When the host's hash may expire (Unix s): ``idle_s`` after now, after its next
    slot, or after its halt ends, or ``give_up_s`` after it was given up; None: kept for
    good (an operator's field)."""
    if state.kept:
        return None
    until = now + s.idle_s
    if state.next_at is not None and state.next_at + s.idle_s > until:
        until = state.next_at + s.idle_s
    if state.until is not None and state.until + s.idle_s > until:
        until = state.until + s.idle_s
    if state.gone is not None and state.gone + s.give_up_s > until:
        until = state.gone + s.give_up_s
    return until


def fields_of(state: HostState) -> dict[str, str]:
    """The hash's fields as the script writes them (None as ""): times to the
    microsecond, rates exactly."""
    return {
        F_NEXT: _time(state.next_at),
        F_RATE: _exact(state.rate),
        F_SLOW: "1" if state.slow else "",
        F_CUT: _time(state.cut_at),
        F_CLIMB: _time(state.climb_at),
        F_DELAY: _exact(state.delay_s),
        F_DELAY_UNTIL: _time(state.delay_until),
        F_FAILS: str(state.fails) if state.fails else "",
        F_SINCE: _time(state.since),
        F_UNTIL: _time(state.until),
        F_HALTS: str(state.halts) if state.halts else "",
        F_GONE: _time(state.gone),
        F_HALT: state.halt or "",
        F_OVERRIDE: _exact(state.override),
        F_EXPIRES: _time(state.expires),
        F_LAST: str(state.last) if state.last else "",
        F_WHY: state.why or "",
        F_SEEN: "" if state.seen is None else f"{state.seen:.3f}",
    }


def _time(value: float | None) -> str:
    return "" if value is None else f"{value:.6f}"


def _exact(value: float | None) -> str:
    return "" if value is None else f"{value:.17g}"


# The interval answered for a host the round did not read (not known).
UNREAD: Final = -1.0


@dataclasses.dataclass(frozen=True, slots=True)
class HostAnswer:
    """The script's answer for one host: seconds until it is worth asking again
    (``next_s``), the granted slots as offsets from now (s), the host's interval (s),
    and why it got nothing (``flag``: "" or one of FLAG_GONE, FLAG_HALTED,
    FLAG_OPERATOR)."""

    next_s: float
    slots: tuple[float, ...]
    interval_s: float
    flag: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class ScoreRange:
    """The scores ``low <= score < high`` of a host index."""

    low: float
    high: float


@dataclasses.dataclass(frozen=True, slots=True)
class SourceRound:
    """What one source's part of an acquire call decided: each host's answer and state
    afterwards, in the order asked, and the source's next slot (None: not moved); each
    host's score written to the source's host index (None: none), and the ranges of
    idle members removed from it."""

    answers: tuple[HostAnswer, ...]
    states: tuple[HostState, ...]
    source_next: float | None
    indexed: tuple[float | None, ...] = ()
    trimmed: tuple[ScoreRange, ...] = ()
    # The hosts not read (see ``decide_source``).
    unread: tuple[bool, ...] = ()


def decide_source(
    now: float,
    source_rps: float,
    host_rate_rps: float | None,
    source_next: float | None,
    hosts: Sequence[tuple[HostState, HostReport, int]],
    horizon_s: float,
    s: HostSettings,
) -> SourceRound:
    """One source's part of an acquire call: each host's report applied
    (``host_step``), then the slots of the hosts that may get one granted together
    (``round_robin_grant``), then each hash's expiry renewed when it is due (``expiry``;
    renewed once less than half of ``idle_s`` is left of what is needed), and each host's
    member of the source's host index written when it is due (``indexed``), with the
    members idle for ``idle_s`` removed from each band written (the index then expires
    ``idle_s`` after this write).

    Hosts are read as the round robin's first pass reaches them: a host with nothing to
    report, reached once the source has no slot left within the horizon, is not read at
    all (``unread``: its hash untouched, asked again when the source's next slot comes),
    so that a source whose rate is the limit costs a read per host it serves, not per
    host waiting (measured before: 39 hosts read per slot granted, 100 hosts waiting)."""
    src = _from(now, source_next)
    limit, source_interval = now + horizon_s, 1 / source_rps
    read: list[_Read | None] = []
    first: list[tuple[float, ...]] = []
    for state, report, wanted in hosts:
        if not report and src > limit:
            read.append(None)
            first.append(())
            continue
        host = _read(state, report, wanted, source_rps, host_rate_rps, now, s)
        at = src if src > host.next_at else host.next_at
        if host.ask.wanted > 0 and at <= limit:  # the first pass, as it reaches the host
            src = at + source_interval
            host.next_at = at + host.ask.interval_s
            first.append((at,))
        else:
            first.append(())
        read.append(host)
    granted = _more_passes(now, src, source_interval, read, first, horizon_s)
    return _decided(read, hosts, granted, now, horizon_s, s)


@dataclasses.dataclass(slots=True)
class _Read:
    """A host the round reached: its state once its report is applied, why it is paced
    as it is, its flag, its ask, and its next slot (moved by the first pass)."""

    state: HostState
    why: str
    flag: str
    ask: HostAsk
    next_at: float


def _read(
    state: HostState,
    report: HostReport,
    wanted: int,
    source_rps: float,
    host_rate_rps: float | None,
    now: float,
    s: HostSettings,
) -> _Read:
    ceiling = ceiling_rps(source_rps, host_rate_rps, state.override, s)
    if report or state.rate is None:
        state = host_step(state, report, ceiling, now, s)
    flag = blocked(state, now)
    interval = host_interval(state, ceiling, now)
    why = host_why(state, flag, ceiling, source_rps, interval)
    ask = HostAsk(state.next_at, interval, 0 if flag else wanted)
    return _Read(state, why, flag, ask, _from(now, state.next_at))


def _more_passes(
    now: float,
    src: float,
    source_interval: float,
    read: Sequence[_Read | None],
    first: Sequence[tuple[float, ...]],
    horizon_s: float,
) -> Round:
    """The round robin's passes after the first (``round_robin_grant``, for the hosts
    that got a slot in it and want more), merged with it."""
    more = [
        j for j, host in enumerate(read) if host is not None and first[j] and host.ask.wanted > 1
    ]
    rest = round_robin_grant(
        now,
        src,
        source_interval,
        [_rest_of(read[j]) for j in more],
        horizon_s,
    )
    slots = [list(f) for f in first]
    host_next = [now if host is None else host.next_at for host in read]
    for k, j in enumerate(more):
        slots[j] += rest.slots[k]
        host_next[j] = rest.host_next[k]
    source_next = rest.source_next if more else src
    return Round(source_next, tuple(tuple(t) for t in slots), tuple(host_next))


def _rest_of(host: _Read | None) -> HostAsk:
    assert host is not None
    return HostAsk(host.next_at, host.ask.interval_s, host.ask.wanted - 1)


def _decided(
    read: Sequence[_Read | None],
    hosts: Sequence[tuple[HostState, HostReport, int]],
    granted: Round,
    now: float,
    horizon_s: float,
    s: HostSettings,
) -> SourceRound:
    answers: list[HostAnswer] = []
    states: list[HostState] = []
    scores: list[float | None] = []
    for i, host in enumerate(read):
        if host is None:  # not read: untouched, asked again when the source has a slot
            states.append(hosts[i][0])
            scores.append(None)
            answers.append(HostAnswer(granted.source_next - horizon_s - now, (), UNREAD))
            continue
        state = host.state
        if granted.slots[i]:
            state = dataclasses.replace(state, next_at=granted.host_next[i])
        state = _renewed(state, now, s)
        written = indexed(state, host.why, now, s)
        scores.append(None if written is state else host_index_score(HOST_WHY[host.why], now))
        states.append(written)
        answers.append(_answer(state, host.flag, granted, i, host.ask.interval_s, now, horizon_s))
    return SourceRound(
        tuple(answers),
        tuple(states),
        granted.source_next if any(granted.slots) else None,
        tuple(scores),
        _trimmed(scores, now, s),
        tuple(host is None for host in read),
    )


def host_why(
    state: HostState, flag: str, ceiling: float, source_rps: float, interval_s: float
) -> str:
    """Why a host is paced as it is (one of contract.HOST_WHY), once its report is
    applied: halted by an operator, given up, or halted by its breaker (its ``flag``);
    else at its source's pace when its interval (``host_interval``'s) is no longer than
    the source's (1 / ``source_rps``); else paced below it by its Crawl-delay (the longer
    interval), by its ceiling (below the source's rate) once its rate is there, else by
    its slow start, a cut it climbs back from, or a climb to its ceiling (which rose,
    without a cut)."""
    if flag:
        return {FLAG_OPERATOR: WHY_OPERATOR, FLAG_GONE: WHY_GONE}.get(flag, WHY_BREAKER)
    if not interval_s > 1 / source_rps:
        return WHY_PACE
    rate = state.rate if state.rate is not None and state.rate < ceiling else ceiling
    if interval_s > 1 / rate:
        return WHY_CRAWL_DELAY
    if not rate < ceiling:
        return WHY_CAP
    if state.slow:
        return WHY_SLOW_START
    return WHY_CUT if state.cut_at is not None else WHY_CLIMB


def indexed(state: HostState, why: str, now: float, s: HostSettings) -> HostState:
    """The host's state once its host index member is written, when that is due (its
    ``why`` changed, or it was written ``index_refresh_s`` ago or longer, or never, or in
    the future): ``why`` and ``seen`` (now) record what was written. ``state`` itself
    when it is not due."""
    seen = state.seen
    if state.why == why and seen is not None and 0 <= now - seen < s.index_refresh_s:
        return state
    return dataclasses.replace(state, why=why, seen=now)


def _trimmed(scores: Sequence[float | None], now: float, s: HostSettings) -> tuple[ScoreRange, ...]:
    bands = sorted({math.floor(score / HOST_INDEX_BAND) for score in scores if score is not None})
    return tuple(
        ScoreRange(band * HOST_INDEX_BAND, band * HOST_INDEX_BAND + now - s.idle_s)
        for band in bands
    )


def _renewed(state: HostState, now: float, s: HostSettings) -> HostState:
    needed = expiry(state, now, s)
    if needed is None:
        return dataclasses.replace(state, expires=None)
    if state.expires is None or needed - state.expires > s.idle_s / 2:
        return dataclasses.replace(state, expires=needed)
    return state


def _answer(
    state: HostState,
    flag: str,
    granted: Round,
    i: int,
    interval_s: float,
    now: float,
    horizon_s: float,
) -> HostAnswer:
    if flag == FLAG_HALTED:
        assert state.until is not None
        return HostAnswer(state.until - now, (), interval_s, flag)
    if flag:
        return HostAnswer(-1.0, (), interval_s, flag)
    host_next = granted.host_next[i]
    later = granted.source_next if granted.source_next > host_next else host_next
    offsets = tuple(t - now for t in granted.slots[i])
    return HostAnswer(later - horizon_s - now, offsets, interval_s)


def noted(
    state: HostState,
    now: float,
    pause_s: float,
    delay_s: float | None,
    delay_keep_s: float,
    idle_s: float,
) -> HostState:
    """A host's state once nothing may start for ``pause_s`` from ``now`` (a
    Retry-After; its next slot moves to ``now + pause_s`` unless later already) and, with
    ``delay_s``, its robots.txt Crawl-delay noted for ``delay_keep_s``: a delay longer
    than the one in force also moves its next slot a delay away (the robots.txt request
    that brought it was a request to the host). Its expiry is pushed to ``idle_s`` past
    the next slot when that is later (never for a hash an operator keeps)."""
    if delay_s is not None:
        current = state.delay_s
        if state.delay_until is None or state.delay_until <= now:
            current = None
        if current is None or delay_s > current:
            pause_s = pause_s if pause_s > delay_s else delay_s
        state = dataclasses.replace(state, delay_s=delay_s, delay_until=now + delay_keep_s)
    until = now + pause_s
    current_next = state.next_at if state.next_at is not None else 0.0
    if pause_s > 0 and until > current_next:
        state = dataclasses.replace(state, next_at=until)
    if not state.kept:
        needed = (state.next_at if state.next_at is not None else now) + idle_s
        if state.delay_until is not None and state.delay_until > needed:
            needed = state.delay_until
        if state.expires is None or needed > state.expires:
            state = dataclasses.replace(state, expires=needed)
    return state
