"""Rate policy: how fast a source may be crawled (its configured rate), and the loop's grid.

Pure functions, no I/O. Rates are in requests per second. A source's configured rate is
computed from its image count, or an operator's override, and at most 1 / its robots.txt
Crawl-delay (``parse_crawl_delay``; applied by ``decision``). How far below its
configured rate a source is held while its server pushes back is ``adaptive``'s business.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Final

from image_crawler.contract import (
    MAX_IMAGES,
    MAX_RATE_RPS,
    MIN_IMAGES,
    MIN_RATE_RPS,
    OVERRIDE_RATE_ALIAS_PREFIX,
    OVERRIDE_RATE_PREFIX,
)


def compute_crawl_rate(image_count: int) -> float:
    """The rate a source of ``image_count`` images may be crawled at, in requests/s.

    Linear between (5,000 images, 0.2/s) and (500,000,000 images, 200/s); smaller sources
    get 0.2/s and larger ones 200/s.
    """
    if image_count <= MIN_IMAGES:
        return MIN_RATE_RPS
    if image_count >= MAX_IMAGES:
        return MAX_RATE_RPS
    share = (image_count - MIN_IMAGES) / (MAX_IMAGES - MIN_IMAGES)
    return MIN_RATE_RPS + share * (MAX_RATE_RPS - MIN_RATE_RPS)


class InvalidOverride(ValueError):
    """An override key holds something that is not a rate."""


def parse_override(raw: str) -> float:
    """The rate an operator wrote into an override key; raises ``InvalidOverride``.

    Any finite number >= 0 is a rate (0 stops the source without halting it).
    """
    try:
        value = float(raw)
    except ValueError:
        raise InvalidOverride(f"not a number: {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise InvalidOverride(f"not a finite rate >= 0: {raw!r}")
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class RateChoice:
    """A source's configured rate and where it came from."""

    rate_rps: float
    # "computed", or the key prefix of the override that won.
    origin: str
    # Override key prefix -> the value that was ignored because it is not a rate.
    ignored: dict[str, str] = dataclasses.field(default_factory=dict)


COMPUTED: Final = "computed"
# PacingInfo.origin of a source whose configured rate is its robots.txt Crawl-delay's cap.
CRAWL_DELAY: Final = "crawl_delay"


def choose_rate(computed_rps: float, override: str | None, alias: str | None) -> RateChoice:
    """Apply the operator's override (``override_rate:``, else ``override-rate:``).

    A value that is not a rate is ignored (and reported in ``ignored``), as if absent.
    """
    ignored: dict[str, str] = {}
    for prefix, raw in ((OVERRIDE_RATE_PREFIX, override), (OVERRIDE_RATE_ALIAS_PREFIX, alias)):
        if raw is None:
            continue
        try:
            rate = parse_override(raw)
        except InvalidOverride:
            ignored[prefix] = raw
            continue
        return RateChoice(rate, prefix, ignored)
    return RateChoice(computed_rps, COMPUTED, ignored)


class InvalidCrawlDelay(ValueError):
    """A ``crawl_delay:`` key holds something that is not a delay."""


def parse_crawl_delay(raw: str) -> float:
    """The delay (seconds) a ``crawl_delay:`` key holds; raises ``InvalidCrawlDelay``.

    Any finite number > 0, as written: the worker that notes a robots.txt Crawl-delay
    caps it (its ``MAX_CRAWL_DELAY_S``), and its pacing obeys the key as it is, so the
    source's configured rate follows the same value.
    """
    try:
        value = float(raw)
    except ValueError:
        raise InvalidCrawlDelay(f"not a number: {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise InvalidCrawlDelay(f"not a finite delay > 0: {raw!r}")
    return value


def crawl_delay_why(delay_s: float) -> str:
    """Why a source's configured rate is its Crawl-delay's cap, for operators."""
    return f"robots.txt Crawl-delay {delay_s:g} s: at most {1.0 / delay_s:.3g}/s"


def next_tick_at(origin_s: float, now_s: float, period_s: float) -> float:
    """The first tick of the grid ``origin + k * period`` strictly after ``now``.

    Ticks a slow loop missed are skipped, not caught up in a burst.
    """
    if now_s < origin_s:
        return origin_s
    elapsed_periods = math.floor((now_s - origin_s) / period_s)
    return origin_s + (elapsed_periods + 1) * period_s
