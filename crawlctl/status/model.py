"""The crawl's state: what ``read_status`` reads from Redis, ``parse_status`` decodes
(pure), and the figures both views derive from it: the ETA, the totals and the order of
the sources. The sources listed are the union of ``inbound_sources``, the monitor's
``crawl_rates``, ``halted``, ``temp_halted`` and ``robots_exempt`` (so that an exempt
name no source has shows, as a typo should).

A source's pacing comes from three keys: the monitor's record in ``crawl_rates`` (the
effective and configured rate, and why), the rate workers are paced at this second
(``pace_rate:``, which expires when no monitor renews it) and the earliest time the next
request may start (``pace_next:``, pushed into the future by a server's Retry-After).
Its robots.txt: how many URLs it disallowed (``resize_errors:{source}:RobotsDisallowed``),
how many images its servers asked us not to index (``resize_errors:{source}:NoIndex``),
the Crawl-delay that caps the source's rate (``crawl_delay:``) and whether an operator
exempted the source (``robots_exempt``). Its backlog, the URLs split but not yet taken by
the workers, as the monitor last measured it (the hash ``backlog``, with the time of the
measurement in ``backlog_measured_at``), and from it the ETA at the effective rate; its
errors by reason (``resize_errors:{source}:{status}``, named by their index, or found
with SCAN until it is whole: image_crawler/error_reasons.py), its re-checks of
earlier crawls by status (the hash ``rechecks``, field ``{source}:{status}``) and the URLs
found deleted unread (``urls_lost:``). Its hosts: how many were asked about in the last
minute, and of them how many are paced below its rate, backed off and halted, counted
from its host index (``host_index:``, ``image_crawler.host_index``) in a second call.
The workers' DNS figures (``dns_workers``, ``image_crawler.dns_stats``), each worker's and
their sum, are read in the first call: a few fields a worker, nothing per host. So are
the deduplication stage's placements by kind (the hash ``dedup_placements``, field
``{source}:{kind}``), whose ``exact`` and ``near`` are the source's duplicates.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import redis.asyncio as aioredis

from image_crawler.contract import (
    BACKLOG_AT,
    BACKLOG_HASH,
    CRAWL_DELAY_PREFIX,
    CRAWL_PAUSED_KEY,
    DNS_WORKERS_HASH,
    DUPLICATE_KINDS,
    HALTED_SET,
    INBOUND_SOURCES_SET,
    LAST_50_PREFIX,
    NUM_MALFORMED,
    NUM_RESIZED,
    NUM_SPLIT,
    OVERRIDE_RATE_ALIAS_PREFIX,
    OVERRIDE_RATE_PREFIX,
    PACE_HALTED,
    PACE_NEXT_PREFIX,
    PACE_RATE_PREFIX,
    PLACEMENTS_HASH,
    RATES_HASH,
    RECHECK_STATUSES,
    RECHECKS_HASH,
    RESIZE_ERRORS,
    ROBOTS_EXEMPT_SET,
    TEMP_HALTED_SET,
    URLS_LOST,
    CrawlPause,
    MalformedMessage,
    PacingInfo,
    Status,
    eta_s,
    source_and_check,
    source_and_kind,
)
from image_crawler.dns_stats import DnsFigures, DnsReport, crawl_dns, parse_reports
from image_crawler.error_reasons import reason_keys
from image_crawler.host_index import HostCounts, read_host_counts
from image_crawler.lua import lua_script

_SCRIPT: Final = lua_script("crawlctl.status", "status.lua")
_ARGV: Final = (
    INBOUND_SOURCES_SET,
    HALTED_SET,
    TEMP_HALTED_SET,
    RATES_HASH,
    PACE_RATE_PREFIX,
    NUM_RESIZED,
    RESIZE_ERRORS,
    LAST_50_PREFIX,
    OVERRIDE_RATE_PREFIX,
    OVERRIDE_RATE_ALIAS_PREFIX,
    NUM_SPLIT,
    NUM_MALFORMED,
    PACE_NEXT_PREFIX,
    ROBOTS_EXEMPT_SET,
    CRAWL_DELAY_PREFIX,
    Status.ROBOTS_DISALLOWED,
    BACKLOG_HASH,
    BACKLOG_AT,
    URLS_LOST,
    Status.NO_INDEX,
    RECHECKS_HASH,
    CRAWL_PAUSED_KEY,
    DNS_WORKERS_HASH,
    PLACEMENTS_HASH,
)
# Every per-status error counter, resize_errors:{source}:{status}; source names and
# statuses hold no ':'.
_REASON_PREFIX: Final = f"{RESIZE_ERRORS}:"

# The monitor rewrites the backlog every LOG_FREQUENCY_S; a figure older than this is from
# a monitor that stopped measuring (or is not running), and the view says so.
BACKLOG_STALE_S: Final = 60.0


@dataclasses.dataclass(frozen=True, slots=True)
class SourceStatus:
    name: str
    # The monitor's effective rate (requests/s), None when it has published none.
    rate_rps: float | None
    # The monitor's whole record; None when ``crawl_rates`` holds no valid PacingInfo for
    # the source (none yet, or an older monitor's plain number: then only ``rate_rps``).
    pacing: PacingInfo | None
    # ``pace_rate:``, the rate workers are paced at this second; None when the key is
    # absent (no monitor renews it, or an unknown source): then workers get no request.
    pace_rate_rps: float | None
    # ``pace_next:`` minus Redis's clock: the next request may start this many seconds
    # from now (negative: it may start now). None when the key is absent.
    next_slot_in_s: float | None
    successes: int
    errors: int
    # Histogram of the last 50 statuses, most frequent first.
    last_statuses: Mapping[str, int]
    halted: bool
    temp_halted: bool
    # The operator's override as written (``override_rate:``, else ``override-rate:``).
    override: str | None
    # URLs its robots.txt disallowed, ever (``resize_errors:{source}:RobotsDisallowed``).
    robots_disallowed: int = 0
    # Images its servers asked us not to index, ever (``resize_errors:{source}:NoIndex``):
    # X-Robots-Tag noindex and the like, robots.txt Content-Signal search=no.
    no_index: int = 0
    # In ``robots_exempt``: its workers do not obey robots.txt.
    robots_exempt: bool = False
    # ``crawl_delay:``, seconds; None when absent or not a positive finite number.
    crawl_delay_s: float | None = None
    # URLs waiting in urls.{source} as last measured (``backlog``); None when not measured.
    backlog: int | None = None
    # ``resize_errors:{source}:{status}`` by status, most frequent first.
    errors_by_reason: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # ``urls_lost:``: URLs deleted from urls.{source} before a worker read them.
    urls_lost: int = 0
    # ``rechecks``'s ``{source}:{status}`` counts, the statuses it has had, in
    # RECHECK_STATUSES order.
    rechecks: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # Its hosts by state, from its host index; None when it has none.
    hosts: HostCounts | None = None
    # The deduplication stage's placements by kind (``dedup_placements``'s
    # ``{source}:{kind}``), the kinds it has had, in DUPLICATE_KINDS order.
    placements: Mapping[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class CrawlStatus:
    sources: tuple[SourceStatus, ...]
    num_resized: int
    resize_errors: int
    num_split: int
    num_malformed: int
    # Seconds since the monitor measured the backlog (Redis's clock); None: never measured.
    backlog_age_s: float | None = None
    # Every ``resize_errors:{source}:{status}`` summed by status, most frequent first.
    errors_by_reason: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # Every source's re-checks (``rechecks``) summed by status, in RECHECK_STATUSES order.
    rechecks: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # The whole crawl is paused (``crawl_paused``: a full disk, an operator); None: not.
    paused: CrawlPause | None = None
    # Each worker's DNS figures as it last reported them (``dns_workers``), by name.
    dns_reports: tuple[DnsReport, ...] = ()
    # Every source's placements (``dedup_placements``) summed by kind, in
    # DUPLICATE_KINDS order; those of sources in no set too.
    placements: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # Redis's clock at the read (Unix s), by which the reports' ages are told; None:
    # unreadable. The moment of a read, not part of the state: left out of ``==``.
    now_s: float | None = dataclasses.field(default=None, compare=False)

    @property
    def dns(self) -> DnsFigures | None:
        """The DNS figures of the workers reporting now, summed; None when none is."""
        return None if self.now_s is None else crawl_dns(self.dns_reports, self.now_s)

    @property
    def dns_errors(self) -> int:
        """URLs ended as ``DnsError`` (``resize_errors:{source}:DnsError``, summed)."""
        return self.errors_by_reason.get(Status.DNS_ERROR, 0)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):  # cjson's false: the key is absent
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _strings(value: Any) -> list[str]:
    # cjson encodes an empty Lua table as {}, not [].
    return [str(v) for v in value] if isinstance(value, list) else []


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _pacing(value: Any) -> PacingInfo | None:
    if not isinstance(value, str):
        return None
    try:
        return PacingInfo.from_json(value)
    except MalformedMessage:
        return None


# Redis's TIME reply, [seconds, microseconds], in Unix seconds.
def _redis_time(value: Any) -> float | None:
    parts = _strings(value)
    seconds = _int(parts[0]) if len(parts) == 2 else None
    microseconds = _int(parts[1]) if len(parts) == 2 else None
    if seconds is None or microseconds is None:
        return None
    return seconds + microseconds / 1e6


def _positive(value: Any) -> float | None:
    number = _float(value)
    return number if number is not None and math.isfinite(number) and number > 0 else None


def _count(value: Any) -> int | None:
    number = _int(value)
    return number if number is not None and number >= 0 else None


def _by_count(counts: Mapping[str, int]) -> dict[str, int]:
    # Most frequent first; ties by name, so that the order does not change between reads.
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def reasons_by_source(counts: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """``{"resize_errors:flickr:503": "2", ...}`` -> ``{"flickr": {"503": 2}}``, each
    source's reasons most frequent first. Keys that are not such a counter, and counts
    that are not a non-negative integer, are left out."""
    found: dict[str, dict[str, int]] = {}
    for key, value in counts.items():
        source, sep, status = key.removeprefix(_REASON_PREFIX).partition(":")
        count = _count(value)
        if key.startswith(_REASON_PREFIX) and sep and source and status and count:
            found.setdefault(source, {})[status] = count
    return {source: _by_count(reasons) for source, reasons in found.items()}


def _in_check_order(counts: Mapping[str, int]) -> dict[str, int]:
    return {status: counts[status] for status in RECHECK_STATUSES if counts.get(status)}


def rechecks_by_source(fields: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """The hash ``rechecks``'s ``{"flickr:gone": "2", ...}`` -> ``{"flickr": {"gone": 2}}``,
    each source's statuses in the order of RECHECK_STATUSES. Fields that are not a
    source and one of those statuses, and counts that are not a positive integer, are
    left out."""
    found: dict[str, dict[str, int]] = {}
    for field, value in fields.items():
        source, status = source_and_check(field)
        count = _count(value)
        if source and status in RECHECK_STATUSES and count:
            found.setdefault(source, {})[status] = count
    return {source: _in_check_order(statuses) for source, statuses in found.items()}


def _in_kind_order(counts: Mapping[str, int]) -> dict[str, int]:
    return {kind: counts[kind] for kind in DUPLICATE_KINDS if counts.get(kind)}


def placements_by_source(fields: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """The hash ``dedup_placements``'s ``{"flickr:near": "2", ...}`` -> ``{"flickr":
    {"near": 2}}``, each source's kinds in the order of DUPLICATE_KINDS. Fields that are
    not one of those kinds, and counts that are not a positive integer, are left out; a
    source an older worker did not name is ``""``."""
    found: dict[str, dict[str, int]] = {}
    for field, value in fields.items():
        source, kind = source_and_kind(field)
        count = _count(value)
        if kind in DUPLICATE_KINDS and count:
            found.setdefault(source, {})[kind] = count
    return {source: _in_kind_order(kinds) for source, kinds in found.items()}


@dataclasses.dataclass(frozen=True, slots=True)
class Duplicates:
    """Of the images placed, the duplicates (exact and near) and their share (None:
    none placed)."""

    exact: int
    near: int
    placed: int

    @property
    def count(self) -> int:
        return self.exact + self.near

    @property
    def share(self) -> float | None:
        return self.count / self.placed if self.placed else None


def duplicates(placements: Mapping[str, int]) -> Duplicates:
    """``placements`` (kind -> count) as duplicates of all placed."""
    return Duplicates(
        placements.get("exact", 0), placements.get("near", 0), sum(placements.values())
    )


def _pairs(flat: Any) -> dict[str, Any]:
    # HGETALL's [field, value, field, value, ...] as a dict.
    items = _strings(flat)
    return dict(zip(items[::2], items[1::2], strict=False))


def _source(
    name: str,
    raw: Mapping[str, Any],
    now: float | None,
    *,
    halted: bool,
    temp_halted: bool,
    robots_exempt: bool,
    reasons: Mapping[str, int],
    rechecks: Mapping[str, int],
    placements: Mapping[str, int],
) -> SourceStatus:
    pacing = _pacing(raw.get("rate"))
    pace_next = _float(raw.get("pace_next"))
    return SourceStatus(
        name=name,
        # An older monitor's plain number is still the rate, with no reason given.
        rate_rps=pacing.rate_rps if pacing is not None else _float(raw.get("rate")),
        pacing=pacing,
        pace_rate_rps=_float(raw.get("pace_rate")),
        next_slot_in_s=None if pace_next is None or now is None else pace_next - now,
        successes=_int(raw.get("ok")) or 0,
        errors=_int(raw.get("errors")) or 0,
        last_statuses=dict(Counter(_strings(raw.get("last"))).most_common()),
        halted=halted,
        temp_halted=temp_halted,
        override=_text(raw.get("override")) or _text(raw.get("alias")),
        robots_disallowed=_int(raw.get("disallowed")) or 0,
        no_index=_int(raw.get("no_index")) or 0,
        robots_exempt=robots_exempt,
        # The monitor ignores a value that is no delay; so does the view.
        crawl_delay_s=_positive(raw.get("crawl_delay")),
        backlog=_count(raw.get("backlog")),
        errors_by_reason=reasons,
        urls_lost=_count(raw.get("lost")) or 0,
        rechecks=rechecks,
        placements=placements,
    )


def parse_status(payload: str | bytes, reason_keys: Sequence[str] = ()) -> CrawlStatus:
    """The script's JSON answer as a ``CrawlStatus``, sources sorted by name;
    ``reason_keys`` are the keys the script was given, whose counts it answers in order."""
    data = json.loads(payload)
    halted = set(_strings(data.get("halted")))
    temp_halted = set(_strings(data.get("temp_halted")))
    exempt = set(_strings(data.get("robots_exempt")))
    now = _redis_time(data.get("now"))
    counts = data.get("reasons")
    # cjson's holes and empty tables: a count is only where the list has one.
    listed = counts if isinstance(counts, list) else []
    reasons = reasons_by_source(dict(zip(reason_keys, listed, strict=False)))
    rechecks = rechecks_by_source(_pairs(data.get("rechecks")))
    placements = placements_by_source(_pairs(data.get("placements")))
    raw_sources = data.get("sources")
    sources = tuple(
        _source(
            name,
            raw,
            now,
            halted=name in halted,
            temp_halted=name in temp_halted,
            robots_exempt=name in exempt,
            reasons=reasons.get(name, {}),
            rechecks=rechecks.get(name, {}),
            placements=placements.get(name, {}),
        )
        for name, raw in sorted((raw_sources if isinstance(raw_sources, dict) else {}).items())
        if isinstance(raw, dict)
    )
    totals = data.get("totals") or {}
    measured_at = _float(data.get("backlog_at"))
    return CrawlStatus(
        sources=sources,
        num_resized=_int(totals.get("num_resized")) or 0,
        resize_errors=_int(totals.get("resize_errors")) or 0,
        num_split=_int(totals.get("num_split")) or 0,
        num_malformed=_int(totals.get("num_malformed")) or 0,
        backlog_age_s=None if measured_at is None or now is None else now - measured_at,
        errors_by_reason=_by_count(_summed(reasons)),
        rechecks=_in_check_order(_summed(rechecks)),
        placements=_in_kind_order(_summed(placements)),
        paused=_pause(data.get("paused")),
        dns_reports=parse_reports(_pairs(data.get("dns"))),
        now_s=now,
    )


def _summed(by_source: Mapping[str, Mapping[str, int]]) -> Counter[str]:
    total: Counter[str] = Counter()
    for counts in by_source.values():
        total.update(counts)
    return total


def _pause(value: Any) -> CrawlPause | None:
    return CrawlPause.from_json(value) if isinstance(value, str) else None


async def read_status(redis: aioredis.Redis) -> CrawlStatus:
    """Everything ``status_table`` shows: the error counters' keys (from their index, or
    found with SCAN while it is not whole: ``reason_keys``), then every value read in one
    round trip (one script, one moment of Redis's clock), the re-checks' hash and the
    workers' DNS figures included; then the sources' host counts (one more script)."""
    keys = await reason_keys(redis)
    payload = await redis.eval(_SCRIPT, len(keys), *keys, *_ARGV)
    status = parse_status(payload, keys)
    return with_hosts(status, await read_host_counts(redis, [s.name for s in status.sources]))


def with_hosts(status: CrawlStatus, hosts: Mapping[str, HostCounts]) -> CrawlStatus:
    """``status`` with each source's host counts (``hosts``, by source)."""
    if not hosts:
        return status
    sources = tuple(dataclasses.replace(s, hosts=hosts.get(s.name)) for s in status.sources)
    return dataclasses.replace(status, sources=sources)


def host_totals(sources: Iterable[SourceStatus]) -> HostCounts | None:
    """The host counts of ``sources`` summed; None when none has a host index."""
    counted = [source.hosts for source in sources if source.hosts is not None]
    return sum(counted[1:], counted[0]) if counted else None


def override_rps(source: SourceStatus) -> float | None:
    """The operator's override (``override``, as written) as a number; None when there is
    none, or it is no number."""
    return _float(source.override)


# --- backlog and ETA -------------------------------------------------------------------

ETA_EMPTY: Final = "empty"  # no backlog: 0 s
ETA_DRAINING: Final = "draining"  # backlog / effective rate
ETA_HALTED: Final = "halted"  # a backlog, and halted (rate 0): never, until resumed
ETA_STOPPED: Final = "stopped"  # a backlog at a rate of 0 without a halt (an override of 0)
ETA_UNKNOWN: Final = "unknown"  # no backlog measured, or no rate published


@dataclasses.dataclass(frozen=True, slots=True)
class Eta:
    """When a backlog drains at a rate: ``seconds`` (0 when empty, None when it never
    does or is unknown) and which case it is (``state``, one of the ``ETA_`` names)."""

    seconds: float | None
    state: str


def eta(backlog: int | None, rate_rps: float | None, *, halted: bool = False) -> Eta:
    """``backlog`` URLs at ``rate_rps`` requests/s: the sources crawl in parallel, each at
    its own rate, so a source's ETA is its backlog over its effective rate."""
    if backlog is None:
        return Eta(None, ETA_UNKNOWN)
    if backlog <= 0:
        return Eta(0.0, ETA_EMPTY)
    if rate_rps is None or not math.isfinite(rate_rps) or rate_rps < 0:
        return Eta(None, ETA_UNKNOWN)
    if rate_rps == 0:
        return Eta(None, ETA_HALTED if halted else ETA_STOPPED)
    return Eta(eta_s(backlog, rate_rps), ETA_DRAINING)


def source_eta(source: SourceStatus) -> Eta:
    halted = source.halted or source.temp_halted
    if source.pacing is not None and source.pacing.state == PACE_HALTED:
        halted = True
    # A halted source gets no request, whatever rate was last published for it.
    return eta(source.backlog, 0.0 if halted else source.rate_rps, halted=halted)


@dataclasses.dataclass(frozen=True, slots=True)
class Totals:
    """The crawl's backlog and ETA over its sources."""

    backlog: int | None  # None: no source's backlog measured
    # The longest ETA of the sources that drain: the crawl ends with it. The sources at a
    # rate of 0 wait outside it (they need an operator; their own ETA says so). 0 when
    # nothing drains and none is stalled; None when not measured or when only stalled
    # sources have a backlog (never).
    eta_s: float | None
    eta_source: str | None  # whose ETA it is
    stalled_sources: int  # sources with a backlog at a rate of 0 (halted or stopped)
    stalled_backlog: int
    unknown_sources: int  # sources with a backlog and no rate published
    effective_rps: float  # sum of the effective rates
    configured_rps: float  # sum of the configured rates (the effective where none)
    urls_lost: int


def totals(sources: Iterable[SourceStatus]) -> Totals:
    backlog: int | None = None
    eta_s: float | None = None
    eta_source: str | None = None
    stalled = stalled_backlog = unknown = lost = 0
    effective = configured = 0.0
    for source in sources:
        lost += source.urls_lost
        if source.rate_rps is not None:
            effective += source.rate_rps
            configured += (
                source.pacing.configured_rps if source.pacing is not None else source.rate_rps
            )
        if source.backlog is None:
            continue
        backlog = (backlog or 0) + source.backlog
        each = source_eta(source)
        if each.state in (ETA_HALTED, ETA_STOPPED):
            stalled += 1
            stalled_backlog += source.backlog
        elif each.state == ETA_UNKNOWN:
            unknown += 1
        elif each.seconds and (eta_s is None or each.seconds > eta_s):
            eta_s, eta_source = each.seconds, source.name
    if eta_s is None and backlog is not None and not stalled:
        eta_s = 0.0  # nothing waits for a rate (a backlog with no rate is no known source)
    return Totals(
        backlog=backlog,
        eta_s=eta_s,
        eta_source=eta_source,
        stalled_sources=stalled,
        stalled_backlog=stalled_backlog,
        unknown_sources=unknown,
        effective_rps=effective,
        configured_rps=configured,
        urls_lost=lost,
    )


# --- which rows: --sort and --top ------------------------------------------------------

SORT_KEYS: Final = ("backlog", "eta", "rate", "errors", "successes", "hosts", "name")
DEFAULT_SORT: Final = "backlog"


def _eta_order(source: SourceStatus) -> float:
    # Never ends first (it needs an operator), unknown last.
    value = source_eta(source)
    if value.state in (ETA_HALTED, ETA_STOPPED):
        return math.inf
    return -1.0 if value.seconds is None else value.seconds


_ORDERS: Final[dict[str, Callable[[SourceStatus], float]]] = {
    "backlog": lambda s: -1.0 if s.backlog is None else float(s.backlog),
    "eta": _eta_order,
    "rate": lambda s: -1.0 if s.rate_rps is None else s.rate_rps,
    "errors": lambda s: float(s.errors),
    "successes": lambda s: float(s.successes),
    "hosts": lambda s: -1.0 if s.hosts is None else float(s.hosts.active),
}


def sort_sources(sources: Iterable[SourceStatus], by: str) -> list[SourceStatus]:
    """By name (A to Z), or by ``by`` largest first (ties by name); unknown values last."""
    ordered = sorted(sources, key=lambda s: s.name)
    if by == "name":
        return ordered
    order = _ORDERS[by]
    return sorted(ordered, key=lambda s: -order(s))


@dataclasses.dataclass(frozen=True, slots=True)
class View:
    """What the command shows: the rows' order and count, and how."""

    sort: str = DEFAULT_SORT
    top: int | None = None
    as_json: bool = False
