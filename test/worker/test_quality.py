import io
import timeit

import pytest
from PIL import Image, JpegImagePlugin

from worker.images.quality import estimate_jpeg_quality, scaled_table

_SAMPLE = Image.radial_gradient("L").resize((32, 32))
_SAMPLE_RGB = Image.merge("RGB", (_SAMPLE, _SAMPLE.rotate(90), _SAMPLE.rotate(180)))


def _tables(mode: str, **save_params: object) -> dict[int, list[int]]:
    out = io.BytesIO()
    (_SAMPLE_RGB if mode == "RGB" else _SAMPLE_RGB.convert(mode)).save(out, "JPEG", **save_params)
    with Image.open(out) as im:
        assert isinstance(im, JpegImagePlugin.JpegImageFile)
        return im.quantization


@pytest.mark.parametrize("mode", ["RGB", "L", "CMYK"])
@pytest.mark.parametrize("quality", range(1, 101))
def test_exact_for_pillow_written_jpegs(mode: str, quality: int) -> None:
    assert estimate_jpeg_quality(_tables(mode, quality=quality)) == quality


@pytest.mark.parametrize(
    ("quantization", "expected"),
    [
        ({}, None),
        ({0: [1] * 63}, None),  # not an 8x8 table
        ({0: [16] * 64, 1: [1] * 10}, None),
    ],
)
def test_none_without_usable_tables(quantization: dict[int, list[int]], expected: None) -> None:
    assert estimate_jpeg_quality(quantization) is expected


@pytest.mark.parametrize("quality", [20, 50, 75, 90])
def test_nearest_quality_for_slightly_different_tables(quality: int) -> None:
    # Another encoder rounding a few entries differently still lands on the same quality.
    luminance = list(scaled_table(_luminance_base(), quality))
    for index in (5, 17, 40):
        luminance[index] += 1
    tables = _tables("RGB", quality=quality)
    assert estimate_jpeg_quality({0: luminance, 1: tables[1]}) == quality


def test_table_ids_need_not_start_at_zero() -> None:
    tables = _tables("RGB", quality=65)
    assert estimate_jpeg_quality({2: tables[0], 3: tables[1]}) == 65


@pytest.mark.parametrize(
    ("qtables", "low", "high"),
    [
        ([[1] * 64], 100, 100),
        ([[255] * 64], 1, 3),
        ([[2] * 64, [3] * 64], 90, 99),  # flat fine tables: a high quality
        ([[40] * 64, [60] * 64], 60, 75),  # about 0.65x the standard tables
        ([[120] * 64, [200] * 64], 15, 30),
    ],
)
def test_sensible_for_custom_tables(qtables: list[list[int]], low: int, high: int) -> None:
    tables = _tables("RGB", qtables=qtables)
    estimate = estimate_jpeg_quality(tables)
    assert estimate is not None
    assert low <= estimate <= high


def test_scaled_table_matches_libjpeg_at_50() -> None:
    assert scaled_table(_luminance_base(), 50) == tuple(_tables("L", quality=50)[0])


@pytest.mark.timing("asserts seconds per estimate_jpeg_quality call under 100 µs (timeit)")
@pytest.mark.parametrize("quality", [75, None])
def test_cheap(quality: int | None) -> None:
    if quality is None:  # the slower path: tables that no quality reproduces
        tables = _tables("RGB", qtables=[[3 + i % 7 for i in range(64)], [9] * 64])
    else:
        tables = _tables("RGB", quality=quality)
    per_call = min(timeit.repeat(lambda: estimate_jpeg_quality(tables), number=500, repeat=3))
    assert per_call / 500 < 100e-6


def _luminance_base() -> tuple[int, ...]:
    return tuple(_tables("L", quality=50)[0])
