"""The one backoff (exponential, equal jitter) and the one stoppable sleep."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from image_crawler.retry import Backoff, backoff_delay, sleep_unless_stopped


@pytest.mark.parametrize(
    ("attempt", "base_s", "cap_s", "draw", "expected"),
    [
        # d = min(cap, base * 2**(attempt-1)); the wait is d/2 + draw * d/2.
        (1, 1.0, 60.0, 0.0, 0.5),
        (1, 1.0, 60.0, 0.5, 0.75),
        (2, 1.0, 60.0, 0.0, 1.0),
        (3, 1.0, 60.0, 0.5, 3.0),
        (4, 1.0, 60.0, 0.0, 4.0),
        (6, 1.0, 60.0, 0.0, 16.0),
        (7, 1.0, 60.0, 0.0, 30.0),  # 64 s is over the cap
        (7, 1.0, 60.0, 0.5, 45.0),
        (100, 1.0, 60.0, 0.0, 30.0),
        (10**9, 1.0, 60.0, 0.0, 30.0),  # no overflow
        (3, 0.5, 60.0, 0.0, 1.0),
        (3, 2.0, 5.0, 0.0, 2.5),
    ],
)
def test_backoff_delays(attempt, base_s, cap_s, draw, expected):
    assert backoff_delay(attempt, base_s=base_s, cap_s=cap_s, rng=lambda: draw) == expected


@pytest.mark.parametrize("seed", range(5))
def test_jittered_delays_stay_between_half_the_step_and_the_step(seed):
    rng = random.Random(seed)
    for attempt in range(1, 12):
        step = min(60.0, 2.0 ** (attempt - 1))
        delays = [backoff_delay(attempt, rng=rng) for _ in range(200)]
        assert all(step / 2 <= d < step for d in delays), (attempt, min(delays), max(delays))
        # Jitter spreads the retries of URLs that failed together.
        assert max(delays) - min(delays) > step / 4


def test_the_draw_may_come_from_the_shared_generator():
    assert 0.5 <= backoff_delay(1) < 1.0


def test_attempts_count_from_one():
    with pytest.raises(ValueError, match="attempt"):
        backoff_delay(0)


# --- settings ----------------------------------------------------------------------------


def test_a_loop_s_backoff_grows_to_its_cap_and_starts_again_after_a_success():
    backoff = Backoff(base_s=0.5, cap_s=4.0, rng=lambda: 0.999999)
    waits = [round(backoff.next_s(), 3) for _ in range(6)]
    assert waits == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    backoff.reset()
    assert round(backoff.next_s(), 3) == 0.5


def test_a_backoff_needs_a_positive_base_under_its_cap():
    with pytest.raises(ValueError, match="base_s"):
        Backoff(base_s=2.0, cap_s=1.0)


@pytest.mark.timing("asserts a stopped sleep ends within 5 s")
async def test_the_sleep_ends_at_once_when_stopped():
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, stop.set)
    started = time.monotonic()
    assert await sleep_unless_stopped(stop, 30.0) is True
    assert time.monotonic() - started < 5.0


@pytest.mark.timing("asserts the sleep lasts at least 0.05 s")
async def test_the_sleep_runs_its_course_unless_stopped():
    stop = asyncio.Event()
    started = time.monotonic()
    assert await sleep_unless_stopped(stop, 0.05) is False
    assert time.monotonic() - started >= 0.05
