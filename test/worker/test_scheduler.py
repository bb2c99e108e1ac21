"""The scheduler's fairness and commit rules, with an in-memory consumer."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import types
from collections import Counter

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import (
    CommitFailedError,
    IllegalGenerationError,
    IllegalStateError,
    KafkaError,
    RebalanceInProgressError,
)
from aiokafka.protocol.commit import OffsetCommitRequest
from prometheus_client import REGISTRY
from redis.exceptions import ConnectionError as RedisConnectionError
from structlog.testing import capture_logs

from image_crawler.contract import (
    INBOUND_SOURCES_SET,
    crawled_key,
    finished_key,
    source_of_topic,
    urls_lost_key,
)
from worker.copies import CrawledLedger
from worker.finished import FinishedLedger, Loaded, fingerprint
from worker.host_queues import HostQueueSettings, slot_taken
from worker.lost_urls import LostUrls
from worker.politeness.hosts import HostKey
from worker.politeness.pacing import HostWaits
from worker.scheduler import Scheduler, SchedulerSettings


@dataclasses.dataclass
class Record:
    offset: int
    value: bytes


class FakeConsumer:
    """The slice of AIOKafkaConsumer the scheduler uses, over in-memory partitions."""

    def __init__(self, messages: dict[TopicPartition, int]) -> None:
        self.log = {
            tp: [f"{tp.topic}:{i}".encode() for i in range(n)] for tp, n in messages.items()
        }
        self.position = dict.fromkeys(messages, 0)
        # Records before a partition's log start are deleted: a read from below it
        # starts there, as tansu answers (Kafka answers OffsetOutOfRange, and aiokafka
        # resets to the same place).
        self.log_start = dict.fromkeys(messages, 0)
        self.assigned: set[TopicPartition] = set()
        self.paused_set: set[TopicPartition] = set()
        self.commits: dict[TopicPartition, int] = {}
        self.rebalance = None

    def subscribe(self, topics, listener):
        # Like aiokafka: the new assignment takes effect in the next poll, which runs the
        # listener before it returns records; positions restart from the committed
        # offsets and nothing is paused.
        self.rebalance = ({tp for tp in self.log if tp.topic in topics}, listener)

    async def _rebalance(self):
        if self.rebalance is None:
            return
        assignment, listener = self.rebalance
        self.rebalance = None
        await listener.on_partitions_revoked(set(self.assigned))
        self.assigned, self.paused_set = assignment, set()
        for partition in assignment:
            self.position[partition] = self.commits.get(partition, 0)
        await listener.on_partitions_assigned(set(assignment))

    def assignment(self):
        return frozenset(self.assigned)

    def paused(self):
        return frozenset(self.paused_set)

    def pause(self, *partitions):
        self.paused_set.update(partitions)

    def resume(self, *partitions):
        self.paused_set.difference_update(partitions)

    def seek(self, tp, offset):
        self.position[tp] = offset

    async def getmany(self, timeout_ms=0, max_records=None):
        await self._rebalance()
        batches, budget = {}, max_records or 1_000_000
        for tp in sorted(self.assigned - self.paused_set):
            start = max(self.position[tp], self.log_start[tp])
            values = self.log[tp][start : start + budget]
            if values:
                batches[tp] = [Record(start + i, v) for i, v in enumerate(values)]
                self.position[tp] = start + len(values)
                budget -= len(values)
            if not budget:
                break
        if not batches:
            await asyncio.sleep(timeout_ms / 1000)
        return batches

    async def commit(self, offsets):
        for tp, offset in offsets.items():
            assert offset >= self.commits.get(tp, 0), "commits never move backwards"
        self.commits.update(offsets)

    async def committed(self, partition):
        return self.commits.get(partition)

    async def beginning_offsets(self, partitions):
        return {tp: self.log_start[tp] for tp in partitions}


class Handler:
    """Records concurrency per source; messages of held sources wait for release."""

    def __init__(self) -> None:
        self.running: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.done: list[bytes] = []
        self.held: set[bytes] = set()
        self.release = asyncio.Event()
        self.failing: set[bytes] = set()
        self.failed: list[bytes] = []

    async def __call__(self, source, value, topic):
        assert source_of_topic(topic) == source
        self.running[source] += 1
        self.peak[source] = max(self.peak[source], self.running[source])
        try:
            if value in self.held or source in self.held:
                await self.release.wait()
            else:
                await asyncio.sleep(0.001)
            if value in self.failing:
                raise RuntimeError("a bug")
            self.done.append(value)
        finally:
            self.running[source] -= 1

    async def on_failure(self, source, value, topic, error):
        self.failed.append(value)


async def wait(condition, timeout_s=5.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


class RefusingConsumer(FakeConsumer):
    """Refuses every commit with ``error`` while ``refusing``, as a broker does during a
    rebalance (aiokafka raises CommitFailedError, or the broker's own error)."""

    def __init__(self, messages: dict[TopicPartition, int], error: KafkaError) -> None:
        super().__init__(messages)
        self.error = error
        self.refusing = True
        self.refused = 0

    async def commit(self, offsets):
        if self.refusing:
            self.refused += 1
            raise self.error
        await super().commit(offsets)


async def start(
    fake_redis,
    messages,
    handler,
    *,
    max_tasks=8,
    grace_s=5.0,
    sources=None,
    consumer=None,
    resume_every_s=0.0,
    finished=None,
    copies=None,
    revoke_wait_s=0.05,
    late_hold_s=60.0,
    commit_interval_s=0.01,
):
    if sources is None:
        sources = {source_of_topic(tp.topic) for tp in messages}
    await fake_redis.sadd(INBOUND_SOURCES_SET, *sources)
    consumer = consumer or FakeConsumer(messages)
    settings = SchedulerSettings(
        max_tasks=max_tasks,
        sources_poll_s=0.01,
        commit_interval_s=commit_interval_s,
        poll_timeout_s=0.005,
        shutdown_grace_s=grace_s,
        resume_every_s=resume_every_s,
        revoke_wait_s=revoke_wait_s,
        late_hold_s=late_hold_s,
    )
    scheduler = Scheduler(
        consumer,
        fake_redis,
        handler,
        handler.on_failure,
        settings,
        finished=finished,
        copies=copies,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(scheduler.run(stop))
    return consumer, scheduler, stop, task


def tp(source, partition=0):
    return TopicPartition(f"urls.{source}", partition)


async def test_each_source_holds_at_most_its_fair_share(fake_redis):
    handler = Handler()
    handler.held = {"a", "b"}
    messages = {tp("a", 0): 10, tp("a", 1): 10, tp("b"): 10}
    consumer, _scheduler, stop, task = await start(fake_redis, messages, handler, max_tasks=8)
    # Two sources of eight slots: min(8 // 2, 8 // 4) = 2 each.
    await wait(lambda: handler.running["a"] == 2 and handler.running["b"] == 2)
    await asyncio.sleep(0.05)  # give it the chance to overshoot
    assert handler.peak == {"a": 2, "b": 2}
    handler.release.set()
    await wait(lambda: len(handler.done) == 30)
    assert Counter(handler.done) == Counter(v for values in consumer.log.values() for v in values)
    assert handler.peak == {"a": 2, "b": 2}
    await wait(lambda: consumer.commits == {tp("a", 0): 10, tp("a", 1): 10, tp("b"): 10})
    stop.set()
    await task


async def test_a_slow_source_does_not_take_the_slots_of_a_fast_one(fake_redis):
    handler = Handler()
    handler.held = {"slow"}
    consumer, _scheduler, stop, task = await start(
        fake_redis, {tp("slow"): 50, tp("fast"): 50}, handler
    )
    await wait(lambda: len(handler.done) == 50)
    assert {v.split(b":")[0] for v in handler.done} == {b"urls.fast"}
    assert handler.running["slow"] == 2
    await wait(lambda: consumer.commits.get(tp("fast")) == 50)
    assert tp("slow") not in consumer.commits
    handler.release.set()
    await wait(lambda: consumer.commits.get(tp("slow")) == 50)
    stop.set()
    await task


async def test_the_commit_never_passes_an_unfinished_message(fake_redis):
    handler = Handler()
    handler.held = {b"urls.a:3"}
    consumer, _scheduler, stop, task = await start(
        fake_redis, {tp("a"): 10}, handler, max_tasks=400
    )
    await wait(lambda: len(handler.done) == 9)
    await wait(lambda: consumer.commits.get(tp("a")) == 3)
    await asyncio.sleep(0.05)
    assert consumer.commits[tp("a")] == 3
    handler.release.set()
    await wait(lambda: consumer.commits.get(tp("a")) == 10)
    stop.set()
    await task


async def test_a_handler_that_raises_is_dead_lettered_and_the_partition_moves_on(fake_redis):
    handler = Handler()
    handler.failing = {b"urls.a:1"}
    consumer, _scheduler, stop, task = await start(fake_redis, {tp("a"): 4}, handler)
    await wait(lambda: consumer.commits.get(tp("a")) == 4)
    assert handler.failed == [b"urls.a:1"]
    assert len(handler.done) == 3
    stop.set()
    await task


async def test_stop_drains_then_hands_back_and_commits_the_finished_prefix(fake_redis):
    handler = Handler()
    handler.held = {b"urls.a:2"}
    consumer, _scheduler, stop, task = await start(
        fake_redis, {tp("a"): 5}, handler, max_tasks=400, grace_s=0.1
    )
    await wait(lambda: len(handler.done) == 4)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert consumer.commits == {tp("a"): 2}
    assert handler.running["a"] == 0  # the held one was cancelled, not left running


async def test_new_sources_are_picked_up_while_running(fake_redis):
    handler = Handler()
    _consumer, scheduler, stop, task = await start(fake_redis, {tp("a"): 3, tp("late"): 3}, handler)
    await fake_redis.srem(INBOUND_SOURCES_SET, "late")
    await wait(lambda: scheduler.sources == {"a"})
    await wait(lambda: len(handler.done) == 3)
    await fake_redis.sadd(INBOUND_SOURCES_SET, "late")
    await wait(lambda: len(handler.done) == 6)
    assert scheduler.sources == {"a", "late"}
    stop.set()
    await task


async def test_sources_only_grow_so_a_redis_that_lost_its_data_strands_no_queue(fake_redis):
    handler = Handler()
    handler.held = {"a", "b"}
    _consumer, scheduler, stop, task = await start(fake_redis, {tp("a"): 2, tp("b"): 2}, handler)
    await wait(lambda: handler.running == {"a": 2, "b": 2})
    # FLUSHALL, then the splitter re-adds only the source whose next message came first.
    await fake_redis.flushall()
    await fake_redis.sadd(INBOUND_SOURCES_SET, "c")
    await wait(lambda: "c" in scheduler.sources)
    assert scheduler.sources == {"a", "b", "c"}
    handler.release.set()
    # Every message of a and b is done (the re-subscription that adding c causes may run
    # a message again: at least once).
    await wait(lambda: len(set(handler.done)) == 4)
    stop.set()
    await task


REBALANCE_ERRORS = [
    CommitFailedError(),
    IllegalGenerationError(),
    RebalanceInProgressError(),
    IllegalStateError("No partitions assigned"),
]


@pytest.mark.parametrize("error", REBALANCE_ERRORS, ids=lambda e: type(e).__name__)
async def test_a_commit_refused_during_a_rebalance_is_logged_and_retried_not_fatal(
    fake_redis, error
):
    handler = Handler()
    handler.held = {b"urls.a:3"}
    consumer = RefusingConsumer({tp("a"): 10}, error)
    with capture_logs() as logs:
        consumer, _scheduler, stop, task = await start(
            fake_redis, {tp("a"): 10}, handler, max_tasks=400, consumer=consumer
        )
        await wait(lambda: len(handler.done) == 9 and consumer.refused >= 3)
        assert not task.done()
        assert consumer.commits == {}
        consumer.refusing = False
        # The next attempt commits, and only up to the unfinished message.
        await wait(lambda: consumer.commits.get(tp("a")) == 3)
        await asyncio.sleep(0.05)
        assert consumer.commits[tp("a")] == 3
        handler.release.set()
        await wait(lambda: consumer.commits.get(tp("a")) == 10)
        stop.set()
        await task
    failed = [e for e in logs if e["event"] == "commit_failed"]
    assert len(failed) >= 3
    assert {e["error"] for e in failed} == {type(error).__name__}
    assert {e["partitions"] for e in failed} == {1}


class AwayLedger(FinishedLedger):
    """Redis refuses every write and read of the finished offsets."""

    async def record(self, finished):
        raise RedisConnectionError("away")

    async def load(self, partitions):
        raise RedisConnectionError("away")

    async def mark_running(self, running, until_ms):
        raise RedisConnectionError("away")

    async def settle(self, tp, offset, until_ms, crc):
        raise RedisConnectionError("away")


@pytest.mark.parametrize("ledger", ["kept", "away", "copies_kept"])
async def test_a_revoke_whose_commit_is_refused_starts_over_from_the_committed_offset(
    fake_redis, ledger
):
    handler = Handler()
    handler.held = {b"urls.a:3"}
    consumer = RefusingConsumer({tp("a"): 10, tp("late"): 2}, RebalanceInProgressError())
    # Redis away for both ledgers, or for the finished offsets only: those re-read are
    # then found to be copies of messages crawled here (worker.copies).
    away = ledger == "away"
    copies_only = ledger == "copies_kept"
    with capture_logs() as logs:
        consumer, scheduler, stop, task = await start(
            fake_redis, {tp("a"): 10}, handler, max_tasks=400, sources={"a"}, consumer=consumer,
            finished=AwayLedger(fake_redis) if away or copies_only else None,
            copies=AwayCopies(fake_redis, 600) if away else None,
        )  # fmt: skip
        await wait(lambda: len(handler.done) == 9)
        # A new source: a rebalance whose revoke commits nothing, so the partition comes
        # back at offset 0 while offset 3 is still running from before. What was finished
        # past the commit was written at the revoke, and is skipped; with Redis away, the
        # worker still knows the digests of what it crawled (kept in memory for
        # CRAWLED_KEEP_S), and skips them too.
        await fake_redis.sadd(INBOUND_SOURCES_SET, "late")
        await wait(lambda: len(handler.done) == 9 + 2)
        assert not task.done()
        assert handler.running["a"] == 1  # offset 3 is not started a second time
        consumer.refusing = False
        await wait(lambda: consumer.commits.get(tp("a")) == 3)
        await asyncio.sleep(0.05)
        assert consumer.commits[tp("a")] == 3
        handler.release.set()
        await wait(lambda: consumer.commits.get(tp("a")) == 10)
        stop.set()
        await task
    assert Counter(handler.done)[b"urls.a:3"] == 1
    # Done once: skipped as finished (the offsets kept) or as copies (their digests kept,
    # in Redis or, with Redis away, in the worker's memory).
    assert Counter(handler.done)[b"urls.a:4"] == 1
    assert scheduler.skipped == (0 if away or copies_only else 9)
    assert scheduler.copies_skipped == (9 if away or copies_only else 0)
    revoked = [e for e in logs if e["event"] == "partitions_revoked"]
    assert [e["topic_partitions"] for e in revoked] == [["urls.a:0"]]
    assert any(e["event"] == "commit_failed" for e in logs)
    if away:
        assert any(e["event"] == "finished_record_failed" for e in logs)
        assert any(e["event"] == "finished_load_failed" for e in logs)
    elif not copies_only:
        # Committed past them all: nothing is left of the partition's finished offsets.
        assert await fake_redis.zcard(finished_key("urls.a", 0)) == 0


async def test_a_revoke_lets_a_request_on_the_wire_end_and_its_image_is_not_fetched_again(
    fake_redis,
):
    handler = Handler()
    handler.held = {b"urls.a:3"}
    consumer = RefusingConsumer({tp("a"): 10, tp("late"): 2}, RebalanceInProgressError())
    with capture_logs() as logs:
        consumer, scheduler, stop, task = await start(
            fake_redis, {tp("a"): 10}, handler, max_tasks=400, sources={"a"}, consumer=consumer,
            revoke_wait_s=30,
        )  # fmt: skip
        await wait(lambda: len(handler.done) == 9)
        # The rebalance's revoke waits for offset 3, which ends meanwhile: finished here,
        # written down with the rest (the commit is refused), skipped after the assignment.
        await fake_redis.sadd(INBOUND_SOURCES_SET, "late")
        asyncio.get_running_loop().call_later(0.2, handler.release.set)
        await wait(lambda: len(handler.done) == 10 + 2)
        consumer.refusing = False
        await wait(lambda: consumer.commits.get(tp("a")) == 10)
        stop.set()
        await task
    assert Counter(handler.done)[b"urls.a:3"] == 1
    assert scheduler.skipped == 10
    [waited] = [e for e in logs if e["event"] == "revoke_waited"]
    assert (waited["tasks"], waited["late"]) == (1, 0)


class HandingOverConsumer(FakeConsumer):
    """Gives its partitions of ``handed_over`` to another member at each rebalance after
    the first."""

    def __init__(self, messages: dict[TopicPartition, int], handed_over: set[str]) -> None:
        super().__init__(messages)
        self.handed_over = handed_over

    def subscribe(self, topics, listener):
        super().subscribe(topics, listener)
        if self.assigned and self.rebalance is not None:
            assignment, _ = self.rebalance
            kept = {p for p in assignment if p.topic not in self.handed_over}
            self.rebalance = (kept, listener)


@pytest.mark.parametrize("end", ["finished", "given_up"])
async def test_a_request_still_running_after_the_revoke_wait_is_marked_until_it_ends(
    fake_redis, end
):
    handler = Handler()
    handler.held = {b"urls.a:3"}
    consumer = HandingOverConsumer({tp("a"): 10, tp("late"): 2}, {"urls.a"})
    ledger = FinishedLedger(fake_redis)
    before_s = time.time()
    with capture_logs() as logs:
        consumer, scheduler, stop, task = await start(
            fake_redis, {tp("a"): 10}, handler, max_tasks=400, sources={"a"}, consumer=consumer,
            late_hold_s=60 if end == "finished" else 0.3,
        )  # fmt: skip
        await wait(lambda: len(handler.done) == 9)
        # A rebalance gives urls.a to another worker while offset 3 is still on the
        # wire: marked running, so that its next owner holds it back.
        await fake_redis.sadd(INBOUND_SOURCES_SET, "late")
        await wait(lambda: consumer.assignment() == {tp("late")})
        loaded = await ledger.load([tp("a")])
        assert loaded.finished == {
            tp("a"): {o: fingerprint(b"urls.a:%d" % o) for o in range(4, 10)}
        }
        [until] = loaded.running[tp("a")].values()
        assert before_s + (60 if end == "finished" else 0.3) <= until <= time.time() + 60
        assert consumer.commits[tp("a")] == 3
        if end == "finished":
            handler.release.set()  # its image comes: finished here, written down as such
            done = {o: fingerprint(b"urls.a:%d" % o) for o in range(3, 10)}
            await wait(lambda: b"urls.a:3" in handler.done)
        else:  # not ended in time: given up here, so that it runs at its next owner
            await wait(lambda: any(e["event"] == "late_given_up" for e in logs))
            done = loaded.finished[tp("a")]
        await wait(lambda: not scheduler._settling)
        assert await ledger.load([tp("a")]) == Loaded({tp("a"): done}, {})
        stop.set()
        await task
    [waited] = [e for e in logs if e["event"] == "revoke_waited"]
    assert (waited["tasks"], waited["late"]) == (1, 1)
    assert handler.done.count(b"urls.a:3") == (end == "finished")


@pytest.mark.parametrize("end", ["finished", "given_up", "time_passed"])
async def test_a_message_running_at_its_previous_owner_is_held_back_until_that_one_ends_it(
    fake_redis, end
):
    # The previous owner of urls.a:0 was still running offset 3 at its revoke.
    ledger = FinishedLedger(fake_redis)
    hold_s = 0.4 if end == "time_passed" else 30
    until_ms = int((time.time() + hold_s) * 1000)
    await ledger.mark_running({tp("a"): [3]}, until_ms)
    handler = Handler()
    consumer, scheduler, stop, task = await start(fake_redis, {tp("a"): 10}, handler)
    await wait(lambda: len(handler.done) == 9 and consumer.commits.get(tp("a")) == 3)
    assert b"urls.a:3" not in handler.done
    if end == "finished":
        await ledger.settle(tp("a"), 3, until_ms, fingerprint(b"urls.a:3"))
    elif end == "given_up":
        await ledger.settle(tp("a"), 3, until_ms, None)
    await wait(lambda: consumer.commits.get(tp("a")) == 10)
    stop.set()
    await task
    assert handler.done.count(b"urls.a:3") == (end != "finished")
    assert scheduler.skipped == (end == "finished")


async def test_a_finished_offset_is_skipped_only_if_its_message_is_the_one_finished(
    fake_redis,
):
    # Offsets 2 and 5 finished by a previous owner; 7 was a message of another life of the
    # topic (deleted, made again): its URL runs.
    await FinishedLedger(fake_redis).record(
        {tp("a"): [(2, fingerprint(b"urls.a:2")), (5, fingerprint(b"urls.a:5")), (7, 0)]}
    )
    handler = Handler()
    consumer, scheduler, stop, task = await start(fake_redis, {tp("a"): 10}, handler)
    await wait(lambda: consumer.commits.get(tp("a")) == 10)
    stop.set()
    await task
    assert sorted(handler.done) == sorted(
        f"urls.a:{o}".encode() for o in range(10) if o not in (2, 5)
    )
    assert scheduler.skipped == 2
    assert await fake_redis.zcard(finished_key("urls.a", 0)) == 0


async def test_what_ends_is_written_down_at_once_not_at_the_next_commit(fake_redis):
    # A worker frozen or killed costs what it finished since its last write: with a commit
    # a minute away, offsets 1-4 (0 runs on) are in Redis well before it.
    handler = Handler()
    handler.held = {b"urls.a:0"}
    consumer, _scheduler, stop, task = await start(
        fake_redis, {tp("a"): 5}, handler, commit_interval_s=60.0
    )
    await wait_async(lambda: fake_redis.zcard(finished_key("urls.a", 0)), 4)
    await wait_async(lambda: fake_redis.zcard(crawled_key("urls.a", 0)), 4)
    assert consumer.commits == {}
    handler.release.set()
    stop.set()
    await task


class FlakyLedger(FinishedLedger):
    """Redis refuses the writes of finished offsets while ``away``."""

    away = False

    async def record(self, finished):
        if self.away:
            raise RedisConnectionError("away")
        await super().record(finished)


async def test_what_a_revoke_failed_to_write_is_written_once_redis_is_back(fake_redis):
    # Offset 3 runs on, so 4-9 are finished past the commit (3). Redis restarted empty and
    # still away at the revoke: the partitions' next owners would do 4-9 again.
    handler = Handler()
    handler.held = {b"urls.a:3"}
    ledger = FlakyLedger(fake_redis)
    consumer, scheduler, stop, task = await start(
        fake_redis, {tp("a"): 10}, handler, finished=ledger
    )
    key = finished_key("urls.a", 0)
    await wait(lambda: len(handler.done) == 9 and consumer.commits.get(tp("a")) == 3)
    ledger.away = True
    await fake_redis.delete(key)
    with capture_logs() as logs:
        await scheduler.on_revoked({tp("a")})
        consumer.assigned = set()
        await scheduler.on_assigned(set())
    assert any(e["event"] == "finished_record_failed" for e in logs)
    ledger.away = False

    async def finished_offsets():  # beside them, 3's marker (still running at the revoke)
        members = await fake_redis.zrange(key, 0, -1)
        return sorted(int(m.split(":")[0]) for m in members if ":r" not in m)

    await wait_async(finished_offsets, [4, 5, 6, 7, 8, 9])
    handler.release.set()
    stop.set()
    await task


async def crawled_copies(fake_redis, copies=None):
    """Four messages crawled, then copies of two of them, byte for byte, at offsets 4
    and 5, once the worker wrote the first four down (as a broker that stored a send
    twice holds them); the handler and the scheduler once all six are committed."""
    handler = Handler()
    consumer, scheduler, stop, task = await start(fake_redis, {tp("a"): 4}, handler, copies=copies)
    key = crawled_key("urls.a", 0)
    await wait(lambda: consumer.commits.get(tp("a")) == 4)
    await wait_async(lambda: fake_redis.zcard(key), 4)
    consumer.log[tp("a")] += [b"urls.a:1", b"urls.a:2"]
    await wait(lambda: consumer.commits.get(tp("a")) == 6)
    stop.set()
    await task
    return handler, scheduler


async def wait_async(read, expected, timeout_s=5.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (got := await read()) != expected:
        assert asyncio.get_running_loop().time() < deadline, f"{got} != {expected} in time"
        await asyncio.sleep(0.005)


async def test_a_copy_of_a_message_crawled_lately_is_counted_finished_without_a_request(
    fake_redis,
):
    before = REGISTRY.get_sample_value("crawler_urls_copies_skipped_total", {"source": "a"}) or 0
    handler, scheduler = await crawled_copies(fake_redis)
    assert sorted(handler.done) == [f"urls.a:{i}".encode() for i in range(4)]
    assert scheduler.copies_skipped == 2
    after = REGISTRY.get_sample_value("crawler_urls_copies_skipped_total", {"source": "a"})
    assert after == before + 2


async def test_a_copy_read_before_its_first_ended_here_is_not_fetched_either(fake_redis):
    # In one poll with its first (0, at 2); and (1, at 4) while its first still runs.
    handler = Handler()
    handler.held = {b"urls.a:1"}
    consumer = FakeConsumer({tp("a"): 4})
    consumer.log[tp("a")][2] = b"urls.a:0"
    _, scheduler, stop, task = await start(fake_redis, {tp("a"): 4}, handler, consumer=consumer)
    await wait(lambda: consumer.commits.get(tp("a")) == 1 and handler.running["a"] == 1)
    consumer.log[tp("a")].append(b"urls.a:1")
    await wait(lambda: scheduler.copies_skipped == 2)
    handler.release.set()
    await wait(lambda: consumer.commits.get(tp("a")) == 5)
    stop.set()
    await task
    assert sorted(handler.done) == [b"urls.a:0", b"urls.a:1", b"urls.a:3"]


class UnaskableCopies(CrawledLedger):
    """Redis takes the digests crawled, and refuses every read of them."""

    async def seen(self, read):
        raise RedisConnectionError("away")


class AwayCopies(UnaskableCopies):
    """Redis refuses every write and read of the digests crawled."""

    async def record(self, crawled):
        raise RedisConnectionError("away")


async def test_a_worker_knows_the_copies_of_what_it_crawled_when_redis_cannot_say(fake_redis):
    # Its own digests are kept in memory for CRAWLED_KEEP_S, beside the Redis check (which
    # fails here, and is left off for a while): the copies are not crawled again.
    with capture_logs() as logs:
        handler, scheduler = await crawled_copies(fake_redis, UnaskableCopies(fake_redis, 600))
    assert sorted(handler.done) == [f"urls.a:{i}".encode() for i in range(4)]
    assert scheduler.copies_skipped == 2
    assert any(e["event"] == "copies_check_failed" for e in logs)


async def test_no_copy_is_looked_for_or_written_with_a_window_of_0(fake_redis):
    handler = Handler()
    with capture_logs() as logs:
        consumer, _, stop, task = await start(
            fake_redis, {tp("a"): 3}, handler, copies=UnaskableCopies(fake_redis, 0)
        )
        await wait(lambda: consumer.commits.get(tp("a")) == 3)
        stop.set()
        await task
    assert not any(e["event"] == "copies_check_failed" for e in logs)
    assert await fake_redis.exists(crawled_key("urls.a", 0)) == 0


class RebalancingCopies(CrawledLedger):
    """While the digests of a poll's records are asked, a rebalance gives their partition
    to another member."""

    scheduler: Scheduler | None = None
    consumer: CountingConsumer | None = None
    polls = 0

    async def seen(self, read):
        if self.scheduler is not None and self.consumer is not None and read:
            scheduler, self.scheduler = self.scheduler, None
            await scheduler.on_revoked(set(read))
            self.consumer.assigned = set()
            await scheduler.on_assigned(set())
            self.polls = self.consumer.polls
        return await super().seen(read)


async def test_records_checked_for_copies_across_a_rebalance_are_not_started(fake_redis):
    copies = RebalancingCopies(fake_redis, 600)
    consumer = copies.consumer = CountingConsumer({tp("a"): 3})
    handler = Handler()
    _, scheduler, stop, task = await start(
        fake_redis, {tp("a"): 3}, handler, consumer=consumer, copies=copies
    )
    copies.scheduler = scheduler
    # Polls go on after the rebalance, and the records in hand then are no one's here.
    await wait(lambda: copies.scheduler is None and consumer.polls > copies.polls + 2)
    assert handler.done == []
    assert scheduler.in_flight == 0
    stop.set()
    await task


class DroppedConsumer(FakeConsumer):
    """A consumer whose member was dropped from the group: aiokafka's coordinator then
    holds generation -1 (reset_generation) until it has joined again."""

    def __init__(self, messages: dict[TopicPartition, int]) -> None:
        super().__init__(messages)
        self._coordinator = types.SimpleNamespace(generation=7)
        self.sent = 0

    def drop(self) -> None:
        self._coordinator.generation = OffsetCommitRequest.DEFAULT_GENERATION_ID

    def rejoin(self) -> None:
        self._coordinator.generation = 8

    async def commit(self, offsets):
        self.sent += 1
        await super().commit(offsets)


async def test_no_commit_is_sent_while_the_worker_is_no_longer_a_member(fake_redis):
    handler = Handler()
    handler.held = {b"urls.a:6"}
    consumer = DroppedConsumer({tp("a"): 10})
    with capture_logs() as logs:
        consumer, _scheduler, stop, task = await start(
            fake_redis, {tp("a"): 10}, handler, max_tasks=400, consumer=consumer
        )
        await wait(lambda: consumer.commits.get(tp("a")) == 6)
        consumer.drop()
        sent = consumer.sent
        handler.release.set()
        await wait(lambda: len(handler.done) == 10)
        await wait(lambda: any(e["event"] == "commit_skipped" for e in logs))
        assert consumer.sent == sent
        assert consumer.commits[tp("a")] == 6
        consumer.rejoin()
        await wait(lambda: consumer.commits.get(tp("a")) == 10)
        stop.set()
        await task
    skipped = [e for e in logs if e["event"] == "commit_skipped"]
    assert {(e["reason"], e["partitions"]) for e in skipped} == {("not_a_member", 1)}
    assert not any(e["event"] == "commit_failed" for e in logs)


async def test_what_was_finished_past_the_commit_is_written_again_at_a_revoke_after_redis_lost_it(
    fake_redis,
):
    handler = Handler()
    handler.held = {b"urls.a:3"}
    consumer = FakeConsumer({tp("a"): 10, tp("late"): 2})
    consumer, scheduler, stop, task = await start(
        fake_redis, {tp("a"): 10}, handler, max_tasks=400, sources={"a"}, consumer=consumer
    )
    await wait(lambda: len(handler.done) == 9)
    deadline = asyncio.get_running_loop().time() + 5
    while await fake_redis.zcard(finished_key("urls.a", 0)) < 6:  # 4-9, at a commit
        assert asyncio.get_running_loop().time() < deadline, "4-9 not written"
        await asyncio.sleep(0.005)
    # Redis restarted empty, then a rebalance: what the set held is written again at the
    # revoke, and the partition's next owner (this worker again) skips it.
    await fake_redis.flushall()
    await fake_redis.sadd(INBOUND_SOURCES_SET, "a", "late")
    await wait(lambda: {b"urls.late:0", b"urls.late:1"} <= set(handler.done))
    handler.release.set()
    await wait(lambda: consumer.commits.get(tp("a")) == 10)
    stop.set()
    await task
    assert Counter(v for v in handler.done if v.startswith(b"urls.a:")) == Counter(
        f"urls.a:{o}".encode() for o in range(10)
    )
    assert scheduler.skipped == 6


class OneByOne:
    """A handler whose messages each wait for their own release, in order of arrival."""

    def __init__(self) -> None:
        self.started: list[asyncio.Event] = []
        self.done = 0

    async def __call__(self, source, value, topic):
        release = asyncio.Event()
        self.started.append(release)
        await release.wait()
        self.done += 1

    async def on_failure(self, source, value, topic, error):
        raise AssertionError(error)


class CountingConsumer(FakeConsumer):
    def __init__(self, messages: dict[TopicPartition, int]) -> None:
        super().__init__(messages)
        self.polls = 0
        self.resumes = 0

    async def getmany(self, timeout_ms=0, max_records=None):
        self.polls += 1
        return await super().getmany(timeout_ms, max_records)

    def resume(self, *partitions):
        self.resumes += len(partitions)
        super().resume(*partitions)


async def test_a_full_source_resumes_once_half_its_share_is_free_not_at_the_first_free_slot(
    fake_redis,
):
    # One source of 16 slots: share min(16, 16 // 4) = 4, resumed at 4 - 2 = 2 unfinished.
    handler = OneByOne()
    consumer = CountingConsumer({tp("a"): 20})
    _, scheduler, stop, task = await start(
        fake_redis, {tp("a"): 20}, handler, max_tasks=16, consumer=consumer
    )
    await wait(lambda: len(handler.started) == 4 and tp("a") in consumer.paused_set)
    handler.started[0].set()
    await wait(lambda: handler.done == 1)
    polls = consumer.polls
    await wait(lambda: consumer.polls >= polls + 5)  # the scheduler looked again, 5 times
    assert (len(handler.started), consumer.resumes) == (4, 0)
    assert tp("a") in consumer.paused_set
    handler.started[1].set()
    await wait(lambda: len(handler.started) == 6)  # resumed: two slots filled at once
    assert consumer.resumes == 1
    assert scheduler.unfinished("a") == 4
    for release in handler.started:
        release.set()
    stop.set()
    await asyncio.wait_for(task, 10)


async def test_a_rebalance_giving_back_the_same_partitions_unpaused_keeps_shares_and_progress(
    fake_redis,
):
    handler = Handler()
    handler.held = {"a"}
    consumer, scheduler, stop, task = await start(fake_redis, {tp("a"): 10}, handler, max_tasks=8)
    # One source of eight slots: share min(8, 8 // 4) = 2.
    await wait(lambda: handler.running["a"] == 2 and tp("a") in consumer.paused_set)
    consumer.subscribe(["urls.a"], scheduler._listener)  # the same partition, unpaused
    await wait(lambda: consumer.rebalance is None and tp("a") in consumer.paused_set)
    assert handler.peak["a"] == 2
    handler.release.set()
    await wait(lambda: consumer.commits.get(tp("a")) == 10)
    assert handler.peak["a"] == 2
    stop.set()
    await task


class FreeSlotCheckingConsumer(FakeConsumer):
    """Records, at every poll, the records asked for and the free slots of the sources
    assigned: their sum (at least 1) is what a poll may take."""

    def __init__(self, messages: dict[TopicPartition, int]) -> None:
        super().__init__(messages)
        self.scheduler = None
        self.asked: list[tuple[int, int]] = []

    async def getmany(self, timeout_ms=0, max_records=None):
        if self.scheduler is not None:
            share = self.scheduler.share()
            sources = {source_of_topic(tp.topic) for tp in self.assigned}
            free = sum(max(0, share - self.scheduler.unfinished(s)) for s in sources)
            self.asked.append((max_records, max(1, free)))
        return await super().getmany(timeout_ms, max_records)


async def test_a_poll_asks_for_exactly_the_free_slots_through_releases_rebalances_and_new_shares(
    fake_redis,
):
    handler = OneByOne()
    messages = {tp(s): 6 for s in "abcde"} | {tp("f"): 0}  # "f" has nothing to do
    consumer = FreeSlotCheckingConsumer(messages)
    _, scheduler, stop, task = await start(
        fake_redis, messages, handler, max_tasks=8, sources={"a", "b", "f"}, consumer=consumer
    )
    consumer.scheduler = scheduler
    await wait(lambda: len(handler.started) == 4)  # three sources of share 2
    for release in handler.started[:3]:
        release.set()
    await wait(lambda: handler.done == 3)
    # Three new sources: a rebalance, and a share of min(8 // 6, 8 // 4) = 1.
    await fake_redis.sadd(INBOUND_SOURCES_SET, "c", "d", "e")
    await wait(lambda: scheduler.share() == 1 and scheduler.unfinished("e") == 1)
    handler.started[3].set()
    await wait(lambda: handler.done == 4)
    # Another worker takes "b", "e" and "f" (a rebalance revokes them): their free slots go.
    consumer.subscribe(["urls.a", "urls.c", "urls.d"], scheduler._listener)
    await wait(lambda: consumer.rebalance is None)
    done = handler.done
    for release in handler.started:  # the revoked sources' messages finish meanwhile
        release.set()
    await wait(lambda: handler.done > done + 3)
    polls = len(consumer.asked)
    await wait(lambda: len(consumer.asked) > polls + 3)
    consumer.subscribe([f"urls.{s}" for s in "abcdef"], scheduler._listener)
    await wait(lambda: consumer.rebalance is None)
    async with asyncio.timeout(20):
        while handler.done < 30 or not task.done():  # messages revoked midway run again
            for release in handler.started:
                release.set()
            if handler.done >= 30:
                stop.set()
            await asyncio.sleep(0.005)
    await task
    assert len(consumer.asked) > 20
    assert [asked for asked in consumer.asked if asked[0] != asked[1]] == []


class ResumeRecordingConsumer(FakeConsumer):
    def __init__(self, messages: dict[TopicPartition, int]) -> None:
        super().__init__(messages)
        self.resumed: list[tuple[float, set[TopicPartition]]] = []

    def resume(self, *partitions):
        self.resumed.append((asyncio.get_running_loop().time(), set(partitions)))
        super().resume(*partitions)


@pytest.mark.timing("asserts resumes 0.5 s apart and work finished within 0.5 s of a resume")
async def test_resumes_due_within_resume_every_s_of_the_last_are_made_together(fake_redis):
    # Three sources of eight slots: share 2 each, resumed at 1 unfinished.
    handler = OneByOne()
    messages = {tp(s): 4 for s in "abc"}
    consumer = ResumeRecordingConsumer(messages)
    _, _scheduler, stop, task = await start(
        fake_redis, messages, handler, consumer=consumer, resume_every_s=0.5
    )
    await wait(lambda: len(handler.started) == 6)  # a0 a1 b0 b1 c0 c1, all three paused
    await wait(lambda: consumer.paused_set == {tp("a"), tp("b"), tp("c")})
    handler.started[0].set()  # a0 finishes: a is resumed at once
    await wait(lambda: len(consumer.resumed) == 1)
    handler.started[2].set()  # b0 and c0 finish right after: due within 0.5 s of a's
    handler.started[4].set()
    await wait(lambda: len(consumer.resumed) == 2)
    (first_at, first), (second_at, second) = consumer.resumed
    assert (first, second) == ({tp("a")}, {tp("b"), tp("c")})
    assert second_at - first_at >= 0.5
    async with asyncio.timeout(20):
        while handler.done < 12:
            for release in handler.started:
                release.set()
            await asyncio.sleep(0.005)
    stop.set()
    await asyncio.wait_for(task, 10)


async def test_a_source_swapped_for_another_in_one_poll_is_still_found(fake_redis):
    # The set is read in full when its size changes, and every few polls regardless.
    handler = Handler()
    messages = {tp("a"): 2, tp("b"): 2, tp("c"): 2}
    _, scheduler, stop, task = await start(fake_redis, messages, handler, sources={"a", "b"})
    await wait(lambda: scheduler.sources == {"a", "b"})
    async with fake_redis.pipeline(transaction=True) as swap:
        swap.srem(INBOUND_SOURCES_SET, "b").sadd(INBOUND_SOURCES_SET, "c")
        await swap.execute()
    await wait(lambda: "c" in scheduler.sources)
    assert scheduler.sources == {"a", "b", "c"}  # b stays: sources are never dropped
    await wait(lambda: len(handler.done) == 6)
    stop.set()
    await asyncio.wait_for(task, 10)


def urls_lost_total(source):
    return REGISTRY.get_sample_value("crawler_urls_lost_total", {"source": source}) or 0.0


async def test_a_committed_offset_below_the_log_start_is_logged_counted_and_acknowledged(
    fake_redis,
):
    handler = Handler()
    consumer = FakeConsumer({tp("sched_lost"): 10})
    consumer.commits[tp("sched_lost")] = 2
    consumer.log_start[tp("sched_lost")] = 6
    before = urls_lost_total("sched_lost")
    with capture_logs() as logs:
        consumer, _scheduler, stop, task = await start(
            fake_redis, {tp("sched_lost"): 10}, handler, consumer=consumer
        )
        await wait(lambda: consumer.commits.get(tp("sched_lost")) == 10)
        stop.set()
        await task
    (lost,) = [e for e in logs if e["event"] == "urls_lost"]
    assert lost["source"] == "sched_lost" and lost["topic"] == "urls.sched_lost"
    assert (lost["partition"], lost["count"]) == (0, 4)
    assert (lost["committed"], lost["log_start"]) == (2, 6)
    assert await fake_redis.get(urls_lost_key("sched_lost")) == "4"
    assert urls_lost_total("sched_lost") - before == 4
    assert sorted(handler.done) == [f"urls.sched_lost:{i}".encode() for i in range(6, 10)]


async def test_records_deleted_while_a_paused_source_waits_are_found_when_it_reads_again(
    fake_redis,
):
    handler = Handler()
    handler.held = {"sched_gap"}
    with capture_logs() as logs:
        consumer, _scheduler, stop, task = await start(
            fake_redis, {tp("sched_gap"): 10}, handler, max_tasks=8
        )
        await wait(lambda: handler.running["sched_gap"] == 2)
        # Taken: 0 and 1; 2 is the next to read when the source has room again.
        consumer.log_start[tp("sched_gap")] = 7
        handler.release.set()
        await wait(lambda: consumer.commits.get(tp("sched_gap")) == 10)
        await wait(lambda: any(e["event"] == "urls_lost" for e in logs))
        stop.set()
        await task
    (lost,) = [e for e in logs if e["event"] == "urls_lost"]
    assert (lost["count"], lost["position"], lost["log_start"]) == (5, 2, 7)
    assert await fake_redis.get(urls_lost_key("sched_gap")) == "5"
    assert len(handler.done) == 5  # 0, 1, then 7, 8, 9


async def test_nothing_is_lost_without_a_commit_or_above_the_log_start(fake_redis):
    handler = Handler()
    consumer = FakeConsumer({tp("sched_ok"): 5, tp("sched_new"): 5})
    consumer.commits[tp("sched_ok")] = 3
    consumer.log_start[tp("sched_ok")] = 3
    consumer.log_start[tp("sched_new")] = 2  # never committed: the group had not begun
    with capture_logs() as logs:
        consumer, _scheduler, stop, task = await start(
            fake_redis, consumer.log, handler, consumer=consumer
        )
        await wait(lambda: consumer.commits == {tp("sched_ok"): 5, tp("sched_new"): 5})
        stop.set()
        await task
    assert [e for e in logs if e["event"] == "urls_lost"] == []


# --- URLs waiting for their host (worker.host_queues) -----------------------------------


class HostHandler:
    """URLs of ``hosts``: each value names its host. A host in ``held`` keeps its URLs
    running until ``release``; one in ``halted`` raises HostWaits (its URL goes back to
    its host's queue). Records the peak of running URLs per host."""

    def __init__(self, host_of):
        self.host_of = host_of
        self.running: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.done: list[bytes] = []
        self.held: set[str] = set()
        self.halted: dict[str, float] = {}
        self.release = asyncio.Event()

    async def __call__(self, source, value, topic):
        host = self.host_of(source, value).host
        if host in self.halted:
            raise HostWaits(self.host_of(source, value), self.halted[host])
        self.running[host] += 1
        self.peak[host] = max(self.peak[host], self.running[host])
        try:
            if host in self.held:
                await self.release.wait()
            else:
                await asyncio.sleep(0.001)
            self.done.append(value)
        finally:
            self.running[host] -= 1

    async def on_failure(self, source, value, topic, error):
        raise AssertionError(f"{value!r} failed: {error!r}")


def hosted(consumer, hosts_of_offsets, intervals, *, share=8, **hosts_settings):
    """A scheduler over ``consumer`` whose URLs' hosts are ``hosts_of_offsets(i)``;
    parking appends the value to its partition's log, as a producer would."""
    by_value = {}

    def host_of(source, value):
        if value not in by_value:
            by_value[value] = HostKey(source, hosts_of_offsets(int(value.split(b":")[-1])))
        return by_value[value]

    parked = []

    async def park(source, value, topic):
        parked.append(value)
        [partition] = [p for p in consumer.log if p.topic == topic]
        consumer.log[partition].append(value)

    handler = HostHandler(host_of)
    settings = SchedulerSettings(
        max_tasks=share * 4,
        sources_poll_s=0.01,
        commit_interval_s=0.01,
        poll_timeout_s=0.005,
        shutdown_grace_s=0.5,
        resume_every_s=0.0,
        hosts=HostQueueSettings(**hosts_settings),
        spin_parks=10,
        spin_pause_s=0.2,
        spin_pause_max_s=0.2,
    )
    return handler, parked, settings, dict(host_of=host_of, interval_of=intervals.get, park=park)


async def run_hosted(fake_redis, consumer, handler, settings, hooks):
    await fake_redis.sadd(INBOUND_SOURCES_SET, *{source_of_topic(p.topic) for p in consumer.log})
    scheduler = Scheduler(consumer, fake_redis, handler, handler.on_failure, settings, **hooks)
    stop = asyncio.Event()
    return scheduler, stop, asyncio.create_task(scheduler.run(stop))


class SlowToClose(LostUrls):
    """Lost-URL checks whose ``close`` waits for ``may_close``: the scheduler stays
    stopped but not yet draining for as long as the test likes."""

    def __init__(self, consumer, redis):
        super().__init__(consumer, redis)
        self.closing = asyncio.Event()
        self.may_close = asyncio.Event()

    async def close(self):
        self.closing.set()
        await self.may_close.wait()
        await super().close()


async def test_nothing_starts_once_stop_is_set_even_before_the_drain(fake_redis):
    # One host at 1 request/s runs 2 URLs (2 s of lead) and queues 8 more (share 8). Once
    # stop is set, the 2 ending must not start queued ones, though the drain has not begun.
    consumer = FakeConsumer({tp("hq_stop"): 20})
    handler, _parked, settings, hooks = hosted(consumer, lambda i: "h.org", {})
    hooks["interval_of"] = lambda key: 1.0
    handler.held = {"h.org"}
    await fake_redis.sadd(INBOUND_SOURCES_SET, "hq_stop")
    lost = SlowToClose(consumer, fake_redis)
    scheduler = Scheduler(
        consumer, fake_redis, handler, handler.on_failure, settings, lost, **hooks
    )
    stop = asyncio.Event()
    task = asyncio.create_task(scheduler.run(stop))
    try:
        await wait(lambda: handler.running["h.org"] == 2 and scheduler.waiting == 8)
        stop.set()
        await asyncio.wait_for(lost.closing.wait(), 5)
        handler.release.set()
        await wait(lambda: scheduler.in_flight == 0)
        assert len(handler.done) == 2
    finally:
        stop.set()
        handler.release.set()
        lost.may_close.set()
        await asyncio.wait_for(task, 5)
    assert consumer.commits == {tp("hq_stop"): 2}  # the queued ones are read again


async def test_a_slow_host_with_nine_tenths_of_a_source_holds_back_none_of_the_others(
    fake_redis,
):
    # 200 URLs; every tenth on a host of its own, the rest on one host at 0.1/s whose
    # requests never end (held): share 8.
    consumer = FakeConsumer({tp("hq_slow"): 200})
    handler, parked, settings, hooks = hosted(
        consumer, lambda i: f"h{i}.org" if i % 10 == 0 else "slow.org", {"slow": 10.0}
    )
    hooks["interval_of"] = lambda key: 10.0 if key.host == "slow.org" else None
    handler.held = {"slow.org"}
    scheduler, stop, task = await run_hosted(fake_redis, consumer, handler, settings, hooks)
    others = {f"urls.hq_slow:{i}".encode() for i in range(0, 200, 10)}
    # A task leaves the slots a moment after its handler is done (its done callback): on a
    # busy machine the last of the others were still in flight when the last was done.
    await wait(lambda: others <= set(handler.done) and scheduler.in_flight <= 1)
    # The slow host ran one URL at a time and kept its source's share (8) waiting,
    # without a slot; the rest were appended again to the topic, not lost.
    assert handler.peak["slow.org"] == 1
    assert scheduler.in_flight <= 1 and scheduler.waiting <= 8
    assert len(parked) >= 180 - 1 - 8
    stop.set()
    await task


async def test_urls_of_a_halted_host_wait_without_a_slot_then_are_parked_to_commit(fake_redis):
    # The first 50 URLs on a halted host, the last on a busy one that holds.
    consumer = FakeConsumer({tp("hq_halt"): 51})
    handler, parked, settings, hooks = hosted(
        consumer,
        lambda i: "busy.org" if i == 50 else "halted.org",
        {},
        park_after_s=0.1,
    )
    handler.halted = {"halted.org": 60.0}
    handler.held = {"busy.org"}
    scheduler, stop, task = await run_hosted(fake_redis, consumer, handler, settings, hooks)
    # Every halted URL gave its slot back and, waiting too long while another host of
    # its source had work, was appended again: the partition commits past all of them,
    # while only the busy host's URL is in flight (it may reach its slot a moment after
    # the commit, on a busy machine).
    await wait(lambda: consumer.commits.get(tp("hq_halt")) == 50 and scheduler.in_flight == 1)
    originals = [f"urls.hq_halt:{i}".encode() for i in range(50)]
    assert set(originals) <= set(parked)
    assert scheduler.in_flight == 1  # the busy host's URL
    stop.set()
    await task


async def test_a_parked_urls_copy_read_before_the_broker_acknowledged_it_is_crawled(
    fake_redis,
):
    # Parking appends the URL again; the broker's acknowledgement comes 0.2 s later, and
    # the copy may be read first: it is the URL's one to crawl, not a copy to skip.
    consumer = FakeConsumer({tp("hq_ack"): 4})
    handler, parked, settings, hooks = hosted(
        consumer, lambda i: "busy.org" if i == 3 else "halted.org", {}, park_after_s=0.1
    )
    handler.halted = {"halted.org": 0.3}
    handler.held = {"busy.org"}
    append = hooks["park"]

    async def acknowledged_late(source, value, topic):
        await append(source, value, topic)
        await asyncio.sleep(0.2)

    hooks["park"] = acknowledged_late
    _, stop, task = await run_hosted(fake_redis, consumer, handler, settings, hooks)
    await wait(lambda: len(parked) >= 3)
    handler.halted = {}
    originals = {f"urls.hq_ack:{i}".encode() for i in range(3)}
    await wait(lambda: originals <= set(handler.done), timeout_s=10)
    handler.release.set()
    stop.set()
    await task


async def test_a_host_whose_wait_is_over_runs_its_urls_again_oldest_first(fake_redis):
    consumer = FakeConsumer({tp("hq_wait"): 5})
    handler, parked, settings, hooks = hosted(consumer, lambda i: "h.org", {})
    handler.halted = {"h.org": 0.3}
    scheduler, stop, task = await run_hosted(fake_redis, consumer, handler, settings, hooks)
    await wait(lambda: scheduler.waiting == 5)
    assert scheduler.in_flight == 0
    del handler.halted["h.org"]
    await wait(lambda: consumer.commits.get(tp("hq_wait")) == 5)
    assert handler.done == [f"urls.hq_wait:{i}".encode() for i in range(5)]
    assert parked == []  # its source's only host: kept, not parked
    stop.set()
    await task


async def test_a_partition_that_parks_all_it_reads_is_paused(fake_redis):
    # One host at 0.1/s, its only URL running held, beside another busy host: everything
    # else read is parked, and reading pauses after spin_parks (10) in a row rather than
    # append them all again.
    consumer = FakeConsumer({tp("hq_spin"): 400})
    handler, parked, settings, hooks = hosted(
        consumer, lambda i: "other.org" if i == 0 else "slow.org", {}
    )
    hooks["interval_of"] = lambda key: 10.0
    handler.held = {"slow.org", "other.org"}
    with capture_logs() as logs:
        _scheduler, stop, task = await run_hosted(fake_redis, consumer, handler, settings, hooks)
        await wait(lambda: any(e["event"] == "parking_paused" for e in logs))
        stop.set()
        await task
    # At most a read's worth (the share's free slots) past the pause's threshold.
    assert len(parked) < 10 + 32


class SlotGate(HostHandler):
    """Each URL waits for ``slot`` before its request has its slot (``slot_taken``), as
    a request of a halted source waits in the pacer, then ends at once."""

    def __init__(self, host_of):
        super().__init__(host_of)
        self.slot = asyncio.Event()

    async def __call__(self, source, value, topic):
        self.running[self.host_of(source, value).host] += 1
        await self.slot.wait()
        slot_taken()
        await asyncio.sleep(0.001)
        self.done.append(value)


async def test_urls_read_again_while_their_first_run_waits_for_a_slot_all_run(fake_redis):
    # Found by the fault campaign (chaos): a rebalance gave a worker back the partition of
    # a source whose URLs were waiting in the pacer (an operator's halt). The URL still
    # running was read again and queued behind itself; when its first run got its slot,
    # the queue handed the copy over, which was dropped as a duplicate together with the
    # next URL it let start: that one never ran, its host stayed full for good, and the
    # partition's commit stopped there until the worker restarted.
    consumer = FakeConsumer({tp("hq_again"): 6})
    handler, parked, settings, hooks = hosted(consumer, lambda i: "h.org", {})
    handler = SlotGate(handler.host_of)
    hooks["interval_of"] = lambda key: 10.0  # one URL of the host waits for its slot
    scheduler, stop, task = await run_hosted(fake_redis, consumer, handler, settings, hooks)
    await wait(lambda: scheduler.in_flight == 1 and scheduler.waiting == 5)
    consumer.subscribe(["urls.hq_again"], scheduler._listener)  # the same partition back
    # Since issue 53 the revoke hands back a URL still waiting for its slot (left to run,
    # it would be fetched by the partition's next owner too): its copy read again runs.
    await wait(
        lambda: (
            consumer.rebalance is None
            and (scheduler.in_flight, scheduler.waiting) == (1, 5)
            and len(scheduler._tasks) == 1
        )
    )
    handler.slot.set()
    await wait(lambda: consumer.commits.get(tp("hq_again")) == 6)
    assert {f"urls.hq_again:{i}".encode() for i in range(6)} <= set(handler.done)
    assert parked == []
    stop.set()
    await task


class SkippingConsumer(FakeConsumer):
    """Answers its first fetch of a partition without the record at ``skip`` (as tansu on
    S3 was seen to: a later batch than asked for), then as it should."""

    def __init__(self, messages: dict[TopicPartition, int], skip: int) -> None:
        super().__init__(messages)
        self.skip = skip
        self.skipped = 0

    async def getmany(self, timeout_ms=0, max_records=None):
        batches = await super().getmany(timeout_ms, max_records)
        for tp, records in batches.items():
            if not self.skipped and any(r.offset == self.skip for r in records):
                self.skipped += 1
                batches[tp] = [r for r in records if r.offset != self.skip]
        return batches


async def test_a_record_a_fetch_skipped_is_read_again_not_committed_past(fake_redis):
    handler = Handler()
    consumer = SkippingConsumer({tp("skip"): 10}, skip=4)
    with capture_logs() as logs:
        consumer, _scheduler, stop, task = await start(
            fake_redis, {tp("skip"): 10}, handler, consumer=consumer
        )
        await wait(lambda: consumer.commits.get(tp("skip")) == 10)
        stop.set()
        await task
    assert consumer.skipped == 1
    assert b"urls.skip:4" in handler.done
    assert [e["offset"] for e in logs if e["event"] == "fetch_skipped"] == [4]
