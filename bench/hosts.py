"""One source over many hosts (issue 36, point 9): ``python -m bench --hosts 1000``.

Two crawls of the same ``--images`` URLs, one after the other in the same run, with the
same workers and settings, one source each at ``--rate`` (so that the source's rate is
never the limit):

1. **one host**: every URL on the origin's own address, which nothing limits (its
   robots.txt is a 404);
2. **many hosts**: the URLs spread round-robin over the origin's ``--hosts`` loopback
   addresses (``bench.origin.host_addresses``), each of whose robots.txt says
   ``Crawl-delay: 1``, so that each host takes at most one request a second, its
   robots.txt and tdmrep.json requests included.

A thousand hosts at one request a second are more than the machine can crawl, so the
second crawl should reach the first's images/s; what it falls short is the cost of
keeping hosts apart. The target (``bench.report``) is on the steady throughput, from
10 % to 90 % of the outputs: the first seconds of the second crawl are its hosts'
robots.txt and tdmrep.json, which the whole-run ratio shows beside it.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from bench.crawl import RunConfig, run_crawl
from bench.services import Origin


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def hosts_figures(
    one: dict[str, Any], many: dict[str, Any], hosts: int, crawl_delay_s: float
) -> dict[str, Any]:
    """The two crawls' figures (``run_crawl``'s) and the many-host crawl's throughput over
    the one-host crawl's: steady (10 % to 90 % of the outputs) and over the whole runs."""
    return {
        "hosts": hosts,
        "crawl_delay_s": crawl_delay_s,
        "images": many["images_requested"],
        "images_per_host": many["images_requested"] / hosts if hosts else None,
        "ratio_steady_10_90": _ratio(
            many["images_per_s_steady_10_90"], one["images_per_s_steady_10_90"]
        ),
        "ratio_whole_run": _ratio(many["images_per_s"], one["images_per_s"]),
        "one_host": one,
        "many_hosts": many,
    }


async def measure_hosts(config: RunConfig, origin: Origin, files: int) -> dict[str, Any]:
    """Crawl ``config.images`` URLs on the origin's own address, then the same URLs spread
    over its ``hosts`` Crawl-delayed addresses; ``config`` is one source's crawl."""
    one_host = dataclasses.replace(config, log_dir=config.log_dir / "one-host", recheck=False)
    many_hosts = dataclasses.replace(
        one_host, log_dir=config.log_dir / f"{origin.hosts}-hosts", host_urls=origin.host_urls
    )
    print(f"hosts: {config.images} images on one unlimited host", file=sys.stderr)
    one = await run_crawl(one_host, origin.url, files)
    print(
        f"hosts: the same images over {origin.hosts} hosts, Crawl-delay "
        f"{origin.crawl_delay_s:g} s each",
        file=sys.stderr,
    )
    many = await run_crawl(many_hosts, origin.url, files)
    return hosts_figures(one, many, origin.hosts, origin.crawl_delay_s)
