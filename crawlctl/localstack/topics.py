"""Reading the local broker's partitions to their end, for ``archive``.

tansu 0.6 answers a partition's end offset with the base offset of its last record batch
plus one, whatever that batch holds, so "read up to the end offset" stops short of the
last batch's records. A partition is read to its end here when a fetch brings nothing
more for ``idle_s`` *and* every position has reached the reported end (the true end is
never below it). That is sound only while nothing is produced to the partitions read,
which is how the stack uses it: after the crawler's processes have stopped.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

# How long the broker may take over a fetch. On an S3 store, tansu lists every batch of a
# partition (one object each) for each fetch, and gives up the listing when this time is
# spent, answering nothing: a reader allowed 100 ms read none of 20 new records in 60 s
# once the partition held 5,000 batches, one allowed 500 ms read them 1.1 s late, 5 s
# 2.7 s late (bench/tansu_fetch.py). The archive is read, not watched: seconds late is
# fine, never is not. ``read_to_end`` does not wait on it: its idle poll is its own.
FETCH_MAX_WAIT_MS: Final = 5000
# The longest a reader found stuck behind is allowed (archive): 20,000 batches take
# about 0.5 s to list, so this is about 2,000,000.
FETCH_MAX_WAIT_CAP_MS: Final = 60_000
IDLE_S: Final = 0.5
# Reading gives up when no record arrives for this long while a partition is still short
# of its reported end.
STALLED_S: Final = 30.0


def reader(bootstrap: str, fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS) -> AIOKafkaConsumer:
    """A consumer in no group that commits nothing: partitions are assigned by hand."""
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=fetch_max_wait_ms,
        request_timeout_ms=fetch_max_wait_ms + 40_000,
    )


async def behind(consumer: AIOKafkaConsumer, tps: list[TopicPartition]) -> bool:
    """Whether any of ``tps`` has records past the consumer's position (by the end offset
    the broker reports, which tansu may report one batch short: never too far)."""
    ends = await consumer.end_offsets(tps)
    for tp in tps:
        if await consumer.position(tp) < ends[tp]:
            return True
    return False


async def partitions(admin: AIOKafkaAdminClient, topics: Iterable[str]) -> list[TopicPartition]:
    """Every partition of those of ``topics`` that exist now.

    Asked of the admin client: a consumer's ``partitions_for_topic`` only knows the topics
    of its last metadata refresh, which misses one created since.
    """
    wanted = set(topics)
    found: list[TopicPartition] = []
    for topic in await admin.describe_topics():
        if topic["topic"] in wanted and not topic["error_code"]:
            found.extend(
                TopicPartition(topic["topic"], p["partition"]) for p in topic["partitions"]
            )
    return sorted(found)


async def unread_from(
    consumer: AIOKafkaConsumer,
    tps: Iterable[TopicPartition],
    committed: Mapping[TopicPartition, int],
) -> dict[TopicPartition, int]:
    """Where a group that committed ``committed`` would go on reading each of ``tps``: its
    committed offset, or the log start where it has none or that offset is gone."""
    tps = list(tps)
    starts = await consumer.beginning_offsets(tps) if tps else {}
    return {tp: max(committed.get(tp, starts[tp]), starts[tp]) for tp in tps}


async def read_to_end(
    consumer: AIOKafkaConsumer,
    start: Mapping[TopicPartition, int],
    *,
    idle_s: float = IDLE_S,
    stalled_s: float = STALLED_S,
) -> AsyncIterator[Any]:
    """Every record of the partitions of ``start`` from its offset there to the end.

    Assigns ``consumer`` those partitions (dropping any others). Raises ``TimeoutError``
    when the records stop coming for ``stalled_s`` before the reported end is reached.
    """
    tps = list(start)
    consumer.assign(tps)
    if not tps:
        return
    for tp, offset in start.items():
        consumer.seek(tp, offset)
    ends = await consumer.end_offsets(tps)
    last_record = time.monotonic()
    while True:
        batch = await consumer.getmany(timeout_ms=int(idle_s * 1000))
        if batch:
            last_record = time.monotonic()
            for records in batch.values():
                for record in records:
                    yield record
            continue
        short = [tp for tp in tps if await consumer.position(tp) < ends[tp]]
        if not short:
            return
        if time.monotonic() - last_record > stalled_s:
            raise TimeoutError(
                f"no records for {stalled_s:g} s while {len(short)} partition(s) were short "
                f"of their end, e.g. {short[0].topic}:{short[0].partition}"
            )
