"""DNS: a worker's names resolved through c-ares (aiodns), each answer kept for its TTL.

aiohttp's default resolver blocks a thread per lookup (the C library's getaddrinfo), and
its cache keeps every answer a fixed time and no failure at all: on a long tail of hosts
each name costs a thread's wait, and a name that does not exist is asked again for each of
its URLs. ``CachingResolver`` is the worker's one resolver instead, behind the address
check (worker/download/netguard.py, which connects to exactly the addresses it checked):

- An answer is kept for its TTL (the least of its records', CNAMEs included), clamped to
  ``[min_ttl_s, max_ttl_s]``: a name is not asked again for every few requests to a host
  whose TTL is seconds, nor trusted for a day.
- A failure is kept for ``negative_ttl_s``, whatever its kind (``FAILURE_KINDS``:
  NXDOMAIN, a name without an address, SERVFAIL, no answer after c-ares' own tries, a
  refusal): a host's URLs share one answer, and a resolver in trouble is not asked again
  at once.
- Concurrent lookups of one name share one query; at most ``max_in_flight`` queries are
  out at once (the others wait their turn), so that a burst of new hosts does not flood
  the resolver, the way img2dataset users' crawls overwhelm theirs.
- The cache holds at most ``cache_entries`` names, the least recently used going first:
  a crawl of a million hosts does not grow it without bound (an entry, its name included,
  is about 0.45 KiB: 45 MB for the default 100,000). c-ares caches answers too, for their
  TTL, without a bound pycares lets us set: a new c-ares client every
  ``lookups_per_client`` lookups drops that one's.
- c-ares' sockets are watched by the worker's event loop (``_LoopResolver``), not by the
  thread aiodns starts for each client by default: that thread hands every answer to the
  loop through its wake-up pipe and shares the client's lock with it (measured with
  dnsmasq on loopback, 5,000 new names 50 at a time: 0.09 ms of CPU a lookup against
  0.17-0.20, 0.09 against 0.10-0.12 of it in the loop's own thread). c-ares' timeouts are
  then checked on the loop's timer (every ``timeout_s``, at most a second), and a change
  of /etc/resolv.conf, which that thread would have watched for, is read by the next
  client.
- ``servers``: the resolvers asked (``DNS_SERVERS``), else those of /etc/resolv.conf.
  /etc/hosts is read first, as resolv.conf's lookup order says (c-ares answers
  ``localhost`` itself). Names are absolute: resolv.conf's search domains are not tried
  (a URL's host is a name on the internet, and a Kubernetes pod's ``ndots:5`` would
  otherwise cost up to four queries more for every name, and as many for each NXDOMAIN).

A name that does not resolve raises ``DnsLookupError``, an ``OSError``: aiohttp wraps it in
``ClientConnectorDNSError``, and the fetcher ends the fetch as ``DnsError``. Lookups,
cache hits and failures by kind are counted (worker/metrics.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import ipaddress
import socket
import time
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

import aiodns
import pycares
from aiohttp.abc import AbstractResolver, ResolveResult

from worker.metrics import DNS_CACHE_HITS, DNS_FAILURES, DNS_QUERIES

# What a failed lookup was. The first two are answers (the name, or any address of it,
# does not exist: asking again soon gets the same from any resolver, which caches them by
# the zone's negative TTL); the others are failures to get one.
FAILURE_KINDS: Final = ("nxdomain", "nodata", "servfail", "timeout", "refused", "other")
FINAL_KINDS: Final = frozenset({"nxdomain", "nodata"})
_KINDS: Final = {
    pycares.errno.ARES_ENOTFOUND: "nxdomain",
    pycares.errno.ARES_ENONAME: "nxdomain",
    # A name DNS cannot carry (a label over 63 bytes...) exists nowhere either.
    pycares.errno.ARES_EBADNAME: "nxdomain",
    pycares.errno.ARES_ENODATA: "nodata",
    pycares.errno.ARES_ESERVFAIL: "servfail",
    pycares.errno.ARES_ETIMEOUT: "timeout",
    pycares.errno.ARES_EREFUSED: "refused",
    # No server would take the query (ICMP port unreachable from every one).
    pycares.errno.ARES_ECONNREFUSED: "refused",
}
for _kind in FAILURE_KINDS:
    DNS_FAILURES.labels(_kind)  # every kind exported from the start, at 0

DEFAULT_PORT: Final = 53
# c-ares ends every lookup itself (about 5 s at the default timeout and tries); this only
# frees the in-flight slot of a lookup that never calls back.
_LOOKUP_DEADLINE_S: Final = 30.0
# Connect to an address as given: never resolved again (aiohttp's own resolvers say so).
_NUMERIC: Final = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV


@dataclasses.dataclass(frozen=True, slots=True)
class DnsSettings:
    """The worker's resolver (see the module's docstring). Times in seconds.

    ``timeout_s`` and ``tries`` are c-ares': the first try's wait for an answer (each
    next try waits longer) and the tries per server. At 2 s and 2, a name whose servers
    never answer fails after about 5 s, well inside a fetch's connect timeout
    (FETCH_CONNECT_TIMEOUT_S, 10 s, which the lookup counts against): the fetch then ends
    as DnsError, not as a Timeout of the connection.
    """

    # "address:port" as c-ares takes them ("[v6]:port"); empty: /etc/resolv.conf's.
    servers: tuple[str, ...] = ()
    # A minute: a TTL of seconds (CDNs) would cost a query every few requests to a busy
    # host; an hour: a host that moves is found within the hour.
    min_ttl_s: float = 60.0
    max_ttl_s: float = 3600.0
    # A minute: long enough for a host's URLs to share one failure, short enough that a
    # name that failed for a moment is asked again soon (robots.txt waits that long before
    # it asks again: worker/politeness/robots.py).
    negative_ttl_s: float = 60.0
    # A local recursive resolver answers a cold name in tens to hundreds of ms: 100 at
    # once is hundreds of new hosts a second, more than a worker fetches.
    max_in_flight: int = 100
    # As many as the URLs a worker keeps waiting for their hosts (MAX_WAITING_URLS): a
    # name looked up for its robots.txt is still there for its image.
    cache_entries: int = 100_000
    timeout_s: float = 2.0
    tries: int = 2
    # c-ares keeps every answer in a cache of its own as well, for its TTL (up to an
    # hour), about 1.2 KiB a name, and pycares cannot turn it off: on a long tail of
    # hosts, a GiB an hour. A new client after this many lookups bounds it (measured: a
    # worker's memory grew by 21 MB over 80,000 names, against 93 MB without); starting
    # one costs under a millisecond.
    lookups_per_client: int = 10_000


class DnsLookupError(OSError):
    """A name that did not resolve: ``kind`` is one of ``FAILURE_KINDS``."""

    def __init__(self, host: str, kind: str, reason: str) -> None:
        self.host = host
        self.kind = kind
        super().__init__(f"{host}: {kind} ({reason})")

    @property
    def final(self) -> bool:
        """The name (or any address of it) does not exist: asking again soon changes
        nothing."""
        return self.kind in FINAL_KINDS


def parse_servers(spec: str) -> tuple[str, ...]:
    """``"10.0.0.53, 127.0.0.1:5353, [2001:db8::53]:53"`` -> c-ares' ``address:port``
    strings (port 53 when none is given); raises ValueError naming a bad entry. Servers
    are addresses: c-ares cannot resolve a resolver's name."""
    servers = []
    for part in spec.replace(";", ",").split(","):
        part = part.strip()
        if part:
            servers.append(_server(part))
    return tuple(servers)


def _server(part: str) -> str:
    host, port = part, ""
    if part.startswith("["):
        host, _, rest = part[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise ValueError(f"not an address:port: {part!r}")
        port = rest[1:]
    elif part.count(":") == 1:
        host, port = part.split(":")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"not an IP address (and port): {part!r}") from None
    if port and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"not a port (1 to 65535): {part!r}")
    shown = f"[{address}]" if address.version == 6 else str(address)
    return f"{shown}:{int(port) if port else DEFAULT_PORT}"


class _Answers(Protocol):
    """What ``DNSResolver.getaddrinfo`` answers (pycares' ``AddrInfoResult``)."""

    @property
    def nodes(self) -> list[pycares.AddrInfoNode]: ...

    @property
    def cnames(self) -> list[pycares.AddrInfoCname]: ...


class AsyncDns(Protocol):
    """The part of ``aiodns.DNSResolver`` used here: the seam a test replaces."""

    def getaddrinfo(
        self, host: str, family: socket.AddressFamily = ..., *, type: int = ...
    ) -> Awaitable[_Answers]: ...

    async def close(self) -> None: ...


class _Entry:
    """One name's answer: its addresses (an IPv6 one has a ':', an IPv4 one none), or
    its failure's kind and reason; fresh until ``expires_at`` (the resolver's clock)."""

    __slots__ = ("addresses", "expires_at", "kind", "reason")

    def __init__(
        self,
        expires_at: float,
        addresses: tuple[str, ...] = (),
        kind: str = "",
        reason: str = "",
    ) -> None:
        self.expires_at = expires_at
        self.addresses = addresses
        self.kind = kind
        self.reason = reason

    def results(self, host: str, port: int) -> list[ResolveResult]:
        """The answer as aiohttp takes it; raises a new ``DnsLookupError`` for a failure
        (a new one each time: raising one instance again would grow its traceback)."""
        if self.kind:
            raise DnsLookupError(host, self.kind, self.reason)
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=_NUMERIC,
            )
            for address in self.addresses
        ]


@dataclasses.dataclass(slots=True)
class DnsCounts:
    """This resolver's counts (the process's are in worker/metrics.py): ``queries``
    looked up, ``hits`` answered without a query of their own (from the cache, a
    failure included, or by joining a query in flight), ``failures`` by kind."""

    queries: int = 0
    hits: int = 0
    failures: dict[str, int] = dataclasses.field(default_factory=dict)

    def hit(self) -> None:
        self.hits += 1
        DNS_CACHE_HITS.inc()

    def query(self) -> None:
        self.queries += 1
        DNS_QUERIES.inc()

    def failure(self, kind: str) -> None:
        self.failures[kind] = self.failures.get(kind, 0) + 1
        DNS_FAILURES.labels(kind).inc()


class CachingResolver(AbstractResolver):
    """aiohttp's resolver interface on c-ares, caching as the module's docstring says.

    ``dns`` makes a c-ares client (by default one of ``settings``, within a running event
    loop: a new one every ``lookups_per_client`` lookups); ``clock`` is the monotonic
    clock entries expire by. ``close`` closes the clients and gives up the lookups in
    flight.
    """

    def __init__(
        self,
        settings: DnsSettings | None = None,
        *,
        dns: Callable[[], AsyncDns] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings = settings or DnsSettings()
        new = dns if dns is not None else functools.partial(_c_ares, settings)
        self._clients = _Clients(new, settings.lookups_per_client)
        self._clock = clock
        self._cache: OrderedDict[tuple[str, int], _Entry] = OrderedDict()
        self._pending: dict[tuple[str, int], asyncio.Task[_Entry]] = {}
        self._in_flight = asyncio.Semaphore(settings.max_in_flight)
        self.counts = DnsCounts()

    @property
    def cached(self) -> int:
        """Names (with their address family) in the cache, expired ones not yet dropped
        included."""
        return len(self._cache)

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        key = (host, int(family))
        entry = self._cached(key)
        if entry is not None:
            self.counts.hit()
        else:
            entry = await self._shared(key)
        return entry.results(host, port)

    def _cached(self, key: tuple[str, int]) -> _Entry | None:
        entry = self._cache.get(key)
        if entry is None:
            return None
        if self._clock() >= entry.expires_at:
            del self._cache[key]
            return None
        self._cache.move_to_end(key)
        return entry

    async def _shared(self, key: tuple[str, int]) -> _Entry:
        task = self._pending.get(key)
        if task is None:
            task = asyncio.create_task(self._lookup(key))
            self._pending[key] = task
            task.add_done_callback(lambda _: self._pending.pop(key, None))
        else:
            self.counts.hit()
        # Shielded: a fetch that gives up (its connect timeout) leaves the lookup to
        # finish for the others, and for the cache.
        return await asyncio.shield(task)

    async def _lookup(self, key: tuple[str, int]) -> _Entry:
        host, family = key
        async with self._in_flight:
            self.counts.query()
            client = await self._clients.take()
            try:
                async with asyncio.timeout(_LOOKUP_DEADLINE_S):
                    answers = await client.getaddrinfo(
                        host, socket.AddressFamily(family), type=socket.SOCK_STREAM
                    )
            except aiodns.error.DNSError as e:
                entry = self._failed(_kind_of(e), _reason_of(e))
            except TimeoutError:
                entry = self._failed("timeout", f"no answer in {_LOOKUP_DEADLINE_S:g} s")
            else:
                entry = self._answered(answers)
            finally:
                await self._clients.give_back(client)
        self._store(key, entry)
        return entry

    def _answered(self, answers: _Answers) -> _Entry:
        addresses = tuple(dict.fromkeys(_address(node) for node in answers.nodes))
        if not addresses:
            return self._failed("nodata", "no address")
        ttls = [node.ttl for node in answers.nodes] + [c.ttl for c in answers.cnames]
        settings = self._settings
        ttl_s = min(max(min(ttls), settings.min_ttl_s), settings.max_ttl_s)
        return _Entry(self._clock() + ttl_s, addresses)

    def _failed(self, kind: str, reason: str) -> _Entry:
        self.counts.failure(kind)
        return _Entry(self._clock() + self._settings.negative_ttl_s, kind=kind, reason=reason)

    def _store(self, key: tuple[str, int], entry: _Entry) -> None:
        cache = self._cache
        cache[key] = entry
        cache.move_to_end(key)
        while len(cache) > self._settings.cache_entries:
            cache.popitem(last=False)

    async def close(self) -> None:
        for task in list(self._pending.values()):
            task.cancel()
        self._pending.clear()
        await self._clients.close()


class _Clients:
    """The c-ares client lookups go to: a new one after every ``every`` lookups (see
    ``DnsSettings.lookups_per_client``), the one it replaces closed once its last lookup
    has ended."""

    def __init__(self, new: Callable[[], AsyncDns], every: int) -> None:
        self._new = new
        self._every = every
        self._current = new()
        self._lookups = 0  # sent to the current client
        self._busy: dict[AsyncDns, int] = {}  # lookups in flight, by client
        self._retired: list[AsyncDns] = []

    async def take(self) -> AsyncDns:
        """The client for one more lookup; give it back with ``give_back``."""
        if self._lookups >= self._every:
            old, self._current, self._lookups = self._current, self._new(), 0
            if old in self._busy:
                self._retired.append(old)
            else:
                await old.close()
        self._lookups += 1
        client = self._current
        self._busy[client] = self._busy.get(client, 0) + 1
        return client

    async def give_back(self, client: AsyncDns) -> None:
        left = self._busy.pop(client) - 1
        if left:
            self._busy[client] = left
        elif client in self._retired:
            self._retired.remove(client)
            await client.close()

    async def close(self) -> None:
        clients, self._retired = [self._current, *self._retired], []
        for client in clients:
            await client.close()


class _LoopResolver(aiodns.DNSResolver):
    """aiodns' resolver with c-ares' sockets on the event loop: the way aiodns itself
    runs when it cannot start its event thread (see the module's docstring). aiodns has
    no option for it: this replaces its private ``_make_channel`` (aiodns 4, pinned in
    constraints.txt; test_dns_dnsmasq reads aiodns' flag for it)."""

    def _make_channel(self, **kwargs: Any) -> tuple[bool, pycares.Channel]:
        # A weak reference, as aiodns' own: the channel's callback must not keep the
        # resolver alive.
        resolver = weakref.ref(self)

        def on_socket(fd: int, readable: bool, writable: bool) -> None:
            this = resolver()
            if this is not None:
                this._sock_state_cb(fd, readable, writable)

        channel = pycares.Channel(sock_state_cb=on_socket, timeout=self._timeout, **kwargs)
        return False, channel


def _c_ares(settings: DnsSettings) -> aiodns.DNSResolver:
    return _LoopResolver(
        nameservers=list(settings.servers) or None,
        loop=asyncio.get_running_loop(),
        timeout=settings.timeout_s,
        tries=settings.tries,
        flags=pycares.ARES_FLAG_NOSEARCH,
    )


def _address(node: pycares.AddrInfoNode) -> str:
    address = node.addr[0]
    text = address.decode() if isinstance(address, bytes) else str(address)
    if node.family == socket.AF_INET6 and len(node.addr) > 3 and node.addr[3]:
        text = f"{text}%{node.addr[3]}"  # a link-local address's scope
    return text


def _kind_of(error: aiodns.error.DNSError) -> str:
    code = error.args[0] if error.args else None
    return _KINDS.get(code, "other") if isinstance(code, int) else "other"


def _reason_of(error: aiodns.error.DNSError) -> str:
    return str(error.args[1]) if len(error.args) > 1 else repr(error)
