"""URLs the broker deleted before any worker read them: found, logged and counted.

A topic's retention (or an operator deleting records) can move a partition's log start
past the offset the group ``image_handlers`` was to read next. Those URLs are gone, and
the consumer, which then starts from the earliest offset it can, would skip them without
a word. Each loss is logged as ``urls_lost`` (source, topic, partition, count,
log_start, and the offset the group was at), added to Redis' ``urls_lost:{source}`` and
to ``crawler_urls_lost_total{source}``.

It is looked for at two moments. When partitions are assigned: the group's committed
offset against the log start. The worker's commits of those partitions wait for the
answer, since a commit made first would hide the loss; a loss found is acknowledged by
committing where the records begin again, so that the next owner of the partition does
not count it a second time. And while reading: records that start past the offset the
worker was to read next mean its position was reset (the records there were deleted
meanwhile), and the log start says how many of the skipped offsets held records.

Both run beside the consumer, never in its way. A Kafka or Redis that does not answer is
logged (``urls_lost_check_failed``, ``redis_unavailable``) and passed over: the crawl
goes on, and the ``urls_lost`` line is written before anything that can fail.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, Final, Protocol

import redis.asyncio as aioredis
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from redis.exceptions import RedisError

from image_crawler.contract import urls_lost_key
from image_crawler.lifecycle import cancel_and_wait
from image_crawler.logs import get_logger
from worker.metrics import URLS_LOST
from worker.offsets import lost_before

log = get_logger(__name__)

# How long one check may wait for Kafka before it gives up (and releases the commits it
# holds back). The committed offsets of many partitions are asked for at most
# COMMITTED_CONCURRENCY at a time: aiokafka's consumer asks for one partition a request.
CHECK_TIMEOUT_S: Final = 30.0
COMMITTED_CONCURRENCY: Final = 32

# Answers the offset of the first record of a partition read since its assignment.
FirstRead = Callable[[TopicPartition], int | None]


class Offsets(Protocol):
    """The slice of AIOKafkaConsumer the checks use."""

    def assignment(self) -> set[TopicPartition]: ...

    async def committed(self, partition: TopicPartition) -> int | None: ...

    async def beginning_offsets(
        self, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, int]: ...

    async def commit(self, offsets: dict[TopicPartition, int]) -> None: ...


class LostUrls:
    """Runs the checks of the module docstring in background tasks."""

    def __init__(
        self, consumer: Offsets, redis: aioredis.Redis, *, timeout_s: float = CHECK_TIMEOUT_S
    ) -> None:
        self._consumer = consumer
        self._redis = redis
        self._timeout_s = timeout_s
        self._held: set[TopicPartition] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def held(self) -> frozenset[TopicPartition]:
        """Partitions whose commits wait for their assignment check."""
        return frozenset(self._held)

    def assigned(self, partitions: Mapping[TopicPartition, str], first_read: FirstRead) -> None:
        """Check newly assigned partitions (each mapped to its source); their commits are
        held back until the check is done."""
        if partitions:
            self._held.update(partitions)
            self._spawn(self._check_assigned(dict(partitions), first_read), "urls_lost_assigned")

    def skipped(self, source: str, tp: TopicPartition, position: int, first: int) -> None:
        """Records of ``tp`` arrived from offset ``first`` while the worker was to read
        ``position`` next."""
        self._spawn(self._check_skipped(source, tp, position, first), "urls_lost_skipped")

    async def close(self) -> None:
        """Cancel the checks still running (their holds are released)."""
        await cancel_and_wait(self._tasks)

    def _spawn(self, check: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(check, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _check_assigned(
        self, partitions: dict[TopicPartition, str], first_read: FirstRead
    ) -> None:
        tps = sorted(partitions)
        try:
            async with asyncio.timeout(self._timeout_s):
                committed = await self._committed(tps)
                starts = await self._consumer.beginning_offsets(tps)
                # Records read before the log start moved past them (while this check
                # waited) were not lost: the records begin again at the earlier of the two.
                begin = {tp: _earlier(starts.get(tp, 0), first_read(tp)) for tp in tps}
                lost = {tp: n for tp in tps if (n := lost_before(committed.get(tp), begin[tp])) > 0}
                for tp, n in lost.items():
                    log.warning(
                        "urls_lost",
                        source=partitions[tp],
                        topic=tp.topic,
                        partition=tp.partition,
                        count=n,
                        committed=committed[tp],
                        log_start=starts[tp],
                    )
                await self._count({tp: (partitions[tp], n) for tp, n in lost.items()})
                await self._acknowledge({tp: begin[tp] for tp in lost})
        except (KafkaError, TimeoutError) as e:
            log.warning(
                "urls_lost_check_failed", at="assignment", partitions=len(tps), error=repr(e)
            )
        except Exception:
            # A bug here must not stop the crawl.
            log.exception("urls_lost_check_error", at="assignment")
        finally:
            self._held.difference_update(tps)

    async def _committed(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        limit = asyncio.Semaphore(COMMITTED_CONCURRENCY)

        async def one(tp: TopicPartition) -> tuple[TopicPartition, int | None]:
            async with limit:
                return tp, await self._consumer.committed(tp)

        return dict(await asyncio.gather(*(one(tp) for tp in tps)))

    async def _acknowledge(self, begin: dict[TopicPartition, int]) -> None:
        """Commit where the records of partitions found short begin again, while they
        are still ours: every record before that is gone, and none of them was read."""
        offsets = {tp: o for tp, o in begin.items() if tp in self._consumer.assignment()}
        if offsets:
            try:
                await self._consumer.commit(offsets)
            except KafkaError as e:
                # Then the next owner of the partition counts the same loss again.
                log.warning("urls_lost_commit_failed", partitions=len(offsets), error=repr(e))

    async def _check_skipped(
        self, source: str, tp: TopicPartition, position: int, first: int
    ) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                start = (await self._consumer.beginning_offsets([tp]))[tp]
                # Only the skipped offsets below the log start held deleted records; the
                # others were skipped for another reason (compaction, transaction
                # markers), not lost.
                n = lost_before(position, min(start, first))
                if n > 0:
                    log.warning(
                        "urls_lost",
                        source=source,
                        topic=tp.topic,
                        partition=tp.partition,
                        count=n,
                        position=position,
                        log_start=start,
                    )
                    await self._count({tp: (source, n)})
        except (KafkaError, TimeoutError, KeyError) as e:
            log.warning("urls_lost_check_failed", at="reading", topic=tp.topic, error=repr(e))
        except Exception:
            log.exception("urls_lost_check_error", at="reading")

    async def _count(self, lost: Mapping[TopicPartition, tuple[str, int]]) -> None:
        by_source: dict[str, int] = {}
        for source, n in lost.values():
            by_source[source] = by_source.get(source, 0) + n
        if not by_source:
            return
        for source, n in by_source.items():
            URLS_LOST.labels(source).inc(n)
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for source, n in by_source.items():
                    pipe.incrby(urls_lost_key(source), n)
                await pipe.execute()
        except RedisError as e:
            log.warning("redis_unavailable", op="count_urls_lost", lost=by_source, error=repr(e))


def _earlier(log_start: int, first_read: int | None) -> int:
    return log_start if first_read is None else min(log_start, first_read)
