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
the Crawl-delay that caps the source's rate (``crawl_delay:``) and whether an operator
exempted the source (``robots_exempt``).

The command prints the table once (``--once``) or keeps it live, read again every
``--interval`` seconds; while Redis is away it keeps the last state read, and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
from collections import Counter
from collections.abc import Mapping
from typing import Any, Final

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from crawlctl.connections import redis_client, redis_option, redis_settings
from crawlctl.console import EXIT_OK, EXIT_UNAVAILABLE, Subcommands, UsageError, error
from crawlctl.signals import loop_signals
from image_crawler.config import RedisSettings
from image_crawler.contract import (
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
    RESIZE_ERRORS,
    ROBOTS_EXEMPT_SET,
    TEMP_HALTED_SET,
    MalformedMessage,
    PacingInfo,
    Status,
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
)

# A next slot closer than this is ordinary pacing at any rate above 1/s: not worth a line.
NEXT_SLOT_SHOWN_S: Final = 1.0
# Pacing keeps pace_next within one interval (1/rate) and the workers' horizon of now; a
# rate raised since the last grant can leave it up to the old interval ahead. Beyond an
# interval and this margin, only a pause (a server's Retry-After) explains it.
PAUSE_MARGIN_S: Final = 1.0


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
    # In ``robots_exempt``: its workers do not obey robots.txt.
    robots_exempt: bool = False
    # ``crawl_delay:``, seconds; None when absent or not a positive finite number.
    crawl_delay_s: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class CrawlStatus:
    sources: tuple[SourceStatus, ...]
    num_resized: int
    resize_errors: int
    num_split: int
    num_malformed: int


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


def _source(
    name: str,
    raw: Mapping[str, Any],
    now: float | None,
    *,
    halted: bool,
    temp_halted: bool,
    robots_exempt: bool,
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
        robots_exempt=robots_exempt,
        # The monitor ignores a value that is no delay; so does the view.
        crawl_delay_s=_positive(raw.get("crawl_delay")),
    )


def parse_status(payload: str | bytes) -> CrawlStatus:
    """The script's JSON answer as a ``CrawlStatus``, sources sorted by name."""
    data = json.loads(payload)
    halted = set(_strings(data.get("halted")))
    temp_halted = set(_strings(data.get("temp_halted")))
    exempt = set(_strings(data.get("robots_exempt")))
    now = _redis_time(data.get("now"))
    raw_sources = data.get("sources")
    sources = tuple(
        _source(
            name,
            raw,
            now,
            halted=name in halted,
            temp_halted=name in temp_halted,
            robots_exempt=name in exempt,
        )
        for name, raw in sorted((raw_sources if isinstance(raw_sources, dict) else {}).items())
        if isinstance(raw, dict)
    )
    totals = data.get("totals") or {}
    return CrawlStatus(
        sources=sources,
        num_resized=_int(totals.get("num_resized")) or 0,
        resize_errors=_int(totals.get("resize_errors")) or 0,
        num_split=_int(totals.get("num_split")) or 0,
        num_malformed=_int(totals.get("num_malformed")) or 0,
    )


async def read_status(redis: aioredis.Redis) -> CrawlStatus:
    """Everything ``status_table`` shows, read in one round trip."""
    payload = await redis.eval(_SCRIPT, 0, *_ARGV)
    return parse_status(payload)


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
    """``"exempt"``, ``"12 disallowed"``, ``"delay 10 s"``, one a line; ``"-"`` for none."""
    parts = ["exempt"] if source.robots_exempt else []
    if source.robots_disallowed:
        parts.append(f"{source.robots_disallowed} disallowed")
    # An exempt source's delay binds nothing (the monitor ignores it) and soon expires.
    if source.crawl_delay_s is not None and not source.robots_exempt:
        parts.append(f"delay {source.crawl_delay_s:g} s")
    # One a line: a row has a second line anyway (the pacing's reason), and the column
    # stays as narrow as its longest part in a narrow terminal.
    return "\n".join(parts) or "-"


def _robots(source: SourceStatus) -> Text:
    return Text(robots_text(source), style="yellow" if source.robots_exempt else "")


def status_table(status: CrawlStatus, *, note: str | None = None) -> Table:
    """The status as a table: one row per source (its pacing's reason on a second line),
    totals in the caption."""
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
    table.add_column("source", no_wrap=True)
    table.add_column("rate/s", justify="right", no_wrap=True)
    table.add_column("pace_rate", justify="right", no_wrap=True)
    table.add_column("pacing")
    table.add_column("ok", justify="right", no_wrap=True)
    table.add_column("errors", justify="right", no_wrap=True)
    table.add_column("last 50 statuses")
    table.add_column("state")
    table.add_column("robots", no_wrap=True, overflow="ellipsis")
    for source in status.sources:
        table.add_row(
            source.name,
            _rates(source),
            _pace_rate(source),
            _pacing_cell(source),
            str(source.successes),
            str(source.errors),
            _histogram(source.last_statuses),
            _state(source),
            _robots(source),
        )
    if not status.sources:
        table.add_row("(no source yet)", "", "", "", "", "", "", "", "")
    caption = (
        f"total: {status.num_resized} resized, {status.resize_errors} errors, "
        f"{status.num_split} split, {status.num_malformed} malformed\n"
        "rate/s: effective of configured; pace_rate: the rate workers get now (none: no "
        "monitor)\nrobots: URLs its robots.txt disallowed, its Crawl-delay; exempt: "
        "robots.txt not obeyed (image-crawler robots-exempt)"
    )
    table.caption = f"{caption}\n{note}" if note else caption
    return table


# --- the command --------------------------------------------------------------------------


def register(subcommands: Subcommands) -> None:
    status = subcommands.add_parser(
        "status",
        parents=[redis_option()],
        help="a live table of every source: pacing, counters, halts",
        description=(
            "Show, per source, its pacing: the effective rate of the configured one "
            "(crawl_rates), the rate workers are paced at now (pace_rate:SOURCE; none "
            "without a monitor), why (backoff, recovering, floor, halted...), and when the "
            "next request may start if a server's Retry-After put it off (pace_next:SOURCE); "
            "then its successes and errors, a histogram of its last 50 statuses, its halt "
            "state and override, and the crawl's totals. Refreshed every --interval seconds "
            "(one Redis round trip each) until Ctrl-C."
        ),
    )
    status.add_argument("--once", action="store_true", help="print the table once and exit")
    status.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="refresh period (default: 1)"
    )
    status.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise UsageError(f"--interval must be > 0, got {args.interval}")
    settings = redis_settings(args)
    try:
        return asyncio.run(_status(settings, once=args.once, interval_s=args.interval))
    except KeyboardInterrupt:
        return EXIT_OK


async def _status(settings: RedisSettings, *, once: bool, interval_s: float) -> int:
    console = Console()
    redis = redis_client(settings)
    try:
        try:
            status = await read_status(redis)
        except RedisError as e:
            error(f"Redis at {settings.redacted_url}: {e}")
            return EXIT_UNAVAILABLE
        if once:
            console.print(status_table(status))
            return EXIT_OK
        await _watch(redis, settings, status, interval_s, console)
        return EXIT_OK
    finally:
        await redis.aclose()


async def _watch(
    redis: aioredis.Redis,
    settings: RedisSettings,
    status: CrawlStatus,
    interval_s: float,
    console: Console,
) -> None:
    """Show ``status`` and read it again every ``interval_s`` until Ctrl-C or SIGTERM;
    while Redis is away, the last state read stays, with a note that says so."""
    stop = asyncio.Event()
    with loop_signals(stop), Live(status_table(status), console=console) as live:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)
            note = f"{settings.redacted_url}, every {interval_s:g} s; Ctrl-C quits"
            try:
                status = await read_status(redis)
            except RedisError as e:
                note = f"Redis unavailable ({e}); showing the last state read"
            live.update(status_table(status, note=note))
