"""JPEG quality estimation from quantization tables.

Encoders built on libjpeg (Pillow, most cameras' desktop tools, ImageMagick, GIMP) derive
their tables by scaling the two example tables of the JPEG standard (ITU-T T.81, Annex K)
with one quality setting. We precompute those scaled tables for every quality 1..100 and
look for the one closest to an image's tables.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Mapping, Sequence

# ITU-T T.81 Annex K.1, in natural (row-major) order, the order Pillow exposes.
_LUMINANCE_BASE = (
    16, 11, 10, 16, 24, 40, 51, 61,
    12, 12, 14, 19, 26, 58, 60, 55,
    14, 13, 16, 24, 40, 57, 69, 56,
    14, 17, 22, 29, 51, 87, 80, 62,
    18, 22, 37, 56, 68, 109, 103, 77,
    24, 35, 55, 64, 81, 104, 113, 92,
    49, 64, 78, 87, 103, 121, 120, 101,
    72, 92, 95, 98, 112, 100, 103, 99,
)  # fmt: skip
_CHROMINANCE_BASE = (
    17, 18, 24, 47, 99, 99, 99, 99,
    18, 21, 26, 66, 99, 99, 99, 99,
    24, 26, 56, 99, 99, 99, 99, 99,
    47, 66, 99, 99, 99, 99, 99, 99,
    99, 99, 99, 99, 99, 99, 99, 99,
    99, 99, 99, 99, 99, 99, 99, 99,
    99, 99, 99, 99, 99, 99, 99, 99,
    99, 99, 99, 99, 99, 99, 99, 99,
)  # fmt: skip

_QUALITIES = range(1, 101)
# How many qualities on each side of the sum-based guess are compared element by element;
# sums of tables from non-libjpeg encoders can sit a few steps away from the best match.
_REFINE_RADIUS = 2


def scaled_table(base: Sequence[int], quality: int) -> tuple[int, ...]:
    """The table libjpeg writes for `quality` (1..100) with baseline (8-bit) values forced."""
    scale = 5000 // quality if quality < 50 else 200 - 2 * quality
    return tuple(min(max((value * scale + 50) // 100, 1), 255) for value in base)


_LUMINANCE = tuple(scaled_table(_LUMINANCE_BASE, q) for q in _QUALITIES)
_CHROMINANCE = tuple(scaled_table(_CHROMINANCE_BASE, q) for q in _QUALITIES)
# Sums fall as quality rises; stored negated so that bisect sees an ascending list.
_NEG_LUMINANCE_SUMS = tuple(-sum(table) for table in _LUMINANCE)


def _distance(table: Sequence[int], reference: Sequence[int]) -> int:
    return sum(map(abs, map(operator.sub, table, reference)))


def estimate_jpeg_quality(quantization: Mapping[int, Sequence[int]]) -> int | None:
    """Estimate the JPEG quality (1..100) from Pillow's `im.quantization`.

    The lowest table id is compared with the standard luminance table and the next one,
    if present, with the chrominance table. Exact for files written by libjpeg at any
    quality; the nearest libjpeg quality for other encoders. None when there are no
    usable tables (none at all, or not 64 entries).
    """
    if not quantization:
        return None
    ids = sorted(quantization)
    luminance = tuple(quantization[ids[0]])
    chrominance = tuple(quantization[ids[1]]) if len(ids) > 1 else None
    if len(luminance) != 64 or (chrominance is not None and len(chrominance) != 64):
        return None

    index = bisect.bisect_left(_NEG_LUMINANCE_SUMS, -sum(luminance))
    index = min(index, len(_QUALITIES) - 1)
    # Fast path: libjpeg's own tables match exactly (tuple comparison runs in C).
    if _LUMINANCE[index] == luminance and (
        chrominance is None or _CHROMINANCE[index] == chrominance
    ):
        return _QUALITIES[index]

    best_index, best_distance = index, -1
    for candidate in range(
        max(index - _REFINE_RADIUS, 0), min(index + _REFINE_RADIUS + 1, len(_QUALITIES))
    ):
        distance = _distance(luminance, _LUMINANCE[candidate])
        if chrominance is not None:
            distance += _distance(chrominance, _CHROMINANCE[candidate])
        if best_distance < 0 or distance < best_distance:
            best_index, best_distance = candidate, distance
    return _QUALITIES[best_index]
