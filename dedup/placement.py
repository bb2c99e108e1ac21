"""Where an image goes: into the cluster of an earlier one (exact or near), or a cluster
of its own (unique).

Clusters are stars around their first-seen image, the canonical: only canonicals are
kept in the index, and an image is placed against them alone, so a copy of a copy points
at the original and never at the copy (no chains of transitive links). An image is a
duplicate of the earliest canonical whose perceptual hash is within the radius and whose
aspect ratio agrees (the second signal: a resize, a re-encode or another format keeps it,
and the 64-bit pHash, taken of the image squashed to 32 x 32, never sees it), or an exact
one of a canonical with its very bytes (the same sha256, so the same hash). Placing an
image again gives the same answer: the canonicals before it do not change, and a
canonical placed again finds itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Final, Literal, Protocol

from dedup.index import Canonical, NearIndex, pairs_within, popcount

Kind = Literal["exact", "near", "unique"]
# imagehash's pHash sets a bit for each of its 64 DCT coefficients above their median:
# 32 of them when all differ. An image without detail (blank, one colour, a smooth
# gradient) has most coefficients equal, few above the median (a flat one: 1, the DC term),
# and all such images collide; so a hash with fewer bits set is never clustered.
DEGENERATE_BELOW: Final = 16
# Copies agree on their aspect ratio to within this share, plus one pixel of rounding on
# the shorter side (a 333-pixel side halved is 166 or 167).
ASPECT_TOLERANCE: Final = 0.02


@dataclasses.dataclass(frozen=True, slots=True)
class Image:
    """What a placement reads of an image: its resolution message, and its source."""

    identifier: str
    source: str
    width: int
    height: int
    sha256: str | None
    phash: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class Placement:
    """An image's cluster: ``duplicate_of`` (and its source) is the canonical's
    identifier, None for a unique image, itself a canonical; ``distance`` is the Hamming
    distance of their hashes (0 for an exact copy), None for a unique one."""

    identifier: str
    source: str
    kind: Kind
    duplicate_of: str | None = None
    duplicate_of_source: str | None = None
    distance: int | None = None


def degenerate(phash: str) -> bool:
    return popcount(phash) < DEGENERATE_BELOW


def aspects_agree(aspect: float, image: Image) -> bool:
    ours = image.width / image.height
    rounding = 1.0 / min(image.width, image.height)
    return abs(ours - aspect) <= (ASPECT_TOLERANCE + rounding) * max(ours, aspect)


class Canonicals(Protocol):
    """Where the canonicals are kept, as ``placements`` uses them: a NearIndex in one
    process (Placer), or shards (dedup/shards.py). Keys are in the order kept: of two
    canonicals, the earlier has the smaller key."""

    @property
    def radius(self) -> int: ...

    def within(self, phashes: list[str]) -> list[list[tuple[int, int]]]:
        """For each hash, the (key, distance) of every canonical within the radius."""
        ...

    def keep(self, image: Image) -> int:
        """Keep an image as a canonical; returns its key."""
        ...

    def canonical(self, key: int) -> Canonical: ...


class Placer:
    """Places images in order, keeping each new canonical in ``index``."""

    def __init__(self, index: NearIndex) -> None:
        self.index = index

    @property
    def radius(self) -> int:
        return self.index.radius

    def within(self, phashes: list[str]) -> list[list[tuple[int, int]]]:
        return self.index.within(phashes)

    def keep(self, image: Image) -> int:
        return self.index.add(
            image.phash or "",
            image.identifier,
            image.source,
            image.width / image.height,
            image.sha256 or "0" * 64,
        )

    def canonical(self, key: int) -> Canonical:
        return self.index.canonical(key)

    def place(self, images: Sequence[Image]) -> list[Placement]:
        return placements(images, self)


def placements(images: Sequence[Image], canonicals: Canonicals) -> list[Placement]:
    """Place a batch, in order: the canonicals are searched once for all of them, and the
    batch once against itself (in C, not pair by pair), so that each is also compared
    with the canonicals the batch kept before it."""
    clusterable = [_clusterable(image) for image in images]
    hashes = [image.phash or "" for image, ok in zip(images, clusterable, strict=True) if ok]
    found = canonicals.within(hashes)
    among = pairs_within(hashes, canonicals.radius)
    keys: list[int | None] = [None] * len(hashes)  # of the batch's canonicals
    placed = []
    k = 0  # the next clusterable image's place among the hashes
    for image, ok in zip(images, clusterable, strict=True):
        if not ok:
            placed.append(Placement(image.identifier, image.source, "unique"))
            continue
        candidates = found[k]
        if among[k]:
            earlier = [(key, d) for j, d in among[k] if (key := keys[j]) is not None]
            candidates = candidates + earlier
        # Nothing within the radius (most images): a canonical, without a look.
        placement = placement_among(image, candidates, canonicals.canonical) if candidates else None
        if placement is None:
            keys[k] = canonicals.keep(image)
            placement = Placement(image.identifier, image.source, "unique")
        placed.append(placement)
        k += 1
    return placed


def placement_among(
    image: Image, candidates: list[tuple[int, int]], canonical_of: Callable[[int], Canonical]
) -> Placement | None:
    """The placement among the canonicals within the radius, (key, distance) each, or
    None: a canonical. The earliest is taken, by key: wherever the candidates were found,
    the same ones give the same answer."""
    near: tuple[Canonical, int] | None = None
    sha_prefix = int(image.sha256[:8], 16) if image.sha256 else None
    for key, distance in sorted(candidates):
        canonical = canonical_of(key)
        if canonical.identifier == image.identifier:
            return Placement(image.identifier, image.source, "unique")  # placed again
        if distance == 0 and canonical.sha_prefix == sha_prefix:
            return _duplicate(image, canonical, "exact", 0)
        if near is None and aspects_agree(canonical.aspect, image):
            near = (canonical, distance)
    if near is None:
        return None
    return _duplicate(image, near[0], "near", near[1])


def _clusterable(image: Image) -> bool:
    return (
        image.phash is not None
        and not degenerate(image.phash)
        and image.width > 0
        and image.height > 0
    )


def _duplicate(image: Image, canonical: Canonical, kind: Kind, distance: int) -> Placement:
    return Placement(
        image.identifier, image.source, kind, canonical.identifier, canonical.source, distance
    )


def _distance(a: str, b: str) -> int:
    return (int(a, 16) ^ int(b, 16)).bit_count()
