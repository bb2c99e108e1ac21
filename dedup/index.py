"""Every canonical image within a Hamming radius of a 64-bit perceptual hash, exactly.

Multi-index hashing (Norouzi et al.; the tables of Manku et al., WWW 2007): the hash's
bits cut into three blocks of 21 bits, a table per block from its value to the images
that have it. Two hashes within ``r`` bits differ in at most ``floor(r / 3)`` bits of some
block (pigeonhole), so looking up every value within that many bits of each block finds
all of them: a search is exact, never approximate. For r = 4, 3 x 22 lookups a search, at
10^8 images about 48 images a value and some 3,200 candidates compared. The tables'
layout is dedup/tables.py's.

Only the canonical images of clusters are kept (the first seen of each; a duplicate is
answered by its canonical and never searched for), each with what a placement needs of it
beside its hash: its identifier, its source, its aspect ratio (the second signal) and a
prefix of its sha256 (to tell an exact copy from a near one).
"""

from __future__ import annotations

import dataclasses
import math
import re
import uuid
from typing import Final

import numpy as np

from dedup.tables import BlockTables, as_bytes

HASH_BITS: Final = 64
# The front of a row's identifier bytes that names an identifier kept whole: no UUID of
# the spelling uuid.UUID writes has it (its variant bits say so), and one that did would
# be kept whole too.
_NAMED: Final = b"\xff" * 8
# A UUID as uuid.UUID spells it (lower case, 8-4-4-4-12): a regular expression is a
# tenth of the cost of parsing one and comparing its spelling.
_UUID: Final = re.compile("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# A batch's identifiers, each 36 characters, joined: all UUIDs if this matches.
_UUIDS: Final = re.compile(f"(?:{_UUID.pattern})*")
_GROW: Final = 1.5
# A row as the journal keeps it: 32 bytes.
RECORD: Final = np.dtype(
    [
        ("phash", np.uint8, (8,)),
        ("identifier", np.uint8, (16,)),
        ("source", "<u2"),
        ("aspect", "<f2"),
        ("sha", "<u4"),
    ]
)


def popcount(phash: str) -> int:
    return int(phash, 16).bit_count()


def pairs_within(phashes: list[str], radius: int) -> list[list[tuple[int, int]]]:
    """For each hash, the (position, distance) of every other one of ``phashes`` at most
    ``radius`` bits from it: a batch searched against itself, all pairs at once (a batch
    of 500 is 250,000 pairs, some 2 ms)."""
    if len(phashes) < 2:
        return [[] for _ in phashes]
    codes = np.array([int(p, 16) for p in phashes], dtype=np.uint64)
    found: list[list[tuple[int, int]]] = [[] for _ in phashes]
    # Rows of the pair matrix a block at a time: 8 bytes a pair, at most 4 MB.
    step = max(1, (1 << 19) // len(codes))
    for top in range(0, len(codes), step):
        distances = np.bitwise_count(codes[top : top + step, None] ^ codes[None, :])
        first, second = np.nonzero(distances <= radius)
        near = distances[first, second].tolist()
        for i, j, d in zip((first + top).tolist(), second.tolist(), near, strict=True):
            if i != j:
                found[i].append((j, d))  # np.nonzero goes row by row: each list is sorted
    return found


@dataclasses.dataclass(frozen=True, slots=True)
class Canonical:
    """A canonical image as the index keeps it."""

    row: int
    identifier: str
    source: str
    aspect: float
    sha_prefix: int


class NearIndex:
    """The canonical images, by perceptual hash; ``within`` finds every one at most
    ``radius`` bits from a hash. Rows are numbered in the order added: the first seen.

    ``add`` only notes a row; the rows noted go into the arrays and the tables together,
    before the next search or journal write: a few numpy calls a batch, where
    a row at a time cost some 25 us each (as much as the search itself at 10^8)."""

    def __init__(self, radius: int = 4) -> None:
        if not 0 <= radius < HASH_BITS:
            raise ValueError(f"radius must be 0-63 bits, not {radius}")
        self.radius = radius
        self._tables = BlockTables(radius)
        self._sources: list[str] = []
        self._source_codes: dict[str, int] = {}
        self._size = 0  # rows added, the noted ones with them
        self._stored = 0  # rows in the arrays and the tables
        self._noted: list[tuple[int, str, int, float, int]] = []
        self._identifiers = np.zeros((0, 16), dtype=np.uint8)
        self._source_of = np.zeros(0, dtype=np.uint16)
        # float16: 3 significant digits, far finer than the tolerance it is compared at.
        self._aspect = np.zeros(0, dtype=np.float16)
        self._sha = np.zeros(0, dtype=np.uint32)
        # Identifiers that are not a UUID in its canonical spelling (a dataset's
        # ``{run}-{key}``, anything a producer sent), kept whole: a row's 16 bytes are
        # then _NAMED and the name's number.
        self._names: list[str] = []
        self._names_taken = 0
        # What take_new has not yet handed to the journal: the rows from _taken, and
        # their hashes (the tables keep them in their own order).
        self._sources_taken = 0
        self._taken = 0
        self._new_codes: list[np.ndarray] = []

    def __len__(self) -> int:
        return self._size

    def within(self, phashes: list[str]) -> list[list[tuple[int, int]]]:
        """For each hash, the (row, distance) of every canonical within the radius, first
        seen first. One call for a batch: the tables search them together."""
        if not phashes:
            return []
        if self._size == 0:
            return [[] for _ in phashes]
        self._store()
        return self._tables.within(np.array([int(p, 16) for p in phashes], dtype=np.uint64))

    def add(self, phash: str, identifier: str, source: str, aspect: float, sha256: str) -> int:
        """Keep a canonical image; returns its row."""
        row = self._size
        self._noted.append(
            (int(phash, 16), identifier, self._code(source), aspect, int(sha256[:8], 16))
        )
        self._size = row + 1
        return row

    def merge(self) -> None:
        """Every row into the tables now (they are merged a million at a time anyway)."""
        self._store()
        self._tables.merge()

    def canonical(self, row: int) -> Canonical:
        if row >= self._stored:
            _, identifier, source, aspect, sha = self._noted[row - self._stored]
            # float16: what the arrays will say.
            return Canonical(row, identifier, self._sources[source], float(np.float16(aspect)), sha)
        return Canonical(
            row=row,
            identifier=self._identifier(self._identifiers[row].tobytes()),
            source=self._sources[self._source_of[row]],
            aspect=float(self._aspect[row]),
            sha_prefix=int(self._sha[row]),
        )

    def _store(self) -> None:
        """The noted rows into the arrays and the tables."""
        if not self._noted:
            return
        codes, identifiers, sources, aspects, shas = zip(*self._noted, strict=True)
        first, self._noted = self._stored, []
        self._reserve(self._size)
        rows = slice(first, self._size)
        self._identifiers[rows] = self._identities(identifiers)
        self._source_of[rows] = sources
        self._aspect[rows] = aspects
        self._sha[rows] = shas
        hashes = np.array(codes, dtype=np.uint64)
        self._tables.add(hashes)
        self._new_codes.append(hashes)
        self._stored = self._size

    def _identities(self, identifiers: tuple[str, ...]) -> np.ndarray:
        """A batch's identifiers as rows of 16 bytes: UUIDs parsed together (a tenth of the
        cost of one at a time), the others one by one, in order (``_names`` is in row
        order)."""
        joined = "".join(identifiers)
        if set(map(len, identifiers)) == {36} and _UUIDS.fullmatch(joined):
            raw = np.frombuffer(bytes.fromhex(joined.replace("-", "")), dtype=np.uint8)
            raw = raw.reshape(-1, 16)
            if not (raw[:, :8] == 0xFF).all(axis=1).any():
                return raw
        identities = b"".join(self._identity(i) for i in identifiers)
        return np.frombuffer(identities, dtype=np.uint8).reshape(-1, 16)

    def _identity(self, identifier: str) -> bytes:
        """An identifier's 16 bytes: a UUID's own, or the number of its name."""
        if _UUID.fullmatch(identifier):
            raw = bytes.fromhex(identifier.replace("-", ""))
            if not raw.startswith(_NAMED):
                return raw
        self._names.append(identifier)
        return _NAMED + (len(self._names) - 1).to_bytes(8, "little")

    def _identifier(self, identity: bytes) -> str:
        if identity.startswith(_NAMED):
            return self._names[int.from_bytes(identity[8:], "little")]
        return str(uuid.UUID(bytes=identity))

    def take_names(self) -> list[str]:
        """The identifiers kept whole since the last call (the journal writes them before
        the rows that name them)."""
        self._store()
        names = self._names[self._names_taken :]
        self._names_taken = len(self._names)
        return names

    def take_new(self) -> tuple[list[str], np.ndarray]:
        """The sources named and the rows added since the last call, as the journal
        writes them (dedup/journal.py): the new source names, in code order, and a RECORD
        array."""
        self._store()
        sources = self._sources[self._sources_taken :]
        self._sources_taken = len(self._sources)
        rows = slice(self._taken, self._size)
        records = np.zeros(self._size - self._taken, dtype=RECORD)
        if self._new_codes:
            records["phash"] = as_bytes(np.concatenate(self._new_codes))
        records["identifier"] = self._identifiers[rows]
        records["source"] = self._source_of[rows]
        records["aspect"] = self._aspect[rows]
        records["sha"] = self._sha[rows]
        self._taken, self._new_codes = self._size, []
        return sources, records

    @classmethod
    def of_records(
        cls, radius: int, sources: list[str], records: np.ndarray, names: list[str] | None = None
    ) -> NearIndex:
        """An index of journaled rows, in their order (all taken), and the identifiers
        they name (``take_names``)."""
        index = cls(radius)
        index._names = list(names or [])
        index._names_taken = len(index._names)
        index._sources = list(sources)
        index._source_codes = {s: i for i, s in enumerate(sources)}
        index._sources_taken = len(sources)
        n = len(records)
        index._identifiers = records["identifier"].copy()
        index._source_of = records["source"].copy()
        index._aspect = records["aspect"].copy()
        index._sha = records["sha"].copy()
        if n and int(index._source_of.max()) >= len(sources):
            raise ValueError(f"a row names source {int(index._source_of.max())} of {len(sources)}")
        hashes = np.ascontiguousarray(records["phash"]).view(">u8").reshape(-1)
        index._tables.add(hashes.astype(np.uint64))
        index._size = index._stored = index._taken = n
        return index

    def _code(self, source: str) -> int:
        code = self._source_codes.get(source)
        if code is None:
            code = len(self._sources)
            if code > np.iinfo(np.uint16).max:
                raise ValueError("more than 65,536 sources")
            self._sources.append(source)
            self._source_codes[source] = code
        return code

    def _reserve(self, rows: int) -> None:
        if rows <= len(self._source_of):
            return
        capacity = max(rows, math.ceil(len(self._source_of) * _GROW), 1024)
        self._identifiers = _grown(self._identifiers, capacity)
        self._source_of = _grown(self._source_of, capacity)
        self._aspect = _grown(self._aspect, capacity)
        self._sha = _grown(self._sha, capacity)


def _grown(array: np.ndarray, capacity: int) -> np.ndarray:
    grown = np.zeros((capacity, *array.shape[1:]), dtype=array.dtype)
    grown[: len(array)] = array
    return grown
