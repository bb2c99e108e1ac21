"""``python -m worker`` against a real broker, redis-server, S3 server and HTTP origin.

The monitor is not running in these tests: the test sets each source's pacing rate itself
(``pace_rate:``, without the monitor's expiry) and writes straight to the per-source
queues, as the splitter would.
"""

from __future__ import annotations

import asyncio
import io
import json
import signal
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from image_crawler import contract as c
from test.harness.corpus import broken_images, good_images
from test.harness.crawl import RATE, Gate, by_kind, start_sources, worker_env
from test.harness.origin import Reply
from test.harness.processes import CrawlerProcess, committed_offset
from test.harness.services import (
    create_topics,
    get_object,
    list_keys,
    produce,
    read_topic,
    wait_for,
)


@pytest.fixture
def worker_log(tmp_path: Path):
    return lambda name="worker": tmp_path / f"{name}.log"


async def test_a_worker_crawls_every_image_of_three_sources(
    kafka, redis, redis_url, s3_server, s3_bucket, origin, worker_log
):
    sources = ["alpha", "beta", "gamma"]
    images = good_images()
    expected = {}
    for source in sources:
        tasks = []
        for i, image in enumerate(images):
            url = origin.add(f"/{source}/{image.name}", image.body, image.content_type)
            uuid = f"{source}-{i:03d}"
            expected[uuid] = (source, image)
            tasks.append(c.SourceTask(url=url, uuid=uuid).to_json())
        await create_topics(kafka.bootstrap, [c.source_topic(source)], partitions=2)
        await produce(kafka.bootstrap, c.source_topic(source), tasks)
    for source in sources:
        await redis.set(c.pace_rate_key(source), repr(RATE))
    await redis.sadd(c.INBOUND_SOURCES_SET, *sources)
    assert len(expected) >= 100

    with_exif = sum(1 for _, image in expected.values() if image.exif)
    worker = CrawlerProcess(
        "worker", worker_env(kafka, redis_url, s3_server, s3_bucket), worker_log()
    )
    try:
        raw = await read_topic(
            kafka.bootstrap, c.METADATA_TOPIC, min_messages=len(expected) + with_exif, timeout_s=180
        )
        resolutions, exifs = by_kind(raw)
        assert set(resolutions) == set(expected)
        assert {u for u, (_, image) in expected.items() if image.exif} == set(exifs)
        for uuid, (_, image) in expected.items():
            r = resolutions[uuid]
            assert (r.width, r.height) == (image.width, image.height), image.name
            assert r.filesize == len(image.body), image.name
            assert r.compression_quality == image.quality, image.name
            if image.exif:
                assert exifs[uuid].exif.items() >= image.exif.items(), image.name

        # Every thumbnail: a JPEG within 640x640 that keeps the original's aspect.
        assert list_keys(s3_server.endpoint_url, s3_bucket) == {f"{u}.jpg" for u in expected}
        for uuid, (_, image) in expected.items():
            thumbnail = Image.open(
                io.BytesIO(get_object(s3_server.endpoint_url, s3_bucket, f"{uuid}.jpg"))
            )
            assert thumbnail.format == "JPEG"
            tw, th = thumbnail.size
            assert max(tw, th) <= 640
            assert max(tw, th) <= max(image.width, image.height)  # never upscaled
            if min(tw, th) >= 20:  # a few pixels cannot carry an aspect ratio to 1%
                assert tw / th == pytest.approx(image.width / image.height, rel=0.01), image.name

        # Counters and windows, per source.
        await wait_for(lambda: redis.get(c.NUM_RESIZED), 10, what="num_resized")
        await wait_for(
            lambda: _equals(redis.get(c.NUM_RESIZED), str(len(expected))),
            20,
            what="every success counted",
        )
        per_source = Counter(source for source, _ in expected.values())
        for source, count in per_source.items():
            assert await redis.get(c.num_resized_key(source)) == str(count)
            assert await redis.get(c.resize_errors_key(source)) is None
            for prefix, _ in c.STATUS_WINDOWS:
                members = await redis.zrange(f"{prefix}{source}", 0, -1)
                assert len(members) == count
                assert {c.status_of_window_member(m) for m in members} == {"200"}
            assert await redis.lrange(c.last50_key(source), 0, -1) == ["200"] * min(50, count)
            # None of the answers asked us to slow down.
            assert await redis.get(c.backoff_signals_key(source)) is None

        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.tail()
        assert worker.events("worker_stopped")
    finally:
        worker.stop()


async def _equals(awaitable, value):
    return (await awaitable) == value


async def test_404_retries_broken_images_malformed_messages_and_missing_rates(
    kafka, redis, redis_url, s3_server, s3_bucket, origin, worker_log
):
    image = next(i for i in good_images() if i.content_type == "image/jpeg")
    corrupt = next(i for i in broken_images() if i.expected_status == "UnidentifiedImageError")
    flaky = origin.add_sequence("/paths/flaky.jpg", [500, Reply(image.body, "image/jpeg")])
    always_500 = origin.add_status("/paths/always500.jpg", 500)
    corrupt_url = origin.add("/paths/corrupt.jpg", corrupt.body, corrupt.content_type)
    good_url = origin.add("/paths/good.jpg", image.body, image.content_type)
    starved_url = origin.add("/starved/a.jpg", image.body, image.content_type)
    await start_sources(redis, kafka, ["paths", "starved"])
    await redis.delete(c.pace_rate_key("starved"))
    await produce(
        kafka.bootstrap,
        c.source_topic("paths"),
        [
            c.SourceTask(url=origin.url("/paths/gone.jpg"), uuid="rot").to_json(),
            c.SourceTask(url=flaky, uuid="flaky").to_json(),
            c.SourceTask(url=always_500, uuid="down").to_json(),
            c.SourceTask(url=corrupt_url, uuid="corrupt").to_json(),
            # Loopback too, but not the exempt address: refused before any request.
            c.SourceTask(
                url=f"http://127.0.0.2:{origin.port}/paths/good.jpg", uuid="blocked"
            ).to_json(),
            b"this is not json",
            b'{"url": "http://example.com/no-uuid.jpg"}',
            c.SourceTask(url=good_url, uuid="after-the-bad-ones").to_json(),
        ],
    )
    await produce(
        kafka.bootstrap,
        c.source_topic("starved"),
        [c.SourceTask(url=starved_url, uuid="starved").to_json()],
    )
    env = worker_env(
        kafka, redis_url, s3_server, s3_bucket, RATE_LIMIT_TIMEOUT_S=0.5, MAX_ATTEMPTS=3
    )
    worker = CrawlerProcess("worker", env, worker_log())
    try:
        # 404: link rot.
        (rot,) = await read_topic(kafka.bootstrap, c.LINK_ROT_TOPIC, min_messages=1, timeout_s=60)
        assert json.loads(rot)["identifier"] == "rot"
        # 500s are tried again by the worker, after a backoff: the flaky one succeeds on
        # its second try, the other is dead-lettered after MAX_ATTEMPTS (3) tries.
        raw = await read_topic(kafka.bootstrap, c.METADATA_TOPIC, min_messages=2, timeout_s=30)
        resolutions, _ = by_kind(raw)
        assert set(resolutions) == {"flaky", "after-the-bad-ones"}
        # The dead letters: the third 500, the corrupt image, two malformed messages.
        errors = [
            json.loads(m)
            for m in await read_topic(
                kafka.bootstrap, c.CRAWL_ERRORS_TOPIC, min_messages=5, timeout_s=30
            )
        ]
        crawl_errors = {e["identifier"]: e for e in errors if "identifier" in e}
        assert crawl_errors["down"] | {"time": None} == {
            "identifier": "down",
            "url": always_500,
            "source": "paths",
            "status": "500",
            "attempts": 3,
            "time": None,
        }
        assert origin.requests("/paths/always500.jpg") == 3
        assert origin.requests("/paths/flaky.jpg") == 2
        assert crawl_errors["corrupt"]["status"] == "UnidentifiedImageError"
        assert crawl_errors["blocked"]["status"] == "Blocked"
        assert origin.requests("/paths/good.jpg") == 1  # only the allowed URL
        unparseable = [e for e in errors if "raw" in e]
        assert sorted(e["raw"] for e in unparseable) == sorted(
            ["this is not json", '{"url": "http://example.com/no-uuid.jpg"}']
        )
        assert {e["topic"] for e in unparseable} == {"urls.paths"}
        await wait_for(
            lambda: _equals(redis.get(c.NUM_MALFORMED), "2"), 10, what="malformed counted"
        )
        await wait_for(
            lambda: _equals(redis.get(c.num_resized_key("paths")), "2"),
            10,
            what="successes counted",
        )
        assert await redis.get(c.resize_errors_key("paths", "404")) == "1"
        assert await redis.get(c.resize_errors_key("paths", "500")) == "4"
        assert await redis.get(c.resize_errors_key("paths", "UnidentifiedImageError")) == "1"
        statuses = Counter(
            c.status_of_window_member(m) for m in await redis.zrange("status60s:paths", 0, -1)
        )
        assert statuses == {"200": 2, "500": 4, "404": 1, "UnidentifiedImageError": 1, "Blocked": 1}
        # No rate, no request: the starved source's URL waits and says so, then goes.
        timeout = await asyncio.to_thread(worker.wait_for_event, "rate_limit_timeout", 30)
        assert timeout["source"] == "starved" and timeout["identifier"] == "starved"
        assert origin.requests("/starved/a.jpg") == 0
        await redis.set(c.pace_rate_key("starved"), 1)
        raw = await read_topic(kafka.bootstrap, c.METADATA_TOPIC, min_messages=3, timeout_s=30)
        assert "starved" in by_kind(raw)[0]
        assert origin.requests("/starved/a.jpg") == 1
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.tail()
    finally:
        worker.stop()


async def test_a_killed_worker_commits_no_unfinished_message_and_a_restart_finishes_them(
    kafka, redis, redis_url, s3_server, s3_bucket, origin, worker_log
):
    image = next(i for i in good_images() if i.content_type == "image/jpeg")
    gate = Gate(image.body)
    gated = origin.add_handler("/slow/held.jpg", gate)
    urls = [origin.add(f"/slow/{i}.jpg", image.body, "image/jpeg") for i in range(10)]
    urls[5] = gated
    await start_sources(redis, kafka, ["slow"])
    await produce(
        kafka.bootstrap,
        c.source_topic("slow"),
        [c.SourceTask(url=u, uuid=f"m{i}").to_json() for i, u in enumerate(urls)],
    )
    env = worker_env(kafka, redis_url, s3_server, s3_bucket)
    first = CrawlerProcess("worker", env, worker_log("first"))
    second = None
    try:
        raw = await read_topic(kafka.bootstrap, c.METADATA_TOPIC, min_messages=9, timeout_s=60)
        assert set(by_kind(raw)[0]) == {f"m{i}" for i in range(10)} - {"m5"}
        # Messages 6-9 finished before 5: the commit stops at 5, the first unfinished one.
        topic = c.source_topic("slow")
        await wait_for(lambda: _offset_is(kafka.bootstrap, topic, 5), 30, what="offset 5 committed")
        # And 6-9 written down as finished past it (at a commit, every COMMIT_INTERVAL_S):
        # what a worker finished in its last interval is done again after a kill -9.
        await wait_for(
            lambda: _equals(redis.zcard(c.finished_key(topic, 0)), 4),
            30,
            what="6-9 recorded as finished",
        )
        first.signal(signal.SIGKILL)
        first.wait(10)
        assert await committed_offset(kafka.bootstrap, c.WORKER_GROUP, topic) == 5
        assert gate.waiting == 1

        gate.opened.set()
        second = CrawlerProcess("worker", env, worker_log("second"))
        # The restart reads from the committed offset: 5 runs for the first time; 6-9, which
        # the first worker wrote down as finished past its commit (they ended long before
        # the kill), are skipped (issue 53), so 10 resolutions in all, each once.
        await wait_for(
            lambda: _offset_is(kafka.bootstrap, topic, 10), 90, what="offset 10 committed"
        )
        raw = await read_topic(kafka.bootstrap, c.METADATA_TOPIC, min_messages=10, timeout_s=30)
        runs = Counter(json.loads(message)["identifier"] for message in raw)
        assert runs == {f"m{i}": 1 for i in range(10)}
        [loaded] = second.events("finished_loaded")
        assert loaded["offsets"] == 4
        second.signal(signal.SIGTERM)
        assert second.wait(30) == 0, second.tail()
    finally:
        first.stop()
        if second is not None:
            second.stop()


async def test_a_message_its_queue_holds_twice_is_crawled_once(
    kafka, redis, redis_url, s3_server, s3_bucket, origin, worker_log
):
    # As a broker that stored a send it did not acknowledge holds it: the sender sent it
    # again (worker.copies). The copies come once the first are crawled and written down.
    image = next(i for i in good_images() if i.content_type == "image/jpeg")
    paths = [f"/twice/{i}.jpg" for i in range(6)]
    tasks = [
        c.SourceTask(url=origin.add(p, image.body, "image/jpeg"), uuid=f"t{i}").to_json()
        for i, p in enumerate(paths)
    ]
    await start_sources(redis, kafka, ["twice"])
    topic = c.source_topic("twice")
    await produce(kafka.bootstrap, topic, tasks[:5])
    worker = CrawlerProcess(
        "worker", worker_env(kafka, redis_url, s3_server, s3_bucket), worker_log()
    )
    try:
        await wait_for(lambda: _offset_is(kafka.bootstrap, topic, 5), 60, what="offset 5")
        await wait_for(
            lambda: _equals(redis.zcard(c.crawled_key(topic, 0)), 5), 30, what="5 digests"
        )
        await produce(kafka.bootstrap, topic, [*tasks[:5], tasks[5]])
        await wait_for(lambda: _offset_is(kafka.bootstrap, topic, 11), 60, what="offset 11")
        assert [origin.requests(p) for p in paths] == [1] * 6
        raw = await read_topic(kafka.bootstrap, c.METADATA_TOPIC, min_messages=6, timeout_s=30)
        # Read after the commit of 11: all that will be published is.
        resolutions = [m for m in map(json.loads, raw) if "exif" not in m]
        assert Counter(m["identifier"] for m in resolutions) == {f"t{i}": 1 for i in range(6)}
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.tail()
    finally:
        worker.stop()


async def _equals(value, expected):
    return await value == expected


async def _offset_is(bootstrap, topic, offset):
    return await committed_offset(bootstrap, c.WORKER_GROUP, topic) == offset


async def test_sigterm_hands_back_work_in_flight_and_exits_0(
    kafka, redis, redis_url, s3_server, s3_bucket, origin, worker_log
):
    image = next(i for i in good_images() if i.content_type == "image/jpeg")
    gate = Gate(image.body)
    urls = [origin.add_handler("/held.jpg", gate)] + [
        origin.add(f"/ok{i}.jpg", image.body, "image/jpeg") for i in range(2)
    ]
    await start_sources(redis, kafka, ["held"])
    await produce(
        kafka.bootstrap,
        c.source_topic("held"),
        [c.SourceTask(url=u, uuid=f"h{i}").to_json() for i, u in enumerate(urls)],
    )
    worker = CrawlerProcess(
        "worker",
        worker_env(kafka, redis_url, s3_server, s3_bucket, SHUTDOWN_GRACE_S=1),
        worker_log(),
    )
    try:
        await read_topic(kafka.bootstrap, c.METADATA_TOPIC, min_messages=2, timeout_s=60)
        await wait_for(lambda: gate.waiting == 1, 10, what="the held request")
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.tail()
        (handed_back,) = worker.events("handing_back")
        assert handed_back["tasks"] == 1
        # Nothing passed the unfinished first message.
        assert await committed_offset(kafka.bootstrap, c.WORKER_GROUP, c.source_topic("held")) in (
            None,
            0,
        )
    finally:
        gate.opened.set()
        worker.stop()


async def test_a_worker_waits_for_kafka_and_still_stops_cleanly(redis_url, worker_log):
    from test.harness.services import free_port

    env = {
        "KAFKA_HOSTS": f"127.0.0.1:{free_port()}",
        "REDIS_URL": redis_url,
        "THUMBNAIL_STORE": "local",
    }
    worker = CrawlerProcess("worker", env, worker_log())
    try:
        event = await asyncio.to_thread(worker.wait_for_event, "kafka_unavailable", 30)
        assert event["op"] == "start_producer"
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.tail()
        assert "Traceback" not in worker.tail(200)
    finally:
        worker.stop()
