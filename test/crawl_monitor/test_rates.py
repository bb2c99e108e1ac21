"""Rate policy: computed rates, overrides and the loop's grid."""

from __future__ import annotations

import pytest

from crawl_monitor.policy.rates import (
    COMPUTED,
    MAX_RATE_RPS,
    MIN_RATE_RPS,
    InvalidCrawlDelay,
    InvalidOverride,
    choose_rate,
    compute_crawl_rate,
    crawl_delay_why,
    next_tick_at,
    parse_crawl_delay,
    parse_override,
)

# The slope of the line through (5,000, 0.2) and (500,000,000, 200), per image.
SLOPE = (200 - 0.2) / (500_000_000 - 5_000)


@pytest.mark.parametrize(
    ("image_count", "rate_rps"),
    [
        (0, 0.2),
        (-10, 0.2),
        (4_999, 0.2),
        (5_000, 0.2),
        (5_001, 0.2 + SLOPE),
        (1_000_000, 0.2 + 995_000 * SLOPE),  # ~0.5976
        (250_000_000, 0.2 + 249_995_000 * SLOPE),  # ~100.1
        (499_999_999, 200 - SLOPE),
        (500_000_000, 200.0),
        (1_000_000_000, 200.0),
    ],
)
def test_compute_crawl_rate(image_count, rate_rps):
    assert compute_crawl_rate(image_count) == pytest.approx(rate_rps, rel=1e-12)


def test_the_rate_grows_with_the_image_count_between_the_anchors():
    counts = [5_000, 5_001, 10_000, 1_000_000, 250_000_000, 499_999_999, 500_000_000]
    rates = [compute_crawl_rate(n) for n in counts]
    assert rates == sorted(rates)
    assert len(set(rates)) == len(rates)
    assert rates[0] == MIN_RATE_RPS and rates[-1] == MAX_RATE_RPS
    # The midpoint of the counts lands on the midpoint of the rates.
    assert compute_crawl_rate((5_000 + 500_000_000) // 2) == pytest.approx(100.1, abs=1e-6)


@pytest.mark.parametrize(
    ("raw", "rate_rps"),
    [("5", 5.0), ("0.5", 0.5), (" 10 ", 10.0), ("0", 0.0), ("1e3", 1000.0), ("2.50", 2.5)],
)
def test_parse_override_accepts_rates(raw, rate_rps):
    assert parse_override(raw) == rate_rps


@pytest.mark.parametrize("raw", ["", "fast", "-1", "-0.5", "nan", "inf", "-inf", "5/s", "1,5"])
def test_parse_override_rejects_what_is_not_a_rate(raw):
    with pytest.raises(InvalidOverride):
        parse_override(raw)


@pytest.mark.parametrize(
    ("override", "alias", "rate_rps", "origin", "ignored"),
    [
        (None, None, 3.0, COMPUTED, {}),
        ("5", None, 5.0, "override_rate:", {}),
        (None, "10", 10.0, "override-rate:", {}),
        ("5", "10", 5.0, "override_rate:", {}),  # both: override_rate: wins
        ("0", "10", 0.0, "override_rate:", {}),  # 0 is a rate (stops the source)
        ("fast", "10", 10.0, "override-rate:", {"override_rate:": "fast"}),
        ("fast", None, 3.0, COMPUTED, {"override_rate:": "fast"}),
        (None, "-2", 3.0, COMPUTED, {"override-rate:": "-2"}),
        ("-1", "x", 3.0, COMPUTED, {"override_rate:": "-1", "override-rate:": "x"}),
    ],
)
def test_choose_rate(override, alias, rate_rps, origin, ignored):
    choice = choose_rate(3.0, override, alias)
    assert (choice.rate_rps, choice.origin, choice.ignored) == (rate_rps, origin, ignored)


@pytest.mark.parametrize(
    ("raw", "delay_s"),
    [
        ("10", 10.0),
        ("0.5", 0.5),
        (" 2 ", 2.0),
        ("1e1", 10.0),
        ("60", 60.0),
        # As written: the worker that noted it capped it, and its pacing obeys it as is.
        ("61", 61.0),
        ("1e9", 1e9),
        ("0.001", 0.001),
    ],
)
def test_parse_crawl_delay_accepts_delays(raw, delay_s):
    assert parse_crawl_delay(raw) == delay_s


@pytest.mark.parametrize("raw", ["", "soon", "0", "-0", "-1", "nan", "inf", "-inf", "10s"])
def test_parse_crawl_delay_rejects_what_is_not_a_delay(raw):
    with pytest.raises(InvalidCrawlDelay):
        parse_crawl_delay(raw)


@pytest.mark.parametrize(
    ("delay_s", "why"),
    [
        (10.0, "robots.txt Crawl-delay 10 s: at most 0.1/s"),
        (3.0, "robots.txt Crawl-delay 3 s: at most 0.333/s"),
        (0.25, "robots.txt Crawl-delay 0.25 s: at most 4/s"),
        (60.0, "robots.txt Crawl-delay 60 s: at most 0.0167/s"),
    ],
)
def test_crawl_delay_why(delay_s, why):
    assert crawl_delay_why(delay_s) == why


@pytest.mark.parametrize(
    ("origin", "now", "period", "expected"),
    [
        (100.0, 100.0, 1.0, 101.0),
        (100.0, 100.2, 1.0, 101.0),
        (100.0, 100.999, 1.0, 101.0),
        (100.0, 101.0, 1.0, 102.0),
        (100.0, 103.4, 1.0, 104.0),  # a slow loop skips the ticks it missed
        (100.0, 99.0, 1.0, 100.0),
        (0.0, 7.0, 5.0, 10.0),
    ],
)
def test_next_tick_at(origin, now, period, expected):
    assert next_tick_at(origin, now, period) == pytest.approx(expected)


def test_ticks_stay_on_the_grid_whatever_each_loop_takes():
    tick = 0.0
    for work_s in [0.3, 0.9, 0.01, 0.5] * 250:
        tick = next_tick_at(0.0, tick + work_s, 1.0)
    assert tick == pytest.approx(1000.0)
