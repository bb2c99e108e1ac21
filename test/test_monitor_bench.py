"""The regulator's loop with 1,000 and 10,000 busy sources against a real redis-server.

Checks every bucket and halt, and the round trips per loop; the durations are printed
(``pytest -s``) and recorded as properties, not asserted (they depend on the machine).
"""

from __future__ import annotations

import math

import pytest

from crawl_monitor.bench import bench_source, measure_loop
from crawl_monitor.rates import compute_crawl_rate
from image_crawler import contract as c


def refill(rate_rps: float, k: int) -> int:
    """The k-th refill (1-based) of a bucket that carries fractions: floor(k r) - floor((k-1) r)."""
    return math.floor(k * rate_rps + 1e-9) - math.floor((k - 1) * rate_rps + 1e-9)


@pytest.mark.parametrize("n_sources", [1_000, 10_000])
async def test_one_loop_with_many_sources(redis, n_sources, record_property):
    loops = 5
    m = await measure_loop(redis, n_sources, loops=loops)
    print(
        f"\n{n_sources} busy sources: loop median {m.median_s * 1000:.0f} ms, slowest "
        f"{m.slowest_s * 1000:.0f} ms, {m.round_trips_per_loop:g} Redis round trips per loop"
    )
    record_property("loop_median_s", m.median_s)
    record_property("round_trips_per_loop", m.round_trips_per_loop)
    assert m.round_trips_per_loop == 2

    seeded = m.seeded
    names = [bench_source(i) for i in range(n_sources)]
    values = await redis.mget([c.tokens_key(n) for n in names])
    zero = seeded.halted | {seeded.failing, seeded.erroring}
    for name, value in zip(names, values, strict=True):
        if name in zero:
            expected = 0
        elif name == seeded.overridden:
            expected = refill(seeded.override_rps, loops)
        else:
            expected = refill(compute_crawl_rate(seeded.image_counts[name]), loops)
        assert value == str(expected), name
    assert await redis.smembers(c.HALTED_SET) == seeded.halted | {seeded.failing}
    assert await redis.smembers(c.TEMP_HALTED_SET) == {seeded.erroring}
    assert m.snapshot.rates[seeded.overridden] == seeded.override_rps
    assert len(m.snapshot.last_statuses) == n_sources
