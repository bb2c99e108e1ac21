"""Circuit breaker decisions, as tables of status histograms."""

from __future__ import annotations

import json

import pytest

from crawl_monitor.policy.breakers import (
    count_errors,
    decide,
    every_request_failed,
    halt_message,
    is_error,
    spread,
    window_unhealthy,
    without_backoff,
)


@pytest.mark.parametrize(
    ("status", "error"),
    [
        ("200", False),
        ("300", False),
        ("301", False),
        ("302", False),
        ("404", False),
        ("UnidentifiedImageError", False),
        ("NoRateToken", False),
        ("500", True),
        ("429", True),
        ("403", True),
        ("303", True),
        ("ServerDisconnected", True),
        ("Timeout", True),
        ("", True),
    ],
)
def test_is_error(status, error):
    assert is_error(status) is error


@pytest.mark.parametrize(
    ("window", "unhealthy"),
    [
        ({}, False),
        ({"500": 5}, False),  # exactly 5 samples: too few to judge
        ({"500": 6}, True),
        ({"500": 1, "200": 5}, True),  # 1 of 6 is 16.7%
        ({"500": 1, "200": 9}, False),  # exactly 10% is not more than 10%
        ({"500": 10, "200": 90}, False),
        ({"500": 11, "200": 89}, True),  # 11%
        ({"500": 2, "200": 17}, True),  # 10.5%
        ({"500": 10, "200": 10}, True),
        ({"404": 50, "200": 3}, False),  # 404 is expected
        ({"NoRateToken": 40, "UnidentifiedImageError": 9, "301": 1}, False),
        ({"429": 3, "ServerDisconnected": 3, "200": 40}, True),  # 6 of 46 = 13%
        ({"429": 3, "ServerDisconnected": 2, "200": 45}, False),  # 5 of 50 = 10%
    ],
)
def test_window_unhealthy(window, unhealthy):
    assert window_unhealthy(window) is unhealthy


@pytest.mark.parametrize(
    ("last", "failed"),
    [
        ({}, False),
        ({"500": 49}, False),  # 49 failures are not 50
        ({"500": 50}, True),
        ({"500": 49, "200": 1}, False),  # 50 with one success
        ({"500": 49, "404": 1}, False),  # 404 is expected, not a failure
        ({"500": 20, "403": 20, "ServerDisconnected": 10}, True),
        ({"500": 50, "200": 0}, True),
    ],
)
def test_every_request_failed(last, failed):
    assert every_request_failed(last) is failed


def test_count_errors():
    assert count_errors({"500": 3, "200": 4, "404": 2, "Timeout": 1}) == 4


BAD = {"500": 10, "200": 10}
GOOD = {"200": 20}
FAILED = {"500": 50}


@pytest.mark.parametrize(
    ("window", "last", "temp_halted", "halted", "expected"),
    [
        # (temp_halted, trips_temporary, lifts_temporary, trips_permanent)
        (GOOD, GOOD, False, False, (False, False, False, False)),
        (BAD, GOOD, False, False, (True, True, False, False)),  # trips
        (BAD, GOOD, True, False, (True, False, False, False)),  # stays, no new trip
        (GOOD, GOOD, True, False, (False, False, True, False)),  # lifted
        ({}, {}, True, False, (False, False, True, False)),  # window aged out: lifted
        ({"500": 5}, {}, True, False, (False, False, True, False)),  # too few samples
        (GOOD, FAILED, False, False, (False, False, False, True)),  # permanent trip
        (GOOD, FAILED, False, True, (False, False, False, False)),  # already halted
        (BAD, FAILED, False, False, (True, True, False, True)),  # both at once
        (BAD, FAILED, True, True, (True, False, False, False)),
    ],
)
def test_decide(window, last, temp_halted, halted, expected):
    decision = decide(window, last, temp_halted=temp_halted, halted=halted)
    assert (
        decision.temp_halted,
        decision.trips_temporary,
        decision.lifts_temporary,
        decision.trips_permanent,
    ) == expected


def test_halt_messages_name_the_source_and_the_codes():
    temporary = halt_message("example", "temporary", {"500": 11, "200": 3})
    assert temporary.startswith("example tripped temporary halt. Response codes: ")
    assert json.loads(temporary.split("Response codes: ", 1)[1]) == {"200": 3, "500": 11}
    permanent = halt_message("example", "permanent", {"500": 50})
    assert permanent.startswith("example tripped permanent halt")
    assert permanent.endswith('Response codes: {"500": 50}')


@pytest.mark.parametrize(
    ("window", "last", "excused", "expected"),
    [
        # (temp_halted, trips_permanent)
        # A server asking for less: not breaker errors while the rate can still fall...
        ({"503": 30, "200": 10}, {"503": 50}, True, (False, False)),
        ({"429": 10, "Timeout": 10, "200": 1}, {"429": 25, "Timeout": 25}, True, (False, False)),
        # ...at the floor, errors as before.
        ({"503": 30, "200": 10}, {"503": 50}, False, (True, True)),
        ({"429": 10, "Timeout": 10, "200": 1}, {"429": 25, "Timeout": 25}, False, (True, True)),
        # Other errors count either way, weighed against what is left.
        ({"503": 40, "500": 2, "200": 8}, {"503": 40, "500": 10}, True, (True, False)),
        ({"503": 40, "500": 1, "200": 9}, {"503": 40, "500": 10}, True, (False, False)),
        ({"503": 40, "500": 6}, {"503": 1, "500": 49}, True, (True, False)),  # 49 left of 50
        ({"500": 6}, {"500": 50}, True, (True, True)),
    ],
)
def test_backoff_statuses_are_excused_above_the_floor(window, last, excused, expected):
    decision = decide(window, last, temp_halted=False, halted=False, backoff_excused=excused)
    assert (decision.temp_halted, decision.trips_permanent) == expected


def test_without_backoff():
    assert without_backoff({"503": 3, "429": 1, "Timeout": 2, "500": 4, "200": 5}) == {
        "500": 4,
        "200": 5,
    }
    healthy = {"200": 5}
    assert without_backoff(healthy) is healthy  # nothing to leave out: not copied


@pytest.mark.parametrize(
    ("hosts", "failing", "expected"),
    [
        (0, 0, True),  # no host named (an older worker): as one host
        (1, 1, True),  # one host: the source's breakers as they always were
        (2, 1, False),  # one of two hosts failing: its own breaker's business
        (2, 2, True),
        (20, 2, True),  # at least 2, and one in ten
        (30, 2, False),
        (30, 3, True),
        (1000, 99, False),
        (1000, 100, True),
    ],
)
def test_a_source_of_several_hosts_trips_on_failures_spread_over_them(hosts, failing, expected):
    assert spread(hosts, failing) is expected
    decision = decide(
        BAD, FAILED, temp_halted=False, halted=False, hosts=hosts, failing_hosts=failing
    )
    assert (decision.trips_temporary, decision.trips_permanent) == (expected, expected)


def test_a_temporary_halt_is_lifted_once_the_failures_are_one_host_s_alone():
    decision = decide(BAD, GOOD, temp_halted=True, halted=False, hosts=10, failing_hosts=1)
    assert decision.lifts_temporary and not decision.temp_halted
