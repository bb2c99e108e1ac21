"""The crawl monitor under faults, as operators run it (``python -m crawl_monitor``), with a
real ``python -m worker``, broker, redis-server and HTTP origin where requests are counted.

- a monitor SIGKILLed mid-split loses no uuid (at least once, duplicates counted);
- malformed ``inbound_images`` messages are dead-lettered, counted and passed;
- no monitor, no requests within 2 s; a restarted monitor does not catch up in a burst;
- two monitors never double a rate (the leader lease), also across a take-over.

Rates are measured where they land: the origin's request log (monotonic times, same
process as the test). Paced at ``rate``, a source gets one request every ``1 / rate``
seconds: at most ``rate x w + 1`` in any window of ``w`` seconds (``test.harness.windows``), the
bound checked here through the monitor's death, its restart and a take-over. (The
original's once-a-second bucket allowed ``rate x (w + 1)``: a second's tokens at once.)
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from redis.asyncio import Redis

from image_crawler import contract as c
from test.harness.corpus import good_images
from test.harness.crawl import sources_file, worker_env
from test.harness.origin import Origin
from test.harness.processes import CrawlerProcess, committed_offset
from test.harness.services import create_topics, produce, wait_for
from test.harness.windows import max_in_window, over_bound, paced_bound

# Widths (s) of the sliding windows the pacing bound is checked in.
WINDOWS_S = (0.5, 1.0, 2.0, 4.0)


def window_report(times: Sequence[float]) -> dict[float, int]:
    return {width: max_in_window(times, width) for width in WINDOWS_S}


def over_envelope(times: Sequence[float], rate_rps: float) -> dict[float, tuple[int, int]]:
    """Widths whose busiest window exceeds the pacing bound: width -> (seen, allowed)."""
    return over_bound(times, rate_rps, WINDOWS_S)


def test_the_bound_tells_even_pacing_from_a_burst_a_second():
    even = [k / 5 for k in range(40)]  # 5/s, one every 0.2 s
    # The original's refills: each second's 5 tokens taken at once, the first second's
    # at its end (a worker that just started), so two seconds' worth come together.
    burst = [(k or 0.9) + i * 0.001 for k in range(8) for i in range(5)]
    assert window_report(even) == {0.5: 3, 1.0: 5, 2.0: 10, 4.0: 20}
    assert over_envelope(even, 5) == {}
    assert set(over_envelope(burst, 5)) == set(WINDOWS_S)


def bursts(times: Sequence[float], since: float, gap_s: float = 0.2) -> list[tuple[float, int]]:
    """Requests grouped where they are less than ``gap_s`` apart: (start - since, count)."""
    found: list[list[float]] = []
    for t in times:
        if found and t - found[-1][-1] < gap_s:
            found[-1].append(t)
        else:
            found.append([t])
    return [(round(group[0] - since, 3), len(group)) for group in found]


def request_times(origin: Origin, source: str, since: float = -math.inf) -> list[float]:
    prefix = f"/{source}/"
    return sorted(t for t, path in origin.request_log if path.startswith(prefix) and t >= since)


def wall_time(event: Mapping[str, Any]) -> float:
    """An event's ``time`` (ISO-8601) as Unix seconds."""
    return datetime.fromisoformat(event["time"]).timestamp()


# --- setting up -----------------------------------------------------------------------------


def jpeg() -> bytes:
    return next(i for i in good_images() if i.content_type == "image/jpeg").body


async def queue_urls(
    kafka: Any, redis: Redis, origin: Origin, sources: Iterable[str], per_source: int
) -> None:
    """``per_source`` image URLs per source straight into ``urls.{source}`` (no splitter)."""
    body = jpeg()
    sources = list(sources)
    await create_topics(kafka.bootstrap, [c.source_topic(s) for s in sources])
    for source in sources:
        tasks = [
            c.SourceTask(
                url=origin.add(f"/{source}/{i}.jpg", body, "image/jpeg"), uuid=f"{source}-{i}"
            ).to_json()
            for i in range(per_source)
        ]
        await produce(kafka.bootstrap, c.source_topic(source), tasks)
    await redis.sadd(c.INBOUND_SOURCES_SET, *sources)


async def override_rates(redis: Redis, rates: Mapping[str, float]) -> None:
    for source, rate in rates.items():
        await redis.set(f"{c.OVERRIDE_RATE_PREFIX}{source}", rate)


def monitor_env(kafka: Any, redis_url: str, **extra: object) -> dict[str, str]:
    env = {**kafka.env, "REDIS_URL": redis_url}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def start_worker(kafka, redis_url, s3_server, bucket, tmp_path) -> CrawlerProcess:
    env = worker_env(kafka, redis_url, s3_server, bucket)
    return CrawlerProcess("worker", env, tmp_path / "worker.log")


async def crawl_for(seconds: float, *, since: float) -> None:
    """Let the crawl run until ``since + seconds`` (the measured interval itself)."""
    await wait_for(
        lambda: time.monotonic() >= since + seconds,
        seconds + 30,
        interval_s=0.1,
        what=f"{seconds:g} s of crawl",
    )


def stop_all(*processes: CrawlerProcess | None) -> None:
    for process in processes:
        if process is not None:
            process.stop()


# --- Kafka ----------------------------------------------------------------------------------


async def produce_partitioned(
    bootstrap: str, topic: str, values: Mapping[int, Sequence[bytes | None]]
) -> None:
    """Produce each partition's values in order (acks=all) and wait for every ack.

    A None value (a tombstone) goes with a key, as Kafka requires one of the two.
    """
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic, value, key=b"tombstone" if value is None else None, partition=partition
            )
            for partition, batch in values.items()
            for value in batch
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def read_all(
    bootstrap: str,
    topics: Sequence[str],
    *,
    min_messages: int,
    idle_s: float = 1.0,
    timeout_s: float = 60.0,
) -> list[Any]:
    """Every record of ``topics`` from the beginning, without a group: at least
    ``min_messages``, and then until nothing new arrived for ``idle_s`` (the topics are
    only read once their writers are stopped, so quiet means complete)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    records: list[Any] = []
    try:
        consumer.subscribe(list(topics))
        deadline = time.monotonic() + timeout_s
        quiet_since = time.monotonic()
        while len(records) < min_messages or time.monotonic() - quiet_since < idle_s:
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {len(records)} of >= {min_messages} from {topics}")
            batch = await consumer.getmany(timeout_ms=100)
            for partition_records in batch.values():
                records.extend(partition_records)
                quiet_since = time.monotonic()
    finally:
        await consumer.stop()
    return records


async def committed_total(bootstrap: str, partitions: int) -> int:
    total = 0
    for partition in range(partitions):
        offset = await committed_offset(bootstrap, c.SPLITTER_GROUP, c.INBOUND_TOPIC, partition)
        total += offset or 0
    return total


async def counter(redis: Redis, key: str) -> int:
    return int(await redis.get(key) or 0)


# --- case 6: killed between producing a split message and committing inbound_images -----

SPLIT_SOURCES = ("north", "south", "east", "west")
INBOUND_PARTITIONS = 2
PER_PARTITION = 10_000


async def test_a_monitor_killed_mid_split_loses_no_uuid(kafka, fresh_redis_server, tmp_path):
    """Held between producing and committing, killed there: every uuid is still routed.

    The splitter records a batch in Redis after its acknowledgements and before it
    commits, so freezing redis-server mid-split holds it exactly in that window (a
    random kill lands there only a third of the time: a 500-message batch takes ~15 ms,
    two thirds of it before its first message reaches the broker).
    """
    redis = Redis.from_url(fresh_redis_server.url, decode_responses=True)
    await create_topics(kafka.bootstrap, [c.INBOUND_TOPIC], partitions=INBOUND_PARTITIONS)
    total = INBOUND_PARTITIONS * PER_PARTITION
    uuids = [f"uuid-{i:05d}" for i in range(total)]
    by_partition: dict[int, list[bytes | None]] = {p: [] for p in range(INBOUND_PARTITIONS)}
    for i, uuid in enumerate(uuids):
        source = SPLIT_SOURCES[i % len(SPLIT_SOURCES)]
        message = c.InboundImage(url=f"http://{source}.test/{uuid}.jpg", uuid=uuid, source=source)
        by_partition[i % INBOUND_PARTITIONS].append(message.to_json())
    await produce_partitioned(kafka.bootstrap, c.INBOUND_TOPIC, by_partition)
    topics = [c.source_topic(s) for s in SPLIT_SOURCES]
    env = monitor_env(kafka, fresh_redis_server.url, SOURCE_TOPIC_PARTITIONS=2, REDIS_TIMEOUT_S=1)

    first = CrawlerProcess("crawl_monitor", env, tmp_path / "first.log")
    second = None
    try:
        await wait_for(
            lambda: _at_least(redis, c.NUM_SPLIT, total // 5), 60, interval_s=0.005, what="split"
        )
        fresh_redis_server.pause()
        # The regulator may find Redis gone first: the splitter's own event is the one.
        await asyncio.to_thread(
            first.wait_for_event, "redis_unavailable", 20, lambda e: e["op"] == "record_split"
        )
        committed = await committed_total(kafka.bootstrap, INBOUND_PARTITIONS)
        routed = len(await read_all(kafka.bootstrap, topics, min_messages=committed + 1))
        assert committed == await committed_total(kafka.bootstrap, INBOUND_PARTITIONS)
        first.process.kill()
        first.wait(10)
        fresh_redis_server.resume()
        assert committed < routed < total, (committed, routed)
        print(f"\nkilled mid-split: {routed} routed, {committed} committed")

        restarted_at = time.monotonic()
        second = CrawlerProcess("crawl_monitor", env, tmp_path / "second.log")
        await wait_for(
            lambda: _committed_is(kafka.bootstrap, total), 120, interval_s=0.5, what="all split"
        )
        print(f"restarted monitor split the rest in {time.monotonic() - restarted_at:.1f} s")
        records = await read_all(kafka.bootstrap, topics, min_messages=total)
        seen = Counter(json.loads(r.value)["uuid"] for r in records)
        assert set(seen) == set(uuids)
        duplicates = sum(n - 1 for n in seen.values())
        # Exactly the routed-but-uncommitted ones were split again, and nothing else.
        assert duplicates == routed - committed
        # Each in its own source's queue, keyed by its uuid.
        for record in records:
            uuid = json.loads(record.value)["uuid"]
            assert record.topic == c.source_topic(SPLIT_SOURCES[int(uuid[5:]) % 4])
            assert record.key == uuid.encode()
        print(
            f"{len(records)} records for {total} uuids: {duplicates} duplicates; "
            f"num_split {await counter(redis, c.NUM_SPLIT)}"
        )
        assert not second.events("malformed_message")
    finally:
        if fresh_redis_server.paused:
            fresh_redis_server.resume()
        stop_all(first, second)
        await redis.aclose()


async def _at_least(redis: Redis, key: str, value: int) -> bool:
    return await counter(redis, key) >= value


async def _committed_is(bootstrap: str, total: int) -> bool:
    return await committed_total(bootstrap, INBOUND_PARTITIONS) == total


# --- case 7: malformed messages on inbound_images -------------------------------------------


def inbound(url: Any, uuid: Any, source: Any, **extra: Any) -> bytes:
    return json.dumps({"url": url, "uuid": uuid, "source": source, **extra}).encode()


ENORMOUS_BYTES = 900_000  # under the broker's and the clients' 1 MiB limits

MALFORMED: list[bytes | None] = [
    b"not json {",
    b"",
    None,  # a tombstone: no value at all
    b"\xff\xfe{\x00",
    b"[1, 2]",
    b'"flickr"',
    b"42",
    b"null",
    b'{"uuid": "m1", "source": "fine"}',
    b'{"url": "http://o/m2.jpg", "source": "fine"}',
    b'{"url": "http://o/m3.jpg", "uuid": "m3"}',
    inbound("", "m4", "fine"),
    inbound("http://o/m5.jpg", "", "fine"),
    inbound("http://o/m6.jpg", "m6", ""),
    inbound("http://o/m7.jpg", "m7", "   "),
    inbound("http://o/m8.jpg", "m8", 8),
    inbound("http://o/m9.jpg", "m9", "a/b"),
    inbound("http://o/m10.jpg", "m10", "../../etc"),
    inbound("http://o/m11.jpg", "m11", "two words"),
    inbound("http://o/m12.jpg", "m12", "x" * 300),
    inbound("http://o/m13.jpg", "m13", "x" * (c.MAX_SOURCE_NAME_LENGTH + 1)),
    inbound("http://o/m14.jpg", "m14", "mus\u00e9e"),
    inbound("http://o/m15.jpg", "m15", "\u212a"),  # the Kelvin sign, "k" once lower-cased
    inbound("http://o/m16.jpg", "m16", "tab\there"),
    inbound("http://o/m17.jpg", "m17", "fine", attempts="1"),
    # Enormous: text that is not JSON, and a JSON object whose source is the bulk.
    (b"not json at all " * (ENORMOUS_BYTES // 16 + 1))[:ENORMOUS_BYTES],
    inbound("http://o/huge.jpg", "m19", "s" * ENORMOUS_BYTES),
]


async def test_malformed_inbound_messages_are_dead_lettered_counted_and_passed(
    kafka, redis, redis_url, tmp_path
):
    await create_topics(kafka.bootstrap, [c.INBOUND_TOPIC])
    # Good ones before, between and after the bad ones, in one partition: none waits.
    good = [inbound(f"http://o/g{i}.jpg", f"g{i}", "fine") for i in range(len(MALFORMED) + 1)]
    # ".." is legal once prefixed ("urls.."): a source like any other, not malformed.
    good.append(inbound("http://o/dots.jpg", "dots", ".."))
    stream: list[bytes | None] = []
    for i, bad in enumerate(MALFORMED):
        stream += [good[i], bad]
    stream += good[len(MALFORMED) :]
    await produce_partitioned(kafka.bootstrap, c.INBOUND_TOPIC, {0: stream})

    monitor = CrawlerProcess(
        "crawl_monitor", monitor_env(kafka, redis_url), tmp_path / "monitor.log"
    )
    try:
        await wait_for(
            lambda: _committed_at(kafka.bootstrap, len(stream)), 60, what="everything committed"
        )
        fine = await read_all(kafka.bootstrap, [c.source_topic("fine")], min_messages=len(good) - 1)
        assert sorted(json.loads(r.value)["uuid"] for r in fine) == sorted(
            f"g{i}" for i in range(len(MALFORMED) + 1)
        )
        (dots,) = await read_all(kafka.bootstrap, [c.source_topic("..")], min_messages=1)
        assert json.loads(dots.value)["uuid"] == "dots"

        letters = await read_all(
            kafka.bootstrap, [c.CRAWL_ERRORS_TOPIC], min_messages=len(MALFORMED)
        )
        assert len(letters) == len(MALFORMED)
        dead = [c.UnparseableMessage.from_json(r.value) for r in letters]
        expected_raw = [
            (raw or b"")[: c.RAW_MESSAGE_CAP_BYTES].decode("utf-8", errors="replace")
            for raw in MALFORMED
        ]
        assert sorted(letter.raw for letter in dead) == sorted(expected_raw)
        for letter in dead:
            assert letter.topic == c.INBOUND_TOPIC
            assert 0 < len(letter.error) < 500, letter.error  # bounded, even for 900 KB
            assert datetime.fromisoformat(letter.time).tzinfo is not None
        assert max(len(r.value) for r in letters) < 2 * c.RAW_MESSAGE_CAP_BYTES
        assert {len(letter.raw) for letter in dead} >= {c.RAW_MESSAGE_CAP_BYTES}

        assert await counter(redis, c.NUM_MALFORMED) == len(MALFORMED)
        assert await counter(redis, c.NUM_SPLIT) == len(good)
        events = monitor.events("malformed_message")
        assert len(events) == len(MALFORMED)
        assert {e["offset"] for e in events} == {2 * i + 1 for i in range(len(MALFORMED))}
        # Nothing enormous reached the log either.
        assert max(map(len, monitor.log_path.read_bytes().splitlines())) < 4096
        assert not monitor.events("splitter_error")
    finally:
        monitor.stop()


async def _committed_at(bootstrap: str, offset: int) -> bool:
    return await committed_offset(bootstrap, c.SPLITTER_GROUP, c.INBOUND_TOPIC) == offset


# --- case 8: no monitor, no requests; a restarted one does not catch up ----------------------

CRAWL_RATES = {"alpha": 5.0, "beta": 3.0, "gamma": 2.0}


@pytest.mark.timing(
    "asserts the last request within 2 s of the kill and the origin's rate after the restart"
)
async def test_killing_the_monitor_stops_every_source_and_a_restart_does_not_burst(
    kafka, redis, redis_url, s3_server, s3_bucket, origin, tmp_path
):
    await override_rates(redis, CRAWL_RATES)
    await queue_urls(kafka, redis, origin, CRAWL_RATES, 250)
    env = monitor_env(
        kafka, redis_url, SOURCES_FILE=sources_file(tmp_path, **dict.fromkeys(CRAWL_RATES, 10**6))
    )
    first = CrawlerProcess("crawl_monitor", env, tmp_path / "first.log")
    second = worker = None
    try:
        worker = start_worker(kafka, redis_url, s3_server, s3_bucket, tmp_path)
        await wait_for(
            lambda: all(len(request_times(origin, s)) >= 2 * r for s, r in CRAWL_RATES.items()),
            90,
            interval_s=0.1,
            what="every source crawled for a while",
        )
        first.process.kill()
        killed_at = time.monotonic()
        first.wait(10)
        # Watch 5 s: long enough to see requests that should not happen after 2 s.
        await crawl_for(5.0, since=killed_at)
        last_after_kill = {s: max(request_times(origin, s)) - killed_at for s in CRAWL_RATES}
        print("\nlast request after the kill (s):", _rounded(last_after_kill))
        assert max(last_after_kill.values()) < 2.0, last_after_kill
        # For want of a rate: nobody renews them, and they expired.
        assert await redis.exists(*[c.pace_rate_key(s) for s in CRAWL_RATES]) == 0

        restarted_at = time.monotonic()
        second = CrawlerProcess("crawl_monitor", env, tmp_path / "second.log")
        await wait_for(
            lambda: all(request_times(origin, s, since=restarted_at) for s in CRAWL_RATES),
            30,
            interval_s=0.05,
            what="requests again",
        )
        resumed_at = {s: request_times(origin, s, since=restarted_at)[0] for s in CRAWL_RATES}
        await crawl_for(6.0, since=max(resumed_at.values()))
        print(
            "first request after the restart (s):",
            _rounded({s: t - restarted_at for s, t in resumed_at.items()}),
        )
        for source, rate in CRAWL_RATES.items():
            after = request_times(origin, source, since=restarted_at)
            first_second = [t for t in after if t < after[0] + 1.0]
            first_refill = [t for t in after if t < after[0] + 0.5]
            report = window_report(after)
            print(
                f"{source} at {rate:g}/s: {len(first_refill)} in the first 0.5 s, "
                f"{len(first_second)} in the first second, busiest windows {report}"
            )
            # No catch-up: the first second after the outage is paced like any other...
            assert len(first_second) <= paced_bound(rate, 1.0), (source, first_second)
            # ...and no window after it holds more than pacing allows.
            assert over_envelope(after, rate) == {}, source
        assert not second.events("loop_crashed")
    finally:
        stop_all(worker, second, first)


def _rounded(values: Mapping[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in values.items()}


# --- case 9: two monitors at once never double a rate ---------------------------------------


@pytest.mark.timing(
    "asserts the rate envelope at the origin and a take-over within 6-8 s of the kill"
)
async def test_two_monitors_never_double_a_rate_and_the_standby_takes_over(
    kafka, redis, redis_url, s3_server, s3_bucket, origin, tmp_path
):
    rate = 5.0
    await override_rates(redis, {"paced": rate})
    await queue_urls(kafka, redis, origin, ["paced"], 400)
    env = monitor_env(kafka, redis_url, SOURCES_FILE=sources_file(tmp_path, paced=10**6))
    first = CrawlerProcess("crawl_monitor", env, tmp_path / "first.log")
    second = worker = None
    try:
        leader = await asyncio.to_thread(first.wait_for_event, "leadership_acquired", 20)
        second = CrawlerProcess("crawl_monitor", env, tmp_path / "second.log")
        standby = await asyncio.to_thread(second.wait_for_event, "leadership_standby", 20)
        assert standby["holder"] == leader["token"]
        worker = start_worker(kafka, redis_url, s3_server, s3_bucket, tmp_path)
        await wait_for(lambda: request_times(origin, "paced"), 60, what="the first request")

        both_from = request_times(origin, "paced")[0]
        await crawl_for(8.0, since=both_from)
        both = request_times(origin, "paced")
        assert not second.events("leadership_acquired")
        print(
            f"\ntwo monitors: {len(both)} requests in {both[-1] - both[0]:.2f} s, "
            f"busiest windows {window_report(both)}"
        )
        assert over_envelope(both, rate) == {}

        # Kill the leader: the standby takes over once the lease expires.
        first.process.kill()
        killed_at, killed_wall = time.monotonic(), time.time()
        first.wait(10)
        acquired = await asyncio.to_thread(second.wait_for_event, "leadership_acquired", 20)
        takeover_s = wall_time(acquired) - killed_wall
        # Requests of the old leader's last refills end within the bucket's TTL; the
        # next ones come from the new leader's refills.
        await wait_for(
            lambda: request_times(origin, "paced", since=killed_at + 1.6),
            20,
            what="requests under the new leader",
        )
        resumed_s = request_times(origin, "paced", since=killed_at + 1.6)[0] - killed_at
        await crawl_for(5.0, since=killed_at + resumed_s)
        times = request_times(origin, "paced")
        around_kill = [t for t in times if t >= killed_at - 3]
        print(
            f"take-over: lease taken {takeover_s:.2f} s after the kill, requests again "
            f"after {resumed_s:.2f} s (lease {acquired['lease_ms']} ms); whole run "
            f"{len(times)} requests, busiest windows {window_report(times)}"
        )
        print("bursts around the kill (s after it, requests):", bursts(around_kill, killed_at))
        assert takeover_s < 6.0
        assert resumed_s < 8.0
        assert over_envelope(times, rate) == {}
        assert not first.events("leadership_lost")
        for monitor in (first, second):
            assert not monitor.events("loop_crashed") and not monitor.events("monitoring_error")
    finally:
        stop_all(worker, second, first)
