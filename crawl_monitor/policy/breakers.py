"""Circuit breaker policy: when a source's errors halt its crawl. Pure, no I/O.

Statuses arrive as histograms (status -> count), as the regulator reads them:

- the 60 s window (``status60s:{source}``): a *temporary* halt while more than 10% of
  more than 5 samples are errors, lifted automatically once the window is healthy;
- the last 50 statuses (``statuslast50req:{source}``): a *permanent* halt when all 50
  failed, which only an operator lifts.

An error is any status outside the contract's ``EXPECTED_STATUSES`` (so 404 is not one).
While a source's adaptive rate is above its floor, its ``BACKOFF_STATUSES`` (429, 503,
timeouts) are left out of both histograms: the server is asking for a lower rate, which
it is getting. At the floor the rate cannot fall further, and they count as errors again.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Final, Literal

from image_crawler.contract import BACKOFF_STATUSES, EXPECTED_STATUSES, LAST_N_STATUSES

# A window trips when errors are MORE than this share of its samples...
ERROR_SHARE_LIMIT: Final = 0.10
# ...and it holds MORE than this many samples.
MIN_SAMPLES: Final = 5
WINDOW_S: Final = 60.0

HaltType = Literal["temporary", "permanent"]


def is_error(status: str) -> bool:
    return status not in EXPECTED_STATUSES


def count_errors(histogram: Mapping[str, int]) -> int:
    return sum(count for status, count in histogram.items() if is_error(status))


def window_unhealthy(window: Mapping[str, int]) -> bool:
    """True when the last minute's statuses call for a temporary halt."""
    samples = sum(window.values())
    if samples <= MIN_SAMPLES:
        return False
    return count_errors(window) > ERROR_SHARE_LIMIT * samples


def every_request_failed(last_statuses: Mapping[str, int]) -> bool:
    """True when the last 50 statuses are 50 entries that are all errors."""
    samples = sum(last_statuses.values())
    return samples >= LAST_N_STATUSES and count_errors(last_statuses) == samples


@dataclasses.dataclass(frozen=True, slots=True)
class BreakerDecision:
    """What one check of one source concluded."""

    # The source belongs in ``temp_halted`` after this check.
    temp_halted: bool
    # It was not temporarily halted before: a trip to log (once).
    trips_temporary: bool
    # It was temporarily halted and its window is healthy again.
    lifts_temporary: bool
    # It was not halted and every one of its last 50 requests failed: add to ``halted``.
    trips_permanent: bool


def without_backoff(histogram: Mapping[str, int]) -> Mapping[str, int]:
    """``histogram`` without its ``BACKOFF_STATUSES``."""
    if BACKOFF_STATUSES.isdisjoint(histogram):
        return histogram
    return {status: n for status, n in histogram.items() if status not in BACKOFF_STATUSES}


def decide(
    window: Mapping[str, int],
    last_statuses: Mapping[str, int],
    *,
    temp_halted: bool,
    halted: bool,
    backoff_excused: bool = False,
) -> BreakerDecision:
    """Check one source, given its statuses and whether it is halted now.

    With ``backoff_excused`` (its rate is above its floor), backoff statuses are left out.
    Trips are transitions: an already halted source does not trip again, so each trip
    is reported once. Nothing here lifts a permanent halt.
    """
    if backoff_excused:
        window, last_statuses = without_backoff(window), without_backoff(last_statuses)
    unhealthy = window_unhealthy(window)
    return BreakerDecision(
        temp_halted=unhealthy,
        trips_temporary=unhealthy and not temp_halted,
        lifts_temporary=temp_halted and not unhealthy,
        trips_permanent=not halted and every_request_failed(last_statuses),
    )


def halt_message(source: str, halt_type: HaltType, histogram: Mapping[str, int]) -> str:
    """The operator's explanation of a trip, with the response codes behind it."""
    codes = json.dumps(dict(sorted(histogram.items())))
    if halt_type == "temporary":
        return f"{source} tripped temporary halt. Response codes: {codes}"
    return (
        f"{source} tripped permanent halt; an operator must resume it (see 'The error "
        f"circuit breaker'). Response codes: {codes}"
    )
