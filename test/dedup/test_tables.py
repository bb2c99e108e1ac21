"""The block tables find what a scan finds, whether the rows are in the tables, in the
recent index, or merged in many times (dedup/tables.py)."""

from __future__ import annotations

import numpy as np
import pytest

from dedup.tables import BlockTables


def near(rng, codes, n, radius):
    queries = codes[rng.integers(0, len(codes), n)].copy()
    for i in range(n):
        for bit in rng.choice(64, size=i % (radius + 2), replace=False):
            queries[i] ^= np.uint64(1) << np.uint64(int(bit))
    return queries


@pytest.mark.parametrize(("merge_at", "radius"), [(7, 4), (1000, 4), (10**9, 4), (500, 6)])
def test_a_search_finds_every_row_within_the_radius_and_no_other(merge_at, radius):
    rng = np.random.default_rng(merge_at + radius)
    codes = rng.integers(0, 2**64, size=3000, dtype=np.uint64)
    tables = BlockTables(radius, merge_at=merge_at)
    for start in range(0, len(codes), 50):
        tables.add(codes[start : start + 50])
    queries = near(rng, codes, 300, radius)
    found = tables.within(queries)
    for query, hits in zip(queries, found, strict=True):
        distances = np.bitwise_count(codes ^ query)
        assert hits == [(int(r), int(distances[r])) for r in np.nonzero(distances <= radius)[0]]
    assert len(tables) == len(codes)


def test_an_empty_table_and_an_empty_batch_find_nothing():
    tables = BlockTables(4)
    assert tables.within(np.array([1, 2], dtype=np.uint64)) == [[], []]
    tables.add(np.array([5], dtype=np.uint64))
    assert tables.within(np.zeros(0, dtype=np.uint64)) == []
    assert tables.within(np.array([5, 7], dtype=np.uint64)) == [[(0, 0)], [(0, 1)]]


@pytest.mark.parametrize("merge_at", [100, 10**9])
def test_a_batch_whose_queries_each_match_thousands_of_rows_finds_them_all(merge_at):
    # Every one of 4,000 rows is within the radius of both queries: runs far longer than
    # a random table's, probed by more than one flip mask each; in the tables, or (never
    # merged) as chains thousands of rows long, added in batches of one and of many.
    rng = np.random.default_rng(7)
    base = rng.integers(0, 2**64, dtype=np.uint64)
    codes = np.array([base ^ (np.uint64(1) << np.uint64(i % 64)) for i in range(4000)])
    tables = BlockTables(4, merge_at=merge_at)
    tables.add(codes[:1])
    tables.add(codes[1:3000])
    for code in codes[3000:]:
        tables.add(code[None])
    found = tables.within(np.array([base, base ^ np.uint64(3)], dtype=np.uint64))
    assert found[0] == [(r, 1) for r in range(4000)]
    assert found[1] == [(r, 1 if r % 64 in (0, 1) else 3) for r in range(4000)]


def test_tables_merged_in_place_many_times_are_laid_out_as_tables_built_at_once():
    # Long runs of few values in every chunk of the merge, so that rows move over each
    # other's places; and some chunks empty.
    rng = np.random.default_rng(12)
    shifts = np.array([0, 17, 40, 41], dtype=np.uint64)[rng.integers(0, 4, 5000)]
    codes = rng.integers(0, 2**64, size=5000, dtype=np.uint64) >> shifts
    merged = BlockTables(4, merge_at=333)
    for start in range(0, len(codes), 111):
        merged.add(codes[start : start + 111])
    merged.add(np.zeros(0, dtype=np.uint64))
    at_once = BlockTables(4, merge_at=len(codes))
    at_once.add(codes[:4995])
    at_once.add(codes[4995:])
    merged.merge()
    for t in range(3):
        assert np.array_equal(merged._starts[t], at_once._starts[t])
        assert np.array_equal(merged._order[t], at_once._order[t])
        assert np.array_equal(merged._prints[t], at_once._prints[t])
    assert np.array_equal(merged._codes, at_once._codes)
