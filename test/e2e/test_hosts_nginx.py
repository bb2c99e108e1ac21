"""Politeness per host against a real limiter: Debian's nginx serving the same folder of
images on three loopback addresses (three hosts as the crawler sees them), with
``limit_req`` keyed by ``$host``; one source configured at 50 requests/s over the three,
its URLs produced shuffled, crawled by the real monitor and two real workers.

- each limited host is found out on its own: its rate is cut (its ``pace_host:`` hash
  has a ``cut``) and settles near its limit: over a late window nginx accepted at least
  80% of the limit a second and refused few of its requests;
- beside two limited hosts, an unlimited one is never cut and keeps going at what the
  source leaves it, faster than either, while they find their limits: their 503s are
  theirs alone (on main the unlimited host starves them: an expected failure, see it);
- every URL ends with its image (the 503s were tried again), none lost, none
  dead-lettered, no breaker tripped, and the source's own rate is untouched.

Set ``PACING_REPORT_DIR`` to keep the figures as JSON (as test_pacing_crawl.py does).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from redis.asyncio import Redis

from image_crawler import contract as c
from test.harness.crawl import Crawl, Outputs
from test.harness.nginx import AccessLogEntry, Nginx, NoNginx, VirtualServer
from test.harness.services import wait_for
from worker.politeness.hosts import HostState

pytestmark = pytest.mark.integration

SOURCE, CONFIGURED_RPS = "hosts", 50.0


@dataclasses.dataclass(frozen=True, slots=True)
class Host:
    """One host of the source: its address, nginx's limit (requests/s; None: none) and
    how many of the source's URLs are on it."""

    address: str
    limit_rps: float | None
    urls: int

    @property
    def zone(self) -> str:
        return f"limit{self.limit_rps:g}"


# Enough URLs on each host for a backlog past the measured window (at about its limit,
# and at what the source leaves the unlimited one), and not much more: the slowest host's
# last URL is what the test waits for.
THREE_LIMITS = (
    Host("127.0.0.2", 5.0, 240),
    Host("127.0.0.3", 10.0, 480),
    Host("127.0.0.4", 20.0, 960),
)
WITH_AN_UNLIMITED_HOST = (
    Host("127.0.0.2", 5.0, 240),
    Host("127.0.0.3", 10.0, 480),
    Host("127.0.0.4", None, 1800),
)
# nginx's limit_req is a leaky bucket per key (here the host asked for, ``$host``): each
# request adds 1 to the key's excess, which leaks at the zone's rate (to the millisecond).
# A request that would take the excess over ``burst`` is refused at once with
# ``limit_req_status`` (503, a backoff signal for the crawler); under ``nodelay`` the ones
# within the burst are served at once rather than delayed to the rate (without it, nginx
# would hold them: a slow server, not a refusing one). So nginx serves at most
# ``rate x t + burst`` requests in any t seconds; a burst of a few requests keeps
# evenly paced requests a hair early (timing noise) from being refused, as real sites do.
BURST = 5
# From the first image request: slow start overshoots every host's limit, and the first
# cuts bring each down within a few seconds; measured after that, over the window.
SETTLE_S, WINDOW_S = 10.0, 30.0
# Bounds set from measured runs (the test prints its figures), two on 2 cores: accepted
# 0.99-1.01, 0.94-0.97 and 0.92 of the 5, 10 and 20/s limits; refused 0.65-1.32 %,
# 0.68-0.70 % and 0.36 %. Before the window, while slow start finds each limit, 24, 15 and
# 9 requests were refused.
ACCEPTED_SHARE_MIN = 0.80  # of the limit, a second, over the window
REFUSED_SHARE_MAX = 0.05  # of the host's requests in the window (the bound)
RATE_NEAR_LIMIT = (0.7, 1.5)  # the median of its hash's rate through the window, x limit
SAMPLE_EVERY_S = 0.5
IMAGE_FILES = 12


def _jpegs(folder: Path) -> None:
    for i in range(IMAGE_FILES):
        out = io.BytesIO()
        colour = (40 + 17 * i, 200 - 11 * i, 90 + 7 * i)
        Image.new("RGB", (48 + 8 * i, 32 + 4 * i), colour).save(out, "JPEG", quality=80)
        (folder / f"{i}.jpg").write_bytes(out.getvalue())


@contextlib.contextmanager
def _serving(hosts: Sequence[Host], tmp_path: Path) -> Iterator[Nginx]:
    """nginx on each host's address: one zone per limit, keyed by host, and each limited
    host's own ``limit_req``."""
    folder = tmp_path / "www"
    folder.mkdir()
    _jpegs(folder)
    zones = [
        f"    limit_req_zone $host zone={h.zone}:1m rate={h.limit_rps:g}r/s;"
        for h in hosts
        if h.limit_rps is not None
    ]
    http = "\n".join([*zones, "    limit_req_status 503;"])
    servers = [
        VirtualServer(h.address, f"        limit_req zone={h.zone} burst={BURST} nodelay;")
        if h.limit_rps is not None
        else VirtualServer(h.address)
        for h in hosts
    ]
    first, *others = servers
    try:
        with Nginx(
            folder,
            host=first.host,
            server_config=first.config,
            http_config=http,
            also=others,
            work_dir=tmp_path / "nginx",
        ) as server:
            yield server
    except NoNginx as e:
        pytest.fail(f"this test needs a real nginx: {e}", pytrace=False)


def _shuffled_urls(nginx: Nginx, hosts: Sequence[Host]) -> tuple[list[str], dict[str, str]]:
    """Every host's URLs, shuffled (a fixed seed), and each uuid's host."""
    planned = [
        (h.address, nginx.url(f"/{i % IMAGE_FILES}.jpg?n={i}", h.address))
        for h in hosts
        for i in range(h.urls)
    ]
    random.Random(36).shuffle(planned)
    urls = [url for _, url in planned]
    host_of = {f"{SOURCE}-{i}": host for i, (host, _) in enumerate(planned)}
    return urls, host_of


def _images(entries: Sequence[AccessLogEntry], host: str) -> list[AccessLogEntry]:
    # The image requests only: robots.txt and tdmrep.json are asked once per host.
    return [e for e in entries if e.host == host and e.path.split("?")[0].endswith(".jpg")]


def _text(fields: Mapping[Any, Any]) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in fields.items()
    }


async def _host_state(redis: Redis, address: str) -> HostState:
    return HostState.from_hash(_text(await redis.hgetall(c.pace_host_key(SOURCE, address))))


async def _sample_rates(
    redis: Redis, hosts: Sequence[Host], window: tuple[float, float]
) -> dict[str, list[float]]:
    """Each host's ``rate`` in its hash, every SAMPLE_EVERY_S through ``window`` (Unix s)."""
    await wait_for(
        lambda: time.time() >= window[0], window[0] - time.time() + 10, what="the window"
    )
    samples: dict[str, list[float]] = {h.address: [] for h in hosts}
    while time.time() < window[1]:
        for h in hosts:
            rate = (await _host_state(redis, h.address)).rate
            if rate is not None:
                samples[h.address].append(rate)
        await asyncio.sleep(SAMPLE_EVERY_S)
    return samples


def per_second(times: Sequence[float], start: float, end: float) -> list[int]:
    counts = [0] * max(0, int(end - start + 0.999))
    for t in times:
        if start <= t < end:
            counts[int(t - start)] += 1
    return counts


def save_report(name: str, report: Mapping[str, Any]) -> None:
    directory = os.environ.get("PACING_REPORT_DIR")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / f"{name}.json").write_text(json.dumps(report, indent=1))


@dataclasses.dataclass(frozen=True, slots=True)
class Seen:
    """One host as nginx and its hash saw it, in the window and before it."""

    accepted_rps: float  # 200s a second in the window
    refused: int  # 503s in the window
    requests: int  # image requests in the window
    refused_before: int  # 503s before the window (slow start, the first cuts)
    rates: tuple[float, ...]  # its hash's rate, sampled through the window
    state: HostState  # its hash at the window's end
    accepted_trace: list[int]  # 200s, then 503s, a second from the first image request
    refused_trace: list[int]

    @property
    def refused_share(self) -> float:
        return self.refused / self.requests if self.requests else 0.0

    @property
    def median_rate(self) -> float:
        return statistics.median(self.rates) if self.rates else math.nan

    def summary(self) -> dict[str, Any]:
        rates = self.rates or (math.nan,)
        return {
            "accepted_rps": round(self.accepted_rps, 2),
            "refused_share": round(self.refused_share, 4),
            "refused": self.refused,
            "requests": self.requests,
            "refused_before": self.refused_before,
            "rate_min_median_max": [
                round(min(rates), 2),
                round(self.median_rate, 2),
                round(max(rates), 2),
            ],
            "rate_at_end": None if self.state.rate is None else round(self.state.rate, 2),
            "cut": self.state.cut_at is not None,
            "accepted_trace": self.accepted_trace,
            "refused_trace": self.refused_trace,
        }


def _seen(
    entries: Sequence[AccessLogEntry],
    address: str,
    started: float,
    window: tuple[float, float],
    rates: Sequence[float],
    state: HostState,
) -> Seen:
    images = _images(entries, address)
    accepted = [e.time_s for e in images if e.status == 200 and e.time_s is not None]
    refused = [e.time_s for e in images if e.status == 503 and e.time_s is not None]
    accepted_in = [t for t in accepted if window[0] <= t < window[1]]
    refused_in = [t for t in refused if window[0] <= t < window[1]]
    return Seen(
        accepted_rps=len(accepted_in) / (window[1] - window[0]),
        refused=len(refused_in),
        requests=len(accepted_in) + len(refused_in),
        refused_before=sum(t < window[0] for t in refused),
        rates=tuple(rates),
        state=state,
        accepted_trace=per_second(accepted, started, window[1]),
        refused_trace=per_second(refused, started, window[1]),
    )


def _print(hosts: Sequence[Host], seen: Mapping[str, Seen]) -> None:
    report: dict[str, Any] = {"configured_rps": CONFIGURED_RPS, "burst": BURST}
    for h in hosts:
        figures = seen[h.address].summary()
        report[h.address] = {"limit_rps": h.limit_rps, "urls": h.urls, **figures}
        print(
            f"\n{h.address} limit {h.limit_rps}: {figures['accepted_rps']}/s accepted from "
            f"{SETTLE_S:g} to {SETTLE_S + WINDOW_S:g} s, {figures['refused']} of "
            f"{figures['requests']} refused ({figures['refused_share']:.2%}), "
            f"{figures['refused_before']} before; its rate min/median/max "
            f"{figures['rate_min_median_max']}, {figures['rate_at_end']} at the end "
            f"(cut: {figures['cut']})"
        )
        print("  200s a second:", figures["accepted_trace"])
        print("  503s a second:", figures["refused_trace"])
    unlimited = sum(h.limit_rps is None for h in hosts)
    save_report(f"hosts_nginx_{len(hosts)}_hosts_{unlimited}_unlimited", report)


# What a test asserts of each host's figures, once the window has passed.
Check = Callable[[Mapping[str, Seen]], None]


async def crawl_behind_nginx(
    hosts: Sequence[Host], check: Check, kafka: Any, redis: Redis, redis_url: str, tmp_path: Path
) -> None:
    """The source's URLs on ``hosts``, crawled by the monitor and two workers: ``check``
    once the window has passed, then every URL's end."""
    with _serving(hosts, tmp_path) as nginx:
        urls, host_of = _shuffled_urls(nginx, hosts)
        crawl = Crawl(kafka, redis_url, tmp_path)
        try:
            async with Outputs(kafka.bootstrap) as outputs:
                await crawl.queue(redis, SOURCE, CONFIGURED_RPS, urls)
                # Every URL of the source in flight at once (a source's share is
                # MAX_TASKS / 4): which host's URLs wait in the task slots is point 4 of
                # issue 36; here each host must find its limit, whatever the others do.
                await crawl.start(
                    redis,
                    [SOURCE],
                    workers=2,
                    MAX_TASKS=4 * (len(urls) + 100),
                    ALLOWED_PRIVATE_NETWORKS="127.0.0.0/8",  # nginx's addresses
                )
                seen = await _measure(nginx, redis, hosts)
                _print(hosts, seen)
                check(seen)
                await wait_for(lambda: outputs.uuids() >= set(host_of), 120, what="every URL ended")
                ended, started = time.time(), _first_image_at(nginx)
                crawl_errors = outputs.count(c.CRAWL_ERRORS_TOPIC)
                assert outputs.resolved >= set(host_of)
        finally:
            crawl.stop()
    print(f"every URL ended {ended - started:.1f} s after the first image request")
    # Every URL ended with its image: the 503s were tried again, none dead-lettered.
    assert not crawl_errors, crawl_errors
    assert not [e for e in crawl.events("crawl_halted") if e.get("source") == SOURCE]


def _first_image_at(nginx: Nginx) -> float:
    """When nginx answered the first image request (Unix s)."""
    return min(e.time_s for e in nginx.requests() if e.time_s is not None and ".jpg" in e.path)


async def _measure(nginx: Nginx, redis: Redis, hosts: Sequence[Host]) -> dict[str, Seen]:
    """Each host's figures over the window, from nginx's log and its hash; and the
    source's own rate untouched by its hosts' 503s."""
    await wait_for(
        lambda: any(".jpg" in e.path for e in nginx.requests()),
        60,
        interval_s=0.1,
        what="the first image request",
    )
    started = _first_image_at(nginx)
    window = (started + SETTLE_S, started + SETTLE_S + WINDOW_S)
    rates = await _sample_rates(redis, hosts, window)
    states = {h.address: await _host_state(redis, h.address) for h in hosts}
    published = await redis.hget(c.RATES_HASH, SOURCE)
    assert published is not None
    pacing = c.PacingInfo.from_json(published)
    assert pacing.rate_rps == CONFIGURED_RPS, pacing
    # nginx writes each line as it sends the answer (the access log has no buffer),
    # stamped with the time of the write: the window's are all in the file by now.
    entries = nginx.requests()
    return {
        h.address: _seen(entries, h.address, started, window, rates[h.address], states[h.address])
        for h in hosts
    }


def found_its_limit(h: Host, seen: Seen) -> None:
    """``h``'s rate was cut and settled near its limit: nginx accepted most of it, and
    refused few; the rate in its hash was about the limit."""
    assert h.limit_rps is not None
    figures = (h, seen.summary())
    assert seen.state.cut_at is not None, figures
    assert seen.accepted_rps >= ACCEPTED_SHARE_MIN * h.limit_rps, figures
    assert seen.refused_share <= REFUSED_SHARE_MAX, figures
    low, high = RATE_NEAR_LIMIT
    assert low * h.limit_rps <= seen.median_rate <= high * h.limit_rps, figures


def three_limits_found(seen: Mapping[str, Seen]) -> None:
    for h in THREE_LIMITS:
        found_its_limit(h, seen[h.address])
    # Three limits, three rates: each host's own, not the slowest's for all.
    accepted = [seen[h.address].accepted_rps for h in THREE_LIMITS]
    assert accepted == sorted(accepted), accepted


def the_unlimited_host_kept_going(seen: Mapping[str, Seen]) -> None:
    limited = [h for h in WITH_AN_UNLIMITED_HOST if h.limit_rps is not None]
    for h in limited:
        found_its_limit(h, seen[h.address])
    (free,) = (seen[h.address] for h in WITH_AN_UNLIMITED_HOST if h.limit_rps is None)
    # Never refused, never cut: at its ceiling (the source's rate), faster than any
    # limited host, and using most of what they leave of the source's rate.
    assert free.refused == free.refused_before == 0
    assert free.state.cut_at is None and free.state.rate == CONFIGURED_RPS, free.state
    assert free.accepted_rps > max(seen[h.address].accepted_rps for h in limited)
    left = CONFIGURED_RPS - sum(h.limit_rps for h in limited if h.limit_rps is not None)
    assert free.accepted_rps >= ACCEPTED_SHARE_MIN * left, free.summary()


@pytest.mark.timing(
    "asserts requests/s nginx accepted per host, the refused share and the hash rate"
)
@pytest.mark.timeout(300)
async def test_each_host_behind_nginx_finds_its_own_limit(kafka, redis, redis_url, tmp_path):
    await crawl_behind_nginx(THREE_LIMITS, three_limits_found, kafka, redis, redis_url, tmp_path)


# Failed before the pacer asked for a source's hosts least recently granted first: once
# the unlimited host's rate reached the source's, it took every source slot (one falls
# within the pacing horizon at 50/s, and it went to the host asked first, the unlimited
# one again and again) and the limited hosts got 0.2 to 2.4 requests/s instead of 5 and 10.
@pytest.mark.timing(
    "asserts requests/s nginx accepted per host, including the unlimited host's throughput"
)
@pytest.mark.timeout(300)
async def test_an_unlimited_host_is_not_cut_with_the_limited_ones(
    kafka, redis, redis_url, tmp_path
):
    await crawl_behind_nginx(
        WITH_AN_UNLIMITED_HOST, the_unlimited_host_kept_going, kafka, redis, redis_url, tmp_path
    )
