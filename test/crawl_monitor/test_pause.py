"""The whole crawl paused (``crawl_paused``): the monitor reads it, paces every source at
0 with the pause as its reason, leaves ``inbound_images`` unread, exports it, and goes
on once it is gone."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from structlog.testing import capture_logs

from crawl_monitor.metrics import MonitorView
from crawl_monitor.pause import PauseWatch
from crawl_monitor.policy.decision import Decision, Memory, decide, plan_read
from crawl_monitor.splitter import Splitter
from crawl_monitor.store import ObservedState, SourceState
from image_crawler import contract as c
from test.crawl_monitor.test_decision import NOW, SETTINGS, after_a_loop, loop, observed
from test.crawl_monitor.test_metrics import samples_of
from test.crawl_monitor.test_splitter import (
    INBOUND,
    FakeConsumer,
    FakeProducer,
    FakeTopics,
    two_partitions,
)
from test.harness.services import wait_for

DISK_FULL = c.CrawlPause(
    c.PAUSE_DISK_FULL,
    "the disk of /data is full: 3.0 MiB free",
    since_s=1_700_000_000.0,
    path="/data",
    free_bytes=3 << 20,
    reserve_bytes=8 << 20,
    needed_bytes=7 << 20,
    biggest=(("/data/broker", 20 << 20),),
)


async def test_the_watch_reads_the_pause_and_logs_its_changes(redis: Redis) -> None:
    watch = PauseWatch(redis)
    with capture_logs() as logs:
        assert await watch.poll() is None and watch.read and not watch.paused
        await redis.set(c.CRAWL_PAUSED_KEY, DISK_FULL.to_json())
        assert await watch.poll() == DISK_FULL
        assert await watch.poll() == DISK_FULL  # logged once
        await redis.delete(c.CRAWL_PAUSED_KEY)
        assert await watch.poll() is None
    events = [e for e in logs if e["event"].startswith("crawl_pause")]
    assert [(e["event"], e["log_level"]) for e in events] == [
        ("crawl_paused", "warning"),
        ("crawl_pause_lifted", "info"),
    ]
    assert events[0]["needed_bytes"] == 7 << 20 and events[0]["path"] == "/data"


async def test_an_operators_text_pauses_the_crawl_too(redis: Redis) -> None:
    await redis.set(c.CRAWL_PAUSED_KEY, "maintenance until 3pm")
    pause = await PauseWatch(redis).poll()
    assert pause == c.CrawlPause(c.PAUSE_OPERATOR, "maintenance until 3pm")


def paused_loop(
    seen: ObservedState, memory: Memory, computed: dict[str, float], why: str
) -> Decision:
    plan = plan_read(computed, memory, 5)
    return decide(seen, computed, memory, plan, now_s=NOW, adaptive=SETTINGS, paused_why=why)


def test_a_paused_crawl_paces_every_source_at_0_and_says_why() -> None:
    seen = observed({"src": SourceState()}, halted=frozenset({"stopped"}))
    computed = {"src": 50.0, "other": 10.0, "stopped": 5.0}
    running = loop(seen, after_a_loop(), computed)
    assert running.writes.pace_rates["src"] == 50.0
    paused = paused_loop(seen, after_a_loop(), computed, "crawl paused: disk full")
    assert paused.writes.pace_rates == {"src": 0.0, "other": 0.0, "stopped": 0.0}
    assert paused.snapshot.pacing["src"].state == c.PACE_HALTED
    assert paused.snapshot.pacing["src"].why == "crawl paused: disk full"
    # An operator's halt keeps its own reason; no breaker trips, no halt is recorded.
    assert paused.snapshot.pacing["stopped"].why.startswith("halted")
    assert paused.snapshot.halted == frozenset({"stopped"}) and not paused.writes.halt
    # The source's rate is held, and comes back as it was.
    again = loop(seen, paused.memory, computed)
    assert again.writes.pace_rates["src"] == 50.0


class PausableConsumer(FakeConsumer):
    """FakeConsumer with aiokafka's pause and resume: paused partitions give nothing."""

    def __init__(self, partitions) -> None:
        super().__init__(partitions)
        self.paused: set = set()
        self.calls: list[str] = []

    def pause(self, *partitions) -> None:
        self.calls.append("pause")
        self.paused |= set(partitions)

    def resume(self, *partitions) -> None:
        self.calls.append("resume")
        self.paused -= set(partitions)

    async def getmany(self, timeout_ms=0, max_records=None):
        if self.paused:
            await asyncio.sleep(timeout_ms / 1000)
            return {}
        return await super().getmany(timeout_ms, max_records)


async def test_the_splitter_reads_nothing_while_the_crawl_is_paused(redis: Redis) -> None:
    journal: list[str] = []
    consumer, producer = PausableConsumer(two_partitions()), FakeProducer(journal)
    paused = [True]
    splitter = Splitter(
        consumer,  # type: ignore[arg-type]
        producer,  # type: ignore[arg-type]
        redis,
        FakeTopics(journal),  # type: ignore[arg-type]
        batch_size=100,
        poll_timeout_s=0.01,
        paused=lambda: paused[0],
    )
    stop = asyncio.Event()
    task = asyncio.create_task(splitter.run(stop))
    try:
        await wait_for(lambda: consumer.calls.count("pause") >= 5, 5, what="polls while paused")
        assert producer.sent == [] and consumer.paused == set(INBOUND)
        paused[0] = False
        await wait_for(lambda: consumer.committed == {INBOUND[0]: 3, INBOUND[1]: 2}, 5)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
    assert consumer.calls.count("resume") == 1 and len(producer.sent) == 5


def test_the_pause_is_exported_once_read() -> None:
    unread = MonitorView(["src"], None, None, None, leading=True)
    assert not [s for s in samples_of(unread) if "pause" in s.name]
    running = MonitorView(["src"], None, None, None, leading=True, pause_read=True)
    assert {s.name: s.value for s in samples_of(running) if "pause" in s.name} == {
        "crawler_crawl_paused": 0.0
    }
    paused = MonitorView(["src"], None, None, None, leading=True, pause=DISK_FULL, pause_read=True)
    samples = {s.name: s for s in samples_of(paused) if "pause" in s.name}
    assert samples["crawler_crawl_paused"].value == 1.0
    assert samples["crawler_crawl_pause_info"].labels == {
        "reason": "disk_full",
        "path": "/data",
        "message": DISK_FULL.message,
    }
    assert samples["crawler_crawl_pause_free_bytes"].value == 3 << 20
    assert samples["crawler_crawl_pause_needed_bytes"].value == 7 << 20
