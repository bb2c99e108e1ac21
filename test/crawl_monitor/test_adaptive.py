"""The adaptive rate (AIMD): one step at a time as a table, and a simulated origin."""

from __future__ import annotations

import math

import pytest

from crawl_monitor.policy.adaptive import (
    AT_CONFIGURED,
    AdaptiveSettings,
    Pace,
    above_floor,
    floor_of,
    hold,
    increase_per_s,
    start,
    step,
)
from image_crawler.contract import (
    PACE_BACKOFF,
    PACE_CONFIGURED,
    PACE_FLOOR,
    PACE_RECOVERING,
    PACE_STOPPED,
)

SETTINGS = AdaptiveSettings()


def pace(
    effective: float,
    configured: float = 50.0,
    *,
    seen: int = 0,
    at: float = 100.0,
    cut: float | None = None,
    state: str | None = None,
) -> Pace:
    if state is None:
        state = PACE_CONFIGURED if effective >= configured else PACE_RECOVERING
    return Pace(effective, configured, state, "", seen, at, cut)


@pytest.mark.parametrize(
    ("before", "configured", "signals", "now", "expected"),
    [
        # (effective, state, last cut)
        # The first reading is where counting starts, whatever the counter holds.
        (None, 50.0, 7, 100.0, (50.0, PACE_CONFIGURED, None)),
        (None, 0.0, 0, 100.0, (0.0, PACE_STOPPED, None)),
        # New signals: x0.7, once per cooldown (1 s, a hair less on the wall clock).
        (pace(50.0), 50.0, 3, 101.0, (35.0, PACE_BACKOFF, 101.0)),
        (pace(35.0, seen=3, at=101, cut=101), 50.0, 5, 102.0, (24.5, PACE_BACKOFF, 102.0)),
        (pace(35.0, seen=3, at=101, cut=101), 50.0, 5, 101.97, (24.5, PACE_BACKOFF, 101.97)),
        (pace(35.0, seen=3, at=101, cut=101), 50.0, 5, 101.5, (35.0, PACE_BACKOFF, 101.0)),
        # No new signal: +1% of the configured rate per second since the last step.
        (pace(35.0, seen=3, at=101, cut=101), 50.0, 3, 102.0, (35.5, PACE_RECOVERING, 101.0)),
        (pace(35.0, seen=3, at=101, cut=101), 50.0, 3, 103.0, (36.0, PACE_RECOVERING, 101.0)),
        (pace(49.8, at=101, cut=90), 50.0, 0, 102.0, (50.0, PACE_CONFIGURED, None)),
        # ...at least 0.01/s.
        (pace(0.2, 0.5, at=101, cut=90), 0.5, 0, 102.0, (0.21, PACE_RECOVERING, 90.0)),
        # A counter that went down (Redis lost it) is no signal.
        (pace(35.0, seen=10, at=101, cut=101), 50.0, 2, 102.0, (35.5, PACE_RECOVERING, 101.0)),
        # The floor (0.1/s): a cut stops there, and signals at the floor hold it.
        (pace(0.12, at=101, cut=100), 50.0, 1, 102.0, (0.1, PACE_FLOOR, 102.0)),
        (pace(0.1, at=101, cut=100, state=PACE_FLOOR), 50.0, 1, 102.0, (0.1, PACE_FLOOR, 102.0)),
        # A configured rate under the floor is the floor.
        (pace(0.05, 0.05), 0.05, 1, 101.0, (0.05, PACE_FLOOR, 101.0)),
        # A source at its configured rate follows a new one, up or down...
        (pace(50.0), 80.0, 0, 101.0, (80.0, PACE_CONFIGURED, None)),
        (pace(50.0), 20.0, 0, 101.0, (20.0, PACE_CONFIGURED, None)),
        # ...one held below it is never above it, and climbs by the new one's share.
        (pace(40.0, at=101, cut=90), 30.0, 0, 102.0, (30.0, PACE_CONFIGURED, None)),
        (pace(20.0, at=101, cut=90), 80.0, 0, 102.0, (20.8, PACE_RECOVERING, 90.0)),
        # An override of 0 stops it; back from 0, it starts at its configured rate.
        (pace(20.0, at=101, cut=90), 0.0, 0, 102.0, (0.0, PACE_STOPPED, 90.0)),
        (pace(0.0, 0.0, state=PACE_STOPPED), 5.0, 0, 101.0, (5.0, PACE_CONFIGURED, None)),
    ],
)
def test_step(before, configured, signals, now, expected):
    after = step(before, configured, signals, now, SETTINGS)
    assert (after.effective_rps, after.state, after.last_cut_at_s) == pytest.approx(expected)
    assert after.configured_rps == configured
    assert after.signals_seen == signals
    assert 0 <= after.effective_rps <= configured


@pytest.mark.parametrize(
    ("before", "signals", "now", "why"),
    [
        (pace(50.0), 3, 101.0, "3 backoff signals in the last second: cut to 0.7 x"),
        (pace(50.0), 1, 101.0, "1 backoff signal in the last second: cut to 0.7 x"),
        (
            pace(35.0, seen=3, at=101, cut=101),
            4,
            101.5,
            "1 backoff signal in the last second, 0.5 s after a cut: held",
        ),
        (pace(35.0, seen=3, at=101, cut=101), 3, 109.0, "recovering +0.5/s, last cut 8 s ago"),
        (pace(49.9, at=101, cut=90), 0, 102.0, AT_CONFIGURED),
        (
            pace(0.12, at=101, cut=100),
            2,
            102.0,
            "2 backoff signals in the last second: cut to the floor, backoff statuses count "
            "as breaker errors",
        ),
        (
            pace(0.1, at=101, cut=100, state=PACE_FLOOR),
            1,
            102.0,
            "1 backoff signal in the last second: held at the floor, backoff statuses count "
            "as breaker errors",
        ),
        (start(20.0, 0, 100.0), 0, 101.0, AT_CONFIGURED),
    ],
)
def test_why(before, signals, now, why):
    assert step(before, before.configured_rps, signals, now, SETTINGS).why == why


def test_a_steady_source_costs_no_new_step():
    steady = start(50.0, 4, 100.0)
    assert step(steady, 50.0, 4, 101.0, SETTINGS) is steady
    stopped = start(0.0, 0, 100.0)
    assert step(stopped, 0.0, 0, 101.0, SETTINGS) is stopped
    # Its time is stale, which matters to no later step: a cut does not read it, and a
    # climb starts from the cut's.
    cut = step(steady, 50.0, 5, 500.0, SETTINGS)
    assert (cut.effective_rps, cut.at_s) == (35.0, 500.0)
    assert step(cut, 50.0, 5, 501.0, SETTINGS).effective_rps == pytest.approx(35.5)


@pytest.mark.parametrize(
    ("configured", "floor_rps", "floor", "increase"),
    [(50.0, 0.1, 0.1, 0.5), (0.5, 0.1, 0.1, 0.01), (0.05, 0.1, 0.05, 0.01), (200.0, 1.0, 1.0, 2.0)],
)
def test_floor_and_increase(configured, floor_rps, floor, increase):
    settings = AdaptiveSettings(floor_rps=floor_rps)
    assert floor_of(configured, settings) == floor
    assert increase_per_s(configured, settings) == pytest.approx(increase)


@pytest.mark.parametrize(
    ("before", "configured", "above"),
    [
        (None, 50.0, True),  # no step yet: at its configured rate
        (None, 0.1, False),  # configured at the floor
        (pace(35.0), 50.0, True),
        (pace(0.1, state=PACE_FLOOR), 50.0, False),
        (pace(0.10000001), 50.0, True),
        (pace(0.0, 0.0, state=PACE_STOPPED), 0.0, False),
    ],
)
def test_above_floor(before, configured, above):
    assert above_floor(before, configured, SETTINGS) is above


def test_a_halted_source_keeps_its_rate_and_owes_nothing_when_it_comes_back():
    cut = pace(20.0, seen=5, at=100, cut=100, state=PACE_BACKOFF)
    held = hold(cut, 50.0, 9, 160.0)  # 4 signals during the halt (requests in flight)
    assert (held.effective_rps, held.signals_seen, held.at_s) == (20.0, 9, 160.0)
    back = step(held, 50.0, 9, 161.0, SETTINGS)
    assert (back.effective_rps, back.state) == (pytest.approx(20.5), PACE_RECOVERING)
    assert hold(cut, 10.0, 9, 160.0).effective_rps == 10.0  # never above its rate
    assert hold(None, 50.0, 3, 160.0) == start(50.0, 3, 160.0)


# --- the design target, simulated ------------------------------------------------------


def simulate(
    seconds: int, capacity_rps: list[float], configured_rps: float, lag_loops: int
) -> tuple[list[float], list[int], list[int]]:
    """One loop a second against an origin that answers at most ``capacity_rps[t]`` of
    the requests of second ``t`` and 503 to the rest; a 503 is a backoff signal that
    reaches the counter the monitor reads ``lag_loops`` loops after its second.

    Returns the rate of each second, its requests and its 503s.
    """
    rates: list[float] = []
    requests: list[int] = []
    rejected: list[int] = []
    counter_by_second = [0]
    before = None
    sent = 0.0
    for t in range(seconds):
        seen = counter_by_second[max(0, len(counter_by_second) - lag_loops)]
        before = step(before, configured_rps, seen, float(t), SETTINGS)
        rates.append(before.effective_rps)
        total = sent + before.effective_rps
        n = math.floor(total) - math.floor(sent)
        sent = total
        requests.append(n)
        rejected.append(max(0, n - math.floor(capacity_rps[t])))
        counter_by_second.append(counter_by_second[-1] + rejected[-1])
    return rates, requests, rejected


@pytest.mark.parametrize("lag_loops", [1, 2])
def test_a_source_finds_its_server_s_capacity_and_returns_when_it_grows(lag_loops):
    # An origin that takes 20 requests/s of a source configured at 50/s for 3 minutes,
    # then 50/s: within 30 s at most 22/s, at most 5% of 503s over the 3 minutes, and
    # back above 45/s within 90 s of the capacity's return.
    capacity = [20.0] * 180 + [50.0] * 120
    rates, requests, rejected = simulate(300, capacity, 50.0, lag_loops)
    assert max(requests[30:180]) <= 22, requests[30:180]
    assert sum(rejected[:180]) <= 0.05 * sum(requests[:180])
    back_after = next(t for t in range(180, 300) if rates[t] > 45) - 180
    assert back_after <= 90
    # Nor does it settle far below the capacity.
    assert sum(requests[60:180]) >= 0.7 * 20 * 120
