"""One measured crawl: the real stack, the real monitor, ``W`` real workers, ``N`` images.

Per run, on free loopback ports: a fresh tansu broker, redis-server and moto S3 server
(so nothing of an earlier run is in them), the real monitor (``python -m crawl_monitor``)
with every source in its ``SOURCES_FILE`` and ``override_rate:{source}`` at
``rate_rps``, so that the monitor paces each source at that many requests a second, and
the workers (``python -m worker``). The origin (``bench.origin``) is shared by the runs.

The URLs are produced straight to the per-source queues ``urls.{source}`` (as the
splitter would write them; the splitter itself is not exercised), spread round-robin
over sources and partitions so every source has work from the first second. Outputs are
read from ``image_metadata_updates``, ``crawl_errors``, ``link_rot`` and ``link_checks``
without a consumer group until every measured uuid is accounted for, or the deadline
passes.

The worker's CPU is the user + system time of each worker's whole process tree (main
process, forkserver, image pool), read after a warm-up crawl (broker group joined, pool
processes started) and again the moment the last output is read: see bench/README.md.

With ``recheck``, the same URLs and uuids are then produced again, each carrying its
first crawl's ``etag``, ``last_modified`` and ``sha256`` (from its resolution message):
a second measured window, from the reading just before producing them to the one when
the last of their ``link_checks`` messages is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psutil
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench.procstats import MemorySample, ProcessTree, Sampler, at_progress
from bench.redis_costs import RedisReadings, redis_window
from bench.services import S3Sink, origin_stats, s3_service, thumbnails_stored
from crawlctl.localstack.processes import ModuleProcess
from crawlctl.localstack.services import KafkaBroker, RedisServer
from image_crawler import contract as c
from test.harness.services import S3Server, create_bucket, create_topics, wait_for


@dataclasses.dataclass(frozen=True, slots=True)
class RunConfig:
    images: int
    workers: int
    image_processes: int  # 0: one per CPU (the worker's default)
    sources: int
    partitions: int
    max_tasks: int
    rate_rps: float
    warmup: int
    timeout_s: float
    profile: bool
    s3: str  # "sink" or "moto"
    log_dir: Path
    recheck: bool = False  # a second measured pass: every image re-checked
    # Base URLs the crawl's URLs are spread over, round-robin (empty: the origin's own).
    host_urls: tuple[str, ...] = ()
    # The warm-up's, when its hosts must not be the measured ones (empty: host_urls).
    warmup_host_urls: tuple[str, ...] = ()
    # More environment for each worker (DNS_SERVERS...), over the crawl's own.
    worker_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # More processes whose CPU is read over the measured window (name -> pid).
    watch_pids: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # What the origin was asked so far (bench.origin's /_stats when None).
    origin_stats: Callable[[], dict[str, Any]] | None = None


def source_names(count: int) -> list[str]:
    return ["photos"] if count == 1 else [f"site{i:04d}" for i in range(count)]


# What a re-check sends back of its first crawl: the resolution message's fields of the
# same names (contract.Earlier).
VALIDATOR_FIELDS = ("etag", "last_modified", "sha256")


class Outputs:
    """What the workers published, per uuid, read without a consumer group.

    Once ``rechecking`` is set, resolutions, errors and link rot count apart (the
    re-check pass's), and the crawl's figures stay those of the crawl."""

    def __init__(self) -> None:
        self.completed_at: dict[str, float] = {}
        self.resolutions = 0
        self.resolved: set[str] = set()
        self.exifs = 0
        self.errors: Counter[str] = Counter()
        self.error_examples: list[dict[str, Any]] = []
        self.wanted: set[str] = set()
        self.done_wanted = 0
        self.changed = asyncio.Event()
        # uuid -> the re-check fields of its (first) resolution message.
        self.validators: dict[str, dict[str, Any]] = {}
        self.rechecking = False
        self.checks_wanted: set[str] = set()
        self.checks_done = 0
        self.checked_at: dict[str, float] = {}
        self.check_statuses: dict[str, str] = {}
        self.check_http_statuses: Counter[str] = Counter()
        self.check_examples: list[dict[str, Any]] = []
        self.recheck_resolutions = 0
        self.recheck_errors: Counter[str] = Counter()

    def add(self, topic: str, value: bytes) -> None:
        message = json.loads(value)
        identifier = message.get("identifier")
        if topic == c.LINK_CHECKS_TOPIC:
            self._add_check(identifier, message)
        elif self.rechecking:
            self._add_during_recheck(topic, message)
        else:
            self._add_crawled(topic, identifier, message)
        self.changed.set()

    def _add_crawled(self, topic: str, identifier: str | None, message: dict[str, Any]) -> None:
        if topic == c.METADATA_TOPIC:
            if "exif" in message:
                self.exifs += 1
                return
            self.resolutions += 1
            if identifier is not None:
                self.resolved.add(identifier)
                self.validators.setdefault(
                    identifier, {k: message[k] for k in VALIDATOR_FIELDS if k in message}
                )
        elif topic == c.CRAWL_ERRORS_TOPIC:
            self.errors[message.get("status", "Unparseable")] += 1
            if len(self.error_examples) < 10:
                self.error_examples.append(message)
        elif topic == c.LINK_ROT_TOPIC:
            self.errors["404"] += 1
        if identifier is not None and identifier not in self.completed_at:
            self.completed_at[identifier] = time.monotonic()
            if identifier in self.wanted:
                self.done_wanted += 1

    def _add_during_recheck(self, topic: str, message: dict[str, Any]) -> None:
        if topic == c.METADATA_TOPIC and "exif" not in message:
            self.recheck_resolutions += 1
        elif topic == c.CRAWL_ERRORS_TOPIC:
            self.recheck_errors[message.get("status", "Unparseable")] += 1
        elif topic == c.LINK_ROT_TOPIC:
            self.recheck_errors["404"] += 1

    def _add_check(self, identifier: str | None, message: dict[str, Any]) -> None:
        if identifier is None or identifier in self.checked_at:
            return
        self.checked_at[identifier] = time.monotonic()
        status = str(message.get("status"))
        self.check_statuses[identifier] = status
        self.check_http_statuses[str(message.get("http_status"))] += 1
        if status != c.CHECK_UNCHANGED and len(self.check_examples) < 10:
            self.check_examples.append(message)
        if identifier in self.checks_wanted:
            self.checks_done += 1


OUTPUT_TOPICS = (c.METADATA_TOPIC, c.CRAWL_ERRORS_TOPIC, c.LINK_ROT_TOPIC, c.LINK_CHECKS_TOPIC)


async def _read_outputs(bootstrap: str, outputs: Outputs, ready: asyncio.Event) -> None:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    await consumer.start()
    try:
        topics = OUTPUT_TOPICS
        partitions = [
            TopicPartition(t, p) for t in topics for p in consumer.partitions_for_topic(t) or ()
        ]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ready.set()
        while True:
            batches = await consumer.getmany(timeout_ms=200, max_records=5000)
            for tp, records in batches.items():
                for record in records:
                    if record.value is not None:
                        outputs.add(tp.topic, record.value)
    finally:
        await consumer.stop()


async def _produce(bootstrap: str, tasks: list[tuple[str, int, bytes]]) -> None:
    """Produce (topic, partition, value) messages and wait for every acknowledgement."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
    await producer.start()
    try:
        futures = [await producer.send(t, v, partition=p) for t, p, v in tasks]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def _tasks(
    sources: list[str], partitions: int, bases: tuple[str, ...], prefix: str, start: int, count: int
) -> tuple[list[tuple[str, int, bytes]], list[str]]:
    """``count`` URLs spread round-robin over sources, then partitions, and over the
    ``bases`` (the hosts' base URLs); body ``i`` is corpus file ``i % files`` (the
    origin's choice)."""
    tasks, uuids = [], []
    for i in range(start, start + count):
        source = sources[i % len(sources)]
        partition = (i // len(sources)) % partitions
        uuid = f"{prefix}-{i:07d}-{source}"
        url = f"{bases[i % len(bases)]}/{i}/{uuid}.jpg"
        tasks.append((c.source_topic(source), partition, c.SourceTask(url, uuid).to_json()))
        uuids.append(uuid)
    return tasks, uuids


@dataclasses.dataclass(frozen=True, slots=True)
class RecheckPlan:
    """The crawl's messages again, each carrying its first crawl's validators."""

    tasks: list[tuple[str, int, bytes]]  # (topic, partition, SourceTask JSON)
    uuids: list[str]
    no_resolution: int  # crawled without a resolution message (an error): not re-checked
    no_validators: int  # a resolution without etag, last_modified or sha256: none either
    carrying: dict[str, int]  # how many re-checks carry each of VALIDATOR_FIELDS


def recheck_plan(
    tasks: list[tuple[str, int, bytes]], validators: Mapping[str, Mapping[str, Any]]
) -> RecheckPlan:
    """The re-check of each of ``tasks`` (the crawl's messages: same topic, partition, URL
    and uuid) whose uuid has a resolution in ``validators`` (uuid -> the resolution
    message's etag, last_modified and sha256, as the worker reported them)."""
    planned: list[tuple[str, int, bytes]] = []
    uuids: list[str] = []
    no_resolution = no_validators = 0
    carrying = dict.fromkeys(VALIDATOR_FIELDS, 0)
    for topic, partition, value in tasks:
        task = c.SourceTask.from_json(value)
        fields = validators.get(task.uuid)
        if fields is None:
            no_resolution += 1
            continue
        try:
            earlier = c.Earlier.from_fields(dict(fields))
        except c.MalformedMessage:
            earlier = None
        if earlier is None:
            no_validators += 1
            continue
        for name in VALIDATOR_FIELDS:
            carrying[name] += getattr(earlier, name) is not None
        recheck = dataclasses.replace(task, earlier=earlier)
        planned.append((topic, partition, recheck.to_json()))
        uuids.append(task.uuid)
    return RecheckPlan(planned, uuids, no_resolution, no_validators, carrying)


def _worker_env(
    config: RunConfig,
    kafka: KafkaBroker,
    redis: RedisServer,
    s3: S3Server | S3Sink,
    bucket: str,
) -> dict[str, str]:
    return {
        **kafka.env,
        **redis.env,
        **s3.env,
        "S3_BUCKET": bucket,
        "MAX_TASKS": str(config.max_tasks),
        "IMAGE_PROCESSES": str(config.image_processes),
        "SOURCES_POLL_S": "1",
        # The hosts of bench.origin --hosts are 127.1.x.y.
        "ALLOWED_PRIVATE_NETWORKS": "127.0.0.0/8" if config.host_urls else "127.0.0.1/32",
        "LOG_LEVEL": "INFO",
        **config.worker_env,
    }


async def _wait_done(
    outputs: Outputs, total: int, deadline: float, done: Callable[[], int] | None = None
) -> bool:
    """Wait until ``done()`` (by default the crawl's uuids accounted for) is ``total``."""
    count = done if done is not None else (lambda: outputs.done_wanted)
    while count() < total:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        outputs.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(outputs.changed.wait(), min(remaining, 1.0))
    return True


@dataclasses.dataclass(slots=True)
class _Stack:
    """What one crawl runs against, once started."""

    kafka: KafkaBroker
    redis_server: RedisServer
    s3: S3Server | S3Sink
    bucket: str
    sources: list[str]
    origin_url: str
    # Where the URLs point: the origin's hosts (RunConfig.host_urls), or the origin.
    bases: tuple[str, ...]
    workers: list[ModuleProcess] = dataclasses.field(default_factory=list)
    monitor: ModuleProcess | None = None

    def service_pids(self) -> dict[str, int | None]:
        monitor = self.monitor.pid if self.monitor is not None else None
        return {
            "kafka": self.kafka.pid,
            "redis": self.redis_server.pid,
            "s3": self.s3.pid,
            "monitor": monitor,
        }


@dataclasses.dataclass(slots=True)
class _Window:
    """The measured part of a crawl: from producing the URLs to the last output read."""

    t0: float
    produce_s: float = 0.0
    t_seen: float = 0.0
    finished: bool = False
    worker_cpu: list[dict[str, float]] = dataclasses.field(default_factory=list)
    other_cpu: dict[str, float] = dataclasses.field(default_factory=dict)
    peaks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    profile: dict[str, Any] | None = None
    sampler: Sampler | None = None
    # The origin's counts (bench.origin.Requests) when the window opened and closed.
    origin_before: dict[str, Any] = dataclasses.field(default_factory=dict)
    origin_after: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Read again by a re-check pass: a tree remembers each process's last reading.
    trees: list[ProcessTree] = dataclasses.field(default_factory=list)
    others: dict[str, ProcessTree] = dataclasses.field(default_factory=dict)
    # redis-server's commands and memory when the window opened and closed (redis_costs).
    redis_before: dict[str, Any] = dataclasses.field(default_factory=dict)
    redis_after: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The whole machine's CPU seconds over the window by kind (/proc/stat's user, system,
    # softirq, idle, steal, ...: every process, ours or not).
    machine_times_s: dict[str, float] = dataclasses.field(default_factory=dict)
    # This process's own CPU over the window (producing, reading the outputs, sampling):
    # the harness's, on the same CPUs as the crawl, counted as no one's.
    harness_cpu_s: float = 0.0


async def run_crawl(config: RunConfig, origin_url: str, files: int) -> dict[str, Any]:
    """Run one crawl and return its figures (see ``bench.report`` for their meaning)."""
    config.log_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as exits:
        kafka = exits.enter_context(KafkaBroker(log_dir=config.log_dir))
        redis_server = exits.enter_context(RedisServer(log_dir=config.log_dir))
        s3 = s3_service(config.s3, config.log_dir)
        exits.enter_context(s3)
        bases = config.host_urls or (origin_url,)
        names = source_names(config.sources)
        stack = _Stack(kafka, redis_server, s3, "bench", names, origin_url, bases)
        if isinstance(s3, S3Server):
            create_bucket(s3.endpoint_url, stack.bucket)
        for start in range(0, len(stack.sources), 200):
            await create_topics(
                kafka.bootstrap,
                [c.source_topic(s) for s in stack.sources[start : start + 200]],
                partitions=config.partitions,
            )
        await create_topics(
            kafka.bootstrap,
            [*OUTPUT_TOPICS, c.INBOUND_TOPIC],
        )
        redis = aioredis.from_url(redis_server.url, decode_responses=True)
        try:
            await _start_monitor(config, stack, redis, exits)
        finally:
            await redis.aclose()
        outputs = Outputs()
        reader_ready = asyncio.Event()
        reader = asyncio.create_task(_read_outputs(kafka.bootstrap, outputs, reader_ready))
        try:
            await asyncio.wait_for(reader_ready.wait(), 30)
            env = _worker_env(config, kafka, redis_server, s3, stack.bucket)
            for i in range(config.workers):
                worker = ModuleProcess(
                    f"worker{i}", "worker", env, config.log_dir / f"worker{i}.log"
                )
                stack.workers.append(exits.enter_context(worker.start()))
            warmup, warmup_s = await _warm_up(config, stack, outputs)
            window = await _measure(config, stack, outputs)
            recheck = await _recheck(config, stack, outputs, window) if config.recheck else None
            _stop_workers(stack)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        figures = _figures(config, stack, outputs, window)
        if recheck is not None:
            figures["recheck"] = _recheck_figures(recheck, outputs, figures)
        figures.update(
            warmup_images=warmup,
            warmup_s=round(warmup_s, 2),
            thumbnails_stored=thumbnails_stored(s3, stack.bucket),
            corpus_files_served=files,
        )
        return figures


async def _start_monitor(
    config: RunConfig, stack: _Stack, redis: aioredis.Redis, exits: contextlib.ExitStack
) -> None:
    """The real monitor, with every source known (SOURCES_FILE) and overridden to
    ``rate_rps``; returns after its first refill. The sources are registered in
    ``inbound_sources`` here, as the splitter would."""
    sources_file = config.log_dir / "sources.json"
    sources_file.write_text(
        json.dumps([{"source_name": s, "image_count": 10**6} for s in stack.sources])
    )
    async with redis.pipeline(transaction=False) as pipe:
        for source in stack.sources:
            pipe.set(f"{c.OVERRIDE_RATE_PREFIX}{source}", str(config.rate_rps))
        pipe.sadd(c.INBOUND_SOURCES_SET, *stack.sources)
        await pipe.execute()
    env = {**stack.kafka.env, **stack.redis_server.env, "SOURCES_FILE": str(sources_file)}
    monitor = ModuleProcess("monitor", "crawl_monitor", env, config.log_dir / "monitor.log")
    stack.monitor = exits.enter_context(monitor.start())
    await wait_for(
        lambda: redis.get(c.pace_rate_key(stack.sources[-1])),
        60,
        0.1,
        what="the monitor's first refill",
    )


async def _warm_up(config: RunConfig, stack: _Stack, outputs: Outputs) -> tuple[int, float]:
    """Crawl at least one image per partition, so that every worker has joined the group,
    got partitions and started its image pool before anything is measured."""
    started = time.monotonic()
    warmup = max(config.warmup, len(stack.sources) * config.partitions)
    bases = config.warmup_host_urls or stack.bases
    tasks, uuids = _tasks(stack.sources, config.partitions, bases, "warm", 0, warmup)
    outputs.wanted = set(uuids)
    await _produce(stack.kafka.bootstrap, tasks)
    if not await _wait_done(outputs, warmup, time.monotonic() + 180 + warmup * 0.2):
        raise RuntimeError(
            f"warm-up: {outputs.done_wanted} of {warmup} done in time; see {config.log_dir}"
        )
    return warmup, time.monotonic() - started


async def _measure(config: RunConfig, stack: _Stack, outputs: Outputs) -> _Window:
    trees = [ProcessTree(w.pid) for w in stack.workers if w.pid is not None]
    pids = {**stack.service_pids(), **config.watch_pids}
    others = {name: ProcessTree(pid) for name, pid in pids.items() if pid}
    cpu_before = [t.cpu_by_role() for t in trees]
    others_before = {name: t.cpu_seconds() for name, t in others.items()}

    tasks, uuids = _tasks(stack.sources, config.partitions, stack.bases, "run", 0,
                          config.images)  # fmt: skip
    outputs.wanted = set(uuids)
    outputs.done_wanted = sum(1 for u in uuids if u in outputs.completed_at)
    sampler = Sampler(trees, lambda: outputs.done_wanted, broker_port=stack.kafka.port)
    profiler = _start_profiler(config, stack.workers[0]) if config.profile else None
    asked = config.origin_stats or functools.partial(origin_stats, stack.origin_url)
    origin_before = await asyncio.to_thread(asked)
    readings = RedisReadings(stack.redis_server.url)
    redis_before = await readings.read()
    sampler.start()
    times_before = machine_times_s()
    harness_before = _own_cpu_s()
    window = _Window(t0=time.monotonic(), origin_before=origin_before, redis_before=redis_before)
    await _produce(stack.kafka.bootstrap, tasks)
    window.produce_s = time.monotonic() - window.t0
    window.finished = await _wait_done(outputs, config.images, window.t0 + config.timeout_s)
    window.t_seen = time.monotonic()
    times_after = machine_times_s()
    window.machine_times_s = {k: v - times_before[k] for k, v in times_after.items()}
    window.harness_cpu_s = _own_cpu_s() - harness_before
    window.origin_after = await asyncio.to_thread(asked)
    window.redis_after = await readings.read()
    await readings.aclose()
    cpu_after = [t.cpu_by_role() for t in trees]
    window.other_cpu = {n: t.cpu_seconds() - others_before[n] for n, t in others.items()}
    sampler.stop()
    window.worker_cpu = [
        {role: after[role] - before[role] for role in before}
        for before, after in zip(cpu_before, cpu_after, strict=True)
    ]
    window.peaks = [t.peak_rss() for t in trees]
    window.profile = _stop_profiler(profiler)
    window.sampler = sampler
    window.trees, window.others = trees, others
    return window


def _stop_workers(stack: _Stack) -> None:
    for worker in stack.workers:
        worker.terminate()
    for worker in stack.workers:
        worker.wait(60)


@dataclasses.dataclass(slots=True)
class _Recheck:
    """The re-check pass: from producing the re-checks to the last link_checks read."""

    plan: RecheckPlan
    t0: float
    produce_s: float = 0.0
    t_seen: float = 0.0
    finished: bool = False
    worker_cpu: list[dict[str, float]] = dataclasses.field(default_factory=list)
    other_cpu: dict[str, float] = dataclasses.field(default_factory=dict)


async def _recheck(config: RunConfig, stack: _Stack, outputs: Outputs, crawl: _Window) -> _Recheck:
    """Produce the crawl's URLs again as re-checks and wait for their ``link_checks``;
    the workers' CPU is read just before producing and when the last one is read."""
    tasks, _ = _tasks(stack.sources, config.partitions, stack.bases, "run", 0,
                      config.images)  # fmt: skip
    plan = recheck_plan(tasks, outputs.validators)
    outputs.rechecking = True
    outputs.checks_wanted = set(plan.uuids)
    outputs.checks_done = sum(1 for u in plan.uuids if u in outputs.checked_at)
    cpu_before = [t.cpu_by_role() for t in crawl.trees]
    others_before = {name: t.cpu_seconds() for name, t in crawl.others.items()}
    window = _Recheck(plan, t0=time.monotonic())
    await _produce(stack.kafka.bootstrap, plan.tasks)
    window.produce_s = time.monotonic() - window.t0
    window.finished = await _wait_done(
        outputs, len(plan.uuids), window.t0 + config.timeout_s, lambda: outputs.checks_done
    )
    window.t_seen = time.monotonic()
    cpu_after = [t.cpu_by_role() for t in crawl.trees]
    window.other_cpu = {n: t.cpu_seconds() - others_before[n] for n, t in crawl.others.items()}
    window.worker_cpu = [
        {role: after[role] - before[role] for role in before}
        for before, after in zip(cpu_before, cpu_after, strict=True)
    ]
    return window


def _recheck_figures(window: _Recheck, outputs: Outputs, crawl: dict[str, Any]) -> dict[str, Any]:
    """The re-check pass's figures; CPU is divided by the re-checks that came back
    ``unchanged`` (what is measured: a re-check of an unchanged image)."""
    plan = window.plan
    statuses = Counter(outputs.check_statuses[u] for u in plan.uuids if u in outputs.checked_at)
    times = sorted(outputs.checked_at[u] - window.t0 for u in plan.uuids if u in outputs.checked_at)
    unchanged = statuses[c.CHECK_UNCHANGED]
    main = sum(w["main"] for w in window.worker_cpu)
    # Equal readings subtracted as sums can leave -1e-15: a pool that did nothing.
    pool = max(0.0, sum(w["children"] for w in window.worker_cpu))
    wall_s = times[-1] if times else window.t_seen - window.t0

    def per_image(seconds: float) -> float | None:
        return seconds / unchanged if unchanged else None

    cpu_s_per_image = per_image(main + pool)
    full = crawl["worker_cpu_s_per_image"]
    return {
        "images": crawl["images_requested"],
        "rechecks": len(plan.uuids),
        "not_rechecked": {
            "no_resolution": plan.no_resolution,
            "no_validators": plan.no_validators,
        },
        "carrying": plan.carrying,
        "finished": window.finished,
        "checks_done": len(times),
        "statuses": dict(statuses),
        "http_statuses": dict(outputs.check_http_statuses),
        "examples": outputs.check_examples,
        "resolutions": outputs.recheck_resolutions,
        "errors": dict(outputs.recheck_errors),
        "produce_s": round(window.produce_s, 3),
        "wall_s": wall_s,
        "completed_by_s": _deciles(times),
        "checks_per_s": len(times) / wall_s if wall_s > 0 else None,
        "worker_cpu_s": main + pool,
        "worker_cpu_s_by_worker": window.worker_cpu,
        "cpu_s_per_image": cpu_s_per_image,
        "main": per_image(main),
        "pool": per_image(pool),
        "full_crawl_cpu_s_per_image": full,
        "ratio": cpu_s_per_image / full if cpu_s_per_image is not None and full else None,
        "other_cpu_s": window.other_cpu,
    }


def _figures(config: RunConfig, stack: _Stack, outputs: Outputs, window: _Window) -> dict[str, Any]:
    uuids = sorted(outputs.wanted)
    times = sorted(outputs.completed_at[u] - window.t0 for u in uuids if u in outputs.completed_at)
    done = len(times)
    # CPU is divided by the images that were crawled: a Timeout costs little CPU, and would
    # flatter the figure.
    ok = len(outputs.resolved & outputs.wanted)
    wall_s = times[-1] if times else window.t_seen - window.t0
    cpu_total = sum(w["main"] + w["children"] for w in window.worker_cpu)
    sampler = window.sampler
    assert sampler is not None

    def per_image(seconds: float) -> float | None:
        return seconds / ok if ok else None

    return {
        "config": _config_figures(config),
        "sources": len(stack.sources),
        "finished": window.finished,
        "images_requested": config.images,
        "images_done": done,
        "images_ok": ok,
        "resolutions": outputs.resolutions,
        "exif_messages": outputs.exifs,
        "errors": dict(outputs.errors),
        "error_examples": outputs.error_examples,
        "produce_s": round(window.produce_s, 3),
        "wall_s": wall_s,
        "completed_by_s": _deciles(times),
        "images_per_s": done / wall_s if wall_s > 0 else None,
        "images_per_s_steady_10_90": _steady_throughput(times),
        "worker_cpu_s": cpu_total,
        "worker_cpu_s_by_worker": window.worker_cpu,
        "worker_cpu_s_per_image": per_image(cpu_total),
        "worker_main_cpu_s_per_image": per_image(sum(w["main"] for w in window.worker_cpu)),
        "worker_children_cpu_s_per_image": per_image(sum(w["children"] for w in window.worker_cpu)),
        "worker_main_system_cpu_s_per_image": per_image(
            sum(w["main_system"] for w in window.worker_cpu)
        ),
        "worker_children_system_cpu_s_per_image": per_image(
            sum(w["children_system"] for w in window.worker_cpu)
        ),
        "images_per_worker_cpu_s": ok / cpu_total if cpu_total else None,
        **_beyond_the_workers(window, ok),
        "origin_requests": origin_requests(window.origin_before, window.origin_after, wall_s),
        "memory": [
            _memory(samples, peak, connections, config.images)
            for samples, peak, connections in zip(
                sampler.samples, window.peaks, sampler.connections, strict=True
            )
        ],
        "fairness": (
            _fairness(outputs, uuids, stack.sources, window.t0, config.images)
            if len(stack.sources) > 1
            else None
        ),
        "worker_log_warnings": [_log_levels(w.log_path) for w in stack.workers],
        "profile": window.profile,
    }


def _beyond_the_workers(window: _Window, ok: int) -> dict[str, Any]:
    """What the window cost besides the workers: the other processes' CPU, the whole
    machine's (every process's, ours or not: what else ran on it meanwhile), and Redis'
    commands and memory."""
    return {
        "other_cpu_s": window.other_cpu,
        "machine_cpu_busy_s": machine_busy_s(window.machine_times_s),
        "machine_cpu_s_by_kind": window.machine_times_s,
        "harness_cpu_s": window.harness_cpu_s,
        "machine_cpus": psutil.cpu_count(),
        "redis": redis_window(window.redis_before, window.redis_after, ok),
    }


def machine_times_s() -> dict[str, float]:
    """CPU seconds the whole machine has spent by kind since it started, all CPUs
    together (psutil's reading of /proc/stat: user, system, softirq, idle, steal, ...)."""
    return {k: float(v) for k, v in psutil.cpu_times()._asdict().items()}


def _own_cpu_s() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


def machine_busy_s(times: Mapping[str, float]) -> float:
    """Of ``machine_times_s``' kinds, the busy ones: running processes and the kernel
    (guest time is within user time on Linux; steal, a hypervisor's, is not ours)."""
    return sum(times.get(part, 0.0) for part in ("user", "nice", "system", "irq", "softirq"))


def _config_figures(config: RunConfig) -> dict[str, Any]:
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    figures = {k: str(v) if isinstance(v, Path) else v for k, v in fields.items()}
    # Whose answers were counted, not the function.
    figures["origin_stats"] = "/_stats" if config.origin_stats is None else "access log"
    figures["host_urls"] = len(config.host_urls)  # not a thousand URLs
    figures["warmup_host_urls"] = len(config.warmup_host_urls)
    figures["watch_pids"] = sorted(config.watch_pids)
    return figures


def origin_requests(
    before: Mapping[str, Any], after: Mapping[str, Any], wall_s: float
) -> dict[str, Any]:
    """What the origin was asked during a window (``bench.origin.Requests.summary`` at its
    start and end, ``wall_s`` long): requests by kind, and per second; and, of the whole
    origin process so far (gaps are not counted by window), how close together its
    Crawl-delayed hosts' requests came."""
    was, now = before.get("by_kind", {}), after.get("by_kind", {})
    by_kind = {k: now.get(k, 0) - was.get(k, 0) for k in sorted({*was, *now})}
    return {
        "by_kind": by_kind,
        "per_s": {k: n / wall_s for k, n in by_kind.items()} if wall_s > 0 else {},
        "delayed_hosts": {k: v for k, v in after.items() if k != "by_kind"},
    }


def _memory(
    samples: list[MemorySample], peak: dict[str, Any], connections: list[int], total: int
) -> dict[str, Any]:
    marks = {}
    for share in (0.1, 0.5, 1.0):
        sample = at_progress(samples, total, share)
        marks[f"{int(share * 100)}%"] = dataclasses.asdict(sample) if sample else None
    return {
        "peak_rss_main_bytes": peak["main"],
        "peak_rss_pool_max_bytes": peak["pool_max"],
        "peak_rss_by_process": peak["processes"],
        "rss_at": marks,
        "pool_processes": max((s.pool_processes for s in samples), default=0),
        "memfd_bytes_max": max((s.memfd_bytes for s in samples), default=0),
        # What the main process holds: its RSS and the bodies it parked in memfds.
        "main_rss_plus_memfd_bytes_max": max(
            (s.main_rss + s.memfd_bytes for s in samples), default=0
        ),
        "broker_connections_max": max(connections, default=None),
        "broker_connections_samples": len(connections),
        "broker_connections_last": connections[-1] if connections else None,
    }


def _deciles(times: list[float]) -> dict[str, float]:
    """Seconds after the URLs were produced by which 1 %, 10 %, ... 100 % were done."""
    if not times:
        return {}
    marks = (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
    return {f"{int(m * 100)}%": round(times[max(0, int(m * len(times)) - 1)], 2) for m in marks}


def _steady_throughput(times: list[float]) -> float | None:
    """Images per second between the 10 % and the 90 % completion (no start or tail)."""
    if len(times) < 20:
        return None
    low, high = times[len(times) // 10], times[len(times) * 9 // 10]
    count = len(times) * 9 // 10 - len(times) // 10
    return count / (high - low) if high > low else None


def _fairness(
    outputs: Outputs, uuids: list[str], sources: list[str], t0: float, total: int
) -> dict[str, Any]:
    """Whether every source with work got task slots: first completion per source, and
    how many sources had completions when 10 % and 50 % of the run was done."""
    by_source: dict[str, list[float]] = {s: [] for s in sources}
    for uuid in uuids:
        if uuid in outputs.completed_at:
            by_source[uuid.rsplit("-", 1)[1]].append(outputs.completed_at[uuid] - t0)
    all_times = sorted(t for ts in by_source.values() for t in ts)
    result: dict[str, Any] = {}
    for share in (0.1, 0.5):
        if not all_times:
            break
        cut = all_times[min(len(all_times) - 1, int(share * total))]
        counts = [sum(1 for t in ts if t <= cut) for ts in by_source.values()]
        result[f"at_{int(share * 100)}%"] = {
            "elapsed_s": cut,
            "sources_with_completions": sum(1 for n in counts if n),
            "completions_per_source_min": min(counts),
            "completions_per_source_max": max(counts),
        }
    firsts = [min(ts) for ts in by_source.values() if ts]
    result["sources_completed_any"] = len(firsts)
    result["first_completion_s_max"] = max(firsts, default=None)
    result["first_completion_s_median"] = sorted(firsts)[len(firsts) // 2] if firsts else None
    return result


def _log_levels(path: Path) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and event.get("level") in ("warning", "error", "critical"):
            counts[f"{event['level']}:{event.get('event')}"] += 1
    return dict(counts)


def _start_profiler(config: RunConfig, worker: ModuleProcess) -> subprocess.Popen[bytes] | None:
    py_spy = Path(sys.executable).parent / "py-spy"
    if not py_spy.exists():
        print("py-spy is not installed (pip install py-spy): no profile", file=sys.stderr)
        return None
    out = config.log_dir / "worker0.pyspy.txt"
    return subprocess.Popen(
        [
            str(py_spy),
            "record",
            "--pid",
            str(worker.pid),
            "--subprocesses",
            "--format",
            "raw",
            "--rate",
            "100",
            "--nonblocking",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(config.log_dir / "py-spy.log", "wb"),
    )


def _stop_profiler(profiler: subprocess.Popen[bytes] | None) -> dict[str, Any] | None:
    if profiler is None:
        return None
    from bench.profile import summarise

    profiler.send_signal(signal.SIGINT)
    try:
        profiler.wait(60)
    except subprocess.TimeoutExpired:
        profiler.kill()
        profiler.wait()
    args = profiler.args
    assert isinstance(args, list)
    path = Path(args[args.index("--output") + 1])
    return (
        summarise(path, int(args[args.index("--pid") + 1]))
        if path.is_file()
        else {"error": f"no output at {path}"}
    )
