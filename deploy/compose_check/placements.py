"""The deduplication stage's placements of the planned images; run inside the worker's image.

    python placements.py PLAN.json [--timeout-s S]

Runs in a one-off container of the worker's image, as ``outcomes.py`` does (the broker is
``kafka:9092``). Reads ``image_duplicates`` from its start without a consumer group until
every uuid of the plan expected ``ok`` has a placement, or the time is up, then prints one
JSON object on stdout: ``{"placed": {uuid: [kind, duplicate_of]}, "seconds": ...}``, an
image's last placement (a placement may be published again after a restart of the stage,
with the same answer). Progress goes to stderr every 5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer

PROGRESS_EVERY_S = 5.0
TOPIC = "image_duplicates"


async def follow(wanted: set[str], timeout_s: float) -> dict[str, object]:
    placed: dict[str, list[str | None]] = {}
    consumer = AIOKafkaConsumer(
        bootstrap_servers=os.environ.get("KAFKA_HOSTS", "kafka:9092"),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        # The topic appears with the stage's first placement: notice it quickly.
        metadata_max_age_ms=1000,
    )
    consumer.subscribe([TOPIC])
    started = time.monotonic()
    await consumer.start()
    try:
        said = started
        while not wanted <= placed.keys() and time.monotonic() < started + timeout_s:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    message = json.loads(record.value)
                    placed[message["identifier"]] = [message["kind"], message["duplicate_of"]]
            if time.monotonic() - said > PROGRESS_EVERY_S:
                said = time.monotonic()
                done = len(wanted & placed.keys())
                print(f"placements: {done} of {len(wanted)}", file=sys.stderr, flush=True)
    finally:
        await consumer.stop()
    return {"placed": placed, "seconds": round(time.monotonic() - started, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan", type=Path)
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args()
    planned = json.loads(args.plan.read_text())
    wanted = {p["uuid"] for p in planned if p["expected"] == "ok"}
    print(json.dumps(asyncio.run(follow(wanted, args.timeout_s))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
