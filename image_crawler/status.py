"""The crawl's state as the operator sees it: ``image-crawler status``.

``read_status`` gathers every source's keys in one round trip (a Lua script: the set of
sources is itself in Redis, so a plain pipeline would need two) and ``status_table``
renders the result; ``parse_status`` between them is pure. The sources listed are the
union of ``inbound_sources``, the monitor's ``crawl_rates``, ``halted`` and
``temp_halted``.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Mapping
from typing import Any, Final

import redis.asyncio as aioredis
from rich.table import Table
from rich.text import Text

from image_crawler.contract import (
    HALTED_SET,
    INBOUND_SOURCES_SET,
    LAST_50_PREFIX,
    NUM_MALFORMED,
    NUM_RESIZED,
    NUM_SPLIT,
    OVERRIDE_RATE_ALIAS_PREFIX,
    OVERRIDE_RATE_PREFIX,
    RATES_HASH,
    RESIZE_ERRORS,
    TEMP_HALTED_SET,
    TOKENS_PREFIX,
)

# ARGV: the set and hash names, then key prefixes and counters, in the order of _ARGV.
# Answers JSON {"sources": {name: {...}}, "halted": [...], "temp_halted": [...],
# "totals": {...}}. A key of the wrong type reads as absent rather than failing the view.
_SCRIPT: Final = """
local inbound, halted_set, temp_set, rates_hash = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local tokens_prefix, resized, errors, last_prefix = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local override_prefix, alias_prefix, split, malformed = ARGV[9], ARGV[10], ARGV[11], ARGV[12]

local function call(...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err then return false end
  return reply
end

local names, seen = {}, {}
local function add(list)
  if not list then return end
  for i = 1, #list do
    if not seen[list[i]] then seen[list[i]] = true; names[#names + 1] = list[i] end
  end
end
local halted = call('SMEMBERS', halted_set) or {}
local temp = call('SMEMBERS', temp_set) or {}
add(call('SMEMBERS', inbound))
add(halted)
add(temp)
local rates = {}
local flat = call('HGETALL', rates_hash) or {}
for i = 1, #flat, 2 do
  rates[flat[i]] = flat[i + 1]
  add({flat[i]})
end

local sources = {}
for _, s in ipairs(names) do
  sources[s] = {
    rate = rates[s] or false,
    tokens = call('GET', tokens_prefix .. s),
    ok = call('GET', resized .. ':' .. s),
    errors = call('GET', errors .. ':' .. s),
    last = call('LRANGE', last_prefix .. s, 0, -1) or {},
    override = call('GET', override_prefix .. s),
    alias = call('GET', alias_prefix .. s),
  }
end
return cjson.encode({
  sources = sources, halted = halted, temp_halted = temp,
  totals = {
    num_resized = call('GET', resized), resize_errors = call('GET', errors),
    num_split = call('GET', split), num_malformed = call('GET', malformed),
  },
})
"""
_ARGV: Final = (
    INBOUND_SOURCES_SET,
    HALTED_SET,
    TEMP_HALTED_SET,
    RATES_HASH,
    TOKENS_PREFIX,
    NUM_RESIZED,
    RESIZE_ERRORS,
    LAST_50_PREFIX,
    OVERRIDE_RATE_PREFIX,
    OVERRIDE_RATE_ALIAS_PREFIX,
    NUM_SPLIT,
    NUM_MALFORMED,
)


@dataclasses.dataclass(frozen=True, slots=True)
class SourceStatus:
    name: str
    # The monitor's current rate (requests/s), None when it has published none.
    rate_rps: float | None
    tokens: int | None
    successes: int
    errors: int
    # Histogram of the last 50 statuses, most frequent first.
    last_statuses: Mapping[str, int]
    halted: bool
    temp_halted: bool
    # The operator's override as written (``override_rate:``, else ``override-rate:``).
    override: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class CrawlStatus:
    sources: tuple[SourceStatus, ...]
    num_resized: int
    resize_errors: int
    num_split: int
    num_malformed: int


def _int(value: Any) -> int | None:
    if isinstance(value, bool):  # cjson's false: the key is absent
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _strings(value: Any) -> list[str]:
    # cjson encodes an empty Lua table as {}, not [].
    return [str(v) for v in value] if isinstance(value, list) else []


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def parse_status(payload: str | bytes) -> CrawlStatus:
    """The script's JSON answer as a ``CrawlStatus``, sources sorted by name."""
    data = json.loads(payload)
    halted = set(_strings(data.get("halted")))
    temp_halted = set(_strings(data.get("temp_halted")))
    raw_sources = data.get("sources")
    sources = []
    for name, raw in sorted((raw_sources if isinstance(raw_sources, dict) else {}).items()):
        last = Counter(_strings(raw.get("last")))
        sources.append(
            SourceStatus(
                name=name,
                rate_rps=_float(raw.get("rate")),
                tokens=_int(raw.get("tokens")),
                successes=_int(raw.get("ok")) or 0,
                errors=_int(raw.get("errors")) or 0,
                last_statuses=dict(last.most_common()),
                halted=name in halted,
                temp_halted=name in temp_halted,
                override=_text(raw.get("override")) or _text(raw.get("alias")),
            )
        )
    totals = data.get("totals") or {}
    return CrawlStatus(
        sources=tuple(sources),
        num_resized=_int(totals.get("num_resized")) or 0,
        resize_errors=_int(totals.get("resize_errors")) or 0,
        num_split=_int(totals.get("num_split")) or 0,
        num_malformed=_int(totals.get("num_malformed")) or 0,
    )


async def read_status(redis: aioredis.Redis) -> CrawlStatus:
    """Everything ``status_table`` shows, read in one round trip."""
    payload = await redis.eval(_SCRIPT, 0, *_ARGV)
    return parse_status(payload)


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


def _optional(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def status_table(status: CrawlStatus, *, note: str | None = None) -> Table:
    """The status as a table: one row per source, totals in the caption."""
    table = Table(title="image-crawler status", caption_justify="left")
    table.add_column("source", no_wrap=True)
    table.add_column("rate/s", justify="right")
    table.add_column("tokens", justify="right")
    table.add_column("ok", justify="right")
    table.add_column("errors", justify="right")
    table.add_column("last 50 statuses")
    table.add_column("state", no_wrap=True)
    for source in status.sources:
        table.add_row(
            source.name,
            _optional(source.rate_rps, ".3g"),
            _optional(source.tokens, "d"),
            str(source.successes),
            str(source.errors),
            _histogram(source.last_statuses),
            _state(source),
        )
    if not status.sources:
        table.add_row("(no source yet)", "", "", "", "", "", "")
    caption = (
        f"total: {status.num_resized} resized, {status.resize_errors} errors, "
        f"{status.num_split} split, {status.num_malformed} malformed"
    )
    table.caption = f"{caption}\n{note}" if note else caption
    return table
