"""Each source's backlog: the URLs split into ``urls.{source}`` that no worker has taken.

Per partition of ``urls.{source}``, the backlog is its end offset minus the offset the
workers' group (``image_handlers``) committed there, or minus the partition's log start
when the group committed nothing there or its offset is below the log start (those URLs
are gone: the workers count them as ``urls_lost``); never below 0. A source's backlog is
the sum over its partitions, and its ETA that backlog at its effective rate
(``image_crawler.contract.eta_s``).

Every ``LOG_FREQUENCY_S`` the monitor measures every ``urls.*`` topic of the cluster,
known source or not, in the same few requests whatever the number of sources
(``KafkaOffsets``): one Metadata request (every topic, its partitions and their leaders),
one FindCoordinator and one OffsetFetch for the group, and per partition leader two
ListOffsets (latest, earliest) and one Fetch at the latest offsets. It keeps the latest
reading in memory (for ``/metrics`` and ``monitoring_update``) and writes it to Redis in
one transaction: the hash ``backlog`` (source -> URLs waiting, rewritten whole) and
``backlog_measured_at`` (Unix time, s), for ``image-crawler status``. Kafka or Redis
away: ``kafka_unavailable`` or ``redis_unavailable`` is logged and the next period tries
again; the latest reading stays (its time says how old it is).

The end offset is the larger of ListOffsets' latest offset and the high watermark of a
Fetch at that offset. On Kafka they agree and the Fetch returns no record. tansu's
in-memory storage (``image-crawler up``, the tests) answers ListOffsets with the base
offset of a partition's last record batch plus one, short of that batch's end, and the
Fetch returns that last batch with the right high watermark.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Final, Protocol

import redis.asyncio as aioredis
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError, for_code
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.protocol.offset import OffsetRequest, OffsetResetStrategy
from redis.exceptions import RedisError
from redis.typing import EncodableT, FieldT

from image_crawler.contract import BACKLOG_AT, BACKLOG_HASH, WORKER_GROUP, source_of_topic
from image_crawler.logs import get_logger
from image_crawler.retry import sleep_unless_stopped

log = get_logger(__name__)

# A measurement that takes longer than this counts as Kafka being away.
MEASURE_TIMEOUT_S: Final = 30.0
# How long a Fetch at the end offsets may wait for a record: not at all on Kafka (it asks
# for 0 bytes); tansu answers a Fetch that may not wait with no partition at all.
_FETCH_MAX_WAIT_MS: Final = 1
# ListOffsets' and Fetch's isolation level: every record written, committed to a transaction or not
# (the splitter does not use transactions).
_READ_UNCOMMITTED: Final = 0


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """One partition's offsets: its log start and end, and the group's committed offset
    (None: the group committed nothing there)."""

    start: int
    end: int
    committed: int | None


def partition_backlog(offsets: PartitionOffsets) -> int:
    """The records of one partition that the group has not taken (see the module)."""
    taken = offsets.start if offsets.committed is None else max(offsets.start, offsets.committed)
    return max(0, offsets.end - taken)


def backlog_by_source(offsets: Mapping[TopicPartition, PartitionOffsets]) -> dict[str, int]:
    """Each source's backlog, summed over the partitions of its ``urls.{source}`` topic
    (partitions of other topics are left out)."""
    backlog: dict[str, int] = {}
    for tp, partition in offsets.items():
        source = source_of_topic(tp.topic)
        if source is not None:
            backlog[source] = backlog.get(source, 0) + partition_backlog(partition)
    return backlog


@dataclasses.dataclass(frozen=True, slots=True)
class Backlog:
    """One measurement: each ``urls.{source}`` topic's backlog, and when it was taken."""

    sources: Mapping[str, int]
    # Unix time (s) of the measurement.
    measured_at_s: float

    @property
    def total(self) -> int:
        return sum(self.sources.values())


@dataclasses.dataclass(frozen=True, slots=True)
class _Layout:
    """The ``urls.*`` topics' partitions and their leaders (broker ids)."""

    leaders: dict[TopicPartition, int]
    # Topics whose metadata came with an error (no leader, say).
    unmeasured: set[str]


class OffsetsReader(Protocol):
    """The seam to Kafka: the offsets of every partition of the ``urls.*`` topics."""

    async def read(self) -> Mapping[TopicPartition, PartitionOffsets]: ...


class KafkaOffsets:
    """``OffsetsReader`` on the monitor's admin client (started elsewhere).

    aiokafka's admin client has no ListOffsets nor Fetch, so those requests go through the
    admin's own client to each partition's leader (as aiokafka's ``delete_records`` does). The
    group's offsets are asked for by partition: tansu does not answer the all-partitions
    form of OffsetFetch. A topic or partition the cluster answers with an error (no
    leader, say) is left out of the reading and logged (``backlog_unmeasured``).
    """

    def __init__(self, admin: AIOKafkaAdminClient, group: str = WORKER_GROUP) -> None:
        self._admin = admin
        self._group = group

    async def read(self) -> Mapping[TopicPartition, PartitionOffsets]:
        """Raises ``KafkaError`` when Kafka is away."""
        layout = await self._layout()
        leaders, unmeasured = layout.leaders, layout.unmeasured
        if not leaders:
            return {}
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp, leader in leaders.items():
            by_leader.setdefault(leader, []).append(tp)
        ends, starts, committed = await asyncio.gather(
            self._list_offsets(by_leader, OffsetResetStrategy.LATEST),
            self._list_offsets(by_leader, OffsetResetStrategy.EARLIEST),
            self._admin.list_consumer_group_offsets(self._group, partitions=list(leaders)),
        )
        marks = await self._high_watermarks(by_leader, ends)
        offsets: dict[TopicPartition, PartitionOffsets] = {}
        for tp in leaders:
            end, start = ends.get(tp), starts.get(tp)
            if end is None or start is None:
                unmeasured.add(tp.topic)
                continue
            group = committed.get(tp)
            at = group.offset if group is not None and group.offset >= 0 else None
            end = max(end, marks.get(tp, end))
            offsets[tp] = PartitionOffsets(start=start, end=end, committed=at)
        if unmeasured:
            # A topic is measured whole or not at all: a partial sum would read low.
            offsets = {tp: o for tp, o in offsets.items() if tp.topic not in unmeasured}
            log.warning("backlog_unmeasured", topics=sorted(unmeasured))
        return offsets

    async def _layout(self) -> _Layout:
        """The leader of every partition of the ``urls.*`` topics (one Metadata request)."""
        leaders: dict[TopicPartition, int] = {}
        unmeasured: set[str] = set()
        for topic in await self._admin.describe_topics():
            name = topic["topic"]
            if source_of_topic(name) is None:
                continue
            if topic["error_code"]:
                unmeasured.add(name)
                continue
            for partition in topic["partitions"]:
                if partition["error_code"] or partition["leader"] < 0:
                    unmeasured.add(name)
                leaders[TopicPartition(name, partition["partition"])] = partition["leader"]
        return _Layout(leaders, unmeasured)

    async def _list_offsets(
        self, by_leader: Mapping[int, Iterable[TopicPartition]], timestamp: int
    ) -> dict[TopicPartition, int]:
        """Each partition's latest or earliest offset (``timestamp`` -1 or -2), one
        request per leader; a partition answered with an error is left out."""
        requests = [
            self._admin._client.send(leader, _offset_request(partitions, timestamp))
            for leader, partitions in by_leader.items()
            if leader >= 0
        ]
        offsets: dict[TopicPartition, int] = {}
        for response in await asyncio.gather(*requests):
            for topic, partitions in response.topics:
                for partition, error_code, *rest in partitions:
                    if error_code:
                        error = for_code(error_code)
                        log.debug("list_offsets_error", topic=topic, error=error.__name__)
                        continue
                    offsets[TopicPartition(topic, partition)] = rest[-1]
        return offsets

    async def _high_watermarks(
        self, by_leader: Mapping[int, Iterable[TopicPartition]], ends: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """Each partition's high watermark, from a Fetch at its offset in ``ends`` (asking
        for one byte: at the true end there is no record to return)."""
        requests = []
        for leader, partitions in by_leader.items():
            by_topic: dict[str, list[tuple[int, int, int]]] = {}
            for tp in partitions:
                if tp in ends:
                    by_topic.setdefault(tp.topic, []).append((tp.partition, ends[tp], 1))
            if leader >= 0 and by_topic:
                request = FetchRequest(
                    _FETCH_MAX_WAIT_MS, 0, 1, _READ_UNCOMMITTED, list(by_topic.items())
                )
                requests.append(self._admin._client.send(leader, request))
        marks: dict[TopicPartition, int] = {}
        for response in await asyncio.gather(*requests):
            for topic, partitions in response.topics:
                for partition, error_code, high_watermark, *_ in partitions:
                    if not error_code and high_watermark >= 0:
                        marks[TopicPartition(topic, partition)] = high_watermark
        return marks


def _offset_request(partitions: Iterable[TopicPartition], timestamp: int) -> OffsetRequest:
    by_topic: dict[str, list[tuple[int, int]]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append((tp.partition, timestamp))
    return OffsetRequest(-1, _READ_UNCOMMITTED, list(by_topic.items()))


async def write_backlog(redis: aioredis.Redis, backlog: Backlog) -> None:
    """Rewrite the ``backlog`` hash and ``backlog_measured_at`` in one transaction, so a
    reader never sees a half-written hash nor a source whose topic is gone."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.delete(BACKLOG_HASH)
        if backlog.sources:
            counts: dict[FieldT, EncodableT] = {s: n for s, n in backlog.sources.items()}
            pipe.hset(BACKLOG_HASH, mapping=counts)
        pipe.set(BACKLOG_AT, f"{backlog.measured_at_s:.3f}")
        await pipe.execute()


class BacklogMonitor:
    """Measures the backlog every ``interval_s``; ``latest`` is the last measurement."""

    def __init__(
        self,
        offsets: OffsetsReader,
        redis: aioredis.Redis,
        interval_s: float,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._offsets = offsets
        self._redis = redis
        self._interval_s = interval_s
        self._clock = clock
        self.latest: Backlog | None = None
        # time.monotonic() of the last measurement that Kafka answered (None: none yet).
        self.measured_at_monotonic: float | None = None

    async def measure(self) -> Backlog:
        """Read the offsets and keep the result as ``latest``. Raises ``KafkaError`` (or
        ``TimeoutError`` after ``MEASURE_TIMEOUT_S``) when Kafka is away."""
        async with asyncio.timeout(MEASURE_TIMEOUT_S):
            offsets = await self._offsets.read()
        backlog = Backlog(backlog_by_source(offsets), self._clock())
        self.latest = backlog
        self.measured_at_monotonic = time.monotonic()
        return backlog

    async def run(self, stop: asyncio.Event, kafka_started: asyncio.Event) -> None:
        """Once ``kafka_started`` is set, measure and publish every ``interval_s`` until
        ``stop``."""
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(kafka_started.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        while not stop.is_set():
            started = time.monotonic()
            await self._once()
            if await sleep_unless_stopped(stop, started + self._interval_s - time.monotonic()):
                return

    async def _once(self) -> None:
        try:
            backlog = await self.measure()
        except (KafkaError, TimeoutError) as e:
            log.warning("kafka_unavailable", op="measure_backlog", error=repr(e))
            return
        except Exception:
            log.exception("backlog_error")
            return
        try:
            await write_backlog(self._redis, backlog)
        except RedisError as e:
            log.warning("redis_unavailable", op="write_backlog", error=repr(e))
