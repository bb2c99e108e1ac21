"""bench.quality's PSNR on small synthetic JPEGs (the definition in the module's doc)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageFilter

from bench.quality import PSNR_CAP_DB, psnr, reference_thumbnail, summarise, thumbnail_psnr


def _photo_like(size: tuple[int, int] = (1200, 800)) -> Image.Image:
    """Smooth gradients plus fine texture: NEAREST aliases it, Lanczos does not."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    rng = np.random.default_rng(7)
    texture = rng.normal(0, 40, (h, w))
    r = 128 + 90 * np.sin(x / 150) + texture
    g = 128 + 90 * np.cos(y / 110) + texture
    b = 255 * x / w
    rgb = np.clip(np.stack([r, g, b], axis=-1), 0, 255).astype(np.uint8)
    return Image.fromarray(rgb, "RGB")


def _jpeg(im: Image.Image, quality: int = 95, subsampling: int = 2) -> bytes:
    out = io.BytesIO()
    im.save(out, "JPEG", quality=quality, subsampling=subsampling)
    return out.getvalue()


@pytest.fixture(scope="module")
def body() -> bytes:
    return _jpeg(_photo_like())


def test_identical_images_are_capped() -> None:
    im = _photo_like((64, 48))
    assert psnr(im, im.copy()) == PSNR_CAP_DB
    with pytest.raises(ValueError, match="sizes differ"):
        psnr(im, im.resize((32, 24)))


def test_psnr_is_over_r_g_b() -> None:
    a = Image.new("RGB", (10, 10), (100, 100, 100))
    b = Image.new("RGB", (10, 10), (110, 100, 100))  # MSE = 100 / 3
    assert psnr(a, b) == pytest.approx(10 * np.log10(255**2 / (100 / 3)))


def test_the_reference_itself_scores_high_and_nearest_scores_lower(body: bytes) -> None:
    size = (640, 427)
    reference = reference_thumbnail(body, size)
    assert reference.size == size and reference.mode == "RGB"
    # The reference itself, stored near-losslessly (q100, 4:4:4).
    good = thumbnail_psnr(body, _jpeg(reference, 100, subsampling=0))
    with Image.open(io.BytesIO(body)) as im:
        im.draft("RGB", size)
        nearest = im.resize(size, Image.Resampling.NEAREST)
    bad = thumbnail_psnr(body, _jpeg(nearest, 95))
    assert good > 45
    assert bad < 25


def test_the_kernels_thumbnail_is_measured_by_default(body: bytes) -> None:
    # process_image's own thumbnail of a smooth image: whatever the kernel, well above 25.
    smooth = _jpeg(_photo_like((1200, 800)).filter(ImageFilter.GaussianBlur(3)))
    assert 25 < thumbnail_psnr(smooth) <= PSNR_CAP_DB


def test_summary_names_the_worst() -> None:
    got = summarise([("a.jpg", 36.0), ("b.jpg", 29.5), ("c.jpg", 40.0)])
    assert got["count"] == 3
    assert got["mean_db"] == pytest.approx(35.1666, abs=1e-3)
    assert (got["worst_db"], got["worst_file"], got["under_30_db"]) == (29.5, "b.jpg", 1)
    assert summarise([]) == {"count": 0}
