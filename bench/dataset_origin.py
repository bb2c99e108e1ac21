"""The dataset comparison's origin: ``python -m bench.dataset_origin CORPUS_DIR --hosts N PORT``.

A process of its own (its CPU is neither tool's). It answers on HOSTS loopback addresses
(``host_addresses``: 127.2.0.1 onwards, the same PORT; apart from the other benchmarks'
ranges), ``GET /{n}.jpg`` with the corpus's "mixed" file ``n % files``. Two hosts are
not like the others:

- the first (``DISALLOWED``) has a robots.txt that disallows everything;
- the second (``LIMITED``) serves at most one image a second and answers any request
  sooner than that 429 with ``Retry-After: 1`` (a server that says how fast it may be
  asked, as many do).

Every other host has no robots.txt (a 404: everything allowed). ``GET /_stats`` (on any
address, 127.0.0.1 among them, which serves nothing else) answers, per host: requests,
images served, 429s, and the most requests that arrived in any one second; ``POST
/_reset`` forgets them (between two runs).
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path
from typing import Final

from aiohttp import web

from bench.origin import load

_NET: Final = "127.2.0"
DISALLOWED: Final = 0  # index of the host that disallows everything
LIMITED: Final = 1  # index of the host that answers 429 beyond one image a second
LIMIT_INTERVAL_S: Final = 1.0


def host_addresses(count: int) -> list[str]:
    if not 1 <= count <= 250:
        raise ValueError(f"1 to 250 hosts, not {count}")
    return [f"{_NET}.{i}" for i in range(1, count + 1)]


def most_in_a_second(times: list[float]) -> int:
    """The most of ``times`` (sorted, seconds) within any window of one second."""
    best = start = 0
    for end, t in enumerate(times):
        while t - times[start] >= 1.0:
            start += 1
        best = max(best, end - start + 1)
    return best


class Hosts:
    """What each host was asked, by its address."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses
        self.reset()

    def reset(self) -> None:
        self.arrivals: dict[str, list[float]] = collections.defaultdict(list)
        self.images: collections.Counter[str] = collections.Counter()
        self.refused: collections.Counter[str] = collections.Counter()
        self.last_served: dict[str, float] = {}

    def summary(self) -> dict[str, object]:
        return {
            host: {
                "requests": len(self.arrivals[host]),
                "images": self.images[host],
                "429": self.refused[host],
                "most_in_a_second": most_in_a_second(self.arrivals[host]),
            }
            for host in self.addresses
        }


def make_app(bodies: list[bytes], hosts: Hosts) -> web.Application:
    disallowed = hosts.addresses[DISALLOWED]
    limited = hosts.addresses[LIMITED]

    def address(request: web.Request) -> str:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        return sockname[0] if sockname else ""

    async def image(request: web.Request) -> web.Response:
        host, now = address(request), time.monotonic()
        hosts.arrivals[host].append(now)
        if host == limited:
            last = hosts.last_served.get(host)
            if last is not None and now - last < LIMIT_INTERVAL_S:
                hosts.refused[host] += 1
                return web.Response(status=429, headers={"Retry-After": "1"}, text="slow down")
            hosts.last_served[host] = now
        hosts.images[host] += 1
        n = int(request.match_info["n"])
        return web.Response(body=bodies[n % len(bodies)], content_type="image/jpeg")

    async def robots(request: web.Request) -> web.Response:
        host = address(request)
        hosts.arrivals[host].append(time.monotonic())
        if host == disallowed:
            return web.Response(text="User-agent: *\nDisallow: /\n")
        return web.Response(status=404, text="no robots.txt")

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(hosts.summary())

    async def reset(request: web.Request) -> web.Response:
        hosts.reset()
        return web.json_response({"reset": True})

    app = web.Application()
    app.router.add_get("/{n:[0-9]+}.jpg", image)
    app.router.add_get("/robots.txt", robots)
    app.router.add_get("/_stats", stats)
    app.router.add_post("/_reset", reset)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dataset_origin")
    parser.add_argument("corpus_dir", type=Path)
    parser.add_argument("--hosts", type=int, default=40)
    parser.add_argument("port", type=int)
    args = parser.parse_args()
    bodies = [f.body for f in load(args.corpus_dir, "mixed")]
    addresses = host_addresses(args.hosts)
    app = make_app(bodies, Hosts(addresses))
    web.run_app(app, host=["127.0.0.1", *addresses], port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
