"""The monitoring log: a ``monitoring_update`` event every ``LOG_FREQUENCY_S``.

Its keys are those of the original README's example, and the pacing of each source::

    general:  global_max_rps, error_rps, processing_rate, success_rps,
              circuit_breaker_tripped, num_resized, resize_errors, split_rate,
              backlog, eta_s, specific_omitted
    specific: {source: {successful, error, last_50_statuses, rate_limit,
                        effective_rate, pacing, pacing_why, backlog, eta_s[, rechecks]}}

Counters come from Redis (one pipelined round trip); rates, pacing, halts and the
last-50 histograms from the regulator's latest snapshot. ``*_rps`` and ``*_rate`` values
are the counters' growth over the measured interval, per second. ``rate_limit`` is a
source's configured rate (computed, or its override; at most 1 / its robots.txt
Crawl-delay, ``pacing_why`` then says so), ``effective_rate`` the rate its
requests are paced at now (lower while its server pushes back, 0 while halted),
``pacing`` its state (``image_crawler.contract.PACE_STATES``) and ``pacing_why`` why.
``global_max_rps`` sums the effective rates of the known sources that are not halted.

``backlog`` is a source's URLs split and not yet taken by a worker, and ``eta_s`` the
seconds to crawl them at its effective rate (``crawl_monitor.backlog``), from the latest
backlog measurement; in ``general`` the sum, and the crawl's ETA
(``image_crawler.contract.crawl_eta_s``: the largest ETA of the known sources being
crawled). Both are null until a first measurement, and ``eta_s`` is null when infinite:
a source with a backlog and no rate (halted, stopped, or not a known source). Rates are
rounded to six significant digits and ETAs to the second.

``rechecks`` (issue 30) is in a source's entry only when it has any: its re-checks of
earlier crawls ended so far, by status (``image_crawler.contract.RECHECK_STATUSES``, in
that order, the statuses with none left out), from the hash ``rechecks`` (fields
``{source}:{status}``).

``specific`` lists the sources with any success, error, recent status, backlog or
re-check, every halted one, and every one held below its configured rate; with
``top_sources`` > 0 at most that many (``MONITORING_TOP_SOURCES``): first the halted
ones, then the busiest (most URLs finished since the last event), then the largest
backlogs. ``specific_omitted`` counts the sources left out; ``/metrics`` and
``image-crawler status`` have every source.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from crawl_monitor.backlog import Backlog
from crawl_monitor.policy.decision import RegulatorSnapshot
from crawl_monitor.policy.rates import next_tick_at
from image_crawler.contract import (
    DUPLICATE_KINDS,
    NUM_RESIZED,
    NUM_SPLIT,
    PACE_BACKOFF,
    PACE_FLOOR,
    PACE_RECOVERING,
    PLACEMENTS_HASH,
    RECHECK_STATUSES,
    RECHECKS_HASH,
    RESIZE_ERRORS,
    PacingInfo,
    Status,
    crawl_eta_s,
    eta_s,
    num_resized_key,
    resize_errors_key,
    source_and_check,
    source_and_kind,
)
from image_crawler.logs import get_logger
from image_crawler.retry import sleep_unless_stopped

log = get_logger(__name__)

# Pacing states of a source held below its configured rate.
_CUT = frozenset({PACE_BACKOFF, PACE_RECOVERING, PACE_FLOOR})


@dataclasses.dataclass(frozen=True, slots=True)
class Counters:
    """The crawl's counters at one instant."""

    num_resized: int = 0
    resize_errors: int = 0
    num_split: int = 0
    successful: Mapping[str, int] = dataclasses.field(default_factory=dict)
    errors: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # Of the errors, images their servers asked us not to index
    # (resize_errors:{source}:NoIndex).
    no_index: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # Of the errors, URLs whose host's name did not resolve (resize_errors:{source}:DnsError).
    dns_errors: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # Re-checks ended, by status in the order of RECHECK_STATUSES, of the sources that
    # have any (the hash rechecks, field {source}:{status}; a status with none is left out).
    rechecks: Mapping[str, Mapping[str, int]] = dataclasses.field(default_factory=dict)
    # The deduplication stage's placements, by kind in the order of DUPLICATE_KINDS, of
    # the sources that have any (the hash dedup_placements, field {source}:{kind}).
    placements: Mapping[str, Mapping[str, int]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class MonitoringUpdate:
    general: dict[str, Any]
    specific: dict[str, dict[str, Any]]


def _per_second(now: int, before: int | None, elapsed_s: float) -> float:
    if before is None or elapsed_s <= 0:
        return 0.0
    # A counter that went down was reset (Redis flushed): count from zero.
    return round(max(0, now - before) / elapsed_s, 6)


def build_update(
    now: Counters,
    before: Counters | None,
    elapsed_s: float,
    snapshot: RegulatorSnapshot | None,
    backlog: Backlog | None = None,
    *,
    top_sources: int = 0,
) -> MonitoringUpdate:
    """The event's contents from two readings ``elapsed_s`` apart, the regulator's view and
    the latest backlog measurement (None: none yet); ``top_sources`` > 0 caps ``specific``.

    Without an earlier reading, rates are 0.
    """
    tripped = (snapshot.halted | snapshot.temp_halted) if snapshot else frozenset()
    listed = _specific(now, snapshot, backlog, tripped)
    specific = _top(listed, top_sources, before, tripped)
    omitted = len(listed) - len(specific)
    general = _general(now, before, elapsed_s, snapshot, backlog, tripped, omitted)
    return MonitoringUpdate(general=general, specific=specific)


def _specific(
    now: Counters,
    snapshot: RegulatorSnapshot | None,
    backlog: Backlog | None,
    tripped: frozenset[str],
) -> dict[str, dict[str, Any]]:
    """The entry of every source worth listing (see the module's docstring), by name."""
    rates: Mapping[str, float] = snapshot.rates if snapshot else {}
    pacing: Mapping[str, PacingInfo] = snapshot.pacing if snapshot else {}
    last_statuses: Mapping[str, Mapping[str, int]] = snapshot.last_statuses if snapshot else {}
    waiting: Mapping[str, int] = backlog.sources if backlog else {}
    specific: dict[str, dict[str, Any]] = {}
    listed = set(rates) | tripped | set(now.successful) | set(now.errors) | set(waiting)
    for source in sorted(listed | set(now.rechecks)):
        successful = now.successful.get(source, 0)
        error = now.errors.get(source, 0)
        last = dict(sorted(last_statuses.get(source, {}).items()))
        paced = pacing.get(source)
        adapted = paced is not None and paced.state in _CUT
        urls = waiting.get(source, 0)
        rechecked = now.rechecks.get(source)
        if not (successful or error or last or urls or rechecked or source in tripped or adapted):
            continue
        effective_rps = paced.rate_rps if paced else 0.0
        specific[source] = {
            "successful": successful,
            "error": error,
            "last_50_statuses": last,
            "rate_limit": _rate(rates.get(source, 0.0)),
            "effective_rate": _rate(effective_rps),
            "pacing": paced.state if paced else None,
            "pacing_why": paced.why if paced else None,
            "backlog": urls if backlog else None,
            "eta_s": _seconds(eta_s(urls, effective_rps)) if backlog else None,
        }
        if rechecked:
            specific[source]["rechecks"] = dict(rechecked)
    return specific


def _top(
    specific: dict[str, dict[str, Any]],
    top_sources: int,
    before: Counters | None,
    tripped: frozenset[str],
) -> dict[str, dict[str, Any]]:
    """``specific`` cut to its ``top_sources`` first by ``_rank`` (0: all of it)."""
    if not 0 < top_sources < len(specific):
        return specific
    kept = sorted(specific, key=lambda s: _rank(s, specific[s], before, tripped))[:top_sources]
    return {source: specific[source] for source in sorted(kept)}


def _general(
    now: Counters,
    before: Counters | None,
    elapsed_s: float,
    snapshot: RegulatorSnapshot | None,
    backlog: Backlog | None,
    tripped: frozenset[str],
    omitted: int,
) -> dict[str, Any]:
    """The crawl's figures; ``omitted``: the sources ``specific`` leaves out."""
    success_rps = _per_second(now.num_resized, before.num_resized if before else None, elapsed_s)
    error_rps = _per_second(now.resize_errors, before.resize_errors if before else None, elapsed_s)
    split_rate = _per_second(now.num_split, before.num_split if before else None, elapsed_s)
    pacing: Mapping[str, PacingInfo] = snapshot.pacing if snapshot else {}
    crawl_eta = None
    if backlog is not None and snapshot is not None:
        rates = {s: p.rate_rps for s, p in pacing.items()}
        crawl_eta = _seconds(crawl_eta_s(backlog.sources, rates))
    return {
        "global_max_rps": round(
            sum((p.rate_rps for source, p in pacing.items() if source not in tripped), 0.0), 6
        ),
        "error_rps": error_rps,
        "processing_rate": round(success_rps + error_rps, 6),
        "success_rps": success_rps,
        "circuit_breaker_tripped": sorted(tripped),
        "num_resized": now.num_resized,
        "resize_errors": now.resize_errors,
        "split_rate": split_rate,
        "backlog": backlog.total if backlog else None,
        "eta_s": crawl_eta,
        "specific_omitted": omitted,
    }


def _rate(rate_rps: float) -> float:
    """Six significant digits: a rate computed from an image count has sixteen, and an
    override of one request an hour still reads as one."""
    return float(f"{rate_rps:.6g}")


def _seconds(value_s: float) -> int | None:
    """Whole seconds for the log; None for an infinite ETA."""
    return round(value_s) if math.isfinite(value_s) else None


def _rank(
    source: str, entry: Mapping[str, Any], before: Counters | None, tripped: frozenset[str]
) -> tuple[bool, int, int, str]:
    """Sort key of the sources kept under ``top_sources``: the halted ones first, then the
    most URLs finished since ``before``, then the largest backlog."""
    finished = entry["successful"] + entry["error"]
    if before is not None:
        finished -= before.successful.get(source, 0) + before.errors.get(source, 0)
    return (source not in tripped, -finished, -(entry["backlog"] or 0), source)


def _int(value: object) -> int:
    if value is None:
        return 0
    try:
        return int(str(value))
    except ValueError:
        return 0


def _rechecks(sources: list[str], fields: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """The non-zero counts of ``fields`` (RECHECKS_HASH's) of the known ``sources`` that
    have any, by source name, each source's in the order of RECHECK_STATUSES. Fields of
    other sources or statuses are left out."""
    if not fields:  # no re-checks at all: the known sources are not even looked at
        return {}
    known = set(sources)
    found: dict[str, dict[str, int]] = {}
    for field, value in fields.items():
        source, status = source_and_check(field)
        if source in known and status in RECHECK_STATUSES and (count := _int(value)):
            found.setdefault(source, {})[status] = count
    return {source: _in_check_order(found[source]) for source in sorted(found)}


def _in_check_order(counts: Mapping[str, int]) -> dict[str, int]:
    return {status: counts[status] for status in RECHECK_STATUSES if status in counts}


def _placements(sources: list[str], fields: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """The non-zero counts of ``fields`` (PLACEMENTS_HASH's) of the known ``sources``, by
    source name, each source's in the order of DUPLICATE_KINDS; others left out."""
    known = set(sources)
    found: dict[str, dict[str, int]] = {}
    for field, value in fields.items():
        source, kind = source_and_kind(field)
        if source in known and kind in DUPLICATE_KINDS and (count := _int(value)) > 0:
            found.setdefault(source, {})[kind] = count
    return {
        source: {kind: found[source][kind] for kind in DUPLICATE_KINDS if kind in found[source]}
        for source in sorted(found)
    }


# Where read_counters's pipeline answers the rechecks and placements hashes.
_RECHECKS_REPLY: Final = 7
_PLACEMENTS_REPLY: Final = 8


def _counts(sources: list[str], values: list[Any]) -> dict[str, int]:
    # MGET's values by source, those with a count.
    return {s: n for s, v in zip(sources, values, strict=True) if (n := _int(v))}


async def read_counters(redis: aioredis.Redis, sources: list[str]) -> Counters:
    """Global and per-source counters in one pipelined round trip.

    A ``rechecks`` or ``dedup_placements`` key that is no hash reads as none, as a
    per-source key of another type reads as 0; the other counters' errors are raised.
    """
    async with redis.pipeline(transaction=False) as pipe:
        pipe.get(NUM_RESIZED)
        pipe.get(RESIZE_ERRORS)
        pipe.get(NUM_SPLIT)
        if sources:
            pipe.mget([num_resized_key(s) for s in sources])
            pipe.mget([resize_errors_key(s) for s in sources])
            pipe.mget([resize_errors_key(s, Status.NO_INDEX) for s in sources])
            pipe.mget([resize_errors_key(s, Status.DNS_ERROR) for s in sources])
            pipe.hgetall(RECHECKS_HASH)
            pipe.hgetall(PLACEMENTS_HASH)
        replies = await pipe.execute(raise_on_error=False)
    for reply in replies[:_RECHECKS_REPLY]:
        if isinstance(reply, Exception):
            raise reply
    successful: dict[str, int] = {}
    errors: dict[str, int] = {}
    no_index: dict[str, int] = {}
    dns_errors: dict[str, int] = {}
    rechecks: dict[str, dict[str, int]] = {}
    placements: dict[str, dict[str, int]] = {}
    if sources:
        successful = _counts(sources, replies[3])
        errors = _counts(sources, replies[4])
        no_index = _counts(sources, replies[5])
        dns_errors = _counts(sources, replies[6])
        fields = replies[_RECHECKS_REPLY]
        rechecks = _rechecks(sources, fields if isinstance(fields, Mapping) else {})
        fields = replies[_PLACEMENTS_REPLY]
        placements = _placements(sources, fields if isinstance(fields, Mapping) else {})
    return Counters(
        num_resized=_int(replies[0]),
        resize_errors=_int(replies[1]),
        num_split=_int(replies[2]),
        successful=successful,
        errors=errors,
        no_index=no_index,
        dns_errors=dns_errors,
        rechecks=rechecks,
        placements=placements,
    )


class MonitoringLog:
    """Logs ``monitoring_update`` every ``interval_s`` until stopped; ``counters`` is the
    latest reading (read by the metrics, which thus cost Redis nothing)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        snapshot: Callable[[], RegulatorSnapshot | None],
        interval_s: float,
        *,
        backlog: Callable[[], Backlog | None] = lambda: None,
        top_sources: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._redis = redis
        self._snapshot = snapshot
        self._backlog = backlog
        self._interval_s = interval_s
        self._top_sources = top_sources
        self._clock = clock
        self._before: Counters | None = None
        self._before_at = 0.0
        self.counters: Counters | None = None

    async def report(self) -> MonitoringUpdate:
        """Read the counters, log one ``monitoring_update`` and return its contents."""
        snapshot = self._snapshot()
        backlog = self._backlog()
        sources: set[str] = set(backlog.sources) if backlog else set()
        if snapshot is not None:
            sources |= set(snapshot.rates) | snapshot.halted | snapshot.temp_halted
        now = await read_counters(self._redis, sorted(sources))
        at = self._clock()
        update = build_update(
            now,
            self._before,
            at - self._before_at,
            snapshot,
            backlog,
            top_sources=self._top_sources,
        )
        self._before, self._before_at = now, at
        self.counters = now
        log.info("monitoring_update", general=update.general, specific=update.specific)
        return update

    async def baseline(self) -> None:
        """Take the first reading, so that the first event's rates cover one interval."""
        self._before = self.counters = await read_counters(self._redis, [])
        self._before_at = self._clock()

    async def run(self, stop: asyncio.Event) -> None:
        with contextlib.suppress(RedisError):
            await self.baseline()
        origin = time.monotonic()
        while True:
            wake_at = next_tick_at(origin, time.monotonic(), self._interval_s)
            if await sleep_unless_stopped(stop, wake_at - time.monotonic()):
                return
            try:
                await self.report()
            except RedisError as e:
                log.warning("redis_unavailable", op="monitoring_update", error=repr(e))
            except Exception:
                log.exception("monitoring_error")
