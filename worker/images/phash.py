"""The perceptual hash of an image, from the pixels of its thumbnail.

The rule is imagehash 4.3's ``phash(image, hash_size=8, highfreq_factor=4)``, so that a
consumer can hash a query image with ``imagehash.phash`` and compare by Hamming distance:
the image in grey (ITU-R 601-2 luma), resized to 32 x 32 with Pillow's LANCZOS (a = 3),
its unnormalised 2-D DCT-II (``scipy.fftpack.dct`` along each axis), the 8 x 8 lowest
frequencies of that, and a bit for each, 1 where it is above their median; the 64 bits
row by row, the first the most significant, as 16 lower-case hex digits. Given a 32 x 32
grey image, the hash here is imagehash's exactly.

Larger images take two shortcuts, each a linear filter close to the one it replaces: the
grey image is first halved (2 x 2 means, OpenCV's SIMD resize) until both sides are
under 192 pixels, as Pillow's own ``reducing_gap`` reduces by boxes before its filter;
and the Lanczos resize and the 8 lowest rows of the DCT make one matrix per side length,
so the 32 x 32 image is never rounded to bytes. Per 640 x 360 thumbnail that is 0.08 ms
of CPU, where imagehash takes 0.96 ms (0.73 ms of it Pillow's LANCZOS resize), in a
kernel of 4.5-9 ms per image; imagehash would also bring scipy and PyWavelets (153 MB
installed) into the worker's image. On 322 thumbnails (the kernel's, of bench/corpus's
300 files and crawlctl/samples' 22) the hash is imagehash's of the same thumbnail for
289 and at most 4 bits off (mean 0.21), and at most 2 bits off imagehash's of the
full-size original (mean 0.22), as imagehash's of the thumbnail itself is (mean 0.16).
Halving down to under 128 pixels saved no measurable time and left up to 4 bits (mean
0.28) off the originals'; down to under 256 took 0.02 ms more for a mean of 0.19. Under
32 pixels a side, where Pillow clips the Lanczos overshoot between its two passes and
this does not, the hash can be further off (16 bits on 3 x 5 pixels of noise).

The sums are in float32, rounded to whole numbers before the median: far below the
rounding of imagehash's own 32 x 32 image to bytes (about 18 on a coefficient), and an
image without detail (flat, or symmetric) then gets imagehash's hash (``8000000000000000``
for a flat one) rather than bits drawn from rounding noise.
"""

from __future__ import annotations

import functools
from typing import Any, Final

import cv2
import numpy as np

# The side of the grey image the DCT is taken of, and of the block of bits kept.
_DCT_SIDE: Final = 32
_HASH_SIDE: Final = 8
_MIDDLE: Final = _HASH_SIDE * _HASH_SIDE // 2
_LANCZOS_A: Final = 3.0
# Halving stops once a side is under this, leaving the Lanczos step a reduction of 3 to 6.
_HALVE_FROM: Final = 6 * _DCT_SIDE


def phash(pixels: Any) -> str:
    """The 64-bit perceptual hash of ``pixels`` as 16 hex digits.

    ``pixels`` is a uint8 array of rows x columns (grey), or rows x columns x 1 or 3 (RGB).
    """
    grey = _grey(pixels)
    rows, cols = grey.shape
    low = _projection(rows) @ _halved(grey).astype(np.float32) @ _projection(cols).T
    low = np.rint(low.ravel())
    # np.median, without the overhead that was a third of the hash's CPU in the kernel.
    ordered = np.sort(low)
    median = (ordered[_MIDDLE - 1] + ordered[_MIDDLE]) / 2
    return np.packbits(low > median).tobytes().hex()


def _grey(pixels: Any) -> Any:
    if pixels.ndim == 3 and pixels.shape[2] == 3:
        return cv2.cvtColor(pixels, cv2.COLOR_RGB2GRAY)
    if pixels.ndim == 3 and pixels.shape[2] == 1:
        return pixels.reshape(pixels.shape[:2])
    if pixels.ndim == 2:
        return pixels
    raise ValueError(f"pixels must be grey or RGB, not of shape {pixels.shape}")


def _halved(grey: Any) -> Any:
    """``grey`` halved along each side of at least ``_HALVE_FROM`` pixels, until none is.

    At a scale of exactly 1/2, OpenCV's bilinear resize centres output pixel i on input
    pixel 2i + 0.5: the mean of each 2 x 2 block (of 2 pixels along a side halved
    alone), whatever the output size it rounds an odd side to."""
    rows, cols = grey.shape
    while rows >= _HALVE_FROM or cols >= _HALVE_FROM:
        fx = 0.5 if cols >= _HALVE_FROM else 1.0
        fy = 0.5 if rows >= _HALVE_FROM else 1.0
        grey = cv2.resize(grey, None, fx=fx, fy=fy, interpolation=cv2.INTER_LINEAR)
        rows, cols = grey.shape
    return grey


@functools.lru_cache(maxsize=1024)  # one per side length: 6 KB each at most
def _projection(side: int) -> Any:
    """8 x the side's length after ``_halved``: a side of ``side`` pixels, halved, resized
    to 32, then the 8 lowest rows of the DCT-II along it.

    An odd side halves to a rounded number of pixels (as OpenCV rounds: half to even)
    that cover ``side / 2`` of them: the resize maps exactly that onto the 32."""
    size, extent = side, float(side)
    while size >= _HALVE_FROM:
        size, extent = round(size / 2), extent / 2
    projection = dct_matrix(_DCT_SIDE)[:_HASH_SIDE] @ lanczos_matrix(size, _DCT_SIDE, extent)
    return projection.astype(np.float32)


def dct_matrix(size: int) -> Any:
    """``size`` x ``size``: the unnormalised DCT-II, ``2 cos(pi k (2n + 1) / (2 size))``
    at row k, column n (``scipy.fftpack.dct(x, type=2)`` is ``dct_matrix(len(x)) @ x``)."""
    k = np.arange(size)
    return 2.0 * np.cos(np.pi * np.outer(k, 2 * k + 1) / (2 * size))


def lanczos_matrix(size_in: int, size_out: int, extent: float | None = None) -> Any:
    """``size_out`` x ``size_in``: Pillow's LANCZOS resize of one side, as weights.

    Pillow's rule (``precompute_coeffs`` in libImaging/Resample.c, with a box of
    ``[0, extent]``, all of the side by default): output pixel i is centred on input
    ``(i + 0.5) * scale``, ``scale = extent / size_out``; the filter is stretched by the
    scale when reducing, takes the input pixels from ``int(centre - support + 0.5)`` up
    to ``int(centre + support + 0.5)`` (within the side), and its weights are normalised
    to sum to 1. The same sizes over the whole side are left alone, as Pillow leaves them.
    """
    extent = float(size_in) if extent is None else extent
    if size_in == size_out == extent:
        return np.eye(size_out)
    scale = extent / size_out
    stretch = max(scale, 1.0)
    support = _LANCZOS_A * stretch
    centres = (np.arange(size_out) + 0.5)[:, None] * scale
    first = np.maximum((centres - support + 0.5).astype(int), 0)
    end = np.minimum((centres + support + 0.5).astype(int), size_in)
    pixel = np.arange(size_in)[None, :]
    x = (pixel - centres + 0.5) / stretch
    taps = np.sinc(x) * np.sinc(x / _LANCZOS_A)
    taps = np.where((pixel >= first) & (pixel < end) & (np.abs(x) < _LANCZOS_A), taps, 0.0)
    return taps / taps.sum(axis=1, keepdims=True)
