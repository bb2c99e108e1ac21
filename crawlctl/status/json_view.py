"""The crawl's state as ``--json`` (``status_json``): every field of the model, numbers
as numbers, None as null, and strict JSON (no NaN or Infinity); one source's hosts as
``--hosts SOURCE --json`` (``hosts_json``). Their fields are documented in
docs/operating.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final

from crawlctl.status.hosts import (
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
    CrawlStatus,
    SourceStatus,
    duplicates,
    host_totals,
    override_rps,
    sort_sources,
    source_eta,
    totals,
)
from image_crawler.contract import CrawlPause
from image_crawler.dns_stats import DnsFigures, DnsReport

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
        "override_rps": _number(override_rps(source)),
        "robots_disallowed": source.robots_disallowed,
        "no_index": source.no_index,
        "robots_exempt": source.robots_exempt,
        "crawl_delay_s": source.crawl_delay_s,
        "hosts": source.hosts.counted() if source.hosts is not None else None,
        **placements_json(source.placements),
    }


def placements_json(placements: Mapping[str, int]) -> dict[str, Any]:
    """The deduplication stage's placements by kind (``{}``: none), the duplicates
    (exact and near) and their share of those placed (null: none placed)."""
    found = duplicates(placements)
    return {
        "placements": dict(placements),
        "duplicates": found.count,
        "duplicate_share": found.share,
    }


def dns_json(figures: DnsFigures) -> dict[str, Any]:
    """DNS figures (a worker's, or their sum) for ``--json``."""
    return {
        "queries": figures.queries,
        "cache_hits": figures.hits,
        "lookups": figures.lookups,
        "hit_ratio": figures.hit_ratio,
        "failures": dict(figures.failures),
        "failed": figures.failed,
        "names_cached": figures.cached,
    }


def _crawl_dns_json(status: CrawlStatus) -> dict[str, Any] | None:
    figures = status.dns
    if figures is None or status.now_s is None:
        return None
    reporting = [r for r in status.dns_reports if not r.stale(status.now_s)]
    return {"workers": len(reporting), **dns_json(figures)}


def _report_json(report: DnsReport, now_s: float | None) -> dict[str, Any]:
    return {
        "worker": report.worker,
        "age_s": None if now_s is None else report.age_s(now_s),
        "stale": None if now_s is None else report.stale(now_s),
        **dns_json(report.figures),
    }


def _pause_json(pause: CrawlPause | None) -> dict[str, Any] | None:
    """``crawl_paused`` as it is in Redis (``CrawlPause``'s fields), None while the crawl
    runs."""
    return None if pause is None else json.loads(pause.to_json())


def status_json(
    status: CrawlStatus, *, sort: str = DEFAULT_SORT, top: int | None = None
) -> dict[str, Any]:
    """The ``--json`` document: ``{"version", "general": {...}, "sources": [...]}``, the
    sources in ``sort`` order, the first ``top`` (None: all). Its fields are documented
    in docs/operating.md; a new field may be added, none changes meaning without a new version."""
    total = totals(status.sources)
    ordered = sort_sources(status.sources, sort)
    shown = ordered if top is None else ordered[:top]
    age = status.backlog_age_s
    hosts = host_totals(status.sources)
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
            "hosts": hosts.counted() if hosts is not None else None,
            "paused": _pause_json(status.paused),
            "dns": _crawl_dns_json(status),
            "dns_errors": status.dns_errors,
            **placements_json(status.placements),
        },
        "sources": [source_json(source) for source in shown],
        "dns_workers": [_report_json(report, status.now_s) for report in status.dns_reports],
    }


def host_json(row: HostRow, hosts: SourceHosts) -> dict[str, Any]:
    """One host for ``--hosts SOURCE --json``."""
    until = row.number("until")
    return {
        "host": row.host,
        "state": row.state,
        "why": row.why,
        "why_text": why_text(row, hosts),
        "rate_rps": _number(effective_rps(row, hosts.source_rps)),
        "asked_ago_s": max(hosts.now_s - row.asked_at_s, 0.0),
        "last_answer": last_answer(row),
        "fails": row.count("fails"),
        "halts": row.count("halts"),
        "halted_for_s": max(until - hosts.now_s, 0.0) if until is not None else None,
        "given_up": row.number("gone") is not None,
        "operator_halt": row.fields.get("halt") or None,
        "override_rps": row.number("override"),
        "crawl_delay_s": row.number("delay"),
        "backlog": None,  # not known per host (see docs/operating.md)
    }


def hosts_json(hosts: SourceHosts) -> dict[str, Any]:
    """The ``--hosts SOURCE --json`` document: the source's counts (null: no host index),
    its rate, and the hosts shown, the troubled first (docs/operating.md)."""
    counts = hosts.counts
    return {
        "version": JSON_VERSION,
        "source": hosts.source,
        "counts": {**counts.counted(), "at_pace": counts.at_pace} if counts is not None else None,
        "source_rps": _number(hosts.source_rps),
        "host_rate_rps": _number(hosts.host_rate_rps),
        "hosts": [
            host_json(row, hosts) for state in SHOWN_ORDER for row in hosts.rows.get(state, ())
        ],
    }
