"""Multi-index hashing laid out for 10^8 hashes: sorted tables, searched a batch at a time.

The same pigeonhole as faiss' ``IndexBinaryMultiHash`` (dedup/index.py's docstring):
three blocks of 21 bits (bits 63-43, 42-22, 21-1), and every value within
``radius // 3`` bits of each block looked up, so a search is exact for any
``radius``. The layout is what differs. Each table is the rows sorted by their block
value, each row's number (4 bytes) and its print (4 bytes: 32 of its hash's bits outside
the block) side by side, and where each value's run starts (2^21 + 1 offsets of 4
bytes); the whole hashes are kept once, in row order: 32 bytes a row in all, where faiss'
hash maps of vectors took 89. A probe's candidates are compared where they lie, one run
of contiguous prints, not gathered from all over memory one cache miss each (at 10^8
rows a search has some 3,200 candidates in 66 runs); only a print within the radius has
its whole hash read. Row numbers, and so run starts, fit 4 bytes: a table holds fewer
than 2^32 rows. A batch's lookups, candidates and distances are whole-array numpy
operations.

The rows added since the tables were last built are kept apart, in chains (``_Recent``),
and merged into the tables once there are ``merge_at`` of them: a merge places each
table's new rows after the old ones of their value, in one pass.
"""

from __future__ import annotations

from typing import Final

import numpy as np

BLOCKS: Final = 3
BLOCK_BITS: Final = 21
_VALUES: Final = 1 << BLOCK_BITS
_MASK: Final = np.uint64(_VALUES - 1)
_SHIFTS: Final = tuple(np.uint64(64 - BLOCK_BITS * (t + 1)) for t in range(BLOCKS))
MERGE_AT: Final = 1 << 20
PRINT_BITS: Final = 32
_PRINT_MASK: Final = np.uint64((1 << PRINT_BITS) - 1)
_LINE: Final = 64 * 8 // PRINT_BITS  # prints a cache line
_PREFETCH: Final = 64


def _flips(nflip: int) -> np.ndarray:
    """Every 21-bit mask of at most ``nflip`` bits."""
    masks = [0]
    for _ in range(nflip):
        masks = sorted({m | (1 << b) for m in masks for b in range(BLOCK_BITS)} | set(masks))
    return np.array(masks, dtype=np.uint32)


def prints(codes: np.ndarray, t: int) -> np.ndarray:
    """Table ``t``'s print of each uint64 hash: the 32 bits above its block, wrapping
    round past bit 63 (none of them in the block)."""
    shift = _SHIFTS[t]
    rotated = (codes >> shift) | (codes << (np.uint64(64) - shift))
    return ((rotated >> np.uint64(BLOCK_BITS)) & _PRINT_MASK).astype(np.uint32)


def as_bytes(codes: np.ndarray) -> np.ndarray:
    """uint64 hashes as 8 bytes each, most significant first (the journal's)."""
    return codes.astype(">u8").view(np.uint8).reshape(-1, 8)


class BlockTables:
    def __init__(self, radius: int, merge_at: int = MERGE_AT) -> None:
        self.radius = radius
        self.merge_at = merge_at
        self._flip_masks = _flips(radius // BLOCKS)
        self._size = 0
        self._built = 0  # rows in the tables; those past it are in _recent
        self._order = [np.zeros(0, dtype=np.uint32) for _ in range(BLOCKS)]
        self._prints = [np.zeros(0, dtype=np.uint32) for _ in range(BLOCKS)]
        self._codes = np.zeros(0, dtype=np.uint64)  # every row's hash, in row order
        self._starts = [np.zeros(_VALUES + 1, dtype=np.uint32) for _ in range(BLOCKS)]
        self._recent = _Recent()

    def __len__(self) -> int:
        return self._size

    def add(self, codes: np.ndarray) -> None:
        """Append rows (uint64 hashes) in order."""
        codes = np.array(codes, dtype=np.uint64)  # a copy: the caller's may change
        self._size += len(codes)
        if self._size - self._built >= self.merge_at:
            self._merge(codes)  # not chained first: a bulk load goes into the tables at once
        else:
            self._recent.add(codes)

    def within(self, queries: np.ndarray) -> list[list[tuple[int, int]]]:
        """For each uint64 query, the (row, distance) of every row within the radius,
        sorted by row."""
        queries = np.asarray(queries, dtype=np.uint64)
        q_all, r_all, d_all = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0)]
        if self._built:
            for t in range(BLOCKS):
                q, r, d = self._table_hits(t, queries)
                q_all.append(q)
                r_all.append(r)
                d_all.append(d)
        if self._size > self._built and len(queries):
            q, r, d = self._recent.hits(queries, self._flip_masks, self.radius)
            q_all.append(q)
            r_all.append(r + self._built)
            d_all.append(d)
        q = np.concatenate(q_all)
        r = np.concatenate(r_all)
        d = np.concatenate(d_all).astype(np.int64)
        # A row found in several tables is one hit; sorted by query, then row.
        key = q * (1 << 40) + r
        key, first = np.unique(key, return_index=True)
        found: list[list[tuple[int, int]]] = [[] for _ in range(len(queries))]
        if len(first):
            # Most queries of a batch find nothing: only the others' lists are built.
            q, r, d = q[first].tolist(), r[first].tolist(), d[first].tolist()
            for n, query in enumerate(q):
                found[query].append((r[n], d[n]))
        return found

    def _table_hits(self, t: int, queries: np.ndarray) -> tuple[np.ndarray, ...]:
        starts, order, table = self._starts[t], self._order[t], self._prints[t]
        flips = len(self._flip_masks)
        values = ((queries >> _SHIFTS[t]) & _MASK).astype(np.uint32)
        probes = (values[:, None] ^ self._flip_masks[None, :]).ravel()
        low = starts[probes].astype(np.int64)
        counts = starts[probes + 1] - low
        ends = np.cumsum(counts)
        total = int(ends[-1])
        if total == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
        # Each run's cache lines asked for first, the runs interleaved (the k-th line of
        # every run, then the next): the gather below reads run after run, and its misses,
        # one run at a time, were most of a search at 10^8 rows (4.9 of 8.8 us a query and
        # table, over 10^8 hashes in runs as these tables make them); asked side by side
        # they overlap (7.0 us in all).
        # The first _PREFETCH of each (at 10^8 rows a run is 48 long, its longest of a batch
        # some 80): the rest of a long run is read in order, which the hardware prefetches
        # itself, and the array stays small (5% faster than 256 at 10^8, the same at 10^7).
        reach = min(int(counts.max()), _PREFETCH)
        lines = (low[None, :] + np.arange(0, reach, _LINE)[:, None]).ravel()
        table[np.minimum(lines, len(table) - 1)]
        # The k-th candidate of a probe is at low + k.
        positions = np.repeat(low - (ends - counts), counts)
        positions += np.arange(total)
        found = table[positions]
        found ^= np.repeat(np.repeat(prints(queries, t), flips), counts)
        near = np.flatnonzero(np.bitwise_count(found) <= self.radius)
        # A hit's probe is the run it lies in; its query, that probe's. Its print is
        # within the radius, so its whole hash is read (rarely: a random row's print is
        # within 4 bits of a query's once in 100,000).
        owner = np.searchsorted(ends, near, side="right") // flips
        rows = order[positions[near]]
        distances = np.bitwise_count(self._codes[rows] ^ queries[owner])
        hit = distances <= self.radius
        return owner[hit], rows[hit].astype(np.int64), distances[hit]

    def merge(self) -> None:
        """Put every row past the tables into them, and empty the recent index (done by
        ``add`` every ``merge_at`` rows)."""
        if self._size > self._built:
            self._merge()

    def _merge(self, added: np.ndarray | None = None) -> None:
        """The recent rows, and ``added`` after them, into the tables."""
        new_rows = np.arange(self._built, self._size, dtype=np.uint32)
        new_codes = self._recent.codes()
        if added is not None:
            new_codes = np.concatenate((new_codes, added))
        for t in range(BLOCKS):
            values = ((new_codes >> _SHIFTS[t]) & _MASK).astype(np.int64)
            self._order[t], self._prints[t], self._starts[t] = _merged(
                (self._order[t], self._prints[t]),
                self._starts[t],
                values,
                (new_rows, prints(new_codes, t)),
            )
        self._codes.resize(self._size, refcheck=False)
        self._codes[self._built :] = new_codes
        self._built = self._size
        self._recent = _Recent()


class _Recent:
    """The rows past the tables, as chains: for each table and block value the last row
    of that value, and for each row the one of its value before it (numbered from 1; 0
    ends a chain). Adding a row is two writes a table; a probe follows its value's chain,
    on random hashes under half a row long even at a million rows over 2^21 values. The
    heads are calloc'd (np.zeros), so a value never written takes no memory.

    Kept in place of a faiss ``IndexBinaryMultiHash``, which cost a search of a batch of
    100 some 6 us a query at 100,000 rows and 15 us at a million (its hash maps' lookups)."""

    def __init__(self) -> None:
        self._heads = np.zeros((BLOCKS, _VALUES), dtype=np.uint32)
        self._before = np.zeros((BLOCKS, 0), dtype=np.uint32)
        self._codes = np.zeros(0, dtype=np.uint64)
        self._size = 0

    def codes(self) -> np.ndarray:
        """The rows' hashes, in order."""
        return self._codes[: self._size]

    def add(self, codes: np.ndarray) -> None:
        first, count = self._size, len(codes)
        if not count:
            return
        if first + count > len(self._codes):
            capacity = max(first + count, 2 * len(self._codes), 1024)
            self._codes = np.concatenate(
                (self._codes[:first], np.zeros(capacity - first, np.uint64))
            )
            before = np.zeros((BLOCKS, capacity), dtype=np.uint32)
            before[:, :first] = self._before[:, :first]
            self._before = before
        self._codes[first : first + count] = codes
        self._size = first + count
        numbers = np.arange(first + 1, first + count + 1, dtype=np.uint32)
        for t in range(BLOCKS):
            values = ((codes >> _SHIFTS[t]) & _MASK).astype(np.int64)
            # Rows of one value within the batch chained to each other in order, the
            # first of them to the value's old head; the last becomes its head.
            by_value = np.argsort(values, kind="stable")
            values, rows = values[by_value], numbers[by_value]
            starts_run = np.ones(count, dtype=bool)
            starts_run[1:] = values[1:] != values[:-1]
            previous = np.empty(count, dtype=np.uint32)
            previous[0] = 0
            previous[1:] = rows[:-1]
            heads = self._heads[t]
            self._before[t, rows - 1] = np.where(starts_run, heads[values], previous)
            ends_run = np.ones(count, dtype=bool)
            ends_run[:-1] = starts_run[1:]
            heads[values[ends_run]] = rows[ends_run]

    def hits(
        self, queries: np.ndarray, flip_masks: np.ndarray, radius: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(query, row, distance) of every row within ``radius`` of a query, once for each
        table it is found in."""
        owners, rows = [], []
        flips = len(flip_masks)
        for t in range(BLOCKS):
            values = ((queries >> _SHIFTS[t]) & _MASK).astype(np.uint32)
            probes = (values[:, None] ^ flip_masks[None, :]).ravel()
            current = self._heads[t][probes]
            live = np.flatnonzero(current)
            owner, current = live // flips, current[live]
            before = self._before[t]
            while len(current):
                owners.append(owner)
                rows.append(current)
                current = before[current - 1]
                live = np.flatnonzero(current)
                owner, current = owner[live], current[live]
        if not rows:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        owner = np.concatenate(owners)
        row = np.concatenate(rows).astype(np.int64) - 1
        distances = np.bitwise_count(self._codes[row] ^ queries[owner])
        hit = distances <= radius
        return owner[hit], row[hit], distances[hit]


def _merged(
    old: tuple[np.ndarray, np.ndarray],
    starts: np.ndarray,
    values: np.ndarray,
    new: tuple[np.ndarray, np.ndarray],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A table, its rows and their hashes (``old``), with ``new`` rows and hashes (of block
    ``values``) added after the old rows of each value; and the runs' new starts.

    In place: the old columns are grown (realloc, which moves a large block's pages
    rather than copying them) and each old row moved up by the new rows of lower values,
    from the top down, a run of values at a time; so a merge at 10^8 rows needs the new
    rows and a 64th of a table beside the tables, not a second copy of one (0.8 GB)."""
    by_value = np.argsort(values, kind="stable")
    added = np.bincount(values, minlength=_VALUES)
    before = np.concatenate(([0], np.cumsum(added)))  # new rows in lower values
    starts = starts.astype(np.int64)
    new_starts = starts + before
    size = len(old[0]) + len(new[0])
    merged = old
    for column in merged:
        # No view of a table's columns outlives a search (its results are copies).
        column.resize(size, refcheck=False)
    old_counts = np.diff(starts)
    step = _VALUES // 64
    for first in reversed(range(0, _VALUES, step)):
        low, high = int(starts[first]), int(starts[first + step])
        if low == high or before[first + step - 1] == 0:
            continue  # nothing in these runs, or nothing new below their end: in place
        shift = np.repeat(before[first : first + step], old_counts[first : first + step])
        target = np.arange(low, high) + shift
        # Every target is at or above its row and below the rows of higher values already
        # moved; a copy, as the chunk may overlap where it goes.
        for column in merged:
            column[target] = column[low:high].copy()
    sorted_values = values[by_value]
    rank = np.arange(len(by_value)) - before[sorted_values]
    target = new_starts[sorted_values] + old_counts[sorted_values] + rank
    for into, column in zip(merged, new, strict=True):
        into[target] = column[by_value]
    return merged[0], merged[1], new_starts.astype(np.uint32)
