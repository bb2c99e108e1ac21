"""The monitor's metrics: the collector over a fixed view, the regulator loop's histogram,
``/healthz``'s problems, and the whole monitor serving them."""

from __future__ import annotations

import asyncio
import json
import math
import re

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from structlog.testing import capture_logs

from crawl_monitor.__main__ import run
from crawl_monitor.backlog import Backlog
from crawl_monitor.metrics import (
    HealthLimits,
    MonitorCollector,
    MonitorView,
    health_problems,
    loop_histogram,
)
from crawl_monitor.monitoring import Counters
from crawl_monitor.policy.decision import RegulatorSnapshot
from crawl_monitor.regulator import Regulator, RegulatorSettings
from crawl_monitor.settings import MonitorSettings
from crawl_monitor.store import RedisRegulatorStore
from image_crawler import contract as c
from image_crawler.dns_stats import DnsReport, figures
from image_crawler.host_index import HostCounts
from test.harness.crawl import sources_file
from test.harness.services import create_topics, produce, wait_for

AT_RATE = "at its configured rate"
RECHECKS = "crawler_source_rechecks_total"
PLACEMENTS = "crawler_source_dedup_placements_total"
HOSTS = "crawler_source_hosts"


def snapshot() -> RegulatorSnapshot:
    return RegulatorSnapshot(
        rates={"flickr": 178.5, "met": 10.0, "phylopic": 0.2, "slow": 8.0},
        pacing={
            "flickr": c.PacingInfo(178.5, 178.5, "computed", c.PACE_CONFIGURED, AT_RATE),
            "met": c.PacingInfo(0.0, 10.0, "override_rate:", c.PACE_HALTED, "halted"),
            "phylopic": c.PacingInfo(0.0, 0.2, "computed", c.PACE_HALTED, "temporarily"),
            "slow": c.PacingInfo(5.6, 8.0, "computed", c.PACE_BACKOFF, "cut"),
        },
        halted=frozenset({"met"}),
        temp_halted=frozenset({"phylopic"}),
        last_statuses={},
    )


def samples_of(view: MonitorView) -> list[Sample]:
    """Every sample of a scrape, as prometheus-client parses the text."""
    registry = CollectorRegistry()
    registry.register(MonitorCollector(lambda: view))
    text = generate_latest(registry).decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def scrape(view: MonitorView) -> dict[tuple[str, str | None], float]:
    """Every sample of a scrape but those labelled by status, state or kind: (name,
    source label or None) -> value."""
    return {
        (sample.name, sample.labels.get("source")): sample.value
        for sample in samples_of(view)
        if not {"status", "state", "kind"} & sample.labels.keys()
    }


def by_state(view: MonitorView) -> dict[tuple[str, str], float]:
    """The samples of crawler_source_hosts: (source, state) -> value."""
    return {
        (sample.labels["source"], sample.labels["state"]): sample.value
        for sample in samples_of(view)
        if sample.name == HOSTS
    }


def by_status(view: MonitorView, name: str) -> dict[tuple[str, str], float]:
    """The samples of ``name``: (source, status) -> value."""
    return {
        (sample.labels["source"], sample.labels["status"]): sample.value
        for sample in samples_of(view)
        if sample.name == name
    }


FULL = MonitorView(
    known=["flickr", "met", "phylopic", "slow"],
    snapshot=snapshot(),
    # "queued": a topic whose source is not known.
    backlog=Backlog({"flickr": 357, "met": 40, "slow": 56, "queued": 9}, 1_700_000_000.0),
    counters=Counters(
        num_resized=1000,
        resize_errors=31,
        num_split=5000,
        successful={"flickr": 982, "slow": 18},
        errors={"met": 30, "flickr": 1},
        no_index={"met": 12},
        dns_errors={"flickr": 3},
        # "slow" has had no re-check: no series at all, not four zeros.
        rechecks={"flickr": {"unchanged": 40, "changed": 2}, "met": {"gone": 5, "failed": 1}},
        placements={"flickr": {"exact": 10, "near": 2, "unique": 970}, "met": {"unique": 30}},
    ),
    leading=True,
    # Only the sources with a host index: "met" and "phylopic" have none.
    hosts={"flickr": HostCounts(1200, 40, 10, 4), "slow": HostCounts(backed_off=1)},
)


def test_every_metric_of_a_full_view():
    samples = scrape(FULL)
    per_source = {
        "crawler_source_configured_requests_per_second": {
            "flickr": 178.5,
            "met": 10.0,
            "phylopic": 0.2,
            "slow": 8.0,
        },
        "crawler_source_effective_requests_per_second": {
            "flickr": 178.5,
            "met": 0.0,
            "phylopic": 0.0,
            "slow": 5.6,
        },
        "crawler_source_halted": {"flickr": 0, "met": 1, "phylopic": 1, "slow": 0},
        "crawler_source_permanently_halted": {"flickr": 0, "met": 1, "phylopic": 0, "slow": 0},
        # A known source without a topic has nothing waiting.
        "crawler_source_backlog_urls": {
            "flickr": 357,
            "met": 40,
            "phylopic": 0,
            "slow": 56,
            "queued": 9,
        },
        "crawler_source_eta_seconds": {
            "flickr": 2.0,  # 357 / 178.5
            "met": math.inf,  # halted with a backlog
            "phylopic": 0.0,
            "slow": 10.0,  # 56 / 5.6
            "queued": math.inf,  # not known: no rate
        },
        "crawler_source_successes_total": {"flickr": 982, "met": 0, "phylopic": 0, "slow": 18},
        "crawler_source_errors_total": {"flickr": 1, "met": 30, "phylopic": 0, "slow": 0},
        "crawler_source_no_index_total": {"flickr": 0, "met": 12, "phylopic": 0, "slow": 0},
        "crawler_source_dns_errors_total": {"flickr": 3, "met": 0, "phylopic": 0, "slow": 0},
    }
    for name, values in per_source.items():
        got = {source: v for (n, source), v in samples.items() if n == name}
        assert got == pytest.approx(values), name
    totals = {
        "crawler_successes_total": 1000,
        "crawler_errors_total": 31,
        "crawler_split_total": 5000,
        "crawler_backlog_urls": 462,
        "crawler_eta_seconds": 10.0,  # slow's: met waits for an operator, queued to be known
        "crawler_sources": 4,
        "crawler_backlog_measured_timestamp_seconds": 1_700_000_000.0,
        "crawler_monitor_leading": 1,
    }
    for name, value in totals.items():
        assert samples[(name, None)] == pytest.approx(value), name
    rechecks = "crawler_source_rechecks_total"
    assert by_status(FULL, rechecks) == {
        ("flickr", "unchanged"): 40,
        ("flickr", "changed"): 2,
        ("met", "gone"): 5,
        ("met", "failed"): 1,
    }
    assert by_state(FULL) == {
        ("flickr", "active"): 1254,
        ("flickr", "paced"): 40,
        ("flickr", "backed_off"): 10,
        ("flickr", "halted"): 4,
        ("slow", "active"): 1,
        ("slow", "paced"): 0,
        ("slow", "backed_off"): 1,
        ("slow", "halted"): 0,
    }
    placements = {
        (sample.labels["source"], sample.labels["kind"]): sample.value
        for sample in samples_of(FULL)
        if sample.name == PLACEMENTS
    }
    assert placements == {
        ("flickr", "exact"): 10,
        ("flickr", "near"): 2,
        ("flickr", "unique"): 970,
        ("met", "unique"): 30,
    }
    names = {n for n, _ in samples}
    assert names == set(per_source) | set(totals)
    assert {sample.name for sample in samples_of(FULL)} == names | {rechecks, HOSTS, PLACEMENTS}
    # No series carries a host: a source's are four, whatever its number of hosts.
    assert {tuple(sorted(s.labels)) for s in samples_of(FULL) if s.name == HOSTS} == {
        ("source", "state")
    }


WORKER_DNS = (
    "crawler_worker_dns_queries_total",
    "crawler_worker_dns_cache_hits_total",
    "crawler_worker_dns_names_cached",
    "crawler_worker_dns_report_age_seconds",
)


def test_each_workers_dns_report_is_a_series_of_its_own_with_its_age():
    now = 1_800_000_000.0
    reports = (
        DnsReport("a:1", figures(120, 880, {"timeout": 2, "nxdomain": 5}, 700), now - 3),
        DnsReport("b:2", figures(0, 0, {}, 0), now - 400),  # stopped reporting
    )
    view = MonitorView(["flickr"], None, None, None, leading=True, dns=reports, now_s=now)
    found = {
        (s.name, s.labels["worker"], s.labels.get("kind")): s.value
        for s in samples_of(view)
        if s.name.startswith("crawler_worker_dns_")
    }
    assert found == {
        ("crawler_worker_dns_queries_total", "a:1", None): 120,
        ("crawler_worker_dns_cache_hits_total", "a:1", None): 880,
        ("crawler_worker_dns_failures_total", "a:1", "nxdomain"): 5,
        ("crawler_worker_dns_failures_total", "a:1", "timeout"): 2,
        ("crawler_worker_dns_names_cached", "a:1", None): 700,
        ("crawler_worker_dns_report_age_seconds", "a:1", None): 3,
        ("crawler_worker_dns_queries_total", "b:2", None): 0,
        ("crawler_worker_dns_cache_hits_total", "b:2", None): 0,
        ("crawler_worker_dns_names_cached", "b:2", None): 0,
        ("crawler_worker_dns_report_age_seconds", "b:2", None): 400,
    }
    # Not read yet: no family at all (a figure the monitor does not have is left out).
    unread = MonitorView(["flickr"], None, None, None, leading=True)
    assert not [s for s in samples_of(unread) if s.name.startswith("crawler_worker_dns_")]
    assert not {name.removesuffix("_total") for name in WORKER_DNS} & {
        "crawler_dns_queries",
        "crawler_dns_cache_hits",
        "crawler_dns_names_cached",
    }, "named apart from the workers' own, so that a sum over both never counts twice"


def test_the_rechecks_family_is_there_without_any_series():
    """Counters read, no re-check yet: the family is described, with no sample."""
    registry = CollectorRegistry()
    view = MonitorView(["flickr"], None, None, Counters(), leading=True)
    registry.register(MonitorCollector(lambda: view))
    text = generate_latest(registry).decode()
    assert "# TYPE crawler_source_rechecks_total counter" in text
    assert "\ncrawler_source_rechecks_total{" not in text
    assert by_status(view, "crawler_source_rechecks_total") == {}


def test_what_the_monitor_does_not_know_yet_is_left_out():
    """Before any loop or reading (and on a standby monitor: no snapshot)."""
    samples = scrape(MonitorView(["flickr"], None, None, None, leading=False))
    assert samples == {("crawler_sources", None): 1, ("crawler_monitor_leading", None): 0}
    assert by_state(MonitorView(["flickr"], None, None, None, leading=False)) == {}
    # A standby has the backlog and the counters, not the rates nor an ETA.
    standby = scrape(MonitorView(["flickr"], None, FULL.backlog, FULL.counters, leading=False))
    names = {n for n, _ in standby}
    assert "crawler_source_backlog_urls" in names
    assert "crawler_source_successes_total" in names
    assert not names & {
        "crawler_eta_seconds",
        "crawler_source_eta_seconds",
        "crawler_source_effective_requests_per_second",
        "crawler_source_halted",
    }


@pytest.mark.timing("asserts every regulator loop's duration lands in the 1 s histogram bucket")
async def test_the_regulator_loop_feeds_the_histogram(redis):
    registry = CollectorRegistry()
    histogram = loop_histogram(registry)
    regulator = Regulator(
        RedisRegulatorStore(redis),
        lambda: {"flickr": 1.0},
        RegulatorSettings(period_s=0.05),
        observe_loop=histogram.observe,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(regulator.run(stop))

    def loops() -> float | None:
        return registry.get_sample_value("crawler_monitor_loop_seconds_count")

    try:
        await wait_for(lambda: (loops() or 0) >= 3, 10, what="three loops")
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
    assert regulator.completed_at is not None
    assert registry.get_sample_value("crawler_monitor_loop_seconds_sum") > 0
    # Every loop of a healthy regulator ends within its period.
    within = registry.get_sample_value("crawler_monitor_loop_seconds_bucket", {"le": "1.0"})
    assert within == loops()


LIMITS = HealthLimits(regulator_s=30.0, backlog_s=120.0)


@pytest.mark.parametrize(
    ("now_s", "regulator_done_s", "backlog_done_s", "problems"),
    [
        (10.0, None, None, []),  # just started: time to get there
        (100.0, 99.5, 98.0, []),
        (100.0, None, 99.0, ["regulator: no loop completed for 100 s (is Redis reachable?)"]),
        (200.0, 199.0, 70.0, ["backlog: not measured for 130 s (is Kafka reachable?)"]),
        (500.0, 400.0, None, ["regulator", "backlog"]),
    ],
)
def test_health_problems(now_s, regulator_done_s, backlog_done_s, problems):
    found = health_problems(now_s, 0.0, regulator_done_s, backlog_done_s, LIMITS)
    assert [p.split(":")[0] for p in found] == [p.split(":")[0] for p in problems]
    if problems and ":" in problems[0]:
        assert list(found) == problems


def test_the_backlog_limit_follows_a_long_log_interval():
    assert HealthLimits.for_interval(5.0).backlog_s == 120.0
    assert HealthLimits.for_interval(60.0).backlog_s == 600.0


async def test_the_monitor_serves_metrics_health_and_the_dashboard(
    kafka, redis, redis_url, tmp_path
):
    """The whole monitor, in this process: its scrape has the backlog of a source's topic,
    the rates, the counters (a re-check's too), the host counts and the loop histogram;
    /healthz is 200 and / the dashboard."""
    await create_topics(kafka.bootstrap, ["urls.alpha"], partitions=1)
    await produce(kafka.bootstrap, "urls.alpha", [b'{"url": "u", "uuid": "1"}'])
    await redis.set(c.num_resized_key("alpha"), 3)
    seconds, micros = await redis.time()
    asked_at = seconds + micros / 1e6
    await redis.zadd(
        c.host_index_key("alpha"),
        {
            "a.example": c.host_index_score(c.HOST_BACKED_OFF, asked_at),
            "b.example": c.host_index_score(c.HOST_AT_PACE, asked_at),
        },
    )
    await redis.hset(
        c.RECHECKS_HASH,
        mapping={
            c.rechecks_field("alpha", c.CHECK_GONE): 2,
            c.rechecks_field("alpha", c.CHECK_CHANGED): "x",  # no count: no series
            c.rechecks_field("alpha", "teapot"): 4,  # no status of the contract: none
            c.rechecks_field("stranger", c.CHECK_GONE): 7,  # no known source: none
        },
    )
    env = {
        **kafka.env,
        "REDIS_URL": redis_url,
        "SOURCES_FILE": sources_file(tmp_path, alpha=5_000),
        "LOG_FREQUENCY_S": "0.2",
        "METRICS_PORT": "0",
        "METRICS_HOST": "127.0.0.1",
    }
    stop = asyncio.Event()
    with capture_logs() as logs:
        task = asyncio.create_task(run(MonitorSettings.from_env(env), stop))
        try:
            serving = await wait_for(
                lambda: [e for e in logs if e["event"] == "metrics_serving"], 10
            )
            base = f"http://127.0.0.1:{serving[0]['port']}"
            async with aiohttp.ClientSession() as http:

                async def scraped() -> str | None:
                    async with http.get(f"{base}/metrics") as response:
                        text = await response.text()
                    wanted = (
                        "crawler_source_backlog_urls{",
                        "crawler_source_successes_total{",
                        "crawler_source_hosts{",
                    )
                    return text if all(w in text for w in wanted) else None

                text = await wait_for(scraped, 20, what="a scrape with the backlog")
                async with http.get(f"{base}/healthz") as response:
                    assert response.status == 200
                    assert json.loads(await response.text()) == {"ok": True, "problems": []}
                async with http.get(f"{base}/") as response:
                    assert response.status == 200
        finally:
            stop.set()
            assert await asyncio.wait_for(task, 30) == 0
    assert _value(text, 'crawler_source_backlog_urls{source="alpha"}') == 1.0
    assert _value(text, 'crawler_source_successes_total{source="alpha"}') == 3.0
    assert _value(text, 'crawler_source_rechecks_total{source="alpha",status="gone"}') == 2.0
    assert [line for line in text.splitlines() if line.startswith(RECHECKS)] == [
        f'{RECHECKS}{{source="alpha",status="gone"}} 2.0'
    ]
    assert _value(text, 'crawler_source_configured_requests_per_second{source="alpha"}') == 0.2
    assert _value(text, "crawler_sources") == 1.0
    assert _value(text, f'{HOSTS}{{source="alpha",state="active"}}') == 2.0
    assert _value(text, f'{HOSTS}{{source="alpha",state="backed_off"}}') == 1.0
    assert _value(text, "crawler_monitor_loop_seconds_count") >= 1
    assert "process_cpu_seconds_total" in text


def _value(text: str, sample: str) -> float:
    match = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.MULTILINE)
    assert match, sample
    return float(match.group(1))
