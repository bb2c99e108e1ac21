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
from collections.abc import Sequence
from typing import Final, Literal

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


class Placer:
    """Places images in order, keeping each new canonical in ``index``."""

    def __init__(self, index: NearIndex) -> None:
        self.index = index

    def place(self, images: Sequence[Image]) -> list[Placement]:
        """Place a batch, in order: the index is searched once for all of them, and the
        batch once against itself (in C, not pair by pair), so that each is also compared
        with the canonicals the batch added before it."""
        positions = [n for n, i in enumerate(images) if _clusterable(i)]
        hashes = [images[n].phash or "" for n in positions]
        found = dict(zip(positions, self.index.within(hashes), strict=True))
        among = dict(zip(positions, pairs_within(hashes, self.index.radius), strict=True))
        row_at: dict[int, int] = {}  # batch position -> row, of the batch's canonicals
        placements = []
        for n, image in enumerate(images):
            if n not in found:
                placements.append(Placement(image.identifier, image.source, "unique"))
                continue
            earlier = [(row_at[positions[j]], d) for j, d in among[n] if positions[j] in row_at]
            placement = self._placed(image, found[n] + earlier)
            if placement is None:
                row_at[n] = self.index.add(
                    image.phash or "",
                    image.identifier,
                    image.source,
                    image.width / image.height,
                    image.sha256 or "0" * 64,
                )
                placement = Placement(image.identifier, image.source, "unique")
            placements.append(placement)
        return placements

    def _placed(self, image: Image, candidates: list[tuple[int, int]]) -> Placement | None:
        """The placement among the canonicals within the radius, or None: a canonical."""
        near: tuple[Canonical, int] | None = None
        sha_prefix = int(image.sha256[:8], 16) if image.sha256 else None
        for row, distance in sorted(candidates):
            canonical = self.index.canonical(row)
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
