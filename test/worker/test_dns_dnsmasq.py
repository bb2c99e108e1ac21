"""The worker's resolver for real: c-ares (aiodns) asking Debian's dnsmasq on loopback
(test/harness/dnsmasq.py), and the fetcher through it. TTLs are honoured within their
bounds, many lookups of a name are one query, NXDOMAIN and a name never answered are
DnsError (the second after c-ares' tries), DNS_SERVERS is what is asked, /etc/hosts still
answers, and the address check still refuses what a name resolves to."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from test.harness.dnsmasq import (
    LONG_TTL_S,
    PRIVATE_ADDRESS,
    SHORT_TTL_S,
    WILDCARD_TTL_S,
    Dnsmasq,
    NoDnsmasq,
    find_or_install_dnsmasq,
)
from test.harness.fakes import FakePacer
from test.harness.services import free_port, wait_for
from worker.download import dns
from worker.download.dns import CachingResolver, DnsLookupError, DnsSettings
from worker.download.fetch import Fetcher, new_session
from worker.download.netguard import AddressPolicy, parse_networks
from worker.images.pool import joined
from worker.politeness.robots import RobotsGuard
from worker.settings import FetchSettings, RobotsSettings, WorkerSettings

pytestmark = pytest.mark.integration

# The origin listens on 127.0.0.1: exempt exactly that address.
ORIGIN_ONLY = AddressPolicy(parse_networks("127.0.0.1/32"))
FETCH = FetchSettings(
    connect_timeout_s=5, read_timeout_s=2, total_timeout_s=10, max_body_bytes=100_000
)
_names = itertools.count()


def fresh(zone: str = "tail.test") -> str:
    """A name of ``zone`` no other test asked for: dnsmasq's log is the module's."""
    return f"h{next(_names)}-{time.monotonic_ns()}.{zone}"


@pytest.fixture(scope="module")
def dnsmasq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dnsmasq]:
    try:
        binary = find_or_install_dnsmasq()
    except NoDnsmasq as e:
        pytest.fail(f"the resolver's tests need a real DNS server: {e}", pytrace=False)
    with Dnsmasq(tmp_path_factory.mktemp("dnsmasq"), binary=binary) as server:
        yield server


def settings_for(dnsmasq: Dnsmasq, **changes: object) -> DnsSettings:
    # Short c-ares timeouts: a name never answered fails in about a second.
    base = DnsSettings(servers=(dnsmasq.server,), min_ttl_s=1, timeout_s=0.3, tries=2)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def resolver(dnsmasq: Dnsmasq) -> AsyncIterator[CachingResolver]:
    resolver = CachingResolver(settings_for(dnsmasq))
    yield resolver
    await resolver.close()


async def addresses(resolver: CachingResolver, name: str) -> list[str]:
    return [r["host"] for r in await resolver.resolve(name, 80, socket.AF_UNSPEC)]


# --- TTLs ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "bounds", "kept_s"),
    [
        ("short.test", (60, 3600), 60),  # 5 s raised to DNS_MIN_TTL_S
        ("long.test", (60, 3600), 3600),  # a day cut to DNS_MAX_TTL_S
        (None, (60, 3600), WILDCARD_TTL_S),  # the zone's own
        ("long.test", (0, 7200), 7200),
    ],
)
async def test_each_answers_ttl_is_kept_within_the_bounds(dnsmasq, name, bounds, kept_s):
    clock = Clock()
    settings = settings_for(dnsmasq, min_ttl_s=bounds[0], max_ttl_s=bounds[1])
    resolver = CachingResolver(settings, clock=clock)
    name = name or fresh()
    try:
        assert await addresses(resolver, name) == ["127.0.0.1"]
        clock.now = kept_s - 0.01
        await addresses(resolver, name)
        assert resolver.counts.queries == 1
        clock.now = kept_s
        await addresses(resolver, name)
        assert resolver.counts.queries == 2
    finally:
        await resolver.close()


@pytest.mark.timing("asserts the second DNS query at least TTL - 0.5 s after the first")
async def test_a_short_ttl_is_asked_again_once_it_has_passed(dnsmasq, resolver):
    name = "short.test"
    before = dnsmasq.queries(name)  # other tests' lookups
    started = time.monotonic()
    await addresses(resolver, name)
    assert dnsmasq.queries(name) == before + 1

    async def asked_again() -> bool:
        await addresses(resolver, name)
        return dnsmasq.queries(name) == before + 2

    await wait_for(asked_again, SHORT_TTL_S + 5, interval_s=0.1, what="a second query")
    assert time.monotonic() - started >= SHORT_TTL_S - 0.5
    assert resolver.counts.queries == 2 and resolver.counts.hits > 0
    assert LONG_TTL_S > 3600  # the zone's long name is longer than the default bound


# --- one query per name ----------------------------------------------------------------------
async def test_many_lookups_of_a_name_at_once_are_one_query(dnsmasq, resolver):
    name = fresh()
    answers = await asyncio.gather(*(addresses(resolver, name) for _ in range(200)))
    assert all(a == ["127.0.0.1"] for a in answers)
    assert (dnsmasq.queries(name, "A"), dnsmasq.queries(name, "AAAA")) == (1, 1)
    assert (resolver.counts.queries, resolver.counts.hits) == (1, 199)
    # And later ones come from the cache.
    await addresses(resolver, name)
    assert dnsmasq.queries(name) == 1


async def test_a_long_tail_of_names_is_one_query_each(dnsmasq, resolver):
    names = [fresh() for _ in range(100)]
    for _ in range(3):  # each host's robots.txt, tdmrep.json and image
        await asyncio.gather(*(addresses(resolver, n) for n in names))
    assert [dnsmasq.queries(n) for n in names] == [1] * 100
    assert resolver.counts.queries == 100


async def test_c_ares_runs_on_the_event_loop_without_a_thread_of_its_own(dnsmasq):
    # aiodns' own flag (private, as the method dns._LoopResolver replaces): whether
    # answers come from a thread of c-ares' through the loop's wake-up pipe. (Counting
    # the process's threads is no test: pycares destroys closed clients on a thread of
    # its own, asynchronously.)
    client = dns._c_ares(settings_for(dnsmasq))
    try:
        assert client._event_thread is False
        answers = await client.getaddrinfo(fresh(), socket.AF_INET, type=socket.SOCK_STREAM)
        assert [node.addr[0] for node in answers.nodes] == [b"127.0.0.1"]
    finally:
        await client.close()


# --- failures ------------------------------------------------------------------------------
@pytest.mark.timing("asserts an NXDOMAIN answer within 1 s")
async def test_nxdomain_is_a_dns_error_at_once_and_remembered(dnsmasq, resolver):
    name = fresh("nx.test")
    started = time.monotonic()
    with pytest.raises(DnsLookupError) as failed:
        await addresses(resolver, name)
    assert time.monotonic() - started < 1.0
    assert (failed.value.kind, failed.value.final) == ("nxdomain", True)
    for _ in range(10):  # its other URLs
        with pytest.raises(DnsLookupError):
            await addresses(resolver, name)
    assert dnsmasq.queries(name) == 1
    assert resolver.counts.failures == {"nxdomain": 1}


@pytest.mark.timing("asserts the seconds to a DNS error between 0.3 s and 5 s")
async def test_a_name_never_answered_is_a_dns_error_after_the_tries(dnsmasq, resolver):
    name = fresh("slow.test")
    started = time.monotonic()
    with pytest.raises(DnsLookupError) as failed:
        await addresses(resolver, name)
    took_s = time.monotonic() - started
    assert (failed.value.kind, failed.value.final) == ("timeout", False)
    assert 0.3 <= took_s < 5, took_s
    # c-ares asked again before it gave up.
    assert dnsmasq.queries(name) >= 2
    asked = dnsmasq.queries(name)
    with pytest.raises(DnsLookupError):  # and the failure is remembered
        await addresses(resolver, name)
    assert dnsmasq.queries(name) == asked


# --- which servers --------------------------------------------------------------------------
async def test_dns_servers_are_the_resolvers_asked(dnsmasq):
    name = fresh()
    env = {"DNS_SERVERS": dnsmasq.server}
    resolver = CachingResolver(WorkerSettings.from_env(env).dns)
    try:
        assert await addresses(resolver, name) == ["127.0.0.1"]
    finally:
        await resolver.close()
    assert dnsmasq.queries(name) == 1
    # Pointed at a port where no server listens, the same name does not resolve.
    nowhere = settings_for(dnsmasq, servers=(f"127.0.0.1:{free_port()}",))
    resolver = CachingResolver(nowhere)
    try:
        with pytest.raises(DnsLookupError) as failed:
            await addresses(resolver, name)
    finally:
        await resolver.close()
    assert failed.value.kind in {"refused", "timeout"}
    assert dnsmasq.queries(name) == 1


def etc_hosts() -> dict[str, str]:
    """The IPv4 names of /etc/hosts and their addresses."""
    found: dict[str, str] = {}
    for line in Path("/etc/hosts").read_text().splitlines():
        address, *names = line.split("#", 1)[0].split() or [""]
        if address.count(".") == 3:
            found.update({name.lower(): address for name in names if name not in found})
    return found


async def test_etc_hosts_and_localhost_still_resolve(dnsmasq, resolver):
    assert "127.0.0.1" in await addresses(resolver, "localhost")
    assert dnsmasq.queries("localhost") == 0  # answered without asking a server
    # Another name of /etc/hosts, if it has one: dnsmasq has none (it reads no hosts file).
    others = {n: a for n, a in (await asyncio.to_thread(etc_hosts)).items() if n != "localhost"}
    for name, address in list(others.items())[:1]:
        assert address in await addresses(resolver, name)
        assert dnsmasq.queries(name) == 0


# --- the fetcher through it ------------------------------------------------------------------
@pytest.fixture
async def fetch(dnsmasq):
    session = new_session(FETCH, ORIGIN_ONLY, settings_for(dnsmasq))
    yield Fetcher(session, FETCH, ORIGIN_ONLY).fetch
    await session.close()


async def test_a_name_that_does_not_exist_is_a_dns_error(origin, fetch):
    result = await fetch(f"http://img.{fresh('nx.test')}:{origin.port}/x.jpg")
    assert (result.status, result.dns_failure) == ("DnsError", "nxdomain")
    assert "nxdomain" in result.detail and result.response_s is None
    assert origin.total_requests == 0


async def test_a_name_never_answered_is_a_dns_error_not_a_timeout(origin, fetch):
    result = await fetch(f"http://{fresh('slow.test')}:{origin.port}/x.jpg")
    assert (result.status, result.dns_failure) == ("DnsError", "timeout")


async def test_any_name_of_the_wildcard_reaches_the_origin(origin, fetch):
    body = bytes(range(256)) * 10
    origin.add("/a.jpg", body, "image/jpeg")
    name = fresh()
    result = await fetch(f"http://{name}:{origin.port}/a.jpg")
    assert result.ok and result.body is not None and joined(result.body) == body
    (headers,) = origin.request_headers("/a.jpg")
    assert headers["Host"] == f"{name}:{origin.port}"


async def test_the_address_a_name_resolves_to_is_still_checked(origin, fetch, dnsmasq):
    origin.add("/a.jpg", b"img", "image/jpeg")
    result = await fetch(f"http://private.test:{origin.port}/a.jpg")
    assert result.status == "Blocked", result
    assert PRIVATE_ADDRESS in result.detail
    assert origin.total_requests == 0


@pytest.mark.timing("asserts 30 robots verdicts end as DNS errors within 1 s")
async def test_urls_of_a_host_that_does_not_exist_end_at_once_on_one_query(redis, dnsmasq):
    """robots.txt's verdict for the whole host, from one lookup: its URLs end as DnsError
    within a second, not after the day an unreachable robots.txt is waited for."""
    session = new_session(FETCH, ORIGIN_ONLY, settings_for(dnsmasq))
    guard = RobotsGuard(redis, Fetcher(session, FETCH, ORIGIN_ONLY), FakePacer(), RobotsSettings())
    name = fresh("nx.test")
    try:
        started = time.monotonic()
        verdicts = await asyncio.wait_for(
            asyncio.gather(
                *(guard.verdict("example", f"http://{name}/{i}.jpg") for i in range(30))
            ),
            10,
        )
        assert set(verdicts) == {"DnsError"}
        assert time.monotonic() - started < 1.0
    finally:
        guard.close()
        await session.close()
    assert dnsmasq.queries(name) == 1 and guard.fetches == 1
