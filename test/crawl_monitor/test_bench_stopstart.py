"""bench.stopstart's reader of the outputs: a fetch that skips an offset (tansu on S3 did,
with two workers publishing to a partition) is read again, so that the uuid whose message
is at the skipped offset is not called lost; the skip is still noted."""

import asyncio
import json
from collections import namedtuple
from typing import Any

from aiokafka import TopicPartition

from bench.stopstart_diagnose import CheckedOutputs
from image_crawler import contract as c
from test.harness.services import wait_for

Record = namedtuple("Record", "topic partition offset value timestamp")
TP = TopicPartition(c.METADATA_TOPIC, 0)


def record(offset: int) -> Record:
    value = json.dumps({"identifier": f"u{offset}", "width": 1}).encode()
    return Record(TP.topic, 0, offset, value, 1000 + offset)


class ScriptedConsumer:
    """Answers as the broker did: offsets 0, 1 and 3 (2 skipped), then from where it is
    sought, everything."""

    def __init__(self) -> None:
        self.answers: list[list[int]] = [[0, 1, 3]]
        self.sought: list[int] = []

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.sought.append(offset)
        self.answers.append(list(range(offset, 5)))

    async def getmany(self, timeout_ms: int) -> dict[TopicPartition, list[Any]]:
        if not self.answers:
            await asyncio.Event().wait()  # nothing more, as a broker at the end
        return {TP: [record(o) for o in self.answers.pop(0)]}


async def test_a_skipped_offset_is_read_again_and_noted() -> None:
    outputs = CheckedOutputs("127.0.0.1:1")
    consumer = ScriptedConsumer()
    outputs._consumer = consumer
    reading = asyncio.create_task(outputs._read())
    try:
        await wait_for(lambda: len(outputs.uuids()) == 5, 5, what="five uuids read")
    finally:
        reading.cancel()
    assert consumer.sought == [2]
    assert outputs.uuids() == {f"u{o}" for o in range(5)}
    assert [g[:4] for g in outputs.gaps] == [(c.METADATA_TOPIC, 0, 2, 3)]
    assert sorted(r.uuid for r in outputs.records) == [f"u{o}" for o in range(5)]
