"""Dependencies that stop answering or lose their data, against the real ``python -m worker``
(and ``python -m crawl_monitor``), with real services on loopback ports.

The oracle (contract): every uuid ends, at least once, in ``image_metadata_updates`` (a
resolution), ``link_rot`` or ``crawl_errors``; a request is made only in a slot the pacer
granted while ``pace_rate:{source}`` held a rate; an offset is committed only once every
message before it is finished.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from crawl_monitor.policy.rates import (
    MAX_IMAGES,
    MAX_RATE_RPS,
    MIN_IMAGES,
    MIN_RATE_RPS,
    compute_crawl_rate,
)
from image_crawler import contract as c
from image_crawler.lifecycle import cancel_and_wait
from test.harness.corpus import good_images
from test.harness.crawl import Gate, Outputs, by_kind, start_sources, worker_env
from test.harness.origin import Origin
from test.harness.processes import CrawlerProcess, committed_offset
from test.harness.services import (
    KafkaBroker,
    RedisServer,
    S3Server,
    create_bucket,
    create_topics,
    list_keys,
    produce,
    read_topic,
    wait_for,
)
from test.harness.windows import max_in_window
from worker.politeness.pacing import PacingSettings

# --- helpers ------------------------------------------------------------------------------


def wall_time(event: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(event["time"]).timestamp()


def events_between(
    process: CrawlerProcess, start: float, end: float, name: str
) -> list[dict[str, Any]]:
    """The events called ``name`` logged between two wall-clock times (Unix seconds)."""
    return [e for e in process.events(name) if start <= wall_time(e) <= end]


def assert_alive_without_traceback(process: CrawlerProcess, pid: int) -> None:
    assert process.process.poll() is None, f"{process.module} exited:\n{process.tail()}"
    assert process.pid == pid
    assert "Traceback" not in process.log_path.read_text(errors="replace"), process.tail(80)


async def offset_is(bootstrap: str, topic: str, offset: int) -> bool:
    return await committed_offset(bootstrap, c.WORKER_GROUP, topic) == offset


# --- 5. a service that stops answering for 30 s -----------------------------------------

PAUSE_S = 30.0  # the figure
SOURCE = "paused"
FAST = 5  # offsets 0-4: finished and committed before the pause
HELD = 20  # offsets 5-24: downloads held at the origin until the service is paused
LATE = 5  # offsets 25-29: produced while the service is away (unless it is the broker)
# The events that say the service is away, and back: (event, its "service" field or None).
OUTAGE_EVENTS = {
    "redis": (("redis_unavailable", None), ("redis_recovered", None)),
    "s3": (("dependency_unavailable", "s3"), ("dependency_recovered", "s3")),
    "kafka": (("dependency_unavailable", "kafka"), ("dependency_recovered", "kafka")),
}


@dataclass
class PausedCrawl:
    """One crawl of SOURCE while ``service`` is stopped, and what it measured."""

    service: str
    paused: Any  # the Service to SIGSTOP
    worker: CrawlerProcess
    gate: Gate
    outputs: Outputs
    bootstrap: str
    origin: Origin
    uuids: list[str]
    late_urls: list[str]
    # (seconds into the pause, committed offset) while the service was away.
    samples: list[tuple[float, int]] = field(default_factory=list)
    late_requests_while_away: int = 0
    noticed_s: float = 0.0  # first "unavailable" event after the pause began
    reported_back_s: float = 0.0  # the "recovered" event after SIGCONT
    resolved_s: float = 0.0  # every uuid resolved, after SIGCONT
    committed_s: float = 0.0  # every offset committed, after SIGCONT
    counted: int = 0  # num_resized at the end

    @property
    def expected(self) -> list[str]:
        return self.uuids if self.service != "kafka" else self.uuids[: FAST + HELD]

    def report(self) -> str:
        offsets = sorted({offset for _, offset in self.samples})
        return (
            f"{self.service} stopped {PAUSE_S:g} s: noticed after {self.noticed_s:.1f} s; "
            f"committed offsets while away {offsets} ({len(self.samples)} samples); "
            f"after SIGCONT: reported back {self.reported_back_s:.2f} s, every uuid resolved "
            f"{self.resolved_s:.2f} s, every offset committed {self.committed_s:.2f} s; "
            f"num_resized {self.counted} for {len(self.expected)} images"
        )


@pytest.mark.parametrize("service", ["redis", "s3", "kafka"])
async def test_a_service_that_stops_answering_for_30_s_stalls_the_crawl_and_loses_nothing(
    service: str, request: pytest.FixtureRequest, kafka: KafkaBroker, origin: Origin, tmp_path: Path
) -> None:
    # The service to stop is this test's own instance; the others may be shared.
    redis_server: RedisServer = request.getfixturevalue(
        "fresh_redis_server" if service == "redis" else "redis_server"
    )
    s3: S3Server = request.getfixturevalue("fresh_s3_server" if service == "s3" else "s3_server")
    if service != "redis":
        redis_server.flushall()
    bucket = f"faults-{service}-{uuid.uuid4().hex[:12]}"
    create_bucket(s3.endpoint_url, bucket)

    image = next(i for i in good_images() if i.content_type == "image/jpeg")
    gate = Gate(image.body)
    held_url = origin.add_handler("/held.jpg", gate)
    urls = [origin.add(f"/fast{i}.jpg", image.body, "image/jpeg") for i in range(FAST)]
    urls += [held_url] * HELD
    late_urls = [origin.add(f"/late{i}.jpg", image.body, "image/jpeg") for i in range(LATE)]
    uuids = [f"u{i:02d}" for i in range(FAST + HELD + LATE)]
    topic = c.source_topic(SOURCE)

    worker = None
    try:
        async with Redis.from_url(redis_server.url, decode_responses=True) as redis:
            await start_sources(redis, kafka, [SOURCE])
        await produce(
            kafka.bootstrap,
            topic,
            [c.SourceTask(url=u, uuid=i).to_json() for u, i in zip(urls, uuids, strict=False)],
        )
        worker = CrawlerProcess(
            "worker", worker_env(kafka, redis_server.url, s3, bucket), tmp_path / "worker.log"
        )
        pid = worker.pid
        async with Outputs(kafka.bootstrap) as outputs:
            await wait_for(lambda: outputs.resolved >= set(uuids[:FAST]), 60, what="fast ones")
            await wait_for(lambda: gate.waiting == HELD, 20, what="the held downloads")
            await wait_for(lambda: offset_is(kafka.bootstrap, topic, FAST), 20, what="commit")
            crawl = PausedCrawl(
                service,
                {"redis": redis_server, "s3": s3, "kafka": kafka}[service],
                worker,
                gate,
                outputs,
                kafka.bootstrap,
                origin,
                uuids,
                late_urls,
            )
            await pause_while_crawling(crawl)

        # Everything completed: every uuid resolved, every thumbnail stored, every outcome
        # in the windows once (counters count at least once: a write that timed out may
        # have been run too), and the same process still running without a traceback.
        expected = crawl.expected
        raw = await read_topic(kafka.bootstrap, c.METADATA_TOPIC, min_messages=len(expected))
        assert set(by_kind(raw)[0]) == set(expected)
        assert list_keys(s3.endpoint_url, bucket) == {f"{u}.jpg" for u in expected}
        async with Redis.from_url(redis_server.url, decode_responses=True) as redis:
            for prefix, _ in c.STATUS_WINDOWS:
                assert await redis.zcard(f"{prefix}{SOURCE}") == len(expected), prefix
            crawl.counted = int(await redis.get(c.num_resized_key(SOURCE)))
        assert crawl.counted >= len(expected)
        print(f"\n{crawl.report()}")
        if service == "redis":
            # No token could be taken while Redis was away: no request either.
            assert crawl.late_requests_while_away == 0
        assert_alive_without_traceback(worker, pid)
        worker.signal(signal.SIGTERM)
        assert await asyncio.to_thread(worker.wait, 30) == 0, worker.tail()
    finally:
        for service_process in (redis_server, s3, kafka):
            if service_process.paused:
                service_process.resume()
        gate.opened.set()
        if worker is not None:
            worker.stop()


async def pause_while_crawling(crawl: PausedCrawl) -> None:
    """SIGSTOP the service with HELD downloads in flight, release them, watch it for
    PAUSE_S, SIGCONT; returns once every message is resolved and committed again."""
    topic = c.source_topic(SOURCE)
    pid = crawl.worker.pid
    crawl.paused.pause()
    paused_at, paused_wall = time.monotonic(), time.time()
    crawl.gate.opened.set()  # the held downloads finish now, and need the service
    if crawl.service != "kafka":
        late = [
            c.SourceTask(url=url, uuid=uuid).to_json()
            for url, uuid in zip(crawl.late_urls, crawl.uuids[FAST + HELD :], strict=True)
        ]
        await produce(crawl.bootstrap, topic, late)
    while (elapsed := time.monotonic() - paused_at) < PAUSE_S:
        assert crawl.worker.process.poll() is None, crawl.worker.tail()
        if crawl.service != "kafka":  # a stopped broker answers no OffsetFetch
            crawl.samples.append((round(elapsed, 1), await committed_now(crawl)))
        await asyncio.sleep(min(2.0, PAUSE_S - elapsed))
    crawl.late_requests_while_away = sum(
        crawl.origin.requests(urlsplit(url).path) for url in crawl.late_urls
    )
    resumed_wall = time.time()
    crawl.paused.resume()
    resumed_at = time.monotonic()

    # Noticed and said while it lasted, by the same process; the held messages (offset
    # 5 on) could not finish, so nothing past them was committed.
    (down, down_service), (back, back_service) = OUTAGE_EVENTS[crawl.service]
    noticed = [
        e
        for e in events_between(crawl.worker, paused_wall, resumed_wall, down)
        if down_service is None or e.get("service") == down_service
    ]
    assert noticed, crawl.worker.tail(60)
    crawl.noticed_s = wall_time(noticed[0]) - paused_wall
    assert crawl.worker.pid == pid and crawl.worker.process.poll() is None
    if crawl.service == "kafka":
        crawl.samples.append((round(time.monotonic() - paused_at, 1), await committed_now(crawl)))
    assert {offset for _, offset in crawl.samples} == {FAST}

    await wait_for(lambda: crawl.outputs.resolved >= set(crawl.expected), 60, what="all resolved")
    crawl.resolved_s = time.monotonic() - resumed_at
    await wait_for(
        lambda: offset_is(crawl.bootstrap, topic, len(crawl.expected)), 60, what="all committed"
    )
    crawl.committed_s = time.monotonic() - resumed_at
    recovered = await wait_for(
        lambda: [
            e
            for e in events_between(crawl.worker, resumed_wall, time.time() + 1, back)
            if back_service is None or e.get("service") == back_service
        ],
        10,
        what=f"a {back} event",
    )
    crawl.reported_back_s = wall_time(recovered[0]) - resumed_wall


async def committed_now(crawl: PausedCrawl) -> int:
    """The committed offset, checked against the outputs: committed means finished."""
    offset = await committed_offset(crawl.bootstrap, c.WORKER_GROUP, c.source_topic(SOURCE))
    assert offset is not None
    # Every message before the offset has its resolution out (read after the offset,
    # so a slow reader cannot make a premature commit look right).
    await wait_for(
        lambda: crawl.outputs.resolved >= set(crawl.uuids[:offset]),
        10,
        what=f"the resolution of every message before committed offset {offset}",
    )
    return offset


# --- 10. Redis loses its data mid-crawl --------------------------------------------------

GOOD, BROKEN = "steady", "broken"
GOOD_RPS, BROKEN_RPS = 3.0, 2.0
GOOD_URLS, BROKEN_URLS = 45, 10
# Polls further apart than this may have missed a refill: that stretch is not judged.
REFILL_POLL_GAP_S = 0.4


def image_count_for(rate_rps: float) -> int:
    """The smallest image count whose computed rate is at least ``rate_rps``."""
    share = (rate_rps - MIN_RATE_RPS) / (MAX_RATE_RPS - MIN_RATE_RPS)
    count = MIN_IMAGES + math.floor(share * (MAX_IMAGES - MIN_IMAGES))
    while compute_crawl_rate(count) < rate_rps:
        count += 1
    return count


def request_times(origin: Origin, prefix: str = "/") -> list[float]:
    return sorted(t for t, path in origin.request_log if path.startswith(prefix))


class Refills:
    """Watches one source's ``pace_rate:`` every 10 ms and notes each time the monitor
    wrote it (a SET with an expiry: the time to live jumps up).

    ``after[i]`` is the last poll before write ``i`` was seen: the write happened after
    it. Polls that fail (Redis restarting) or come late leave ``blind`` stretches where a
    write could hide.
    """

    def __init__(self, redis_url: str, source: str) -> None:
        self._client = Redis.from_url(redis_url, socket_timeout=0.5, socket_connect_timeout=0.5)
        self._key = c.pace_rate_key(source)
        self.after: list[float] = []
        self.blind: list[tuple[float, float]] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Refills:
        self._task = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
        await self._client.aclose()

    async def _watch(self) -> None:
        last_poll, last_ttl = time.monotonic(), -2
        while True:
            try:
                ttl = await self._client.pttl(self._key)
            except RedisError:
                ttl = -2
            now = time.monotonic()
            if now - last_poll > REFILL_POLL_GAP_S:
                self.blind.append((last_poll, now))
            if ttl > 0 and (last_ttl <= 0 or ttl > last_ttl):
                self.after.append(last_poll)
            last_poll, last_ttl = now, ttl
            await asyncio.sleep(0.01)

    def first_after(self, t: float) -> float | None:
        return next((a for a in self.after if a > t), None)


async def lose_data(server: RedisServer, loss: str) -> tuple[float, float, float, float]:
    """FLUSHALL, or a restart of a server without persistence. Returns when it began
    (monotonic and wall clock), when the old data was gone for good (monotonic: FLUSHALL
    answered, or the old server exited; it answers scripts until then), and when the empty
    server was there (wall clock)."""
    began, began_wall = time.monotonic(), time.time()
    if loss == "flushall":
        await asyncio.to_thread(server.flushall)
        gone = time.monotonic()
    else:
        await asyncio.to_thread(server.stop)
        gone = time.monotonic()
        await asyncio.to_thread(server.restart)
    return began, began_wall, gone, time.time()


@pytest.mark.timing(
    "asserts origin request times around the loss (to ~0.1 s) and requests per window"
)
@pytest.mark.parametrize("loss", ["flushall", "restart"])
async def test_redis_losing_its_data_mid_crawl_loses_no_url_and_invents_no_rate(
    loss: str,
    kafka: KafkaBroker,
    fresh_redis_server: RedisServer,
    s3_server: S3Server,
    s3_bucket: str,
    origin: Origin,
    tmp_path: Path,
) -> None:
    image = next(i for i in good_images() if i.content_type == "image/jpeg")
    good = {
        f"g{i:02d}": origin.add(f"/{GOOD}/{i}.jpg", image.body, "image/jpeg")
        for i in range(GOOD_URLS)
    }
    broken = {f"b{i:02d}": origin.add_status(f"/{BROKEN}/{i}.jpg", 500) for i in range(BROKEN_URLS)}
    await create_topics(kafka.bootstrap, [c.INBOUND_TOPIC])
    await produce(
        kafka.bootstrap,
        c.INBOUND_TOPIC,
        [
            c.InboundImage(url=url, uuid=uuid, source=source).to_json()
            for source, urls in ((GOOD, good), (BROKEN, broken))
            for uuid, url in urls.items()
        ],
    )
    redis_url = fresh_redis_server.url
    sources = tmp_path / "sources.json"
    sources.write_text(
        json.dumps(
            [
                {"source_name": GOOD, "image_count": image_count_for(GOOD_RPS)},
                {"source_name": BROKEN, "image_count": image_count_for(BROKEN_RPS)},
            ]
        )
    )
    monitor_env = {**kafka.env, "REDIS_URL": redis_url, "SOURCES_FILE": str(sources)}
    # A share of 10 per source: most URLs wait in Kafka, so the crawl finishes only if the
    # worker goes on taking work after the loss.
    env = worker_env(kafka, redis_url, s3_server, s3_bucket, MAX_TASKS=20)
    monitor = CrawlerProcess("crawl_monitor", monitor_env, tmp_path / "monitor.log")
    worker = CrawlerProcess("worker", env, tmp_path / "worker.log")
    pids = (monitor.pid, worker.pid)
    try:
        async with Outputs(kafka.bootstrap) as outputs, Refills(redis_url, GOOD) as refills:
            # Crawling, and the broken source's breaker has tripped.
            await wait_for(lambda: len(outputs.resolved) >= 9, 90, what="9 resolved")
            await wait_for(
                lambda: [e for e in monitor.events("crawl_halted") if e["source"] == BROKEN],
                30,
                what="the broken source halted",
            )
            async with Redis.from_url(redis_url, decode_responses=True) as redis:
                counted_before = int(await redis.get(c.num_resized_key(GOOD)) or 0)
            assert counted_before > 0

            lost_at, lost_wall, gone_at, empty_wall = await lose_data(fresh_redis_server, loss)
            # No rate, no request: once the slots granted before the loss (at most the
            # pacing horizon ahead) have started, nothing may go out until the monitor
            # writes a rate again.
            refill = await wait_for(lambda: refills.first_after(lost_at), 30, what="a refill")
            granted_before = gone_at + PacingSettings().horizon_s + 0.05
            in_gap = [t for t in request_times(origin) if granted_before < t < refill]
            assert in_gap == [], f"{len(in_gap)} requests without a rate to be had"

            # Every URL of the healthy source finishes: none is lost or left waiting.
            await wait_for(
                lambda: outputs.resolved >= set(good), 60, what="every healthy URL resolved"
            )
            done = time.monotonic()
            # The breakers work again: the broken source, un-halted by the loss, trips anew.
            retrip = await wait_for(
                lambda: [
                    e
                    for e in monitor.events("crawl_halted")
                    if e["source"] == BROKEN and wall_time(e) > lost_wall
                ],
                30,
                what="the broken source halted again",
            )
            assert retrip[0]["type"] == "temporary"
            good_times = request_times(origin, f"/{GOOD}/")

        async with Redis.from_url(redis_url, decode_responses=True) as redis:
            assert await redis.smembers(c.TEMP_HALTED_SET) == {BROKEN}
            # Counters and windows restarted from zero: exactly the outcomes since the loss.
            counted = int(await redis.get(c.num_resized_key(GOOD)))
            # A worker counts an image after its resolution is sent: one sent once the
            # empty server was there is counted in the new data; one sent before may
            # have been counted in the lost data or not (the reader cannot tell).
            sent_after_loss = len(
                {
                    o.uuid
                    for o in outputs.records
                    if o.topic == c.METADATA_TOPIC and o.time_ms / 1000 > empty_wall
                }
            )
            assert sent_after_loss <= counted <= GOOD_URLS - counted_before
            for prefix, _ in c.STATUS_WINDOWS:
                assert await redis.zcard(f"{prefix}{GOOD}") == counted, prefix
            assert await redis.lrange(c.last50_key(GOOD), 0, -1) == ["200"] * min(50, counted)

        # Paced throughout, the loss included: no catch-up after it (the next slot was
        # lost with the data, and starts again from Redis' clock).
        assert len(good_times) == GOOD_URLS  # one request each, no retry
        busiest = {w: max_in_window(good_times, w) for w in (0.5, 1.0, 2.0, 4.0)}
        assert all(n <= GOOD_RPS * w + 1 for w, n in busiest.items()), busiest
        resumed = next(t for t in good_times if t > lost_at)
        print(
            f"\n{loss}: first rate written {refill - lost_at:.2f} s after the loss, crawling "
            f"again {resumed - lost_at:.2f} s after, all done {done - lost_at:.1f} s after; "
            f"busiest windows {busiest} at {GOOD_RPS:g}/s; counted {counted} of {GOOD_URLS} "
            f"(before: {counted_before}, sent after the loss: {sent_after_loss})"
        )
        for process, pid in zip((monitor, worker), pids, strict=True):
            assert_alive_without_traceback(process, pid)
            process.signal(signal.SIGTERM)
        for process in (monitor, worker):
            assert await asyncio.to_thread(process.wait, 30) == 0, process.tail()
    finally:
        monitor.stop()
        worker.stop()
