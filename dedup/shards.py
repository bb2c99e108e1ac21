"""The index over several processes (issue 54, "Beyond one machine"): routing after Manku
et al. (WWW 2007), the shards' wire format, and ``ShardedPlacer``, the router.

Routing. With radius ``r``, the 64 bits are cut into ``r + 1`` blocks (r = 4: 13, 13, 13,
13 and 12 bits, from the top); two hashes at most ``r`` bits apart agree exactly on at
least one block (pigeonhole: ``r`` differing bits cannot touch ``r + 1`` blocks). Each
block is a key, (block number, block value), owned by one shard: a stable hash of the key
modulo the number of shards. A canonical is kept on every shard owning one of its blocks
(at most ``r + 1`` copies) and a hash is looked up on the same shards, so any two hashes
within the radius meet on the owner of the block they share.

A shard answers, for a hash, every canonical it keeps within the radius, exactly: its
rows in dedup/tables.py's tables (three blocks of 21 bits, one bit flipped), not by exact
match on the routing block, whose 13 bits are too few to narrow a search (at 10^9 images
a 13-bit value is shared by 122,000 of them, 610,000 compared a search, where the
tables' 66 lookups compare some 27,000 a shard queried at 3 shards and far fewer at more).
The union of the shards' answers is then the set a single NearIndex finds.

Order. The router numbers the canonicals it keeps (a global sequence, kept with each
copy), and the placement is dedup/placement.py's, given candidates keyed by that number:
the earliest canonical is the one with the smallest, as the single index's earliest is its
first row; a batch is also compared with itself, so that the canonicals it keeps count for
the images after them in it. The placements are therefore the single Placer's, image for
image. One router must be the only writer: it alone numbers the canonicals.

Wire. A frame is two little-endian u32 (the JSON header's length, the body's), the header,
and the body, a numpy array whose dtype the operation names (``ROW``, ``HIT``, hashes as
``<u8``). A batch is one request a shard, sent to every shard before any answer is read,
so the shards search in parallel.
"""

from __future__ import annotations

import json
import socket
import struct
import uuid
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from dedup.index import HASH_BITS, Canonical
from dedup.placement import Image, Placement, placements

# Each canonical's copy on a shard: 32 bytes here, 36 more in the shard's tables.
STORED: Final = np.dtype(
    [
        ("seq", "<u8"),
        ("identifier", np.uint8, (16,)),
        ("source", "<u2"),
        ("aspect", "<f2"),
        ("sha", "<u4"),
    ]
)
# A canonical as the router sends it to be kept.
ROW: Final = np.dtype([("phash", "<u8"), *STORED.descr])
# A canonical a shard found: the query's position in the request, the distance.
HIT: Final = np.dtype([("query", "<u4"), ("distance", "<u4"), *STORED.descr])
CODES: Final = np.dtype("<u8")

_FRAME: Final = struct.Struct("<II")
MAX_FRAME_BYTES: Final = 1 << 28
_GOLDEN: Final = 0x9E3779B97F4A7C15
_MIX: Final = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


class ShardError(RuntimeError):
    """A shard refused a request, broke the protocol, or could not be reached in time."""


# --- routing ----------------------------------------------------------------------------


def block_widths(radius: int) -> tuple[int, ...]:
    """The ``radius + 1`` blocks' widths in bits, from the top; the wider first."""
    blocks = radius + 1
    if not 1 <= blocks <= HASH_BITS:
        raise ValueError(f"radius must be 0-63 bits, not {radius}")
    return tuple(HASH_BITS // blocks + (t < HASH_BITS % blocks) for t in range(blocks))


class Routing:
    """Which shards own a hash's blocks. Stable: the same on every machine and every
    run, for the same radius and number of shards (a change of either moves the keys)."""

    def __init__(self, radius: int, shards: int) -> None:
        if shards < 1:
            raise ValueError(f"need at least one shard, not {shards}")
        self.radius = radius
        self.shards = shards
        widths = block_widths(radius)
        ends = np.cumsum(widths)
        self._shifts = np.array([HASH_BITS - e for e in ends], dtype=np.uint64)
        self._masks = np.array([(1 << w) - 1 for w in widths], dtype=np.uint64)
        # Set apart each block's keys before mixing: (0, v) and (1, v) are other keys.
        salts = [(_GOLDEN * (t + 1)) % (1 << 64) for t in range(len(widths))]
        self._salts = np.array(salts, dtype=np.uint64)

    def blocks(self, codes: np.ndarray) -> np.ndarray:
        """The block values, one row a hash (uint64 hashes in)."""
        codes = np.asarray(codes, dtype=np.uint64).reshape(-1, 1)
        return (codes >> self._shifts[None, :]) & self._masks[None, :]

    def owners(self, codes: np.ndarray) -> np.ndarray:
        """The owner shard of each of a hash's keys, one row a hash."""
        x = self.blocks(codes) ^ self._salts[None, :]
        # splitmix64's finaliser: every bit of the key moves every bit of the result, so
        # the keys of neighbouring values spread evenly over the shards. Array arithmetic
        # wraps modulo 2^64, as it must.
        x = (x ^ (x >> np.uint64(30))) * np.uint64(_MIX[0])
        x = (x ^ (x >> np.uint64(27))) * np.uint64(_MIX[1])
        x = x ^ (x >> np.uint64(31))
        return (x % np.uint64(self.shards)).astype(np.int64)

    def placed_on(self, codes: np.ndarray) -> np.ndarray:
        """A (hashes, shards) mask: the shards a hash is kept on and looked up on."""
        owners = self.owners(codes)
        mask = np.zeros((len(owners), self.shards), dtype=bool)
        np.put_along_axis(mask, owners, True, axis=1)
        return mask


# --- wire ---------------------------------------------------------------------------------


def frame(header: dict[str, Any], body: bytes = b"") -> bytes:
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return _FRAME.pack(len(encoded), len(body)) + encoded + body


def frame_sizes(prefix: bytes) -> tuple[int, int]:
    """The header's and body's lengths a frame's first 8 bytes give, checked."""
    header_bytes, body_bytes = _FRAME.unpack(prefix)
    if header_bytes + body_bytes > MAX_FRAME_BYTES:
        raise ShardError(f"a frame of {header_bytes + body_bytes} bytes")
    return header_bytes, body_bytes


PREFIX_BYTES: Final = _FRAME.size


def canonical_of(row: np.void, source: str) -> Canonical:
    """A canonical as the single index gives it (the same float16 aspect, the same
    identifier spelling), so that both placers compare the very same values."""
    return Canonical(
        row=int(row["seq"]),
        identifier=str(uuid.UUID(bytes=bytes(row["identifier"]))),
        source=source,
        aspect=float(row["aspect"]),
        sha_prefix=int(row["sha"]),
    )


class _Connection:
    """A blocking connection to one shard: a request is sent whole, its answer read
    whole; several shards' requests are all sent before any answer is read."""

    def __init__(self, address: tuple[str, int], timeout_s: float) -> None:
        self.address = address
        try:
            self._socket = socket.create_connection(address, timeout=timeout_s)
        except OSError as e:
            raise ShardError(f"shard {address[0]}:{address[1]}: {e}") from e
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, header: dict[str, Any], body: bytes = b"") -> None:
        try:
            self._socket.sendall(frame(header, body))
        except OSError as e:
            raise ShardError(f"shard {self.address[0]}:{self.address[1]}: {e}") from e

    def receive(self) -> tuple[dict[str, Any], bytes]:
        try:
            header_bytes, body_bytes = frame_sizes(self._exactly(PREFIX_BYTES))
            header = json.loads(self._exactly(header_bytes))
            body = self._exactly(body_bytes)
        except (OSError, ValueError) as e:
            raise ShardError(f"shard {self.address[0]}:{self.address[1]}: {e}") from e
        if "error" in header:
            raise ShardError(f"shard {self.address[0]}:{self.address[1]}: {header['error']}")
        return header, body

    def close(self) -> None:
        self._socket.close()

    def _exactly(self, count: int) -> bytes:
        data = bytearray(count)
        view = memoryview(data)
        got = 0
        while got < count:
            n = self._socket.recv_into(view[got:])
            if n == 0:
                raise ConnectionError("closed by the shard")
            got += n
        return bytes(data)


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` (DEDUP_SHARDS' form) as a pair."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"a shard is host:port, not {text!r}")
    return host, int(port)


# --- the router ----------------------------------------------------------------------------


class ShardedPlacer:
    """The Placer's ``place`` over shards (the i-th address is shard i: the list's order is
    the routing's). At connection each shard is told its number, the count and the radius,
    and refuses others than it was first told; the sequence goes on from the highest kept.

    A batch that fails (a shard's error or silence, ShardError, or any exception while
    requests may be half answered) may have left its canonicals on some of their shards
    and not on others, and its connections mid-answer: the placer is then closed, and
    the shards' state is to be rebuilt before another is started."""

    def __init__(
        self, addresses: Sequence[tuple[str, int]], radius: int = 4, timeout_s: float = 30.0
    ) -> None:
        self.routing = Routing(radius, len(addresses))
        self._connections: list[_Connection] = []
        try:
            for address in addresses:
                self._connections.append(_Connection(address, timeout_s))
            hello = {"op": "hello", "shards": len(addresses), "radius": radius}
            answers = self._ask({s: ({**hello, "shard": s}, b"") for s in range(len(addresses))})
        except BaseException:
            self.close()
            raise
        self.next_key = max(int(header["next_seq"]) for header, _body in answers.values())
        self._seen: dict[int, Canonical] = {}
        self._kept: list[tuple[Any, ...]] = []  # a batch's new canonicals, as ROW rows
        self._first_kept = self.next_key
        self._kept_sources: dict[str, int] = {}  # a batch's, in the order named

    @property
    def radius(self) -> int:
        return self.routing.radius

    def place(self, images: Sequence[Image]) -> list[Placement]:
        """Place a batch, as Placer.place does (the same answers), and keep its new
        canonicals on their shards before returning: the next batch finds them."""
        if not self._connections:
            raise ShardError("the placer is closed")
        self._seen = {}
        self._kept = []
        self._kept_sources = {}
        self._first_kept = self.next_key
        try:
            placed = placements(images, self)
            if self._kept:
                self._keep_on_shards()
        except BaseException:
            self.close()
            raise
        return placed

    def stats(self) -> list[dict[str, Any]]:
        """Each shard's rows (copies kept) and next sequence number."""
        answers = self._ask({s: ({"op": "stats"}, b"") for s in range(len(self._connections))})
        return [answers[s][0] for s in range(len(self._connections))]

    def close(self) -> None:
        for connection in self._connections:
            connection.close()
        self._connections = []

    def __enter__(self) -> ShardedPlacer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # What dedup/placement.py's ``placements`` asks of the canonicals (its Canonicals).

    def within(self, phashes: list[str]) -> list[list[tuple[int, int]]]:
        if not phashes:
            return []
        codes = np.array([int(p, 16) for p in phashes], dtype=np.uint64)
        on = self.routing.placed_on(codes)
        asked = {s: np.flatnonzero(on[:, s]) for s in range(self.routing.shards)}
        requests = {
            s: ({"op": "search"}, codes[queries].astype(CODES).tobytes())
            for s, queries in asked.items()
            if len(queries)
        }
        found: list[dict[int, int]] = [{} for _ in phashes]
        for s, (header, body) in self._ask(requests).items():
            hits = np.frombuffer(body, dtype=HIT)
            sources = header["sources"]
            for hit in hits:
                key = int(hit["seq"])
                # The same canonical found on several shards is one candidate.
                found[int(asked[s][hit["query"]])][key] = int(hit["distance"])
                if key not in self._seen:
                    self._seen[key] = canonical_of(hit, sources[hit["source"]])
        return [sorted(candidates.items()) for candidates in found]

    def keep(self, image: Image) -> int:
        key = self.next_key
        self.next_key += 1
        self._kept.append(
            (
                int(image.phash or "0", 16),
                key,
                np.frombuffer(uuid.UUID(image.identifier).bytes, dtype=np.uint8),
                self._kept_sources.setdefault(image.source, len(self._kept_sources)),
                image.width / image.height,
                int((image.sha256 or "0" * 8)[:8], 16),
            )
        )
        return key

    def canonical(self, key: int) -> Canonical:
        found = self._seen.get(key)
        if found is None:
            # One the batch kept, asked for by a later image of it: made when asked, as
            # most canonicals never are.
            row = np.array([self._kept[key - self._first_kept]], dtype=ROW)[0]
            source = list(self._kept_sources)[int(row["source"])]
            found = self._seen[key] = canonical_of(row, source)
        return found

    def _keep_on_shards(self) -> None:
        rows = np.array(self._kept, dtype=ROW)
        on = self.routing.placed_on(rows["phash"])
        header = {"op": "add", "sources": list(self._kept_sources)}
        self._ask(
            {
                s: (header, rows[on[:, s]].tobytes())
                for s in range(self.routing.shards)
                if on[:, s].any()
            }
        )

    def _ask(
        self, requests: dict[int, tuple[dict[str, Any], bytes]]
    ) -> dict[int, tuple[dict[str, Any], bytes]]:
        """Send every shard its request, then read the answers: the shards work at once."""
        for s, (header, body) in requests.items():
            self._connections[s].send(header, body)
        return {s: self._connections[s].receive() for s in requests}
