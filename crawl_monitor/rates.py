"""Rate policy: how fast a source may be crawled and how its tokens are handed out.

Pure functions and one small stateful class, no I/O. Rates are in requests per second.
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
    """The rate a source gets this second and where it came from."""

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


# Float sums such as 0.1 + 0.2 + ... land a hair below the whole number they stand for.
_EPSILON: Final = 1e-9


class TokenSchedule:
    """The whole tokens of one source's refills, carrying fractions between refills.

    Each refill credits ``rate * period`` tokens; the bucket gets the whole part of the
    credit and the rest carries over. So 2.5/s gives 2, 3, 2, 3, ... and 0.2/s gives a
    token on every fifth refill (0, 0, 0, 0, 1, ...): the long-run average is the rate.
    """

    __slots__ = ("_credit",)

    def __init__(self) -> None:
        self._credit = 0.0

    @property
    def credit(self) -> float:
        """The fraction of a token carried to the next refill."""
        return self._credit

    def next_refill(self, rate_rps: float, period_s: float = 1.0) -> int:
        """The bucket's value for the next refill period."""
        # Conditionals rather than max(): this runs for every source every second.
        credit = self._credit + (rate_rps * period_s if rate_rps > 0.0 else 0.0)
        tokens = math.floor(credit + _EPSILON)
        rest = credit - tokens
        self._credit = rest if rest > 0.0 else 0.0
        return tokens

    def reset(self) -> None:
        """Forget the carried fraction (a halted source starts afresh)."""
        self._credit = 0.0


def next_tick_at(origin_s: float, now_s: float, period_s: float) -> float:
    """The first tick of the grid ``origin + k * period`` strictly after ``now``.

    Ticks a slow loop missed are skipped, not caught up in a burst.
    """
    if now_s < origin_s:
        return origin_s
    elapsed_periods = math.floor((now_s - origin_s) / period_s)
    return origin_s + (elapsed_periods + 1) * period_s
