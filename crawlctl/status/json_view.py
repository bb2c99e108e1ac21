"""The crawl's state as ``--json`` (``status_json``): every field of the model, numbers
as numbers, None as null, and strict JSON (no NaN or Infinity). Its fields are
documented in docs/operating.md.
"""

from __future__ import annotations

import math
from typing import Any, Final

from crawlctl.status.model import (
    BACKLOG_STALE_S,
    DEFAULT_SORT,
    CrawlStatus,
    SourceStatus,
    override_rps,
    sort_sources,
    source_eta,
    totals,
)

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
    }


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
