"""Measuring request times as the origin saw them: the busiest window of each width."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence


def max_in_window(times: Sequence[float], width_s: float) -> int:
    """The most of ``times`` (sorted) that fall in any half-open window of ``width_s``."""
    return _busiest(times, width_s)[1]


def _busiest(times: Sequence[float], width_s: float) -> tuple[int, int]:
    """(index of the first, count) of the busiest half-open window of ``width_s`` that
    starts at one of ``times`` (sorted); (0, 0) for no times."""
    return max(
        ((i, bisect.bisect_left(times, start + width_s) - i) for i, start in enumerate(times)),
        key=lambda first_count: first_count[1],
        default=(0, 0),
    )


def paced_bound(rate_rps: float, width_s: float, jitter_s: float = 0.0) -> int:
    """The most requests even pacing at ``rate_rps`` may start in ``width_s``: one every
    ``1 / rate`` seconds, so ``rate x w + 1``; with each start seen up to ``jitter_s``
    after its slot, the slots of a window ``jitter_s`` wider."""
    return int(rate_rps * (width_s + jitter_s) + 1 + 1e-9)


def over_bound(
    times: Sequence[float], rate_rps: float, widths_s: Iterable[float], jitter_s: float = 0.0
) -> dict[float, tuple[int, int]]:
    """The widths whose busiest window holds more than ``paced_bound``: w -> (seen, bound)."""
    found = {}
    for width in widths_s:
        seen, bound = max_in_window(times, width), paced_bound(rate_rps, width, jitter_s)
        if seen > bound:
            found[width] = (seen, bound)
    return found


def busiest_gaps_ms(times: Sequence[float], width_s: float) -> list[float]:
    """The gaps in ms between the requests of the busiest window of ``width_s``: what a
    failure shows, to tell a burst (gaps near 0) from timing noise (gaps a little short)."""
    first, count = _busiest(times, width_s)
    window = times[first : first + count]
    return [round((b - a) * 1000, 1) for a, b in itertools.pairwise(window)]
