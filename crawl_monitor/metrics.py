"""The monitor's Prometheus metrics, and what its ``/healthz`` calls a problem.

A custom collector (``MonitorCollector``) turns the monitor's latest state into metrics
at scrape time, so a scrape costs no Redis or Kafka request: the regulator's snapshot
(every second), the backlog measurement and the counters the monitoring log reads (every
``LOG_FREQUENCY_S``). Per source (label ``source``; every known source, and every source
with a ``urls.{source}`` topic for the backlog):

- ``crawler_source_configured_requests_per_second``: its configured rate (computed, its
  override, or its robots.txt Crawl-delay's cap);
- ``crawler_source_effective_requests_per_second``: the rate it is paced at now (lower
  while its server pushes back, 0 while halted);
- ``crawler_source_backlog_urls``: URLs split into ``urls.{source}`` and not yet taken
  by a worker (``crawl_monitor.backlog``);
- ``crawler_source_eta_seconds``: that backlog at its effective rate (0 without a
  backlog, +Inf with a backlog and no rate);
- ``crawler_source_halted`` (in ``halted`` or ``temp_halted``) and
  ``crawler_source_permanently_halted`` (in ``halted``), 1 or 0;
- ``crawler_source_successes_total``, ``crawler_source_errors_total``
  (``num_resized:{source}``, ``resize_errors:{source}``), and of the errors
  ``crawler_source_no_index_total``, images their servers asked us not to index
  (``resize_errors:{source}:NoIndex``);
- ``crawler_source_rechecks_total`` (labels ``source`` and ``status``, one of
  ``image_crawler.contract.RECHECK_STATUSES``): re-checks of earlier crawls ended
  (the hash ``rechecks``, field ``{source}:{status}``), a series only for the statuses a
  source has had;
- ``crawler_source_dedup_placements_total`` (labels ``source`` and ``kind``: ``exact``,
  ``near``, ``unique``): the deduplication stage's images placed, each counted once (the
  hash ``dedup_placements``, field ``{source}:{kind}``; ``exact`` and ``near`` are the
  duplicates), a series only for the kinds a source has had. Named apart from the
  stage's own ``dedup_images_placed_total``, so that a sum over both never counts twice;
- ``crawler_source_hosts`` (labels ``source`` and ``state``: ``active``, ``paced``,
  ``backed_off``, ``halted``): how many of a source's hosts were asked about in the last
  minute, and of them how many were paced below the source's rate, backed off and halted
  (``image_crawler.host_index``; read every ``LOG_FREQUENCY_S``), for the sources with a
  host index. No metric has a host label: the series stay four a source, whatever its
  number of hosts;
- ``crawler_source_dns_errors_total``: of its errors, URLs whose host's name did not
  resolve (``resize_errors:{source}:DnsError``).

Per worker (label ``worker``, its name in ``dns_workers``: host name and process id), its
resolver as it last reported it (``image_crawler.dns_stats``, read every
``LOG_FREQUENCY_S``; a worker that stops deletes its report, one killed leaves it to go
stale): ``crawler_worker_dns_queries_total``, ``crawler_worker_dns_cache_hits_total``,
``crawler_worker_dns_failures_total`` (label ``kind``, the kinds it has had),
``crawler_worker_dns_names_cached`` and ``crawler_worker_dns_report_age_seconds`` (older
than ``DNS_STALE_S``: it stopped reporting). The workers' own ``/metrics`` have the same
counts as ``crawler_dns_*``; these are named apart so that a sum over both never counts
twice.

Totals: ``crawler_successes_total``, ``crawler_errors_total`` (``num_resized``,
``resize_errors``), ``crawler_split_total`` (``num_split``), ``crawler_backlog_urls``,
``crawler_eta_seconds`` (the largest ETA of the known sources being crawled, see
``image_crawler.contract.crawl_eta_s``), ``crawler_sources`` (known sources),
``crawler_crawl_paused`` (1 while ``crawl_paused`` pauses the whole crawl; then also
``crawler_crawl_pause_info`` with its reason, folder and sentence as labels, and for a
full disk ``crawler_crawl_pause_free_bytes`` and ``crawler_crawl_pause_needed_bytes``),
``crawler_backlog_measured_timestamp_seconds``, ``crawler_monitor_leading`` (1 while this
monitor holds the leader lease) and ``crawler_monitor_loop_seconds`` (a histogram of the
regulator loop's duration, observed by the loop).

A metric whose input the monitor does not have yet is left out of the scrape rather
than shown as 0: the rates, pacing and halts before the first regulator loop (and on a
standby monitor, which decides nothing), the backlog before the first measurement, the
counters before the first Redis reading.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Final

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from crawl_monitor.backlog import Backlog
from crawl_monitor.monitoring import Counters
from crawl_monitor.policy.decision import RegulatorSnapshot
from image_crawler.contract import CrawlPause, crawl_eta_s, eta_s
from image_crawler.dns_stats import DnsReport
from image_crawler.host_index import HostCounts

# The regulator loop takes tens of milliseconds with thousands of sources; its period is
# one second, and a loop waiting on an unreachable Redis takes REDIS_TIMEOUT_S.
LOOP_BUCKETS_S: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclasses.dataclass(frozen=True, slots=True)
class MonitorView:
    """What the monitor knows at one instant (None: not yet)."""

    # The known sources (the source list).
    known: Collection[str]
    snapshot: RegulatorSnapshot | None
    backlog: Backlog | None
    counters: Counters | None
    leading: bool
    # Each source's host counts (sources without a host index left out).
    hosts: Mapping[str, HostCounts] | None = None
    # The pause of the whole crawl in force (crawl_paused), None while it runs; whether
    # the key was read yet (``pause_read``).
    pause: CrawlPause | None = None
    pause_read: bool = False
    # The workers' DNS reports (None: not read yet), and the Unix time of the scrape,
    # which their ages are told by.
    dns: Sequence[DnsReport] | None = None
    now_s: float = 0.0


def monitor_metrics(view: MonitorView) -> list[Metric]:
    """The metrics of ``view`` (see the module)."""
    metrics = _totals(view)
    if view.snapshot is not None:
        metrics += _pacing(view.snapshot)
    if view.backlog is not None:
        metrics += _backlog(view.backlog, view.snapshot, view.known)
    if view.counters is not None:
        metrics += _counters(view.counters, view.known)
    if view.hosts is not None:
        metrics.append(_hosts(view.hosts))
    if view.dns is not None:
        metrics += _dns(view.dns, view.now_s)
    return metrics


def _totals(view: MonitorView) -> list[Metric]:
    sources = GaugeMetricFamily("crawler_sources", "Known sources (the source list).")
    sources.add_metric([], len(view.known))
    leading = GaugeMetricFamily(
        "crawler_monitor_leading",
        "1 while this monitor holds the leader lease (sets rates, runs breakers), else 0.",
    )
    leading.add_metric([], 1.0 if view.leading else 0.0)
    return [sources, leading, *(_pause(view.pause) if view.pause_read else [])]


def _pause(pause: CrawlPause | None) -> list[Metric]:
    paused = GaugeMetricFamily(
        "crawler_crawl_paused",
        "1 while the whole crawl is paused (crawl_paused: a full disk, or an operator), else 0.",
    )
    paused.add_metric([], 0.0 if pause is None else 1.0)
    if pause is None:
        return [paused]
    info = GaugeMetricFamily(
        "crawler_crawl_pause_info",
        "1, labelled with why the crawl is paused: reason (disk_full, operator), the "
        "folder whose disk is short, and the operator's sentence.",
        labels=["reason", "path", "message"],
    )
    info.add_metric([pause.reason, pause.path or "", pause.message], 1.0)
    metrics: list[Metric] = [paused, info]
    for name, value, text in (
        ("crawler_crawl_pause_free_bytes", pause.free_bytes, "Free space on the short disk"),
        ("crawler_crawl_pause_needed_bytes", pause.needed_bytes, "Space to free to resume"),
    ):
        if value is not None:
            gauge = GaugeMetricFamily(name, f"{text} (bytes), while paused for a full disk.")
            gauge.add_metric([], float(value))
            metrics.append(gauge)
    return metrics


def _pacing(snapshot: RegulatorSnapshot) -> list[Metric]:
    configured = GaugeMetricFamily(
        "crawler_source_configured_requests_per_second",
        "Configured rate of a source (computed from its image count, its override, or its "
        "robots.txt Crawl-delay's cap), requests/s.",
        labels=["source"],
    )
    effective = GaugeMetricFamily(
        "crawler_source_effective_requests_per_second",
        "Rate a source's requests are paced at now (lower while its server pushes back, "
        "0 while halted), requests/s.",
        labels=["source"],
    )
    halted = GaugeMetricFamily(
        "crawler_source_halted",
        "1 while a source is halted, temporarily or permanently (it gets no request).",
        labels=["source"],
    )
    permanent = GaugeMetricFamily(
        "crawler_source_permanently_halted",
        "1 while a source is permanently halted (an operator must resume it).",
        labels=["source"],
    )
    tripped = snapshot.halted | snapshot.temp_halted
    for source in sorted(snapshot.rates.keys() | tripped):
        labels = [source]
        if source in snapshot.rates:
            configured.add_metric(labels, snapshot.rates[source])
            paced = snapshot.pacing.get(source)
            effective.add_metric(labels, paced.rate_rps if paced else 0.0)
        halted.add_metric(labels, 1.0 if source in tripped else 0.0)
        permanent.add_metric(labels, 1.0 if source in snapshot.halted else 0.0)
    return [configured, effective, halted, permanent]


def _backlog(
    backlog: Backlog, snapshot: RegulatorSnapshot | None, known: Collection[str]
) -> list[Metric]:
    per_source = GaugeMetricFamily(
        "crawler_source_backlog_urls",
        "URLs split into urls.{source} that no worker has taken yet (consumer lag of "
        "image_handlers).",
        labels=["source"],
    )
    eta = GaugeMetricFamily(
        "crawler_source_eta_seconds",
        "Seconds to crawl a source's backlog at its effective rate (+Inf: a backlog and no rate).",
        labels=["source"],
    )
    rates = {s: p.rate_rps for s, p in snapshot.pacing.items()} if snapshot else {}
    for source in sorted(backlog.sources.keys() | set(known)):
        urls = backlog.sources.get(source, 0)
        per_source.add_metric([source], urls)
        if snapshot is not None:
            eta.add_metric([source], eta_s(urls, rates.get(source, 0.0)))
    total = GaugeMetricFamily(
        "crawler_backlog_urls", "URLs split and not yet taken by a worker, all sources."
    )
    total.add_metric([], backlog.total)
    measured = GaugeMetricFamily(
        "crawler_backlog_measured_timestamp_seconds",
        "Unix time of the backlog measurement these figures come from.",
    )
    measured.add_metric([], backlog.measured_at_s)
    metrics: list[Metric] = [per_source, total, measured]
    if snapshot is not None:
        crawl = GaugeMetricFamily(
            "crawler_eta_seconds",
            "Seconds until the sources being crawled have crawled their backlogs at their "
            "effective rates (the largest of their ETAs).",
        )
        crawl.add_metric([], crawl_eta_s(backlog.sources, rates))
        metrics += [eta, crawl]
    return metrics


def _counters(counters: Counters, known: Collection[str]) -> list[Metric]:
    successes = CounterMetricFamily(
        "crawler_source_successes",
        "Images of a source crawled and stored (num_resized:{source}).",
        labels=["source"],
    )
    errors = CounterMetricFamily(
        "crawler_source_errors",
        "URLs of a source that failed for good (resize_errors:{source}).",
        labels=["source"],
    )
    dns_errors = CounterMetricFamily(
        "crawler_source_dns_errors",
        "URLs of a source that ended because their host's name did not resolve "
        "(resize_errors:{source}:DnsError).",
        labels=["source"],
    )
    no_index = CounterMetricFamily(
        "crawler_source_no_index",
        "URLs of a source whose server asked that the image not be indexed "
        "(resize_errors:{source}:NoIndex; X-Robots-Tag, Content-Signal search=no).",
        labels=["source"],
    )
    for source in sorted(set(known) | counters.successful.keys() | counters.errors.keys()):
        successes.add_metric([source], counters.successful.get(source, 0))
        errors.add_metric([source], counters.errors.get(source, 0))
        no_index.add_metric([source], counters.no_index.get(source, 0))
        dns_errors.add_metric([source], counters.dns_errors.get(source, 0))
    total_successes = CounterMetricFamily(
        "crawler_successes", "Images crawled and stored, all sources (num_resized)."
    )
    total_successes.add_metric([], counters.num_resized)
    total_errors = CounterMetricFamily(
        "crawler_errors", "URLs that failed for good, all sources (resize_errors)."
    )
    total_errors.add_metric([], counters.resize_errors)
    split = CounterMetricFamily(
        "crawler_split", "Messages split from inbound_images into urls.{source} (num_split)."
    )
    split.add_metric([], counters.num_split)
    rechecks = _rechecks(counters)
    placements = _placements(counters)
    return [
        successes,
        errors,
        no_index,
        dns_errors,
        rechecks,
        placements,
        total_successes,
        total_errors,
        split,
    ]


def _rechecks(counters: Counters) -> Metric:
    rechecks = CounterMetricFamily(
        "crawler_source_rechecks",
        "Re-checks of a source's earlier crawls ended, by status: unchanged, changed, gone, "
        "failed (hash rechecks, field {source}:{status}).",
        labels=["source", "status"],
    )
    for source, by_status in sorted(counters.rechecks.items()):
        for status, count in by_status.items():
            rechecks.add_metric([source, status], count)
    return rechecks


def _placements(counters: Counters) -> Metric:
    placements = CounterMetricFamily(
        "crawler_source_dedup_placements",
        "Images of a source the deduplication stage placed, by kind: exact, near (the "
        "duplicates), unique (hash dedup_placements, field {source}:{kind}).",
        labels=["source", "kind"],
    )
    for source, by_kind in sorted(counters.placements.items()):
        for kind, count in by_kind.items():
            placements.add_metric([source, kind], count)
    return placements


def _hosts(hosts: Mapping[str, HostCounts]) -> Metric:
    gauge = GaugeMetricFamily(
        "crawler_source_hosts",
        "Hosts of a source asked about in the last minute (state active), and of them those "
        "paced below the source's rate, backed off (their rate cut) and halted (host index).",
        labels=["source", "state"],
    )
    for source, counts in sorted(hosts.items()):
        for state, count in counts.counted().items():
            gauge.add_metric([source, state], count)
    return gauge


def _dns(reports: Sequence[DnsReport], now_s: float) -> list[Metric]:
    labels = ["worker"]
    queries = CounterMetricFamily(
        "crawler_worker_dns_queries", "Names a worker's resolver looked up.", labels=labels
    )
    hits = CounterMetricFamily(
        "crawler_worker_dns_cache_hits",
        "Lookups a worker's resolver answered without a query of its own (its cache, or a "
        "query in flight).",
        labels=labels,
    )
    failures = CounterMetricFamily(
        "crawler_worker_dns_failures",
        "Lookups of a worker's resolver that failed, by kind (nxdomain, nodata, servfail, "
        "timeout, refused, other).",
        labels=["worker", "kind"],
    )
    cached = GaugeMetricFamily(
        "crawler_worker_dns_names_cached", "Names in a worker's resolver cache.", labels=labels
    )
    age = GaugeMetricFamily(
        "crawler_worker_dns_report_age_seconds",
        "Seconds since a worker last reported its resolver (dns_workers).",
        labels=labels,
    )
    for report in reports:
        worker, figures = [report.worker], report.figures
        queries.add_metric(worker, figures.queries)
        hits.add_metric(worker, figures.hits)
        for kind, count in figures.failures.items():
            failures.add_metric([report.worker, kind], count)
        cached.add_metric(worker, figures.cached)
        age.add_metric(worker, report.age_s(now_s))
    return [queries, hits, failures, cached, age]


class MonitorCollector(Collector):
    """Collects ``monitor_metrics(view())`` at each scrape."""

    def __init__(self, view: Callable[[], MonitorView]) -> None:
        self._view = view

    def collect(self) -> Iterator[Metric]:
        yield from monitor_metrics(self._view())


def loop_histogram(registry: CollectorRegistry) -> Histogram:
    """``crawler_monitor_loop_seconds`` on ``registry``, for the regulator to observe."""
    return Histogram(
        "crawler_monitor_loop_seconds",
        "Duration of the regulator's loop (read, decide, write), seconds.",
        buckets=LOOP_BUCKETS_S,
        registry=registry,
    )


# /healthz: how long without a completed regulator loop, and without a backlog
# measurement, before the monitor reports a problem.
REGULATOR_STALE_S: Final = 30.0
BACKLOG_STALE_MIN_S: Final = 120.0
# In LOG_FREQUENCY_S periods, when that is longer.
BACKLOG_STALE_PERIODS: Final = 10


@dataclasses.dataclass(frozen=True, slots=True)
class HealthLimits:
    """How old the last completed regulator loop and the last backlog measurement may be
    (s) before ``/healthz`` reports a problem."""

    regulator_s: float = REGULATOR_STALE_S
    backlog_s: float = BACKLOG_STALE_MIN_S

    @classmethod
    def for_interval(cls, log_frequency_s: float) -> HealthLimits:
        return cls(backlog_s=max(BACKLOG_STALE_MIN_S, BACKLOG_STALE_PERIODS * log_frequency_s))


def health_problems(
    now_s: float,
    started_s: float,
    regulator_done_s: float | None,
    backlog_done_s: float | None,
    limits: HealthLimits = HealthLimits(),
) -> Sequence[str]:
    """The monitor's problems (empty: healthy), from monotonic times: its start, its
    regulator's last completed loop and its last backlog measurement (None: none yet).

    The regulator completes a loop every second unless Redis is away (or the loop is
    stuck): then no source has a rate and the crawl stands still. The backlog is measured
    every ``LOG_FREQUENCY_S`` unless Kafka is away, which also stops the splitter. A
    monitor just started has the same time to get there.
    """
    problems = []
    regulator_age_s = now_s - (regulator_done_s if regulator_done_s is not None else started_s)
    if regulator_age_s > limits.regulator_s:
        problems.append(
            f"regulator: no loop completed for {regulator_age_s:.0f} s (is Redis reachable?)"
        )
    backlog_age_s = now_s - (backlog_done_s if backlog_done_s is not None else started_s)
    if backlog_age_s > limits.backlog_s:
        problems.append(f"backlog: not measured for {backlog_age_s:.0f} s (is Kafka reachable?)")
    return problems
