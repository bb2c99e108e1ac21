"""The queued URLs an earlier version of ``up`` kept in a file across a stop: restored once.

Before the broker of ``up`` kept its topics on disk (``objects.ObjectStore``), it kept them
in memory, and a clean stop wrote what no one had consumed yet to ``DATA/spool.jsonl``
(JSON lines, one record each, with its message bytes, key and headers). A data folder
may still hold one: at the next start, before the monitor runs, ``restore`` produces it
into ``inbound_images`` and deletes the file only once the broker has acknowledged it
all. A ``urls.{source}`` message goes back with its source added again (the splitter
dropped it), to be split anew; any other message goes back byte for byte. A restore cut
short is done again whole at the next start: a URL may come back twice, never not at
all.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Final, Self

from aiokafka import AIOKafkaProducer

from image_crawler.contract import (
    INBOUND_TOPIC,
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
