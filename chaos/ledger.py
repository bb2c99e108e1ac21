"""The campaign's own record, kept apart from the crawler's counters: every uuid it
produced (once the broker acknowledged it) and every message on the output topics,
read by a consumer of its own in no group. Both are appended to ``ledger.jsonl`` as they
happen, so a failed run can be read afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import IO, Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from chaos import plan
from deploy.compose_check.outcomes import HoleCheck
from image_crawler import contract as c

OUTPUT_TOPICS = (c.METADATA_TOPIC, c.LINK_ROT_TOPIC, c.CRAWL_ERRORS_TOPIC)
# Read too: how many copies of each URL the feeder's retries queued (chaos.checks).
READ_TOPICS = (c.INBOUND_TOPIC, *OUTPUT_TOPICS)


class Ledger:
    def __init__(self, path: Path) -> None:
        self._file: IO[str] = open(path, "a", buffering=1)  # noqa: SIM115 - closed in close
        self.produced: dict[str, plan.Url] = {}
        self.produce_failures = 0
        # uuid -> copies of its message in inbound_images
        self.copies: Counter[str] = Counter()
        # uuid -> [(topic, unix time read, message's create time in ms)]
        self.ends: dict[str, list[tuple[str, float, int]]] = defaultdict(list)
        self.resolved: set[str] = set()
        self.positions: dict[TopicPartition, int] = {}
        self.consumer_restarts = 0
        # Offsets a fetch skipped (read again): the broker's fault, not the crawler's.
        self.reader_holes = 0

    def note_produced(self, url: plan.Url) -> None:
        self.produced[url.uuid] = url
        self._write({"produced": url.uuid, "url": url.url, "kind": url.kind, "t": time.time()})

    def note_output(
        self, topic: str, partition: int, offset: int, value: bytes, ts_ms: int
    ) -> None:
        try:
            message = json.loads(value)
        except ValueError:
            message = {}
        if topic == c.INBOUND_TOPIC:
            if isinstance(message, dict) and isinstance(queued := message.get("uuid"), str):
                self.copies[queued] += 1
            return
        uuid = message.get("identifier") if isinstance(message, dict) else None
        self._write({"topic": topic, "p": partition, "o": offset, "uuid": uuid, "t": time.time()})
        if uuid is None or (topic == c.METADATA_TOPIC and "exif" in message):
            return  # an EXIF message follows its image's resolution; it ends nothing
        self.ends[uuid].append((topic, time.time(), ts_ms))
        if topic == c.METADATA_TOPIC:
            self.resolved.add(uuid)

    def unended(self) -> set[str]:
        return set(self.produced) - set(self.ends)

    def _write(self, entry: dict[str, Any]) -> None:
        self._file.write(json.dumps(entry) + "\n")

    def close(self) -> None:
        self._file.close()


async def feed(ledger: Ledger, bootstrap: str, urls: asyncio.Queue[plan.Url]) -> None:
    """Produce each URL of ``urls`` to ``inbound_images`` until it is acknowledged: a URL
    whose send failed (the broker stopped, restarted) is sent again."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", request_timeout_ms=15000)
    await producer.start()
    retry: list[plan.Url] = []
    try:
        while True:
            batch = retry or [await urls.get()]
            while not retry and not urls.empty():
                batch.append(urls.get_nowait())
            retry = await _send(producer, ledger, batch)
            if retry:
                ledger.produce_failures += len(retry)
                await asyncio.sleep(1.0)
    finally:
        with contextlib.suppress(Exception):
            await producer.stop()


async def _send(
    producer: AIOKafkaProducer, ledger: Ledger, batch: list[plan.Url]
) -> list[plan.Url]:
    """The URLs of ``batch`` not acknowledged."""
    futures = []
    for url in batch:
        try:
            futures.append(await producer.send(c.INBOUND_TOPIC, url.message()))
        except KafkaError:
            futures.append(None)
    failed = []
    for url, future in zip(batch, futures, strict=True):
        if future is None:
            failed.append(url)
            continue
        try:
            await future
        except KafkaError:
            failed.append(url)
        else:
            ledger.note_produced(url)
    return failed


async def read_outputs(ledger: Ledger, bootstrap: str) -> None:
    """Every record of the output topics, from the start, for as long as the campaign
    runs; a consumer that fails is replaced and goes on from where it was."""
    while True:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            request_timeout_ms=15000,
            # tansu on SeaweedFS lists a partition's every batch for each fetch and answers
            # nothing when the listing outlasts this (crawlctl.localstack.topics): the
            # 60-minute campaign's reader, at 500 ms, fell 17,400 records behind. A large
            # fetch makes each listing count.
            fetch_max_wait_ms=5000,
            max_partition_fetch_bytes=8 * 1024 * 1024,
        )
        try:
            await consumer.start()
            await _assign(consumer, ledger)
            reader = HoleCheck(consumer)
            while True:
                batches = await consumer.getmany(timeout_ms=500)
                for tp, records in batches.items():
                    for r in reader.contiguous(tp, records):
                        ledger.note_output(r.topic, r.partition, r.offset, r.value, r.timestamp)
                        ledger.positions[tp] = r.offset + 1
                ledger.reader_holes += reader.holes
                reader.holes = 0
        except KafkaError:
            ledger.consumer_restarts += 1
            await asyncio.sleep(1.0)
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()


async def _assign(consumer: AIOKafkaConsumer, ledger: Ledger) -> None:
    partitions = []
    for topic in READ_TOPICS:
        found = consumer.partitions_for_topic(topic)
        while not found:
            await consumer.topics()  # refreshes the metadata
            found = consumer.partitions_for_topic(topic)
            if not found:
                await asyncio.sleep(0.5)
        partitions += [TopicPartition(topic, p) for p in sorted(found)]
    consumer.assign(partitions)
    for tp in partitions:
        if tp in ledger.positions:
            consumer.seek(tp, ledger.positions[tp])
        else:
            await consumer.seek_to_beginning(tp)
