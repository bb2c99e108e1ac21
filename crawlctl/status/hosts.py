"""One source's hosts as the operator sees them: ``image-crawler status --hosts SOURCE``.

``read_source_hosts`` reads the source's host index (``host_index:{source}``, see
image_crawler/contract.py): its counts (``image_crawler.host_index``), and the hosts asked
about most recently in each state, a few per state (one ZRANGE a state); then only those
hosts' hashes (``pace_host:{source}:{host}``, one HGETALL each, pipelined), with the
source's rate (``pace_rate:``), ``host_rate:{source}`` and Redis' clock. Nothing SCANs the
``pace_host:`` keys: with a million hosts the read costs what the hosts shown cost.
``parse_host`` (pure) turns a member and its hash into a ``HostRow``; ``why_text`` says
why a host is paced as it is, from what the pacing script decided (the hash's ``why``).

The hosts shown, up to a number of each state: the troubled first (halted, backed off,
paced below the source's rate), then the busiest (the hosts at the source's pace:
nothing of their own slows them), each state's most recently asked about first.

A host's backlog is not known: URLs wait per source (in ``urls.{source}``, whose backlog
``image-crawler status`` shows) and in the workers, which count none per host; the views
say so rather than show a figure.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

import redis.asyncio as aioredis

from image_crawler.contract import (
    HOST_AT_PACE,
    HOST_BACKED_OFF,
    HOST_HALTED,
    HOST_INDEX_BAND,
    HOST_OVERRIDE_FIELD,
    HOST_PACED,
    HOST_STATES,
    HOST_WHY,
    WHY_BREAKER,
    WHY_CAP,
    WHY_CLIMB,
    WHY_CRAWL_DELAY,
    WHY_CUT,
    WHY_GONE,
    WHY_OPERATOR,
    WHY_PACE,
    WHY_SLOW_START,
    HostIndexEntry,
    host_index_key,
    host_rate_key,
    pace_host_key,
    pace_rate_key,
)
from image_crawler.host_index import HostCounts, read_host_counts

# The order the states are shown in: the troubled first, the busiest last.
SHOWN_ORDER: Final = (HOST_HALTED, HOST_BACKED_OFF, HOST_PACED, HOST_AT_PACE)
# The hash's "last": how the host's last answer counted (worker/politeness/hosts.py).
LAST_ANSWERS: Final = {1: "clean", 2: "refused", 3: "failed"}
BACKLOG_UNKNOWN: Final = (
    "backlog per host: not known (URLs wait per source, in urls.{source}: `image-crawler "
    "status` shows its backlog; workers count none per host)"
)


@dataclasses.dataclass(frozen=True, slots=True)
class HostRow:
    """One host: its state and when it was last asked about (its index member), and its
    hash as read (empty when it expired since)."""

    host: str
    state: str | None
    asked_at_s: float
    fields: Mapping[str, str]

    def number(self, name: str) -> float | None:
        """The hash's field ``name`` as a finite number; None when absent or not one."""
        try:
            value = float(self.fields.get(name) or "nan")
        except ValueError:
            return None
        return value if math.isfinite(value) else None

    def count(self, name: str) -> int:
        value = self.number(name)
        return int(value) if value is not None else 0

    @property
    def why(self) -> str | None:
        why = self.fields.get("why")
        return why if why in HOST_WHY else None


@dataclasses.dataclass(frozen=True, slots=True)
class SourceHosts:
    """What ``status --hosts SOURCE`` shows: the source's host counts (None: it has no
    host index), its rate now (``pace_rate:``), ``host_rate:{source}``, Redis' clock
    (Unix s), and the hosts read, by state in ``SHOWN_ORDER``, each state's most recently
    asked about first."""

    source: str
    counts: HostCounts | None
    source_rps: float | None
    host_rate_rps: float | None
    now_s: float
    rows: Mapping[str, tuple[HostRow, ...]]


def _number(raw: Any) -> float | None:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def parse_host(host: str, score: float, fields: Mapping[str, str]) -> HostRow:
    entry = HostIndexEntry.of(score)
    return HostRow(host, entry.state, entry.asked_at_s, dict(fields))


def effective_rps(row: HostRow, source_rps: float | None) -> float | None:
    """The rate the host is paced at (requests/s): 0 while halted; else its rate (capped
    by the source's), or one request per Crawl-delay when that is slower."""
    if row.state == HOST_HALTED:
        return 0.0
    rate = row.number("rate")
    if rate is not None and source_rps is not None and source_rps < rate:
        rate = source_rps
    delay = row.number("delay")
    if row.why == WHY_CRAWL_DELAY and delay and (rate is None or 1 / delay < rate):
        return 1 / delay
    return rate


def _clock(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).strftime("%H:%M:%S UTC")


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{max(seconds, 0):.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def why_text(row: HostRow, hosts: SourceHosts) -> str:
    """Why ``row``'s host is paced as it is, for operators: ``"crawl-delay 3 s"``,
    ``"cut by its server 12 s ago, climbing back"``, ``"slow start"``, ``"its override
    0.5/s"``, ``"halted by its breaker until 12:03:04 UTC, 5 failures in a row"``,
    ``"operator halt: asked by its webmaster"``, ``"given up at ...: its URLs end as
    HostUnavailable"``..."""
    why = row.why or {state: why for why, state in HOST_WHY.items()}.get(row.state or "")
    now = hosts.now_s
    if why == WHY_OPERATOR:
        return f"operator halt: {row.fields.get('halt', '')}"
    if why in (WHY_BREAKER, WHY_GONE):
        return _breaker_text(row, why, now)
    if why == WHY_CUT:
        cut = row.number("cut")
        since = f" {_ago(now - cut)} ago" if cut is not None else ""
        return f"cut by its server{since} (429, 503, timeouts, slow answers), climbing back"
    if why == WHY_CRAWL_DELAY:
        return f"crawl-delay {row.number('delay') or 0:g} s (its robots.txt)"
    if why == WHY_SLOW_START:
        return "slow start (a new host, climbing on clean answers)"
    if why == WHY_CAP:
        return _cap_text(row, hosts)
    if why == WHY_CLIMB:
        return "climbing to its ceiling, which rose"
    return "at the source's pace" if why == WHY_PACE else "-"


def _breaker_text(row: HostRow, why: str, now: float) -> str:
    parts = []
    if row.count("fails"):
        parts.append(f"{row.count('fails')} failures in a row")
    if row.count("halts"):
        parts.append(f"{row.count('halts')} halts")
    since = row.number("since")
    if since is not None:
        parts.append(f"failing for {_ago(now - since)}")
    streak = f" ({', '.join(parts)})" if parts else ""
    gone = row.number("gone")
    if why == WHY_GONE and gone is not None:
        return f"given up at {_clock(gone)}: its URLs end as HostUnavailable{streak}"
    until = row.number("until")
    if until is None:
        return f"halted by its breaker{streak}"
    return f"halted by its breaker until {_clock(until)}, in {_ago(until - now)}{streak}"


def _cap_text(row: HostRow, hosts: SourceHosts) -> str:
    override = row.number(HOST_OVERRIDE_FIELD)
    if override is not None:
        return f"its override, {override:g}/s"
    if hosts.host_rate_rps is not None and hosts.host_rate_rps > 0:
        return f"host_rate:{hosts.source}, {hosts.host_rate_rps:g}/s"
    return "MAX_HOST_RATE (the workers' ceiling for any one host)"


def last_answer(row: HostRow) -> str:
    return LAST_ANSWERS.get(row.count("last"), "-")


def _pairs(reply: Any) -> list[tuple[str, float]]:
    # ZRANGE ... WITHSCORES: [(member, score), ...]; an error (not a sorted set): none.
    if not isinstance(reply, list):
        return []
    return [(str(member), float(score)) for member, score in reply]


async def read_source_hosts(redis: aioredis.Redis, source: str, per_state: int = 10) -> SourceHosts:
    """``source``'s hosts (see the module): its counts, the source's rate and host_rate,
    and up to ``per_state`` hosts of each state. Three round trips; raises
    ``RedisError``."""
    key = host_index_key(source)
    async with redis.pipeline(transaction=False) as pipe:
        pipe.time()
        pipe.get(pace_rate_key(source))
        pipe.get(host_rate_key(source))
        for state in SHOWN_ORDER:
            low = HOST_STATES.index(state) * HOST_INDEX_BAND
            pipe.zrange(
                key,
                f"({low + HOST_INDEX_BAND!r}",
                repr(low),
                desc=True,
                byscore=True,
                offset=0,
                num=per_state,
                withscores=True,
            )
        (seconds, micros), rate, host_rate, *members = await pipe.execute(raise_on_error=False)
    listed = [pair for reply in members for pair in _pairs(reply)]
    async with redis.pipeline(transaction=False) as pipe:
        for host, _ in listed:
            pipe.hgetall(pace_host_key(source, host))
        hashes = await pipe.execute(raise_on_error=False)
    counts = (await read_host_counts(redis, [source])).get(source)
    rows = _by_state(listed, hashes)
    now_s = seconds + micros / 1e6
    return SourceHosts(source, counts, _number(rate), _number(host_rate), now_s, rows)


def _by_state(
    listed: Sequence[tuple[str, float]], hashes: Sequence[Any]
) -> dict[str, tuple[HostRow, ...]]:
    by_state: dict[str, list[HostRow]] = {state: [] for state in SHOWN_ORDER}
    for (host, score), fields in zip(listed, hashes, strict=True):
        row = parse_host(host, score, fields if isinstance(fields, dict) else {})
        if row.state is not None:
            by_state[row.state].append(row)
    return {state: tuple(rows) for state, rows in by_state.items()}
