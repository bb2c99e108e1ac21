"""The stage's placement on real photographs (issue 54, requirement 4): scikit-image's
photographs (the test corpus's, bench/dedup_real.py's ``SKIMAGE_PHOTOS``) published by
source A, and copies of each by other sources, every file through the worker's own
kernel (its thumbnail's pHash, its sha256) and then ``dedup.placement.Placer``.
``python -m bench.dedup_real`` runs the same over the benchmark's wallpapers too and
writes the figures (docs/deduplication.md, On real photographs)."""

from __future__ import annotations

import math

import pytest

from bench.dedup_real import (
    CLUSTERED,
    Placed,
    balanced_cdf,
    false_matches,
    pairs_of,
    place_all,
    skimage_photographs,
    tail_bits,
)
from dedup.index import NearIndex
from dedup.placement import Image, Placement

RADIUS = NearIndex().radius
PHOTOS = skimage_photographs()
pytestmark = pytest.mark.skipif(not PHOTOS, reason="scikit-image's photographs are not installed")


@pytest.fixture(scope="module")
def placed() -> tuple[list[Image], list[Placement], list[Placed]]:
    return place_all(PHOTOS)


def test_copies_are_clustered_with_their_original(placed) -> None:
    _, _, copies = placed
    wanted = [c for c in copies if c.transform in CLUSTERED]
    assert len(wanted) == len(CLUSTERED) * len(PHOTOS)
    missed = {c.image.identifier: c.placement for c in wanted if not c.with_original}
    assert len(missed) <= 0.05 * len(wanted), missed
    for copy in wanted:
        if copy.with_original:
            assert copy.placement.kind in ("exact", "near")
            assert copy.placement.duplicate_of_source == "A"
            assert copy.placement.distance == copy.distance <= RADIUS


def test_no_distinct_photographs_are_clustered_together(placed) -> None:
    originals, first, copies = placed
    assert [p.kind for p in first] == ["unique"] * len(PHOTOS)
    assert [c.image.identifier for c in copies if c.false] == []
    # Far from it: the closest two of these are 20 bits apart (five times the radius).
    assert min(d for d, *_ in pairs_of(originals)) > 2 * RADIUS


def test_a_mirrored_copy_is_not_clustered(placed) -> None:
    # A stable fact, not a hope: a mirror keeps every even horizontal frequency of the
    # DCT and negates every odd one, so about half of the 64 bits (those of odd
    # frequencies whose coefficient is far from the median) flip. These are 28-32 bits
    # from their originals, and over the wallpapers too the least is 26. Only a
    # photograph symmetric about its vertical axis would stay close.
    _, _, copies = placed
    flips = [c for c in copies if c.transform == "flip"]
    assert all(c.placement.kind == "unique" for c in flips)
    assert min(c.distance for c in flips) > 4 * RADIUS
    # The 10 % crops are measured by the benchmark, not asserted either way: they are
    # 10-26 bits from their originals here, but 5 of the 28 wallpapers' are within 4
    # bits and clustered, so neither answer is a property of pHash.


def test_the_false_match_figures_of_random_hashes() -> None:
    pairs = 10**8 * (10**8 - 1) / 2
    uniform = sum(math.comb(64, i) for i in range(5)) / 2**64
    assert round(uniform * pairs) == 184  # the figure of "Two signals" in the docs
    exact = (1 + 32**2 + math.comb(32, 2) ** 2) / math.comb(64, 32)
    assert balanced_cdf(4, 64) == pytest.approx(exact, rel=1e-12)
    assert balanced_cdf(64, 64) == pytest.approx(1.0)
    # Between two whole k, the interpolation stays between their answers.
    assert balanced_cdf(4, 64) < balanced_cdf(5, 64) < balanced_cdf(6, 64)


def test_the_tail_fit_finds_the_length_of_random_balanced_hashes() -> None:
    # The exact distribution of distances between random 32-of-64 hashes, 10^6 pairs.
    counts = {2 * k: math.comb(32, k) ** 2 / math.comb(64, 32) * 10**6 for k in range(33)}
    ordered = [d for d, n in counts.items() for _ in range(round(n))]
    assert tail_bits(ordered) == (64, 16)
    figures = false_matches(ordered, RADIUS, aspect_share=0.25)
    assert figures["pairs_at_catalog"]["tail_fit"] == pytest.approx(674, rel=0.01)
    assert figures["with_aspect"]["tail_fit"] == pytest.approx(674 / 4, rel=0.01)
