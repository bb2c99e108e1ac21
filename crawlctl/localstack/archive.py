"""The crawl's outputs in files that outlive the broker: ``DATA/outputs/{topic}.jsonl``.

While the stack runs, a thread of ``up`` follows ``image_metadata_updates``, ``link_rot``,
``crawl_errors``, ``link_checks`` and ``image_duplicates`` (the deduplication stage's
placements) from their start, in no consumer group, and appends each message to its
topic's file as one line (the message's JSON as it is). It follows them as they are
written rather than reading them once at stop: the files can be read (``tail -f``) during
the crawl, and what is in them survives a SIGKILL of ``up`` or a dead broker, which a read
at stop would lose. At a clean stop, once the workers, the monitor and the deduplication
stage have stopped, it reads each topic to its end and closes the files.

The broker keeps its topics across runs (``stack``), so the archive keeps its place in
them: ``positions.json`` beside the files, each partition's next offset, written (after
the lines it covers are on disk) at most every ``SAVE_EVERY_S`` and at a stop. A crash
between the two archives the last second's messages again at the next start: a message
is archived at least once, and the crawl's own at-least-once duplicates stay, as in the
topics. With a new broker (its storage was empty at the start), the positions are
dropped: its topics start from offset 0 again.
A full disk leaves no line half-written: each partition's records of a poll are
appended in one write, whole or not at all (the file is cut back when the disk takes only
part of it), and the records the disk refused are read again from the broker and written
once it has room (``up`` pauses the crawl meanwhile, ``disk``); positions.json is written
to a temporary file and renamed, so it stays as it was when there is no room for it.
``image-crawler recheck`` reads the archives of ``image_metadata_updates`` (the earlier
crawl's validators) and ``link_checks`` (when each image was last checked).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from crawlctl.localstack import topics as topic_io
from crawlctl.localstack.files import append_whole, cut_to_last_line
from image_crawler.contract import (
    CRAWL_ERRORS_TOPIC,
    DUPLICATES_TOPIC,
    LINK_CHECKS_TOPIC,
    LINK_ROT_TOPIC,
    METADATA_TOPIC,
)
from image_crawler.retry import Backoff

OUTPUT_TOPICS: Final = (
    METADATA_TOPIC,
    LINK_ROT_TOPIC,
    CRAWL_ERRORS_TOPIC,
    LINK_CHECKS_TOPIC,
    DUPLICATES_TOPIC,
)
# How often the topics' partitions are looked up again: a topic appears when a worker
# first writes to it.
REFRESH_S: Final = 1.0
POLL_MS: Final = 200
STOP_TIMEOUT_S: Final = 60.0
# Without a broker to read from, the thread only has to notice that it should end.
ABANDON_TIMEOUT_S: Final = 5.0
POSITIONS_NAME: Final = "positions.json"
# Fetch waits without a record, while a partition is short of its end, before the reader
# is taken as stuck and given a longer wait.
STUCK_WAITS: Final = 3
SAVE_EVERY_S: Final = 1.0


def archive_path(folder: Path, topic: str) -> Path:
    return folder / f"{topic}.jsonl"


def archive_line(value: bytes | None) -> str:
    """The file's line for one message: its text when that is one line of UTF-8 (the
    crawler's JSON always is), else ``{"raw": text}`` so that a line stays a message."""
    if value is not None:
        with contextlib.suppress(UnicodeDecodeError):
            text = value.decode("utf-8")
            if "\n" not in text and "\r" not in text:
                return text + "\n"
    raw = None if value is None else value.decode("utf-8", "replace")
    return json.dumps({"raw": raw}, ensure_ascii=False) + "\n"


def _open_for_append(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    # A line cut short (by a crash of an earlier version, or a power cut) is cut off: its
    # message is past the saved positions, so it is archived again, whole.
    cut_to_last_line(fd)
    return fd


@dataclasses.dataclass(frozen=True, slots=True)
class Archived:
    """What one run appended, per topic, and why it stopped short if it did."""

    folder: Path
    counts: Mapping[str, int]
    error: str | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class OutputArchive:
    """The archiving thread: ``start()``, then ``stop()`` once the producers have stopped."""

    def __init__(
        self,
        bootstrap: str,
        folder: Path,
        topics: Iterable[str] = OUTPUT_TOPICS,
        *,
        new_broker: bool = False,
    ) -> None:
        self.bootstrap = bootstrap
        self.new_broker = new_broker
        self.folder = folder
        self.topics = tuple(topics)
        self.counts = dict.fromkeys(self.topics, 0)
        self._positions: dict[TopicPartition, int] = {}
        # The positions last written to positions.json, and when (monotonic).
        self._saved: dict[TopicPartition, int] = {}
        self._saved_at = 0.0
        # Each topic's file, open for appending (a file descriptor).
        self._files: dict[str, int] = {}
        self._finish = threading.Event()
        self._to_end = True
        self._error: str | None = None
        self._thread: threading.Thread | None = None
        # The reader's fetch wait now (topics.FETCH_MAX_WAIT_MS, doubled each time stuck).
        self.fetch_wait_ms = topic_io.FETCH_MAX_WAIT_MS

    def start(self) -> None:
        """Open the files and start following the topics in a thread of this process."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / POSITIONS_NAME
        self._positions = {} if self.new_broker else read_positions(path)
        if self.new_broker:
            path.unlink(missing_ok=True)
        self._saved = dict(self._positions)
        self._files = {t: _open_for_append(archive_path(self.folder, t)) for t in self.topics}
        self._thread = threading.Thread(target=self._main, name="output-archive", daemon=True)
        self._thread.start()

    def stop(self, *, read_to_end: bool = True, timeout_s: float = STOP_TIMEOUT_S) -> Archived:
        """Read the topics to their end (unless ``read_to_end`` is false: the broker is
        gone), close the files and return what was archived. Idempotent."""
        thread = self._thread
        if thread is not None:
            self._to_end = read_to_end
            self._finish.set()
            thread.join(timeout_s if read_to_end else ABANDON_TIMEOUT_S)
            if thread.is_alive():
                # Left to die with the process; its files stay open for it meanwhile.
                self._error = self._error or f"still reading after {timeout_s:g} s; gave up"
                return Archived(self.folder, dict(self.counts), self._error)
            self._thread = None
        self._close()
        return Archived(self.folder, dict(self.counts), self._error)

    def _close(self) -> None:
        with contextlib.suppress(OSError):
            self._save_positions()
        files, self._files = self._files, {}
        for fd in files.values():
            os.close(fd)

    def _save_positions(self) -> None:
        """The lines to disk, then the positions past them (atomically). Raises
        ``OSError`` (a full disk) with positions.json as it was."""
        self._saved_at = time.monotonic()
        if self._positions == self._saved:
            return
        for fd in self._files.values():
            os.fsync(fd)
        write_positions(self.folder / POSITIONS_NAME, self._positions)
        self._saved = dict(self._positions)

    # --- the thread -----------------------------------------------------------------------

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except Exception as e:  # noqa: BLE001 - the thread's top level: stop() reports it
            self._error = repr(e)

    async def _run(self) -> None:
        wait_ms = topic_io.FETCH_MAX_WAIT_MS
        consumer = topic_io.reader(self.bootstrap, wait_ms)
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        try:
            await consumer.start()
            await admin.start()
            backoff = Backoff(base_s=0.1, cap_s=2.0)
            while not self._finish.is_set():
                try:
                    if await self._follow(consumer, admin, wait_ms / 1000):
                        # Stuck behind: the broker gives up its fetches sooner than it
                        # can answer them (topics.FETCH_MAX_WAIT_MS). A reader allowed
                        # longer goes on from the positions archived.
                        wait_ms = min(2 * wait_ms, topic_io.FETCH_MAX_WAIT_CAP_MS)
                        self.fetch_wait_ms = wait_ms
                        await consumer.stop()
                        consumer = topic_io.reader(self.bootstrap, wait_ms)
                        await consumer.start()
                except KafkaError as e:
                    # The broker is away for a moment (or for good: stop() says so).
                    self._error = repr(e)
                    await asyncio.to_thread(self._finish.wait, backoff.next_s())
            if self._to_end:
                await self._read_to_end(consumer, admin)
                self._error = None
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()
            with contextlib.suppress(Exception):
                await admin.close()

    async def _follow(
        self, consumer: AIOKafkaConsumer, admin: AIOKafkaAdminClient, wait_s: float
    ) -> bool:
        """Follow the topics until asked to finish (False), looking up their partitions
        again every ``REFRESH_S``; True when nothing came for ``STUCK_WAITS`` fetch waits
        while a partition is short of its end."""
        loop = asyncio.get_running_loop()
        assigned: list[TopicPartition] = []
        refresh_at = 0.0
        backoff = Backoff(base_s=0.1, cap_s=2.0)
        last_read = loop.time()
        while not self._finish.is_set():
            if loop.time() >= refresh_at:
                found = await topic_io.partitions(admin, self.topics)
                if found != assigned:
                    start = await topic_io.unread_from(consumer, found, self._positions)
                    consumer.assign(found)
                    for tp, offset in start.items():
                        consumer.seek(tp, offset)
                    assigned = found
                refresh_at = loop.time() + REFRESH_S
            if not assigned:
                # No output topic yet; a consumer with nothing assigned would wait forever.
                await asyncio.sleep(POLL_MS / 1000)
                continue
            batch = await consumer.getmany(timeout_ms=POLL_MS)
            if any(batch.values()):
                last_read = loop.time()
            elif loop.time() - last_read > STUCK_WAITS * wait_s:
                if await topic_io.behind(consumer, assigned):
                    return True
                last_read = loop.time()
            refused = self._write_batch(consumer, batch)
            if refused is not None:
                # The disk is full: nothing half-written, the records read again later.
                self._error = repr(refused)
                await asyncio.to_thread(self._finish.wait, backoff.next_s())
                continue
            backoff.reset()
            self._flush()
        return False

    async def _read_to_end(self, consumer: AIOKafkaConsumer, admin: AIOKafkaAdminClient) -> None:
        found = await topic_io.partitions(admin, self.topics)
        start = await topic_io.unread_from(consumer, found, self._positions)
        async for record in topic_io.read_to_end(consumer, start):
            self._write([record])
        self._flush()

    def _write_batch(
        self, consumer: AIOKafkaConsumer, batch: Mapping[TopicPartition, Sequence[Any]]
    ) -> OSError | None:
        """Append each partition's records; at the first the disk refuses, that partition
        and the ones after it are read again from their first record, and the error is
        returned (None: all written)."""
        partitions = [(tp, records) for tp, records in batch.items() if records]
        for i, (_, records) in enumerate(partitions):
            try:
                self._write(records)
            except OSError as e:
                for tp, unwritten in partitions[i:]:
                    consumer.seek(tp, unwritten[0].offset)
                return e
        return None

    def _write(self, records: Sequence[Any]) -> None:
        """Append the lines of ``records`` (of one partition, in order) in one write, whole
        or not at all (``files.append_whole``: raises ``OSError`` with none written). The
        write puts them in the OS's hands at once: a SIGKILL of ``up`` right after loses
        nothing."""
        last = records[-1]
        data = "".join(archive_line(record.value) for record in records).encode()
        append_whole(self._files[last.topic], data)
        self.counts[last.topic] += len(records)
        self._positions[TopicPartition(last.topic, last.partition)] = last.offset + 1

    def _flush(self) -> None:
        if time.monotonic() - self._saved_at >= SAVE_EVERY_S:
            try:
                self._save_positions()
            except OSError as e:
                # A full disk: positions.json stays as it was, saved again next time.
                self._error = repr(e)


def read_positions(path: Path) -> dict[TopicPartition, int]:
    """positions.json's offsets; none when it is missing or unreadable (all is archived
    again, at least once)."""
    try:
        document = json.loads(path.read_text())
        return {
            TopicPartition(topic, int(partition)): int(offset)
            for topic, offsets in document.items()
            for partition, offset in offsets.items()
        }
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def write_positions(path: Path, positions: Mapping[TopicPartition, int]) -> None:
    document: dict[str, dict[str, int]] = {}
    for tp, offset in sorted(positions.items()):
        document.setdefault(tp.topic, {})[str(tp.partition)] = offset
    temporary = path.with_suffix(".tmp")
    try:
        with temporary.open("w", encoding="utf-8") as f:
            json.dump(document, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise
