"""A local HTTP origin for crawl tests: an aiohttp server in its own thread and event loop.

Running on its own loop makes it independent of the test's loop (any pytest-asyncio loop
scope, or a synchronous test) and of whatever the code under test does to that loop.
Routes are registered at runtime, per exact path::

    origin = Origin().start()
    origin.add("/cat.jpg", jpeg_bytes, "image/jpeg")
    origin.add_sequence("/flaky.jpg", [500, Reply(jpeg_bytes, "image/jpeg")])
    origin.add_disconnect("/rude.jpg")
    url = origin.url("/cat.jpg")
    ...
    assert origin.requests("/cat.jpg") == 1
    origin.stop()

Unknown paths answer 404. Every request is counted and logged with its monotonic time,
and its headers are kept (``origin.request_headers("/cat.jpg")``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Self

from aiohttp import web
from multidict import CIMultiDict

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

LOOPBACK = "127.0.0.1"


@dataclasses.dataclass(frozen=True, slots=True)
class Reply:
    """One canned response; ``delay_s`` waits before answering (cut short by ``stop()``)."""

    body: bytes = b""
    content_type: str = "application/octet-stream"
    status: int = 200
    headers: Mapping[str, str] | None = None
    delay_s: float = 0.0


class Disconnect:
    """Close the connection without sending any response."""

    def __repr__(self) -> str:
        return "DISCONNECT"


DISCONNECT = Disconnect()

Step = Reply | Disconnect | int


def _as_step(step: Step) -> Reply | Disconnect:
    if isinstance(step, int):
        return Reply(f"{step}\n".encode(), "text/plain", status=step)
    if isinstance(step, Reply | Disconnect):
        return step
    raise TypeError(f"a response is a Reply, DISCONNECT or a status int, not {step!r}")


class _Sequence:
    def __init__(self, steps: Iterable[Step]):
        self.steps = [_as_step(step) for step in steps]
        if not self.steps:
            raise ValueError("a sequence needs at least one response")
        self.served = 0

    def next(self) -> Reply | Disconnect:
        step = self.steps[min(self.served, len(self.steps) - 1)]
        self.served += 1
        return step


Route = Reply | Disconnect | _Sequence | Handler


class Origin:
    """An HTTP server on ``127.0.0.1`` (a free port) with routes registered at runtime.

    Thread-safe: routes may be added and counters read from any thread while it serves.
    Routes match ``path?query`` exactly first, then the bare path.
    """

    def __init__(self, *, host: str = LOOPBACK, port: int = 0, shutdown_timeout_s: float = 1.0):
        self.host = host
        self.port = port
        self.shutdown_timeout_s = shutdown_timeout_s
        self._routes: dict[str, Route] = {}
        self._log: list[tuple[float, str]] = []
        self._headers: list[tuple[str, str, CIMultiDict[str]]] = []
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # --- lifecycle ----------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url(self, path: str) -> str:
        """``base_url`` + ``path`` (which starts with ``/``)."""
        return f"{self.base_url}{path}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout_s: float = 10.0) -> Self:
        """Start serving in a background thread; returns once the port is listening."""
        if self.running:
            raise RuntimeError("origin already running")
        self._ready.clear()
        self._error = None
        self._thread = threading.Thread(target=self._run, name="test-origin", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError(f"origin did not start listening within {timeout_s:g} s")
        if self._error is not None:
            self._thread.join(timeout_s)
            raise RuntimeError("origin failed to start") from self._error
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving: slow responses are cut short, open connections closed. Idempotent."""
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None:
            return
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed in the meantime
                loop.call_soon_threadsafe(stopping.set)
        thread.join(timeout_s)
        if thread.is_alive():
            raise TimeoutError(f"origin thread did not stop within {timeout_s:g} s")
        self._thread = None
        if self._error is not None:
            raise RuntimeError("origin thread failed") from self._error

    def __enter__(self) -> Self:
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except Exception as exc:  # noqa: BLE001 - the thread's top level: start()/stop() re-raise it
            self._error = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=self.shutdown_timeout_s)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port)
            await site.start()
            self.port = int(runner.addresses[0][1])
            self._ready.set()
            await self._stopping.wait()
        finally:
            await runner.cleanup()

    # --- routes -------------------------------------------------------------------------
    def _set(self, path: str, route: Route) -> None:
        if not path.startswith("/"):
            raise ValueError(f"path must start with '/': {path!r}")
        with self._lock:
            self._routes[path] = route

    def add(
        self,
        path: str,
        body: bytes,
        content_type: str,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
    ) -> str:
        """Serve ``body`` at ``path``; returns the full URL."""
        self._set(path, Reply(body, content_type, status, headers))
        return self.url(path)

    def set_robots(self, text: str | bytes, content_type: str = "text/plain") -> str:
        """Serve ``text`` as this host's /robots.txt; returns its URL."""
        body = text.encode() if isinstance(text, str) else text
        return self.add("/robots.txt", body, content_type)

    def add_handler(self, path: str, handler: Handler) -> str:
        """Serve ``path`` with ``async handler(request) -> web.StreamResponse``.

        The handler runs on the origin's own event loop, not the test's.
        """
        self._set(path, handler)
        return self.url(path)

    def add_status(self, path: str, status: int) -> str:
        """Answer ``status`` with a short text body (e.g. 404, 429, 500)."""
        self._set(path, _as_step(status))
        return self.url(path)

    def add_sequence(self, path: str, responses: Iterable[Step]) -> str:
        """The n-th request gets the n-th response; later requests repeat the last one.

        Each response is a ``Reply``, ``DISCONNECT`` or a status int.
        """
        self._set(path, _Sequence(responses))
        return self.url(path)

    def add_disconnect(self, path: str) -> str:
        """Close the connection without any response (clients see a server disconnect)."""
        self._set(path, DISCONNECT)
        return self.url(path)

    def add_slow(
        self, path: str, body: bytes, delay_s: float, content_type: str = "image/jpeg"
    ) -> str:
        """Wait ``delay_s`` before answering 200 with ``body``; ``stop()`` cuts the wait short."""
        self._set(path, Reply(body, content_type, delay_s=delay_s))
        return self.url(path)

    def remove(self, path: str) -> None:
        """Forget the route: ``path`` answers 404 again."""
        with self._lock:
            self._routes.pop(path, None)

    # --- observations -------------------------------------------------------------------
    def requests(self, path: str) -> int:
        """How many requests arrived for ``path`` (with any query string, unless given one)."""
        with self._lock:
            return self._counts[path]

    @property
    def request_log(self) -> list[tuple[float, str]]:
        """A copy of ``(time.monotonic(), path_with_query)`` for every request, in order."""
        with self._lock:
            return list(self._log)

    def request_headers(self, path: str | None = None) -> list[CIMultiDict[str]]:
        """The headers of every request (only those for ``path``, with any query string,
        when given), in arrival order."""
        with self._lock:
            return [
                headers.copy()
                for bare, path_qs, headers in self._headers
                if path is None or path in (bare, path_qs)
            ]

    @property
    def total_requests(self) -> int:
        with self._lock:
            return len(self._log)

    # --- serving ------------------------------------------------------------------------
    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        path, path_qs = request.path, request.path_qs
        with self._lock:
            self._log.append((time.monotonic(), path_qs))
            self._headers.append((path, path_qs, request.headers.copy()))
            self._counts[path] += 1
            if path_qs != path:
                self._counts[path_qs] += 1
            route = self._routes.get(path_qs) or self._routes.get(path)
            step = route.next() if isinstance(route, _Sequence) else route
        if step is None:
            return web.Response(status=404, text="not found\n")
        if isinstance(step, Disconnect):
            return self._disconnect(request)
        if isinstance(step, Reply):
            if step.delay_s > 0 and not await self._wait_unless_stopping(step.delay_s):
                return self._disconnect(request)
            # A multidict's repeated headers stay repeated (X-Robots-Tag, say).
            headers = CIMultiDict(step.headers or {})
            headers.setdefault("Content-Type", step.content_type)
            return web.Response(body=step.body, status=step.status, headers=headers)
        return await step(request)

    @staticmethod
    def _disconnect(request: web.Request) -> web.Response:
        # Closing before any byte is written: the client reads EOF where the status line
        # should be (aiohttp: ServerDisconnectedError). aiohttp's server then fails to
        # write the returned response and ignores that as a premature disconnection.
        if request.transport is not None:
            request.transport.close()
        return web.Response(status=499)

    async def _wait_unless_stopping(self, delay_s: float) -> bool:
        """Sleep ``delay_s``; False if the origin began stopping first."""
        assert self._stopping is not None
        try:
            await asyncio.wait_for(self._stopping.wait(), delay_s)
        except TimeoutError:
            return True
        return False
