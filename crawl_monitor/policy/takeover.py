"""Take-over: where a monitor that takes the lead starts each source's adaptive rate. Pure.

The adaptive rate (``adaptive``) lives in the leading monitor's memory; what it decided is
published in ``crawl_rates`` every loop. A monitor that takes the lead, after a take-over
or a restart, reads that hash once, at its term's first loop, and starts each source from
its published record rather than from its configured rate, so that a server that was
pushing back is not hit at full rate until it is cut again:

- a record of a source being cut or climbing back (states ``backoff``, ``recovering``,
  ``floor``) that is at most ``AdaptiveSettings.inherit_max_age_s`` old (its
  ``decided_at_s``, on the new leader's clock) is taken over: the source starts at its
  published rate, never below its floor, and climbs back or is cut from there;
- the configured rate (computed, overridden, capped by a Crawl-delay) is read afresh, and
  always wins: a source whose published rate is at or above it now starts at it;
- everything else starts at the configured rate, as a new process always did: no record
  (a source new to the leader), a record with no cut in it (``configured``, ``stopped``,
  ``halted``: a halted record's rate is 0, not a cut), a stale one (the server may be
  another by now), one without ``decided_at_s`` (written by an older monitor: its age is
  unknown), and one that is not a pacing record.

What is carried is the rate alone. Not the signal count seen (the new leader's first
reading of ``backoff_signals:`` is where its counting starts, as ever: it cannot tell the
signals its predecessor acted on from those it did not), nor the time of the last cut
(the cooldown is over by the time a successor runs its first loop: the lease outlives
several loops), nor the time without a leader, which earns no climb: no request was made
then, so nothing says the server recovered (a halted source's rate waits likewise).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterable
from typing import Final

from crawl_monitor.policy.adaptive import AdaptiveSettings, Pace, floor_of
from image_crawler.contract import (
    PACE_BACKOFF,
    PACE_FLOOR,
    PACE_RECOVERING,
    PACE_STATES,
    MalformedMessage,
    PacingInfo,
)

# The states of a record whose rate is a cut (below its configured rate).
CUT_STATES: Final = frozenset({PACE_BACKOFF, PACE_RECOVERING, PACE_FLOOR})

# The why of a source's first adaptive state in a term when it was taken over (the
# term's first step, which follows at once, says why for operators).
TAKEN_OVER: Final = "taken over from the last leader"


class Outcome(enum.StrEnum):
    """What became of one source's published record (the ``pacing_inherited`` counts)."""

    INHERITED = "inherited"  # starts at its published rate
    UNCUT = "uncut"  # the record holds no cut: configured, stopped or halted
    CAPPED = "capped"  # its published rate is at or above its configured rate now
    STALE = "stale"  # older than inherit_max_age_s
    UNTIMED = "untimed"  # no decided_at_s: written by an older monitor
    MALFORMED = "malformed"  # not a pacing record
    NEW = "new"  # no record: a source new to the leader


@dataclasses.dataclass(frozen=True, slots=True)
class Inherited:
    """A source's start in a new term: ``pace`` is its first adaptive state (None: it
    starts at its configured rate, ``adaptive.start``), ``outcome`` why."""

    pace: Pace | None
    outcome: Outcome


def inherit(
    raw: str | None,
    configured_rps: float,
    signals: int,
    now_s: float,
    settings: AdaptiveSettings,
) -> Inherited:
    """Where a source starts when this monitor takes the lead (see the module's docstring).

    ``raw`` is the source's ``crawl_rates`` field (None: missing), ``configured_rps`` its
    configured rate now (requests/s), ``signals`` its ``backoff_signals:`` counter now
    and ``now_s`` the time of the loop (Unix s).
    """
    if raw is None:
        return Inherited(None, Outcome.NEW)
    try:
        record = PacingInfo.from_json(raw)
    except MalformedMessage:
        return Inherited(None, Outcome.MALFORMED)
    if not _well_formed(record):
        return Inherited(None, Outcome.MALFORMED)
    if record.state not in CUT_STATES:
        return Inherited(None, Outcome.UNCUT)
    if record.decided_at_s is None:
        return Inherited(None, Outcome.UNTIMED)
    age_s = now_s - record.decided_at_s
    if age_s > settings.inherit_max_age_s:
        return Inherited(None, Outcome.STALE)
    if record.rate_rps >= configured_rps:
        return Inherited(None, Outcome.CAPPED)
    # Never below the floor: a floor raised since the record was written applies at once.
    floor = floor_of(configured_rps, settings)
    effective = record.rate_rps if record.rate_rps > floor else floor
    state = PACE_FLOOR if effective <= floor else PACE_RECOVERING
    # at_s is now: the time without a leader earns no climb (see the module's docstring).
    return Inherited(
        Pace(effective, configured_rps, state, TAKEN_OVER, signals, now_s), Outcome.INHERITED
    )


def _well_formed(record: PacingInfo) -> bool:
    """Rates a controller could have written, a known state, a finite time (if any)."""
    rates_ok = all(math.isfinite(r) and r >= 0.0 for r in (record.rate_rps, record.configured_rps))
    time_ok = record.decided_at_s is None or math.isfinite(record.decided_at_s)
    return rates_ok and time_ok and record.state in PACE_STATES


def counts(outcomes: Iterable[Outcome]) -> dict[str, int]:
    """Sources per outcome, every outcome named (0 when none): the event's fields."""
    tally = dict.fromkeys((o.value for o in Outcome), 0)
    for outcome in outcomes:
        tally[outcome.value] += 1
    return tally
