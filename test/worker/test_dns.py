"""The worker's resolver as pure logic, against a fake c-ares client: TTLs within bounds,
failures cached briefly, one query per name at a time, a bound on queries in flight, a
bounded cache, and its counts. The real thing (c-ares against dnsmasq) is
test_dns_dnsmasq.py."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from types import SimpleNamespace
from typing import Any

import aiodns
import pycares
import pytest
from prometheus_client import REGISTRY

from image_crawler.config import ConfigError
from test.harness.services import wait_for
from worker.download import dns
from worker.download.dns import (
    FAILURE_KINDS,
    CachingResolver,
    DnsLookupError,
    DnsSettings,
    parse_servers,
)
from worker.settings import WorkerSettings

SETTINGS = DnsSettings(min_ttl_s=60, max_ttl_s=3600, negative_ttl_s=30)
NAME = "img.example.org"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def answer(*addresses: str, ttl: int = 300, cname_ttl: int | None = None) -> SimpleNamespace:
    """What c-ares' getaddrinfo gives: a node per address, and a CNAME when asked."""
    nodes = [
        SimpleNamespace(
            ttl=ttl,
            family=socket.AF_INET6 if ":" in a else socket.AF_INET,
            addr=(a.encode(), 0, 0, 0) if ":" in a else (a.encode(), 0),
        )
        for a in addresses
    ]
    cnames = [] if cname_ttl is None else [SimpleNamespace(ttl=cname_ttl, alias=NAME, name="x")]
    return SimpleNamespace(nodes=nodes, cnames=cnames)


class FakeDns:
    """Answers each name from ``answers`` (an answer, or a c-ares error code; unknown
    names NXDOMAIN). While ``gate`` is set, every lookup waits for it. Counts lookups and
    the most ever in flight at once."""

    def __init__(self, answers: dict[str, Any] | None = None) -> None:
        self.answers = answers or {}
        self.asked: list[tuple[str, int]] = []
        self.gate: asyncio.Event | None = None
        self.in_flight = 0
        self.most_in_flight = 0
        self.closed = False

    async def getaddrinfo(self, host: str, family: int = 0, *, type: int = 0) -> Any:
        assert type == socket.SOCK_STREAM
        self.asked.append((host, family))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.gate is not None:
                await self.gate.wait()
            found = self.answers.get(host, pycares.errno.ARES_ENOTFOUND)
            if isinstance(found, int):
                raise aiodns.error.DNSError(found, pycares.errno.strerror(found))
            return found
        finally:
            self.in_flight -= 1

    async def close(self) -> None:
        self.closed = True


def make(answers: dict[str, Any] | None = None, settings: DnsSettings = SETTINGS):
    fake, clock = FakeDns(answers), Clock()
    return CachingResolver(settings, dns=lambda: fake, clock=clock), fake, clock


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# --- answers -----------------------------------------------------------------------------
async def test_an_answer_is_what_aiohttp_connects_to():
    resolver, fake, _ = make({NAME: answer("93.184.216.34", "2606:2800:220:1::1")})
    results = await resolver.resolve(NAME, 443, socket.AF_UNSPEC)
    assert [(r["host"], r["port"], r["family"]) for r in results] == [
        ("93.184.216.34", 443, socket.AF_INET),
        ("2606:2800:220:1::1", 443, socket.AF_INET6),
    ]
    assert all(r["hostname"] == NAME and r["flags"] & socket.AI_NUMERICHOST for r in results)
    assert fake.asked == [(NAME, socket.AF_UNSPEC)]
    # The same name on another port: the cached addresses, with that port.
    assert [r["port"] for r in await resolver.resolve(NAME, 80, socket.AF_UNSPEC)] == [80, 80]
    assert len(fake.asked) == 1


@pytest.mark.parametrize(
    ("ttl", "cname_ttl", "kept_s"),
    [
        (300, None, 300),  # within the bounds: the answer's own
        (5, None, 60),  # a CDN's seconds: raised to DNS_MIN_TTL_S
        (0, None, 60),  # /etc/hosts (and localhost) answer with 0
        (86400, None, 3600),  # a day: cut to DNS_MAX_TTL_S
        (3000, 100, 100),  # the least of the records', a CNAME's included
    ],
)
async def test_an_answer_is_kept_for_its_ttl_within_the_bounds(ttl, cname_ttl, kept_s):
    resolver, fake, clock = make({NAME: answer("93.184.216.34", ttl=ttl, cname_ttl=cname_ttl)})
    await resolver.resolve(NAME, 80)
    clock.now += kept_s - 0.01
    await resolver.resolve(NAME, 80)
    assert len(fake.asked) == 1
    clock.now += 0.01
    await resolver.resolve(NAME, 80)
    assert len(fake.asked) == 2


def failures() -> list[tuple[int, str]]:
    e = pycares.errno
    return [
        (e.ARES_ENOTFOUND, "nxdomain"),
        (e.ARES_EBADNAME, "nxdomain"),
        (e.ARES_ENODATA, "nodata"),
        (e.ARES_ESERVFAIL, "servfail"),
        (e.ARES_ETIMEOUT, "timeout"),
        (e.ARES_EREFUSED, "refused"),
        (e.ARES_ECONNREFUSED, "refused"),
        (e.ARES_EFORMERR, "other"),
    ]


@pytest.mark.parametrize(("code", "kind"), failures())
async def test_a_failure_is_kept_for_the_negative_ttl(code, kind):
    resolver, fake, clock = make({NAME: code})
    with pytest.raises(DnsLookupError) as first:
        await resolver.resolve(NAME, 80)
    assert isinstance(first.value, OSError)  # aiohttp wraps it in ClientConnectorDNSError
    assert (first.value.host, first.value.kind) == (NAME, kind)
    assert first.value.final is (kind in {"nxdomain", "nodata"})
    clock.now += SETTINGS.negative_ttl_s - 0.01
    with pytest.raises(DnsLookupError) as cached:
        await resolver.resolve(NAME, 80)
    assert cached.value is not first.value and cached.value.kind == kind
    assert len(fake.asked) == 1
    clock.now += 0.01
    with pytest.raises(DnsLookupError):
        await resolver.resolve(NAME, 80)
    assert len(fake.asked) == 2


async def test_an_answer_without_an_address_is_nodata():
    resolver, _, _ = make({NAME: answer()})
    with pytest.raises(DnsLookupError) as failed:
        await resolver.resolve(NAME, 80)
    assert failed.value.kind == "nodata"


async def test_a_lookup_that_never_ends_frees_its_slot(monkeypatch):
    monkeypatch.setattr(dns, "_LOOKUP_DEADLINE_S", 0.05)
    resolver, fake, _ = make({NAME: answer("93.184.216.34")})
    fake.gate = asyncio.Event()  # never set: c-ares never calls back
    with pytest.raises(DnsLookupError) as failed:
        await asyncio.wait_for(resolver.resolve(NAME, 80), 5)
    assert failed.value.kind == "timeout"
    assert resolver.counts.failures == {"timeout": 1}


# --- one query per name, a bound on queries ----------------------------------------------
async def test_concurrent_lookups_of_a_name_share_one_query():
    resolver, fake, _ = make({NAME: answer("93.184.216.34")})
    fake.gate = asyncio.Event()
    lookups = [asyncio.create_task(resolver.resolve(NAME, 80)) for _ in range(50)]
    await wait_for(lambda: fake.in_flight == 1, 5, what="the one query")
    fake.gate.set()
    results = await asyncio.gather(*lookups)
    assert fake.asked == [(NAME, socket.AF_INET)]
    assert all(r == results[0] for r in results)
    assert (resolver.counts.queries, resolver.counts.hits) == (1, 49)


async def test_a_failure_is_shared_by_the_lookups_waiting_for_it():
    resolver, fake, _ = make()
    fake.gate = asyncio.Event()
    lookups = [asyncio.create_task(resolver.resolve("gone.example", 80)) for _ in range(20)]
    await wait_for(lambda: fake.in_flight == 1, 5, what="the one query")
    fake.gate.set()
    ended = await asyncio.gather(*lookups, return_exceptions=True)
    assert all(isinstance(e, DnsLookupError) and e.kind == "nxdomain" for e in ended)
    assert len(fake.asked) == 1 and resolver.counts.failures == {"nxdomain": 1}


async def test_a_lookup_given_up_by_its_request_still_answers_the_others():
    resolver, fake, _ = make({NAME: answer("93.184.216.34")})
    fake.gate = asyncio.Event()
    impatient = asyncio.create_task(resolver.resolve(NAME, 80))
    await wait_for(lambda: fake.in_flight == 1, 5, what="the query")
    impatient.cancel()  # aiohttp's connect timeout
    patient = asyncio.create_task(resolver.resolve(NAME, 80))
    await asyncio.sleep(0)
    fake.gate.set()
    assert [r["host"] for r in await patient] == ["93.184.216.34"]
    assert impatient.cancelled()
    await resolver.resolve(NAME, 80)  # and the answer was cached
    assert len(fake.asked) == 1


async def test_at_most_max_in_flight_queries_are_out():
    names = [f"h{i}.example" for i in range(10)]
    settings = DnsSettings(max_in_flight=3)
    resolver, fake, _ = make({n: answer("93.184.216.34") for n in names}, settings)
    fake.gate = asyncio.Event()
    lookups = [asyncio.create_task(resolver.resolve(n, 80)) for n in names]
    await wait_for(lambda: fake.in_flight == 3, 5, what="three queries out")
    for _ in range(20):  # the others keep waiting their turn
        await asyncio.sleep(0)
    assert fake.in_flight == 3 and len(fake.asked) == 3
    fake.gate.set()
    await asyncio.gather(*lookups)
    assert len(fake.asked) == 10 and fake.most_in_flight == 3


# --- a bounded cache ---------------------------------------------------------------------
async def test_the_least_recently_used_name_goes_first():
    names = ["a.example", "b.example", "c.example", "d.example"]
    resolver, fake, _ = make(
        {n: answer("93.184.216.34") for n in names}, DnsSettings(cache_entries=3)
    )
    for name in ["a.example", "b.example", "c.example", "a.example", "d.example"]:
        await resolver.resolve(name, 80)
    assert resolver.cached == 3 and len(fake.asked) == 4
    await resolver.resolve("a.example", 80)  # used last but one: kept
    assert len(fake.asked) == 4
    await resolver.resolve("b.example", 80)  # the least recently used: gone
    assert len(fake.asked) == 5 and resolver.cached == 3


async def test_many_names_keep_the_cache_at_its_size():
    resolver, _, _ = make(settings=DnsSettings(cache_entries=1000))
    for i in range(5000):
        with pytest.raises(DnsLookupError):
            await resolver.resolve(f"h{i}.example", 80)
    assert resolver.cached == 1000


async def test_a_new_client_every_so_many_lookups_the_old_one_closed_once_idle():
    """c-ares' own cache, which pycares cannot turn off, goes with its client."""
    names = [f"n{i}.example" for i in range(7)]
    clients: list[FakeDns] = []

    def new_client() -> FakeDns:
        clients.append(FakeDns({n: answer("93.184.216.34") for n in names}))
        return clients[-1]

    resolver = CachingResolver(DnsSettings(lookups_per_client=3), dns=new_client)
    first = clients[0]
    first.gate = asyncio.Event()
    held = [asyncio.create_task(resolver.resolve(n, 80)) for n in names[:3]]
    await wait_for(lambda: first.in_flight == 3, 5, what="three lookups on the first client")
    await resolver.resolve(names[3], 80)  # the fourth goes to a new client
    assert len(clients) == 2 and clients[1].asked == [(names[3], socket.AF_INET)]
    assert not first.closed  # its lookups are still out
    first.gate.set()
    await asyncio.gather(*held)
    assert first.closed
    for name in names[4:]:
        await resolver.resolve(name, 80)
    assert len(clients) == 3 and clients[1].closed and not clients[2].closed
    await resolver.close()
    assert clients[2].closed


# --- counts ----------------------------------------------------------------------------
async def test_queries_hits_and_failures_are_counted_here_and_in_the_metrics():
    before = {
        "queries": sample("crawler_dns_queries_total"),
        "hits": sample("crawler_dns_cache_hits_total"),
        **{k: sample("crawler_dns_failures_total", kind=k) for k in FAILURE_KINDS},
    }
    e = pycares.errno
    resolver, _, _ = make(
        {
            NAME: answer("93.184.216.34"),
            "busy.example": e.ARES_ESERVFAIL,
            "slow.example": e.ARES_ETIMEOUT,
        }
    )
    for name in [NAME, NAME, "gone.example", "gone.example", "busy.example", "slow.example"]:
        with contextlib.suppress(DnsLookupError):
            await resolver.resolve(name, 80)
    counts = resolver.counts
    assert (counts.queries, counts.hits) == (4, 2)
    assert counts.failures == {"nxdomain": 1, "servfail": 1, "timeout": 1}
    assert sample("crawler_dns_queries_total") - before["queries"] == 4
    assert sample("crawler_dns_cache_hits_total") - before["hits"] == 2
    grew = {k: sample("crawler_dns_failures_total", kind=k) - before[k] for k in FAILURE_KINDS}
    assert grew == {
        "nxdomain": 1,
        "nodata": 0,
        "servfail": 1,
        "timeout": 1,
        "refused": 0,
        "other": 0,
    }


async def test_close_closes_the_client_and_gives_up_the_lookups_in_flight():
    resolver, fake, _ = make({NAME: answer("93.184.216.34")})
    fake.gate = asyncio.Event()
    lookup = asyncio.create_task(resolver.resolve(NAME, 80))
    await wait_for(lambda: fake.in_flight == 1, 5, what="the query")
    await resolver.close()
    assert fake.closed
    with pytest.raises(asyncio.CancelledError):
        await lookup


# --- settings ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "servers"),
    [
        ("", ()),
        ("10.0.0.53", ("10.0.0.53:53",)),
        (" 127.0.0.1:5353 , 10.0.0.53;", ("127.0.0.1:5353", "10.0.0.53:53")),
        ("[2001:db8::53]:5353,2001:db8::1", ("[2001:db8::53]:5353", "[2001:db8::1]:53")),
        ("[::1]", ("[::1]:53",)),
    ],
)
def test_dns_servers_are_addresses_with_a_port(spec, servers):
    assert parse_servers(spec) == servers


@pytest.mark.parametrize(
    "spec", ["dns.google", "10.0.0.53:0", "10.0.0.53:99999", "10.0.0.53:dns", "[::1]x", "1.2.3"]
)
def test_a_dns_server_that_is_not_an_address_is_refused_by_name(spec):
    with pytest.raises(ValueError, match=spec.replace("[", r"\[").replace("]", r"\]")):
        parse_servers(spec)


def test_the_settings_read_the_dns_variables():
    assert WorkerSettings.from_env({}).dns == DnsSettings()
    settings = WorkerSettings.from_env(
        {
            "DNS_SERVERS": "127.0.0.1:5353",
            "DNS_MIN_TTL_S": "0",
            "DNS_MAX_TTL_S": "600",
            "DNS_NEGATIVE_TTL_S": "5",
            "DNS_MAX_IN_FLIGHT": "7",
            "DNS_CACHE_ENTRIES": "1000",
        }
    )
    assert settings.dns == DnsSettings(
        servers=("127.0.0.1:5353",),
        min_ttl_s=0,
        max_ttl_s=600,
        negative_ttl_s=5,
        max_in_flight=7,
        cache_entries=1000,
    )
    # robots.txt asks again about a name once the resolver has forgotten its failure.
    assert settings.robots.dns_retry_s == 6


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DNS_SERVERS": "resolver.internal"}, "DNS_SERVERS: not an IP address"),
        ({"DNS_MIN_TTL_S": "-1"}, "DNS_MIN_TTL_S must be at least 0"),
        ({"DNS_MAX_TTL_S": "0"}, "DNS_MAX_TTL_S must be a number of seconds above 0"),
        ({"DNS_MIN_TTL_S": "600", "DNS_MAX_TTL_S": "60"}, "DNS_MIN_TTL_S .600. must not be"),
        ({"DNS_NEGATIVE_TTL_S": "never"}, "DNS_NEGATIVE_TTL_S must be a number"),
        ({"DNS_MAX_IN_FLIGHT": "0"}, "DNS_MAX_IN_FLIGHT must be at least 1"),
        ({"DNS_CACHE_ENTRIES": "lots"}, "DNS_CACHE_ENTRIES must be an integer"),
    ],
)
def test_bad_dns_settings_are_refused_with_their_name(env, message):
    with pytest.raises(ConfigError, match=message):
        WorkerSettings.from_env(env)
