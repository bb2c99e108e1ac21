"""Rate policy: how fast a source may be crawled (its configured rate), and the loop's grid.

Pure functions, no I/O. Rates are in requests per second. How far below its configured
rate a source is held while its server pushes back is ``adaptive``'s business.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Final

from image_crawler.contract import OVERRIDE_RATE_ALIAS_PREFIX, OVERRIDE_RATE_PREFIX

# The interpolation's two anchors: (image count, requests/s).
MIN_IMAGES: Final = 5_000
MAX_IMAGES: Final = 500_000_000
MIN_RATE_RPS: Final = 0.2
MAX_RATE_RPS: Final = 200.0


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


def next_tick_at(origin_s: float, now_s: float, period_s: float) -> float:
    """The first tick of the grid ``origin + k * period`` strictly after ``now``.

    Ticks a slow loop missed are skipped, not caught up in a burst.
    """
    if now_s < origin_s:
        return origin_s
    elapsed_periods = math.floor((now_s - origin_s) / period_s)
    return origin_s + (elapsed_periods + 1) * period_s
