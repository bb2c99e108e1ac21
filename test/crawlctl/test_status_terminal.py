"""The status table: what its rows and caption say, and a table that fits the terminal
(its width, and live, its height)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from redis.asyncio import Redis
from rich.console import Console

from crawlctl.status.model import (
    CrawlStatus,
    SourceStatus,
    View,
    parse_status,
    read_status,
    source_eta,
    totals,
)
from crawlctl.status.terminal import (
    FittedTable,
    backlog_line,
    eta_cell,
    eta_text,
    next_slot_text,
    paused_by_server,
    robots_text,
    status_table,
)
from image_crawler import contract as c
from test.crawlctl.test_status_model import (
    BUSY,
    NOW,
    SORTABLE,
    parsed,
    seed,
    seed_backlog,
    seed_host_index,
    seed_rechecks,
    seed_robots,
    source,
)


@pytest.mark.parametrize(
    ("next_slot_in_s", "rate_rps", "paused"),
    [
        (42.0, 14.0, True),
        (1.5, 14.0, True),  # 1/14 s apart and a 1 s margin: not pacing
        (1.0, 14.0, False),
        (9.0, 0.1, False),  # 0.1/s: one request every 10 s
        (11.5, 0.1, True),
        (42.0, None, False),  # no rate known: cannot tell
        (42.0, 0.0, False),
    ],
)
def test_a_pause_is_a_next_slot_further_than_pacing_puts_it(
    next_slot_in_s: float, rate_rps: float | None, paused: bool
) -> None:
    assert paused_by_server(next_slot_in_s, rate_rps) is paused


@pytest.mark.parametrize(
    ("source", "text"),
    [
        ({"rate": BUSY.to_json().decode(), "pace_next": "1700000042.250000"},
         "Retry-After: next request in 42 s"),
        ({"rate": BUSY.to_json().decode(), "pace_next": "1700000001.000000"}, None),
        ({"rate": BUSY.to_json().decode(), "pace_next": "1699999999.000000"}, None),
        ({"rate": BUSY.to_json().decode()}, None),
        ({"rate": "0.1", "pace_next": "1700000008.250000"}, "next request in 8.0 s"),
        ({"rate": "0.1", "pace_next": "1700000600.250000"},
         "Retry-After: next request in 10 min 0 s"),
        # Halted (effective 0): slots were at most the configured rate apart.
        ({"rate": c.PacingInfo(0, 0.5, "computed", c.PACE_HALTED, "").to_json().decode(),
          "pace_next": "1700000005.250000"}, "Retry-After: next request in 5.0 s"),
        ({"pace_next": "1700000005.250000"}, "next request in 5.0 s"),  # no rate at all
    ],
)  # fmt: skip
def test_next_slot_text(source: dict[str, Any], text: str | None) -> None:
    assert next_slot_text(parsed(source)) == text


@pytest.mark.parametrize(
    ("raw_source", "exempt", "text"),
    [
        ({}, False, "-"),
        ({"disallowed": "12"}, False, "12 disallowed"),
        ({"crawl_delay": "10"}, False, "delay 10 s"),
        ({"crawl_delay": "0.5", "disallowed": "1"}, False, "1 disallowed\ndelay 0.5 s"),
        ({}, True, "exempt"),
        # The monitor ignores an exempt source's delay: so does the view.
        ({"crawl_delay": "10", "disallowed": "3"}, True, "exempt\n3 disallowed"),
        ({"no_index": "4"}, False, "4 noindex"),
        ({"disallowed": "1", "no_index": "2"}, False, "1 disallowed\n2 noindex"),
    ],
)
def test_robots_text(raw_source: dict[str, Any], exempt: bool, text: str) -> None:
    raw = json.dumps(
        {"sources": {"s": raw_source}, "robots_exempt": ["s"] if exempt else [], "now": NOW}
    )
    (source,) = parse_status(raw).sources
    assert robots_text(source) == text


# --- the table -------------------------------------------------------------------------


def render(status: CrawlStatus, width: int = 160) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(status_table(status))
    return console.export_text()


def row(text: str, name: str) -> list[str]:
    """The lines of ``name``'s row: its first line and the ones under it."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(f"{name} "))
    rest = lines[first + 1 :]
    under = next((i for i, line in enumerate(rest) if not line.startswith(" ")), len(rest))
    return [lines[first], *rest[:under]]


async def test_the_table_shows_pacing_counters_histogram_and_state(redis: Redis) -> None:
    await seed(redis)
    text = render(await read_status(redis))
    flickr = row(text, "flickr")
    for cell in ("178 of 178", "178", "configured", "13188", "200=48 500=1 404=1", "running"):
        assert cell in flickr[0]
    assert "at its configured rate" in flickr[1]
    busy = row(text, "busy")
    assert "14 of 50" in busy[0] and "backoff" in busy[0] and "override 50/s" in busy[0]
    assert any(re.search(r"Retry-After: next request in 4[12] s", line) for line in busy), busy
    assert any("cut to 14/s: 3 backoff signals (503)" in line for line in busy)
    met = row(text, "met")
    assert "temp halted, override 5/s" in met[0]
    assert " - " in met[0] and "none" in met[0]  # no rate from the monitor, none paced
    phylopic = row(text, "phylopic")
    assert "0.2" in phylopic[0] and "unknown" in phylopic[0]
    broken = row(text, "broken")
    assert "halted" in broken[0]
    assert "total: 13224 resized, 9 errors, 20000 split, 2 malformed" in text


async def test_the_table_fits_100_columns(redis: Redis) -> None:
    await seed(redis)
    long_why = c.PacingInfo(
        0.1, 200.0, "computed", c.PACE_FLOOR, "held at its floor (0.1/s): " + "why " * 40
    )
    await redis.hset(c.RATES_HASH, "wikimedia_commons", long_why.to_json())
    text = render(await read_status(redis), width=100)
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 100
    # Names and counters whole; the long reason cut short on its own line.
    assert "wikimedia_commons" in text and "13188" in text
    wikimedia = row(text, "wikimedia_commons")
    assert "0.1 of 200" in wikimedia[0] and "floor" in wikimedia[0]
    assert wikimedia[1].rstrip().endswith("…") and len(wikimedia) == 2


async def test_the_table_has_a_robots_column(redis: Redis) -> None:
    await seed(redis)
    await seed_robots(redis)
    text = render(await read_status(redis))
    header = next(line for line in text.splitlines() if line.startswith("source "))
    assert header.rstrip().endswith("robots")
    flickr = row(text, "flickr")
    assert re.search(r"running\s+12 disallowed$", flickr[0].rstrip()), flickr
    assert flickr[1].rstrip().endswith("delay 10 s")
    met = row(text, "met")
    assert met[0].rstrip().endswith("exempt") and met[1].rstrip().endswith("3 disallowed")
    assert not any("delay" in line for line in met)
    assert re.search(r"running\s+4 noindex$", row(text, "nasa")[0].rstrip())
    assert row(text, "typo")[0].rstrip().endswith("exempt")
    assert "robots: URLs its robots.txt disallowed, images not to be indexed" in text


async def test_the_table_has_a_rechecks_column_only_when_there_are_any(redis: Redis) -> None:
    await seed(redis)
    before = render(await read_status(redis))
    assert "re-checks" not in before
    await seed_rechecks(redis)
    text = render(await read_status(redis), width=200)
    header = next(line for line in text.splitlines() if line.startswith("source "))
    assert re.search(r"\serrors\s+re-checks\s+last 50 statuses\s", header), header
    assert re.search(r"\s3\s+unchanged=12 changed=3 gone=1\s+200=48", row(text, "flickr")[0])
    assert re.search(r"\s0\s+unchanged=40 failed=2\s+-\s", row(text, "busy")[0])
    assert re.search(r"\s0\s+-\s+-\s+temp halted", row(text, "met")[0])
    assert (
        "re-checks: unchanged=52 changed=3 gone=6 failed=2 (images of earlier crawls asked again"
        in text
    )


async def test_the_table_has_a_hosts_column_only_when_a_source_has_a_host_index(
    redis: Redis,
) -> None:
    await seed(redis)
    assert "hosts" not in render(await read_status(redis))
    await seed_host_index(redis, "busy")
    text = render(await read_status(redis), width=220)
    header = next(line for line in text.splitlines() if line.startswith("source "))
    assert re.search(r"\sstate\s+hosts\s+robots", header), header
    busy = row(text, "busy")
    assert re.search(r"\s3 active\s", busy[0]), busy
    assert "1 paced, 1 backed off" in busy[1]
    assert re.search(r"\s-\s+-\s*$", row(text, "flickr")[0])  # no index; no robots
    assert (
        "hosts: 3 asked about in the last minute, 1 paced below their source's rate, "
        "1 backed off, 0 halted (image-crawler status --hosts SOURCE lists them)"
    ) in " ".join(text.split())


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.2, "1s"),  # never "0s" while something waits
        (42.4, "42s"),
        (60, "1m"),
        (750, "12m30s"),
        (3599.6, "1h"),  # rounded into the next unit
        (3600, "1h"),
        (11_520, "3h12m"),
        (11_549, "3h12m"),
        (11_550, "3h13m"),
        (86_399.9, "1d"),
        (86_400 * 4, "4d"),
        (86_400 * 4 + 3 * 3600 + 59, "4d3h"),
        (86_400 * 4 + 3 * 3600 + 1800, "4d4h"),
        (86_400 * 9.99, "10d"),
        (86_400 * 10, "10d"),
        (86_400 * 27.5, "28d"),
    ],
)
def test_eta_text(seconds: float, text: str) -> None:
    assert eta_text(seconds) == text


HALTED_PACING = c.PacingInfo(0.0, 5.0, "computed", c.PACE_HALTED, "in halted")


@pytest.mark.parametrize(
    ("fields", "cell"),
    [
        ({"backlog": 7200, "rate_rps": 2.0}, "1h"),
        ({"backlog": 0, "rate_rps": 2.0}, "—"),
        ({"backlog": 10, "rate_rps": 2.0, "halted": True}, "halted"),  # whatever rate was set
        ({"backlog": 10, "rate_rps": 2.0, "temp_halted": True}, "halted"),
        ({"backlog": 10, "rate_rps": 0.0, "pacing": HALTED_PACING}, "halted"),
        ({"backlog": 10, "rate_rps": 0.0}, "never"),  # an override of 0
        ({"backlog": 10}, "?"),  # no rate published
    ],
)
def test_a_sources_eta_cell(fields: dict[str, Any], cell: str) -> None:
    assert eta_cell(source_eta(source("s", **fields))) == cell


@pytest.mark.parametrize(
    ("age_s", "fragment"),
    [
        (None, "backlog: not measured (backlog_measured_at is not set"),
        (7.0, "backlog: 20 URLs, measured 7.0 s ago; ETA 10s (the slowest source: b)"),
        (59.0, "measured 59 s ago; ETA"),
        (61.0, "measured 61 s ago (stale: is the monitor running?); ETA"),
        (3600.0, "measured 60 min 0 s ago (stale: is the monitor running?)"),
    ],
)
def test_the_backlog_line_says_how_old_the_measurement_is(
    age_s: float | None, fragment: str
) -> None:
    status = CrawlStatus(
        sources=tuple(SORTABLE[:2]),
        num_resized=0,
        resize_errors=0,
        num_split=0,
        num_malformed=0,
        backlog_age_s=age_s,
    )
    assert fragment in backlog_line(status, totals(status.sources))


def test_the_backlog_line_names_what_never_drains() -> None:
    status = CrawlStatus(tuple(SORTABLE), 0, 0, 0, 0, backlog_age_s=1.0)
    assert backlog_line(status, totals(status.sources)) == (
        "backlog: 23 URLs, measured 1.0 s ago; ETA 10s (the slowest source: b); 3 URLs of 1 "
        "source(s) at rate 0 (halted or stopped) never drain until resumed"
    )


def row_names(text: str) -> list[str]:
    """The sources of the rows, in order (the header and caption lines left out)."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("source "))
    return [m.group(1) for line in lines[header + 1 :] if (m := re.match(r"^(\S+)\s{2,}", line))]


async def test_the_table_shows_backlog_eta_reasons_and_lost_urls(redis: Redis) -> None:
    await seed_backlog(redis)
    text = render(await read_status(redis), width=200)
    header = next(line for line in text.splitlines() if line.startswith("source "))
    assert re.match(r"source\s+backlog\s+ETA\s+rate/s\s+pace_rate\s+pacing\s+ok\s+errors", header)
    flickr = row(text, "flickr")
    assert re.match(r"flickr\s+2055000\s+3h12m\s+178 of 178\s", flickr[0]), flickr
    assert "500=2 404=1" in flickr[1]
    busy = row(text, "busy")
    assert re.match(r"busy\s+50400\s+1h\s+14 of 50\s", busy[0]), busy
    assert re.match(r"\s+lost 120\s", busy[1]) and "503=40 500=9 Timeout=9" in busy[1]
    assert re.match(r"broken\s+300\s+halted\s", row(text, "broken")[0])
    assert re.match(r"met\s+0\s+—\s", row(text, "met")[0])
    assert re.match(r"orphan\s+12\s+\?\s", row(text, "orphan")[0])
    assert re.match(r"phylopic\s+0.2\s", row(text, "phylopic")[0])  # not measured: blank
    # The rows come by backlog, largest first.
    assert row_names(text) == ["flickr", "busy", "broken", "orphan", "met", "phylopic"]
    assert "backlog: 2105712 URLs, measured 7" in text
    assert "ETA 3h12m (the slowest source: flickr); 300 URLs of 1 source(s) at rate 0" in text
    assert "errors by reason: 503=40 500=11 Timeout=9 404=1 ConnectionError=1" in text
    assert "lost: 120 URLs deleted from urls.* topics before a worker read them" in text


async def test_top_shows_the_first_n_and_says_how_many_are_hidden(redis: Redis) -> None:
    await seed_backlog(redis)
    status = await read_status(redis)
    console = Console(width=200, record=True, color_system=None)
    console.print(status_table(status, sort="errors", top=2))
    text = console.export_text()
    assert row_names(text) == ["flickr", "broken"]  # 3 errors, then 0 each: by name
    assert "showing 2 of 6 sources by errors (4 more hidden: --top, --sort)" in text
    # The totals are the whole crawl's, not the rows'.
    assert "backlog: 2105712 URLs" in text


# --- a table that fits the terminal ------------------------------------------------------


def render_fitted(status: CrawlStatus, width: int) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(FittedTable(status))
    return console.export_text()


async def test_a_narrow_terminal_hides_the_least_useful_columns_not_words(redis: Redis) -> None:
    await seed_backlog(redis)
    await seed_robots(redis)
    long_why = c.PacingInfo(
        0.1, 200.0, "computed", c.PACE_FLOOR, "held at its floor: " + "why " * 40
    )
    await redis.hset(c.RATES_HASH, "wikimedia_commons", long_why.to_json())
    await redis.hset(c.BACKLOG_HASH, "wikimedia_commons", 123_456_789)
    status = await read_status(redis)

    wide = render_fitted(status, 200)
    assert "too narrow" not in wide and "last 50 statuses" in wide
    assert wide == render(status, width=200)  # as status_table draws it

    narrow = render_fitted(status, 100)
    assert "too narrow for: last 50 statuses, pace_rate, robots (a wider terminal or " in narrow
    header = next(line for line in narrow.splitlines() if line.startswith("source "))
    assert "pace_rate" not in header and "robots" not in header
    for width in range(100, 201, 10):
        text = render_fitted(status, width)
        assert max(len(line.rstrip()) for line in text.splitlines()) <= width
        # Every word whole: names, counts, states; only the reasons' lines are cut.
        wikimedia = row(text, "wikimedia_commons")
        assert re.match(
            r"wikimedia_commons\s+123456789\s+14289d\s+0.1 of 200\s+(none\s+)?floor\s", wikimedia[0]
        )
        assert re.search(r"\sconfigured\s+13188\s+3\s", row(text, "flickr")[0])
        assert {"backoff", "Retry-After:", "running,", "override", "50/s"} <= words(text, "busy")
        assert {"temp", "halted,", "override", "5/s"} <= words(text, "met")


async def test_a_narrow_terminal_hides_the_rechecks_after_the_last_50_statuses(
    redis: Redis,
) -> None:
    await seed_backlog(redis)
    await seed_robots(redis)
    await seed_rechecks(redis)
    status = await read_status(redis)
    wide = render_fitted(status, 220)
    assert "too narrow" not in wide and "unchanged=12 changed=3 gone=1" in row(wide, "flickr")[0]
    hidden = []
    for width in range(220, 79, -5):
        text = render_fitted(status, width)
        assert max(len(line.rstrip()) for line in text.splitlines()) <= width
        if match := re.search(r"too narrow for: ([^(]+) \(", text):
            hidden.append(match.group(1))
    order = "last 50 statuses, re-checks, pace_rate, robots"
    assert hidden and all(order.startswith(h) for h in hidden), hidden
    assert hidden[-1] == order
    # The crawl's re-checks stay in the caption.
    assert "re-checks: unchanged=52 changed=3 gone=6 failed=2" in render_fitted(status, 80)


def words(text: str, name: str) -> set[str]:
    return {word for line in row(text, name) for word in line.split()}


def many_sources(count: int) -> CrawlStatus:
    backoff = c.PacingInfo(1.5, 2.0, "computed", c.PACE_BACKOFF, "cut to 1.5/s: 3 signals (503)")
    return CrawlStatus(
        tuple(
            source(f"s{i:04d}", backlog=i * 10, rate_rps=1.5, pacing=backoff, errors=i)
            for i in range(count)
        ),
        0,
        0,
        0,
        0,
        backlog_age_s=3.0,
    )


@pytest.mark.parametrize("height", [12, 24, 50])
def test_the_live_table_shows_the_rows_that_leave_its_totals_on_the_screen(height: int) -> None:
    status = many_sources(1000)
    console = Console(width=120, height=height, record=True, color_system=None)
    console.print(FittedTable(status, fit_height=True))
    lines = console.export_text().splitlines()
    names = row_names("\n".join(lines))
    assert len(lines) <= height or len(names) == 1  # one row at least
    assert names == [f"s{i:04d}" for i in range(999, 999 - len(names), -1)]  # by backlog
    text = "\n".join(lines)
    assert "backlog: 4995000 URLs, measured 3.0 s ago" in text
    assert f"showing {len(names)} of 1000 sources by backlog" in text
    if height >= 24:
        assert len(names) >= (height - 14) // 2  # not needlessly few


def test_a_top_is_kept_in_the_live_table() -> None:
    console = Console(width=120, height=20, record=True, color_system=None)
    console.print(FittedTable(many_sources(100), View(top=30), fit_height=True))
    assert len(row_names(console.export_text())) == 30  # asked for: cropped by Live


def test_an_empty_status_fits_anywhere() -> None:
    empty = CrawlStatus((), 0, 0, 0, 0)
    text = render_fitted(empty, 80)
    assert "(no source yet)" in text and "backlog: not measured" in text


@pytest.mark.parametrize(
    ("sources", "eta_s", "fragment"),
    [
        ([source("a", backlog=0, rate_rps=1.0)], 0.0, "ETA —"),
        ([source("a", backlog=0, rate_rps=1.0), source("x", backlog=4)], 0.0, "ETA —; 1 source"),
        ([source("a", backlog=5, rate_rps=0.0, halted=True)], None, "ETA never; 5 URLs of 1"),
        ([source("a", backlog=5, rate_rps=0.0), source("b", backlog=10, rate_rps=5.0)], 2.0,
         "ETA 2s (the slowest source: b); 5 URLs of 1 source(s) at rate 0"),
    ],
)  # fmt: skip
def test_the_crawls_eta_leaves_out_what_never_drains(
    sources: list[SourceStatus], eta_s: float | None, fragment: str
) -> None:
    total = totals(sources)
    assert total.eta_s == eta_s
    status = CrawlStatus(tuple(sources), 0, 0, 0, 0, backlog_age_s=1.0)
    assert fragment in backlog_line(status, total)
