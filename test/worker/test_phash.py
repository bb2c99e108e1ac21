"""The perceptual hash (worker/images/phash.py) against imagehash's own, on the demo's
photographs (crawlctl/samples): the DCT, the median and the bit order exactly, the
shortcuts (halving, one matrix per side) within the bound measured."""

from __future__ import annotations

import re
from pathlib import Path

import imagehash
import numpy as np
import pytest
import scipy.fftpack
from PIL import Image, ImageDraw

from worker.images.phash import dct_matrix, lanczos_matrix, phash

SAMPLES = Path(__file__).resolve().parents[2] / "crawlctl" / "samples"
PHOTOS = sorted(p for p in SAMPLES.iterdir() if p.suffix in (".jpg", ".png") and p.stem != "broken")
# Measured on these photographs at their own size, a half and a third: at most 4 bits off
# imagehash's hash of the same image (rocket.jpg at half size), mean 0.24; 54 of 66 equal.
SAME_IMAGE_BITS = 4


def _photo(path: Path) -> Image.Image:
    with Image.open(path) as im:
        im.load()
        return im


def _hamming(first: str, second: str) -> int:
    return (int(first, 16) ^ int(second, 16)).bit_count()


def _imagehash(im: Image.Image) -> str:
    return str(imagehash.phash(im))


def test_the_samples_are_photographs() -> None:
    assert len(PHOTOS) >= 20
    assert {_photo(path).mode for path in PHOTOS} == {"RGB", "L"}


def test_the_dct_matrix_is_scipys_dct() -> None:
    pixels = np.random.default_rng(7).integers(0, 256, (32, 32)).astype(np.float64)
    d = dct_matrix(32)
    expected = scipy.fftpack.dct(scipy.fftpack.dct(pixels, axis=0), axis=1)
    np.testing.assert_allclose(d @ pixels @ d.T, expected, rtol=1e-9, atol=1e-6)


@pytest.mark.parametrize("size_in", [1, 5, 31, 32, 33, 96, 191, 427, 640])
@pytest.mark.parametrize("short", [None, 0.5])  # all of the side, or half a pixel less
def test_the_lanczos_matrix_is_pillows_resize(size_in: int, short: float | None) -> None:
    row = np.random.default_rng(size_in).integers(60, 190, (1, size_in)).astype(np.uint8)
    box_end = size_in - (short or 0.0)
    expected = Image.fromarray(row).resize(
        (32, 1), Image.Resampling.LANCZOS, box=(0, 0, box_end, 1)
    )
    weights = lanczos_matrix(size_in, 32, None if short is None else box_end)
    resized = np.round(weights @ row[0].astype(np.float64))
    # Pillow sums in fixed point: one level at most off a rounding of the exact sum.
    assert np.abs(resized - np.asarray(expected)[0]).max() <= 1


@pytest.mark.parametrize("path", PHOTOS, ids=lambda path: path.name)
def test_a_32_pixel_grey_image_hashes_as_imagehash_hashes_it(path: Path) -> None:
    small = _photo(path).convert("L").resize((32, 32), Image.Resampling.LANCZOS)
    assert phash(np.asarray(small)) == _imagehash(small)


@pytest.mark.parametrize("path", PHOTOS, ids=lambda path: path.name)
@pytest.mark.parametrize("divisor", [1, 2, 3])
def test_a_photograph_hashes_close_to_imagehash(path: Path, divisor: int) -> None:
    im = _photo(path)
    if divisor > 1:
        size = (im.width // divisor, im.height // divisor)
        im = im.resize(size, Image.Resampling.LANCZOS)
    assert _hamming(phash(np.asarray(im)), _imagehash(im)) <= SAME_IMAGE_BITS


def _halves(size: tuple[int, int]) -> Image.Image:
    im = Image.new("L", size, 0)
    ImageDraw.Draw(im).rectangle((0, 0, size[0] // 2 - 1, size[1] - 1), fill=255)
    return im


@pytest.mark.parametrize(
    "im",
    [
        Image.new("L", (100, 80), 0),
        Image.new("L", (100, 80), 37),
        Image.new("RGB", (640, 427), (200, 120, 3)),
        Image.new("L", (1, 1), 255),
        _halves((64, 64)),
        _halves((640, 360)),
    ],
    ids=["black", "grey", "orange", "one-pixel", "halves-64", "halves-640"],
)
def test_an_image_without_detail_hashes_as_imagehash_hashes_it(im: Image.Image) -> None:
    # Many coefficients are equal here: rounding noise must not decide their bits.
    assert phash(np.asarray(im)) == _imagehash(im)


def test_grey_is_grey_in_any_shape() -> None:
    grey = np.asarray(_photo(SAMPLES / "camera.jpg"))
    expected = phash(grey)
    assert re.fullmatch("[0-9a-f]{16}", expected)
    assert phash(grey[:, :, None]) == expected
    assert phash(np.repeat(grey[:, :, None], 3, axis=2)) == expected


@pytest.mark.parametrize("shape", [(1, 700), (700, 1), (5, 3), (191, 192), (640, 640)])
def test_any_size_gets_16_hex_digits(shape: tuple[int, int]) -> None:
    pixels = np.random.default_rng(1).integers(0, 256, (*shape, 3), dtype=np.uint8)
    assert re.fullmatch("[0-9a-f]{16}", phash(pixels))


@pytest.mark.parametrize("shape", [(8, 8, 4), (8, 8, 2), (64,)])
def test_other_shapes_are_refused(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="grey or RGB"):
        phash(np.zeros(shape, dtype=np.uint8))
