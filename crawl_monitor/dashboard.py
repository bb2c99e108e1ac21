"""The operator's dashboard at ``/`` on the monitor's METRICS_PORT (stub; issue 18)."""

from __future__ import annotations

from aiohttp import web


def routes() -> list[web.RouteDef]:
    """The dashboard's routes, added to the monitor's metrics server."""

    async def index(_: web.Request) -> web.Response:
        return web.Response(text="<!doctype html><title>image-crawler</title>", content_type="text/html")

    return [web.get("/", index)]
