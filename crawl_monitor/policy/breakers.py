"""Circuit breaker policy: when a source's errors halt its crawl. Pure, no I/O.

Statuses arrive as histograms (status -> count), as the regulator reads them:

- the 60 s window (``status60s:{source}``): a *temporary* halt while more than 10% of
  more than 5 samples are errors, lifted automatically once the window is healthy;
- the last 50 statuses (``statuslast50req:{source}``): a *permanent* halt when all 50
  failed, which only an operator lifts.

A host never halts its source (issue 36): a source whose outcomes in the last minute came
from more than one host trips either breaker only when its failures are spread over its
hosts, that is when at least ``MIN_FAILING_HOSTS`` (2) of them, and at least
``FAILING_HOSTS_SHARE`` (one in ten) of the hosts it had outcomes from in that minute,
had an error other than a backoff status (``spread``). A host failing alone is its own
breaker's business (worker/politeness/hosts.py). A source with one host (or none the
workers named) keeps the breakers above unchanged.

An error is any status outside the contract's ``EXPECTED_STATUSES`` (so 404 is not one).
While a source's adaptive rate is above its floor, its ``BACKOFF_STATUSES`` (429, 503,
timeouts) are left out of both histograms: the server is asking for a lower rate, which
it is getting. At the floor the rate cannot fall further, and they count as errors again.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Final, Literal

from image_crawler.contract import BACKOFF_STATUSES, EXPECTED_STATUSES, LAST_N_STATUSES

# A window trips when errors are MORE than this share of its samples...
ERROR_SHARE_LIMIT: Final = 0.10
# ...and it holds MORE than this many samples.
MIN_SAMPLES: Final = 5
WINDOW_S: Final = 60.0
# A source of several hosts trips only when this many of them failed...
MIN_FAILING_HOSTS: Final = 2
# ...and at least this share of the hosts it had outcomes from in the window.
FAILING_HOSTS_SHARE: Final = 0.10

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


def spread(hosts: int, failing_hosts: int) -> bool:
    """True when a source's failures are spread over its hosts enough for its breakers
    to trip: always for a source of one host (or unknown hosts, 0)."""
    if hosts <= 1:
        return True
    needed = max(MIN_FAILING_HOSTS, math.ceil(FAILING_HOSTS_SHARE * hosts - 1e-9))
    return failing_hosts >= needed


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
    hosts: int = 0,
    failing_hosts: int = 0,
) -> BreakerDecision:
    """Check one source, given its statuses and whether it is halted now.

    With ``backoff_excused`` (its rate is above its floor), backoff statuses are left out.
    ``hosts`` and ``failing_hosts``: how many hosts the window's outcomes came from and
    how many of them failed; neither breaker trips unless they are ``spread``.
    Trips are transitions: an already halted source does not trip again, so each trip
    is reported once. Nothing here lifts a permanent halt.
    """
    if backoff_excused:
        window, last_statuses = without_backoff(window), without_backoff(last_statuses)
    spread_out = spread(hosts, failing_hosts)
    unhealthy = spread_out and window_unhealthy(window)
    return BreakerDecision(
        temp_halted=unhealthy,
        trips_temporary=unhealthy and not temp_halted,
        lifts_temporary=temp_halted and not unhealthy,
        trips_permanent=not halted and spread_out and every_request_failed(last_statuses),
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
