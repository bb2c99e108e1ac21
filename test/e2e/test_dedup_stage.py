"""``python -m dedup`` against a real broker: every image of image_metadata_updates placed
once in the cluster of its photograph, and a SIGKILL costing nothing (dedup/); its
placements counted in a real Redis once each, the first stage running with Redis away
(logged once, the stage unhindered) and its restart reading its input again from the
commit without counting twice."""

from __future__ import annotations

import asyncio
import random
import signal
from collections import Counter, defaultdict

from aiokafka import AIOKafkaConsumer
from redis.asyncio import Redis

from dedup.placement import Image
from image_crawler import contract as c
from test.dedup.test_placement import flipped, image, random_phash
from test.dedup.test_stage import resolution
from test.harness.processes import CrawlerProcess
from test.harness.services import create_topics, free_port, produce, wait_for


def photographs(
    rng: random.Random, first: int, originals: list[Image], n: int, copy_of: dict[str, str]
) -> list[Image]:
    """n new images: each third a copy of one of ``originals`` (2 bits or fewer off, so
    that two copies are within 4 of each other too; noted in ``copy_of``), the rest new
    photographs."""
    images = []
    for i in range(first, first + n):
        if originals and i % 3 == 0:
            original = rng.choice(originals)
            bits = rng.sample(range(64), rng.randint(0, 2))
            images.append(image(i, flipped(original.phash, bits), source="mirror"))
            copy_of[images[-1].identifier] = original.identifier
        else:
            images.append(image(i, random_phash(rng)))
    return images


async def feed(bootstrap: str, images: list[Image]) -> None:
    for one in images:  # keyed, as the workers publish: spread over the partitions
        await produce(bootstrap, c.METADATA_TOPIC, [resolution(one)], key=one.identifier.encode())


class Placements:
    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.seen: dict[str, list[c.DuplicateMessage]] = defaultdict(list)

    async def read(self) -> None:
        consumer = AIOKafkaConsumer(
            c.DUPLICATES_TOPIC, bootstrap_servers=self.bootstrap, auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            while True:
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    for record in records:
                        message = c.DuplicateMessage.from_json(record.value)
                        self.seen[message.identifier].append(message)
        finally:
            await consumer.stop()


def clusters(placements: dict[str, list[c.DuplicateMessage]]) -> set[frozenset[str]]:
    members: dict[str, set[str]] = defaultdict(set)
    for identifier, messages in placements.items():
        members[messages[-1].duplicate_of or identifier].add(identifier)
    return {frozenset(m) for m in members.values()}


def expected(images: list[Image], copy_of: dict[str, str]) -> set[frozenset[str]]:
    members: dict[str, set[str]] = defaultdict(set)
    for one in images:
        members[copy_of.get(one.identifier, one.identifier)].add(one.identifier)
    return {frozenset(m) for m in members.values()}


def counted(placements: dict[str, list[c.DuplicateMessage]]) -> dict[str, str]:
    """PLACEMENTS_HASH as it should read: each image once, by its source and kind."""
    kinds = Counter(c.placements_field(m[0].source or "", m[0].kind) for m in placements.values())
    return {field: str(n) for field, n in kinds.items()}


async def test_every_image_is_placed_in_its_cluster_and_a_sigkill_costs_no_answer(
    kafka, redis_url, tmp_path
):
    await create_topics(kafka.bootstrap, [c.METADATA_TOPIC], partitions=3)
    await create_topics(kafka.bootstrap, [c.DUPLICATES_TOPIC])
    rng = random.Random(54)
    copy_of: dict[str, str] = {}
    originals = photographs(rng, 0, [], 60, copy_of)
    first = originals + photographs(rng, 60, originals, 90, copy_of)
    env = {"KAFKA_HOSTS": kafka.bootstrap, "DEDUP_STATE_DIR": str(tmp_path / "state")}
    # The first stage's Redis is away (nothing listens there), the second's is there.
    away = {**env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "REDIS_TIMEOUT_S": "1"}
    env["REDIS_URL"] = redis_url
    redis = Redis.from_url(redis_url, decode_responses=True)
    placements = Placements(kafka.bootstrap)
    reader = asyncio.create_task(placements.read())
    started: list[CrawlerProcess] = []
    try:
        await feed(kafka.bootstrap, first)
        await produce(kafka.bootstrap, c.METADATA_TOPIC, [b'{"not": "a resolution"}'])
        stage = CrawlerProcess("dedup", away, tmp_path / "dedup-1.log")
        started.append(stage)
        ids = {i.identifier for i in first}
        await wait_for(lambda: ids <= placements.seen.keys(), 60, 0.1, "the first placements")
        assert stage.events("unparseable"), stage.tail()
        # Its writes fail (in their own task: the placements above went through): once logged.
        await wait_for(lambda: stage.events("redis_unavailable"), 10, 0.1, "the outage logged")
        assert len(stage.events("redis_unavailable")) == 1, stage.tail()
        answered = {k: v[0] for k, v in placements.seen.items()}
        stage.signal(signal.SIGKILL)
        stage.wait(10)
        # Copies of photographs placed before the kill, and new ones, then the stage again.
        second = photographs(rng, 150, originals, 60, copy_of)
        await feed(kafka.bootstrap, second)
        again = CrawlerProcess("dedup", env, tmp_path / "dedup-2.log")
        started.append(again)
        ids |= {i.identifier for i in second}
        await wait_for(lambda: ids <= placements.seen.keys(), 60, 0.1, "the second placements")
        loaded = again.wait_for_event("dedup_started", 10)
        assert loaded["canonicals"] > 0
        # Read again from the commit, whatever was placed before the kill has its answer.
        for identifier, messages in placements.seen.items():
            assert set(messages) == {answered.get(identifier, messages[0])}
        copies = [i for i in second if i.source == "mirror"]
        assert copies and all(placements.seen[i.identifier][0].kind != "unique" for i in copies)
        assert clusters(placements.seen) == expected(first + second, copy_of)
        # Counted once each: those placed again after the kill were not counted again.
        want = counted(placements.seen)
        await wait_for(
            lambda: _equal(redis.hgetall(c.PLACEMENTS_HASH), want), 30, 0.1, "the counts"
        )
        again.signal(signal.SIGTERM)
        assert again.wait(20) == 0, again.tail()
    finally:
        await redis.aclose()
        reader.cancel()
        for process in started:  # a failed assertion leaves none running
            process.stop()


async def _equal(reading, want: dict[str, str]) -> bool:
    return await reading == want
