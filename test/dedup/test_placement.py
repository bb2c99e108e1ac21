"""Placing images in clusters: exact and near copies, stars not chains, degenerate hashes,
the second signal, and placing again (dedup/placement.py, dedup/index.py)."""

from __future__ import annotations

import hashlib
import random
import uuid

import numpy as np
import pytest

from dedup.index import NearIndex
from dedup.placement import Image, Placement, Placer, degenerate


def ident(n: int) -> str:
    return str(uuid.UUID(int=n + 1))


def flipped(phash: str, bits: list[int]) -> str:
    value = int(phash, 16)
    for bit in bits:
        value ^= 1 << bit
    return f"{value:016x}"


def random_phash(rng: random.Random) -> str:
    # As imagehash's: 32 of the 64 bits set.
    bits = rng.sample(range(64), 32)
    return f"{sum(1 << b for b in bits):016x}"


def image(n, phash, *, source="museum", size=(1200, 800), body=None) -> Image:
    sha = hashlib.sha256(body if body is not None else f"body {n}".encode()).hexdigest()
    return Image(ident(n), source, size[0], size[1], sha, phash)


def test_an_exact_copy_a_near_copy_and_a_stranger():
    rng = random.Random(1)
    original = image(0, random_phash(rng), body=b"photo")
    exact = image(1, original.phash, source="commons", body=b"photo")
    near = image(2, flipped(original.phash, [3, 17, 40, 63]), source="flickr", size=(600, 400))
    far = image(3, flipped(original.phash, [3, 17, 40, 63, 5, 9]))
    placed = Placer(NearIndex()).place([original, exact, near, far])
    assert placed == [
        Placement(ident(0), "museum", "unique"),
        Placement(ident(1), "commons", "exact", ident(0), "museum", 0),
        Placement(ident(2), "flickr", "near", ident(0), "museum", 4),
        Placement(ident(3), "museum", "unique"),
    ]


def test_the_same_hash_with_other_bytes_is_near_at_distance_0():
    rng = random.Random(2)
    original = image(0, random_phash(rng))
    reencoded = image(1, original.phash)  # other bytes: another sha256
    assert Placer(NearIndex()).place([original, reencoded])[1] == Placement(
        ident(1), "museum", "near", ident(0), "museum", 0
    )


def test_clusters_are_stars_around_the_first_seen_never_chains():
    rng = random.Random(3)
    a = image(0, random_phash(rng))
    b = image(1, flipped(a.phash, [0, 1, 2, 3]))  # 4 from a
    c = image(2, flipped(b.phash, [10, 11, 12, 13]))  # 4 from b, 8 from a
    placer = Placer(NearIndex())
    placed = placer.place([a, b, c])
    assert [p.kind for p in placed] == ["unique", "near", "unique"]
    assert placed[1].duplicate_of == ident(0)
    # c is not b's: b is no canonical, and c is a cluster of its own.
    assert len(placer.index) == 2


def test_an_image_near_two_canonicals_joins_the_first_seen():
    rng = random.Random(4)
    a = image(0, random_phash(rng))
    b = image(1, flipped(a.phash, [0, 1, 2, 3, 4, 5]))  # 6 from a: its own cluster
    c = image(2, flipped(a.phash, [0, 1, 2]))  # 3 from a, 3 from b
    placed = Placer(NearIndex()).place([a, b, c])
    assert placed[1].kind == "unique"
    assert (placed[2].duplicate_of, placed[2].distance) == (ident(0), 3)


def test_a_hash_within_the_radius_but_another_aspect_ratio_is_another_photograph():
    rng = random.Random(5)
    wide = image(0, random_phash(rng), size=(1600, 900))
    square = image(1, flipped(wide.phash, [1, 2]), size=(1000, 1000))
    halved = image(2, flipped(wide.phash, [7, 8]), size=(800, 450))
    odd = image(3, flipped(wide.phash, [9]), size=(333, 187))  # 1600 x 900 at 0.208, rounded
    placed = Placer(NearIndex()).place([wide, square, halved, odd])
    assert [p.kind for p in placed] == ["unique", "unique", "near", "near"]


@pytest.mark.parametrize("phash", ["8000000000000000", "0000000000000000", "fffe000000000000"])
def test_blank_and_flat_images_never_cluster(phash):
    assert degenerate(phash)
    placer = Placer(NearIndex())
    placed = placer.place([image(n, phash, body=b"blank") for n in range(3)])
    assert [p.kind for p in placed] == ["unique"] * 3
    assert len(placer.index) == 0


def test_an_image_without_a_hash_is_unique_and_kept_nowhere():
    placer = Placer(NearIndex())
    placed = placer.place([image(0, None), image(1, None, body=b"body 0")])
    assert [p.kind for p in placed] == ["unique", "unique"]
    assert len(placer.index) == 0


def corpus(rng: random.Random, n: int) -> list[Image]:
    """n images: random hashes, each fifth a copy of an earlier one 0-4 bits off."""
    images: list[Image] = []
    for i in range(n):
        if images and i % 5 == 0:
            original = rng.choice(images)
            bits = rng.sample(range(64), rng.randint(0, 4))
            images.append(image(i, flipped(original.phash, bits), size=(1200, 800)))
        else:
            images.append(image(i, random_phash(rng)))
    return images


def test_placing_again_gives_the_same_answers_and_adds_nothing():
    # At least once delivery: a message placed twice, or a batch replayed after a crash.
    images = corpus(random.Random(6), 400)
    placer = Placer(NearIndex())
    first = placer.place(images)
    kept = len(placer.index)
    shuffled = images[::-1]
    again = {p.identifier: p for p in placer.place(shuffled)}
    assert [again[p.identifier] for p in first] == first
    assert len(placer.index) == kept


def test_a_batch_is_placed_as_the_same_images_one_by_one():
    images = corpus(random.Random(7), 300)
    together = Placer(NearIndex()).place(images)
    alone = Placer(NearIndex())
    assert [alone.place([i])[0] for i in images] == together
    # A batch's canonicals are stored with the next search: those of the batch before
    # are found in the tables, those of its own among the batch.
    sevens = Placer(NearIndex())
    assert [p for n in range(0, 300, 7) for p in sevens.place(images[n : n + 7])] == together


def test_the_index_finds_every_canonical_within_the_radius_as_a_scan_does():
    rng = np.random.default_rng(8)
    codes = rng.integers(0, 2**63, size=5000, dtype=np.uint64)
    index = NearIndex(radius=4)
    for n, code in enumerate(codes):
        index.add(f"{int(code):016x}", ident(n), "s", 1.5, "0" * 64)
    queries = []
    for n in range(300):  # planted at 0-4 bits from a kept one, and some strangers
        code = int(codes[rng.integers(len(codes))])
        for bit in rng.choice(64, size=n % 5, replace=False):
            code ^= 1 << int(bit)
        queries.append(code)
    queries += [int(c) for c in rng.integers(0, 2**63, size=100, dtype=np.uint64)]
    found = index.within([f"{q:016x}" for q in queries])
    for query, rows in zip(queries, found, strict=True):
        scan = sorted(
            (n, (query ^ int(c)).bit_count())
            for n, c in enumerate(codes)
            if (query ^ int(c)).bit_count() <= 4
        )
        assert rows == scan
    assert all(found[n] for n in range(300))
