"""The campaign's web servers: ``python -m chaos.origin --port P --log FILE`` serves every
host of ``chaos.plan`` (one loopback address each, on one port) as the plan says it
behaves, and writes each request to FILE as it arrives, one JSON array a line:
``[unix time, host, path, status, retry-after seconds]``.

It runs in a process of its own, so that the times it writes are the requests' arrival
as a web server would log them, whatever the campaign's own process is busy with.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import json
import os
import signal
import time
from collections import defaultdict, deque
from typing import IO

from aiohttp import web
from PIL import Image

from chaos import plan

BROKEN_BODY = b"this is not an image, whatever its name says\n" * 20


def _images() -> list[bytes]:
    """A few small JPEGs of different sizes and colours (a thumbnail is made of each)."""
    bodies = []
    for i, size in enumerate([(320, 240), (800, 600), (64, 64), (1200, 300)]):
        out = io.BytesIO()
        Image.new("RGB", size, (40 * i, 200 - 30 * i, 90)).save(out, "JPEG", quality=85)
        bodies.append(out.getvalue())
    return bodies


def _digest(path: str) -> int:
    return int.from_bytes(hashlib.blake2b(path.encode(), digest_size=4).digest(), "big")


class Origin:
    def __init__(self, log: IO[str]) -> None:
        self._log = log
        self._images = _images()
        self._image_requests: dict[str, int] = defaultdict(int)
        self._served: dict[str, deque[float]] = defaultdict(deque)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        now = time.time()
        host = _local_address(request)
        behaviour = plan.HOSTS[host].behaviour if host in plan.HOSTS else None
        response, retry_after = await self._answer(request.path, host, behaviour)
        self._log.write(json.dumps([now, host, request.path, response.status, retry_after]))
        self._log.write("\n")
        return response

    async def _answer(
        self, path: str, host: str, behaviour: str | None
    ) -> tuple[web.Response, int]:
        if behaviour is None:
            return web.Response(status=421, text="not a host of this campaign\n"), 0
        if path == "/robots.txt":
            delay = (
                f"Crawl-delay: {plan.CRAWL_DELAY_S:g}\n" if behaviour == plan.CRAWL_DELAY else ""
            )
            return web.Response(text=f"User-agent: *\n{delay}Allow: /\n"), 0
        kind = plan.kind_of(path)
        if kind is None:
            return web.Response(status=404, text="not found\n"), 0
        refused = self._refusal(host, behaviour)
        if refused is not None:
            return refused
        if behaviour == plan.SLOW:
            low, high = plan.SLOW_S
            await asyncio.sleep(low + (high - low) * (_digest(path) % 1000) / 1000)
        if kind == plan.MISSING:
            return web.Response(status=404, text="gone\n"), 0
        if kind == plan.BROKEN:
            return web.Response(body=BROKEN_BODY, content_type="image/jpeg"), 0
        body = self._images[_digest(path) % len(self._images)]
        return web.Response(body=body, content_type="image/jpeg"), 0

    def _refusal(self, host: str, behaviour: str) -> tuple[web.Response, int] | None:
        """A 429 with Retry-After every few requests, or a 503 over capacity."""
        self._image_requests[host] += 1
        if (
            behaviour == plan.RETRY_AFTER
            and self._image_requests[host] % plan.RETRY_AFTER_EVERY == 0
        ):
            headers = {"Retry-After": str(plan.RETRY_AFTER_S)}
            return web.Response(status=429, text="slow down\n", headers=headers), plan.RETRY_AFTER_S
        if behaviour == plan.CAPACITY:
            served, now = self._served[host], time.monotonic()
            while served and served[0] <= now - 1.0:
                served.popleft()
            if len(served) >= plan.CAPACITY_RPS:
                return web.Response(status=503, text="over capacity\n"), 0
            served.append(now)
        return None


def _local_address(request: web.Request) -> str:
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    return sockname[0] if sockname else ""


async def serve(port: int, log: IO[str]) -> None:
    origin = Origin(log)
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", origin.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    for address in plan.HOSTS:
        await web.TCPSite(runner, address, port).start()
    print(f"chaos origin serving {len(plan.HOSTS)} hosts on port {port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def _prompt() -> None:
    """Real-time scheduling where allowed (root): the times logged are the requests'
    arrival, as on a server of its own, not when a CPU shared with the crawl's processes
    (on this machine) got round to them. Without it, the log says so."""
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
    except (OSError, AttributeError) as e:
        print(f"chaos origin: no real-time scheduling ({e}); request times may lag", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    _prompt()
    # Line-buffered: a line is in the file once its request is answered, so a campaign
    # that reads the file after a kill of the origin loses at most the last line.
    with open(args.log, "a", buffering=1) as log:
        asyncio.run(serve(args.port, log))


if __name__ == "__main__":
    main()
