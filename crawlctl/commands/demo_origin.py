"""The demo's web server: the bundled samples, served on loopback as the plan lays them
out, with the time of every request so that the summary can show each source's rate.

Its own module because aiohttp's server is loaded only when a demo runs.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from crawlctl.commands.demo_plan import DemoPlan


class DemoOrigin:
    """The demo's web server on 127.0.0.1 (a free port), on the caller's event loop.

    Serves each planned item at its path (404 for the missing one and anything else) and
    remembers when each source was asked, to measure the rate it was crawled at.
    """

    def __init__(self, plan: DemoPlan, host: str = "127.0.0.1") -> None:
        self._routes = {item.path: item.sample for item in plan.items if item.sample is not None}
        self._host = host
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.requests: dict[str, list[float]] = defaultdict(list)

    def url(self, path: str) -> str:
        return f"http://{self._host}:{self.port}{path}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._serve)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _serve(self, request: web.Request) -> web.Response:
        source = request.path.split("/")[1] if request.path.count("/") >= 2 else ""
        self.requests[source].append(time.monotonic())
        sample = self._routes.get(request.path)
        if sample is None:
            return web.Response(status=404, text="not found\n")
        return web.Response(body=sample.body, content_type=sample.content_type)

    def observed_rate(self, source: str) -> float | None:
        """Requests/s the source was crawled at, over at least one second.

        A source with fewer URLs than its rate is done within a second: its figure is then
        its URL count, not its rate.
        """
        times = self.requests.get(source, [])
        if not times:
            return None
        return len(times) / max(1.0, times[-1] - times[0])
