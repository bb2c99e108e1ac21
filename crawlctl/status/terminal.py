"""The crawl's state in a terminal: ``status_table`` draws it as a table, a row per
source (its pacing's reason, top error reasons and troubled hosts on a second line) and
the crawl's totals in the caption; ``FittedTable`` draws that table at the terminal's size, without
the columns it has no room for, and live, without the rows that would push the totals
off the screen. ``hosts_table`` draws one source's hosts (``status --hosts SOURCE``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from crawlctl.status.hosts import (
    BACKLOG_UNKNOWN,
    SHOWN_ORDER,
    HostRow,
    SourceHosts,
    effective_rps,
    last_answer,
    why_text,
)
from crawlctl.status.model import (
    BACKLOG_STALE_S,
    DEFAULT_SORT,
    ETA_DRAINING,
    ETA_EMPTY,
    ETA_HALTED,
    ETA_STOPPED,
    ETA_UNKNOWN,
    CrawlStatus,
    Eta,
    SourceStatus,
    Totals,
    View,
    duplicates,
    host_totals,
    sort_sources,
    source_eta,
    totals,
)
from image_crawler.contract import (
    BACKLOG_AT,
    DNS_STALE_S,
    HOST_AT_PACE,
    HOST_BACKED_OFF,
    HOST_HALTED,
    HOST_PACED,
    PACE_BACKOFF,
    PACE_CONFIGURED,
    PACE_FLOOR,
    PACE_HALTED,
    PACE_RECOVERING,
    PACE_STOPPED,
    PLACEMENTS_HASH,
    URLS_LOST,
)
from image_crawler.dns_stats import DnsFigures

# A next slot closer than this is ordinary pacing at any rate above 1/s: not worth a line.
NEXT_SLOT_SHOWN_S: Final = 1.0
# Pacing keeps pace_next within one interval (1/rate) and the workers' horizon of now; a
# rate raised since the last grant can leave it up to the old interval ahead. Beyond an
# interval and this margin, only a pause (a server's Retry-After) explains it.
PAUSE_MARGIN_S: Final = 1.0
# Reasons shown in a source's row; the caption and --json have them all.
ROW_REASONS: Final = 3
# Workers whose DNS figures the caption shows a line each; --json has them all.
DNS_WORKERS_SHOWN: Final = 8


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


def hosts_text(source: SourceStatus) -> str:
    """``"1254 active"``, then those paced below the source's rate, backed off and
    halted (``"40 paced, 10 backed off, 4 halted"``, the states with none left out) on a
    second line; ``"-"`` for a source without a host index."""
    if source.hosts is None:
        return "-"
    counts = source.hosts
    troubled = [
        f"{n} {label}"
        for n, label in (
            (counts.paced, "paced"),
            (counts.backed_off, "backed off"),
            (counts.halted, "halted"),
        )
        if n
    ]
    return f"{counts.active} active" + ("\n" + ", ".join(troubled) if troubled else "")


def _hosts(source: SourceStatus) -> RenderableType:
    first, _, troubled = hosts_text(source).partition("\n")
    if not troubled:
        return Text(first)
    style = "yellow" if source.hosts is not None and source.hosts.halted else "dim"
    return Group(Text(first), _Cut(Text(troubled, style=style, no_wrap=True, overflow="ellipsis")))


def duplicates_text(placements: Mapping[str, int]) -> str:
    """``"12 (4.1%)"``, the images placed as exact or near copies and their share of
    those placed, then ``"10 exact, 2 near"`` on a second line (when there are any);
    ``"-"`` for none placed."""
    found = duplicates(placements)
    if found.share is None:
        return "-"
    kinds = f"\n{found.exact} exact, {found.near} near" if found.count else ""
    return f"{found.count} ({found.share:.1%}){kinds}"


def _duplicates(source: SourceStatus) -> RenderableType:
    first, _, kinds = duplicates_text(source.placements).partition("\n")
    if not kinds:
        return Text(first)
    return Group(Text(first), _Cut(Text(kinds, style="dim", no_wrap=True, overflow="ellipsis")))


def duplicates_line(status: CrawlStatus) -> str | None:
    """The caption's duplicates, of every source; None before the stage placed any."""
    found = duplicates(status.placements)
    if found.share is None:
        return None
    return (
        f"duplicates: {found.count} of {found.placed} images placed ({found.share:.1%}): "
        f"{found.exact} exact, {found.near} near (the deduplication stage, {PLACEMENTS_HASH})"
    )


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
class _Column:
    header: str
    cell: Callable[[SourceStatus], RenderableType]
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


_RIGHT: Final = {"justify": "right", "no_wrap": True}
# Shown only when a source has had re-checks.
RECHECKS_COLUMN: Final = "re-checks"
# Shown only when a source has a host index.
HOSTS_COLUMN: Final = "hosts"
# Shown only once the deduplication stage has placed images.
DUPLICATES_COLUMN: Final = "duplicates"
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
    _Column(DUPLICATES_COLUMN, _duplicates, {"justify": "right"}),
    _Column("last 50 statuses", lambda s: _histogram(s.last_statuses)),
    _Column("state", _state),
    _Column(HOSTS_COLUMN, _hosts),
    _Column("robots", _robots, {"no_wrap": True, "overflow": "ellipsis"}),
)
# What a terminal too narrow for every column goes without, first to last: the backlog,
# ETA, rates, errors and state are what a long crawl is watched for.
NARROW_HIDES: Final = (
    "last 50 statuses",
    RECHECKS_COLUMN,
    DUPLICATES_COLUMN,
    "pace_rate",
    "robots",
    HOSTS_COLUMN,
)
# Wide enough for any cell: measured within it, a cell's widths are its own.
UNLIMITED_WIDTH: Final = 100_000


def _columns(status: CrawlStatus, hidden: Collection[str] = ()) -> list[_Column]:
    unused = [] if status.rechecks else [RECHECKS_COLUMN]
    if all(not source.placements for source in status.sources):
        unused.append(DUPLICATES_COLUMN)
    if all(source.hosts is None for source in status.sources):
        unused.append(HOSTS_COLUMN)
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
        title=status_title(status),
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


def status_title(status: CrawlStatus) -> Text | str:
    """The table's title; while the whole crawl is paused (``crawl_paused``), why, first
    and in red: no source gets a request until it is lifted."""
    if status.paused is None:
        return "image-crawler status"
    title = Text("image-crawler status\n")
    title.append(f"CRAWL PAUSED: {status.paused.message}", style="bold red")
    return title


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
    found = duplicates_line(status)
    if found is not None:
        lines.append(found)
    hosts = host_totals(status.sources)
    if hosts is not None:
        lines.append(
            f"hosts: {hosts.active} asked about in the last minute, {hosts.paced} paced below "
            f"their source's rate, {hosts.backed_off} backed off, {hosts.halted} halted "
            "(image-crawler status --hosts SOURCE lists them)"
        )
    lines += dns_lines(status)
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


def dns_text(figures: DnsFigures) -> str:
    """``"12500 queries, 91.2% of 142000 lookups from cache, 5210 names cached, 61 failed
    (nxdomain 50, timeout 11)"``."""
    ratio = figures.hit_ratio
    cache = "no lookup yet" if ratio is None else f"{ratio:.1%} of {figures.lookups} lookups"
    failed = ", ".join(f"{kind} {n}" for kind, n in figures.failures.items())
    return f"{figures.queries} queries, {cache} from cache, {figures.cached} names cached, " + (
        f"{figures.failed} failed ({failed})" if failed else "none failed"
    )


def dns_lines(status: CrawlStatus) -> list[str]:
    """The workers' resolvers, summed over those reporting (``dns_workers``), and the URLs
    ended as DnsError; then each worker on a line of its own when there are several (or
    one stopped reporting), the first ``DNS_WORKERS_SHOWN``. None without either."""
    reports, now_s = status.dns_reports, status.now_s
    ended = f"; {status.dns_errors} URLs ended as DnsError" if status.dns_errors else ""
    if (not reports and not ended) or now_s is None:
        return []
    total = status.dns
    if total is None:
        gone = f" ({len(reports)} stopped reporting)" if reports else ""
        return [f"dns: no worker reported in the last {DNS_STALE_S:g} s{gone}{ended}"]
    reporting = sum(not report.stale(now_s) for report in reports)
    lines = [f"dns: {reporting} worker(s) reporting: {dns_text(total)}{ended}"]
    if len(reports) == 1 and reporting == 1:
        return lines
    for report in reports[:DNS_WORKERS_SHOWN]:
        age_s = report.age_s(now_s)
        when = f"stale: last report {eta_text(age_s)} ago" if report.stale(now_s) else ""
        when = when or f"{age_s:.0f} s ago"
        lines.append(f"  {report.worker}: {dns_text(report.figures)} ({when})")
    if len(reports) > DNS_WORKERS_SHOWN:
        lines.append(f"  and {len(reports) - DNS_WORKERS_SHOWN} more workers (--json has them)")
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
    view: View = dataclasses.field(default_factory=View)
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


# --- one source's hosts: status --hosts SOURCE -------------------------------------------

_HOST_STATE_TEXT: Final = {
    HOST_HALTED: ("halted", "bold red"),
    HOST_BACKED_OFF: ("backed off", "yellow"),
    HOST_PACED: ("paced", "cyan"),
    HOST_AT_PACE: ("at pace", "green"),
}


def hosts_counts_line(hosts: SourceHosts) -> str:
    """The source's counts: ``"1204 active (asked about in the last minute): 1150 at the
    source's pace, 40 paced below it, 10 backed off, 4 halted"``."""
    counts = hosts.counts
    if counts is None:
        return (
            f"no host of {hosts.source} asked about in the last 10 minutes "
            f"(no host_index:{hosts.source})"
        )
    return (
        f"{counts.active} active (asked about in the last minute): {counts.at_pace} at the "
        f"source's pace, {counts.paced} paced below it, {counts.backed_off} backed off, "
        f"{counts.halted} halted"
    )


def _host_cells(row: HostRow, hosts: SourceHosts) -> list[RenderableType]:
    text, style = _HOST_STATE_TEXT.get(row.state or "", ("?", ""))
    rate = effective_rps(row, hosts.source_rps)
    fails = row.count("fails")
    return [
        Text(row.host, no_wrap=True, overflow="ellipsis"),
        Text(text, style=style),
        "-" if rate is None else _rate(rate),
        why_text(row, hosts),
        last_answer(row),
        str(fails) if fails else "-",
        f"{_duration(max(hosts.now_s - row.asked_at_s, 0.0))} ago",
    ]


def hosts_table(hosts: SourceHosts) -> Table:
    """One source's hosts: the troubled (halted, backed off, paced below its rate) and
    the busiest, a row each, the counts and the source's rate in the caption."""
    table = Table(
        title=f"image-crawler status --hosts {hosts.source}",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        collapse_padding=True,
    )
    for header, options in (
        ("host", {"no_wrap": True}),
        ("state", {"no_wrap": True}),
        ("rate/s", _RIGHT),
        ("why", {}),
        ("last answer", {"no_wrap": True}),
        ("fails", _RIGHT),
        ("asked", {"justify": "right", "no_wrap": True}),
    ):
        table.add_column(header, **options)
    for state in SHOWN_ORDER:
        for row in hosts.rows.get(state, ()):
            table.add_row(*_host_cells(row, hosts))
    if not any(hosts.rows.values()):
        table.add_row("(no host)", *[""] * 6)
    table.caption = "\n".join(_hosts_caption(hosts))
    return table


def _hosts_caption(hosts: SourceHosts) -> list[str]:
    rate = "none (no monitor)" if hosts.source_rps is None else f"{_rate(hosts.source_rps)}/s"
    lines = [hosts_counts_line(hosts), f"source rate now (pace_rate:{hosts.source}): {rate}"]
    if hosts.host_rate_rps is not None:
        lines[-1] += f"; host_rate:{hosts.source} {hosts.host_rate_rps:g}/s"
    cut = _cut_states(hosts)
    if cut:
        lines.append(f"showing {', '.join(cut)} (the most recently asked about; --top)")
    lines.append(BACKLOG_UNKNOWN.replace("{source}", hosts.source))
    lines.append(
        "rate/s: the host's rate now (0 while halted); last answer: clean, refused (429, 503, "
        "a timeout) or failed (5xx, no answer); fails: in a row; asked: by a worker"
    )
    return lines


def _cut_states(hosts: SourceHosts) -> list[str]:
    """``"10 of 40 paced"`` for each state with more active hosts than shown."""
    counts = hosts.counts
    if counts is None:
        return []
    active = {
        HOST_HALTED: (counts.halted, "halted"),
        HOST_BACKED_OFF: (counts.backed_off, "backed off"),
        HOST_PACED: (counts.paced, "paced"),
        HOST_AT_PACE: (counts.at_pace, "at the source's pace"),
    }
    cut = []
    for state in SHOWN_ORDER:
        shown = len(hosts.rows.get(state, ()))
        total, name = active[state]
        if total > shown:
            cut.append(f"{shown} of {total} {name}")
    return cut
