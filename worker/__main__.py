"""``python -m worker``: one worker process.

Every client is built here, once, entered through one ``AsyncExitStack`` and passed to the
parts that use it. SIGTERM or SIGINT stops taking work, lets in-flight work finish for
``SHUTDOWN_GRACE_SECONDS`` (handing back the rest), commits, flushes and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from image_crawler.contract import (
    CRAWL_ERRORS_TOPIC,
    WORKER_GROUP,
    MalformedMessage,
    SourceTask,
    Status,
)
from image_crawler.lifecycle import cancel_and_wait, serve, start_kafka_clients
from image_crawler.logs import get_logger
from worker.download.budget import ByteBudget
from worker.download.fetch import Fetcher, close_session, new_session
from worker.images.pool import PoolProcessor
from worker.pipeline import Pipeline, RetryPolicy
from worker.politeness.pacing import PacingSettings, RedisPacer
from worker.politeness.robots import RobotsGuard
from worker.scheduler import Scheduler, SchedulerSettings
from worker.settings import WorkerSettings
from worker.sinks.base import ThumbnailStore
from worker.sinks.kafka import KafkaSink
from worker.sinks.local import LocalThumbnailStore
from worker.sinks.s3 import SignedS3Store
from worker.stats import RedisStats

log = get_logger("worker")


@contextlib.asynccontextmanager
async def _background(*coroutines: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    """Run ``coroutines`` as tasks for the duration of the block, then cancel them."""
    tasks = [asyncio.create_task(c) for c in coroutines]
    try:
        yield
    finally:
        await cancel_and_wait(tasks)


async def run(settings: WorkerSettings, stop: asyncio.Event) -> None:
    """Run one worker until ``stop`` is set."""
    async with contextlib.AsyncExitStack() as stack:
        redis = settings.redis.client(decode_responses=True)
        stack.push_async_callback(redis.aclose)

        # A 20 ms linger: a busy worker sends one request per partition every 20 ms rather
        # than many small ones; a task waits that long at most, once, for its messages.
        producer = AIOKafkaProducer(**settings.kafka.client_options(), acks="all", linger_ms=20)
        stack.push_async_callback(producer.stop)  # flushes what is still buffered

        consumer = AIOKafkaConsumer(
            **settings.kafka.client_options(),
            group_id=WORKER_GROUP,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=256 * 1024,
            # A fetch names every unpaused partition, and aiokafka encodes and decodes each
            # in Python: with 1,000 sources, most with nothing queued, a long poll of
            # ~640 empty partitions every 0.5 s (the default) cost ~0.4 ms of the main
            # process per image (bench/). A partition resumed during a long poll waits for
            # it to end, up to this long (Kafka ends a long poll as soon as one of the
            # partitions it names has data).
            fetch_max_wait_ms=2000,
            # The fetcher also wakes this often with nothing to do, and walks every
            # assigned partition (~2 ms with 1,000): 5 times a second by default, though
            # every event it acts on (records consumed, a resume, a seek, a fetch's end,
            # a rebalance) wakes it anyway. Once a second is enough for the rest.
            consumer_timeout_ms=1000,
            max_poll_interval_ms=int(settings.kafka_max_poll_interval_s * 1000),
        )
        stack.push_async_callback(consumer.stop)
        started = await start_kafka_clients(
            [("producer", producer.start), ("consumer", consumer.start)], stop
        )
        if not started:
            return

        store: ThumbnailStore
        if settings.thumbnails.store == "local":
            store = LocalThumbnailStore(settings.thumbnails.directory)
            destination = str(settings.thumbnails.directory.resolve())
        else:
            s3 = await SignedS3Store.open(settings.s3)
            stack.push_async_callback(s3.close)
            store = s3
            destination = f"s3://{settings.s3.bucket}"
        policy = settings.fetch.address_policy
        http = new_session(settings.fetch, policy)
        stack.push_async_callback(close_session, http)
        processor = PoolProcessor(settings.image_processes)
        stack.callback(processor.close)

        pacer = RedisPacer(redis, PacingSettings(no_rate_retry_s=settings.token_retry_s))
        stack.callback(pacer.close)
        stats = RedisStats(redis)
        fetcher = Fetcher(
            http, settings.fetch, policy, ByteBudget(settings.fetch.max_bytes_in_flight)
        )
        robots = RobotsGuard(redis, fetcher, pacer, settings.robots)
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
        )

        async def dead_letter(
            source: str, raw: bytes | None, topic: str, error: BaseException
        ) -> None:
            try:
                task = SourceTask.from_json(raw or b"")
            except MalformedMessage:
                await pipeline.reject(raw, f"InternalError: {error!r}", topic)
            else:
                await pipeline.dead_letter(source, task, Status.INTERNAL_ERROR)

        scheduler = Scheduler(
            consumer,
            redis,
            pipeline.handle,
            dead_letter,
            SchedulerSettings(
                max_tasks=settings.max_tasks,
                sources_poll_s=settings.sources_poll_s,
                commit_interval_s=settings.commit_interval_s,
                shutdown_grace_s=settings.shutdown_grace_s,
            ),
        )
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
        )
        async with _background(pacer.run(), stats.run(), _report(scheduler, stop)):
            await scheduler.run(stop)
    log.info("worker_stopped", finished=scheduler.finished)


async def _report(scheduler: Scheduler, stop: asyncio.Event, interval_s: float = 30.0) -> None:
    last = 0
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
        log.info(
            "worker_progress",
            finished=scheduler.finished,
            finished_per_s=round((scheduler.finished - last) / interval_s, 2),
            sources=len(scheduler.sources),
            share=scheduler.share(),
        )
        last = scheduler.finished


def main() -> None:
    serve("worker", WorkerSettings.from_env, run)


if __name__ == "__main__":
    main()
