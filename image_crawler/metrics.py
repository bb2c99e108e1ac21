"""The HTTP side of a process's metrics: ``/metrics``, ``/healthz`` and extra routes.

Both processes serve it on ``METRICS_PORT`` when that is set (unset: no HTTP server),
or on the first free port of its range ``FIRST-LAST``.
It runs on the process's own event loop (aiohttp), not in prometheus-client's thread,
so that a route can read the process's state without locks.

``/metrics`` is the Prometheus text exposition of ``registry``, gzipped when the client
accepts it; ``/healthz`` answers 200
with ``{"ok": true}`` while ``health()`` returns no problem, and 503 with the problems
otherwise, for compose health checks and load balancers.
"""

from __future__ import annotations

import contextlib
import errno
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Final

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from image_crawler.logs import get_logger

log = get_logger(__name__)

# Smaller bodies go as they are: compressing them saves less than it costs.
COMPRESS_FROM_BYTES: Final = 4096

# Problems that make /healthz answer 503; empty when healthy.
HealthCheck = Callable[[], Sequence[str]]


def _healthy() -> Sequence[str]:
    return ()


def build_app(
    registry: CollectorRegistry = REGISTRY,
    *,
    health: HealthCheck = _healthy,
    routes: Sequence[web.RouteDef] = (),
) -> web.Application:
    """The application: ``/metrics``, ``/healthz`` and ``routes``."""

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        response = web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
        if len(body) >= COMPRESS_FROM_BYTES:
            # With every source labelled the text runs to hundreds of KB, and it compresses
            # about 10x; Prometheus and browsers ask for gzip (Accept-Encoding).
            response.enable_compression()
        return response

    async def healthz(_: web.Request) -> web.Response:
        problems = list(health())
        status = 503 if problems else 200
        body = {"ok": not problems, "problems": problems}
        return web.Response(status=status, text=json.dumps(body), content_type="application/json")

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics), web.get("/healthz", healthz), *routes])
    return app


@contextlib.asynccontextmanager
async def serving(
    port: int | None,
    host: str,
    registry: CollectorRegistry = REGISTRY,
    *,
    port_last: int | None = None,
    health: HealthCheck = _healthy,
    routes: Sequence[web.RouteDef] = (),
) -> AsyncIterator[int | None]:
    """Serve the application on ``host:port`` while the block runs; yields the bound port
    (``port`` 0 picks a free one), or None when ``port`` is None (metrics off).

    With ``port_last``, on the first free port from ``port`` to ``port_last`` (both
    included), for processes that share a network namespace: a port in use moves on to
    the next one, and OSError (EADDRINUSE) names the range when every port is in use.
    """
    if port is None:
        yield None
        return
    runner = web.AppRunner(build_app(registry, health=health, routes=routes), access_log=None)
    await runner.setup()
    try:
        bound = await _start_site(runner, host, port, port if port_last is None else port_last)
        log.info("metrics_serving", host=host, port=bound)
        yield bound
    finally:
        await runner.cleanup()


async def _start_site(runner: web.AppRunner, host: str, first: int, last: int) -> int:
    """Start a site on the first free port of ``first``..``last``; the port it bound."""
    for port in range(first, last + 1):
        # No SO_REUSEPORT (aiohttp's default): two processes must never share a port.
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as e:
            await site.stop()  # a site that failed to start stays registered otherwise
            if e.errno != errno.EADDRINUSE or first == last:
                raise
            continue
        # The bound port (port 0 picks one): only the server's sockets know it.
        sockets = getattr(site._server, "sockets", None)
        return int(sockets[0].getsockname()[1]) if sockets else port
    raise OSError(errno.EADDRINUSE, f"METRICS_PORT {first}-{last}: every port is in use on {host}")
