import hashlib
import io
import itertools
import json
import mmap
import os
import pickle
import re
import warnings
from pathlib import Path
from typing import Any

import imagehash
import pytest
from PIL import IcoImagePlugin, Image, ImageChops, ImageStat, JpegImagePlugin

from test.harness.corpus import CorpusImage, broken_images, build, good_images, skimage_data_dir
from worker.images import kernel
from worker.images.exif import ExifLimits
from worker.images.kernel import (
    DEFAULT_LIMITS,
    ImageFailure,
    ImageLimits,
    ProcessedImage,
    process_image,
    thumbnail_size,
)
from worker.images.quality import estimate_jpeg_quality

_GOOD = good_images()
_BROKEN = broken_images()


def _encode(im: Image.Image, fmt: str, **params: Any) -> bytes:
    out = io.BytesIO()
    im.save(out, fmt, **params)
    return out.getvalue()


def _processed(body: bytes, limits: ImageLimits = DEFAULT_LIMITS) -> ProcessedImage:
    result = process_image(body, limits)
    assert isinstance(result, ProcessedImage), result
    return result


def _thumbnail(result: ProcessedImage) -> Image.Image:
    im = Image.open(io.BytesIO(result.thumbnail))
    im.load()
    return im


def _assert_subset(actual: Any, expected: Any, path: str = "exif") -> None:
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path} is {actual!r}"
        for key, value in expected.items():
            assert key in actual, f"{path}[{key}] missing from {sorted(actual)}"
            _assert_subset(actual[key], value, f"{path}[{key}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


# --- geometry ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "max_px", "expected"),
    [
        ((4000, 3000), 640, (640, 480)),
        ((3000, 4000), 640, (480, 640)),
        ((100, 50), 640, (100, 50)),
        ((640, 640), 640, (640, 640)),
        ((641, 479), 640, (640, 478)),
        ((5000, 1), 640, (640, 1)),
        ((1, 5000), 640, (1, 640)),
        ((1281, 961), 640, (640, 480)),
        ((1, 1), 640, (1, 1)),
        ((1000, 999), 1, (1, 1)),
        ((300, 200), 100, (100, 67)),
    ],
)
def test_thumbnail_size(size: tuple[int, int], max_px: int, expected: tuple[int, int]) -> None:
    assert thumbnail_size(*size, max_px) == expected


@pytest.mark.parametrize(("width", "height", "max_px"), [(0, 10, 640), (10, -1, 640), (5, 5, 0)])
def test_thumbnail_size_rejects_empty_sizes(width: int, height: int, max_px: int) -> None:
    with pytest.raises(ValueError, match="sizes"):
        thumbnail_size(width, height, max_px)


# --- the corpus ----------------------------------------------------------------------


def test_corpus_is_big_enough() -> None:
    assert len(_GOOD) >= 40
    assert {"UnidentifiedImageError", "ImageDecodeError", "DecompressionBombError"} == {
        image.expected_status for image in _BROKEN
    }
    assert sum(len(image.body) for image in _GOOD + _BROKEN) < 40_000_000


@pytest.mark.parametrize("image", _GOOD, ids=lambda image: image.name)
def test_good_image(image: CorpusImage) -> None:
    result = _processed(image.body)

    assert (result.width, result.height) == (image.width, image.height)
    assert result.format == image.format
    assert result.compression_quality == image.quality
    if image.exif is None:
        assert result.exif is None
    else:
        assert result.exif is not None
        _assert_subset(result.exif, image.exif)
        encoded = json.dumps(result.exif, allow_nan=False, separators=(",", ":"))
        assert len(encoded) <= ExifLimits().max_total_bytes
        assert "0x927c" not in result.exif  # the MakerNotes here are all over the cap

    thumbnail = _thumbnail(result)
    assert thumbnail.format == "JPEG"
    assert thumbnail.mode in ("RGB", "L")
    assert thumbnail.size == thumbnail_size(result.width, result.height, 640)
    assert max(thumbnail.size) <= 640
    assert thumbnail.width <= result.width and thumbnail.height <= result.height
    aspect = result.width / result.height
    assert abs(thumbnail.width / thumbnail.height - aspect) <= 0.01 * aspect
    assert "exif" not in thumbnail.info and "icc_profile" not in thumbnail.info
    assert result.sha256 == hashlib.sha256(image.body).hexdigest()
    assert re.fullmatch("[0-9a-f]{16}", result.phash)


def test_corpus_without_skimage() -> None:
    synthetic = build(None)
    originals = {image.name for image in _GOOD if image.name.startswith("original-")}
    assert {image.name for image in synthetic} == {image.name for image in _GOOD + _BROKEN} - (
        originals
    )
    for image in synthetic:
        result = process_image(image.body)
        if image.expected_status is None:
            assert isinstance(result, ProcessedImage), image.name
            assert (result.width, result.height, result.compression_quality) == (
                image.width,
                image.height,
                image.quality,
            ), image.name
        else:
            assert isinstance(result, ImageFailure), image.name
            assert result.status == image.expected_status, image.name


@pytest.mark.parametrize("image", _BROKEN, ids=lambda image: image.name)
def test_broken_image(image: CorpusImage) -> None:
    result = process_image(image.body)
    assert isinstance(result, ImageFailure)
    assert result.status == image.expected_status
    assert 0 < len(result.detail) <= 200


def test_pillow_global_state_untouched() -> None:
    max_pixels, filters = Image.MAX_IMAGE_PIXELS, list(warnings.filters)
    for image in _GOOD[:5] + _BROKEN:
        process_image(image.body)
    assert max_pixels == Image.MAX_IMAGE_PIXELS
    assert list(warnings.filters) == filters


# --- limits --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "max_pixels", "status"),
    [
        ((150, 100), 10_000, "DecompressionBombError"),  # 1.5x over
        ((101, 100), 10_000, "DecompressionBombError"),
        ((100, 100), 10_000, None),  # exactly at the limit
        ((40, 30), 10_000, None),
    ],
)
@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF", "AVIF"])
def test_max_pixels(size: tuple[int, int], max_pixels: int, status: str | None, fmt: str) -> None:
    body = _encode(Image.new("RGB", size, (10, 20, 30)), fmt)
    result = process_image(body, ImageLimits(max_pixels=max_pixels))
    if status is None:
        assert isinstance(result, ProcessedImage)
    else:
        assert isinstance(result, ImageFailure)
        assert result.status == status
        assert str(max_pixels) in result.detail


def test_an_icos_pixel_limit_applies_before_pillow_decodes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Pillow decodes an ICO's largest entry inside Image.open: the limit must come first.
    body = _encode(Image.new("RGBA", (48, 48), (10, 20, 30, 255)), "ICO")  # 16 to 48 px
    decoded: list[int] = []
    frame = IcoImagePlugin.IcoFile.frame

    def spy(self: IcoImagePlugin.IcoFile, idx: int) -> Image.Image:
        decoded.append(idx)
        return frame(self, idx)

    monkeypatch.setattr(IcoImagePlugin.IcoFile, "frame", spy)
    refused = process_image(body, ImageLimits(max_pixels=48 * 48 - 1))
    assert isinstance(refused, ImageFailure)
    assert refused.status == "DecompressionBombError"
    assert "48x48" in refused.detail
    assert decoded == []
    result = _processed(body, ImageLimits(max_pixels=48 * 48))
    assert (result.width, result.height) == (48, 48)
    assert decoded == [0]  # the spy sees a decode when there is one


def test_formats_are_restricted() -> None:
    body = _encode(Image.new("RGB", (10, 10)), "JPEG")
    result = process_image(body, ImageLimits(formats=("PNG",)))
    assert isinstance(result, ImageFailure)
    assert result.status == "UnidentifiedImageError"


@pytest.mark.parametrize(
    ("thumbnail_px", "expected"), [(100, (100, 75)), (1, (1, 1)), (2000, (800, 600))]
)
def test_thumbnail_px(thumbnail_px: int, expected: tuple[int, int]) -> None:
    body = _encode(Image.new("RGB", (800, 600), (200, 100, 50)), "JPEG")
    thumbnail = _thumbnail(_processed(body, ImageLimits(thumbnail_px=thumbnail_px)))
    assert thumbnail.size == expected


@pytest.mark.parametrize("quality", [30, 85, 95])
def test_thumbnail_quality(quality: int) -> None:
    body = _encode(Image.new("RGB", (800, 600), (200, 100, 50)), "PNG")
    thumbnail = _thumbnail(_processed(body, ImageLimits(thumbnail_quality=quality)))
    assert isinstance(thumbnail, JpegImagePlugin.JpegImageFile)
    assert estimate_jpeg_quality(thumbnail.quantization) == quality


def test_exif_limits_are_passed_through() -> None:
    exif = Image.Exif()
    exif[0x013B] = "Alden Page"
    exif[0x010E] = "d" * 500
    body = _encode(Image.new("RGB", (8, 8)), "JPEG", exif=exif)
    result = _processed(body, ImageLimits(exif=ExifLimits(max_value_bytes=100)))
    assert result.exif == {"0x13b": "Alden Page"}


@pytest.mark.parametrize(
    "kwargs",
    [{"thumbnail_px": 0}, {"max_pixels": 0}, {"formats": ()}, {"thumbnail_quality": 0}],
)
def test_limits_validate(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must"):
        ImageLimits(**kwargs)


# --- modes ---------------------------------------------------------------------------


def _flat(mode: str, value: Any, size: tuple[int, int] = (64, 48)) -> Image.Image:
    return Image.new(mode, size, value)


def _palette_with_transparency() -> Image.Image:
    im = Image.new("P", (64, 48), 1)
    im.putpalette([255, 0, 0, 0, 0, 0] + [0] * (254 * 3))
    im.info["transparency"] = 1
    return im


def _sixteen_bit(value: int) -> Image.Image:
    return Image.new("I", (64, 48), value).convert("I;16")


@pytest.mark.parametrize(
    ("name", "body", "mode", "expected"),
    [
        (
            "RGB JPEG",
            _encode(_flat("RGB", (200, 100, 50)), "JPEG", quality=95),
            "RGB",
            (200, 100, 50),
        ),
        ("L JPEG", _encode(_flat("L", 77), "JPEG", quality=95), "L", 77),
        (
            "CMYK JPEG",
            _encode(_flat("RGB", (200, 100, 50)).convert("CMYK"), "JPEG", quality=95),
            "RGB",
            (200, 100, 50),
        ),
        ("RGBA transparent", _encode(_flat("RGBA", (0, 0, 0, 0)), "PNG"), "RGB", (255, 255, 255)),
        ("RGBA half", _encode(_flat("RGBA", (0, 0, 255, 128)), "PNG"), "RGB", (127, 127, 255)),
        ("RGBA opaque", _encode(_flat("RGBA", (10, 20, 30, 255)), "PNG"), "RGB", (10, 20, 30)),
        ("LA transparent", _encode(_flat("LA", (0, 0)), "PNG"), "L", 255),
        ("L tRNS", _encode(_flat("L", 9), "PNG", transparency=9), "L", 255),
        (
            "RGB tRNS",
            _encode(_flat("RGB", (1, 2, 3)), "PNG", transparency=(1, 2, 3)),
            "RGB",
            (255, 255, 255),
        ),
        ("P tRNS", _encode(_palette_with_transparency(), "PNG"), "RGB", (255, 255, 255)),
        ("P GIF tRNS", _encode(_palette_with_transparency(), "GIF"), "RGB", (255, 255, 255)),
        ("P opaque", _encode(_flat("RGB", (0, 128, 255)).quantize(4), "PNG"), "RGB", (0, 128, 255)),
        ("1 bit", _encode(_flat("1", 1), "PNG"), "L", 255),
        ("I;16 PNG", _encode(_sixteen_bit(32896), "PNG"), "L", 128),
        ("I;16 TIFF", _encode(_sixteen_bit(65535), "TIFF"), "L", 255),
        ("I TIFF in 0..255", _encode(_flat("I", 90), "TIFF"), "L", 90),
        ("F TIFF in 0..255", _encode(_flat("F", 90.0), "TIFF"), "L", 90),
        (
            "CMYK TIFF",
            _encode(_flat("RGB", (200, 100, 50)).convert("CMYK"), "TIFF"),
            "RGB",
            (200, 100, 50),
        ),
        (
            "YCbCr TIFF",
            _encode(_flat("RGB", (200, 100, 50)).convert("YCbCr"), "TIFF"),
            "RGB",
            (200, 100, 50),
        ),
        (
            "LAB TIFF",
            _encode(_flat("RGB", (200, 100, 50)).convert("LAB"), "TIFF"),
            "RGB",
            (200, 100, 50),
        ),
        (
            "RGBA WebP",
            _encode(_flat("RGBA", (0, 0, 0, 0)), "WEBP", lossless=True),
            "RGB",
            (255, 255, 255),
        ),
        ("RGBA TIFF", _encode(_flat("RGBA", (0, 0, 0, 0)), "TIFF"), "RGB", (255, 255, 255)),
        ("RGBA AVIF", _encode(_flat("RGBA", (0, 0, 0, 0)), "AVIF"), "RGB", (255, 255, 255)),
        ("RGBA ICO", _encode(_flat("RGBA", (0, 0, 255, 128)), "ICO"), "RGB", (127, 127, 255)),
        ("P BMP", _encode(_flat("RGB", (0, 128, 255)).quantize(4), "BMP"), "RGB", (0, 128, 255)),
    ],
)
def test_modes(name: str, body: bytes, mode: str, expected: Any) -> None:
    thumbnail = _thumbnail(_processed(body))
    assert thumbnail.mode == mode, name
    mean = ImageStat.Stat(thumbnail).mean
    wanted = expected if isinstance(expected, tuple) else (expected,)
    assert all(abs(got - want) <= 4 for got, want in zip(mean, wanted, strict=True)), (name, mean)


@pytest.mark.parametrize("mode", ["I", "F"])
def test_wide_range_images_are_stretched(mode: str) -> None:
    im = Image.linear_gradient("L").convert(mode).point(lambda value: value * 1000 - 5000)
    thumbnail = _thumbnail(_processed(_encode(im, "TIFF")))
    assert thumbnail.mode == "L"
    assert thumbnail.getextrema()[0] <= 2  # type: ignore[operator]
    assert thumbnail.getextrema()[1] >= 253  # type: ignore[operator]


def test_animation_gives_first_frame() -> None:
    first = Image.linear_gradient("L").resize((120, 80)).convert("RGB")
    second = first.rotate(180)
    for fmt in ("GIF", "WEBP", "AVIF"):
        body = _encode(first, fmt, save_all=True, append_images=[second], duration=100)
        thumbnail = _thumbnail(_processed(body)).convert("RGB")
        to_first = ImageStat.Stat(ImageChops.difference(thumbnail, first)).mean[0]
        to_second = ImageStat.Stat(ImageChops.difference(thumbnail, second)).mean[0]
        assert to_first < 10 < to_second, fmt


# --- JPEG decoding at a reduced scale -------------------------------------------------


@pytest.mark.parametrize(
    ("size", "decoded"),
    [
        ((2048, 1536), (768, 576)),  # 3/8 is the smallest scale that covers 640x480
        ((1281, 961), (641, 481)),  # 4/8
        ((1024, 768), (640, 480)),  # 5/8: nothing left for the resize
        ((640, 480), (640, 480)),
        ((50, 40), (50, 40)),
    ],
)
def test_ycbcr_and_grey_jpegs_decode_at_the_smallest_covering_scale(
    monkeypatch: pytest.MonkeyPatch, size: tuple[int, int], decoded: tuple[int, int]
) -> None:
    shapes: list[tuple[int, int]] = []
    decode = kernel.simplejpeg.decode_jpeg

    def spy(*args: Any, **kwargs: Any) -> Any:
        pixels = decode(*args, **kwargs)
        shapes.append((pixels.shape[1], pixels.shape[0]))
        return pixels

    monkeypatch.setattr(kernel.simplejpeg, "decode_jpeg", spy)
    for mode in ("RGB", "L"):
        shapes.clear()
        body = _encode(Image.new(mode, size, 90), "JPEG")
        thumbnail = _thumbnail(_processed(body))
        assert shapes == [decoded], mode
        assert thumbnail.size == thumbnail_size(*size, 640)
        assert thumbnail.mode == mode


@pytest.mark.parametrize(
    ("size", "drafted"),
    [((2048, 1536), (640, 480)), ((1281, 961), (640, 480)), ((640, 480), None), ((50, 40), None)],
)
def test_cmyk_jpegs_are_drafted_by_pillow(
    monkeypatch: pytest.MonkeyPatch, size: tuple[int, int], drafted: tuple[int, int] | None
) -> None:
    calls: list[tuple[str | None, tuple[int, int] | None]] = []
    draft = JpegImagePlugin.JpegImageFile.draft

    def spy(
        self: JpegImagePlugin.JpegImageFile, mode: str | None, size: tuple[int, int] | None
    ) -> Any:
        calls.append((mode, size))
        return draft(self, mode, size)

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", spy)
    body = _encode(Image.new("CMYK", size, (10, 20, 30, 40)), "JPEG")
    result = _processed(body)
    assert calls == ([] if drafted is None else [("RGB", drafted)])
    thumbnail = _thumbnail(result)
    assert thumbnail.size == thumbnail_size(*size, 640)
    assert thumbnail.mode == "RGB"


def test_a_jpeg_libjpeg_turbo_refuses_gets_pillows_verdict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("Corrupt JPEG data: 3 extraneous bytes before marker 0xd9")

    monkeypatch.setattr(kernel.simplejpeg, "decode_jpeg", refuse)
    body = _encode(Image.new("RGB", (1600, 1200), (200, 30, 60)), "JPEG")
    thumbnail = _thumbnail(_processed(body))
    assert thumbnail.size == (640, 480)
    assert thumbnail.getpixel((320, 240)) == pytest.approx((200, 30, 60), abs=3)


# --- hashes --------------------------------------------------------------------------

_SAMPLES = Path(__file__).resolve().parents[2] / "crawlctl" / "samples"
_SKIMAGE = skimage_data_dir()
# Three of scikit-image's photographs bigger than a thumbnail (the demo's hubble.jpg and
# retina.jpg are cut down from the first two), and all the demo's.
_BIG = [
    _SKIMAGE / name
    for name in ("hubble_deep_field.jpg", "retina.jpg", "motorcycle_left.png")
    if _SKIMAGE is not None
]
_PHOTOS = [
    *sorted(p for p in _SAMPLES.iterdir() if p.suffix in (".jpg", ".png") and p.stem != "broken"),
    *_BIG,
]
# Different photographs; the other samples are crops or re-encodings of these.
_DISTINCT = [
    _SAMPLES / f"{name}.jpg"
    for name in (
        *("astronaut", "brick", "camera", "chelsea", "coffee"),
        *("grass", "gravel", "hubble", "retina", "rocket"),
    )
]
# Measured: the kernel's hash of each of _PHOTOS is at most 2 bits off imagehash's of the
# full-size original (21 of 25 equal); re-encoded at quality 40 a photograph's hash moves
# by at most 2 bits (retina.jpg), and at half size by 4 (rocket.jpg); the 45 pairs of
# different photographs are 20 to 38 bits apart (mean 31.5).
_ORIGINAL_BITS = 4
_SAME_PHOTO_BITS = 8
_OTHER_PHOTO_BITS = 16


def _hamming(first: str, second: str) -> int:
    return (int(first, 16) ^ int(second, 16)).bit_count()


def _photo(path: Path) -> Image.Image:
    with Image.open(path) as im:
        im.load()
        return im


@pytest.mark.parametrize("name", ["coffee.jpg", "camera.jpg", "hubble-galaxies.png"])
def test_the_sha256_is_the_bodys_whether_bytes_or_mapped(name: str) -> None:
    body = (_SAMPLES / name).read_bytes()
    digest = hashlib.sha256(body).hexdigest()
    assert _processed(body).sha256 == digest
    fd = os.memfd_create("test-body")  # as the pool maps a body: read-only, exactly its size
    try:
        os.pwrite(fd, body, 0)
        with mmap.mmap(fd, len(body), access=mmap.ACCESS_READ) as view:
            assert _processed(view).sha256 == digest  # type: ignore[arg-type]
    finally:
        os.close(fd)


@pytest.mark.parametrize("path", _PHOTOS, ids=lambda path: path.name)
def test_a_photographs_phash_is_imagehashs_of_the_original(path: Path) -> None:
    result = _processed(path.read_bytes())
    assert _hamming(result.phash, str(imagehash.phash(_photo(path)))) <= _ORIGINAL_BITS


@pytest.mark.parametrize("path", _DISTINCT + _BIG, ids=lambda path: path.name)
def test_a_photograph_recompressed_or_halved_keeps_its_phash(path: Path) -> None:
    original = _processed(path.read_bytes()).phash
    im = _photo(path).convert("RGB")
    recompressed = _processed(_encode(im, "JPEG", quality=40)).phash
    half = im.resize((im.width // 2, im.height // 2), Image.Resampling.LANCZOS)
    halved = _processed(_encode(half, "JPEG", quality=85)).phash
    assert _hamming(recompressed, original) <= _SAME_PHOTO_BITS
    assert _hamming(halved, original) <= _SAME_PHOTO_BITS


def test_different_photographs_are_far_apart() -> None:
    hashes = {path.name: _processed(path.read_bytes()).phash for path in _DISTINCT}
    for (first, a), (second, b) in itertools.combinations(hashes.items(), 2):
        assert _hamming(a, b) >= _OTHER_PHOTO_BITS, (first, second)


def _semi_transparent(im: Image.Image) -> Image.Image:
    # Opacity 200 of 255 everywhere: flattened onto white, each pixel is an affine
    # function of the photograph's, which moves no bit of its hash.
    rgba = im.convert("RGBA")
    rgba.putalpha(200)
    return rgba


def _animated(im: Image.Image) -> bytes:
    second = im.rotate(180)
    return _encode(im, "GIF", save_all=True, append_images=[second], duration=100)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(lambda im: _encode(_semi_transparent(im), "PNG"), id="png-with-alpha"),
        pytest.param(lambda im: _encode(im.convert("L"), "JPEG", quality=90), id="grey-jpeg"),
        pytest.param(lambda im: _encode(im.convert("CMYK"), "JPEG", quality=90), id="cmyk-jpeg"),
        pytest.param(_animated, id="animated-gif"),
        pytest.param(lambda im: _encode(im, "WEBP", quality=80), id="webp"),
    ],
)
def test_a_photograph_in_another_format_or_mode_keeps_its_phash(body: Any) -> None:
    path = _SAMPLES / "coffee.jpg"
    original = _processed(path.read_bytes()).phash
    result = _processed(body(_photo(path)))
    assert re.fullmatch("[0-9a-f]{16}", result.phash)
    assert _hamming(result.phash, original) <= _SAME_PHOTO_BITS


# --- values --------------------------------------------------------------------------


def test_results_pickle() -> None:
    image = next(image for image in _GOOD if image.name == "exif-full-q90.jpg")
    for value in (process_image(image.body), process_image(b"nope"), ImageLimits()):
        assert pickle.loads(pickle.dumps(value)) == value


def test_bugs_still_raise() -> None:
    with pytest.raises(TypeError):
        process_image("not bytes")  # type: ignore[arg-type]
