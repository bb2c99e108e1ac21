"""Adaptive rate: how fast a source is crawled while its server pushes back. Pure, no I/O.

Additive increase, multiplicative decrease (AIMD), stepped once a loop for every source
with its configured rate (computed or overridden) and its ``backoff_signals:`` counter,
which workers bump for each 429, 503, timeout or much slower response they see:

- the counter grew since the last step (new signals), and the last cut is at least
  ``cooldown_s`` old: the effective rate is cut, ``max(floor, effective x
  decrease_factor)``;
- new signals within the cooldown: the rate is held (those signals may come from requests
  started before the last cut took effect);
- no new signals: the rate climbs back by ``max(increase_share_per_s x configured,
  min_increase_rps_per_s)`` per second since the last step, up to the configured rate.

The floor is ``floor_rps``, or the configured rate when that is lower. The effective rate
is never above the configured rate, and a source at its configured rate follows a new one
at once. A counter that went down (Redis lost it) is no signal, and neither is the first
reading: it is where counting starts.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from image_crawler.contract import (
    PACE_BACKOFF,
    PACE_CONFIGURED,
    PACE_FLOOR,
    PACE_RECOVERING,
    PACE_STOPPED,
)

# Loops run on a grid of the monotonic clock but read the wall clock: two loops one
# period apart may read a hair less than a period apart, which must not defer a cut.
COOLDOWN_SLACK_S: Final = 0.05


@dataclasses.dataclass(frozen=True, slots=True)
class AdaptiveSettings:
    """The AIMD parameters (see the module's docstring); rates in requests/s."""

    floor_rps: float = 0.1
    decrease_factor: float = 0.7
    increase_share_per_s: float = 0.01
    min_increase_rps_per_s: float = 0.01
    cooldown_s: float = 1.0
    # How old (s) a published cut may be for a monitor that takes the lead to resume from
    # it (``takeover``). A take-over or a restart takes seconds; a cut from a crawl that
    # stopped for longer says little about the server now, so its source starts afresh at
    # its configured rate, as in a new crawl.
    inherit_max_age_s: float = 600.0


@dataclasses.dataclass(frozen=True, slots=True)
class Pace:
    """One source's adaptive rate after a step, with what the next step needs."""

    effective_rps: float
    configured_rps: float
    # One of PACE_CONFIGURED, PACE_BACKOFF, PACE_RECOVERING, PACE_FLOOR, PACE_STOPPED.
    state: str
    # Why, for operators.
    why: str
    # The backoff_signals counter at this step.
    signals_seen: int
    # When this step was taken (Unix s), and when the rate was last cut (None: never).
    at_s: float
    last_cut_at_s: float | None = None
    # New signals at this step (0 when none).
    new_signals: int = 0


AT_CONFIGURED: Final = "at its configured rate"
STOPPED: Final = "stopped: configured at 0"


def floor_of(configured_rps: float, settings: AdaptiveSettings) -> float:
    """The lowest rate a cut reaches: ``floor_rps``, capped at the configured rate."""
    return settings.floor_rps if settings.floor_rps < configured_rps else configured_rps


def increase_per_s(configured_rps: float, settings: AdaptiveSettings) -> float:
    """How fast (requests/s per second) a source without signals climbs back."""
    share = settings.increase_share_per_s * configured_rps
    return share if share > settings.min_increase_rps_per_s else settings.min_increase_rps_per_s


def above_floor(pace: Pace | None, configured_rps: float, settings: AdaptiveSettings) -> bool:
    """True while a source's rate can still fall: its backoff statuses are not breaker
    errors then. ``pace`` is the source's last step (None: none yet, at its configured
    rate)."""
    effective = configured_rps if pace is None else pace.effective_rps
    return effective > floor_of(configured_rps, settings)


def start(configured_rps: float, signals: int, now_s: float) -> Pace:
    """A source's first step: at its configured rate, counting signals from ``signals``."""
    if configured_rps <= 0.0:
        return Pace(0.0, 0.0, PACE_STOPPED, STOPPED, signals, now_s)
    return Pace(configured_rps, configured_rps, PACE_CONFIGURED, AT_CONFIGURED, signals, now_s)


def hold(pace: Pace | None, configured_rps: float, signals: int, now_s: float) -> Pace:
    """The step of a source that gets no request (halted): its rate stays as it is
    (capped at the configured rate) and its signals are taken as seen, so neither a cut
    nor a climb is owed when it comes back."""
    if pace is None:
        return start(configured_rps, signals, now_s)
    return dataclasses.replace(
        pace,
        effective_rps=min(pace.effective_rps, configured_rps),
        configured_rps=configured_rps,
        signals_seen=signals,
        at_s=now_s,
        new_signals=0,
    )


def step(
    pace: Pace | None,
    configured_rps: float,
    signals: int,
    now_s: float,
    settings: AdaptiveSettings,
) -> Pace:
    """One loop of AIMD for one source (see the module's docstring).

    ``signals`` is the source's ``backoff_signals:`` counter now (0 when missing),
    ``now_s`` the time of the loop (Unix s).
    """
    if pace is None:
        return start(configured_rps, signals, now_s)
    if (
        signals == pace.signals_seen
        and configured_rps == pace.configured_rps
        and (pace.state == PACE_CONFIGURED or pace.state == PACE_STOPPED)
    ):
        # The common case: at its configured rate, nothing new. The same step again (its
        # time is only read once the rate is below the configured one, after a cut).
        return pace
    if configured_rps <= 0.0:
        return Pace(0.0, 0.0, PACE_STOPPED, STOPPED, signals, now_s, pace.last_cut_at_s)
    effective = pace.effective_rps
    if effective >= pace.configured_rps:
        effective = configured_rps  # at its configured rate: follows it, up or down
    elif effective > configured_rps:
        effective = configured_rps
    if signals > pace.signals_seen:  # new signals (a counter that went down is none)
        return _cut(pace, effective, configured_rps, signals, now_s, settings)
    return _climb(pace, effective, configured_rps, signals, now_s, settings)


def _cut(
    pace: Pace,
    effective_rps: float,
    configured_rps: float,
    signals: int,
    now_s: float,
    settings: AdaptiveSettings,
) -> Pace:
    """The step of a source with new signals: cut, unless within the cooldown (held)."""
    new = signals - pace.signals_seen
    floor = floor_of(configured_rps, settings)
    last_cut = pace.last_cut_at_s
    signalled = f"{new} backoff signal{'' if new == 1 else 's'} in the last second"
    cooled = last_cut is None or now_s - last_cut >= settings.cooldown_s - COOLDOWN_SLACK_S
    if not cooled:
        assert last_cut is not None
        state = PACE_FLOOR if effective_rps <= floor else PACE_BACKOFF
        why = f"{signalled}, {_number(now_s - last_cut)} s after a cut: held"
    elif effective_rps <= floor:
        effective_rps, last_cut, state = floor, now_s, PACE_FLOOR
        why = f"{signalled}: held at the floor, backoff statuses count as breaker errors"
    else:
        effective_rps = max(floor, effective_rps * settings.decrease_factor)
        last_cut = now_s
        if effective_rps <= floor:
            state = PACE_FLOOR
            why = f"{signalled}: cut to the floor, backoff statuses count as breaker errors"
        else:
            state = PACE_BACKOFF
            why = f"{signalled}: cut to {settings.decrease_factor:g} x"
    return Pace(effective_rps, configured_rps, state, why, signals, now_s, last_cut, new)


def _climb(
    pace: Pace,
    effective_rps: float,
    configured_rps: float,
    signals: int,
    now_s: float,
    settings: AdaptiveSettings,
) -> Pace:
    """The step of a source without new signals: back up towards its configured rate."""
    increase = increase_per_s(configured_rps, settings)
    elapsed_s = now_s - pace.at_s if now_s > pace.at_s else 0.0
    effective_rps = min(configured_rps, effective_rps + increase * elapsed_s)
    if effective_rps >= configured_rps:
        return Pace(configured_rps, configured_rps, PACE_CONFIGURED, AT_CONFIGURED, signals, now_s)
    why = f"recovering +{_number(increase)}/s"
    last_cut = pace.last_cut_at_s
    if last_cut is not None:
        why += f", last cut {_number(now_s - last_cut)} s ago"
    return Pace(effective_rps, configured_rps, PACE_RECOVERING, why, signals, now_s, last_cut)


def _number(value: float) -> str:
    """Three significant digits at most, without a trailing ".0"."""
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"
