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


async def first_record_after_seek(bootstrap: str, offset: int) -> tuple[int | None, float]:
    """The offset of the first record read after a seek to ``offset``, and how long it
    took (None after ``GIVE_UP_S``)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
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


async def measure(bootstrap: str, records: int) -> None:
    await create_topics(bootstrap, [TOPIC])
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    await producer.start()
    started = time.monotonic()
    try:
        for i in range(records):
            await (await producer.send(TOPIC, b"x" * 600))  # a batch of one record
            if i and i % 5000 == 0:
                print(f"{i} produced in {time.monotonic() - started:.0f} s", flush=True)
    finally:
        await producer.stop()
    print(f"{records} produced in {time.monotonic() - started:.0f} s", flush=True)
    for offset in (0, records // 4, records // 2, 3 * records // 4, records - 1):
        first, took_s = await first_record_after_seek(bootstrap, offset)
        print(f"fetch at {offset}: first record {first} after {took_s:.2f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        objects = ObjectStore(data_dir=Path(folder) / "data", log_dir=Path(folder))
        objects.start()
        broker = KafkaBroker(
            storage=objects.storage_url, storage_env=objects.client_env, log_dir=Path(folder)
        )
        broker.start()
        try:
            asyncio.run(measure(broker.bootstrap, args.records))
        finally:
            broker.stop()
            objects.stop()


if __name__ == "__main__":
    main()
