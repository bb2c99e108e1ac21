"""The known sources and their image counts, from ``SOURCES_FILE`` and/or ``SOURCES_URL``.

Both inputs hold a JSON list of ``{"source_name": str, "image_count": int}`` objects
(``media_count`` is accepted in place of ``image_count``, the shape of Openverse's stats
endpoint). Names are lower-cased. The two are merged; the URL wins where both name a
source. An entry with a bad name or count is skipped and logged; an input that cannot be
read, is not a list, or has no usable entry keeps its last known list (``sources_unavailable``).
A source in neither input is unknown: it gets no rate, so nothing of it is crawled.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any, Final

import aiohttp

from crawl_monitor.policy.rates import compute_crawl_rate
from image_crawler.contract import is_valid_source_name
from image_crawler.logs import get_logger
from image_crawler.retry import Backoff, sleep_unless_stopped

log = get_logger(__name__)

# After a failed read of an input that never loaded, retry after this delay (doubling, with
# jitter, up to the refresh period) instead of a full refresh period, so that a monitor
# started during an outage crawls soon.
FIRST_LOAD_RETRY_S: Final = 5.0


class SourcesUnavailable(Exception):
    """An input could not be read or holds no usable source list."""


@dataclasses.dataclass(frozen=True, slots=True)
class SkippedEntry:
    index: int
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class SourceList:
    """One input's sources: lower-cased name -> image count, and what was skipped."""

    image_counts: Mapping[str, int]
    skipped: tuple[SkippedEntry, ...] = ()


def _count(entry: Mapping[str, Any]) -> int:
    for field in ("image_count", "media_count"):
        value = entry.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{field} is not a number: {value!r}")
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{field} is not a whole number: {value!r}")
        if value < 0:
            raise ValueError(f"{field} is negative: {value!r}")
        return int(value)
    raise ValueError("neither image_count nor media_count is given")


def parse_sources(payload: object) -> SourceList:
    """Validate a decoded source list; raises ``SourcesUnavailable`` when nothing is usable.

    A later entry of the same (lower-cased) name replaces an earlier one.
    """
    if not isinstance(payload, list):
        raise SourcesUnavailable(f"expected a JSON list, got {type(payload).__name__}")
    counts: dict[str, int] = {}
    skipped: list[SkippedEntry] = []
    for index, entry in enumerate(payload):
        if not isinstance(entry, dict):
            skipped.append(SkippedEntry(index, f"not an object: {type(entry).__name__}"))
            continue
        name = entry.get("source_name")
        # Checked before lower-casing: str.lower() turns some non-ASCII letters into ASCII
        # ones (the Kelvin sign into "k"), and such a name is not the source it looks like.
        if not isinstance(name, str) or not is_valid_source_name(name.strip()):
            skipped.append(SkippedEntry(index, f"bad source_name: {name!r}"))
            continue
        try:
            count = _count(entry)
        except ValueError as e:
            skipped.append(SkippedEntry(index, f"{name}: {e}"))
            continue
        counts[name.strip().lower()] = count
    if not counts:
        raise SourcesUnavailable(f"no usable entry among {len(payload)}")
    return SourceList(counts, tuple(skipped))


def decode_sources(raw: bytes) -> SourceList:
    """``parse_sources`` of a JSON document."""
    try:
        payload = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SourcesUnavailable(f"not JSON: {e}") from None
    return parse_sources(payload)


def merge_sources(
    from_file: Mapping[str, int] | None, from_url: Mapping[str, int] | None
) -> dict[str, int]:
    """Both lists in one; the URL's count wins where both name a source."""
    merged = dict(from_file or {})
    merged.update(from_url or {})
    return merged


async def read_file(path: Path) -> SourceList:
    try:
        raw = await asyncio.to_thread(path.read_bytes)
    except OSError as e:
        raise SourcesUnavailable(f"cannot read {path}: {e}") from None
    return decode_sources(raw)


async def fetch_url(http: aiohttp.ClientSession, url: str) -> SourceList:
    try:
        async with http.get(url) as response:
            if response.status != 200:
                raise SourcesUnavailable(f"HTTP {response.status}")
            raw = await response.read()
    except (aiohttp.ClientError, TimeoutError) as e:
        raise SourcesUnavailable(f"request failed: {e!r}") from None
    return decode_sources(raw)


class SourceCatalog:
    """The merged, last known source list and the computed rate of each source.

    ``run()`` keeps it fresh; ``rates`` is read by the regulator every second.
    """

    def __init__(
        self,
        *,
        file: Path | None,
        url: str | None,
        http: aiohttp.ClientSession | None,
        refresh_s: float,
        first_load_retry_s: float = FIRST_LOAD_RETRY_S,
    ) -> None:
        if url is not None and http is None:
            raise ValueError("a SOURCES_URL needs an HTTP session")
        self._file = file
        self._url = url
        self._http = http
        self._refresh_s = refresh_s
        self._first_load_retry_s = first_load_retry_s
        self._from_file: Mapping[str, int] | None = None
        self._from_url: Mapping[str, int] | None = None
        self._image_counts: Mapping[str, int] = {}
        self._rates: Mapping[str, float] = {}

    @property
    def configured(self) -> bool:
        return self._file is not None or self._url is not None

    @property
    def image_counts(self) -> Mapping[str, int]:
        return self._image_counts

    @property
    def rates(self) -> Mapping[str, float]:
        """Computed rate (requests/s) of every known source, before overrides."""
        return self._rates

    @property
    def complete(self) -> bool:
        """Every configured input has loaded at least once."""
        return (self._file is None or self._from_file is not None) and (
            self._url is None or self._from_url is not None
        )

    async def refresh(self) -> None:
        """Re-read every configured input; one that fails keeps its last known list."""
        if self._file is not None:
            self._from_file = await self._load(
                "file", str(self._file), read_file(self._file), self._from_file
            )
        if self._url is not None:
            assert self._http is not None
            self._from_url = await self._load(
                "url", self._url, fetch_url(self._http, self._url), self._from_url
            )
        merged = merge_sources(self._from_file, self._from_url)
        if merged != self._image_counts:
            added = sorted(merged.keys() - self._image_counts.keys())
            removed = sorted(self._image_counts.keys() - merged.keys())
            self._image_counts = merged
            self._rates = {name: compute_crawl_rate(n) for name, n in merged.items()}
            log.info(
                "sources_loaded",
                sources=len(merged),
                added=added[:50],
                removed=removed[:50],
            )

    @staticmethod
    async def _load(
        kind: str,
        where: str,
        reading: Awaitable[SourceList],
        last_known: Mapping[str, int] | None,
    ) -> Mapping[str, int] | None:
        try:
            loaded = await reading
        except SourcesUnavailable as e:
            log.warning(
                "sources_unavailable",
                input=kind,
                where=where,
                reason=str(e),
                keeping=len(last_known) if last_known is not None else 0,
            )
            return last_known
        for skipped in loaded.skipped:
            log.warning(
                "source_entry_skipped", input=kind, index=skipped.index, reason=skipped.reason
            )
        return loaded.image_counts

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh every ``refresh_s`` until ``stop``; sooner while an input never loaded."""
        if not self.configured:
            log.warning(
                "no_sources_configured",
                msg="neither SOURCES_FILE nor SOURCES_URL is set: no source gets a rate, "
                "nothing will be crawled",
            )
            return
        # Until every input has loaded, a retry comes sooner than a refresh.
        retry = Backoff(
            base_s=min(self._first_load_retry_s, self._refresh_s), cap_s=self._refresh_s
        )
        while not stop.is_set():
            try:
                await self.refresh()
            except Exception:
                log.exception("sources_refresh_error")
            if self.complete:
                retry.reset()
                delay_s = self._refresh_s
            else:
                delay_s = retry.next_s()
            await sleep_unless_stopped(stop, delay_s)
