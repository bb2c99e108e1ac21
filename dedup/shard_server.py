"""``python -m dedup.shard_server [--host HOST] [--port PORT]``: one shard of the sharded
index (dedup/shards.py), served on a TCP port (by default any free one of 127.0.0.1: the
port is logged, ``shard_listening``, once it accepts connections).

The router (``ShardedPlacer``) tells the shard at its first ``hello`` which shard it is,
of how many, at what radius; the shard keeps that claim and refuses another (a router
given its shards in another order, or another count, would route the same hash
elsewhere and miss what is kept here). It then asks ``search`` (uint64 hashes: every row
kept here within the radius of each) and ``add`` (rows to keep), a batch a request, and
``stats``. A request is answered before the next is read, so a connection's requests
take effect in the order sent.

Its state is in memory only: a shard restarted is empty, and the router, numbering on
from the highest sequence number the shards still hold, would place against a part of
the clusters. Durable shards are still to come (docs/deduplication.md).

SIGTERM or SIGINT closes the port and the open connections, and the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import sys
from typing import Any

import numpy as np

from dedup.shards import (
    CODES,
    HIT,
    PREFIX_BYTES,
    ROW,
    STORED,
    ShardError,
    frame,
    frame_sizes,
)
from dedup.tables import BlockTables
from image_crawler.config import DeprecatedSetting
from image_crawler.lifecycle import serve
from image_crawler.logs import get_logger

log = get_logger("dedup.shard")

_GROW = 1.5
_STORED_FIELDS: tuple[str, ...] = STORED.names or ()


class Shard:
    """A shard's rows and tables, and its answers to requests (header, body)."""

    def __init__(self) -> None:
        self.claim: dict[str, int] | None = None  # shard, shards, radius: the first hello
        self._tables: BlockTables | None = None
        self._rows = np.zeros(0, dtype=STORED)
        self._size = 0
        self._sources: list[str] = []
        self._source_codes: dict[str, int] = {}

    def __len__(self) -> int:
        return self._size

    def answer(self, header: dict[str, Any], body: bytes) -> tuple[dict[str, Any], bytes]:
        """The answer to a request; a refused one is ``{"error": why}``, changing nothing."""
        try:
            op = header.get("op")
            if op == "hello":
                return self._hello(header), b""
            if op == "stats":
                return self.stats(), b""
            if self._tables is None:
                raise ShardError("no hello yet: which shard this is is unknown")
            if op == "search":
                return self._search(self._tables, _array(body, CODES))
            if op == "add":
                return self._add(self._tables, header, _array(body, ROW)), b""
            raise ShardError(f"no such operation: {op!r}")
        except (ShardError, ValueError, KeyError, TypeError) as e:
            return {"error": f"{type(e).__name__}: {e}"}, b""

    def stats(self) -> dict[str, Any]:
        next_seq = int(self._rows["seq"][: self._size].max()) + 1 if self._size else 0
        return {"rows": self._size, "next_seq": next_seq, **(self.claim or {})}

    def _hello(self, header: dict[str, Any]) -> dict[str, Any]:
        claim = {name: int(header[name]) for name in ("shard", "shards", "radius")}
        if self.claim is None:
            if not 0 <= claim["shard"] < claim["shards"]:
                raise ShardError(f"shard {claim['shard']} of {claim['shards']}")
            self._tables = BlockTables(claim["radius"])
            self.claim = claim
            log.info("shard_claimed", **claim)
        elif claim != self.claim:
            raise ShardError(f"this shard is {self.claim}, not {claim}")
        return self.stats()

    def _search(self, tables: BlockTables, codes: np.ndarray) -> tuple[dict[str, Any], bytes]:
        if self._size == 0 or len(codes) == 0:
            return {"sources": []}, b""
        found = tables.within(codes.astype(np.uint64))
        counts = [len(pairs) for pairs in found]
        pairs = [pair for hits in found for pair in hits]
        if not pairs:
            return {"sources": []}, b""
        hits = np.zeros(len(pairs), dtype=HIT)
        rows = np.array([row for row, _d in pairs], dtype=np.int64)
        hits["query"] = np.repeat(np.arange(len(codes)), counts)
        hits["distance"] = [d for _row, d in pairs]
        for name in _STORED_FIELDS:
            hits[name] = self._rows[name][rows]
        # The answer names only the sources it uses, its hits' codes renumbered into them.
        used, hits["source"] = np.unique(hits["source"], return_inverse=True)
        return {"sources": [self._sources[c] for c in used.tolist()]}, hits.tobytes()

    def _add(self, tables: BlockTables, header: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
        names = header["sources"]
        if len(rows) and int(rows["source"].max()) >= len(names):
            raise ShardError(f"a row names source {int(rows['source'].max())} of {len(names)}")
        codes = np.array([self._code(str(name)) for name in names], dtype=np.uint16)
        start = self._size
        self._reserve(start + len(rows))
        kept = self._rows[start : start + len(rows)]
        for name in _STORED_FIELDS:
            kept[name] = rows[name]
        if len(rows):
            kept["source"] = codes[rows["source"]]
        tables.add(rows["phash"].astype(np.uint64))
        self._size = start + len(rows)
        return {"rows": self._size}

    def _code(self, source: str) -> int:
        code = self._source_codes.get(source)
        if code is None:
            code = len(self._sources)
            if code > np.iinfo(np.uint16).max:
                raise ShardError("more than 65,536 sources")
            self._sources.append(source)
            self._source_codes[source] = code
        return code

    def _reserve(self, rows: int) -> None:
        if rows <= len(self._rows):
            return
        grown = np.zeros(max(rows, math.ceil(len(self._rows) * _GROW), 1024), dtype=STORED)
        grown[: self._size] = self._rows[: self._size]
        self._rows = grown


def _array(body: bytes, dtype: np.dtype[Any]) -> np.ndarray:
    if len(body) % dtype.itemsize:
        raise ShardError(f"a body of {len(body)} bytes is no whole number of rows")
    return np.frombuffer(body, dtype=dtype)


async def serve_connection(
    shard: Shard, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Answer a connection's requests in order until it closes; a frame that breaks the
    protocol closes it (what follows could not be framed)."""
    peer = writer.get_extra_info("peername")
    try:
        while True:
            try:
                prefix = await reader.readexactly(PREFIX_BYTES)
            except asyncio.IncompleteReadError:
                return  # closed between requests: the router is done
            header_bytes, body_bytes = frame_sizes(prefix)
            header = json.loads(await reader.readexactly(header_bytes))
            body = await reader.readexactly(body_bytes)
            answer, answer_body = shard.answer(header, body)
            writer.write(frame(answer, answer_body))
            await writer.drain()
    except (ShardError, ValueError, asyncio.IncompleteReadError, ConnectionError) as e:
        log.warning("shard_connection_dropped", peer=str(peer), error=repr(e))
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


@dataclasses.dataclass(frozen=True, slots=True)
class ShardSettings:
    host: str = "127.0.0.1"
    port: int = 0  # any free port, logged
    log_level: str = "INFO"
    deprecated: tuple[DeprecatedSetting, ...] = ()

    @classmethod
    def from_args(cls, argv: list[str]) -> ShardSettings:
        default = cls()
        parser = argparse.ArgumentParser(prog="python -m dedup.shard_server")
        parser.add_argument("--host", default=default.host)
        parser.add_argument("--port", type=int, default=default.port)
        parser.add_argument("--log-level", default=default.log_level)
        args = parser.parse_args(argv)
        return cls(args.host, args.port, args.log_level)


async def run(settings: ShardSettings, stop: asyncio.Event) -> int:
    shard = Shard()
    connections: set[asyncio.Task[None]] = set()

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        connections.add(task)
        try:
            await serve_connection(shard, reader, writer)
        finally:
            connections.discard(task)

    server = await asyncio.start_server(connected, settings.host, settings.port)
    host, port = server.sockets[0].getsockname()[:2]
    log.info("shard_listening", host=host, port=port)
    async with server:
        await stop.wait()
        server.close()
        for task in list(connections):
            task.cancel()
        await asyncio.gather(*connections, return_exceptions=True)
    log.info("shard_stopped", rows=len(shard), **(shard.claim or {}))
    return 0


def main() -> None:
    serve("dedup.shard_server", lambda: ShardSettings.from_args(sys.argv[1:]), run)


if __name__ == "__main__":
    main()
