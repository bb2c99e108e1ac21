"""A whole crawl on one machine: ``image-crawler up`` (and the stack under ``demo``).

``LocalStack`` starts, on loopback, a tansu broker, a redis-server, ``python -m
crawl_monitor``, N ``python -m worker`` processes and (persistent stacks) ``python -m
dedup``, each logging to a file under the data folder, and stops them in order: workers
first (SIGTERM, they hand back or finish their work), then the monitor and the
deduplication stage, then the broker and redis-server. The crawler's processes get the
environment of the contract (``KAFKA_HOSTS``, ``REDIS_URL``...), with thumbnails written
to a local folder instead of S3.

A persistent stack (``up``'s) keeps its work in the data folder across any stop, a crash
or a ``kill -9`` included: the broker's topics, offsets and groups (``broker/``, a
SeaweedFS that tansu's ``s3://`` engine writes to, ``objects.ObjectStore``),
redis-server's append-only file (``redis/``), the deduplication stage's journal
(``dedup/``) and the outputs (``outputs/``, archived as they come). A stop saves nothing
of its own: the next start finds the queue where the broker left it. A ``spool.jsonl``
left by an earlier version (whose broker kept its topics in memory and spooled them at a
clean stop) is restored once, at the next start. The folder's layout is
``StackSettings``'s. The demo's stack is not persistent: its broker is in memory, and it
runs no deduplication stage (whose journal would outlive the broker's topics, and whose
answers only the archive keeps; the demo measures the crawl).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Set
from pathlib import Path
from typing import Any, Final

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from redis import Redis

from crawlctl.localstack import spool
from crawlctl.localstack.archive import Archived, OutputArchive
from crawlctl.localstack.disk import DiskGuard, disk_reserve_bytes
from crawlctl.localstack.events import UP_LOG_NAME, EventLog
from crawlctl.localstack.lock import DataDirLock
from crawlctl.localstack.objects import ObjectStore
from crawlctl.localstack.processes import Child, ModuleProcess, ServiceError, wait_until
from crawlctl.localstack.services import (
    LOOPBACK,
    KafkaBroker,
    RedisServer,
    free_port,
    port_free,
)
from image_crawler import contract
from image_crawler.config import env_optional

LOOPBACK_NETWORK: Final = "127.0.0.0/8"
# Every crawler process SIGTERMed at once gets this long beyond its own grace period.
STOP_MARGIN_S: Final = 15.0
# The stack's own values where the caller's environment sets none (see ``crawler_env``),
# shorter than the worker's defaults on purpose: a crawl on one machine should stop soon
# after Ctrl-C and pick up a new source within a second.
DEFAULT_SHUTDOWN_GRACE_S: Final = 10.0
DEFAULT_SOURCES_POLL_S: Final = 1.0
DEFAULT_MONITOR_METRICS_PORT: Final = 9100
# On SIGTERM the deduplication stage ends the batch in hand (placed, synced, published with
# acks=all, committed) before it exits: seconds on the local broker, which writes each
# produce and commit to S3.
DEDUP_STOP_TIMEOUT_S: Final = 30.0
# image_metadata_updates as the broker makes a topic on first use (KafkaBroker), made
# before the deduplication stage starts: the stage looks for its input's partitions only
# in metadata it refreshes every 5 minutes (aiokafka's metadata_max_age_ms), so a topic
# the workers create after its start was placed from up to 5 minutes late.
METADATA_PARTITIONS: Final = 4
TOPIC_ALREADY_EXISTS: Final = 36  # Kafka's error code


@dataclasses.dataclass(frozen=True, slots=True)
class StackSettings:
    """What ``LocalStack`` runs. Paths are made absolute; times in seconds."""

    data_dir: Path
    thumbnails_dir: Path
    workers: int = 1
    sources_file: Path | None = None
    log_frequency_s: float = contract.LOG_FREQUENCY_S
    start_timeout_s: float = 60.0
    # Keep Redis's state, the queued URLs and the outputs in ``data_dir`` across restarts.
    persistent: bool = True
    # More of the crawler's variables at the stack's values, which the operator's
    # environment beats, as it beats the stack's own defaults (download's MAX_HOST_RATE).
    defaults: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def redis_dir(self) -> Path:
        """redis-server's append-only file."""
        return self.data_dir / "redis"

    @property
    def broker_dir(self) -> Path:
        """The broker's storage (SeaweedFS's volumes and filer)."""
        return self.data_dir / "broker"

    @property
    def dedup_state_dir(self) -> Path:
        """The deduplication stage's journal (``DEDUP_STATE_DIR``), its whole state."""
        return self.data_dir / "dedup"

    @property
    def spool_path(self) -> Path:
        """The URLs an earlier version queued at its last clean stop, until the next start."""
        return self.data_dir / spool.SPOOL_NAME

    @property
    def outputs_dir(self) -> Path:
        """``{topic}.jsonl`` for each output topic."""
        return self.data_dir / "outputs"


def crawler_env(
    settings: StackSettings,
    kafka_bootstrap: str,
    redis_url: str,
    environ: Mapping[str, str],
) -> dict[str, str]:
    """The environment added to the crawler's processes (on top of ``environ``).

    Connection settings, the local thumbnail store and the sources file always come from
    the stack. Tuning knobs that ``environ`` sets win over the stack's defaults; loopback
    is always an allowed private network, as the demo's origin lives there.
    """
    cpus = os.cpu_count() or 1
    env = {
        "LOG_FREQUENCY_S": f"{settings.log_frequency_s:g}",
        "SOURCES_POLL_S": f"{DEFAULT_SOURCES_POLL_S:g}",
        "SHUTDOWN_GRACE_S": f"{DEFAULT_SHUTDOWN_GRACE_S:g}",
        # One image process per CPU for the whole stack, not per worker.
        "IMAGE_PROCESSES": str(max(1, cpus // max(1, settings.workers))),
        **settings.defaults,
    }
    for name in env:
        # The operator's value, also under a variable's old name (SHUTDOWN_GRACE_SECONDS).
        value = env_optional(environ, name)
        if value is not None:
            env[name] = value
    allowed = [n.strip() for n in environ.get("ALLOWED_PRIVATE_NETWORKS", "").split(",")]
    allowed = [n for n in allowed if n]
    if LOOPBACK_NETWORK not in allowed:
        allowed.append(LOOPBACK_NETWORK)
    env.update(
        {
            "KAFKA_HOSTS": kafka_bootstrap,
            "REDIS_URL": redis_url,
            "THUMBNAIL_STORE": "local",
            "THUMBNAIL_DIR": str(settings.thumbnails_dir),
            "ALLOWED_PRIVATE_NETWORKS": ",".join(allowed),
        }
    )
    if settings.sources_file is not None:
        env["SOURCES_FILE"] = str(settings.sources_file)
    return env


def monitor_metrics_port(environ: Mapping[str, str]) -> int:
    """The monitor's METRICS_PORT: the operator's, else 9100 (the compose file's, so that
    the dashboard has the same address) while it is free, else any free port."""
    chosen = env_optional(environ, "METRICS_PORT")
    if chosen is not None and chosen.isdigit():
        return int(chosen)
    return DEFAULT_MONITOR_METRICS_PORT if port_free(DEFAULT_MONITOR_METRICS_PORT) else free_port()


def metrics_env(port: int) -> dict[str, str]:
    """/metrics, /healthz (and the monitor's dashboard) on loopback only: the stack is one
    machine's, and what it serves is for its operator."""
    return {"METRICS_PORT": str(port), "METRICS_HOST": LOOPBACK}


def shutdown_grace_s(env: Mapping[str, str]) -> float:
    try:
        return max(0.0, float(env.get("SHUTDOWN_GRACE_S", DEFAULT_SHUTDOWN_GRACE_S)))
    except ValueError:
        return DEFAULT_SHUTDOWN_GRACE_S


class ChildExited(ServiceError):
    """A process of the stack exited when it should be running."""

    def __init__(self, child: Child) -> None:
        self.child = child
        super().__init__(
            f"{child.name} exited unexpectedly with status {child.returncode}; "
            f"log {child.log_path}:\n{child.log_tail(2000)}"
        )


def _quiet(message: str) -> None:
    pass


class LocalStack:
    """The processes of a local crawl; ``start()``, then ``stop()`` (also on failure).

    ``notify`` is told, in a sentence each, what a persistent stack restored at start and
    saved at stop (``up`` prints them).
    """

    def __init__(self, settings: StackSettings, notify: Callable[[str], None] = _quiet) -> None:
        self.settings = settings
        self.notify = notify
        self.objects = (
            ObjectStore(data_dir=settings.broker_dir, log_dir=settings.log_dir)
            if settings.persistent
            else None
        )
        self.broker = (
            KafkaBroker(log_dir=settings.log_dir, storage=self.objects.storage_url)
            if self.objects is not None
            else KafkaBroker(log_dir=settings.log_dir)
        )
        self.redis = RedisServer(
            log_dir=settings.log_dir,
            data_dir=settings.redis_dir if settings.persistent else None,
        )
        self.monitor: ModuleProcess | None = None
        self.workers: list[ModuleProcess] = []
        self.dedup: ModuleProcess | None = None
        self.env: dict[str, str] = {}
        self.archive: OutputArchive | None = None
        # What the last start restored and the last stop saved (None: not done).
        self.restored: int | None = None
        self.archived: Archived | None = None
        # The broker's storage was empty at the start: its topics begin anew.
        self._new_broker = True
        self._lock = DataDirLock(settings.data_dir) if settings.persistent else None
        # A persistent stack pauses its crawl while its disk is short (``disk``).
        self.disk: DiskGuard | None = None
        self._disk_redis: Redis | None = None

    @property
    def crawler_processes(self) -> list[ModuleProcess]:
        monitor = [self.monitor] if self.monitor is not None else []
        return monitor + self.workers + ([self.dedup] if self.dedup is not None else [])

    @property
    def services(self) -> list[Child]:
        """The broker's storage, the broker and redis-server, in the order they start."""
        return [*([self.objects] if self.objects is not None else []), self.broker, self.redis]

    @property
    def children(self) -> list[Child]:
        return [*self.services, *self.crawler_processes]

    def start(self) -> None:
        """Start everything, in order, and return once each process is up.

        The broker and redis-server answer requests; the monitor and every worker have
        logged that they started, and so has the deduplication stage.
        Raises ``ServiceError`` (``ChildExited`` when a process died meanwhile) after
        stopping whatever had started.
        """
        settings = self.settings
        try:
            reserve_bytes = disk_reserve_bytes(os.environ)
        except ValueError as e:
            raise ServiceError(str(e)) from e
        settings.log_dir.mkdir(parents=True, exist_ok=True)
        settings.thumbnails_dir.mkdir(parents=True, exist_ok=True)
        try:
            if self._lock is not None:
                self._lock.acquire()
            for service in self.services:
                service.pass_fds = self._lock_fds()
            if self.objects is not None:
                self._new_broker = not any(self.objects.data_dir.iterdir())
                # SeaweedFS refuses writes below this: well under the point where up
                # pauses the crawl, so that what is in flight then still fits.
                self.objects.min_free_bytes = reserve_bytes // 4
                self.objects.start()
                self.broker.storage_env = self.objects.client_env
            self.broker.start()
            self.redis.start()
            if settings.persistent:
                self._restore()
                self._start_archive()
                self.disk = self._disk_guard(reserve_bytes)
            self.env = crawler_env(settings, self.broker.bootstrap, self.redis.url, os.environ)
            self._start_crawlers()
        except BaseException:
            self.stop()
            raise

    def _start_crawlers(self) -> None:
        """Start the monitor, the workers and the deduplication stage; return once each
        has logged that it is up."""
        settings = self.settings
        self.monitor = ModuleProcess(
            "monitor",
            "crawl_monitor",
            {**self.env, **metrics_env(monitor_metrics_port(os.environ))},
            settings.log_dir / "monitor.log",
        )
        self.workers = [
            ModuleProcess(
                f"worker-{i}",
                "worker",
                {**self.env, **metrics_env(free_port())},
                settings.log_dir / f"worker-{i}.log",
            )
            for i in range(1, settings.workers + 1)
        ]
        if settings.persistent:
            _create_topic(self.broker.bootstrap, contract.METADATA_TOPIC, METADATA_PARTITIONS)
            # The stack's folder, whatever the operator's DEDUP_STATE_DIR: the journal
            # must stay with the broker whose topics and offsets it answered.
            state = {"DEDUP_STATE_DIR": str(settings.dedup_state_dir)}
            self.dedup = ModuleProcess(
                "dedup",
                "dedup",
                {**self.env, **state, **metrics_env(free_port())},
                settings.log_dir / "dedup.log",
            )
        marks = {}
        for process in self.crawler_processes:
            marks[process.name] = _log_size(process.log_path)
            process.pass_fds = self._lock_fds()
            process.start()
        self._wait_started(self.monitor, {"monitor_started"}, marks["monitor"])
        for worker in self.workers:
            self._wait_started(worker, {"worker_started"}, marks[worker.name])
        if self.dedup is not None:
            self._wait_started(self.dedup, {"dedup_started"}, marks["dedup"])

    def _restore(self) -> None:
        """Put the URLs an earlier version spooled at its last stop back in the broker."""
        path = self.settings.spool_path
        try:
            self.restored = spool.restore(self.broker.bootstrap, path)
        except (KafkaError, OSError, spool.SpoolError) as e:
            raise ServiceError(f"could not restore the queued URLs from {path}: {e!r}") from e
        if self.restored:
            self.notify(f"restored {self.restored:,} queued URLs from {path}")

    def _start_archive(self) -> None:
        self.archive = OutputArchive(
            self.broker.bootstrap, self.settings.outputs_dir, new_broker=self._new_broker
        )
        self.archive.start()

    def _disk_guard(self, reserve_bytes: int) -> DiskGuard:
        settings = self.settings
        self._disk_redis = Redis.from_url(
            self.redis.url, socket_timeout=2.0, socket_connect_timeout=2.0
        )
        folders = [settings.data_dir]
        if _device(settings.thumbnails_dir) != _device(settings.data_dir):
            folders.append(settings.thumbnails_dir)
        return DiskGuard(
            folders,
            reserve_bytes,
            self._disk_redis,
            EventLog(settings.log_dir / UP_LOG_NAME),
            self.notify,
        )

    def check_disk(self) -> None:
        """Pause the crawl while the data folder's disk is short, resume once it is not
        (``crawlctl.localstack.disk``); call it often, it looks every second."""
        if self.disk is not None:
            self.disk.check()

    def _wait_started(self, process: ModuleProcess, events: Set[str], offset: int) -> None:
        """Wait until ``process`` has logged one of ``events`` past byte ``offset``."""

        def started() -> bool:
            if not process.running:
                raise ChildExited(process)
            return any(e.get("event") in events for e in read_events(process.log_path, offset))

        try:
            wait_until(
                started,
                self.settings.start_timeout_s,
                interval_s=0.05,
                what=f"{process.name} to start",
            )
        except TimeoutError as e:
            raise ServiceError(f"{e}; log {process.log_path}:\n{process.log_tail(2000)}") from e

    def exited(self) -> list[Child]:
        """Processes of the stack that are no longer running (none, while all is well)."""
        return [child for child in self.children if child.pid is not None and not child.running]

    def stop(self) -> dict[str, int | None]:
        """Stop everything in order; returns each process's exit status. Idempotent."""
        statuses: dict[str, int | None] = {}
        grace_s = shutdown_grace_s(self.env) + STOP_MARGIN_S
        for worker in self.workers:
            worker.terminate()
        for worker in self.workers:
            statuses[worker.name] = worker.wait(grace_s)
        # The stage ends the batch in hand; what it has not read yet it places at the next
        # start, read again from its commit.
        for process in (self.monitor, self.dedup):
            if process is not None:
                process.terminate()
        if self.monitor is not None:
            statuses[self.monitor.name] = self.monitor.wait(
                contract.MONITOR_STOP_GRACE_S + STOP_MARGIN_S
            )
        if self.dedup is not None:
            statuses[self.dedup.name] = self.dedup.wait(DEDUP_STOP_TIMEOUT_S + STOP_MARGIN_S)
        self._archive_last()
        # The broker's storage stops last: the broker writes to it until it exits.
        for service in (self.broker, self.redis):
            service.terminate()
        for service in (self.broker, self.redis):
            statuses[service.name] = service.wait()
        if self.objects is not None:
            self.objects.terminate()
            statuses[self.objects.name] = self.objects.wait()
        if self._disk_redis is not None:
            self._disk_redis.close()
            self._disk_redis = None
        self.disk = None
        if self._lock is not None:
            self._lock.release()
        return statuses

    def _lock_fds(self) -> tuple[int, ...]:
        fd = self._lock.fd if self._lock is not None else None
        return () if fd is None else (fd,)

    def _archive_last(self) -> None:
        """Archive the last outputs, now that nothing produces."""
        if self.archive is not None:
            self.archived = self.archive.stop(read_to_end=self.broker.running)
            self.archive = None
            self._say_archived(self.archived)

    def _say_archived(self, archived: Archived) -> None:
        counts = ", ".join(f"{n:,} {topic}" for topic, n in archived.counts.items())
        self.notify(f"outputs of this run archived in {archived.folder}: {counts}")
        if archived.error is not None:
            self.notify(f"the outputs archive may miss the last messages: {archived.error}")


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create ``topic`` unless it exists. Raises ``ServiceError``."""

    async def create() -> Any:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            return await admin.create_topics([NewTopic(topic, partitions, 1)])
        finally:
            await admin.close()

    try:
        response = asyncio.run(create())
    except KafkaError as e:
        raise ServiceError(f"could not create {topic}: {e!r}") from e
    for name, code, message, *_ in getattr(response, "topic_errors", []):
        if code not in (0, TOPIC_ALREADY_EXISTS):
            raise ServiceError(f"could not create {name}: error {code} {message}")


def _device(path: Path) -> int | None:
    try:
        return path.stat().st_dev
    except OSError:
        return None


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def read_events(path: Path, offset: int = 0) -> list[dict[str, Any]]:
    """The JSON log events in ``path`` after byte ``offset`` (other lines are skipped)."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return []
    events = []
    for line in data.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events
