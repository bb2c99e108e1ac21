"""``python -m worker``: one worker process.

Every client is built here, once, entered through one ``AsyncExitStack`` and passed to the
parts that use it. SIGTERM or SIGINT stops taking work, lets in-flight work finish for
``SHUTDOWN_GRACE_S`` (handing back the rest), commits, flushes and exits 0.

With ``METRICS_PORT`` set, ``/metrics`` and ``/healthz`` (worker/health.py) are served
from the start to the end of the process, its drain included.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
from collections.abc import AsyncIterator, Coroutine
from typing import Any, Final

import prometheus_client
import yarl
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from redis.asyncio import Redis

from image_crawler.contract import (
    CRAWL_ERRORS_TOPIC,
    WORKER_GROUP,
    MalformedMessage,
    SourceTask,
    Status,
)
from image_crawler.lifecycle import cancel_and_wait, serve, start_kafka_clients
from image_crawler.logs import get_logger
from image_crawler.metrics import serving
from image_crawler.retry import sleep_unless_stopped
from worker.download.budget import ByteBudget
from worker.download.dns import CachingResolver
from worker.download.dns_report import DnsReporter
from worker.download.fetch import Fetcher, close_session, new_session
from worker.health import WorkerHealth
from worker.images.pool import PoolProcessor
from worker.metrics import DNS_NAMES_CACHED, IMAGE_POOL_QUEUE, TASK_SLOTS, TASKS_IN_FLIGHT
from worker.pipeline import Pipeline, RetryPolicy
from worker.politeness.pacing import PacingSettings, RedisPacer
from worker.politeness.robots import RobotsGuard
from worker.scheduler import Scheduler, SchedulerSettings
from worker.settings import WorkerSettings
from worker.sinks.base import DEPENDENCY_STATES, ThumbnailStore
from worker.sinks.kafka import KafkaSink
from worker.sinks.local import LocalThumbnailStore
from worker.sinks.s3 import SignedS3Store
from worker.stats import RedisStats

log = get_logger("worker")

# A fetch names every unpaused partition, and aiokafka encodes and decodes each in Python:
# with many sources, most with nothing queued, frequent long polls of hundreds of empty
# partitions would cost the main process more than its images. A partition resumed
# during a long poll waits for it to end, up to this long (Kafka ends a long poll as soon
# as one of the partitions it names has data).
CONSUMER_FETCH_MAX_WAIT_MS: Final = 2000
# The cyclic garbage collector's first threshold (Python's default: 700). Each image makes
# hundreds of short-lived futures, tasks and handles; at 700 the collector ran about 25
# times a second and moved what was still alive on to older generations, whose collections
# walk every object of the process (OpenCV's and numpy's included): about 0.07 ms of the
# main process's CPU per image, three quarters of it saved by collecting the youngest
# objects a few times less often and leaving those of the imports out (``gc.freeze``).
# Garbage in a cycle (on Python 3.11 every closed connection's transport: cpython#100348,
# fixed in 3.12) lives about a second at most. Higher thresholds (50,000 and 20) halve a
# long tail's collections, but a one-host crawl's process grew with them to twice its
# size (bench/README.md, "Long-tail figures"): not used until that is understood.
GC_FIRST_THRESHOLD: Final = 10_000
# Host names whose IDNA decoding yarl keeps (``URL.host``; its default: 256). A URL's host
# is read a few times on its way (its politeness key, the address check of each request,
# its robots.txt origin), and yarl decodes even an ASCII name in pure Python (14 us):
# on a long tail of new hosts, a few hundred in flight at once, the default kept too few,
# and each image paid 0.056 ms of the worker's CPU for it (py-spy, 6,000 hosts).
# About 200 bytes a name: 3 MB.
URL_HOSTS_DECODED: Final = 16_384
# The consumer's fetcher also wakes this often with nothing to do, and walks every
# assigned partition, though every event it acts on (records consumed, a resume, a seek,
# a fetch's end, a rebalance) wakes it anyway: rarely is enough for the rest.
CONSUMER_IDLE_WAKE_MS: Final = 1000
# Redis connections of one worker: its tasks' commands queue for them beyond this (a
# worker with 1,000 new hosts at once needed more than redis-py's default of 100).
REDIS_POOL_SIZE: Final = 256


@contextlib.asynccontextmanager
async def _background(*coroutines: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    """Run ``coroutines`` as tasks for the duration of the block, then cancel them."""
    tasks = [asyncio.create_task(c) for c in coroutines]
    try:
        yield
    finally:
        await cancel_and_wait(tasks)


async def run(settings: WorkerSettings, stop: asyncio.Event) -> None:
    """Run one worker until ``stop`` is set.

    Shutting down runs in the reverse of building: the scheduler drains and commits, the
    background loops stop, then each client closes, the Kafka producer and Redis last.
    """
    async with contextlib.AsyncExitStack() as stack:
        health = WorkerHealth(stop)
        await stack.enter_async_context(
            serving(
                settings.metrics.port,
                settings.metrics.host,
                port_last=settings.metrics.port_last,
                health=health.problems,
            )
        )
        # Connections wait for each other rather than fail: see RedisSettings.client.
        redis = settings.redis.client(decode_responses=True, pool_size=REDIS_POOL_SIZE)
        stack.push_async_callback(redis.aclose)
        producer, consumer = _kafka_clients(settings, stack)
        started = await start_kafka_clients(
            [("producer", producer.start), ("consumer", consumer.start)], stop
        )
        if not started:
            return
        store, destination = await _thumbnail_store(settings, stack)
        parts = _build_pipeline(settings, stack, redis, producer, store)
        scheduler = _build_scheduler(settings, consumer, redis, parts)
        _export_gauges(settings, scheduler, parts)
        _log_started(settings, destination)
        health.running()
        background = (parts.pacer.run(), parts.stats.run(), parts.dns.run())
        async with _background(*background, _report(scheduler, stop)):
            await scheduler.run(stop)
    log.info("worker_stopped", finished=scheduler.finished)


def _kafka_clients(
    settings: WorkerSettings, stack: contextlib.AsyncExitStack
) -> tuple[AIOKafkaProducer, AIOKafkaConsumer]:
    """The producer and the consumer, not started; each stopped when ``stack`` closes."""
    producer = AIOKafkaProducer(
        **settings.kafka.producer_options(), acks="all", linger_ms=settings.producer_linger_ms
    )
    stack.push_async_callback(producer.stop)  # flushes what is still buffered
    consumer = AIOKafkaConsumer(
        **settings.kafka.client_options(),
        group_id=WORKER_GROUP,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=256 * 1024,
        fetch_max_wait_ms=CONSUMER_FETCH_MAX_WAIT_MS,
        consumer_timeout_ms=CONSUMER_IDLE_WAKE_MS,
        max_poll_interval_ms=int(settings.kafka_max_poll_interval_s * 1000),
        group_instance_id=settings.kafka_group_instance_id,
        session_timeout_ms=int(settings.kafka_session_timeout_s * 1000),
        # Kafka's advice: a heartbeat at most a third of the session timeout.
        heartbeat_interval_ms=min(3000, int(settings.kafka_session_timeout_s * 1000 / 3)),
    )
    stack.push_async_callback(consumer.stop)
    return producer, consumer


async def _thumbnail_store(
    settings: WorkerSettings, stack: contextlib.AsyncExitStack
) -> tuple[ThumbnailStore, str]:
    """The thumbnail store of the settings, and where it writes (for the log)."""
    if settings.thumbnails.store == "local":
        directory = settings.thumbnails.directory
        return LocalThumbnailStore(directory), str(directory.resolve())
    s3 = await SignedS3Store.open(settings.s3)
    stack.push_async_callback(s3.close)
    return s3, f"s3://{settings.s3.bucket}"


@dataclasses.dataclass(frozen=True, slots=True)
class _Parts:
    """The pipeline, and the loops beside it that must run for it to make progress."""

    pipeline: Pipeline
    pacer: RedisPacer
    stats: RedisStats
    processor: PoolProcessor
    dns: DnsReporter


def _build_pipeline(
    settings: WorkerSettings,
    stack: contextlib.AsyncExitStack,
    redis: Redis,
    producer: AIOKafkaProducer,
    store: ThumbnailStore,
) -> _Parts:
    """A URL's way from its slot to its results; each part closed when ``stack`` closes."""
    policy = settings.fetch.address_policy
    resolver = CachingResolver(settings.dns)
    http = new_session(settings.fetch, policy, resolver=resolver)
    stack.push_async_callback(close_session, http)
    # Its figures for operators; deleted as the worker stops, before Redis closes.
    dns = DnsReporter(redis, resolver)
    stack.push_async_callback(dns.close)
    processor = PoolProcessor(settings.image_processes)
    stack.callback(processor.close)
    pacer = RedisPacer(
        redis, PacingSettings(no_rate_retry_s=settings.token_retry_s), settings.hosts
    )
    stack.callback(pacer.close)
    stats = RedisStats(redis)
    fetcher = Fetcher(
        http,
        settings.fetch,
        policy,
        ByteBudget(settings.fetch.max_bytes_in_flight),
        token=settings.robots.token,
    )
    robots = RobotsGuard(
        redis, fetcher, pacer, settings.robots, pacing_key=settings.hosts.pacing_key
    )
    stack.callback(robots.close)
    pipeline = Pipeline(
        pacer=pacer,
        fetcher=fetcher,
        processor=processor,
        store=store,
        sink=KafkaSink(producer),
        stats=stats,
        retries=RetryPolicy(
            max_attempts=settings.max_attempts, max_retry_after_s=settings.max_retry_after_s
        ),
        rate_limit_timeout_s=settings.rate_limit_timeout_s,
        robots=robots,
        pacing_key=settings.hosts.pacing_key,
        encoding=settings.encoding,
    )
    return _Parts(pipeline, pacer, stats, processor, dns)


def _build_scheduler(
    settings: WorkerSettings, consumer: AIOKafkaConsumer, redis: Redis, parts: _Parts
) -> Scheduler:
    """The scheduler feeding the pipeline; a message whose handling raised is
    dead-lettered, and URLs wait for their hosts by what the pacer last heard of them."""
    pipeline = parts.pipeline

    async def dead_letter(source: str, raw: bytes | None, topic: str, error: BaseException) -> None:
        try:
            task = SourceTask.from_json(raw or b"")
        except MalformedMessage:
            await pipeline.reject(raw, f"InternalError: {error!r}", topic)
        else:
            await pipeline.dead_letter(source, task, Status.INTERNAL_ERROR)

    return Scheduler(
        consumer,
        redis,
        pipeline.handle,
        dead_letter,
        SchedulerSettings(
            max_tasks=settings.max_tasks,
            sources_poll_s=settings.sources_poll_s,
            commit_interval_s=settings.commit_interval_s,
            shutdown_grace_s=settings.shutdown_grace_s,
            hosts=settings.waiting,
            copy_window_s=settings.copy_window_s,
        ),
        host_of=pipeline.host_key,
        interval_of=parts.pacer.interval_of,
        park=pipeline.park,
    )


def _export_gauges(settings: WorkerSettings, scheduler: Scheduler, parts: _Parts) -> None:
    """The gauges read from the parts at scrape time (nothing to keep up to date), and
    the dependencies exported as up before any outage."""
    TASK_SLOTS.set(settings.max_tasks)
    TASKS_IN_FLIGHT.set_function(lambda: scheduler.in_flight)
    processor = parts.processor
    IMAGE_POOL_QUEUE.set_function(lambda: processor.queued)
    DNS_NAMES_CACHED.set_function(lambda: parts.dns.figures().cached)
    store = "local_store" if settings.thumbnails.store == "local" else "s3"
    DEPENDENCY_STATES.known("kafka", "redis", store)


def _log_started(settings: WorkerSettings, destination: str) -> None:
    log.info(
        "worker_started",
        kafka=settings.kafka.bootstrap_servers,
        max_tasks=settings.max_tasks,
        max_poll_interval_s=settings.kafka_max_poll_interval_s,
        fetch_total_timeout_s=settings.fetch.total_timeout_s,
        allowed_private_networks=[str(n) for n in settings.fetch.allowed_private_networks],
        image_processes=settings.image_processes or "cpu_count",
        thumbnail_store=settings.thumbnails.store,
        thumbnails=destination,
        dead_letter_topic=CRAWL_ERRORS_TOPIC,
        user_agent=settings.fetch.user_agent,
        max_attempts=settings.max_attempts,
        robots_policy=settings.robots.policy,
        robots_user_agent=settings.robots.token,
        dns_servers=list(settings.dns.servers) or "resolv.conf",
    )


async def _report(scheduler: Scheduler, stop: asyncio.Event, interval_s: float = 30.0) -> None:
    last = 0
    while not stop.is_set():
        await sleep_unless_stopped(stop, interval_s)
        log.info(
            "worker_progress",
            finished=scheduler.finished,
            finished_per_s=round((scheduler.finished - last) / interval_s, 2),
            sources=len(scheduler.sources),
            share=scheduler.share(),
        )
        last = scheduler.finished


def keep_decoded_hosts() -> None:
    """Have yarl keep the last ``URL_HOSTS_DECODED`` host names it decoded."""
    yarl.cache_configure(idna_decode_size=URL_HOSTS_DECODED)


def main() -> None:
    # No ``*_created`` series: in the text format each would be one more series per
    # source and status, for a timestamp nobody queries (counters reset at a restart
    # anyway, which Prometheus' rate() handles).
    prometheus_client.disable_created_metrics()
    gc.collect()
    gc.freeze()  # what the imports made lives as long as the process: never walked again
    gc.set_threshold(GC_FIRST_THRESHOLD, *gc.get_threshold()[1:])
    keep_decoded_hosts()
    serve("worker", WorkerSettings.from_env, run)


if __name__ == "__main__":
    main()
