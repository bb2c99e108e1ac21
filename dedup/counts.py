"""The stage's placements per source and kind (exact, near, unique), counted once each
whatever the stage reads twice, and their copy in Redis (``PLACEMENTS_HASH``) for
`image-crawler status`, the monitor's dashboard and its ``/metrics``.

The stage is at least once: after a crash it reads its input again from its last
commit and places those images again (with the same answers). Incrementing Redis as it
places (HINCRBY) would count each of them twice. So the counts are part of the stage's
own durable state instead, kept with the input offset up to which each partition has
been counted: ``placements.json`` in the journal's folder, replaced whole (written,
synced, renamed) after the batch's journal append and before its placements are
published. A record below its partition's counted offset was counted already and is not
again; the counts and the offsets can never disagree, being one file. Redis gets the
counts as absolute values (HSET), so that a write repeated, retried after an outage or
made by a restarted stage sets the same number rather than adding one.

Redis is the operators', not the stage's job (that is the topic): ``RedisCopy`` writes
in a task of its own, so a slow or absent Redis never holds up a batch, and a failed
write is logged once (``redis_unavailable``, then ``redis_recovered``) and tried again
at the next batch, or after ``RETRY_S`` when none comes. After a restart and after an
outage it writes every field (Redis may have come back empty); else only those changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

import redis.asyncio as aioredis

from dedup.metrics import REDIS_UP
from image_crawler.contract import PLACEMENTS_HASH, placements_field
from image_crawler.logs import get_logger

log = get_logger("dedup")

COUNTS: Final = "placements.json"
# An idle stage's next try after a failed write; a batch tries at once.
RETRY_S: Final = 5.0
# Fields a single HSET carries: a write of every field of 10,000 sources is three.
HSET_FIELDS: Final = 10_000
# The last write at a clean stop waits at most this long.
FINAL_WRITE_S: Final = 2.0


class PlacementCounts:
    """The counts in ``folder`` (read at construction; empty when there are none)."""

    def __init__(self, folder: Path) -> None:
        self._path = folder / COUNTS
        self.counts: dict[str, int] = {}
        # Partition -> the first offset not counted yet.
        self._counted: dict[int, int] = {}
        self.found = self._path.exists()
        if self.found:
            self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self._path.read_text())
            self.counts = {str(k): int(v) for k, v in data["counts"].items()}
            self._counted = {int(k): int(v) for k, v in data["offsets"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            # Replaced whole, the file is never torn: this is damage from outside. The
            # counts start again from the input's commit rather than stop the stage.
            log.warning("placement_counts_unreadable", path=str(self._path), error=repr(e))
            self.counts, self._counted = {}, {}

    def count(self, partition: int, offset: int, source: str, kind: str) -> str | None:
        """Count one placement read at ``offset``: its field, or None when that offset
        was counted before (read again after a crash)."""
        if offset < self._counted.get(partition, 0):
            return None
        field = placements_field(source, kind)
        self.counts[field] = self.counts.get(field, 0) + 1
        return field

    def counted_to(self, partition: int, offset: int) -> None:
        """Every offset of ``partition`` below ``offset`` has been counted."""
        self._counted[partition] = max(self._counted.get(partition, 0), offset)

    def save(self) -> None:
        """Replace the file with the counts and offsets, synced; raises OSError."""
        data = {
            "counts": self.counts,
            "offsets": {str(p): o for p, o in sorted(self._counted.items())},
        }
        part = self._path.with_suffix(".part")
        with part.open("wb") as f:
            f.write(json.dumps(data, separators=(",", ":")).encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, self._path)
        folder = os.open(self._path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)  # the rename itself
        finally:
            os.close(folder)


class RedisCopy:
    """Writes ``counts`` (a live mapping of field -> count) to PLACEMENTS_HASH."""

    def __init__(self, redis: aioredis.Redis, counts: Mapping[str, int]) -> None:
        self._redis = redis
        self._counts = counts
        self._pending: set[str] = set(counts)  # all of it at start
        self._wake = asyncio.Event()
        self._wake.set()
        self._down_since: float | None = None
        self.written = 0

    def changed(self, fields: Iterable[str]) -> None:
        """Fields whose counts changed; written by the next write, which starts now."""
        self._pending.update(fields)
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Write until ``stop``, then once more (within FINAL_WRITE_S)."""
        while not stop.is_set():
            await self._woken(stop, RETRY_S if self._pending else None)
            self._wake.clear()
            await self.write()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.write(), FINAL_WRITE_S)

    async def _woken(self, stop: asyncio.Event, timeout_s: float | None) -> None:
        """Until a change, the stop or ``timeout_s``."""
        waits = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def write(self) -> bool:
        """Write the pending fields' counts; False (and kept pending) when Redis failed."""
        if not self._pending:
            return True
        fields = self._pending
        self._pending = set()
        values = {f: self._counts[f] for f in sorted(fields)}
        try:
            await self._hset(values)
        except Exception as e:  # noqa: BLE001 - nothing of Redis's may end the stage
            self._pending |= fields
            self._failed(e)
            return False
        self.written += len(values)
        if self._down_since is not None:
            log.info("redis_recovered", op="write_placements", unavailable_s=self._away_s())
            self._down_since = None
        REDIS_UP.set(1)
        return True

    async def _hset(self, values: Mapping[str, int]) -> None:
        items = list(values.items())
        async with self._redis.pipeline(transaction=False) as pipe:
            for first in range(0, len(items), HSET_FIELDS):
                pipe.hset(PLACEMENTS_HASH, mapping=dict(items[first : first + HSET_FIELDS]))
            await pipe.execute()

    def _failed(self, error: Exception) -> None:
        REDIS_UP.set(0)
        if self._down_since is None:  # logged once an outage
            self._down_since = time.monotonic()
            log.warning("redis_unavailable", op="write_placements", error=repr(error))
        # Redis may come back empty (restarted without its data): all of it then.
        self._pending |= set(self._counts)

    def _away_s(self) -> float:
        return round(time.monotonic() - (self._down_since or time.monotonic()), 2)
