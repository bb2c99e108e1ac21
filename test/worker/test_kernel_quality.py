"""Thumbnail quality: PSNR of the worker's thumbnails against full-decode Lanczos ones.

The reference is what a careful, slow resizer makes of the same body: a full decode (no
DCT scaling) and one exact Lanczos pass to the thumbnail's own size. The thumbnail is
compared as stored, JPEG and all, since that is what consumers get. The issue's targets,
at least 35.5 dB on average and 30 dB on the worst image, hold on real photographs of the
sizes the kernel's two roads take (bench/README.md gives the figures for the benchmark's
whole corpus).
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator

import pytest
from PIL import Image

from bench.quality import thumbnail_psnr
from test.harness.corpus import skimage_data_dir
from worker.images import kernel
from worker.images.kernel import ProcessedImage, process_image

PSNR_MEAN_MIN = 35.5
PSNR_WORST_MIN = 30.0


def psnr(body: bytes, thumbnail: bytes) -> float:
    """dB over R, G and B of `thumbnail` against a full-decode Lanczos thumbnail of `body`
    (the benchmark's own measure)."""
    return thumbnail_psnr(body, thumbnail)


def _photos() -> list[Image.Image]:
    data = skimage_data_dir()
    if data is None:
        pytest.skip("scikit-image's photographs are not installed (pip install -e '.[test]')")
    names = ("retina.jpg", "hubble_deep_field.jpg", "motorcycle_left.png", "coffee.png")
    names += ("astronaut.png", "chelsea.png", "motorcycle_right.png", "rocket.jpg")
    return [Image.open(data / name).convert("RGB") for name in names]


def _mosaic(photos: list[Image.Image], size: tuple[int, int]) -> Image.Image:
    """Photographs side by side at their own scale, as many as fill `size`: detail that
    no upscaled photograph has."""
    canvas = Image.new("RGB", size)
    x = y = row = 0
    for photo in _cycle(photos):
        if x + photo.width > size[0]:
            x, y, row = 0, y + row, 0
        if y >= size[1]:
            return canvas
        canvas.paste(photo, (x, y))
        x, row = x + photo.width, max(row, photo.height)
    raise AssertionError("unreachable")


def _cycle(photos: list[Image.Image]) -> Iterator[Image.Image]:
    while True:
        yield from photos


def _jpeg(im: Image.Image, quality: int = 90) -> bytes:
    out = io.BytesIO()
    im.save(out, "JPEG", quality=quality)  # 4:2:0, as cameras and most sites write
    return out.getvalue()


def _thumbnail(body: bytes) -> bytes:
    result = process_image(body)
    assert isinstance(result, ProcessedImage), result
    return result.thumbnail


@pytest.fixture(scope="module")
def bodies() -> dict[str, bytes]:
    photos = _photos()
    # Long sides chosen for each n/8 scale and ratio the JPEG road meets: 1000 and 1411 px
    # (the photographs themselves, ratios 1.17 and 1.10), 1600 (4/8, 1.25), 2400 (3/8,
    # 1.41: blurred first), 4000 (2/8, 1.56: blurred first) and a PNG (Pillow's road).
    out = {
        "retina.jpg": _jpeg(photos[0], 94),
        "hubble.jpg": _jpeg(photos[1], 94),
        "mosaic-1600.jpg": _jpeg(_mosaic(photos, (1600, 1100))),
        "mosaic-2400.jpg": _jpeg(_mosaic(photos, (2400, 1500))),
        "mosaic-4000.jpg": _jpeg(_mosaic(photos, (4000, 2600)), 85),
    }
    png = io.BytesIO()
    _mosaic(photos[2:], (1500, 1000)).save(png, "PNG")
    out["mosaic-1500.png"] = png.getvalue()
    return out


def test_thumbnails_are_close_to_full_decode_lanczos(bodies: dict[str, bytes]) -> None:
    figures = {name: psnr(body, _thumbnail(body)) for name, body in bodies.items()}
    shown = ", ".join(f"{name} {db:.2f} dB" for name, db in figures.items())
    assert sum(figures.values()) / len(figures) >= PSNR_MEAN_MIN, shown
    assert min(figures.values()) >= PSNR_WORST_MIN, shown


def test_blurring_first_is_what_keeps_big_images_sharp_without_aliasing(
    bodies: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # 4000 px decodes at 2/8 to 1000 px, 1.56 times the thumbnail: bicubic sampling alone
    # would alias.
    body = bodies["mosaic-4000.jpg"]
    blurred = psnr(body, _thumbnail(body))
    monkeypatch.setattr(kernel, "_PREFILTER_ABOVE", math.inf)
    sampled = psnr(body, _thumbnail(body))
    assert blurred >= sampled + 0.5, (blurred, sampled)
