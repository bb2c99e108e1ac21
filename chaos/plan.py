"""What a campaign crawls: its sources, their hosts and how each host behaves, and the URLs
fed to ``inbound_images`` (seeded, so that a seed replays the same feed).

Every host is a loopback address of its own (127.0.3.N) on the origin's one port, so the
crawler paces each as a host of its own. The bound a host is checked against is its
source's rate, or its Crawl-delay where it asks one; a source's bound is its rate, for
all of its hosts together.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Final

from crawl_monitor.policy.rates import compute_crawl_rate
from image_crawler import contract as c

# Host behaviours (chaos/origin.py serves them).
PLAIN: Final = "plain"
SLOW: Final = "slow"  # each image answered after 0.5-3 s
RETRY_AFTER: Final = "retry_after"  # every 10th image request: 429 with Retry-After
CAPACITY: Final = "capacity"  # 503 beyond CAPACITY_RPS requests in any second
CRAWL_DELAY: Final = "crawl_delay"  # robots.txt asks a Crawl-delay of CRAWL_DELAY_S

RETRY_AFTER_S: Final = 3
# The crawler cuts a host's rate at each 429 and climbs back 2 % a second: every 10th
# request refused holds this host near 0.55 requests/s, which its feed stays well under.
RETRY_AFTER_EVERY: Final = 10
CAPACITY_RPS: Final = 2.0
CRAWL_DELAY_S: Final = 2.0
SLOW_S: Final = (0.5, 3.0)

# What a URL is, and where its uuid must end.
OK: Final = "ok"
MISSING: Final = "missing"  # 404: link_rot
BROKEN: Final = "broken"  # not an image: crawl_errors
EXPECTED_TOPIC: Final = {
    OK: c.METADATA_TOPIC,
    MISSING: c.LINK_ROT_TOPIC,
    BROKEN: c.CRAWL_ERRORS_TOPIC,
}
# Shares of the feed: mostly images, a few dead links and broken files (few enough that
# no source's error window trips its breaker: 404 is not an error, a broken file is).
KIND_WEIGHTS: Final = {OK: 0.92, MISSING: 0.05, BROKEN: 0.03}

ADDRESS_PREFIX: Final = "127.0.3."
ALLOWED_NETWORK: Final = "127.0.3.0/24"


@dataclasses.dataclass(frozen=True, slots=True)
class Host:
    address: str
    source: str
    behaviour: str
    feed_rps: float  # URLs fed a second, on average

    def bound_rps(self, source_rps: float) -> float:
        """The most requests a second this host may get: its source's rate, or less."""
        if self.behaviour == CRAWL_DELAY:
            return min(source_rps, 1 / CRAWL_DELAY_S)
        return source_rps


@dataclasses.dataclass(frozen=True, slots=True)
class Source:
    name: str
    wanted_rps: float
    hosts: tuple[Host, ...]

    @property
    def image_count(self) -> int:
        """The size the monitor is given, so that it computes (about) ``wanted_rps``."""
        share = (self.wanted_rps - c.MIN_RATE_RPS) / (c.MAX_RATE_RPS - c.MIN_RATE_RPS)
        # Rounded up: a rate a hair under the one wanted would lower every bound by one.
        return math.ceil(c.MIN_IMAGES + share * (c.MAX_IMAGES - c.MIN_IMAGES))

    @property
    def rate_rps(self) -> float:
        """The rate the monitor computes from the size: the source's pacing bound."""
        return compute_crawl_rate(self.image_count)


# The one source an operator halts during the faults and resumes after them.
HALTED_SOURCE: Final = "chaos-d"


def _source(name: str, rps: float, first: int, *behaviours: tuple[str, float]) -> Source:
    hosts = tuple(
        Host(f"{ADDRESS_PREFIX}{first + i}", name, behaviour, feed)
        for i, (behaviour, feed) in enumerate(behaviours)
    )
    return Source(name, rps, hosts)


SOURCES: Final = (
    _source("chaos-a", 10.0, 1, (PLAIN, 1.0), (PLAIN, 1.0), (SLOW, 0.5)),
    _source("chaos-b", 8.0, 4, (RETRY_AFTER, 0.15), (CAPACITY, 0.6), (PLAIN, 1.0)),
    _source("chaos-c", 5.0, 7, (CRAWL_DELAY, 0.2), (PLAIN, 1.0)),
    _source(HALTED_SOURCE, 6.0, 9, (PLAIN, 0.3), (PLAIN, 0.3)),
)
HOSTS: Final = {h.address: h for s in SOURCES for h in s.hosts}
SOURCES_BY_NAME: Final = {s.name: s for s in SOURCES}


@dataclasses.dataclass(frozen=True, slots=True)
class Url:
    uuid: str
    url: str
    source: str
    kind: str

    def message(self) -> bytes:
        return c.InboundImage(url=self.url, uuid=self.uuid, source=self.source).to_json()


class Feed:
    """The URLs of each second of a campaign, drawn from the seed."""

    def __init__(self, seed: int, port: int) -> None:
        self._random = random.Random(seed)
        self._port = port
        self._count = 0

    def second(self) -> list[Url]:
        """One second's URLs: each host's count drawn around its feed rate."""
        urls = []
        for host in HOSTS.values():
            whole, part = divmod(host.feed_rps, 1)
            for _ in range(int(whole) + (self._random.random() < part)):
                urls.append(self._url(host))
        return urls

    def _url(self, host: Host) -> Url:
        self._count += 1
        kind = self._random.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
        uuid = f"{host.source}-{self._count:07d}-{self._random.getrandbits(32):08x}"
        url = f"http://{host.address}:{self._port}/{kind}/{uuid}.jpg"
        return Url(uuid, url, host.source, kind)


def kind_of(path: str) -> str | None:
    """The kind of an image path (``/ok/UUID.jpg``), None for robots.txt and others."""
    first = path.lstrip("/").split("/", 1)[0]
    return first if first in EXPECTED_TOPIC else None
