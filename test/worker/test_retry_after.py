"""Retry-After parsing and its cap (pure)."""

from __future__ import annotations

import math

import pytest

from image_crawler import contract
from image_crawler.config import ConfigError
from worker.politeness.retry_after import (
    RetryAfter,
    cap_retry_after,
    parse_retry_after,
)
from worker.settings import WorkerSettings

# Wed, 21 Oct 2015 07:28:00 GMT
NOW = 1445412480.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # No header at all.
        (None, RetryAfter(None)),
        ("", RetryAfter(None)),
        ("   ", RetryAfter(None)),
        # delta-seconds: 1*DIGIT, nothing else.
        ("0", RetryAfter(0.0)),
        ("120", RetryAfter(120.0)),
        (" 120\t", RetryAfter(120.0)),
        ("0120", RetryAfter(120.0)),
        ("3600", RetryAfter(3600.0)),
        ("3601", RetryAfter(3600.0, capped=True)),
        ("1" + "0" * 30, RetryAfter(3600.0, capped=True)),
        ("9" * 100_000, RetryAfter(3600.0, capped=True)),  # no int of 100,000 digits
        ("0" * 100_000 + "7", RetryAfter(7.0)),
        ("-5", RetryAfter(None, malformed=True)),
        ("+5", RetryAfter(None, malformed=True)),
        ("1.5", RetryAfter(None, malformed=True)),
        ("1e3", RetryAfter(None, malformed=True)),
        ("5s", RetryAfter(None, malformed=True)),
        ("5 6", RetryAfter(None, malformed=True)),
        ("\u0661\u0662", RetryAfter(None, malformed=True)),  # Arabic-Indic digits
        ("soon", RetryAfter(None, malformed=True)),
        # HTTP-date: IMF-fixdate and the two obsolete forms, all two minutes from NOW.
        ("Wed, 21 Oct 2015 07:30:00 GMT", RetryAfter(120.0)),
        ("Wednesday, 21-Oct-15 07:30:00 GMT", RetryAfter(120.0)),
        ("Wed Oct 21 07:30:00 2015", RetryAfter(120.0)),
        ("Wed, 21 Oct 2015 07:28:00 GMT", RetryAfter(0.0)),
        ("Wed, 21 Oct 2015 07:00:00 GMT", RetryAfter(0.0)),  # in the past: go now
        ("Thu, 01 Jan 1970 00:00:00 GMT", RetryAfter(0.0)),
        ("Wed, 21 Oct 2015 09:00:00 GMT", RetryAfter(3600.0, capped=True)),
        ("Fri, 31 Dec 9999 23:59:59 GMT", RetryAfter(3600.0, capped=True)),
        ("Wed, 32 Oct 2015 07:30:00 GMT", RetryAfter(None, malformed=True)),
        ("Wed, 21 Oct 2015 25:30:00 GMT", RetryAfter(None, malformed=True)),
        ("Wed, 21 Oct 99999 07:30:00 GMT", RetryAfter(None, malformed=True)),
        ("Wed, 21 Oct 2015", RetryAfter(None, malformed=True)),
    ],
)
def test_retry_after_values(value, expected):
    assert parse_retry_after(value, NOW, max_s=3600.0) == expected


def test_without_a_cap_any_delay_is_kept():
    assert parse_retry_after("86400", NOW) == RetryAfter(86400.0)
    assert parse_retry_after("9" * 50, NOW) == RetryAfter(math.inf)


@pytest.mark.parametrize(
    ("seconds", "max_s", "expected"),
    [
        (0.0, 3600.0, RetryAfter(0.0)),
        (3600.0, 3600.0, RetryAfter(3600.0)),
        (3600.5, 3600.0, RetryAfter(3600.0, capped=True)),
        (math.inf, 60.0, RetryAfter(60.0, capped=True)),
    ],
)
def test_the_cap(seconds, max_s, expected):
    assert cap_retry_after(seconds, max_s) == expected


def test_attempts_and_the_retry_after_cap_default_to_the_contract():
    settings = WorkerSettings.from_env({})
    assert settings.max_attempts == contract.MAX_ATTEMPTS == 5
    assert settings.max_retry_after_s == contract.MAX_RETRY_AFTER_S == 3600.0


def test_attempts_and_the_retry_after_cap_come_from_the_environment():
    settings = WorkerSettings.from_env({"MAX_ATTEMPTS": "1", "MAX_RETRY_AFTER_S": "0.5"})
    assert (settings.max_attempts, settings.max_retry_after_s) == (1, 0.5)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"MAX_ATTEMPTS": "0"}, "MAX_ATTEMPTS"),
        ({"MAX_ATTEMPTS": "two"}, "MAX_ATTEMPTS"),
        ({"MAX_ATTEMPTS": "2.5"}, "MAX_ATTEMPTS"),
        ({"MAX_RETRY_AFTER_S": "0"}, "MAX_RETRY_AFTER_S"),
        ({"MAX_RETRY_AFTER_S": "-1"}, "MAX_RETRY_AFTER_S"),
        ({"MAX_RETRY_AFTER_S": "inf"}, "MAX_RETRY_AFTER_S"),
        ({"MAX_RETRY_AFTER_S": "nan"}, "MAX_RETRY_AFTER_S"),
        ({"MAX_RETRY_AFTER_S": "an hour"}, "MAX_RETRY_AFTER_S"),
    ],
)
def test_bad_attempts_and_caps_name_their_variable(env, named):
    with pytest.raises(ConfigError, match=named):
        WorkerSettings.from_env(env)
