"""The dashboard at ``/`` of the monitor's METRICS_PORT, in a real browser.

Headless Chromium (Debian's package; the ``chromium`` fixture installs it with apt-get
when it is missing) is driven through the DevTools protocol (test/harness/dashboard_browser.py).

- The page as served: nothing from outside it, and a Content-Security-Policy that allows
  exactly its inline blocks (checked on the text, and in the browser: an injected script
  and a fetch to another origin are refused).
- Against a monitor's ``/metrics`` made up by the test (1,000 sources, odd names, halted
  and unrated sources, re-checks by status): every row and total as ``/metrics`` says;
  throughput once the counters move, steady when the monitor refreshes them less often
  than the page reads, 0 once they stop; sorting by a click on a header, the filter box;
  the "cannot reach the monitor" state when the server goes away, and a standby monitor
  when it is back.
- The DNS panel, against a made-up monitor: a row per worker as ``/metrics`` says (one
  that stopped reporting dimmed and said stale), the sum of those reporting, the URLs
  ended as DnsError; the empty state before any report.
- During a real crawl (the monitor, a worker, a local origin, one source halted by its
  breaker, one on ``localhost`` so that its worker's resolver has a name to look up,
  re-check counters written into Redis): the sources and their values, and the worker's
  DNS row, as the monitor's ``/metrics`` says, the row gone once the worker has stopped;
  sorting, no console error, no request to another origin;
  the screenshot is saved to the test's directory, and to ``DASHBOARD_SCREENSHOT``
  when that is set (how ``docs/dashboard.png`` is made; the crawl then runs longer so
  that the chart has more to show).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import html.parser
import json
import math
import os
import re
import signal
import socket
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from crawl_monitor import dashboard
from image_crawler import contract as c
from image_crawler.metrics import serving
from test.harness.crawl import Crawl, sources_file, tiny_jpeg
from test.harness.dashboard_browser import (
    Browser,
    NoBrowser,
    Tab,
    find_or_install_chromium,
    other_origins,
)
from test.harness.processes import CrawlerProcess
from test.harness.services import produce, wait_for

# The first test may wait for `apt-get install chromium` (and `apt-get update`).
pytestmark = pytest.mark.timeout(900)

LOOPBACK = "127.0.0.1"
VIEWPORT = (1360, 900)
# The page's polling interval in these tests (?every=, seconds).
EVERY_S = 1
COLUMNS = [
    "source",
    "configured",
    "effective",
    "backlog",
    "eta",
    "successes",
    "errors",
    "noIndex",
    "rechecks",
    "duplicates",
    "hosts",
    "state",
]
STATE = COLUMNS.index("state")
TOTALS = ["successes", "errors", "throughput", "backlog", "eta", "sources", "split", "rechecks"]

# What the page shows, read in one go: the state, the totals, and the table as displayed.
READ_PAGE = """(() => {
  const root = document.documentElement;
  const text = (id) => document.getElementById(id).textContent;
  return {
    state: root.dataset.state,
    status: text("status"),
    polls: Number(root.dataset.polls || 0),
    renderMs: Number(root.dataset.renderMs || 0),
    totals: Object.fromEntries(TOTALS.map((id) => [id, text(id)])),
    subs: Object.fromEntries(TOTALS.map((id) => [id, text(id + "-sub")])),
    columns: [...document.querySelectorAll("#head th")].map((th) => th.dataset.key),
    sort: [...document.querySelectorAll("#head th")]
      .filter((th) => th.getAttribute("aria-sort") !== "none")
      .map((th) => [th.dataset.key, th.getAttribute("aria-sort")])[0] || null,
    rows: [...document.querySelectorAll("#rows tr:not(.empty-row)")]
      .map((tr) => [...tr.cells].map((td) => td.textContent)),
    shown: text("shown"),
    chartLines: document.querySelectorAll("#chart path.total").length,
    dns: [...document.querySelectorAll("#dns-rows tr")]
      .map((tr) => [tr.className, ...[...tr.cells].map((td) => td.textContent)]),
    dnsNote: text("dns-note"),
  };
})()""".replace("TOTALS", json.dumps(TOTALS))


# --- what an operator reads: the page's formatting, stated once here ---------------------

# Shown where a value is not known (yet).
NONE = "\N{EN DASH}"


def half_up(value: float, places: int = 0) -> Decimal:
    """``value`` rounded as ``Intl.NumberFormat`` does in Chromium: its shortest decimal
    form (``repr``), halves away from zero (Python's ``round`` takes halves to even)."""
    return Decimal(repr(value)).quantize(Decimal(1).scaleb(-places), ROUND_HALF_UP)


def fmt_int(value: float | None) -> str:
    if value is None or math.isnan(value):
        return NONE
    return "∞" if math.isinf(value) else f"{half_up(value):,}"


def fmt_rate(value: float | None) -> str:
    """Two decimals at most below 10, one below 100, none above; no trailing zero."""
    if value is None or math.isnan(value):
        return NONE
    if math.isinf(value):
        return "∞"
    places = 2 if value < 10 else 1 if value < 100 else 0
    rounded = half_up(value, places)
    return f"{rounded:,f}".rstrip("0").rstrip(".") if places else f"{rounded:,}"


UNITS = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return NONE
    if math.isinf(seconds):
        return "∞"
    rest = math.floor(seconds + 0.5)  # Math.round
    if rest <= 0:
        return "0 s"
    i = next(i for i, (_, size) in enumerate(UNITS) if rest >= size)
    unit, size = UNITS[i]
    major = rest // size
    if i + 1 == len(UNITS):
        return f"{major} {unit}"
    minor_unit, minor_size = UNITS[i + 1]
    minor = (rest - major * size) // minor_size
    return f"{major} {unit} {minor} {minor_unit}" if minor else f"{major} {unit}"


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0 s"),
        (0.4, "0 s"),
        (42, "42 s"),
        (60, "1 min"),
        (725, "12 min 5 s"),
        (3600, "1 h"),
        (18720, "5 h 12 min"),
        (86400 * 27 + 3 * 3600 + 59, "27 d 3 h"),
        (math.inf, "∞"),
        (None, NONE),
    ],
)
def test_durations_read_in_two_units(seconds: float | None, shown: str) -> None:
    assert fmt_duration(seconds) == shown


# The metric of re-checks by status, and the key its samples get among a source's values.
RECHECKS = "crawler_source_rechecks_total"
RECHECK_KEY = "rechecks:"


def fmt_rechecks(values: Mapping[str, float]) -> str:
    """``"12 unchanged · 3 changed · 1 gone"``: the statuses of ``values``'
    ``rechecks:{status}`` keys with any, the contract's first and in its order."""
    counts = {
        k.removeprefix(RECHECK_KEY): v for k, v in values.items() if k.startswith(RECHECK_KEY)
    }
    order = [*c.RECHECK_STATUSES, *sorted(set(counts) - set(c.RECHECK_STATUSES))]
    return " · ".join(f"{fmt_int(counts[s])} {s}" for s in order if counts.get(s, 0) > 0)


# The metric of the deduplication stage's placements by kind, and the key its samples get
# among a source's values.
PLACEMENTS = "crawler_source_dedup_placements_total"
PLACEMENT_KEY = "placements:"
DUPLICATE_KINDS = ("exact", "near")


def fmt_duplicates(values: Mapping[str, float]) -> str:
    """``"10 exact · 2 near (4.1 %)"``: the duplicates of ``values``' ``placements:{kind}``
    keys, the kinds with any, and their share of all placed; "0 (0.0 %)" for none of
    them; "" before any placement."""
    counts = {
        k.removeprefix(PLACEMENT_KEY): v for k, v in values.items() if k.startswith(PLACEMENT_KEY)
    }
    placed = sum(v for v in counts.values() if v > 0)
    if not placed:
        return ""
    found = sum(max(counts.get(k, 0), 0) for k in DUPLICATE_KINDS)
    kinds = [f"{fmt_int(counts[k])} {k}" for k in DUPLICATE_KINDS if counts.get(k, 0) > 0]
    return f"{' · '.join(kinds) or '0'} ({half_up(100 * found / placed, 1)} %)"


# The metric of host counts by state, and the key its samples get among a source's values.
HOSTS = "crawler_source_hosts"
HOST_KEY = "hosts:"


def fmt_hosts(values: Mapping[str, float]) -> str:
    """``"1,254 active · 40 paced · 10 backed off · 4 halted"``, the states with none
    left out; "" without an ``active`` count (no host index)."""
    if f"{HOST_KEY}active" not in values:
        return ""
    parts = [f"{fmt_int(values[f'{HOST_KEY}active'])} active"]
    for state in ("paced", "backed_off", "halted"):
        if values.get(f"{HOST_KEY}{state}", 0) > 0:
            parts.append(f"{fmt_int(values[f'{HOST_KEY}{state}'])} {state.replace('_', ' ')}")
    return " · ".join(parts)


def recheck_totals(text: str) -> dict[str, float]:
    """Every source's re-checks in a ``/metrics`` text, summed by status."""
    totals: dict[str, float] = {}
    for values in per_source(text)[0].values():
        for key, value in values.items():
            if key.startswith(RECHECK_KEY):
                totals[key] = totals.get(key, 0) + value
    return totals


def expected_row(source: str, values: Mapping[str, float]) -> list[str]:
    """A table row as the page shows a source whose metrics are ``values``."""
    state = ""
    if values.get("permanent") == 1:
        state = "permanent"
    elif values.get("halted") == 1:
        state = "temporary"
    eta = NONE if values.get("backlog") == 0 else fmt_duration(values.get("eta"))
    return [
        source,
        fmt_rate(values.get("configured")),
        fmt_rate(values.get("effective")),
        fmt_int(values.get("backlog")),
        eta,
        fmt_int(values.get("successes")),
        fmt_int(values.get("errors")),
        fmt_int(values.get("no_index")),
        fmt_rechecks(values),
        fmt_duplicates(values),
        fmt_hosts(values),
        state,
    ]


PER_SOURCE = {
    "crawler_source_configured_requests_per_second": "configured",
    "crawler_source_effective_requests_per_second": "effective",
    "crawler_source_backlog_urls": "backlog",
    "crawler_source_eta_seconds": "eta",
    "crawler_source_halted": "halted",
    "crawler_source_permanently_halted": "permanent",
    "crawler_source_successes_total": "successes",
    "crawler_source_errors_total": "errors",
    "crawler_source_no_index_total": "no_index",
    "crawler_source_dns_errors_total": "dns_errors",
}


def per_source(text: str) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """The per-source values and the unlabelled samples of a ``/metrics`` text, read with
    prometheus-client's own parser."""
    sources: dict[str, dict[str, float]] = {}
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == RECHECKS:
                key = RECHECK_KEY + sample.labels["status"]
                sources.setdefault(sample.labels["source"], {})[key] = sample.value
            elif sample.name == PLACEMENTS:
                key = PLACEMENT_KEY + sample.labels["kind"]
                sources.setdefault(sample.labels["source"], {})[key] = sample.value
            elif sample.name == HOSTS:
                key = HOST_KEY + sample.labels["state"]
                sources.setdefault(sample.labels["source"], {})[key] = sample.value
            elif sample.name in PER_SOURCE:
                sources.setdefault(sample.labels["source"], {})[PER_SOURCE[sample.name]] = (
                    sample.value
                )
            elif not sample.labels:
                totals[sample.name] = sample.value
    return sources, totals


def expected_rows(text: str) -> dict[str, list[str]]:
    sources, _ = per_source(text)
    return {name: expected_row(name, values) for name, values in sources.items()}


# The page's DNS_STALE_S (the monitor's): a worker whose report is older is stale.
DNS_KINDS = ("nxdomain", "nodata", "servfail", "timeout", "refused", "other")
WORKER_DNS = {
    "crawler_worker_dns_queries_total": "queries",
    "crawler_worker_dns_cache_hits_total": "hits",
    "crawler_worker_dns_names_cached": "cached",
    "crawler_worker_dns_report_age_seconds": "age",
}
NO_DNS_YET = [["empty-row", "No worker has reported its resolver yet."]]


def fmt_failures(failures: Mapping[str, float]) -> str:
    """``"50 nxdomain · 11 timeout"``, the resolver's kinds first; "none" for none."""
    order = [*DNS_KINDS, *sorted(set(failures) - set(DNS_KINDS))]
    shown = [f"{fmt_int(failures[k])} {k}" for k in order if failures.get(k, 0) > 0]
    return " · ".join(shown) or "none"


def fmt_ratio(hits: float, queries: float) -> str:
    lookups = hits + queries
    return f"{half_up(100 * hits / lookups, 1)} %" if lookups else NONE


def workers_dns(text: str) -> dict[str, dict[str, Any]]:
    """Each worker's DNS values in a ``/metrics`` text (failures by kind under
    ``failures``)."""
    workers: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            worker = sample.labels.get("worker")
            if worker is None:
                continue
            values = workers.setdefault(worker, {"failures": {}})
            if sample.name == "crawler_worker_dns_failures_total":
                values["failures"][sample.labels["kind"]] = sample.value
            elif sample.name in WORKER_DNS:
                values[WORKER_DNS[sample.name]] = sample.value
    return workers


def dns_cells(name: str, values: Mapping[str, Any]) -> list[str]:
    queries, hits = values.get("queries", 0), values.get("hits", 0)
    return [
        name,
        fmt_int(values.get("queries")),
        fmt_int(values.get("hits")),
        fmt_ratio(hits, queries),
        fmt_int(values.get("cached")),
        fmt_failures(values["failures"]),
    ]


def expected_dns(text: str) -> tuple[list[list[str]], str]:
    """The DNS panel's rows (class first, then the cells) and note for a ``/metrics``
    text: a row per worker by name, then the workers reporting now summed."""
    rows: list[list[str]] = []
    total: dict[str, Any] = {"queries": 0.0, "hits": 0.0, "cached": 0.0, "failures": {}}
    reporting = 0
    for worker, values in sorted(workers_dns(text).items()):
        stale = not values.get("age", math.inf) <= c.DNS_STALE_S
        when = f"{fmt_duration(values.get('age'))} ago"
        rows.append(["stale" if stale else "", *dns_cells(worker, values)])
        rows[-1].append(f"stale · {when}" if stale else when)
        if not stale:
            reporting += 1
            for key in ("queries", "hits", "cached"):
                total[key] += values.get(key, 0)
            for kind, n in values["failures"].items():
                total["failures"][kind] = total["failures"].get(kind, 0) + n
    if reporting:
        rows.append(["total", *dns_cells(f"all workers ({reporting} reporting)", total), ""])
    sources, _ = per_source(text)
    ended = (
        f"{fmt_int(sum(v.get('dns_errors', 0) for v in sources.values()))} URLs ended as DnsError"
    )
    note = (
        f"{fmt_ratio(total['hits'], total['queries'])} from cache · {ended}" if reporting else ended
    )
    return (rows or NO_DNS_YET), note


# --- the page as served ------------------------------------------------------------------


class _Tags(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def test_the_page_loads_nothing_from_outside_and_its_policy_allows_only_its_own_blocks() -> None:
    served = dashboard.page()
    text = served.body.decode()
    parser = _Tags()
    parser.feed(text)
    tags = parser.tags
    # One script and one style sheet, inline: no attribute, so no src.
    assert [(t, a) for t, a in tags if t in ("script", "style")] == [("style", {}), ("script", {})]
    # Nothing that fetches: no src, no href except the icon's own bytes, no style attribute
    # (a CSP with hashes refuses those), no inline event handler.
    for tag, attrs in tags:
        assert "src" not in attrs and "style" not in attrs, tag
        assert not any(name.startswith("on") for name in attrs), tag
        if "href" in attrs:
            assert (tag, attrs.get("rel")) == ("link", "icon") and attrs["href"].startswith("data:")
    # The only absolute URL is the SVG namespace, a name and never fetched.
    assert set(re.findall(r"https?://[^\s'\"`)]+", text)) == {"http://www.w3.org/2000/svg"}
    assert "innerHTML" not in text and "eval(" not in text

    csp = dict(
        d.strip().split(" ", 1) for d in served.headers["Content-Security-Policy"].split(";")
    )
    hashes = dashboard.inline_hashes(text)
    assert csp["default-src"] == "'none'"
    assert csp["script-src"] == " ".join(hashes["script"]) and len(hashes["script"]) == 1
    assert csp["style-src"] == " ".join(hashes["style"]) and len(hashes["style"]) == 1
    assert csp["connect-src"] == "'self'"
    assert csp["img-src"] == "data:"
    assert "unsafe" not in served.headers["Content-Security-Policy"]
    assert served.headers["X-Content-Type-Options"] == "nosniff"


# --- a made-up monitor -------------------------------------------------------------------


@dataclasses.dataclass
class SourceState:
    configured: float = 5.0
    effective: float = 5.0
    backlog: float | None = 100.0
    eta: float | None = 20.0
    halted: int = 0
    permanent: int = 0
    successes: int = 0
    errors: int = 0
    no_index: int = 0
    dns_errors: int = 0
    # status -> count, a sample each (the monitor's has none for a status never seen).
    rechecks: dict[str, int] = dataclasses.field(default_factory=dict)
    # state -> count (active, paced, backed_off, halted); empty: no host index.
    hosts: dict[str, int] = dataclasses.field(default_factory=dict)
    # kind -> count (exact, near, unique); empty: the stage placed none of its images.
    placements: dict[str, int] = dataclasses.field(default_factory=dict)


class MadeUpMonitor:
    """A collector that says what the test sets, under the monitor's metric names."""

    def __init__(self, sources: Mapping[str, SourceState]) -> None:
        self.sources = dict(sources)
        # worker -> its DNS figures (queries, hits, cached, age, failures by kind).
        self.dns: dict[str, dict[str, Any]] = {}
        self.split = 0
        self.measured_at = time.time()
        self.leading = True

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        def family(kind: type, name: str, field: str) -> Metric:
            metric = kind(name, f"made up: {field}", labels=["source"])
            for source, state in self.sources.items():
                value = getattr(state, field)
                if value is not None:
                    metric.add_metric([source], value)
            return metric

        yield family(
            GaugeMetricFamily, "crawler_source_configured_requests_per_second", "configured"
        )
        yield family(GaugeMetricFamily, "crawler_source_effective_requests_per_second", "effective")
        yield family(GaugeMetricFamily, "crawler_source_backlog_urls", "backlog")
        yield family(GaugeMetricFamily, "crawler_source_eta_seconds", "eta")
        yield family(GaugeMetricFamily, "crawler_source_halted", "halted")
        yield family(GaugeMetricFamily, "crawler_source_permanently_halted", "permanent")
        yield family(CounterMetricFamily, "crawler_source_successes", "successes")
        yield family(CounterMetricFamily, "crawler_source_errors", "errors")
        yield family(CounterMetricFamily, "crawler_source_no_index", "no_index")
        yield family(CounterMetricFamily, "crawler_source_dns_errors", "dns_errors")
        yield from self._dns()
        rechecks = CounterMetricFamily(
            RECHECKS.removesuffix("_total"), "made up: rechecks", labels=["source", "status"]
        )
        for source, state in self.sources.items():
            for status, count in state.rechecks.items():
                rechecks.add_metric([source, status], count)
        yield rechecks
        placements = CounterMetricFamily(
            PLACEMENTS.removesuffix("_total"), "made up: placements", labels=["source", "kind"]
        )
        for source, state in self.sources.items():
            for kind, count in state.placements.items():
                placements.add_metric([source, kind], count)
        yield placements
        hosts = GaugeMetricFamily(HOSTS, "made up: hosts", labels=["source", "state"])
        for source, state in self.sources.items():
            for name, count in state.hosts.items():
                hosts.add_metric([source, name], count)
        yield hosts
        states = list(self.sources.values())
        backlog = sum(s.backlog or 0 for s in states)
        etas = [s.eta for s in states if s.eta is not None]
        yield CounterMetricFamily("crawler_successes", "", value=sum(s.successes for s in states))
        yield CounterMetricFamily("crawler_errors", "", value=sum(s.errors for s in states))
        yield CounterMetricFamily("crawler_split", "", value=self.split)
        yield GaugeMetricFamily("crawler_backlog_urls", "", value=backlog)
        yield GaugeMetricFamily("crawler_eta_seconds", "", value=max(etas, default=0))
        yield GaugeMetricFamily("crawler_sources", "", value=len(states))
        yield GaugeMetricFamily(
            "crawler_backlog_measured_timestamp_seconds", "", value=self.measured_at
        )
        yield GaugeMetricFamily("crawler_monitor_leading", "", value=int(self.leading))

    def _dns(self) -> Iterable[Metric]:
        for name, field in WORKER_DNS.items():
            kind = CounterMetricFamily if name.endswith("_total") else GaugeMetricFamily
            metric = kind(name.removesuffix("_total"), f"made up: {field}", labels=["worker"])
            for worker, values in self.dns.items():
                metric.add_metric([worker], values[field])
            yield metric
        failures = CounterMetricFamily(
            "crawler_worker_dns_failures", "made up: failures", labels=["worker", "kind"]
        )
        for worker, values in self.dns.items():
            for kind_of, count in values["failures"].items():
                failures.add_metric([worker, kind_of], count)
        yield failures


@contextlib.asynccontextmanager
async def made_up_monitor(monitor: MadeUpMonitor, port: int = 0) -> AsyncIterator[int]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(monitor)  # type: ignore[arg-type]
    async with serving(port, LOOPBACK, registry, routes=dashboard.routes()) as bound:
        assert bound is not None
        yield bound


async def scrape(port: int) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://{LOOPBACK}:{port}/metrics") as response,
    ):
        assert response.status == 200
        return await response.text()


def thousand_sources() -> dict[str, SourceState]:
    sources = {
        f"source{i:04d}": SourceState(
            configured=0.2 + i * 0.7,
            effective=0.2 + i * 0.35,
            backlog=float(i * 37 % 5000),
            eta=(i * 37 % 5000) / (0.2 + i * 0.35),
            successes=i * 1234,
            errors=i * 7 % 50,
            no_index=i * 3 % 7,
            # One in five re-checked; some statuses at 0, which the page leaves out.
            rechecks=(
                {"unchanged": i * 11, "changed": i % 4, "gone": i % 3, "failed": i % 2}
                if i % 5 == 0
                else {}
            ),
        )
        for i in range(996)
    }
    # A status the page does not know yet comes after the contract's.
    sources["source0010"].rechecks["moved"] = 2
    # Placements: one in four sources placed by the deduplication stage; some with no
    # duplicate at all, some with no unique image.
    for i in range(0, 996, 4):
        sources[f"source{i:04d}"].placements = {
            kind: n for kind, n in (("exact", i % 3), ("near", i % 5), ("unique", i % 7 * 10)) if n
        }
    # Hosts: one in seven sources has a host index.
    for i in range(0, 996, 7):
        sources[f"source{i:04d}"].hosts = {
            "active": i * 13,
            "paced": i % 5,
            "backed_off": i % 3,
            "halted": i % 2,
        }
    sources["halted-for-now"] = SourceState(effective=0, halted=1, eta=math.inf, errors=80)
    sources["halted-for-good"] = SourceState(
        effective=0, halted=1, permanent=1, eta=math.inf, errors=500
    )
    sources["caught-up"] = SourceState(backlog=0, eta=0, successes=10**7)
    # Not an actual source name (those are topic names); the page must show it as text.
    sources['<img src=x onerror="window.owned=1">"\\'] = SourceState(backlog=None, eta=None)
    return sources


# --- the browser ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def chromium() -> str:
    started = time.monotonic()
    try:
        found = find_or_install_chromium()
    except NoBrowser as e:
        pytest.skip(str(e))
    print(f"\nchromium: {found} (found or installed in {time.monotonic() - started:.1f} s)")
    return found


@pytest.fixture
def browser(chromium: str, tmp_path: Path) -> Iterator[Browser]:
    started = Browser(chromium, tmp_path / "chromium-profile", VIEWPORT)
    started.start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
async def tab(browser: Browser) -> AsyncIterator[Tab]:
    async with aiohttp.ClientSession() as session, browser.tab(session) as opened:
        await opened.send(
            "Emulation.setDeviceMetricsOverride",
            width=VIEWPORT[0],
            height=VIEWPORT[1],
            deviceScaleFactor=1,
            mobile=False,
        )
        yield opened


async def read_page(tab: Tab) -> dict[str, Any]:
    page: dict[str, Any] = await tab.evaluate(READ_PAGE)
    return page


async def open_dashboard(tab: Tab, port: int) -> str:
    """Open the dashboard on ``port``; returns once it has shown a first reading."""
    origin = f"http://{LOOPBACK}:{port}"
    await tab.navigate(f"{origin}/?every={EVERY_S}")
    await tab.wait_until(
        "document.documentElement.dataset.state === 'live'", 30, "the page's first reading"
    )
    return origin


def assert_clean(tab: Tab, origin: str) -> None:
    """No console error, no exception, nothing asked of another origin."""
    assert tab.problems() == []
    assert other_origins(tab.requested_urls(), origin) == []


@pytest.mark.timing("asserts the throughput the page computes from its 1 s timer within 300-1200/s")
async def test_a_thousand_sources_show_as_metrics_says_and_throughput_follows_the_counters(
    tab: Tab,
) -> None:
    monitor = MadeUpMonitor(thousand_sources())
    async with made_up_monitor(monitor) as port:
        origin = await open_dashboard(tab, port)
        text = await scrape(port)
        expected = expected_rows(text)
        assert len(expected) == 1000

        page = await tab.wait_until(
            f"(() => {{ const p = {READ_PAGE}; return p.rows.length === 1000 && p; }})()",
            10,
            "a row per source",
        )
        print(f"\nrender of 1,000 sources (fetch, parse, table, chart): {page['renderMs']:.1f} ms")
        assert page["columns"] == COLUMNS
        assert {row[0]: row for row in page["rows"]} == expected
        # Largest backlog first; a source without one yet comes last.
        assert page["sort"] == ["backlog", "descending"]
        backlogs = [monitor.sources[row[0]].backlog for row in page["rows"]]
        assert backlogs[-1] is None
        assert backlogs[:-1] == sorted(backlogs[:-1], reverse=True)  # type: ignore[type-var]
        assert await tab.evaluate("window.owned === undefined")

        _, totals = per_source(text)
        assert page["totals"]["successes"] == fmt_int(totals["crawler_successes_total"])
        assert page["totals"]["errors"] == fmt_int(totals["crawler_errors_total"])
        assert page["totals"]["backlog"] == fmt_int(totals["crawler_backlog_urls"])
        assert page["totals"]["eta"] == "∞"
        assert page["totals"]["sources"] == "1,000"
        assert page["subs"]["sources"] == "2 halted, 1 permanently"
        assert page["totals"]["throughput"] == NONE
        # Every source's re-checks, summed by status.
        checked = recheck_totals(text)
        assert page["totals"]["rechecks"] == fmt_int(sum(checked.values()))
        assert page["subs"]["rechecks"] == fmt_rechecks(checked)
        assert (
            page["subs"]["rechecks"]
            == "1,094,500 unchanged · 300 changed · 200 gone · 100 failed · 2 moved"
        )
        # A source's hosts, the states with none left out; nothing without a host index.
        hosts = COLUMNS.index("hosts")
        assert expected["source0007"][hosts] == "91 active · 2 paced · 1 backed off · 1 halted"
        assert expected["source0015"][hosts] == ""
        assert expected["source0000"][hosts] == "0 active"
        assert expected["source0010"][COLUMNS.index("rechecks")] == (
            "110 unchanged · 2 changed · 1 gone · 2 moved"
        )
        assert expected["source0011"][COLUMNS.index("rechecks")] == ""
        duplicates = COLUMNS.index("duplicates")
        assert expected["source0004"][duplicates] == "1 exact · 4 near (11.1 %)"
        assert expected["source0012"][duplicates] == "2 near (3.8 %)"
        assert expected["source0028"][duplicates] == "1 exact · 3 near (100.0 %)"
        assert expected["source0060"][duplicates] == "0 (0.0 %)"
        assert expected["source0105"][duplicates] == expected["source0000"][duplicates] == ""

        # 500 successes and 100 errors a reading, until the page shows a rate (five
        # readings): the throughput is their sum per second.
        polls = page["polls"]

        async def counted_until_shown() -> dict[str, Any] | None:
            nonlocal polls
            page = await read_page(tab)
            if page["polls"] > polls:
                polls = page["polls"]
                for state in list(monitor.sources.values())[:100]:
                    state.successes += 5
                    state.errors += 1
            return page if shown_rate(page) is not None else None

        page = await wait_for(counted_until_shown, 30, interval_s=0.1, what="a rate shown")
        assert page["chartLines"] >= 1
        shown = shown_rate(page)
        # About a reading's worth of change per second, whatever the timers did.
        assert shown is not None and 600 / (2 * EVERY_S) <= shown <= 600 / (0.5 * EVERY_S)
        assert page["rows"][0] == expected_rows(await scrape(port))[page["rows"][0][0]]
        assert_clean(tab, origin)


def shown_rate(page: Mapping[str, Any]) -> float | None:
    text = page["totals"]["throughput"]
    return None if text == NONE else float(text.removesuffix("/s").replace(",", ""))


@pytest.mark.timing("asserts eight shown rates within ±25% of 110/s against the page's 1 s timer")
async def test_throughput_holds_steady_when_the_monitor_counts_less_often_than_the_page_reads(
    tab: Tab,
) -> None:
    # The monitor refreshes its counters every LOG_FREQUENCY_S: here every 3 readings.
    period_s, successes, errors = 3 * EVERY_S, 300, 30
    rate = (successes + errors) / period_s
    monitor = MadeUpMonitor({"flickr": SourceState(), "met": SourceState()})

    async def count() -> None:
        while True:
            await asyncio.sleep(period_s)
            monitor.sources["flickr"].successes += successes
            monitor.sources["met"].errors += errors

    async with made_up_monitor(monitor) as port:
        await open_dashboard(tab, port)
        # No re-check yet: the family has no sample, and the counters are known.
        page = await read_page(tab)
        assert (page["totals"]["rechecks"], page["subs"]["rechecks"]) == ("0", "none yet")
        counting = asyncio.create_task(count())
        try:
            seen: list[float] = []

            async def shown_for_a_while() -> bool:
                page = await read_page(tab)
                if shown_rate(page) is not None and (not seen or page["polls"] > seen[-1]):
                    seen.extend([shown_rate(page), page["polls"]])  # type: ignore[list-item]
                return len(seen) >= 2 * 8

            await wait_for(shown_for_a_while, 60, interval_s=0.2, what="eight rates shown")
        finally:
            counting.cancel()
        rates = seen[::2]
        # Never the 0 or the double a rate between two readings would show.
        assert all(0.75 * rate <= r <= 1.25 * rate for r in rates), (rate, rates)

        # Once nothing is counted for half the window (30 s), the rate falls to 0.
        page = await tab.wait_until(
            f"(() => {{ const p = {READ_PAGE}; return p.totals.throughput === '0/s' && p; }})()",
            30,
            "the throughput at 0 after the counters stopped",
        )
        assert page["state"] == "live"


async def test_a_click_on_a_header_sorts_and_the_filter_box_narrows(tab: Tab) -> None:
    names = ["wikimedia", "flickr", "smithsonian", "met", "wikiart", "europeana", "nappy"]
    monitor = MadeUpMonitor(
        {
            name: SourceState(
                successes=(i * 7919) % 1000,
                configured=i + 1.0,
                rechecks={"unchanged": (i * 37) % 11, "gone": i % 3} if i % 3 else {},
            )
            for i, name in enumerate(names)
        }
    )
    async with made_up_monitor(monitor) as port:
        origin = await open_dashboard(tab, port)

        async def sorted_by(key: str, direction: str) -> list[str]:
            await tab.click(f'#head th[data-key="{key}"] button')
            page = await tab.wait_until(
                f"(() => {{ const p = {READ_PAGE}; "
                f"return p.sort && p.sort.join() === '{key},{direction}' && p; }})()",
                10,
                f"sorted by {key}, {direction}",
            )
            return [row[0] for row in page["rows"]]

        assert await sorted_by("source", "ascending") == sorted(names)
        assert await sorted_by("source", "descending") == sorted(names, reverse=True)
        by_successes = sorted(names, key=lambda n: -monitor.sources[n].successes)
        assert await sorted_by("successes", "descending") == by_successes
        assert await sorted_by("successes", "ascending") == by_successes[::-1]
        # By the number of re-checks, whatever their statuses; ties by name.
        by_rechecks = sorted(names, key=lambda n: (-sum(monitor.sources[n].rechecks.values()), n))
        assert await sorted_by("rechecks", "descending") == by_rechecks
        by_rate = sorted(names, key=lambda n: -monitor.sources[n].configured)
        assert await sorted_by("configured", "descending") == by_rate

        await tab.type_text("#filter", "WIKI")
        page = await tab.wait_until(
            f"(() => {{ const p = {READ_PAGE}; return p.rows.length === 2 && p; }})()",
            10,
            "the filtered rows",
        )
        assert [row[0] for row in page["rows"]] == [n for n in by_rate if "wiki" in n]
        assert page["shown"] == "2 of 7 sources"
        # The order and the filter hold through the next readings.
        polls = page["polls"]
        page = await tab.wait_until(
            f"(() => {{ const p = {READ_PAGE}; return p.polls > {polls} + 1 && p; }})()",
            10,
            "two more readings",
        )
        assert [row[0] for row in page["rows"]] == [n for n in by_rate if "wiki" in n]
        assert_clean(tab, origin)


async def test_the_dns_panel_shows_each_worker_and_the_sum_of_those_reporting(
    tab: Tab,
) -> None:
    monitor = MadeUpMonitor({"web": SourceState(dns_errors=40), "met": SourceState(dns_errors=8)})
    async with made_up_monitor(monitor) as port:
        origin = await open_dashboard(tab, port)
        page = await read_page(tab)
        assert page["dns"] == NO_DNS_YET
        assert page["dnsNote"] == "48 URLs ended as DnsError"

        monitor.dns = {
            "worker-b:31": {
                "queries": 2500,
                "hits": 27500,
                "cached": 2600,
                "age": 2.2,
                # A kind the page does not know yet comes after the resolver's.
                "failures": {"timeout": 3, "nxdomain": 40, "brand-new": 1},
            },
            "worker-a:12": {
                "queries": 1500, "hits": 8500, "cached": 1400, "age": 4.0, "failures": {}},
            # Stopped reporting 5 minutes ago: shown, dimmed, and left out of the sum.
            "worker-c:77": {
                "queries": 900, "hits": 100, "cached": 800, "age": 300.0,
                "failures": {"servfail": 9},
            },
            # Not an actual worker name; the page must show it as text.
            '<b onmouseover="window.owned=1">': {
                "queries": 10, "hits": 0, "cached": 10, "age": 0.4, "failures": {}},
        }  # fmt: skip
        page = await tab.wait_until(
            f"(() => {{ const p = {READ_PAGE}; return p.dns.length === 5 && p; }})()",
            10,
            "a row per worker and their sum",
        )
        rows, note = expected_dns(await scrape(port))
        assert page["dns"] == rows
        assert page["dnsNote"] == note == "90.0 % from cache · 48 URLs ended as DnsError"
        # What that reads as, once in plain words.
        assert rows[1:] == [
            ["", "worker-a:12", "1,500", "8,500", "85.0 %", "1,400", "none", "4 s ago"],
            [
                "", "worker-b:31", "2,500", "27,500", "91.7 %", "2,600",
                "40 nxdomain · 3 timeout · 1 brand-new", "2 s ago",
            ],
            [
                "stale", "worker-c:77", "900", "100", "10.0 %", "800", "9 servfail",
                "stale · 5 min ago",
            ],
            [
                "total", "all workers (3 reporting)", "4,010", "36,000", "90.0 %", "4,010",
                "40 nxdomain · 3 timeout · 1 brand-new", "",
            ],
        ]  # fmt: skip
        assert rows[0][1] == '<b onmouseover="window.owned=1">'
        assert await tab.evaluate("window.owned === undefined")

        # A worker that stops deletes its report: its row goes, the sum follows.
        del monitor.dns["worker-b:31"]
        page = await tab.wait_until(
            f"(() => {{ const p = {READ_PAGE}; return p.dns.length === 4 && p; }})()",
            10,
            "the stopped worker's row gone",
        )
        rows, note = expected_dns(await scrape(port))
        assert page["dns"] == rows and page["dnsNote"] == note
        assert rows[-1][:3] == ["total", "all workers (2 reporting)", "1,510"]
        assert_clean(tab, origin)


async def test_an_unreachable_monitor_is_shown_as_such_and_the_page_recovers(tab: Tab) -> None:
    monitor = MadeUpMonitor({"flickr": SourceState(successes=10)})
    async with made_up_monitor(monitor) as port:
        await open_dashboard(tab, port)
    status = await tab.wait_until(
        "document.documentElement.dataset.state === 'down' && "
        "document.getElementById('status').textContent",
        15,
        "the page noticing the monitor is gone",
    )
    assert status.startswith("Cannot reach the monitor (network error). Showing data from ")
    # What was last read stays on the page.
    assert (await read_page(tab))["rows"] == [
        expected_row("flickr", dataclasses.asdict(monitor.sources["flickr"]))
    ]

    # Back, as a standby monitor (another one leads): the page says where rates are.
    assert await tab.evaluate("document.getElementById('role').hidden")
    monitor.sources["flickr"].successes = 11
    monitor.leading = False
    async with made_up_monitor(monitor, port):
        page = await tab.wait_until(
            f"(() => {{ const p = {READ_PAGE}; return p.state === 'live' && p; }})()",
            15,
            "the page back to live",
        )
        assert page["status"].startswith("Live · updated ")
        assert page["rows"][0][5] == "11"
        assert await tab.evaluate(
            "!document.getElementById('role').hidden && "
            "document.getElementById('role').textContent.startsWith('Standby monitor')"
        )
    # The failed fetches are the browser's own report of a refused connection, nothing else.
    assert all("ERR_CONNECTION_REFUSED" in p for p in tab.problems()), tab.problems()


async def test_the_policy_is_sent_and_refuses_injected_scripts_and_other_origins(
    tab: Tab,
) -> None:
    async with made_up_monitor(MadeUpMonitor({"flickr": SourceState()})) as port:
        origin = await open_dashboard(tab, port)
        document = next(
            p["response"]
            for p in tab.named("Network.responseReceived")
            if p["response"]["url"].startswith(f"{origin}/?")
        )
        headers = {k.lower(): v for k, v in document["headers"].items()}
        assert (
            headers["content-security-policy"]
            == dashboard.page().headers["Content-Security-Policy"]
        )
        assert_clean(tab, origin)

        # The same server under another name is another origin: refused even in no-cors
        # mode, where nothing but the policy would stop the request.
        other = f"http://localhost:{port}/metrics"
        refused = await tab.evaluate(
            """(async () => {
              const seen = [];
              const both = new Promise((resolve) => {
                document.addEventListener("securitypolicyviolation", (e) => {
                  seen.push(e.effectiveDirective);
                  if (seen.includes("style-src-elem") && seen.includes("connect-src")) resolve();
                });
              });
              try {
                const script = document.createElement("script");
                script.textContent = "window.injected = 1";
                document.body.append(script);
              } catch (e) { seen.push(e.name); }
              const style = document.createElement("style");
              style.append("body { display: none }");
              document.head.append(style);
              let fetched = "yes";
              try { await fetch(OTHER, { mode: "no-cors" }); } catch (e) { fetched = "refused"; }
              await both;
              return { seen, injected: window.injected === 1, fetched,
                       hidden: getComputedStyle(document.body).display === "none" };
            })()""".replace("OTHER", json.dumps(other))
        )
        assert refused["injected"] is False and refused["hidden"] is False
        assert refused["fetched"] == "refused"
        assert {"style-src-elem", "connect-src"} <= set(refused["seen"]), refused
        assert other not in tab.requested_urls()


async def test_the_route_serves_the_page_with_its_headers() -> None:
    async with (
        made_up_monitor(MadeUpMonitor({})) as port,
        aiohttp.ClientSession() as session,
        session.get(f"http://{LOOPBACK}:{port}/") as response,
    ):
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/html; charset=utf-8"
        for name, value in dashboard.page().headers.items():
            assert response.headers[name] == value
        assert await response.read() == dashboard.page().body


# --- during a real crawl -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CrawledSource:
    rate_rps: float
    images: int  # URLs that answer an image
    missing: int = 0  # URLs that answer 404 (link rot: an error)
    failing: bool = False  # every URL answers 500: the breaker halts the source
    # Its URLs name the origin "localhost": the worker's resolver has a name to look up.
    by_name: bool = False


# Named after some of Openverse's providers, so that the screenshot reads like a crawl.
CRAWL = {
    # Each source takes its own time (images / rate): the chart steps down as they finish.
    "flickr": CrawledSource(30.0, 450),
    "wikimedia": CrawledSource(15.0, 150),
    "smithsonian": CrawledSource(8.0, 200),
    "brooklynmuseum": CrawledSource(5.0, 90, missing=10),
    "met": CrawledSource(4.0, 140),
    "europeana": CrawledSource(2.0, 60),
    "nappy": CrawledSource(1.0, 20, by_name=True),
    "rawpixel": CrawledSource(5.0, 0, failing=True),
}
FAILING_URLS = 40
# Re-checks of earlier crawls, as the workers' stats flush counts them: written into Redis
# before the crawl (these URLs carry no earlier crawl), so that the page shows some.
RECHECKED = {
    "flickr": {c.CHECK_UNCHANGED: 1840, c.CHECK_CHANGED: 52, c.CHECK_GONE: 7},
    "met": {c.CHECK_UNCHANGED: 120, c.CHECK_FAILED: 3},
}
# Fields of the same hash that the monitor leaves out: the page shows none of them.
ODD_RECHECKS = {
    c.rechecks_field("flickr", "teapot"): 9,  # no status of the contract
    c.rechecks_field("europeana", c.CHECK_GONE): "many",  # no count
    c.rechecks_field("stranger", c.CHECK_GONE): 5,  # no known source
}
# Set to a path (docs/dashboard.png) to keep the screenshot; the crawl is then this many
# times longer, so that the chart has more to show.
SCREENSHOT_ENV = "DASHBOARD_SCREENSHOT"
LONGER = 3


async def _metrics_port(process: Any) -> int:
    def bound() -> int | None:
        if process.process.poll() is not None:
            raise AssertionError(f"the monitor exited:\n{process.tail()}")
        events = process.events("metrics_serving")
        return events[-1]["port"] if events else None

    port: int = await wait_for(bound, 60, interval_s=0.05, what="the monitor's metrics server")
    return port


async def _page_matches(tab: Tab, port: int) -> dict[str, Any] | None:
    """The page when its table and totals are what ``/metrics`` says now, else None."""
    text = await scrape(port)
    page = await read_page(tab)
    _, totals = per_source(text)
    shown = page["totals"]
    if {row[0]: row for row in page["rows"]} != expected_rows(text):
        return None
    if (shown["successes"], shown["errors"], shown["backlog"], shown["split"]) != (
        fmt_int(totals.get("crawler_successes_total")),
        fmt_int(totals.get("crawler_errors_total")),
        fmt_int(totals.get("crawler_backlog_urls")),
        fmt_int(totals.get("crawler_split_total")),
    ):
        return None
    return {"page": page, "metrics": text}


async def _dns_matches(tab: Tab, port: int, workers: int = 1) -> dict[str, Any] | None:
    """The page when its DNS panel is what ``/metrics`` says now, of ``workers``
    workers, else None."""
    text = await scrape(port)
    page = await read_page(tab)
    rows, note = expected_dns(text)
    if len(workers_dns(text)) != workers or (page["dns"], page["dnsNote"]) != (rows, note):
        return None
    return page


PLACED = {
    c.placements_field("flickr", "exact"): 1203,
    c.placements_field("flickr", "near"): 97,
    c.placements_field("flickr", "unique"): 3700,
    c.placements_field("met", "unique"): 20,
    c.placements_field("stranger", "near"): 5,  # no known source: no row
}


async def test_during_a_real_crawl_the_page_shows_what_the_monitor_measures(
    kafka, redis, redis_url, origin, tab: Tab, tmp_path: Path
) -> None:
    keep = os.environ.get(SCREENSHOT_ENV)
    scale = LONGER if keep else 1
    body = tiny_jpeg()
    crawl = Crawl(kafka, redis_url, tmp_path)
    try:
        for name, source in CRAWL.items():
            urls = [
                origin.add(f"/{name}/{i}.jpg", body, "image/jpeg")
                for i in range(source.images * scale)
            ]
            urls += [origin.add_status(f"/{name}/gone-{i}.jpg", 404) for i in range(source.missing)]
            if source.failing:
                urls += [
                    origin.add_status(f"/{name}/broken-{i}.jpg", 500) for i in range(FAILING_URLS)
                ]
            if source.by_name:
                urls = [url.replace(f"//{LOOPBACK}:", "//localhost:") for url in urls]
            # Half straight into the source's queue, half through the splitter.
            half = len(urls) // 2
            await crawl.queue(redis, name, source.rate_rps, urls[:half])
            await produce(
                kafka.bootstrap,
                c.INBOUND_TOPIC,
                [
                    c.InboundImage(url=url, uuid=f"{name}-{half + i}", source=name).to_json()
                    for i, url in enumerate(urls[half:])
                ],
            )
        await redis.hset(
            c.RECHECKS_HASH,
            mapping={
                **ODD_RECHECKS,
                **{
                    c.rechecks_field(name, status): count
                    for name, counts in RECHECKED.items()
                    for status, count in counts.items()
                },
            },
        )
        # The deduplication stage's counts, as it writes them (dedup/counts.py).
        await redis.hset(c.PLACEMENTS_HASH, mapping=PLACED)
        crawl.monitor = CrawlerProcess(
            "crawl_monitor",
            {
                **kafka.env,
                "REDIS_URL": redis_url,
                "SOURCES_FILE": sources_file(tmp_path, **dict.fromkeys(CRAWL, 10**6)),
                "LOG_FREQUENCY_S": "1",
                "METRICS_PORT": "0",
                "METRICS_HOST": LOOPBACK,
            },
            tmp_path / "monitor.log",
        )
        port = await _metrics_port(crawl.monitor)
        origin_url = await open_dashboard(tab, port)
        await tab.wait_until(
            f"(() => {{ const p = {READ_PAGE}; return p.rows.length === {len(CRAWL)} && p; }})()",
            30,
            "a row per source",
        )
        await crawl.add_workers(list(CRAWL), 1)

        # --- mid-crawl: the chart fills, the failing source is halted ----------------------
        good = sum(s.images * scale for s in CRAWL.values())
        page = await tab.wait_until(
            f"""(() => {{ const p = {READ_PAGE};
              const done = Number(p.totals.successes.replaceAll(",", ""));
              const halted = p.rows.some((r) => r[0] === "rawpixel" && r[{STATE}] !== "");
              return done >= {good * 0.75} && halted && p.chartLines > 0 && p; }})()""",
            120 * scale,
            "a crawl well under way, with rawpixel halted",
        )
        text = await scrape(port)
        assert {row[0] for row in page["rows"]} == set(expected_rows(text)) == set(CRAWL)
        sources, _ = per_source(text)
        for name, source in CRAWL.items():
            assert sources[name]["configured"] == source.rate_rps
        assert (shown_rate(page) or 0) > 0
        rows = {row[0]: row for row in page["rows"]}
        rechecks = COLUMNS.index("rechecks")
        assert rows["flickr"][rechecks] == "1,840 unchanged · 52 changed · 7 gone"
        assert rows["met"][rechecks] == "120 unchanged · 3 failed"
        assert rows["wikimedia"][rechecks] == ""
        assert page["totals"]["rechecks"] == "2,022"
        assert page["subs"]["rechecks"] == "1,960 unchanged · 52 changed · 7 gone · 3 failed"
        duplicates = COLUMNS.index("duplicates")
        assert rows["flickr"][duplicates] == "1,203 exact · 97 near (26.0 %)"
        assert (rows["met"][duplicates], rows["wikimedia"][duplicates]) == ("0 (0.0 %)", "")
        # Each source's URLs are on one host of the local origin, which the workers' pacing
        # script indexed: one active host, as /metrics says.
        assert sources["flickr"][f"{HOST_KEY}active"] == 1
        assert rows["flickr"][COLUMNS.index("hosts")].startswith("1 active")
        # The worker's resolver, as it reported it to Redis and the monitor exports it.
        page = await wait_for(
            lambda: _dns_matches(tab, port), 30, interval_s=0.5, what="the DNS panel as /metrics"
        )
        (worker,) = crawl.workers
        assert page["dns"][0][1] == f"{socket.gethostname()}:{worker.pid}"
        ((values),) = workers_dns(await scrape(port)).values()
        assert values["queries"] >= 1 and values["cached"] >= 1  # localhost, looked up
        assert page["dns"][-1][0] == "total"
        screenshot = await tab.screenshot()
        await asyncio.to_thread((tmp_path / "dashboard.png").write_bytes, screenshot)
        if keep:
            await asyncio.to_thread(Path(keep).write_bytes, screenshot)

        # --- every image crawled, the worker stopped: the page and /metrics agree ----------
        async def crawled() -> bool:
            sources, _ = per_source(await scrape(port))
            return all(
                sources[n].get("successes") == s.images * scale
                and sources[n].get("errors", 0) >= s.missing
                for n, s in CRAWL.items()
            )

        await wait_for(crawled, 120 * scale, interval_s=0.5, what="every image crawled")
        for worker in crawl.workers:
            worker.signal(signal.SIGTERM)
            assert worker.wait(30) == 0
        stopped_at = time.time()

        async def matches_after_stop() -> dict[str, Any] | None:
            # The backlog is measured every LOG_FREQUENCY_S: the page is compared with a
            # measurement taken after the workers' last commits, not one from before.
            matched = await _page_matches(tab, port)
            if matched is None:
                return None
            _, totals = per_source(matched["metrics"])
            measured_at = totals.get("crawler_backlog_measured_timestamp_seconds", 0.0)
            return matched if measured_at > stopped_at else None

        matched = await wait_for(
            matches_after_stop, 30, interval_s=0.5, what="page == /metrics, measured after the stop"
        )
        # The worker deleted its DNS report as it stopped: its row is gone.
        await wait_for(
            lambda: _dns_matches(tab, port, workers=0), 30, interval_s=0.5, what="no DNS row"
        )
        sources, totals = per_source(matched["metrics"])
        for name, source in CRAWL.items():
            assert sources[name]["successes"] == source.images * scale
            if not source.failing:
                assert sources[name]["backlog"] == 0, name
        assert totals["crawler_split_total"] > 0

        # A click on "Successes" puts the most crawled source first.
        await tab.click('#head th[data-key="successes"] button')
        page = await tab.wait_until(
            f"(() => {{ const p = {READ_PAGE}; "
            "return p.sort && p.sort.join() === 'successes,descending' && p; })()",
            10,
            "sorted by successes",
        )
        by_successes = sorted(CRAWL, key=lambda n: (-sources[n]["successes"], n))
        assert [row[0] for row in page["rows"]] == by_successes

        document = next(
            p["response"]
            for p in tab.named("Network.responseReceived")
            if p["response"]["url"].startswith(f"{origin_url}/?")
        )
        assert "content-security-policy" in {k.lower() for k in document["headers"]}
        assert_clean(tab, origin_url)
    finally:
        crawl.stop()
