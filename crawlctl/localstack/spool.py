"""The queued URLs of a local crawl, kept in a file across a stop and a restart.

The stack's broker keeps its topics in memory (see ``services.KafkaBroker``), so at a
clean stop, once the workers and the monitor have stopped and committed, ``save`` reads
what no one has consumed yet: ``inbound_images`` past the splitter group's committed
offsets and every ``urls.{source}`` past the workers' group's, and writes it to the spool
(JSON lines, one record each, with its message bytes, key and headers), atomically. At the
next start, before the monitor runs, ``restore`` produces the spool into
``inbound_images`` and deletes the file only once the broker has acknowledged it all.

A ``urls.{source}`` message goes back with its source added again (the splitter dropped
it), to be split anew; any other message goes back byte for byte. Delivery is at least
once: a spool that was not restored (a start that failed half-way) is carried into the
next save, so a URL may come back twice, never not at all. A SIGKILL of ``up`` (or a
crash of the broker) saves nothing: the queue is lost with the broker's memory.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Final, Self

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from crawlctl.localstack import topics as topic_io
from image_crawler.contract import (
    INBOUND_TOPIC,
    SPLITTER_GROUP,
    WORKER_GROUP,
    MalformedMessage,
    SourceTask,
    source_of_topic,
)

SPOOL_NAME: Final = "spool.jsonl"
# Acknowledgements awaited together while restoring: bounded memory for a large spool.
RESTORE_WINDOW: Final = 10_000


class SpoolError(ValueError):
    """A spool line that cannot be read back (a damaged or hand-edited file)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SpoolRecord:
    """One unconsumed message: where it was, and its bytes."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()

    def to_line(self) -> str:
        """One JSON line; bytes that are UTF-8 stay readable text, others go in base64."""
        obj: dict[str, Any] = {
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
        }
        _put_bytes(obj, "key", self.key)
        _put_bytes(obj, "value", self.value)
        if self.headers:
            obj["headers"] = [[k, base64.b64encode(v).decode()] for k, v in self.headers]
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"

    @classmethod
    def from_line(cls, line: str) -> Self:
        try:
            obj = json.loads(line)
            return cls(
                topic=str(obj["topic"]),
                partition=int(obj["partition"]),
                offset=int(obj["offset"]),
                key=_get_bytes(obj, "key"),
                value=_get_bytes(obj, "value"),
                headers=tuple((str(k), base64.b64decode(v)) for k, v in obj.get("headers", ())),
            )
        except (ValueError, KeyError, TypeError, binascii.Error) as e:
            raise SpoolError(f"not a spool record: {line[:200]!r} ({e})") from None

    def inbound_value(self) -> bytes | None:
        """The ``inbound_images`` message that puts this one back in the crawl."""
        source = source_of_topic(self.topic)
        if source is None or self.value is None:
            return self.value
        try:
            task = SourceTask.from_json(self.value)
        except MalformedMessage:
            # The splitter dead-letters it, as a worker would have.
            return self.value
        return task.with_source(source).to_json()


def _put_bytes(obj: dict[str, Any], name: str, data: bytes | None) -> None:
    if data is None:
        obj[name] = None
        return
    try:
        obj[name] = data.decode("utf-8")
    except UnicodeDecodeError:
        obj[f"{name}_b64"] = base64.b64encode(data).decode()


def _get_bytes(obj: dict[str, Any], name: str) -> bytes | None:
    if f"{name}_b64" in obj:
        return base64.b64decode(obj[f"{name}_b64"], validate=True)
    text = obj.get(name)
    return None if text is None else str(text).encode("utf-8")


def read_spool(path: Path) -> Iterator[SpoolRecord]:
    """The records of the spool at ``path``, in order (none if there is no file)."""
    try:
        f = path.open(encoding="utf-8")
    except FileNotFoundError:
        return
    with f:
        for line in f:
            if line.strip():
                yield SpoolRecord.from_line(line)


def _sync_dir(path: Path) -> None:
    # The rename or unlink itself must reach the disk, not only the file's data.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: Path) -> Iterator[IO[str]]:
    """A text file that replaces ``path`` whole once the block ends without error (written
    beside it, fsynced, renamed), or not at all."""
    temp = path.with_name(f".{path.name}.tmp")
    try:
        with temp.open("w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        temp.replace(path)
    finally:
        temp.unlink(missing_ok=True)
    _sync_dir(path.parent)


@dataclasses.dataclass(frozen=True, slots=True)
class Saved:
    """What ``save`` wrote: messages read from the broker, and from an earlier spool."""

    path: Path
    from_broker: int
    carried: int

    @property
    def total(self) -> int:
        return self.from_broker + self.carried


def save(bootstrap: str, path: Path) -> Saved:
    """Write every unconsumed message to the spool at ``path``, with the records of a spool
    already there (never restored); with none at all, remove the file. Raises
    ``KafkaError``, ``TimeoutError`` or ``OSError``; then an earlier spool stays as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    carried = 0
    with atomic_writer(path) as f:
        for old in read_spool(path):
            f.write(old.to_line())
            carried += 1
        from_broker = asyncio.run(_drain(bootstrap, f))
    if not carried + from_broker:
        # Nothing queued: no file, rather than one that a restart restores nothing from.
        path.unlink()
        _sync_dir(path.parent)
    return Saved(path, from_broker, carried)


async def _drain(bootstrap: str, f: IO[str]) -> int:
    """Write the unconsumed messages to ``f``; returns their count."""
    consumer = topic_io.reader(bootstrap)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await consumer.start()
    count = 0
    try:
        await admin.start()
        try:
            start = await _unconsumed(consumer, admin)
        finally:
            await admin.close()
        async for record in topic_io.read_to_end(consumer, start):
            f.write(_record(record).to_line())
            count += 1
    finally:
        await consumer.stop()
    return count


async def _unconsumed(
    consumer: AIOKafkaConsumer, admin: AIOKafkaAdminClient
) -> dict[TopicPartition, int]:
    """Where unconsumed messages start: inbound past the splitter, queues past the workers."""
    existing = await admin.list_topics()
    queues = sorted(t for t in existing if source_of_topic(t) is not None)
    start: dict[TopicPartition, int] = {}
    for group, names in ((SPLITTER_GROUP, [INBOUND_TOPIC]), (WORKER_GROUP, queues)):
        tps = await topic_io.partitions(admin, names)
        committed = await topic_io.committed_offsets(admin, group, tps)
        start.update(await topic_io.unread_from(consumer, tps, committed))
    return start


def _record(record: Any) -> SpoolRecord:
    headers: Sequence[tuple[str, bytes]] = record.headers or ()
    return SpoolRecord(
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=record.key,
        value=record.value,
        headers=tuple((str(k), bytes(v)) for k, v in headers),
    )


def restore(bootstrap: str, path: Path) -> int:
    """Produce the spool at ``path`` into ``inbound_images``; once every message is
    acknowledged, delete the file. Returns the count (0 without a spool). Raises
    ``KafkaError``, ``SpoolError`` or ``OSError``; then the spool stays for the next try."""
    if not path.exists():
        return 0
    count = asyncio.run(_produce(bootstrap, read_spool(path)))
    path.unlink()
    _sync_dir(path.parent)
    return count


async def _produce(bootstrap: str, records: Iterable[SpoolRecord]) -> int:
    """Send each record's inbound message; returns once all are acknowledged."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    count = 0
    try:
        pending: list[asyncio.Future[Any]] = []
        for record in records:
            pending.append(
                await producer.send(
                    INBOUND_TOPIC,
                    record.inbound_value(),
                    key=record.key,
                    headers=list(record.headers) or None,
                )
            )
            count += 1
            if len(pending) >= RESTORE_WINDOW:
                await _acknowledged(pending)
        await _acknowledged(pending)
    finally:
        await producer.stop()
    return count


async def _acknowledged(pending: list[asyncio.Future[Any]]) -> None:
    """Wait for every send in ``pending`` (emptied); the first failure is raised."""
    futures, pending[:] = list(pending), []
    for outcome in await asyncio.gather(*futures, return_exceptions=True):
        if isinstance(outcome, BaseException):
            raise outcome
