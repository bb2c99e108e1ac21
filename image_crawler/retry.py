"""Waiting between tries, the same way everywhere: exponential backoff with jitter, and
a sleep that a stop cuts short.

Every loop that retries a service (Kafka, Redis, S3, a sources URL, a robots.txt file, a
URL) waits ``backoff_delay`` between tries: the step doubles from ``base_s`` up to
``cap_s``, and "equal jitter" draws the wait from the step's upper half, so that the
processes (or URLs) that failed together do not come back together, and a wait never
falls below half its step. ``Backoff`` counts the tries of one loop. Every wait of a
process that has a stop event goes through ``sleep_unless_stopped``, so that SIGTERM is
never stuck behind a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable

RandomSource = random.Random | Callable[[], float]


def backoff_delay(
    attempt: int,
    *,
    base_s: float = 1.0,
    cap_s: float = 60.0,
    rng: RandomSource | None = None,
) -> float:
    """Seconds to wait before try ``attempt + 1``, after ``attempt`` tries (1 = the first).

    ``d = min(cap_s, base_s * 2 ** (attempt - 1))``, then "equal jitter": ``d/2`` plus a
    uniform draw from ``[0, d/2)``, so the wait never falls below half the exponential
    step and never exceeds ``cap_s``. ``rng`` is a ``random.Random`` or a function
    returning a float in ``[0, 1)`` (default: the module's shared generator).
    """
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    # 2 ** 1100 is past a float's range; any exponent beyond the cap's is the cap anyway.
    exponent = min(attempt - 1, 1023)
    step = min(cap_s, base_s * 2.0**exponent)
    draw = _draw(rng)
    return step / 2 + draw * step / 2


def _draw(rng: RandomSource | None) -> float:
    if rng is None:
        return random.random()
    if isinstance(rng, random.Random):
        return rng.random()
    return rng()


class Backoff:
    """The waits of one retry loop: ``next_s()`` after each failure, ``reset()`` after a
    success."""

    def __init__(self, *, base_s: float, cap_s: float, rng: RandomSource | None = None) -> None:
        if not 0 < base_s <= cap_s:
            raise ValueError(f"need 0 < base_s <= cap_s, got {base_s}, {cap_s}")
        self.base_s = base_s
        self.cap_s = cap_s
        self._rng = rng
        self.failures = 0

    def next_s(self) -> float:
        """Count a failure; the seconds to wait before the next try."""
        self.failures += 1
        return backoff_delay(self.failures, base_s=self.base_s, cap_s=self.cap_s, rng=self._rng)

    def reset(self) -> None:
        self.failures = 0


async def sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` or until ``stop`` is set, whichever comes first; True if stopped."""
    if seconds > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)
    else:
        # Still a turn of the loop: a caller looping on a zero wait must not starve it.
        await asyncio.sleep(0)
    return stop.is_set()
