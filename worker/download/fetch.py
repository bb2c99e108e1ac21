"""Downloading one URL: the only place the worker speaks HTTP to a source.

A fetch ends in a ``FetchResult`` whose status is the HTTP code or an error name; network
failures are outcomes, not exceptions. A re-check's fetch is conditional (its
``conditions``, worker/download/recheck.py): a 304 ends it with status "304", no body.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import time
import types
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

import aiohttp
from aiohttp.abc import AbstractResolver
from yarl import URL

from image_crawler.contract import Status, is_validator
from worker.download.budget import ByteBudget
from worker.download.dns import CachingResolver, DnsLookupError, DnsSettings
from worker.download.netguard import AddressPolicy, BlockedAddressError, GuardedResolver
from worker.images.pool import Body, body_size
from worker.politeness.robots_rules import DEFAULT_PRODUCT_TOKEN
from worker.politeness.signals import NO_SIGNALS, Signals, tdm_headers, x_robots_tag
from worker.settings import FetchSettings

ALLOWED_SCHEMES = frozenset({"http", "https"})
# HTTP codes (ints, as aiohttp gives them) whose Location the fetcher follows itself.
REDIRECT_CODES = frozenset({301, 302, 303, 307, 308})
_CHUNK_BYTES = 256 * 1024
# What a fetch takes of the budget before it knows better, and the least it ever takes.
_FIRST_ESTIMATE_BYTES = 1024 * 1024
_MIN_ESTIMATE_BYTES = 64 * 1024
# A Retry-After is a number or a date: anything longer is junk, kept short for the logs.
RETRY_AFTER_MAX_CHARS = 200


@dataclasses.dataclass(frozen=True, slots=True)
class FetchResult:
    status: str  # "200", "404", "Timeout", "TooLarge", "Blocked", "DnsError", ...
    # As it arrived: pieces are not joined, the image pool copies them where it needs them.
    body: Body | None = None
    detail: str = ""
    # Gives the body's bytes back to the fetcher's budget; call once the body is done with.
    release: Callable[[], None] = dataclasses.field(default=lambda: None, repr=False)
    # The raw Retry-After header of a final response other than 200 or a redirect (the
    # first RETRY_AFTER_MAX_CHARS characters), None without one; see
    # worker/politeness/retry_after.py.
    retry_after: str | None = None
    # Seconds from sending the final hop's request to its response headers: the server's
    # answer time, without the wait for a connection. None when no response came.
    response_s: float | None = None
    # Redirects followed before this result (its hop's index).
    redirects: int = 0
    # What an image's answer said of its use (X-Robots-Tag, tdm-reservation); an answer
    # that keeps the image out of the index ends as NoIndex, its body unread, the
    # directives in ``detail``.
    signals: Signals = NO_SIGNALS
    # The 200's ETag and Last-Modified headers as the server sent them, None without one
    # (or with one no request header could carry back: see contract.is_validator).
    etag: str | None = None
    last_modified: str | None = None
    # For a DnsError: what failed (one of worker.download.dns.FAILURE_KINDS).
    dns_failure: str = ""

    @property
    def ok(self) -> bool:
        return self.status == Status.OK and self.body is not None


# Asked before each redirect hop: None lets the hop go ahead, a status ends the fetch with
# that status (robots.txt: worker/politeness/robots.py).
HopPermit = Callable[[URL], Awaitable[str | None]]


class Reservation(Protocol):
    """Bytes of the fetcher's budget taken for one fetch (``UrlFetcher.reserve``)."""

    def release(self) -> None: ...


class UrlFetcher(Protocol):
    async def reserve(self) -> Reservation:
        """Wait for a typical body's bytes of the budget, for a fetch to come: taken
        before the request's pacing slot, so that a request never waits for memory
        between its slot and its send (it would reach its server late, and the next
        one on time: closer together than the host's Crawl-delay)."""
        ...

    async def fetch(
        self,
        url: str,
        permit: HopPermit | None = None,
        conditions: Mapping[str, str] | None = None,
        reserved: Reservation | None = None,
    ) -> FetchResult:
        """Download ``url`` (sending ``conditions``, a re-check's If-None-Match and
        If-Modified-Since, with each hop's request), with the budget ``reserved`` for it
        (None: taken now); every failure is a status, never an exception. The
        reservation is the fetch's from then on (released with its result)."""
        ...


def new_session(
    settings: FetchSettings,
    policy: AddressPolicy,
    dns: DnsSettings | None = None,
    *,
    resolver: CachingResolver | None = None,
) -> aiohttp.ClientSession:
    """The one HTTP client of a worker process (within a running event loop).

    Names are resolved once, by ``resolver`` (None: a new ``CachingResolver`` of ``dns``,
    defaults when None), which the session closes with itself, through ``policy``, and
    the connector connects to the checked addresses only. Proxy variables are ignored on
    purpose: a proxy would resolve again.
    """
    timeout = aiohttp.ClientTimeout(
        total=settings.total_timeout_s,
        connect=settings.connect_timeout_s,
        sock_read=settings.read_timeout_s,
    )
    resolver = resolver if resolver is not None else CachingResolver(dns)
    connector = _Connector(GuardedResolver(policy, resolver), limit=settings.max_connections)
    # Marks when each request's headers are written: the response time the fetcher reports
    # starts there, not before a wait for a free connection (our queue, not the server's).
    timing = aiohttp.TraceConfig()
    timing.on_request_headers_sent.append(_headers_sent)
    session = aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        trust_env=False,
        headers={"User-Agent": settings.user_agent},
        # No cookies: each URL is fetched as if it were the first. A jar would send one
        # source's cookies back on every later request and keep those of every host the
        # crawl ever touched, for the life of the process.
        cookie_jar=aiohttp.DummyCookieJar(),
        max_line_size=settings.max_header_bytes,
        max_field_size=settings.max_header_bytes,
        # Reads of up to a chunk at a time: aiohttp's smaller default wakes the loop more
        # often for every body (the profile in bench/README.md).
        read_bufsize=_CHUNK_BYTES,
        trace_configs=[timing],
    )
    # aiohttp (3.10 onwards) silently repeats a GET whose connection was dropped or reset:
    # a second request to the source that pacing never granted. 3.10 has no way to stop
    # it; from 3.11 on this private flag does (aiohttp's own test client sets it the same
    # way), hence aiohttp>=3.11. test_fetch pins one request per fetch.
    session._retry_connection = False
    return session


class _Connector(aiohttp.TCPConnector):
    """A connector of at most ``limit`` connections that closes its resolver with
    itself: aiohttp closes only a resolver it made."""

    def __init__(self, resolver: AbstractResolver, *, limit: int) -> None:
        # No cache of aiohttp's: the resolver caches (each answer by its TTL, failures
        # too), and aiohttp's would keep every answer a fixed time on top of it.
        super().__init__(resolver=resolver, limit=limit, use_dns_cache=False)
        self._own_resolver = resolver

    async def close(self, *, abort_ssl: bool = False) -> None:
        try:
            await super().close(abort_ssl=abort_ssl)
        finally:
            await self._own_resolver.close()


class _Timing:
    """When one request's headers were sent (``time.monotonic()``), None until then."""

    __slots__ = ("sent_at",)

    def __init__(self) -> None:
        self.sent_at: float | None = None


async def _headers_sent(
    session: aiohttp.ClientSession,
    context: types.SimpleNamespace,
    params: aiohttp.TraceRequestHeadersSentParams,
) -> None:
    request_context = context.trace_request_ctx
    if isinstance(request_context, dict):
        timing = request_context.get("timing")
        if isinstance(timing, _Timing):
            timing.sent_at = time.monotonic()


class Fetcher:
    """GETs a URL with the session it is given, within the size and redirect limits.

    Redirects are followed here, not by aiohttp, so that every hop's URL is checked
    against ``policy`` before it is requested (a literal address never reaches the
    resolver, which checks names). With a ``budget``, a body's bytes are taken from it
    before they are read and held until the caller calls ``FetchResult.release``.

    The wait for budget happens before the request is sent, never while a response is
    open (its read timeout would run out while it waits): the fetcher takes a typical
    body's size up front (a running mean of recent bodies; ``reserve``, before the
    request's pacing slot) and a body that turns out larger takes the difference as an
    overdraft (``ByteBudget.take``).

    An image's answer is read for what it says of the image's use (worker.politeness.
    signals), X-Robots-Tag groups for ``token`` (our robots.txt token) included: one that
    keeps the image out of the index ends as ``NoIndex`` before its body is read.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        settings: FetchSettings,
        policy: AddressPolicy,
        budget: ByteBudget | None = None,
        *,
        token: str = DEFAULT_PRODUCT_TOKEN,
    ) -> None:
        self._session = session
        self._settings = settings
        self._policy = policy
        self._budget = budget
        self._token = token
        self._typical_body_bytes = _FIRST_ESTIMATE_BYTES

    async def reserve(self) -> _Hold:
        hold = _Hold(self._budget)
        if self._budget is not None:
            hold.held = await self._budget.acquire(self._typical_body_bytes)
        return hold

    async def fetch(
        self,
        url: str,
        permit: HopPermit | None = None,
        conditions: Mapping[str, str] | None = None,
        reserved: Reservation | None = None,
    ) -> FetchResult:
        """Download ``url``, asking ``permit`` before each redirect hop; ``conditions``
        (request headers) go with every hop's request; ``reserved`` (from ``reserve``,
        None: taken now) is the budget it starts with."""
        try:
            current = URL(url)
        except (ValueError, TypeError) as e:
            if reserved is not None:
                reserved.release()
            return FetchResult(Status.INVALID_URL, detail=str(e))
        refusal = self._refusal(current)
        if refusal is not None:  # refused before it waits for any budget
            if reserved is not None:
                reserved.release()
            return FetchResult(Status.BLOCKED, detail=refusal)
        hold = reserved if isinstance(reserved, _Hold) else await self.reserve()
        read = _Read(
            self._settings.max_body_bytes, truncate=False, signals=True, headers=conditions
        )
        try:
            result = await self._follow(current, hold, read, permit, self._settings.max_redirects)
        except BaseException:
            hold.release()
            raise
        if result.ok:
            assert result.body is not None
            self._learn(body_size(result.body))
        else:
            hold.release()
        return result

    async def fetch_text(self, url: str, max_bytes: int, max_redirects: int) -> FetchResult:
        """GET a small text resource (robots.txt): the first ``max_bytes`` of the body
        are kept and the rest is not read (``detail`` then says "truncated"). Outside the
        byte budget, which is for images: ``max_bytes`` bounds it."""
        try:
            current = URL(url)
        except (ValueError, TypeError) as e:
            return FetchResult(Status.INVALID_URL, detail=str(e))
        read = _Read(max_bytes, truncate=True)
        return await self._follow(current, _Hold(None), read, None, max_redirects)

    async def _follow(
        self,
        url: URL,
        hold: _Hold,
        read: _Read,
        permit: HopPermit | None,
        max_redirects: int,
    ) -> FetchResult:
        current = url
        for hop in range(max_redirects + 1):
            result = await self._hop(current, hold, read, permit if hop else None)
            if isinstance(result, FetchResult):
                return dataclasses.replace(result, redirects=hop) if hop else result
            current = result
        return FetchResult(
            Status.TOO_MANY_REDIRECTS, detail=f"more than {max_redirects}", redirects=max_redirects
        )

    async def _hop(
        self, url: URL, hold: _Hold, read: _Read, permit: HopPermit | None
    ) -> FetchResult | URL:
        refusal = self._refusal(url)
        if refusal is not None:
            return FetchResult(Status.BLOCKED, detail=refusal)
        if permit is not None:
            status = await permit(url)
            if status is not None:
                return FetchResult(status, detail=str(url))
        return await self._get_once(url, hold, read)

    def _learn(self, size: int) -> None:
        # A running mean over about the last 32 bodies, kept within sensible bounds.
        mean = self._typical_body_bytes + (size - self._typical_body_bytes) // 32
        self._typical_body_bytes = min(
            max(mean, _MIN_ESTIMATE_BYTES), self._settings.max_body_bytes
        )

    def _signals(self, response: aiohttp.ClientResponse) -> Signals:
        # Most answers carry neither header: two lookups, nothing parsed.
        headers = response.headers
        x_robots = headers.getall("X-Robots-Tag", ())
        reservation = headers.get("tdm-reservation")
        if not x_robots and reservation is None:
            return NO_SIGNALS
        said = x_robots_tag(x_robots, self._token, dt.datetime.now(dt.UTC))
        return said | tdm_headers(reservation, headers.get("tdm-policy"))

    def _refusal(self, url: URL) -> str | None:
        if url.scheme.lower() not in ALLOWED_SCHEMES:
            return f"scheme {url.scheme!r} is not http or https"
        if not url.host:
            return "no host"
        return self._policy.refusal(url.host)

    async def _get_once(self, url: URL, hold: _Hold, read: _Read) -> FetchResult | URL:
        """One request: a final result, or the URL a redirect points to."""
        timing = _Timing()
        # The fallback start, for a session built without new_session's trace.
        started = time.monotonic()
        try:
            async with self._session.get(
                url,
                allow_redirects=False,
                headers=read.headers,
                trace_request_ctx={"timing": timing},
            ) as response:
                sent_at = started if timing.sent_at is None else timing.sent_at
                response_s = max(0.0, time.monotonic() - sent_at)
                if response.status in REDIRECT_CODES:
                    location = response.headers.get("Location")
                    if not location:
                        return FetchResult(
                            str(response.status),
                            detail="redirect without Location",
                            response_s=response_s,
                        )
                    return response.url.join(URL(location))
                if response.status != 200:
                    retry_after = response.headers.get("Retry-After")
                    if retry_after is not None:
                        retry_after = retry_after[:RETRY_AFTER_MAX_CHARS]
                    return FetchResult(
                        str(response.status), retry_after=retry_after, response_s=response_s
                    )
                signals = self._signals(response) if read.signals else NO_SIGNALS
                if signals.noindex:
                    # Not read: the server asked that the image not be indexed, and it
                    # will not be. The connection is closed rather than drained.
                    return FetchResult(
                        Status.NO_INDEX,
                        detail=", ".join(signals.noindex),
                        response_s=response_s,
                        signals=signals,
                    )
                result = await self._read_body(response, hold, read, response_s)
                if not result.ok:
                    return dataclasses.replace(result, signals=signals) if signals else result
                return _with_validators(result, response.headers, signals)
        except aiohttp.ServerDisconnectedError as e:
            return FetchResult(Status.SERVER_DISCONNECTED, detail=str(e))
        except (TimeoutError, aiohttp.ServerTimeoutError) as e:
            return FetchResult(Status.TIMEOUT, detail=repr(e))
        except (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError, ValueError) as e:
            return FetchResult(Status.INVALID_URL, detail=str(e))
        except aiohttp.ClientConnectorError as e:
            return _not_connected(e)
        except aiohttp.ClientPayloadError as e:
            return FetchResult(Status.PAYLOAD_ERROR, detail=str(e))
        except aiohttp.ClientResponseError as e:
            return FetchResult(Status.BAD_RESPONSE, detail=str(e))
        except aiohttp.ClientError as e:
            return FetchResult(Status.CLIENT_ERROR, detail=repr(e))

    async def _read_body(
        self, response: aiohttp.ClientResponse, hold: _Hold, read: _Read, response_s: float
    ) -> FetchResult:
        cap = read.max_bytes
        declared = response.content_length
        if declared is not None and declared > cap and not read.truncate:
            return FetchResult(
                Status.TOO_LARGE, detail=f"Content-Length {declared}", response_s=response_s
            )
        if declared is not None:
            hold.cover(declared)
        chunks: list[bytes] = []
        size = 0
        detail = ""
        async for chunk in response.content.iter_chunked(min(_CHUNK_BYTES, cap + 1)):
            size += len(chunk)
            if size > cap:
                if not read.truncate:
                    return FetchResult(
                        Status.TOO_LARGE, detail=f"body over {cap} bytes", response_s=response_s
                    )
                # The rest is never read: the connection is closed, not drained.
                chunks.append(chunk[: len(chunk) - (size - cap)])
                size, detail = cap, f"truncated at {cap} bytes"
                break
            hold.cover(size)  # no Content-Length, or a wrong one
            chunks.append(chunk)
        body: Body = chunks[0] if len(chunks) == 1 else tuple(chunks)
        return FetchResult(
            Status.OK, body=body, detail=detail, release=hold.keep(size), response_s=response_s
        )


def _not_connected(error: aiohttp.ClientConnectorError) -> FetchResult:
    """No connection: the address check refused every address (``Blocked``), the name
    did not resolve (``DnsError``), or connecting failed."""
    cause = error.os_error
    if isinstance(cause, BlockedAddressError):
        return FetchResult(Status.BLOCKED, detail=str(cause))
    if isinstance(cause, DnsLookupError):
        return FetchResult(Status.DNS_ERROR, detail=str(cause), dns_failure=cause.kind)
    return FetchResult(Status.CONNECTION_ERROR, detail=str(error))


def _with_validators(
    result: FetchResult, headers: Mapping[str, str], signals: Signals
) -> FetchResult:
    etag = headers.get("ETag")
    last_modified = headers.get("Last-Modified")
    if etag is None and last_modified is None and not signals:
        return result  # no copy of the result for an answer that says nothing more
    return dataclasses.replace(
        result,
        signals=signals,
        etag=etag if is_validator(etag) else None,
        last_modified=last_modified if is_validator(last_modified) else None,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Read:
    """How much of a body is read: over ``max_bytes`` it is TooLarge, or, with
    ``truncate``, cut there; with ``signals``, the answer is an image's, read for its
    opt-out signals."""

    max_bytes: int
    truncate: bool
    signals: bool = False
    # Sent with the request: a re-check's conditions.
    headers: Mapping[str, str] | None = None


class _Hold:
    """The bytes of the budget one fetch holds."""

    def __init__(self, budget: ByteBudget | None) -> None:
        self.budget = budget
        self.held = 0

    def cover(self, size: int) -> None:
        """Hold at least ``size`` bytes, taking any difference at once."""
        if self.budget is not None and size > self.held:
            self.held += self.budget.take(size - self.held)

    def keep(self, size: int) -> Callable[[], None]:
        """Give back all but ``size`` bytes now; the returned call gives back the rest."""
        if self.budget is not None and self.held > size:
            self.budget.release(self.held - size)
            self.held = size
        return self.release

    def release(self) -> None:
        if self.budget is not None and self.held:
            self.budget.release(self.held)
        self.held = 0


async def close_session(session: aiohttp.ClientSession) -> None:
    await session.close()
    # Lets the connector's transports close before the loop goes (aiohttp's advice).
    await asyncio.sleep(0)
