"""Real services on free loopback ports for the tests: a Kafka-protocol broker, redis-server,
an S3 server, and Kafka helpers.

The broker and redis-server are the ones ``image-crawler up`` runs
(``crawlctl.localstack.services``), with the controls only fault tests need added here:
``pause()`` (SIGSTOP: the process keeps its port but answers nothing, a hung service),
``resume()`` (SIGCONT), ``restart()`` on the same port, and redis-server's ``flushall()``.
The S3 server (moto, a test dependency) and the Kafka helpers are the tests' own. Each
service is a subprocess whose output goes to a log file (``.log_path``); ``start()``
returns once the service answers a real request and raises with the log's tail when it
does not. ``stop()`` sends SIGTERM and SIGKILLs after a deadline; ``kill()`` is a crash.

Waiting is done with ``wait_until`` / ``wait_for`` only: a condition polled against a
deadline, never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import random
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Self, TypeVar, overload

from crawlctl.localstack import services as localstack
from crawlctl.localstack.processes import ServiceError, timeout_error, wait_until
from crawlctl.localstack.services import (
    LOOPBACK,
    Service,
    free_port,
    kafka_metadata_brokers,
    redis_command,
    redis_server_binary,
)
from image_crawler.ports import PortRange

__all__ = [
    "LOOPBACK",
    "S3_ACCESS_KEY_ID",
    "S3_REGION",
    "S3_SECRET_ACCESS_KEY",
    "KafkaBroker",
    "RedisServer",
    "S3Server",
    "ServiceError",
    "create_bucket",
    "create_topics",
    "free_port",
    "free_port_range",
    "get_object",
    "kafka_metadata_brokers",
    "list_keys",
    "produce",
    "put_object",
    "read_records",
    "read_topic",
    "redis_command",
    "redis_server_binary",
    "s3_client",
    "wait_for",
    "wait_until",
]

T = TypeVar("T")


# --- waiting ------------------------------------------------------------------------------


@overload
async def wait_for(
    predicate: Callable[[], Awaitable[T]],
    timeout_s: float,
    interval_s: float = ...,
    what: str = ...,
    *,
    ignore: tuple[type[BaseException], ...] = ...,
) -> T: ...
@overload
async def wait_for(
    predicate: Callable[[], T],
    timeout_s: float,
    interval_s: float = ...,
    what: str = ...,
    *,
    ignore: tuple[type[BaseException], ...] = ...,
) -> T: ...
async def wait_for(
    predicate: Callable[[], Any],
    timeout_s: float,
    interval_s: float = 0.02,
    what: str = "condition",
    *,
    ignore: tuple[type[BaseException], ...] = (),
) -> Any:
    """The async ``wait_until``: ``predicate`` may be a plain or an async function.

    A single call of an async predicate is not interrupted by the deadline; give it its own
    timeout if it can hang.
    """
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            result = predicate()
            if inspect.isawaitable(result):
                result = await result
        except ignore as exc:
            last_error = exc
        else:
            if result:
                return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise timeout_error(what, timeout_s, last_error) from last_error
        await asyncio.sleep(min(interval_s, remaining))


# Below Linux's ephemeral ports (32768-60999), which outgoing connections take meanwhile.
PORT_RUNS_FROM = 20000
PORT_RUNS_TO = 32000


def free_port_range(count: int) -> PortRange:
    """``count`` consecutive ports that 127.0.0.1 could bind a moment ago."""
    for _ in range(200):
        first = random.randrange(PORT_RUNS_FROM, PORT_RUNS_TO - count)
        if all(localstack.port_free(port) for port in range(first, first + count)):
            return PortRange(first, first + count - 1)
    raise RuntimeError(f"no run of {count} free ports in {PORT_RUNS_FROM}-{PORT_RUNS_TO}")


# --- fault controls -----------------------------------------------------------------------


class FaultControls(Service):
    """What fault tests do to a service beyond starting and stopping it."""

    _paused = False

    @property
    def paused(self) -> bool:
        return self._paused and self.running

    def pause(self) -> None:
        """SIGSTOP: the process keeps its port but answers nothing (a hung service)."""
        if not self.running:
            raise ServiceError(f"{self.name} is not running")
        self._signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT after ``pause()``."""
        self._signal(signal.SIGCONT)
        self._paused = False

    def restart(self) -> Self:
        """Stop (if running) and start again on the same port."""
        self.stop()
        self._fixed_port = True
        return self.start()

    def terminate(self) -> None:
        super().terminate()
        if self._paused:  # a stopped process only acts on SIGTERM once continued
            self._signal(signal.SIGCONT)

    def _after_exit(self) -> None:
        self._paused = False
        super()._after_exit()

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running" if self.running else "stopped"
        return f"<{type(self).__name__} port={self.port} {state} log={self.log_path}>"


class KafkaBroker(FaultControls, localstack.KafkaBroker):
    """The local stack's tansu broker, with the fault controls."""


class RedisServer(FaultControls, localstack.RedisServer):
    """The local stack's redis-server, with the fault controls."""

    def flushall(self) -> None:
        """Delete every key in every database."""
        reply = redis_command(self.port, "FLUSHALL")
        if reply != b"+OK":
            raise ServiceError(f"FLUSHALL answered {reply!r}")


# --- Kafka helpers ------------------------------------------------------------------------


async def create_topics(bootstrap: str, names: Iterable[str], partitions: int = 1) -> None:
    """Create topics with ``partitions`` partitions each (replication factor 1)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1) for name in names]
        )
    finally:
        await admin.close()
    errors = [
        (topic, code, message)
        for topic, code, message, *_ in getattr(response, "topic_errors", [])
        if code != 0
    ]
    if errors:
        raise RuntimeError(f"create_topics failed: {errors}")


async def produce(
    bootstrap: str, topic: str, values: Iterable[bytes], *, key: bytes | None = None
) -> None:
    """Produce ``values`` to ``topic`` with acks=all and wait for every acknowledgement."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        futures = [await producer.send(topic, value, key=key) for value in values]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def read_records(
    bootstrap: str, topic: str, *, min_messages: int, timeout_s: float = 10.0
) -> list[Any]:
    """Like ``read_topic`` but returns aiokafka ``ConsumerRecord`` objects (key, partition...)."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    records: list[Any] = []
    try:
        deadline = time.monotonic() + timeout_s

        # Without a group, subscribing assigns every partition of the topic and keeps
        # refreshing metadata until the topic exists; earliest offsets, no commits.
        consumer.subscribe([topic])
        while len(records) < min_messages:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                exists = topic in await consumer.topics()
                raise TimeoutError(
                    f"read {len(records)} of {min_messages} messages from {topic!r} "
                    f"in {timeout_s:g} s" + ("" if exists else f" (topic {topic!r} does not exist)")
                )
            batch = await consumer.getmany(timeout_ms=max(1, int(min(remaining, 0.2) * 1000)))
            for partition_records in batch.values():
                records.extend(partition_records)
    finally:
        await consumer.stop()
    return records


async def read_topic(
    bootstrap: str, topic: str, *, min_messages: int, timeout_s: float = 10.0
) -> list[bytes]:
    """Read ``topic`` from the beginning WITHOUT a consumer group until ``min_messages``.

    All partitions are assigned by hand, so tansu's slow group protocol is not involved.
    Returns every value read so far (at least ``min_messages``; the order across partitions
    is not defined). Raises ``TimeoutError`` saying how many arrived.
    """
    records = await read_records(bootstrap, topic, min_messages=min_messages, timeout_s=timeout_s)
    return [record.value for record in records]


# --- S3 (moto) ----------------------------------------------------------------------------

S3_ACCESS_KEY_ID = "testing"
S3_SECRET_ACCESS_KEY = "testing"
S3_REGION = "us-east-1"


class S3Server(FaultControls):
    """moto's S3 server in a subprocess; ``.endpoint_url`` and client settings in ``.env``."""

    name = "s3"
    start_timeout_s = 30.0  # moto imports a lot of Python

    @property
    def endpoint_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """Environment for S3 clients (the crawler's settings read these names)."""
        return {
            "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": S3_SECRET_ACCESS_KEY,
            "AWS_DEFAULT_REGION": S3_REGION,
            "S3_ENDPOINT_URL": self.endpoint_url,
        }

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(self.port)]

    def _env(self) -> Mapping[str, str]:
        env = dict(os.environ)
        env.update(self.env)
        env["MOTO_PORT"] = str(self.port)  # moto builds its own URLs from this
        env.pop("PYTHONWARNINGS", None)  # "error" there would turn moto's own warnings fatal
        return env

    def _probe(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint_url}/", timeout=1.0) as response:
                response.read()
        except urllib.error.HTTPError as exc:  # an HTTP error status is still an answer
            exc.close()
        return True


def s3_client(endpoint_url: str) -> Any:
    """A synchronous boto3 S3 client for the test server; close it after use."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=S3_ACCESS_KEY_ID,
        aws_secret_access_key=S3_SECRET_ACCESS_KEY,
        region_name=S3_REGION,
    )


def create_bucket(endpoint_url: str, bucket: str) -> None:
    with contextlib.closing(s3_client(endpoint_url)) as client:
        client.create_bucket(Bucket=bucket)


def put_object(endpoint_url: str, bucket: str, key: str, data: bytes) -> None:
    with contextlib.closing(s3_client(endpoint_url)) as client:
        client.put_object(Bucket=bucket, Key=key, Body=data)


def get_object(endpoint_url: str, bucket: str, key: str) -> bytes:
    """The object's bytes; raises botocore's ``ClientError`` (NoSuchKey) when absent."""
    with contextlib.closing(s3_client(endpoint_url)) as client:
        response = client.get_object(Bucket=bucket, Key=key)
        with contextlib.closing(response["Body"]) as body:
            return bytes(body.read())


def list_keys(endpoint_url: str, bucket: str) -> set[str]:
    with contextlib.closing(s3_client(endpoint_url)) as client:
        keys: set[str] = set()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            keys.update(item["Key"] for item in page.get("Contents", []))
        return keys
