"""The rule of which read URLs run, wait for their host, or are parked (worker.host_queues)."""

from __future__ import annotations

import pytest

from worker.host_queues import (
    HOLD,
    PARK,
    QUEUED,
    START,
    HostQueues,
    HostQueueSettings,
    Waiting,
)
from worker.politeness.hosts import HostKey

SLOW, FAST, OTHER = HostKey("s", "slow.org"), HostKey("s", "fast.org"), HostKey("t", "x.org")
SETTINGS = HostQueueSettings(lead_s=2.0, queue_s=30.0, park_after_s=60.0, max_waiting=1000)


def queues(intervals=None, settings=SETTINGS):
    known = {SLOW: 10.0, FAST: 0.01} if intervals is None else intervals
    return HostQueues(known.get, settings)


def url(key, offset, now=0.0):
    return Waiting(key, ("p", 0), offset, f"{key.host}/{offset}".encode(), now)


@pytest.mark.parametrize(
    ("interval", "share", "running", "queued"),
    [
        # Never heard from: 1 request/s; its queue at least the source's share.
        (None, 100, 2, 100),
        (10.0, 100, 1, 100),  # a host at 0.1/s runs one URL waiting for its slot
        (10.0, 2, 1, 3),  # and keeps 30 s of them, when that is more than the share
        (3.0, 5, 1, 10),  # Crawl-delay 3 s
        (0.1, 100, 20, 300),
        (0.001, 100, 100, 30_000),  # a fast host: as many as the source's share
        (0.001, 7, 7, 30_000),
    ],
)
def test_a_host_runs_what_it_can_start_soon_and_queues_what_it_can_do_in_30_s(
    interval, share, running, queued
):
    q = queues({SLOW: interval} if interval else {})
    assert q.running_cap(SLOW, share) == running
    assert q.queue_cap(SLOW, share) == queued


def test_a_slow_host_runs_one_url_and_the_rest_wait_without_a_slot():
    q = queues()
    assert q.offer(url(FAST, 0), share=3, now=0.0) == START
    q.started(FAST)
    assert q.offer(url(SLOW, 0), share=3, now=0.0) == START
    q.started(SLOW)
    verdicts = [q.offer(url(SLOW, i), share=3, now=0.0) for i in range(1, 6)]
    # Its queue holds 30 s of its requests or the share (3); the rest are parked, for
    # the source's other host needs the reading to go on.
    assert verdicts == [QUEUED, QUEUED, QUEUED, PARK, PARK]
    assert q.waiting == q.waiting_of("s") == 3
    # As the slow host's URL ends, its next one starts, oldest first.
    [ready] = q.ended(SLOW, share=8, now=1.0)
    assert ready.offset == 1 and not ready.queued
    assert q.running_of(SLOW) == 1 and q.waiting == 2


def test_a_source_queues_at_most_its_share_and_the_worker_at_most_max_waiting():
    hosts = [HostKey("s", f"h{i}.org") for i in range(10)]
    q = queues(dict.fromkeys(hosts, 10.0))
    for i, key in enumerate(hosts):
        q.started(key)
        assert q.offer(url(key, i), share=4, now=0.0) == (QUEUED if i < 4 else HOLD)
    assert q.waiting_of("s") == 4
    small = queues(dict.fromkeys(hosts, 10.0), HostQueueSettings(max_waiting=2))
    for key in hosts[:3]:
        small.started(key)
    verdicts = [small.offer(url(key, 0), share=100, now=0.0) for key in hosts[:3]]
    assert verdicts == [QUEUED, QUEUED, HOLD]
    assert small.crowded()


def test_a_deferred_url_waits_at_the_head_of_its_host_until_the_wait_is_over():
    q = queues()
    q.started(SLOW)
    q.offer(url(SLOW, 1), share=8, now=0.0)
    q.defer(url(SLOW, 0), wait_s=30.0, now=0.0)  # halted for 30 s
    assert q.running_of(SLOW) == 0 and q.waiting == 2
    # Blocked: a new URL of the host waits too, even with no task running.
    assert q.offer(url(SLOW, 2), share=8, now=1.0) == QUEUED
    assert q.due(share=8, now=29.0) == []
    [first] = q.due(share=8, now=30.0)
    assert first.offset == 0  # the deferred one first
    assert q.running_of(SLOW) == 1 and q.waiting == 2


def test_a_url_waiting_too_long_is_parked_only_when_another_host_of_its_source_has_work():
    q = queues()
    q.started(SLOW)
    q.offer(url(SLOW, 1), share=8, now=0.0)
    # Its source's only busy host: kept (nothing else needs its partition's commit).
    assert q.stale(now=61.0) == []
    q.started(FAST)
    [parked] = q.stale(now=121.0)  # looked at again a park_after_s later
    assert parked.offset == 1 and q.waiting == 0
    # Parked, it is no longer queued: the host's next URL starts as it ends.
    assert q.ended(SLOW, share=8, now=122.0) == []


def test_a_host_of_another_source_does_not_count_as_another_host():
    q = queues()
    q.started(OTHER)
    q.started(SLOW)
    assert not q.has_other_host(SLOW)
    q.offer(url(SLOW, 1), share=8, now=0.0)
    assert q.stale(now=61.0) == []


def test_a_url_started_or_queued_again_is_not_parked_for_its_first_wait():
    q = queues()
    q.started(SLOW)
    q.started(FAST)
    q.offer(url(SLOW, 1), share=8, now=0.0)
    [entry] = q.ended(SLOW, share=8, now=50.0)
    q.defer(entry, wait_s=5.0, now=55.0)
    assert q.stale(now=61.0) == []  # its wait began again at 55
    assert [e.offset for e in q.stale(now=115.0)] == [1]


def test_revoked_partitions_lose_their_waiting_urls():
    q = queues()
    q.started(SLOW)
    q.offer(url(SLOW, 1), share=8, now=0.0)
    other = Waiting(SLOW, ("p", 1), 7, b"", 0.0)
    q.offer(other, share=8, now=0.0)
    assert q.forget({("p", 0)}) == 1
    assert [e.offset for e in q] == [7] and q.waiting == 1


def test_a_url_that_has_its_slot_no_longer_takes_its_host_s_room():
    q = queues()
    q.started(SLOW)
    q.offer(url(SLOW, 1), share=8, now=0.0)
    # The running URL's request has its slot: the next one starts while it downloads.
    [ready] = q.granted(SLOW, share=8, now=1.0)
    assert ready.offset == 1 and q.running_of(SLOW) == 1
    assert q.ended(SLOW, share=8, now=2.0, granted=True) == []
    assert q.running_of(SLOW) == 1  # the second, still waiting for its slot
    q.ended(SLOW, share=8, now=3.0)
    assert q.running_of(SLOW) == 0 and not q.has_other_host(FAST)


def test_a_source_of_one_busy_host_is_read_later_rather_than_parked():
    q = queues()
    q.started(SLOW)
    verdicts = [q.offer(url(SLOW, i), share=3, now=0.0) for i in range(1, 6)]
    assert verdicts == [QUEUED, QUEUED, QUEUED, HOLD, HOLD]
    # Blocked (halted, a long Retry-After): parked, it may wait long.
    q.defer(url(SLOW, 0), wait_s=60.0, now=0.0)
    assert q.offer(url(SLOW, 6), share=3, now=1.0) == PARK
