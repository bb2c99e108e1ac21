"""``python -m crawl_monitor``: the crawl monitor.

Runs eight loops concurrently: the source list refresher, the pause watch
(``crawl_monitor.pause``: the whole crawl is paused while ``crawl_paused`` exists), the
regulator (each source's rate and circuit breakers, every second, while this monitor
holds the leader lease), the monitoring log, the backlog measurement (every
``LOG_FREQUENCY_S``, once Kafka's clients have started), the host counts and the
workers' DNS figures (every ``LOG_FREQUENCY_S``, ``crawl_monitor.hosts`` and
``crawl_monitor.dns``), and the splitter (in every monitor: the consumer group shares the
partitions); and once, at the start, makes the index of the error counters whole
(``crawl_monitor.reasons``). Every client is built here, once, entered through
one ``AsyncExitStack`` and passed to the loops.

With ``METRICS_PORT`` set, the monitor serves ``/metrics`` (``crawl_monitor.metrics``,
read from the loops' latest state: a scrape costs no Redis or Kafka request), its
dashboard at ``/`` (``crawl_monitor.dashboard``) and ``/healthz``, which answers 503 when
no regulator loop has completed for ``REGULATOR_STALE_S`` (Redis away or the loop stuck:
no source has a rate) or the backlog has not been measured for ten ``LOG_FREQUENCY_S``
and at least ``BACKLOG_STALE_MIN_S`` (Kafka away), counted from the start.

Kafka and Redis may be away at start or later: each loop logs it and retries with
backoff; the regulator keeps ticking without Kafka, and without Redis no source keeps a
rate. SIGTERM or SIGINT stops the loops (the splitter finishes and commits its batch),
then the consumer leaves its group, the producer flushes, and the process exits 0. A loop
that dies of an unexpected error stops the process with exit status 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector

from crawl_monitor import dashboard
from crawl_monitor.backlog import BacklogMonitor, KafkaOffsets
from crawl_monitor.dns import DnsReportsMonitor
from crawl_monitor.hosts import HostCountsMonitor
from crawl_monitor.metrics import (
    HealthLimits,
    MonitorCollector,
    MonitorView,
    health_problems,
    loop_histogram,
)
from crawl_monitor.monitoring import MonitoringLog
from crawl_monitor.pause import PauseWatch
from crawl_monitor.reasons import index_error_reasons
from crawl_monitor.regulator import Regulator, RegulatorSettings
from crawl_monitor.settings import MonitorSettings
from crawl_monitor.sources import SourceCatalog
from crawl_monitor.splitter import Splitter, TopicCreator
from crawl_monitor.store import LeaderLease, RedisRegulatorStore, new_lease_token
from image_crawler.contract import INBOUND_TOPIC, MONITOR_STOP_GRACE_S, SPLITTER_GROUP
from image_crawler.lifecycle import cancel_and_wait, serve, start_kafka_clients
from image_crawler.logs import get_logger
from image_crawler.metrics import serving

log = get_logger("crawl_monitor")


async def run(settings: MonitorSettings, stop: asyncio.Event) -> int:
    """Run the monitor until ``stop`` is set (0) or a loop crashes (1)."""
    started_at = time.monotonic()
    async with contextlib.AsyncExitStack() as stack:
        clients = _open_clients(settings, stack)
        registry = _registry()
        loops = _build_loops(settings, clients, loop_histogram(registry).observe)
        registry.register(MonitorCollector(lambda: _view(loops)))
        limits = HealthLimits.for_interval(settings.log_frequency_s)
        await stack.enter_async_context(
            serving(
                settings.metrics.port,
                settings.metrics.host,
                registry,
                port_last=settings.metrics.port_last,
                health=lambda: _health(loops, started_at, limits),
                routes=dashboard.routes(),
            )
        )
        _log_started(settings, loops.lease)
        kafka_started = asyncio.Event()
        status = await _supervise(
            {
                "sources": loops.catalog.run(stop),
                "regulator": loops.regulator.run(stop),
                "monitoring": loops.monitoring.run(stop),
                "backlog": loops.backlog.run(stop, kafka_started),
                "hosts": loops.hosts.run(stop),
                "dns": loops.dns.run(stop),
                "error_reasons": index_error_reasons(clients.redis, stop),
                "pause": loops.pause.run(stop),
                "splitter": _split(clients, loops.splitter, stop, kafka_started),
            },
            stop,
        )
    log.info("monitor_stopped", status=status)
    return status


@dataclasses.dataclass(frozen=True, slots=True)
class _Clients:
    """The process's clients, each closed by the exit stack it was opened on."""

    redis: aioredis.Redis
    http: aiohttp.ClientSession | None
    admin: AIOKafkaAdminClient
    producer: AIOKafkaProducer
    consumer: AIOKafkaConsumer


def _open_clients(settings: MonitorSettings, stack: contextlib.AsyncExitStack) -> _Clients:
    """Every client, its closing pushed on ``stack``; the Kafka ones are started later
    (``_split``), and stopping one that never started is harmless."""
    redis = settings.redis.client(
        decode_responses=True,
        socket_timeout=settings.redis_timeout_s,
        socket_connect_timeout=settings.redis_timeout_s,
    )
    stack.push_async_callback(redis.aclose)
    http = None
    if settings.sources_url is not None:
        http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=settings.sources_timeout_s)
        )
        stack.push_async_callback(http.close)
    kafka = settings.kafka.client_options()
    admin = AIOKafkaAdminClient(**kafka)
    stack.push_async_callback(admin.close)
    producer = AIOKafkaProducer(**settings.kafka.producer_options(), acks="all", linger_ms=5)
    stack.push_async_callback(producer.stop)  # flushes what is still buffered
    consumer = AIOKafkaConsumer(
        INBOUND_TOPIC,
        **kafka,
        group_id=SPLITTER_GROUP,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    stack.push_async_callback(consumer.stop)  # after the splitter's last commit
    return _Clients(redis, http, admin, producer, consumer)


@dataclasses.dataclass(frozen=True, slots=True)
class _Loops:
    catalog: SourceCatalog
    lease: LeaderLease
    regulator: Regulator
    monitoring: MonitoringLog
    backlog: BacklogMonitor
    hosts: HostCountsMonitor
    splitter: Splitter
    pause: PauseWatch
    dns: DnsReportsMonitor


def _build_loops(
    settings: MonitorSettings, clients: _Clients, observe_loop: Callable[[float], None]
) -> _Loops:
    """The eight loops, on ``clients``; ``observe_loop`` gets each regulator loop's
    duration (s)."""
    catalog = SourceCatalog(
        file=settings.sources_file,
        url=settings.sources_url,
        http=clients.http,
        refresh_s=settings.sources_refresh_s,
    )
    lease = LeaderLease(token=new_lease_token(), ttl_ms=settings.leader_lease_ms)
    pause = PauseWatch(clients.redis, period_s=settings.refill_period_s)
    regulator = Regulator(
        RedisRegulatorStore(clients.redis),
        lambda: catalog.rates,
        RegulatorSettings(
            period_s=settings.refill_period_s,
            pace_rate_ttl_ms=settings.pace_rate_ttl_ms,
            adaptive=settings.backoff,
        ),
        lease=lease,
        observe_loop=observe_loop,
        paused=lambda: pause.current,
    )
    backlog = BacklogMonitor(KafkaOffsets(clients.admin), clients.redis, settings.log_frequency_s)
    hosts = HostCountsMonitor(clients.redis, lambda: catalog.rates.keys(), settings.log_frequency_s)
    monitoring = MonitoringLog(
        clients.redis,
        lambda: regulator.snapshot,
        settings.log_frequency_s,
        backlog=lambda: backlog.latest,
        top_sources=settings.monitoring_top_sources,
    )
    splitter = Splitter(
        clients.consumer,
        clients.producer,
        clients.redis,
        TopicCreator(
            clients.admin,
            partitions=settings.source_topic_partitions,
            replication_factor=settings.source_topic_replication_factor,
            retention_ms=settings.url_topic_retention_ms,
        ),
        batch_size=settings.splitter_batch_size,
        paused=lambda: pause.paused,
    )
    dns = DnsReportsMonitor(clients.redis, settings.log_frequency_s)
    return _Loops(catalog, lease, regulator, monitoring, backlog, hosts, splitter, pause, dns)


def _registry() -> CollectorRegistry:
    """The registry ``/metrics`` serves: the monitor's own metrics are added to it, with
    the process's (CPU, memory, open files) and Python's version."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


def _view(loops: _Loops) -> MonitorView:
    return MonitorView(
        known=loops.catalog.rates.keys(),
        snapshot=loops.regulator.snapshot,
        backlog=loops.backlog.latest,
        counters=loops.monitoring.counters,
        leading=loops.regulator.leading,
        hosts=loops.hosts.latest,
        pause=loops.pause.current,
        pause_read=loops.pause.read,
        dns=loops.dns.latest,
        now_s=time.time(),
    )


def _health(loops: _Loops, started_at: float, limits: HealthLimits) -> Sequence[str]:
    return health_problems(
        time.monotonic(),
        started_at,
        loops.regulator.completed_at,
        loops.backlog.measured_at_monotonic,
        limits,
    )


async def _split(
    clients: _Clients, splitter: Splitter, stop: asyncio.Event, kafka_started: asyncio.Event
) -> None:
    """Start the Kafka clients (retrying while Kafka is away), set ``kafka_started``, then
    split until ``stop``."""
    started = await start_kafka_clients(
        [
            ("admin", clients.admin.start),
            ("producer", clients.producer.start),
            ("consumer", clients.consumer.start),
        ],
        stop,
    )
    if started:
        kafka_started.set()
        log.info("splitter_started", topic=INBOUND_TOPIC, group=SPLITTER_GROUP)
        await splitter.run(stop)
    log.info("splitter_stopped", split=splitter.split, malformed=splitter.malformed)


def _log_started(settings: MonitorSettings, lease: LeaderLease) -> None:
    log.info(
        "monitor_started",
        kafka=settings.kafka.bootstrap_servers,
        sources_file=str(settings.sources_file) if settings.sources_file else None,
        sources_url=settings.sources_url,
        pace_rate_ttl_ms=settings.pace_rate_ttl_ms,
        backoff=dataclasses.asdict(settings.backoff),
        leader_token=lease.token,
        leader_lease_ms=lease.ttl_ms,
        log_frequency_s=settings.log_frequency_s,
        url_topic_retention_ms=settings.url_topic_retention_ms,
        monitoring_top_sources=settings.monitoring_top_sources,
        metrics_port=settings.metrics.port,
    )


async def _supervise(loops: dict[str, Coroutine[Any, Any, None]], stop: asyncio.Event) -> int:
    """Run ``loops`` until ``stop``; a loop that raises stops the rest (status 1)."""
    tasks: dict[asyncio.Task[Any], str] = {
        asyncio.create_task(coro, name=name): name for name, coro in loops.items()
    }
    stopping: asyncio.Task[Any] = asyncio.create_task(stop.wait())
    status = 0
    pending: set[asyncio.Task[Any]] = set(tasks)
    while pending and not stop.is_set():
        done, pending = await asyncio.wait(
            pending | {stopping}, return_when=asyncio.FIRST_COMPLETED
        )
        pending.discard(stopping)
        for task in done - {stopping}:
            error = task.exception()
            if error is not None:
                log.error("loop_crashed", loop=tasks[task], exc_info=error)
                status = 1
                stop.set()
    await cancel_and_wait([stopping])
    if pending:
        finished, late = await asyncio.wait(pending, timeout=MONITOR_STOP_GRACE_S)
        for task in finished:
            if (error := task.exception()) is not None:
                log.error("loop_crashed", loop=tasks[task], exc_info=error)
                status = 1
        for task in late:
            log.warning("loop_cancelled", loop=tasks[task])
        await cancel_and_wait(late)
    return status


def main() -> None:
    serve("crawl_monitor", MonitorSettings.from_env, run)


if __name__ == "__main__":
    main()
