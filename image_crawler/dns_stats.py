"""The workers' DNS figures, shared through Redis for operators (issue 38).

Each worker's resolver (worker/download/dns.py) counts the names it looked up (queries),
the lookups it answered without a query of its own (cache hits), its failures by kind and
the names it holds. Its own ``/metrics`` exports them, but ``image-crawler status`` reads
Redis and the monitor's dashboard reads the monitor's ``/metrics``: so every worker also
writes them to its field of ``DNS_WORKERS_HASH`` (its name: host name and process id) every
``DNS_REPORT_EVERY_S``, as JSON (``DnsReport``), and deletes the field as it stops.

Figures are a worker's since it started: one that restarts starts again from 0 under a
new name. The crawl's figures are the sum over the workers reporting now (``crawl_dns``):
a report older than ``DNS_STALE_S`` is a worker that stopped without deleting its field
(killed, or hung), shown as such and left out of the sum. Each report also deletes the
fields older than ``DNS_FORGET_S``, so that they do not pile up. A hash of a few fields a
worker: its reads cost nothing whatever the number of hosts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
from collections.abc import Iterable, Mapping
from typing import Any, Final

import redis.asyncio as aioredis

from image_crawler.contract import DNS_FORGET_S, DNS_STALE_S, DNS_WORKERS_HASH

# The kinds of failed lookup, in the order they are shown (worker/download/dns.py's
# FAILURE_KINDS): the first two are the names' (they do not exist), the others the
# resolver's trouble.
DNS_FAILURE_KINDS: Final = ("nxdomain", "nodata", "servfail", "timeout", "refused", "other")


def _in_kind_order(failures: Mapping[str, int]) -> dict[str, int]:
    # The known kinds first and in their order, any other after them by name; none at 0.
    others = sorted(set(failures) - set(DNS_FAILURE_KINDS))
    return {kind: failures[kind] for kind in (*DNS_FAILURE_KINDS, *others) if failures.get(kind)}


@dataclasses.dataclass(frozen=True, slots=True)
class DnsFigures:
    """A resolver's counts, or several summed: ``queries`` (names looked up), ``hits``
    (lookups answered without a query of their own: from the cache, a remembered
    failure included, or by joining a query in flight), ``failures`` by kind (those with
    any, in ``DNS_FAILURE_KINDS`` order) and ``cached`` (names held now)."""

    queries: int = 0
    hits: int = 0
    failures: Mapping[str, int] = dataclasses.field(default_factory=dict)
    cached: int = 0

    @property
    def lookups(self) -> int:
        """Every name asked of the resolver: its queries and its hits."""
        return self.queries + self.hits

    @property
    def hit_ratio(self) -> float | None:
        """The share of lookups answered without a query; None before the first."""
        return self.hits / self.lookups if self.lookups else None

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    def __add__(self, other: DnsFigures) -> DnsFigures:
        kinds = set(self.failures) | set(other.failures)
        failures = {k: self.failures.get(k, 0) + other.failures.get(k, 0) for k in kinds}
        return DnsFigures(
            self.queries + other.queries,
            self.hits + other.hits,
            _in_kind_order(failures),
            self.cached + other.cached,
        )


def figures(queries: int, hits: int, failures: Mapping[str, int], cached: int) -> DnsFigures:
    """``DnsFigures`` of a resolver's counts, its failures put in kind order."""
    return DnsFigures(queries, hits, _in_kind_order(failures), cached)


@dataclasses.dataclass(frozen=True, slots=True)
class DnsReport:
    """One worker's figures as it last wrote them, at ``at_s`` (Unix s, its clock)."""

    worker: str
    figures: DnsFigures
    at_s: float

    def age_s(self, now_s: float) -> float:
        """Seconds since the report at ``now_s`` (never below 0: clocks a little apart)."""
        return max(now_s - self.at_s, 0.0)

    def stale(self, now_s: float, stale_s: float = DNS_STALE_S) -> bool:
        """Older than ``stale_s``: its worker stopped reporting."""
        return self.age_s(now_s) > stale_s

    def to_json(self) -> str:
        f = self.figures
        return json.dumps(
            {
                "queries": f.queries,
                "hits": f.hits,
                "failures": dict(f.failures),
                "cached": f.cached,
                "at": self.at_s,
            },
            separators=(",", ":"),
        )


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(value)
    return int(value)


def parse_report(worker: str, raw: str | bytes) -> DnsReport | None:
    """A field of ``DNS_WORKERS_HASH`` as a report; None when it is none (written by hand,
    or cut short)."""
    try:
        obj = json.loads(raw)
        failures = obj.get("failures") or {}
        at_s = float(obj["at"])
        if not math.isfinite(at_s):
            return None
        return DnsReport(
            worker,
            figures(
                _count(obj["queries"]),
                _count(obj["hits"]),
                {str(kind): _count(n) for kind, n in failures.items()},
                _count(obj.get("cached", 0)),
            ),
            at_s,
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def parse_reports(fields: Mapping[Any, str | bytes]) -> tuple[DnsReport, ...]:
    """The hash's fields as reports, by worker name; those that are none are left out."""
    named = {_text(worker): raw for worker, raw in fields.items()}
    reports = (parse_report(worker, raw) for worker, raw in sorted(named.items()))
    return tuple(report for report in reports if report is not None)


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def crawl_dns(
    reports: Iterable[DnsReport], now_s: float, stale_s: float = DNS_STALE_S
) -> DnsFigures | None:
    """The figures of the workers reporting at ``now_s`` (not stale), summed; None when
    none is."""
    fresh = [report.figures for report in reports if not report.stale(now_s, stale_s)]
    return sum(fresh[1:], fresh[0]) if fresh else None


def worker_name() -> str:
    """This process's name in ``DNS_WORKERS_HASH``: ``{host name}:{process id}`` (a
    container's host name is its id, a Kubernetes pod's its name)."""
    return f"{socket.gethostname()}:{os.getpid()}"


async def write_report(
    redis: aioredis.Redis, report: DnsReport, forget_s: float = DNS_FORGET_S
) -> None:
    """Write ``report`` to its worker's field, and delete the fields of reports older
    than ``forget_s`` before it (workers gone without deleting theirs). Raises
    ``RedisError``."""
    await redis.hset(DNS_WORKERS_HASH, report.worker, report.to_json())
    fields = await redis.hgetall(DNS_WORKERS_HASH)
    # Only reports: a field that is none (written by hand) is not ours to delete.
    old = [found.worker for found in parse_reports(fields) if found.at_s < report.at_s - forget_s]
    if old:
        await redis.hdel(DNS_WORKERS_HASH, *old)


async def delete_report(redis: aioredis.Redis, worker: str) -> None:
    """Delete ``worker``'s field (it stops). Raises ``RedisError``."""
    await redis.hdel(DNS_WORKERS_HASH, worker)


async def read_reports(redis: aioredis.Redis) -> tuple[DnsReport, ...]:
    """Every worker's report, by name. Raises ``RedisError``."""
    return parse_reports(await redis.hgetall(DNS_WORKERS_HASH))
