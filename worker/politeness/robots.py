"""robots.txt (RFC 9309): asked of each host before its first URL, once for the cluster.

Every URL's host (scheme, host and port: its *origin*) is looked up before the URL takes
its pacing slot. What the host's ``/robots.txt`` said is cached in Redis
(``robots:{origin}``) for ``cache_s``, and in each worker's memory until then, so that
two workers, or a restarted one, do not fetch it again. The first worker to need a host
takes ``robots_lock:{origin}`` and fetches the file; the others (and the other requests
of its own process, which share one in-process load) read the result once it is
written.

A robots.txt fetch is a request to the server: it takes a pacing slot of the host, as
any source whose URL asked for it reaches it, and its answer is reported to the host's
pace and breaker like any other. It follows up to ``ROBOTS_MAX_REDIRECTS`` redirects (the rules
are still those of the original host), the same address checks and timeouts as image
fetches, and reads at most ``ROBOTS_MAX_BYTES`` (the RFC asks for at least 500 KiB): a
longer file is cut at its last whole line. What its answer means (RFC 9309 2.3.1):

- 2xx: the file's rules (decoded as UTF-8, anything undecodable replaced);
- 4xx but 429, or more than ``ROBOTS_MAX_REDIRECTS`` redirects: no rules, everything
  allowed;
- 5xx, 429, a timeout or a network error: unreachable, everything disallowed for now. It
  is asked again after an exponential backoff (``retry_base_s``, doubling to
  ``retry_cap_s``; a 429's or 503's Retry-After if longer, which also pauses the source
  for every worker). Its URLs wait, neither lost nor requested; once the host has been
  unreachable for ``unavailable_max_s`` they end as ``RobotsUnavailable``.

A host whose name does not resolve (the fetch ends as ``DnsError``: worker/download/
dns.py) is not unreachable in that sense: waiting a day for it would only hold its URLs
back. Its entry says so (status ``DnsError``), and is asked again after ``dns_retry_s``
(the resolver's cached failure has expired by then), not kept for a day. Its URLs end as
``DnsError``, without a request, at once when the answer was that the name (or any
address of it) does not exist, and once it has failed to get an answer ``dns_tries``
times in a row (a SERVFAIL, a timeout or a refusal may be the resolver's moment, not the
name's: asked once more a minute later, such a name's URLs end after about a minute).
Every URL of the host shares that verdict: one lookup per ``dns_retry_s`` for
the cluster, not one per URL. Only the host's own name counts: a robots.txt redirected
to a name that does not resolve is unreachable, as for any other network error.

A disallowed URL ends as ``RobotsDisallowed``, never requested. A ``Crawl-delay`` (not in
the RFC, widely used) is the shortest interval between requests to that host only: it
goes into the host's pacing state (``RedisPacer.note_crawl_delay``), which the pacing
script obeys at once (the robots.txt request counted), kept as long as the file is.
A host given up by its breaker before its file could be read ends its URLs as
``HostUnavailable``. Sources in the set ``robots_exempt`` (an operator has the sites'
permission) and every source under ``policy="ignore"`` skip all of this.

The same file's ``Content-Signal`` line (worker.politeness.signals) is read for us: under
``search=no`` a URL ends as ``NoIndex``, never requested, and ``ai-train=no`` and
``ai-input=no`` are opt-outs published with each image. Once a host's robots.txt is
known, its ``/.well-known/tdmrep.json`` (TDMRep) is fetched too where the file allows us
that path (a file we may not read reserves nothing), on a pacing slot of its own, under
the same limits, and cached beside the file in the same entry: a rule covering
a URL's path puts ``tdm-reservation`` in its opt-outs. A tdmrep.json that cannot be
fetched or read reserves nothing: it is an opt-out signal, not a permission.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import enum
import hashlib
import json
import random
import secrets
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from yarl import URL

from image_crawler.contract import (
    ROBOTS_EXEMPT_SET,
    ROBOTS_MAX_BYTES,
    ROBOTS_MAX_REDIRECTS,
    TDMREP_PATH,
    Status,
    robots_key,
    robots_lock_key,
)
from image_crawler.logs import get_logger
from image_crawler.lua import lua_script
from image_crawler.retry import Backoff, backoff_delay
from worker.download.dns import FINAL_KINDS
from worker.download.fetch import FetchResult
from worker.images.pool import Body
from worker.politeness.hosts import HostKey, host_of
from worker.politeness.pacing import Pacer
from worker.politeness.retry_after import obey_retry_after
from worker.politeness.robots_rules import RobotsRules, decided_rules
from worker.politeness.signals import NO_SIGNALS, Signals, TdmRep, compact_tdmrep
from worker.settings import RobotsSettings

log = get_logger(__name__)

# A redirect hop whose host's robots.txt cannot be fetched now: the fetch ends with this
# status and the pipeline waits for that host as it waits for a URL's own (never an
# outcome of a message).
ROBOTS_PENDING: Final = "RobotsPending"


# While Redis is away, a host's load asks again at most this far apart (from every
# ``poll_s`` at first): its URLs wait meanwhile, and Redis is mostly back within seconds.
_REDIS_RETRY_CAP_S: Final = 5.0
# A worker waiting for another's fetch of a host's files looks for the entry at most this
# far apart (from every ``poll_s`` at first).
_POLL_CAP_S: Final = 1.0

_CLAIM_SCRIPT: Final = lua_script("worker.politeness", "robots_claim.lua")
# What lua/robots_claim.lua answers of the lock: left alone (the entry is fresh), held by
# another worker, taken by this call.
_CLAIM_FRESH: Final = 0
_CLAIM_LOCKED: Final = 1
_CLAIM_TAKEN: Final = 2
# A lock outlives the fetch it guards (``fetch_timeout_s``) by this much; it is renewed
# when less than a fetch and half of this is left (``_HeldLock.keep``).
_LOCK_SPARE_S: Final = 10.0


class Robots(enum.Enum):
    """What robots.txt says of one URL now."""

    ALLOWED = "allowed"
    DISALLOWED = "disallowed"
    UNAVAILABLE = "unavailable"


class TextFetcher(Protocol):
    async def fetch_text(self, url: str, max_bytes: int, max_redirects: int) -> FetchResult: ...


@dataclasses.dataclass(frozen=True, slots=True)
class RobotsEntry:
    """What one host's robots.txt fetch found, as cached in ``robots:{origin}``.

    ``text`` is what the file says to us (None: a 4xx, everything allowed, or
    unavailable): for ``token``, the lines that apply to it (``decided_rules``), or,
    without a ``token``, the whole file (an entry of an older version, or a file no longer
    than its decided rules); either is read by ``RobotsRules.parse`` with the same
    answers. ``digest`` is the start of the whole file's SHA-256 (hex), to tell a changed
    file from the same one. Fresh until ``expires_at`` (Unix s): then it is fetched
    again. While the host is unreachable, ``unavailable_since`` is the first failure of
    the outage and ``failures`` counts them; ``expires_at`` is when to ask again.
    ``tdmrep`` is the host's /.well-known/tdmrep.json when it answered 2xx with rules,
    its rules as ``compact_tdmrep`` keeps them (None: it did not, or not asked yet).
    """

    status: str
    text: str | None
    fetched_at: float
    expires_at: float
    unavailable_since: float | None = None
    failures: int = 0
    tdmrep: str | None = None
    digest: str | None = None
    token: str | None = None

    @property
    def available(self) -> bool:
        return self.unavailable_since is None

    def to_json(self) -> str:
        """The entry as Redis keeps it: compact JSON (``ENTRY_FIELDS``), each text
        compressed where that is shorter."""
        obj: dict[str, object] = {
            "v": ENTRY_VERSION,
            "s": self.status,
            "f": round(self.fetched_at, 3),
            "e": round(self.expires_at, 3),
        }
        if self.unavailable_since is not None:
            obj["u"] = round(self.unavailable_since, 3)
        if self.failures:
            obj["n"] = self.failures
        if self.digest is not None:
            obj["d"] = self.digest
        if self.token is not None:
            obj["t"] = self.token
        _put_text(obj, "r", self.text)
        _put_text(obj, "m", self.tdmrep)
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, raw: str | bytes) -> RobotsEntry | None:
        """The entry, or None when ``raw`` is not one (written by hand, or by a newer
        version): it is then fetched again. An entry of the format before
        ``ENTRY_VERSION`` (the whole file in ``text``) is read as it was written."""
        try:
            obj = json.loads(raw)
            if "v" not in obj:
                return cls._from_old(obj)
            if obj["v"] != ENTRY_VERSION:
                return None
            since, digest, token = obj.get("u"), obj.get("d"), obj.get("t")
            return cls(
                status=str(obj["s"]),
                text=_get_text(obj, "r"),
                fetched_at=float(obj["f"]),
                expires_at=float(obj["e"]),
                unavailable_since=None if since is None else float(since),
                failures=int(obj.get("n", 0)),
                tdmrep=_get_text(obj, "m"),
                digest=digest if isinstance(digest, str) else None,
                token=token if isinstance(token, str) else None,
            )
        except (ValueError, TypeError, KeyError, AttributeError, zlib.error):
            return None

    @classmethod
    def _from_old(cls, obj: Any) -> RobotsEntry:
        """An entry as versions before ``ENTRY_VERSION`` wrote it (long names, the whole
        file); raises what ``from_json`` catches when it is not one."""
        text, tdmrep, since = obj["text"], obj.get("tdmrep"), obj.get("unavailable_since")
        return cls(
            status=str(obj["status"]),
            text=text if isinstance(text, str) else None,
            fetched_at=float(obj["fetched_at"]),
            expires_at=float(obj["expires_at"]),
            unavailable_since=None if since is None else float(since),
            failures=int(obj.get("failures", 0)),
            tdmrep=tdmrep if isinstance(tdmrep, str) else None,
        )


# The format of ``RobotsEntry.to_json`` (image_crawler/contract.py, ROBOTS_PREFIX): "v"
# this version, "s" status, "f" fetched_at, "e" expires_at, "u" unavailable_since, "n"
# failures, "d" digest, "t" token, "r" text, "m" tdmrep; a text is stored compressed under
# its name and "z" ("rz", "mz": raw deflate, then base85) where that is shorter.
ENTRY_VERSION: Final = 2
# How many hex digits of the file's SHA-256 an entry keeps: 64 bits.
DIGEST_CHARS: Final = 16


def _put_text(obj: dict[str, object], name: str, text: str | None) -> None:
    if text is None:
        return
    plain = len(json.dumps(text, ensure_ascii=False).encode())
    # Compression only pays beyond a few hundred bytes; shorter texts are not tried.
    if plain > 160:
        packer = zlib.compressobj(9, zlib.DEFLATED, -15)
        packed = base64.b85encode(packer.compress(text.encode()) + packer.flush()).decode()
        if len(packed) + 3 < plain:
            obj[f"{name}z"] = packed
            return
    obj[name] = text


def _get_text(obj: Mapping[str, object], name: str) -> str | None:
    packed = obj.get(f"{name}z")
    if isinstance(packed, str):
        return zlib.decompress(base64.b85decode(packed), -15).decode()
    text = obj.get(name)
    return text if isinstance(text, str) else None


def file_digest(text: str) -> str:
    """The ``digest`` of a robots.txt's text."""
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()[:DIGEST_CHARS]


def origin_of(url: str) -> tuple[str, str] | None:
    """``(origin, robots.txt URL)`` of an http(s) URL with a host, else None (the fetcher
    refuses those URLs itself)."""
    try:
        parsed = URL(url)
        scheme, host, port = parsed.scheme.lower(), parsed.host, parsed.port
    except (ValueError, TypeError):
        return None
    if scheme not in ("http", "https") or not host or port is None:
        return None
    host = host.lower()
    robots_url = str(URL.build(scheme=scheme, host=host, port=port, path="/robots.txt"))
    return f"{scheme}://{host}:{port}", robots_url


def decode_robots(body: Body | None, truncated: bool) -> str:
    """A robots.txt body as text: UTF-8 with a byte-order mark dropped, anything
    undecodable replaced; a body cut at the size cap loses its last, partial, line (a
    cut ``Allow: /public`` would allow more than the file does)."""
    raw = b"" if body is None else body if isinstance(body, bytes) else b"".join(body)
    if truncated:
        raw = raw[: raw.rfind(b"\n") + 1]
    return raw.decode("utf-8", errors="replace").removeprefix("\ufeff")


# A URL the fetcher will not request at all.
_REFUSED: Final = frozenset({Status.BLOCKED, Status.INVALID_URL})
# Files longer than this are parsed outside the event loop.
_PARSE_INLINE_CHARS: Final = 32 * 1024


@dataclasses.dataclass(slots=True)
class _Known:
    """A host's entry as this worker holds it, parsed."""

    entry: RobotsEntry
    rules: RobotsRules | None  # None while unavailable
    tdmrep: TdmRep = dataclasses.field(default_factory=TdmRep)
    # Sources whose Crawl-delay from this entry is already written.
    delays_noted: set[str] = dataclasses.field(default_factory=set)
    # The host was given up (HostUnavailable) before its file could be read.
    gone: bool = False

    def signals(self, url: str) -> Signals:
        """What the host's files say of the use of ``url``, an allowed URL of the host."""
        said = NO_SIGNALS if self.rules is None else self.rules.signals
        if self.tdmrep:
            with contextlib.suppress(ValueError, TypeError):  # not a URL: reserves nothing
                said = said | self.tdmrep.signals(URL(url).raw_path_qs)
        return said


class RobotsGuard:
    """Answers, for each URL, what its host's robots.txt says (``check``), waiting while
    it cannot be known (``verdict``)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        fetcher: TextFetcher,
        pacer: Pacer,
        settings: RobotsSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        pacing_key: str = "host",
    ) -> None:
        self._redis = redis
        self._pacing_key = pacing_key
        self._fetcher = fetcher
        self._pacer = pacer
        self._settings = settings or RobotsSettings()
        self._clock = clock
        self._rng = rng or random.Random()
        self._known: OrderedDict[str, _Known] = OrderedDict()
        self._known_chars = 0  # of the rules in _known (_weight)
        self._loading: dict[str, asyncio.Task[_Known]] = {}
        # Origin -> the sources whose URLs wait for its load.
        self._asking: dict[str, set[str]] = {}
        self._exempt: frozenset[str] = frozenset()
        self._exempt_read_at = -float("inf")
        self._exempt_lock = asyncio.Lock()
        self.fetches = 0  # robots.txt requests this worker made
        self.tdmrep_fetches = 0  # and tdmrep.json requests
        # (source, origin) of Crawl-delays noted as their file was fetched (before its
        # tdmrep.json request), not to be noted again at the first URL's answer.
        self._noted_at_fetch: set[tuple[str, str]] = set()
        self._claim = redis.register_script(_CLAIM_SCRIPT)

    async def verdict(self, source: str, url: str) -> str | None:
        """None when ``url`` may be requested; else the status it ends with
        (``RobotsDisallowed``, ``NoIndex`` under a Content-Signal ``search=no``, or
        ``RobotsUnavailable`` once its host has been unreachable for
        ``unavailable_max_s``, ``DnsError`` once its host's name did not resolve). Waits
        while the host is unreachable."""
        status, _ = await self.consult(source, url)
        return status

    async def consult(self, source: str, url: str) -> tuple[str | None, Signals]:
        """``verdict``'s status, and what the host's files say of the URL's use (its
        ``noindex`` the directives when the status is ``NoIndex``)."""
        while True:
            answer, known = await self._answer(source, url)
            if answer is Robots.ALLOWED:
                if known is None:
                    return None, NO_SIGNALS
                said = known.signals(url)
                return (Status.NO_INDEX if said.noindex else None), said
            if answer is Robots.DISALLOWED:
                return Status.ROBOTS_DISALLOWED, NO_SIGNALS
            assert known is not None
            if known.gone:
                return Status.HOST_UNAVAILABLE, NO_SIGNALS
            entry, now = known.entry, self._clock()
            if entry.status == Status.DNS_ERROR and entry.failures >= self._settings.dns_tries:
                return Status.DNS_ERROR, NO_SIGNALS
            since = now if entry.unavailable_since is None else entry.unavailable_since
            give_up_at = since + self._settings.unavailable_max_s
            if now >= give_up_at:
                return Status.ROBOTS_UNAVAILABLE, NO_SIGNALS
            # Until it is asked again (by whichever worker), or the URL's time is up.
            wait_s = min(entry.expires_at, give_up_at) - now
            await asyncio.sleep(max(wait_s, self._settings.poll_s))

    async def hop_status(self, source: str, hop: URL) -> str | None:
        """For a redirect hop: None when it may be requested, ``RobotsDisallowed``, or
        ``ROBOTS_PENDING`` when its host's robots.txt cannot be fetched now."""
        answer, _ = await self._answer(source, str(hop))
        if answer is Robots.ALLOWED:
            return None
        return Status.ROBOTS_DISALLOWED if answer is Robots.DISALLOWED else ROBOTS_PENDING

    async def check(self, source: str, url: str) -> Robots:
        """What robots.txt says of ``url`` now (fetching it first if nobody has)."""
        answer, _ = await self._answer(source, url)
        return answer

    async def _answer(self, source: str, url: str) -> tuple[Robots, _Known | None]:
        if self._settings.policy == "ignore" or await self._is_exempt(source):
            return Robots.ALLOWED, None
        where = origin_of(url)
        if where is None:
            return Robots.ALLOWED, None  # not a URL the fetcher will request
        origin, robots_url = where
        known = await self._known_for(source, origin, robots_url)
        if known.rules is None:
            return Robots.UNAVAILABLE, known
        if known.rules.crawl_delay_s and source not in known.delays_noted:
            if (source, origin) in self._noted_at_fetch:
                self._noted_at_fetch.discard((source, origin))
                known.delays_noted.add(source)
            else:
                await self._note_crawl_delay(source, origin, known)
        return (Robots.ALLOWED if known.rules.allows(url) else Robots.DISALLOWED), known

    # --- the exempt set ------------------------------------------------------------------
    async def _is_exempt(self, source: str) -> bool:
        if self._clock() - self._exempt_read_at >= self._settings.exempt_refresh_s:
            async with self._exempt_lock:
                if self._clock() - self._exempt_read_at >= self._settings.exempt_refresh_s:
                    await self._read_exempt()
        return source in self._exempt

    async def _read_exempt(self) -> None:
        try:
            members = await self._redis.smembers(ROBOTS_EXEMPT_SET)
        except RedisError as e:
            # The last set read stays in force; Redis is asked again at the next refresh.
            log.warning("redis_unavailable", op="read_robots_exempt", error=repr(e))
        else:
            exempt = frozenset(m.decode() if isinstance(m, bytes) else m for m in members)
            if exempt != self._exempt:
                log.info("robots_exempt_changed", sources=sorted(exempt))
            self._exempt = exempt
        self._exempt_read_at = self._clock()

    # --- this worker's copy ----------------------------------------------------------------
    async def _known_for(self, source: str, origin: str, robots_url: str) -> _Known:
        known = self._known.get(origin)
        if known is not None and self._clock() < known.entry.expires_at:
            self._known.move_to_end(origin)
            return known
        # Every source with a URL waiting for the host offers its pacing slots.
        self._asking.setdefault(origin, set()).add(source)
        task = self._loading.get(origin)
        if task is None:
            task = asyncio.create_task(self._load(origin, robots_url))
            self._loading[origin] = task
            task.add_done_callback(lambda _: self._forget_load(origin))
        # Shielded: one waiter cancelled (its worker stopping) does not cancel the others'.
        known = await asyncio.shield(task)
        self._remember(origin, known)
        return known

    def _remember(self, origin: str, known: _Known) -> None:
        """Keep ``known`` parsed for ``origin``: the hosts used last, at most
        ``local_hosts`` of them and ``local_rules_chars`` characters of their rules (a
        parsed rule costs Protego about 25 bytes a character: a host of long rules must
        not cost a worker what thousands of short ones do)."""
        previous = self._known.pop(origin, None)
        if previous is not None:
            self._known_chars -= _weight(previous)
        self._known[origin] = known
        self._known_chars += _weight(known)
        settings = self._settings
        while len(self._known) > 1 and (
            len(self._known) > settings.local_hosts
            or self._known_chars > settings.local_rules_chars
        ):
            _, dropped = self._known.popitem(last=False)
            self._known_chars -= _weight(dropped)

    def _forget_load(self, origin: str) -> None:
        self._loading.pop(origin, None)
        self._asking.pop(origin, None)

    async def _load(self, origin: str, robots_url: str) -> _Known:
        poll_s = self._settings.poll_s
        retry = Backoff(base_s=poll_s, cap_s=max(poll_s, _REDIS_RETRY_CAP_S), rng=self._rng)
        # Another worker's fetch is looked for every poll_s at first, then less often: it
        # may be waiting for the host's slot (a Crawl-delay, a Retry-After) for a while.
        polls = Backoff(base_s=poll_s, cap_s=max(poll_s, _POLL_CAP_S), rng=self._rng)
        while True:
            try:
                found = await self._shared_entry(origin, robots_url)
            except _HostGone:
                now = self._clock()
                gone = RobotsEntry(Status.HOST_UNAVAILABLE, None, now, now + poll_s, now)
                return _Known(gone, None, gone=True)
            except RedisError as e:
                log.warning("redis_unavailable", op="robots", origin=origin, error=repr(e))
                await asyncio.sleep(retry.next_s())
                continue
            if found is not None:
                entry, rules = found
                long = entry.text is not None and len(entry.text) > _PARSE_INLINE_CHARS
                if rules is None and long:
                    # Parsing a long file takes Protego a while: in a thread, the event
                    # loop (every other request's pacing slot) keeps turning meanwhile.
                    return await asyncio.to_thread(self._parsed, entry)
                return self._parsed(entry, rules)
            await asyncio.sleep(polls.next_s())

    def _parsed(self, entry: RobotsEntry, rules: RobotsRules | None = None) -> _Known:
        """``entry`` parsed (``rules``: its text's, when already parsed)."""
        if not entry.available:
            return _Known(entry, None)
        tdmrep = TdmRep.parse(entry.tdmrep)
        return _Known(entry, rules or self._rules(entry.text), tdmrep)

    def _rules(self, text: str | None) -> RobotsRules:
        """The rules of an available entry's text (None: a 4xx, everything allowed)."""
        token = self._settings.token
        return RobotsRules.allow_all(token) if text is None else RobotsRules.parse(text, token)

    # --- the cluster's copy ----------------------------------------------------------------
    async def _shared_entry(
        self, origin: str, robots_url: str
    ) -> tuple[RobotsEntry, RobotsRules | None] | None:
        """The host's fresh entry: read from Redis, or fetched by this worker if nobody
        is fetching it (then with its rules, parsed); None: another worker is, look
        again soon.

        A new host costs two round trips before its files' requests: the entry read and
        the lock taken in one (``lua/robots_claim.lua``), the entry written and the lock
        released in another. The lock is held from before the robots.txt's slot, so that
        no other worker waits for a slot to fetch what this one will, and renewed only
        when what is left to do could outlive it (``_HeldLock.keep``)."""
        key = robots_key(origin)
        lock = _HeldLock(self._redis, robots_lock_key(origin), self._settings.fetch_timeout_s)
        now = self._clock()
        raw, state = await self._claim(
            keys=[key, lock.key],
            args=[repr(now), self._settings.token, ENTRY_VERSION, lock.value, lock.life_ms],
        )
        entry = _entry_of(raw, self._settings.token)
        if is_fresh(entry, now):
            assert entry is not None
            if state == _CLAIM_TAKEN:  # not fresh to the script: given back
                with contextlib.suppress(RedisError):  # or expires in a fetch's time
                    await lock.release()
            return entry, None
        if state == _CLAIM_LOCKED:
            return None
        if state == _CLAIM_TAKEN:
            lock.taken()
        # Fresh to the script, which reads no further than the JSON, but not readable
        # here (a damaged text): fetched again like any stale entry.
        elif not await lock.take():
            return None
        released = False
        try:
            # A robots.txt request is a request to the server: it waits for a slot.
            host_key = await self._slot(origin, lock)
            entry = await self._fetch(host_key, origin, robots_url, entry)
            rules = await self._rules_of(entry)
            if rules is not None and await self._may_read_tdmrep(entry, rules, origin, host_key):
                entry = await self._with_tdmrep(entry, origin, lock)
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.set(key, entry.to_json(), px=self._keep_ms(entry))
                pipe.delete(lock.key)  # with the entry it guarded
                await pipe.execute()
            released = True
        finally:
            if not released:
                with contextlib.suppress(RedisError):
                    await lock.release()
        return entry, rules

    def _key(self, source: str, origin: str) -> HostKey:
        return HostKey(source, host_of(origin, self._pacing_key))

    async def _slot(self, origin: str, lock: _HeldLock) -> HostKey:
        """A pacing slot of the host as any source with a URL waiting for ``origin``
        reaches it (one without a rate, halted or unknown, must not hold the others
        back); returns that source's key, ``lock`` kept for one fetch more. Raises
        ``_HostGone`` when the host was given up."""
        while True:
            await lock.keep()  # however long the slot takes to come
            sources = sorted(self._asking.get(origin, ()))
            if not sources:  # closing
                await asyncio.sleep(self._settings.slot_recheck_s)
                continue
            asks: dict[asyncio.Future[str | None], HostKey] = {}
            for source in sources:
                key = self._key(source, origin)
                asks[asyncio.ensure_future(self._pacer.acquire(key))] = key
            done, pending = await _first_of(asks, self._settings.slot_recheck_s)
            for future in pending:
                future.cancel()  # gives the slot to the host's next request
            if done:
                future = next(iter(done))
                if future.result() is not None:
                    raise _HostGone(origin)
                await lock.keep()
                return asks[future]

    def _keep_ms(self, entry: RobotsEntry) -> int:
        """How long Redis keeps an entry: while fresh, and while unavailable as long as
        the outage may still end its URLs (its start must be remembered)."""
        until = entry.expires_at
        # A name that did not resolve is no outage to remember for a day: its tries are
        # counted only while it is asked again.
        if entry.unavailable_since is not None and entry.status != Status.DNS_ERROR:
            until = max(until, entry.unavailable_since + self._settings.unavailable_max_s)
        return max(1000, int((until - self._clock()) * 1000) + 60_000)

    async def _fetch(
        self, key: HostKey, origin: str, robots_url: str, previous: RobotsEntry | None
    ) -> RobotsEntry:
        self.fetches += 1
        settings = self._settings
        started = time.monotonic()
        result = await self._get(robots_url)
        now, status = self._clock(), result.status
        if status == Status.DNS_ERROR and not result.redirects:
            # No request reached the host: nothing to tell its pace.
            return self._unresolved(origin, result, previous, now)
        self._pacer.report(key, status)
        took_s = round(time.monotonic() - started, 3)
        if status.isdigit() and 200 <= int(status) < 300:
            text = decode_robots(result.body, truncated=bool(result.detail))
            if result.detail:
                log.warning("robots_truncated", origin=origin, detail=result.detail)
            entry = await self._decided(status, text, now)
            log.info(
                "robots_fetched",
                origin=origin,
                status=status,
                bytes=len(text),
                kept=len(entry.text or ""),
                digest=entry.digest,
                changed=previous is not None and previous.digest not in (None, entry.digest),
                took_s=took_s,
            )
            return entry
        if (
            (status.isdigit() and 400 <= int(status) < 500 and status != Status.TOO_MANY_REQUESTS)
            or status == Status.TOO_MANY_REDIRECTS  # RFC 9309 2.3.1.2: as if there were no file
            # The host itself is one the fetcher refuses: its URLs end as Blocked, without
            # a request, rather than wait for a file that will never be asked for.
            or (status in _REFUSED and not result.redirects)
        ):
            log.info("robots_fetched", origin=origin, status=status, allows="everything")
            return RobotsEntry(status, None, now, now + settings.cache_s)
        return await self._unavailable(key, origin, result, previous, now)

    async def _decided(self, status: str, text: str, now: float) -> RobotsEntry:
        """The entry of a file: what of it applies to our token, where that is shorter than
        the file (a long file is read outside the event loop, as in ``_load``)."""
        token = self._settings.token
        if len(text) > _PARSE_INLINE_CHARS:
            decided = await asyncio.to_thread(decided_rules, text, token)
        else:
            decided = decided_rules(text, token)
        kept, by = (decided, token) if len(decided) < len(text) else (text, None)
        expires_at = now + self._settings.cache_s
        return RobotsEntry(status, kept, now, expires_at, digest=file_digest(text), token=by)

    async def _get(self, url: str) -> FetchResult:
        """A host's file (robots.txt, tdmrep.json), within the files' limits of size,
        redirects and time."""
        timeout_s = self._settings.fetch_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                return await self._fetcher.fetch_text(url, ROBOTS_MAX_BYTES, ROBOTS_MAX_REDIRECTS)
        except TimeoutError:
            return FetchResult(Status.TIMEOUT, detail=f"over {timeout_s:g} s")

    async def _with_tdmrep(self, entry: RobotsEntry, origin: str, lock: _HeldLock) -> RobotsEntry:
        """The entry with the host's /.well-known/tdmrep.json, fetched on a pacing slot of
        its own."""
        try:
            key = await self._slot(origin, lock)
        except _HostGone:
            return entry  # no slot will come: nothing reserved known
        self.tdmrep_fetches += 1
        result = await self._get(str(URL(origin).with_path(TDMREP_PATH)))
        self._pacer.report(key, result.status)
        if not (result.status.isdigit() and 200 <= int(result.status) < 300):
            log.debug("tdmrep_fetched", origin=origin, status=result.status, rules=0)
            return entry
        text = decode_robots(result.body, truncated=False)
        rules = len(TdmRep.parse(text))
        log.info("tdmrep_fetched", origin=origin, status=result.status, rules=rules)
        return dataclasses.replace(entry, tdmrep=compact_tdmrep(text) if rules else None)

    async def _rules_of(self, entry: RobotsEntry) -> RobotsRules | None:
        """The rules of a fetched entry (None while unavailable); a long file is parsed
        outside the event loop, as in ``_load``."""
        if not entry.available:
            return None
        if entry.text is not None and len(entry.text) > _PARSE_INLINE_CHARS:
            return await asyncio.to_thread(self._rules, entry.text)
        return self._rules(entry.text)

    async def _may_read_tdmrep(
        self, entry: RobotsEntry, rules: RobotsRules, origin: str, key: HostKey
    ) -> bool:
        """Whether the host's robots.txt allows us its tdmrep.json (RFC 9309 governs
        every request we make, our own look-ups included). Its Crawl-delay is noted
        first, for ``key``: the tdmrep.json request keeps it too."""
        if rules.crawl_delay_s and await self._note_delay(key, origin, rules, entry.expires_at):
            self._noted_at_fetch.add((key.source, origin))
        return rules.allows(str(URL(origin).with_path(TDMREP_PATH)))

    async def _unavailable(
        self,
        key: HostKey,
        origin: str,
        result: FetchResult,
        previous: RobotsEntry | None,
        now: float,
    ) -> RobotsEntry:
        ongoing = previous is not None and previous.unavailable_since is not None
        since = previous.unavailable_since if ongoing and previous else now
        failures = previous.failures + 1 if ongoing and previous else 1
        settings = self._settings
        wait_s = backoff_delay(
            failures, base_s=settings.retry_base_s, cap_s=settings.retry_cap_s, rng=self._rng
        )
        asked_s = await obey_retry_after(
            self._pacer,
            key,
            result.status,
            result.retry_after,
            now_unix_s=now,
            max_s=settings.max_retry_after_s,
            # Every source waiting for the host: the server asked it of all of them.
            also=[self._key(s, origin) for s in sorted(self._asking.get(origin, ()))],
        )
        if asked_s:
            wait_s = max(wait_s, asked_s)
        assert since is not None
        log.warning(
            "robots_unavailable",
            origin=origin,
            source=key.source,
            status=result.status,
            detail=result.detail[:200],
            failures=failures,
            retry_in_s=round(wait_s, 1),
            unavailable_s=round(now - since, 1),
        )
        return RobotsEntry(result.status, None, now, now + wait_s, since, failures)

    def _unresolved(
        self, origin: str, result: FetchResult, previous: RobotsEntry | None, now: float
    ) -> RobotsEntry:
        """The entry of a host whose name did not resolve, its tries counted on from the
        previous entry's; an answer that the name does not exist counts as every try."""
        settings = self._settings
        since, tries = now, 1
        if previous is not None and previous.status == Status.DNS_ERROR:
            since = now if previous.unavailable_since is None else previous.unavailable_since
            tries = previous.failures + 1
        if result.dns_failure in FINAL_KINDS:
            tries = max(tries, settings.dns_tries)
        log.warning(
            "robots_unresolved",
            origin=origin,
            kind=result.dns_failure,
            detail=result.detail[:200],
            tries=tries,
            ends_urls=tries >= settings.dns_tries,
            retry_in_s=settings.dns_retry_s,
        )
        return RobotsEntry(Status.DNS_ERROR, None, now, now + settings.dns_retry_s, since, tries)

    # --- Crawl-delay ---------------------------------------------------------------------
    async def _note_crawl_delay(self, source: str, origin: str, known: _Known) -> None:
        assert known.rules is not None
        key = self._key(source, origin)
        if await self._note_delay(key, origin, known.rules, known.entry.expires_at):
            known.delays_noted.add(source)

    async def _note_delay(
        self, key: HostKey, origin: str, rules: RobotsRules, expires_at: float
    ) -> bool:
        """Note the file's Crawl-delay (capped) for ``key``; False when Redis is away."""
        assert rules.crawl_delay_s is not None
        asked_s = rules.crawl_delay_s
        delay_s = min(asked_s, self._settings.max_crawl_delay_s)
        if delay_s < asked_s:
            log.warning(
                "crawl_delay_capped",
                source=key.source,
                origin=origin,
                crawl_delay_s=asked_s,
                cap_s=delay_s,
            )
        # A minute beyond the file's expiry: the file is fetched again by then, and the
        # delay noted again, so the delay never lapses in between.
        keep_s = max(1.0, expires_at - self._clock() + 60)
        try:
            await self._pacer.note_crawl_delay(key, delay_s, keep_s)
        except RedisError as e:
            log.warning(
                "redis_unavailable", op="note_crawl_delay", source=key.source, error=repr(e)
            )
            return False  # noted at a later URL
        log.info("crawl_delay", source=key.source, origin=origin, crawl_delay_s=delay_s)
        return True

    def close(self) -> None:
        self._asking.clear()
        for task in self._loading.values():
            task.cancel()
        self._loading.clear()


def _weight(known: _Known) -> int:
    """What a host parsed in memory counts against ``local_rules_chars``: its rules'
    characters, and a hundred for what any parsed host costs (about 2.5 KiB)."""
    return len(known.entry.text or "") + 100


def _entry_of(raw: str | bytes | None, token: str) -> RobotsEntry | None:
    """The entry in ``raw``; None without one, or when its rules were decided for a product
    token other than ``token`` (ROBOTS_USER_AGENT changed): it is fetched again."""
    entry = None if raw is None else RobotsEntry.from_json(raw)
    if entry is None or entry.token not in (None, token):
        return None
    return entry


def is_fresh(entry: RobotsEntry | None, now: float) -> bool:
    """Whether ``entry`` (``_entry_of``'s) holds at ``now`` (Unix s); else it is fetched."""
    return entry is not None and now < entry.expires_at


class _HeldLock:
    """``robots_lock:{origin}`` as the worker fetching that host's files holds it: for
    ``fetch_s`` and ``_LOCK_SPARE_S`` from its taking, should the worker die meanwhile;
    ``keep`` renews it only when less than a fetch is left, so that a host whose slots
    come at once pays no round trip for it."""

    def __init__(self, redis: aioredis.Redis, key: str, fetch_s: float) -> None:
        self.key = key
        self.value = secrets.token_hex(8)
        self._redis = redis
        self._fetch_s = fetch_s
        self.life_ms = int((fetch_s + _LOCK_SPARE_S) * 1000)
        self._until = -float("inf")  # time.monotonic()

    def taken(self) -> None:
        self._until = time.monotonic() + self.life_ms / 1000

    async def take(self) -> bool:
        """Takes the lock if nobody holds it."""
        if await self._redis.set(self.key, self.value, nx=True, px=self.life_ms):
            self.taken()
            return True
        return False

    async def keep(self) -> None:
        """Makes sure the lock lives through one fetch more."""
        if self._until - time.monotonic() < self._fetch_s + _LOCK_SPARE_S / 2:
            await self._redis.pexpire(self.key, self.life_ms)
            self.taken()

    async def release(self) -> None:
        await self._redis.delete(self.key)


class _HostGone(Exception):
    """The host was given up by its breaker: no slot will come for its files."""


async def _first_of(
    futures: Mapping[asyncio.Future[str | None], HostKey], timeout_s: float
) -> tuple[set[asyncio.Future[str | None]], set[asyncio.Future[str | None]]]:
    """Waits for the first of ``futures`` (cancelled with the caller: ``asyncio.wait``
    leaves them running)."""
    try:
        return await asyncio.wait(futures, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        for future in futures:
            future.cancel()
        raise
