"""Take-over: where a new leader starts each source, from what the last one published."""

from __future__ import annotations

import json

import pytest

from crawl_monitor.policy.adaptive import AdaptiveSettings, step
from crawl_monitor.policy.takeover import Outcome, counts, inherit
from image_crawler.contract import (
    PACE_BACKOFF,
    PACE_CONFIGURED,
    PACE_FLOOR,
    PACE_HALTED,
    PACE_RECOVERING,
    PACE_STOPPED,
    PacingInfo,
)

NOW = 1_800_000_000.0
SETTINGS = AdaptiveSettings()  # floor 0.1/s, records up to 600 s old are taken over


def record(
    rate: float,
    state: str = PACE_RECOVERING,
    *,
    configured: float = 50.0,
    age_s: float | None = 4.0,
) -> str:
    decided_at = None if age_s is None else NOW - age_s
    return PacingInfo(rate, configured, "computed", state, "why", decided_at).to_json().decode()


def scribbled(**fields: object) -> str:
    """A record as ``record(17.2)`` writes it, with ``fields`` replaced (None: removed)."""
    obj = json.loads(record(17.2))
    for name, value in fields.items():
        if value is None:
            del obj[name]
        else:
            obj[name] = value
    return json.dumps(obj)


@pytest.mark.parametrize(
    ("raw", "configured", "expected"),
    [
        # (outcome, effective rate, state); no rate: it starts at its configured rate.
        pytest.param(record(17.2), 50.0, (Outcome.INHERITED, 17.2, PACE_RECOVERING), id="cut"),
        pytest.param(
            record(35.0, PACE_BACKOFF),
            50.0,
            (Outcome.INHERITED, 35.0, PACE_RECOVERING),
            id="just-cut",
        ),
        pytest.param(
            record(0.1, PACE_FLOOR), 50.0, (Outcome.INHERITED, 0.1, PACE_FLOOR), id="floor"
        ),
        # A floor raised since: never below it.
        pytest.param(
            record(0.05, PACE_FLOOR), 50.0, (Outcome.INHERITED, 0.1, PACE_FLOOR), id="below-floor"
        ),
        # The configured rate is read afresh, and wins: an override lowered (or a
        # Crawl-delay) below the published rate starts it there...
        pytest.param(record(17.2), 10.0, (Outcome.CAPPED, None, None), id="override-lowered"),
        pytest.param(record(17.2), 17.2, (Outcome.CAPPED, None, None), id="at-configured"),
        pytest.param(record(17.2), 0.0, (Outcome.CAPPED, None, None), id="override-of-0"),
        # ...and one raised above it keeps the cut, as a leader that stayed would.
        pytest.param(
            record(17.2), 80.0, (Outcome.INHERITED, 17.2, PACE_RECOVERING), id="override-raised"
        ),
        # Nothing to carry: no cut in the record (a halted one's 0 is no cut).
        pytest.param(
            record(50.0, PACE_CONFIGURED), 50.0, (Outcome.UNCUT, None, None), id="configured"
        ),
        pytest.param(record(0.0, PACE_HALTED), 50.0, (Outcome.UNCUT, None, None), id="halted"),
        pytest.param(record(0.0, PACE_STOPPED), 50.0, (Outcome.UNCUT, None, None), id="stopped"),
        # Age, on the new leader's clock: up to 600 s, stale after.
        pytest.param(
            record(17.2, age_s=600.0), 50.0, (Outcome.INHERITED, 17.2, PACE_RECOVERING), id="600s"
        ),
        pytest.param(record(17.2, age_s=600.5), 50.0, (Outcome.STALE, None, None), id="stale"),
        pytest.param(record(17.2, age_s=86400.0), 50.0, (Outcome.STALE, None, None), id="a-day"),
        # A leader whose clock runs ahead of this one's: its record is recent all the same.
        pytest.param(
            record(17.2, age_s=-2.0), 50.0, (Outcome.INHERITED, 17.2, PACE_RECOVERING), id="ahead"
        ),
        # Written by a monitor older than decided_at_s: its age is unknown.
        pytest.param(record(17.2, age_s=None), 50.0, (Outcome.UNTIMED, None, None), id="untimed"),
        # A source new to the leader.
        pytest.param(None, 50.0, (Outcome.NEW, None, None), id="new"),
        # Not a pacing record.
        *(
            pytest.param(raw, 50.0, (Outcome.MALFORMED, None, None), id=f"malformed-{name}")
            for name, raw in [
                ("not-json", "recovering at 17/s"),
                ("empty", ""),
                ("a-list", "[17.2]"),
                ("no-rate", scribbled(rate_rps=None)),
                ("rate-a-word", scribbled(rate_rps="fast")),
                ("rate-nan", scribbled(rate_rps="nan")),
                ("rate-infinite", scribbled(rate_rps="inf")),
                ("rate-negative", scribbled(rate_rps=-3)),
                ("configured-negative", scribbled(configured_rps=-50)),
                ("unknown-state", scribbled(state="sulking")),
                ("time-a-word", scribbled(decided_at_s="yesterday")),
                ("time-nan", scribbled(decided_at_s="nan")),
            ]
        ),
    ],
)
def test_inherit(raw, configured, expected):
    outcome, rate, state = expected
    taken = inherit(raw, configured, 7, NOW, SETTINGS)
    assert taken.outcome == outcome
    if rate is None:
        assert taken.pace is None
        return
    pace = taken.pace
    assert pace is not None
    assert (pace.effective_rps, pace.state) == (pytest.approx(rate), state)
    assert pace.configured_rps == configured
    # Counting starts at the new leader's first reading; no cut is remembered.
    assert (pace.signals_seen, pace.at_s, pace.last_cut_at_s) == (7, NOW, None)
    assert 0 < pace.effective_rps <= configured


def test_a_taken_over_rate_is_where_the_new_leader_climbs_and_cuts_from():
    taken = inherit(record(17.2), 50.0, 7, NOW, SETTINGS).pace
    # Its first step, at once: the same rate (the time without a leader earns no climb).
    first = step(taken, 50.0, 7, NOW, SETTINGS)
    assert (first.effective_rps, first.state) == (pytest.approx(17.2), PACE_RECOVERING)
    # Then +0.5/s a second without signals, and a cut of 0.7 on the first new one.
    assert step(first, 50.0, 7, NOW + 2, SETTINGS).effective_rps == pytest.approx(18.2)
    cut = step(first, 50.0, 9, NOW + 1, SETTINGS)
    assert (cut.effective_rps, cut.state) == (pytest.approx(17.2 * 0.7), PACE_BACKOFF)


def test_the_age_limit_is_a_setting():
    settings = AdaptiveSettings(inherit_max_age_s=60.0)
    assert inherit(record(17.2, age_s=59.0), 50.0, 0, NOW, settings).outcome == Outcome.INHERITED
    assert inherit(record(17.2, age_s=61.0), 50.0, 0, NOW, settings).outcome == Outcome.STALE


def test_counts_name_every_outcome():
    tally = counts([Outcome.INHERITED, Outcome.NEW, Outcome.INHERITED])
    assert tally == {
        "inherited": 2,
        "uncut": 0,
        "capped": 0,
        "stale": 0,
        "untimed": 0,
        "malformed": 0,
        "new": 1,
    }
