"""The regulator's loop with 1,000 and 10,000 busy sources against a real redis-server,
10,000 also with 100 of them capped by a robots.txt Crawl-delay.

Checks every rate and halt, and the round trips per loop; the durations are printed
(``pytest -s``) and recorded as properties, not asserted (they depend on the machine).
"""

from __future__ import annotations

import pytest

from bench.regulator import CRAWL_DELAY_S, bench_source, measure_loop
from crawl_monitor.policy.rates import compute_crawl_rate
from image_crawler import contract as c


@pytest.mark.parametrize(("n_sources", "crawl_delayed"), [(1_000, 0), (10_000, 0), (10_000, 100)])
async def test_one_loop_with_many_sources(redis, n_sources, crawl_delayed, record_property):
    loops = 5
    m = await measure_loop(redis, n_sources, loops=loops, crawl_delayed=crawl_delayed)
    print(
        f"\n{n_sources} busy sources, {crawl_delayed} crawl-delayed: loop median "
        f"{m.median_s * 1000:.0f} ms, slowest {m.slowest_s * 1000:.0f} ms, "
        f"{m.round_trips_per_loop:g} Redis round trips per loop"
    )
    record_property("loop_median_s", m.median_s)
    record_property("round_trips_per_loop", m.round_trips_per_loop)
    assert m.round_trips_per_loop == 2

    seeded = m.seeded
    names = [bench_source(i) for i in range(n_sources)]
    values = await redis.mget([c.pace_rate_key(n) for n in names])
    signals = await redis.mget([c.backoff_signals_key(n) for n in names])
    zero = seeded.halted | {seeded.failing, seeded.erroring}
    cut = 0
    for name, value, signalled in zip(names, values, signals, strict=True):
        if name in zero:
            assert value == "0", name
            continue
        configured = (
            seeded.override_rps
            if name == seeded.overridden
            else compute_crawl_rate(seeded.image_counts[name])
        )
        if name in seeded.crawl_delayed:
            configured = min(configured, 1 / CRAWL_DELAY_S)
        assert m.snapshot.rates[name] == configured
        # Sources whose server answered 503 are paced below their configured rate.
        if signalled:
            assert float(value) < configured, name
            cut += 1
        else:
            assert float(value) == configured, name
    assert cut >= n_sources // m.backoff_every
    assert len(seeded.crawl_delayed) == crawl_delayed
    capped = [n for n in seeded.crawl_delayed if m.snapshot.pacing[n].origin == "crawl_delay"]
    assert len(capped) >= crawl_delayed * 0.9  # all but those computed below 0.5/s
    assert await redis.smembers(c.HALTED_SET) == seeded.halted | {seeded.failing}
    assert await redis.smembers(c.TEMP_HALTED_SET) == {seeded.erroring}
    assert await redis.hlen(c.RATES_HASH) == n_sources
    assert len(m.snapshot.last_statuses) == n_sources
