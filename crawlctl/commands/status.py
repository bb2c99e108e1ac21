"""The crawl's state as the operator sees it: ``image-crawler status``.

``read_status`` gathers every source's keys in one round trip (a Lua script: the set of
sources is itself in Redis, so a plain pipeline would need two) and ``status_table``
renders the result; ``parse_status`` between them is pure. The sources listed are the
union of ``inbound_sources``, the monitor's ``crawl_rates``, ``halted``, ``temp_halted``
and ``robots_exempt`` (so that an exempt name no source has shows, as a typo should).

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
errors by reason (``resize_errors:{source}:{status}``, found with SCAN), its re-checks of
earlier crawls by status (the hash ``rechecks``, field ``{source}:{status}``) and the URLs
found deleted unread (``urls_lost:``).

The command prints the table once (``--once``), or as JSON (``--json``, ``status_json``),
or keeps it live, read again every ``--interval`` seconds; while Redis is away it keeps
the last state read, and says so. ``--sort`` and ``--top`` choose the rows shown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Final

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.live import Live
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from crawlctl.connections import redis_client, redis_option, redis_settings
from crawlctl.console import EXIT_OK, EXIT_UNAVAILABLE, Subcommands, UsageError, error, out
from crawlctl.signals import loop_signals
from image_crawler.config import RedisSettings
from image_crawler.contract import (
    BACKLOG_AT,
    BACKLOG_HASH,
    CRAWL_DELAY_PREFIX,
    HALTED_SET,
    INBOUND_SOURCES_SET,
    LAST_50_PREFIX,
    NUM_MALFORMED,
    NUM_RESIZED,
    NUM_SPLIT,
    OVERRIDE_RATE_ALIAS_PREFIX,
    OVERRIDE_RATE_PREFIX,
    PACE_BACKOFF,
    PACE_CONFIGURED,
    PACE_FLOOR,
    PACE_HALTED,
    PACE_NEXT_PREFIX,
    PACE_RATE_PREFIX,
    PACE_RECOVERING,
    PACE_STOPPED,
    RATES_HASH,
    RECHECK_STATUSES,
    RECHECKS_HASH,
    RESIZE_ERRORS,
    ROBOTS_EXEMPT_SET,
    TEMP_HALTED_SET,
    URLS_LOST,
    MalformedMessage,
    PacingInfo,
    Status,
    eta_s,
    source_and_check,
)
from image_crawler.lua import lua_script

_SCRIPT: Final = lua_script("crawlctl.commands", "status.lua")
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
)
# Every per-status error counter, resize_errors:{source}:{status}; source names and
# statuses hold no ':'.
_REASON_PREFIX: Final = f"{RESIZE_ERRORS}:"
REASON_KEYS_MATCH: Final = f"{RESIZE_ERRORS}:*:*"
# Keys SCAN looks at per call: each call holds Redis for about that many keys' walk.
SCAN_COUNT: Final = 1000

# A next slot closer than this is ordinary pacing at any rate above 1/s: not worth a line.
NEXT_SLOT_SHOWN_S: Final = 1.0
# Pacing keeps pace_next within one interval (1/rate) and the workers' horizon of now; a
# rate raised since the last grant can leave it up to the old interval ahead. Beyond an
# interval and this margin, only a pause (a server's Retry-After) explains it.
PAUSE_MARGIN_S: Final = 1.0
# The monitor rewrites the backlog every LOG_FREQUENCY_S; a figure older than this is from
# a monitor that stopped measuring (or is not running), and the view says so.
BACKLOG_STALE_S: Final = 60.0
# Reasons shown in a source's row; the caption and --json have them all.
ROW_REASONS: Final = 3


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
        )
        for name, raw in sorted((raw_sources if isinstance(raw_sources, dict) else {}).items())
        if isinstance(raw, dict)
    )
    totals = data.get("totals") or {}
    measured_at = _float(data.get("backlog_at"))
    total_reasons: Counter[str] = Counter()
    for by_status in reasons.values():
        total_reasons.update(by_status)
    total_rechecks: Counter[str] = Counter()
    for by_status in rechecks.values():
        total_rechecks.update(by_status)
    return CrawlStatus(
        sources=sources,
        num_resized=_int(totals.get("num_resized")) or 0,
        resize_errors=_int(totals.get("resize_errors")) or 0,
        num_split=_int(totals.get("num_split")) or 0,
        num_malformed=_int(totals.get("num_malformed")) or 0,
        backlog_age_s=None if measured_at is None or now is None else now - measured_at,
        errors_by_reason=_by_count(total_reasons),
        rechecks=_in_check_order(total_rechecks),
    )


async def reason_keys(redis: aioredis.Redis) -> list[str]:
    """Every ``resize_errors:{source}:{status}`` key, found with SCAN (a step of
    ``SCAN_COUNT`` keys a call, so that Redis serves others between steps)."""
    keys = [key async for key in redis.scan_iter(match=REASON_KEYS_MATCH, count=SCAN_COUNT)]
    return list(dict.fromkeys(keys))  # SCAN may return a key twice


async def read_status(redis: aioredis.Redis) -> CrawlStatus:
    """Everything ``status_table`` shows: the error counters' keys found with SCAN, then
    every value read in one round trip (one script, one moment of Redis's clock), the
    re-checks' hash included."""
    keys = await reason_keys(redis)
    payload = await redis.eval(_SCRIPT, len(keys), *keys, *_ARGV)
    return parse_status(payload, keys)


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


def _grain_s(seconds: float) -> int:
    # The smallest unit shown for a duration this long.
    if seconds < 3600:
        return 1
    if seconds < 86400:
        return 60
    return 3600 if seconds < 10 * 86400 else 86400


def eta_text(seconds: float) -> str:
    """A duration in its two largest units, rounded to the smaller: ``"42s"``,
    ``"12m30s"``, ``"3h12m"``, ``"4d3h"``; days alone from ten days on (``"27d"``); at
    least ``"1s"`` when more than nothing is left."""
    if seconds <= 0:
        return "0s"
    whole = max(1, math.floor(seconds + 0.5))
    for _ in range(2):  # rounding up may reach the next unit: round again in that one
        grain = _grain_s(whole)
        whole = math.floor(whole / grain + 0.5) * grain
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    units = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    first = next(i for i, (value, _) in enumerate(units) if value)
    shown = [f"{value}{unit}" for value, unit in units[first : first + 2] if value]
    return "".join(shown)


def eta_cell(value: Eta) -> str:
    """``"3h12m"``, ``"—"`` (nothing waits), ``"halted"``, ``"never"`` (rate 0),
    ``"?"`` (a backlog, no rate) or ``""`` (no backlog measured)."""
    if value.state == ETA_DRAINING and value.seconds is not None:
        return eta_text(value.seconds)
    return {ETA_EMPTY: "—", ETA_HALTED: "halted", ETA_STOPPED: "never"}.get(value.state, "?")


# --- which rows: --sort and --top ------------------------------------------------------

SORT_KEYS: Final = ("backlog", "eta", "rate", "errors", "successes", "name")
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
}


def sort_sources(sources: Iterable[SourceStatus], by: str) -> list[SourceStatus]:
    """By name (A to Z), or by ``by`` largest first (ties by name); unknown values last."""
    ordered = sorted(sources, key=lambda s: s.name)
    if by == "name":
        return ordered
    order = _ORDERS[by]
    return sorted(ordered, key=lambda s: -order(s))


def paused_by_server(next_slot_in_s: float, rate_rps: float | None) -> bool:
    """True when the next slot is further away than pacing at ``rate_rps`` puts it: a
    pause, which only a server's Retry-After sets. Unknown with no rate (False)."""
    if rate_rps is None or rate_rps <= 0:
        return False
    return next_slot_in_s > 1.0 / rate_rps + PAUSE_MARGIN_S


def next_slot_text(source: SourceStatus) -> str | None:
    """``"Retry-After: next request in 42 s"``, or None when the next slot is near."""
    wait_s = source.next_slot_in_s
    if wait_s is None or wait_s <= NEXT_SLOT_SHOWN_S:
        return None
    text = f"next request in {_duration(wait_s)}"
    return f"Retry-After: {text}" if paused_by_server(wait_s, _paced_at(source)) else text


def _paced_at(source: SourceStatus) -> float | None:
    # A halted source's effective rate is 0; the slots it was given were at most its
    # configured rate apart.
    if source.rate_rps:
        return source.rate_rps
    if source.pacing is not None and source.pacing.configured_rps:
        return source.pacing.configured_rps
    return source.pace_rate_rps


def _duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s"


def _rate(rate_rps: float) -> str:
    # Three significant digits, but never an exponent: rates go up to a few hundred.
    return f"{rate_rps:.0f}" if rate_rps >= 100 else f"{rate_rps:.3g}"


def _rates(source: SourceStatus) -> str:
    if source.pacing is not None:
        return f"{_rate(source.pacing.rate_rps)} of {_rate(source.pacing.configured_rps)}"
    return "-" if source.rate_rps is None else _rate(source.rate_rps)


def _pace_rate(source: SourceStatus) -> Text:
    if source.pace_rate_rps is None:
        # Workers start nothing: worth a colour unless the source is meant to stop.
        quiet = source.halted or source.temp_halted or source.rate_rps is None
        return Text("none", style="" if quiet else "red")
    return Text(_rate(source.pace_rate_rps))


_STATE_STYLES: Final = {
    PACE_CONFIGURED: "green",
    PACE_RECOVERING: "cyan",
    PACE_BACKOFF: "yellow",
    PACE_FLOOR: "bold yellow",
    PACE_HALTED: "red",
    PACE_STOPPED: "red",
}


def _pacing_cell(source: SourceStatus) -> RenderableType:
    text = Text()
    if source.pacing is not None:
        text.append(source.pacing.state, style=_STATE_STYLES.get(source.pacing.state, ""))
    elif source.rate_rps is not None:
        text.append("unknown", style="dim")  # an older monitor: a rate, no reason
    else:
        text.append("-")
    slot = next_slot_text(source)
    if slot is not None:
        text.append(f"\n{slot}", style="bold magenta")
    if source.pacing is None or not source.pacing.why:
        return text
    # The reason is the widest thing in a row: in a narrow terminal it is cut, not
    # wrapped over many lines (`redis-cli hget crawl_rates SOURCE` has it whole).
    why = Text(source.pacing.why, style="dim", no_wrap=True, overflow="ellipsis")
    return Group(text, why)


def _histogram(statuses: Mapping[str, int]) -> str:
    return " ".join(f"{status}={count}" for status, count in statuses.items()) or "-"


def _state(source: SourceStatus) -> Text:
    text = Text()
    if source.halted:
        text.append("halted", style="bold red")
    elif source.temp_halted:
        text.append("temp halted", style="yellow")
    else:
        text.append("running", style="green")
    if source.override is not None:
        text.append(f", override {source.override}/s", style="cyan")
    return text


def robots_text(source: SourceStatus) -> str:
    """``"exempt"``, ``"12 disallowed"``, ``"3 noindex"``, ``"delay 10 s"``, one a line;
    ``"-"`` for none."""
    parts = ["exempt"] if source.robots_exempt else []
    if source.robots_disallowed:
        parts.append(f"{source.robots_disallowed} disallowed")
    if source.no_index:
        parts.append(f"{source.no_index} noindex")
    # An exempt source's delay binds nothing (the monitor ignores it) and soon expires.
    if source.crawl_delay_s is not None and not source.robots_exempt:
        parts.append(f"delay {source.crawl_delay_s:g} s")
    # One a line: a row has a second line anyway (the pacing's reason), and the column
    # stays as narrow as its longest part in a narrow terminal.
    return "\n".join(parts) or "-"


def _robots(source: SourceStatus) -> Text:
    return Text(robots_text(source), style="yellow" if source.robots_exempt else "")


def _backlog(source: SourceStatus) -> Text:
    # Blank when not measured: the caption says why, once.
    text = Text("" if source.backlog is None else str(source.backlog))
    if source.urls_lost:
        text.append(f"\nlost {source.urls_lost}", style="bold red")
    return text


def _eta(source: SourceStatus) -> Text:
    if source.backlog is None:
        return Text("")
    value = source_eta(source)
    style = {ETA_HALTED: "red", ETA_STOPPED: "red", ETA_UNKNOWN: "yellow"}.get(value.state, "")
    return Text(eta_cell(value), style=style)


@dataclasses.dataclass(frozen=True, slots=True)
class _Cut:
    """A line shown whole where its column has room, else cut with an ellipsis: unlike
    a plain Text, it asks its column for no width of its own."""

    text: Text

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(1, self.text.cell_len).with_maximum(options.max_width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.text


def _errors(source: SourceStatus) -> RenderableType:
    count = Text(str(source.errors))
    top = list(source.errors_by_reason.items())[:ROW_REASONS]
    if not top:
        return count
    reasons = Text(_histogram(dict(top)), style="dim", no_wrap=True, overflow="ellipsis")
    return Group(count, _Cut(reasons))


def backlog_line(status: CrawlStatus, total: Totals) -> str:
    """The caption's backlog and ETA: the total, how old the measurement is, the crawl's
    ETA and the sources that will not drain."""
    age = status.backlog_age_s
    if total.backlog is None or age is None:
        return (
            f"backlog: not measured ({BACKLOG_AT} is not set: is a monitor of this version "
            "running?)"
        )
    measured = f"measured {_duration(max(age, 0.0))} ago"
    if age > BACKLOG_STALE_S:
        measured += " (stale: is the monitor running?)"
    line = f"backlog: {total.backlog} URLs, {measured}; "
    if total.eta_source is not None and total.eta_s is not None:
        line += f"ETA {eta_text(total.eta_s)} (the slowest source: {total.eta_source})"
    elif total.eta_s is None:
        line += "ETA never"
    else:
        line += "ETA —"
    if total.stalled_sources:
        line += (
            f"; {total.stalled_backlog} URLs of {total.stalled_sources} source(s) at rate 0 "
            "(halted or stopped) never drain until resumed"
        )
    if total.unknown_sources:
        line += f"; {total.unknown_sources} source(s) with a backlog have no rate yet"
    return line


def _reasons_line(reasons: Mapping[str, int], shown: int = 12) -> str:
    items = list(reasons.items())
    line = f"errors by reason: {_histogram(dict(items[:shown]))}"
    if len(items) > shown:
        line += f" and {len(items) - shown} more (--json has them all)"
    return line


@dataclasses.dataclass(frozen=True, slots=True)
class View:
    """What the command shows: the rows' order and count, and how."""

    sort: str = DEFAULT_SORT
    top: int | None = None
    as_json: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class _Column:
    header: str
    cell: Callable[[SourceStatus], RenderableType]
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


_RIGHT: Final = {"justify": "right", "no_wrap": True}
# Shown only when a source has had re-checks.
RECHECKS_COLUMN: Final = "re-checks"
_COLUMNS: Final = (
    _Column("source", lambda s: s.name, {"no_wrap": True}),
    _Column("backlog", _backlog, _RIGHT),
    _Column("ETA", _eta, _RIGHT),
    _Column("rate/s", _rates, _RIGHT),
    _Column("pace_rate", _pace_rate, _RIGHT),
    _Column("pacing", _pacing_cell),
    _Column("ok", lambda s: str(s.successes), _RIGHT),
    # The reasons are cut, not wrapped: the caption and --json have them whole.
    _Column("errors", _errors, {"justify": "right"}),
    _Column(RECHECKS_COLUMN, lambda s: _histogram(s.rechecks)),
    _Column("last 50 statuses", lambda s: _histogram(s.last_statuses)),
    _Column("state", _state),
    _Column("robots", _robots, {"no_wrap": True, "overflow": "ellipsis"}),
)
# What a terminal too narrow for every column goes without, first to last: the backlog,
# ETA, rates, errors and state are what a long crawl is watched for.
NARROW_HIDES: Final = ("last 50 statuses", RECHECKS_COLUMN, "pace_rate", "robots")
# Wide enough for any cell: measured within it, a cell's widths are its own.
UNLIMITED_WIDTH: Final = 100_000


def _columns(status: CrawlStatus, hidden: Collection[str] = ()) -> list[_Column]:
    unused = () if status.rechecks else (RECHECKS_COLUMN,)
    return [c for c in _COLUMNS if c.header not in hidden and c.header not in unused]


def _shown(status: CrawlStatus, view: View) -> list[SourceStatus]:
    ordered = sort_sources(status.sources, view.sort)
    return ordered if view.top is None else ordered[: view.top]


def status_table(
    status: CrawlStatus,
    *,
    note: str | None = None,
    sort: str = DEFAULT_SORT,
    top: int | None = None,
    hidden: Collection[str] = (),
) -> Table:
    """The status as a table: one row per source (its pacing's reason and top error
    reasons on a second line), sorted by ``sort``, the first ``top`` only (None: all),
    without the ``hidden`` columns (by header); totals in the caption."""
    # No side borders and one space between columns: the pacing's reason gets the width.
    table = Table(
        title="image-crawler status",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        collapse_padding=True,
    )
    columns = _columns(status, hidden)
    for column in columns:
        table.add_column(column.header, **column.options)
    shown = _shown(status, View(sort=sort, top=top))
    for source in shown:
        table.add_row(*(column.cell(source) for column in columns))
    if not status.sources:
        table.add_row("(no source yet)", *[""] * (len(columns) - 1))
    table.caption = "\n".join(_caption(status, sort, len(shown), hidden, note))
    return table


def _caption(
    status: CrawlStatus, sort: str, shown: int, hidden: Collection[str], note: str | None
) -> list[str]:
    total = totals(status.sources)
    lines = [
        f"total: {status.num_resized} resized, {status.resize_errors} errors, "
        f"{status.num_split} split, {status.num_malformed} malformed; rate "
        f"{_rate(total.effective_rps)}/s of {_rate(total.configured_rps)}/s configured",
        backlog_line(status, total),
    ]
    if status.errors_by_reason:
        lines.append(_reasons_line(status.errors_by_reason))
    if status.rechecks:
        lines.append(
            f"re-checks: {_histogram(status.rechecks)} (images of earlier crawls asked again; "
            "changed: crawled again, gone: 404 or 410)"
        )
    if total.urls_lost:
        lines.append(
            f"lost: {total.urls_lost} URLs deleted from urls.* topics before a worker read "
            f"them ({URLS_LOST}:SOURCE; see the workers' urls_lost events)"
        )
    if shown < len(status.sources):
        lines.append(
            f"showing {shown} of {len(status.sources)} sources by {sort} "
            f"({len(status.sources) - shown} more hidden: --top, --sort)"
        )
    if hidden:
        lines.append(f"too narrow for: {', '.join(hidden)} (a wider terminal or --json has them)")
    legend = "rate/s: effective of configured; "
    if "pace_rate" not in hidden:
        legend += "pace_rate: the rate workers get now (none: no monitor); "
    lines.append(legend + "ETA: backlog / effective rate")
    if "robots" not in hidden:
        lines.append(
            "robots: URLs its robots.txt disallowed, images not to be indexed (NoIndex), "
            "its Crawl-delay; exempt: "
            "robots.txt not obeyed (image-crawler robots-exempt)"
        )
    if note:
        lines.append(note)
    return lines


def fits(
    console: Console,
    options: ConsoleOptions,
    status: CrawlStatus,
    view: View,
    hidden: Collection[str],
) -> bool:
    """True when the table fits ``options.max_width`` with every word of every column
    whole. Rich narrows the widest wrapping columns first, to a common width: the table
    fits when, at the width of the longest word of any of them, the rest still fits."""
    columns = _columns(status, hidden)
    sources = _shown(status, view)
    unlimited = options.update_width(UNLIMITED_WIDTH)
    fixed = 0
    wrapping: list[Measurement] = []
    for index, column in enumerate(columns):
        cells = [Text(column.header), *(column.cell(source) for source in sources)]
        measured = [Measurement.get(console, unlimited, cell) for cell in cells]
        padding = 0 if index == len(columns) - 1 else 1
        lowest = max(m.minimum for m in measured) + padding
        widest = max(m.maximum for m in measured) + padding
        if column.options.get("no_wrap"):
            fixed += widest
        else:
            wrapping.append(Measurement(lowest, widest))
    fixed += len(columns) - 1  # the box's dividers, one between each two columns
    if not wrapping:
        return fixed <= options.max_width
    level = max(m.minimum for m in wrapping)
    return fixed + sum(min(m.maximum, level) for m in wrapping) <= options.max_width


@dataclasses.dataclass(frozen=True, slots=True)
class FittedTable:
    """``status_table`` at the size it is drawn at: it hides the ``NARROW_HIDES``
    columns, in turn, while the table cannot show its every word whole; with
    ``fit_height`` and no ``top`` of the view's, it shows as many rows as leave the
    caption (the totals) on the screen. (Live draws it again at each refresh, so a
    terminal made larger gets them back.)"""

    status: CrawlStatus
    view: View = View()
    note: str | None = None
    fit_height: bool = False

    def table(self, console: Console, options: ConsoleOptions) -> Table:
        view = self.view
        height = options.size.height if self.fit_height and view.top is None else None
        if height is not None:
            # Most rows take two lines (the pacing's reason under its state).
            view = dataclasses.replace(view, top=max(1, height // 2))
        shown = {column.header for column in _columns(self.status)}
        while True:
            hidden: list[str] = []
            for drop in (header for header in NARROW_HIDES if header in shown):
                if fits(console, options, self.status, view, hidden):
                    break
                hidden.append(drop)
            table = status_table(
                self.status, note=self.note, sort=view.sort, top=view.top, hidden=hidden
            )
            if height is None or view.top is None or view.top <= 1:
                return table
            excess = len(console.render_lines(table, options, pad=False)) - height
            if excess <= 0:
                return table
            view = dataclasses.replace(view, top=max(1, view.top - (excess + 1) // 2))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table(console, options)


# --- --json ----------------------------------------------------------------------------

JSON_VERSION: Final = 1


def _number(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def source_json(source: SourceStatus) -> dict[str, Any]:
    """One source for ``--json``: every field, numbers as numbers, None as null (and
    for what is no finite number: strict JSON has no NaN or Infinity)."""
    value = source_eta(source)
    pacing = source.pacing
    configured = pacing.configured_rps if pacing is not None else source.rate_rps
    return {
        "name": source.name,
        "backlog": source.backlog,
        "eta_s": _number(value.seconds),
        "eta_state": value.state,
        "effective_rps": _number(source.rate_rps),
        "configured_rps": _number(configured),
        "rate_origin": pacing.origin if pacing is not None else None,
        "pacing_state": pacing.state if pacing is not None else None,
        "pacing_why": pacing.why if pacing is not None else None,
        "pace_rate_rps": _number(source.pace_rate_rps),
        "next_slot_in_s": _number(source.next_slot_in_s),
        "successes": source.successes,
        "errors": source.errors,
        "errors_by_reason": dict(source.errors_by_reason),
        "rechecks": dict(source.rechecks),
        "last_statuses": dict(source.last_statuses),
        "urls_lost": source.urls_lost,
        "halted": source.halted,
        "temp_halted": source.temp_halted,
        "override_rps": _number(_float(source.override)),
        "robots_disallowed": source.robots_disallowed,
        "no_index": source.no_index,
        "robots_exempt": source.robots_exempt,
        "crawl_delay_s": source.crawl_delay_s,
    }


def status_json(
    status: CrawlStatus, *, sort: str = DEFAULT_SORT, top: int | None = None
) -> dict[str, Any]:
    """The ``--json`` document: ``{"version", "general": {...}, "sources": [...]}``, the
    sources in ``sort`` order, the first ``top`` (None: all). Its fields are documented
    in the README; a new field may be added, none changes meaning without a new version."""
    total = totals(status.sources)
    ordered = sort_sources(status.sources, sort)
    shown = ordered if top is None else ordered[:top]
    age = status.backlog_age_s
    return {
        "version": JSON_VERSION,
        "general": {
            "sources": len(ordered),
            "sources_shown": len(shown),
            "sort": sort,
            "successes": status.num_resized,
            "errors": status.resize_errors,
            "split": status.num_split,
            "malformed": status.num_malformed,
            "effective_rps": _number(total.effective_rps),
            "configured_rps": _number(total.configured_rps),
            "backlog": total.backlog,
            "backlog_age_s": age,
            "backlog_stale": age is None or age > BACKLOG_STALE_S,
            "eta_s": _number(total.eta_s),
            "eta_source": total.eta_source,
            "stalled_sources": total.stalled_sources,
            "stalled_backlog": total.stalled_backlog,
            "unknown_eta_sources": total.unknown_sources,
            "errors_by_reason": dict(status.errors_by_reason),
            "rechecks": dict(status.rechecks),
            "urls_lost": total.urls_lost,
        },
        "sources": [source_json(source) for source in shown],
    }


# --- the command --------------------------------------------------------------------------


def register(subcommands: Subcommands) -> None:
    status = subcommands.add_parser(
        "status",
        parents=[redis_option()],
        help="a live table of every source: backlog, ETA, pacing, errors, halts",
        description=(
            "Show, per source, its backlog (URLs split but not yet taken, as the monitor "
            "last measured it) and the ETA at its effective rate; its pacing: the effective "
            "rate of the configured one (crawl_rates), the rate workers are paced at now "
            "(pace_rate:SOURCE; none without a monitor), why (backoff, recovering, floor, "
            "halted...), and when the next request may start if a server's Retry-After put "
            "it off (pace_next:SOURCE); then its successes, its errors and their top "
            "reasons, its re-checks by status (when there are any), a histogram of its "
            "last 50 statuses, its halt state and override, and the crawl's totals (the "
            "ETA of the crawl is its slowest source's). Refreshed "
            "every --interval seconds until Ctrl-C."
        ),
    )
    status.add_argument("--once", action="store_true", help="print the table once and exit")
    status.add_argument(
        "--json",
        action="store_true",
        help="print the status once as JSON (every field; see the README) and exit",
    )
    status.add_argument(
        "--sort",
        choices=SORT_KEYS,
        default=DEFAULT_SORT,
        help=f"order of the sources, largest first except name (default: {DEFAULT_SORT})",
    )
    status.add_argument(
        "--top", type=int, metavar="N", help="show the first N sources only (default: all)"
    )
    status.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="refresh period (default: 1)"
    )
    status.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise UsageError(f"--interval must be > 0, got {args.interval}")
    if args.top is not None and args.top < 1:
        raise UsageError(f"--top must be at least 1, got {args.top}")
    settings = redis_settings(args)
    view = View(sort=args.sort, top=args.top, as_json=args.json)
    try:
        return asyncio.run(_status(settings, view, once=args.once, interval_s=args.interval))
    except KeyboardInterrupt:
        return EXIT_OK


async def _status(settings: RedisSettings, view: View, *, once: bool, interval_s: float) -> int:
    console = Console()
    redis = redis_client(settings)
    try:
        try:
            status = await read_status(redis)
        except RedisError as e:
            error(f"Redis at {settings.redacted_url}: {e}")
            return EXIT_UNAVAILABLE
        if view.as_json:
            out(json.dumps(status_json(status, sort=view.sort, top=view.top), indent=2))
            return EXIT_OK
        if once:
            console.print(FittedTable(status, view))
            return EXIT_OK
        await _watch(redis, settings, status, view, interval_s, console)
        return EXIT_OK
    finally:
        await redis.aclose()


async def _watch(
    redis: aioredis.Redis,
    settings: RedisSettings,
    status: CrawlStatus,
    view: View,
    interval_s: float,
    console: Console,
) -> None:
    """Show ``status`` and read it again every ``interval_s`` until Ctrl-C or SIGTERM;
    while Redis is away, the last state read stays, with a note that says so."""
    stop = asyncio.Event()

    def table(note: str | None = None) -> FittedTable:
        return FittedTable(status, view, note, fit_height=True)

    with loop_signals(stop), Live(table(), console=console) as live:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)
            note = f"{settings.redacted_url}, every {interval_s:g} s; Ctrl-C quits"
            try:
                status = await read_status(redis)
            except RedisError as e:
                note = f"Redis unavailable ({e}); showing the last state read"
            live.update(table(note))
