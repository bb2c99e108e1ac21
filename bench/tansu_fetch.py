"""How long the stand-in broker takes to answer a fetch, by offset.

    python -m bench.tansu_fetch [--records 20000]

tansu on SeaweedFS (``up``'s durable broker, and compose-check's Kafka stand-in) is given
one topic of ``--records`` records, each a batch of its own as a worker publishes them
(acknowledged one by one), then a group-less consumer is placed at offsets from the first
to the last and the time to its first record is printed. The 60-minute fault campaign
saw the crawl's reads slow down as its topics grew (docs/guarantees.md).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from crawlctl.localstack.objects import ObjectStore
from test.harness.services import KafkaBroker, create_topics

TOPIC = "fetch-by-offset"
GIVE_UP_S = 300.0


async def first_record_after_seek(
    bootstrap: str, offset: int, max_wait_ms: int
) -> tuple[int | None, float]:
    """The offset of the first record read after a seek to ``offset``, and how long it
    took (None after ``GIVE_UP_S``)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        fetch_max_wait_ms=max_wait_ms,
        request_timeout_ms=max_wait_ms + 40_000,
    )
    await consumer.start()
    partition = TopicPartition(TOPIC, 0)
    consumer.assign([partition])
    consumer.seek(partition, offset)
    started = time.monotonic()
    try:
        while time.monotonic() - started < GIVE_UP_S:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                if records:
                    return records[0].offset, time.monotonic() - started
        return None, time.monotonic() - started
    finally:
        await consumer.stop()


async def follow(bootstrap: str, end: int, max_wait_ms: int, count: int = 20) -> str:
    """A reader at the end of the topic, as ``up``'s archive follows the outputs, while
    ``count`` records are published a quarter of a second apart, each a batch of its
    own: how long each took to reach the reader."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        fetch_max_wait_ms=max_wait_ms,
        request_timeout_ms=max_wait_ms + 40_000,
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    await consumer.start()
    await producer.start()
    partition = TopicPartition(TOPIC, 0)
    consumer.assign([partition])
    consumer.seek(partition, end)
    sent_at: dict[int, float] = {}
    took: list[float] = []

    async def publish() -> None:
        for _ in range(count):
            meta = await (await producer.send(TOPIC, b"y" * 600))
            sent_at[meta.offset] = time.monotonic()
            await asyncio.sleep(0.25)

    publishing = asyncio.create_task(publish())
    deadline = time.monotonic() + 60 + count * 0.25
    try:
        while len(took) < count and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                now = time.monotonic()
                took += [now - sent_at.get(r.offset, now) for r in records]
        await publishing
    finally:
        await consumer.stop()
        await producer.stop()
    took.sort()
    if not took:
        return f"follow, fetch_max_wait_ms {max_wait_ms}: 0 of {count} read within 60 s"
    return (
        f"follow, fetch_max_wait_ms {max_wait_ms}: {len(took)} of {count} read, median"
        f" {took[len(took) // 2]:.2f} s, slowest {took[-1]:.2f} s"
    )


async def measure(bootstrap: str, records: int, per_batch: int, waits_ms: list[int]) -> None:
    await create_topics(bootstrap, [TOPIC])
    # Alone, a record is sent at once; several wait for each other (up to a second).
    linger_ms = 0 if per_batch == 1 else 1000
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=linger_ms, max_batch_size=per_batch * 1024
    )
    await producer.start()
    started = time.monotonic()
    try:
        for i in range(0, records, per_batch):
            # per_batch records sent together, acknowledged together: one batch
            sent = [await producer.send(TOPIC, b"x" * 600) for _ in range(per_batch)]
            await asyncio.gather(*sent)
            if i and i % 5000 == 0:
                print(f"{i} produced in {time.monotonic() - started:.0f} s", flush=True)
    finally:
        await producer.stop()
    print(f"{records} produced in {time.monotonic() - started:.0f} s", flush=True)
    for max_wait_ms in waits_ms:
        print(await follow(bootstrap, records + 20 * waits_ms.index(max_wait_ms), max_wait_ms))
    for max_wait_ms in waits_ms:
        for offset in (0, records // 4, records // 2, 3 * records // 4, records - 1):
            first, took_s = await first_record_after_seek(bootstrap, offset, max_wait_ms)
            print(
                f"fetch_max_wait_ms {max_wait_ms}, at {offset}: first record {first}"
                f" after {took_s:.2f} s",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--per-batch", type=int, default=1, help="records per batch")
    parser.add_argument(
        "--max-wait-ms", type=int, nargs="+", default=[500], help="consumers' fetch_max_wait_ms"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        objects = ObjectStore(data_dir=Path(folder) / "data", log_dir=Path(folder))
        objects.start()
        broker = KafkaBroker(
            storage=objects.storage_url, storage_env=objects.client_env, log_dir=Path(folder)
        )
        broker.start()
        try:
            asyncio.run(measure(broker.bootstrap, args.records, args.per_batch, args.max_wait_ms))
        finally:
            broker.stop()
            objects.stop()


if __name__ == "__main__":
    main()
