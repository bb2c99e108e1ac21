"""The tools of a whole crawl in tests: the processes' environment and sources, origin
handlers, the outputs the workers publish, and a monitor with workers on loopback services.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import threading
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Self

from aiohttp import web
from aiokafka import AIOKafkaConsumer
from PIL import Image
from redis.asyncio import Redis

from image_crawler import contract as c
from image_crawler.lifecycle import cancel_and_wait
from test.harness.processes import CrawlerProcess
from test.harness.services import create_topics, produce, wait_for

# --- the processes' environment and sources ------------------------------------------------

# Requests/s: fast enough that pacing never holds these crawls up.
RATE = 1000.0


def worker_env(kafka, redis_url, s3_server, bucket, **extra) -> dict[str, str]:
    env = {
        **kafka.env,
        "REDIS_URL": redis_url,
        **s3_server.env,
        "S3_BUCKET": bucket,
        "MAX_TASKS": "100",
        "IMAGE_PROCESSES": "2",
        "SOURCES_POLL_S": "0.2",
        "COMMIT_INTERVAL_S": "0.2",
        "TOKEN_RETRY_S": "0.1",
        "SHUTDOWN_GRACE_S": "5",
        # The origin listens on 127.0.0.1: exempt exactly that address, nothing else.
        "ALLOWED_PRIVATE_NETWORKS": "127.0.0.1/32",
    }
    env.update({k: str(v) for k, v in extra.items()})
    return env


async def start_sources(redis, kafka, sources, *, rate=RATE, partitions=1):
    await create_topics(
        kafka.bootstrap, [c.source_topic(s) for s in sources], partitions=partitions
    )
    for source in sources:
        if rate:
            await redis.set(c.pace_rate_key(source), repr(rate))
    await redis.sadd(c.INBOUND_SOURCES_SET, *sources)


def sources_file(tmp_path: Path, **image_counts: int) -> str:
    path = tmp_path / "sources.json"
    path.write_text(
        json.dumps([{"source_name": n, "image_count": k} for n, k in image_counts.items()])
    )
    return str(path)


# --- the origin -----------------------------------------------------------------------------


def tiny_jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (48, 32), (200, 120, 40)).save(out, "JPEG", quality=80)
    return out.getvalue()


class Gate:
    """An origin route that holds every request until the test opens it."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.opened = threading.Event()
        self.waiting = 0

    async def __call__(self, request: web.Request) -> web.Response:
        self.waiting += 1
        # Opened from the test's thread, so a threading.Event polled here, not an asyncio one.
        while not self.opened.is_set():  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        return web.Response(body=self.body, content_type="image/jpeg")


class Capacity:
    """Serves at most ``capacity_rps`` images in any second and answers 503 beyond."""

    def __init__(self, body: bytes, capacity_rps: float) -> None:
        self.body = body
        self.capacity_rps = capacity_rps
        self._served: deque[float] = deque()
        self.refused: list[float] = []  # monotonic times of the 503s

    async def __call__(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        while self._served and self._served[0] <= now - 1.0:
            self._served.popleft()
        if len(self._served) >= self.capacity_rps:
            self.refused.append(now)
            return web.Response(status=503, text="over capacity\n")
        self._served.append(now)
        return web.Response(body=self.body, content_type="image/jpeg")


# --- what the crawl published ---------------------------------------------------------------

OUTPUT_TOPICS = (c.METADATA_TOPIC, c.LINK_ROT_TOPIC, c.CRAWL_ERRORS_TOPIC, c.LINK_CHECKS_TOPIC)
# A test's own message on the output topics (see ``Outputs.sync``); no crawler output has it.
MARKER = "test_marker"

# The keys of the original README's example ``monitoring_update`` event.
GENERAL_KEYS = {
    "global_max_rps",
    "error_rps",
    "processing_rate",
    "success_rps",
    "circuit_breaker_tripped",
    "num_resized",
    "resize_errors",
    "split_rate",
}
SPECIFIC_KEYS = {"successful", "last_50_statuses", "rate_limit", "error"}
# Beyond the original: the pacing of each source.
PACING_KEYS = {"effective_rate", "pacing", "pacing_why"}


def by_kind(raw_messages):
    resolutions, exifs = {}, {}
    for raw in raw_messages:
        message = json.loads(raw)
        if "exif" in message:
            exifs[message["identifier"]] = c.ExifMessage.from_json(raw)
        else:
            resolutions[message["identifier"]] = c.ResolutionMessage.from_json(raw)
    return resolutions, exifs


@dataclasses.dataclass(frozen=True, slots=True)
class Output:
    topic: str
    uuid: str
    time_ms: int  # when the worker published it (the record's create time)
    message: dict[str, Any]


class Outputs:
    """Every record of the output topics, read as they arrive by one group-less consumer."""

    def __init__(self, bootstrap: str) -> None:
        self._bootstrap = bootstrap
        self.opened_ms = int(time.time() * 1000)
        self.records: list[Output] = []
        self.first_ms: dict[str, int] = {}
        self._markers: dict[str, int] = {}
        self._markers_sent = 0
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        await create_topics(self._bootstrap, OUTPUT_TOPICS)
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await self._consumer.start()
        self._consumer.subscribe(list(OUTPUT_TOPICS))
        self._task = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._task is not None and self._consumer is not None
        await cancel_and_wait([self._task])
        await self._consumer.stop()

    async def _read(self) -> None:
        assert self._consumer is not None
        while True:
            batches = await self._consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for record in records:
                    self._add(record.topic, record.value, record.timestamp)

    async def sync(self) -> None:
        """Return once every output published so far has been read: a marker is produced to
        each output topic (one partition each) after them and waited for."""
        self._markers_sent += 1
        marker = json.dumps({MARKER: self._markers_sent}).encode()
        for topic in OUTPUT_TOPICS:
            await produce(self._bootstrap, topic, [marker])
        await wait_for(
            lambda: all(self._markers.get(t) == self._markers_sent for t in OUTPUT_TOPICS),
            30,
            what="the output markers",
        )

    def _add(self, topic: str, value: bytes, time_ms: int) -> None:
        message = json.loads(value)
        if MARKER in message:
            self._markers[topic] = message[MARKER]
            return
        uuid = message.get("identifier")
        if uuid is None or (topic == c.METADATA_TOPIC and "exif" in message):
            return
        self.records.append(Output(topic, uuid, time_ms, message))
        self.first_ms[uuid] = min(time_ms, self.first_ms.get(uuid, time_ms))

    def uuids(self) -> set[str]:
        return set(self.first_ms)

    @property
    def resolved(self) -> set[str]:
        """The uuids with a resolution message."""
        return {o.uuid for o in self.records if o.topic == c.METADATA_TOPIC}

    def count(self, topic: str) -> Counter[str]:
        return Counter(o.uuid for o in self.records if o.topic == topic)

    def of(self, uuid: str) -> list[Output]:
        return [o for o in self.records if o.uuid == uuid]


# --- a monitor and workers ------------------------------------------------------------------

# Partitions of each source's topic in a ``Crawl``: its workers share them evenly.
PARTITIONS = 4


class Crawl:
    """A monitor and workers on sources whose URLs all point at ``origin``."""

    def __init__(self, kafka: Any, redis_url: str, tmp_path: Path) -> None:
        self.kafka = kafka
        self.redis_url = redis_url
        self.tmp_path = tmp_path
        self.monitor: CrawlerProcess | None = None
        self.workers: list[CrawlerProcess] = []

    async def queue(self, redis: Redis, source: str, rate_rps: float, urls: Sequence[str]) -> None:
        """The source's URLs straight into its queue (as the splitter would), at a rate."""
        topic = c.source_topic(source)
        await create_topics(self.kafka.bootstrap, [topic], partitions=PARTITIONS)
        tasks = [
            c.SourceTask(url=url, uuid=f"{source}-{i}").to_json() for i, url in enumerate(urls)
        ]
        await produce(self.kafka.bootstrap, topic, tasks)
        await redis.set(f"{c.OVERRIDE_RATE_PREFIX}{source}", repr(rate_rps))
        await redis.sadd(c.INBOUND_SOURCES_SET, source)

    async def queue_more(self, source: str, urls: Sequence[str], first_index: int) -> None:
        """More URLs for a source already queued; uuids go on from ``first_index``."""
        tasks = [
            c.SourceTask(url=url, uuid=f"{source}-{first_index + i}").to_json()
            for i, url in enumerate(urls)
        ]
        await produce(self.kafka.bootstrap, c.source_topic(source), tasks)

    async def start(self, redis: Redis, sources: Sequence[str], workers: int, **extra: Any) -> None:
        """The monitor, then ``workers`` workers; returns once each worker holds its share
        of every source's partitions (no rebalance left to come)."""
        env = {**self.kafka.env, "REDIS_URL": self.redis_url}
        counts = dict.fromkeys(sources, 10**6)
        monitor_env = {**env, "SOURCES_FILE": sources_file(self.tmp_path, **counts)}
        self.monitor = CrawlerProcess("crawl_monitor", monitor_env, self.tmp_path / "monitor.log")
        await wait_for(
            lambda: redis.exists(*[c.pace_rate_key(s) for s in sources]),
            30,
            what="the monitor's first rates",
        )
        await self.add_workers(sources, workers, **extra)

    async def add_workers(self, sources: Sequence[str], workers: int, **extra: Any) -> None:
        """Start ``workers`` workers; returns once each holds its share of every source's
        partitions."""
        env = {**self.kafka.env, "REDIS_URL": self.redis_url}
        worker_env = {
            **env,
            "THUMBNAIL_STORE": "local",
            "THUMBNAIL_DIR": str(self.tmp_path / "thumbnails"),
            "MAX_TASKS": "300",
            "IMAGE_PROCESSES": "1",
            "SOURCES_POLL_S": "0.2",
            "COMMIT_INTERVAL_S": "0.5",
            "TOKEN_RETRY_S": "0.1",
            "SHUTDOWN_GRACE_S": "5",
            "ALLOWED_PRIVATE_NETWORKS": "127.0.0.1/32",
            **{k: str(v) for k, v in extra.items()},
        }
        started = [
            CrawlerProcess(
                "worker", worker_env, self.tmp_path / f"worker{len(self.workers) + i}.log"
            )
            for i in range(workers)
        ]
        self.workers.extend(started)
        topics = [c.source_topic(s) for s in sources]
        await wait_for(
            lambda: all(_holds_share(w, topics, workers) for w in started),
            90,
            interval_s=0.2,
            what="every worker holding its share of every source",
        )

    def events(self, name: str) -> list[dict[str, Any]]:
        processes = [self.monitor, *self.workers] if self.monitor else self.workers
        return [e for p in processes for e in p.events(name)]

    def stop(self) -> None:
        for process in [*self.workers, self.monitor]:
            if process is not None:
                process.stop()


class Backlog:
    """A source's URLs, queued as its crawl takes them rather than all up front.

    While ``kept`` is open, there are at least ``ahead`` URLs the origin has not been asked
    for yet (checked every ``every_s``): a backlog throughout whatever the crawl's pace,
    and, once it is closed, only about ``ahead`` left for the test to wait out, where a
    list sized for the slowest pace leaves minutes of URLs to crawl after the measuring.
    ``ahead`` must outlast ``every_s`` at the source's rate by far, so that the worker's
    queue never runs dry between two top-ups.
    """

    def __init__(self, crawl: Crawl, origin: Any, source: str, handler: Any, ahead: int) -> None:
        self._crawl, self._origin, self.source = crawl, origin, source
        self._handler, self.ahead = handler, ahead
        self.urls: list[str] = []

    def _more(self, count: int) -> list[str]:
        first = len(self.urls)
        more = [
            self._origin.add_handler(f"/{self.source}/{i}.jpg", self._handler)
            for i in range(first, first + count)
        ]
        self.urls.extend(more)
        return more

    async def queue(self, redis: Redis, rate_rps: float) -> None:
        """The first ``ahead`` URLs, as ``Crawl.queue`` does, at a rate."""
        await self._crawl.queue(redis, self.source, rate_rps, self._more(self.ahead))

    def requested(self) -> int:
        """How many of the URLs the origin has been asked for, at least once."""
        prefix = f"/{self.source}/"
        return len({path for _, path in self._origin.request_log if path.startswith(prefix)})

    async def top_up(self) -> None:
        missing = self.requested() + self.ahead - len(self.urls)
        if missing > 0:
            first = len(self.urls)
            await self._crawl.queue_more(self.source, self._more(missing), first)

    @contextlib.asynccontextmanager
    async def kept(self, every_s: float = 1.0) -> AsyncIterator[None]:
        # Stopped between top-ups, never cancelled inside one: a top-up cancelled mid-send
        # left URLs in ``urls`` (so in ``uuids``) that never reached the topic, and a test
        # waiting for them all to be crawled timed out (seen once in a suite run).
        stop = asyncio.Event()

        async def keep() -> None:
            while not stop.is_set():
                await self.top_up()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), every_s)

        task = asyncio.create_task(keep())
        try:
            yield
        finally:
            stop.set()
            await task

    def uuids(self) -> set[str]:
        return {f"{self.source}-{i}" for i in range(len(self.urls))}


def _holds_share(worker: CrawlerProcess, topics: Sequence[str], workers: int) -> bool:
    assigned = worker.events("partitions_assigned")
    if not assigned:
        return False
    names = assigned[-1].get("topic_partitions", [])
    return all(sum(n.startswith(f"{t}:") for n in names) == PARTITIONS // workers for t in topics)
