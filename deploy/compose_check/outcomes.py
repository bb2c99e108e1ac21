"""How each planned uuid ended, read from the output topics; run inside the worker's image.

    python outcomes.py PLAN.json [--until N] [--timeout-s S]

Runs in a one-off container of the worker's image (its Python, aiokafka and crawlctl; the
broker is ``kafka:9092``, a name only the stack's containers resolve). Reads
``image_metadata_updates``, ``link_rot`` and ``crawl_errors`` from their start without a
consumer group (crawlctl's demo reader), until ``N`` of the plan's uuids have ended (all
of them by default; 0: until it has read what is there) or the time is up, then prints
one JSON object on stdout:
``{"ended": {uuid: "ok" | status}, "seconds": ...}``. Progress goes to stderr every 5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from crawlctl.commands.demo import DemoTally, outcome_consumer
from crawlctl.commands.demo_plan import DemoItem, DemoPlan

PROGRESS_EVERY_S = 5.0
# An EXIF message may trail its resolution: read on this long once every uuid has ended.
TRAILING_S = 2.0


class HoleCheck:
    """Records up to the first offset a fetch skipped, which is read again (once).

    The stand-in broker (tansu on S3) was seen answering a fetch with a later batch than
    asked for while workers published, and aiokafka moves past what it skipped: one
    record of 804 was never read, and its uuid looked lost (bench.stopstart). The output
    topics' offsets follow each other, so a hole is the reader's, not the broker's."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        self._next: dict[Any, int] = {}
        self._reread: set[tuple[Any, int]] = set()
        self.holes = 0

    def contiguous(self, partition: Any, records: list[Any]) -> list[Any]:
        expected = self._next.get(partition)
        kept: list[Any] = []
        for record in records:
            if (
                expected is not None
                and record.offset > expected
                and ((partition, expected) not in self._reread)
            ):
                self._reread.add((partition, expected))
                self.holes += 1
                self._consumer.seek(partition, expected)
                return kept
            kept.append(record)
            expected = record.offset + 1
        if expected is not None:
            self._next[partition] = expected
        return kept


async def follow(
    planned: list[dict[str, str]], until: int | None, timeout_s: float
) -> dict[str, object]:
    plan = DemoPlan(
        tuple(DemoItem(p["uuid"], p["source"], "", None) for p in planned),
        {p["source"]: (0, 0.0) for p in planned},
    )
    tally = DemoTally(plan)
    wanted = min(until, len(planned)) if until else len(planned)
    read_any = False
    consumer = outcome_consumer(os.environ.get("KAFKA_HOSTS", "kafka:9092"))
    started = time.monotonic()
    await consumer.start()
    try:
        deadline = started + timeout_s
        said = started
        reader = HoleCheck(consumer)
        while len(tally.ended) < wanted and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for partition, records in batch.items():
                for record in reader.contiguous(partition, records):
                    tally.add(partition.topic, record.value)
            read_any = read_any or bool(batch)
            if until == 0 and read_any and not batch:
                break  # caught up: what has ended so far
            if time.monotonic() - said > PROGRESS_EVERY_S:
                said = time.monotonic()
                print(
                    f"outcomes: {len(tally.ended)} of {len(planned)} ended",
                    file=sys.stderr,
                    flush=True,
                )
        if len(tally.ended) == len(planned):
            quiet_until = time.monotonic() + TRAILING_S
            while time.monotonic() < quiet_until:
                for partition, records in (await consumer.getmany(timeout_ms=500)).items():
                    for record in records:
                        tally.add(partition.topic, record.value)
    finally:
        await consumer.stop()
    return {
        "ended": {identifier: end.status for identifier, end in tally.ended.items()},
        "metadata_messages": len(tally.metadata),
        "seconds": round(time.monotonic() - started, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan", type=Path)
    parser.add_argument("--until", type=int, default=None)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    args = parser.parse_args()
    planned = json.loads(args.plan.read_text())
    result = asyncio.run(follow(planned, args.until, args.timeout_s))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
