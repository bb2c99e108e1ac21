"""Finding URLs deleted unread, with an in-memory consumer: what is counted, what is
committed, and that a Kafka or Redis that does not answer stops nothing."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, KafkaConnectionError
from prometheus_client import REGISTRY
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from structlog.testing import capture_logs

from image_crawler.contract import urls_lost_key
from test.harness.services import free_port
from worker.lost_urls import LostUrls

A0 = TopicPartition("urls.lost_a", 0)
A1 = TopicPartition("urls.lost_a", 1)
B0 = TopicPartition("urls.lost_b", 0)


class Offsets:
    """The consumer's offsets: committed, log starts, and the commits made."""

    def __init__(self, committed, log_start, *, fail=None, hang=False, refuse=False):
        self.committed_offsets = committed
        self.log_start = log_start
        self.fail = fail
        self.hang = hang
        self.refuse = refuse
        self.commits = {}

    def assignment(self):
        return set(self.log_start)

    async def committed(self, partition):
        if self.fail is not None:
            raise self.fail
        if self.hang:
            await asyncio.Event().wait()
        return self.committed_offsets.get(partition)

    async def beginning_offsets(self, partitions):
        return {tp: self.log_start[tp] for tp in partitions}

    async def commit(self, offsets):
        if self.refuse:
            raise CommitFailedError("rebalancing")
        self.commits.update(offsets)


def total(source):
    return REGISTRY.get_sample_value("crawler_urls_lost_total", {"source": source}) or 0.0


async def run_assigned(lost, partitions, first_read=None):
    lost.assigned(partitions, (first_read or {}).get)
    assert lost.held == frozenset(partitions)
    for _ in range(1000):
        if not lost.held:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the check never finished")


async def test_losses_are_logged_counted_per_source_and_acknowledged(fake_redis):
    offsets = Offsets({A0: 2, A1: 10, B0: 0}, {A0: 5, A1: 4, B0: 7})
    before_a, before_b = total("lost_a"), total("lost_b")
    with capture_logs() as logs:
        await run_assigned(
            LostUrls(offsets, fake_redis), {A0: "lost_a", A1: "lost_a", B0: "lost_b"}
        )
    events = sorted(
        (e["topic"], e["partition"], e["count"], e["committed"], e["log_start"])
        for e in logs
        if e["event"] == "urls_lost"
    )
    assert events == [("urls.lost_a", 0, 3, 2, 5), ("urls.lost_b", 0, 7, 0, 7)]
    assert await fake_redis.get(urls_lost_key("lost_a")) == "3"
    assert await fake_redis.get(urls_lost_key("lost_b")) == "7"
    assert (total("lost_a") - before_a, total("lost_b") - before_b) == (3, 7)
    # The log start is committed for the partitions found short, and only for them.
    assert offsets.commits == {A0: 5, B0: 7}


async def test_records_read_before_the_log_start_moved_are_not_lost(fake_redis):
    # The consumer read from offset 3 on, then the log start moved to 8 while the
    # check waited: 2 was deleted unread, 3..7 were not.
    offsets = Offsets({A0: 2}, {A0: 8})
    with capture_logs() as logs:
        await run_assigned(LostUrls(offsets, fake_redis), {A0: "lost_a"}, {A0: 3})
    (lost,) = [e for e in logs if e["event"] == "urls_lost"]
    assert lost["count"] == 1
    assert offsets.commits == {A0: 3}  # never past a record read and perhaps unfinished


@pytest.mark.parametrize(
    "offsets",
    [
        Offsets({}, {A0: 5}, fail=KafkaConnectionError("away")),
        Offsets({}, {A0: 5}, hang=True),
    ],
    ids=["kafka refuses", "kafka hangs"],
)
async def test_a_kafka_that_does_not_answer_releases_the_commits(fake_redis, offsets):
    with capture_logs() as logs:
        await run_assigned(LostUrls(offsets, fake_redis, timeout_s=0.05), {A0: "lost_a"})
    (failed,) = [e for e in logs if e["event"] == "urls_lost_check_failed"]
    assert failed["at"] == "assignment" and failed["log_level"] == "warning"
    assert not [e for e in logs if e["event"] == "urls_lost"]


async def test_a_redis_away_still_logs_and_counts_the_metric():
    redis = aioredis.Redis(
        port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    offsets = Offsets({A0: 0}, {A0: 4})
    before = total("lost_a")
    try:
        with capture_logs() as logs:
            await run_assigned(LostUrls(offsets, redis), {A0: "lost_a"})
    finally:
        await redis.aclose()
    assert [e["count"] for e in logs if e["event"] == "urls_lost"] == [4]
    (away,) = [e for e in logs if e["event"] == "redis_unavailable"]
    assert away["op"] == "count_urls_lost" and away["lost"] == {"lost_a": 4}
    assert total("lost_a") - before == 4
    assert offsets.commits == {A0: 4}


async def test_a_refused_acknowledgement_is_logged(fake_redis):
    offsets = Offsets({A0: 0}, {A0: 4}, refuse=True)
    with capture_logs() as logs:
        await run_assigned(LostUrls(offsets, fake_redis), {A0: "lost_a"})
    assert [e["count"] for e in logs if e["event"] == "urls_lost"] == [4]
    assert [e["event"] for e in logs if e["event"] == "urls_lost_commit_failed"]


async def test_a_jump_while_reading_counts_only_offsets_below_the_log_start(fake_redis):
    offsets = Offsets({}, {A0: 6})
    lost = LostUrls(offsets, fake_redis)
    with capture_logs() as logs:
        lost.skipped("lost_a", A0, position=2, first=9)  # 6..8 skipped but still there
        lost.skipped("lost_a", A0, position=7, first=9)  # above the log start: not lost
        for _ in range(1000):
            if await fake_redis.get(urls_lost_key("lost_a")) == "4":
                break
            await asyncio.sleep(0.005)
        await lost.close()
    assert [(e["count"], e["position"]) for e in logs if e["event"] == "urls_lost"] == [(4, 2)]
    assert offsets.commits == {}  # records before the jump may still be in flight
