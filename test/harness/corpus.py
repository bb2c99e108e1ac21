"""Test images with known truth, for unit tests and for the integration tests.

The photographs come from scikit-image's data folder, read as files (skimage itself is
never imported). Without scikit-image, synthetic gradients and noise of the same sizes
and modes stand in for them and the three original JPEGs (`original-*`) are left out;
every other name is the same either way.

What each entry promises (see `CorpusImage`):

- good JPEGs carry the quality they were saved at with Pillow (exact for the estimator);
  `original-retina.jpg` is libjpeg quality 94, while `original-rocket.jpg` and
  `original-hubble.jpg` come from unknown encoders and carry the estimator's answer;
- `exif` lists the tags written into the file as `exif_to_json` renders them; a nested
  IFD ("0x8825" GPS, "0xa005" Interop) is listed whole, so that
  `result.items() >= image.exif.items()` holds. The entries named `exif-*` and
  `original-hubble.jpg` have EXIF, except `exif-corrupt.jpg`, whose EXIF block cannot
  be parsed (exif None, the image itself is fine); all others have none.
  `exif-full-q90.jpg`, `exif-makernote.png` and `exif-makernote.webp` also hold a binary
  MakerNote (0x927c) of 60 KB, 100 KB and 100 KB that the size caps must drop, so it
  is not in `exif`;
- broken entries have width, height, quality, exif and format None and an
  `expected_status`; the two `bomb-*` PNGs are valid images that are too big for the
  default `ImageLimits.max_pixels` ("DecompressionBombError").
"""

from __future__ import annotations

import functools
import importlib.util
import io
import random
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw
from PIL.TiffImagePlugin import IFDRational


@dataclass(frozen=True)
class CorpusImage:
    """One test body and what processing it must give.

    `width`/`height` are the stored pixel size, `quality` the expected
    `compression_quality`, `exif` the subset of `exif_to_json` output that must be
    present (None: the result must be None), `expected_status` None for good images or
    the `ImageFailure.status`, `format` Pillow's format name (None for broken files).
    """

    name: str
    body: bytes
    content_type: str
    width: int | None
    height: int | None
    quality: int | None
    exif: dict[str, Any] | None
    expected_status: str | None
    format: str | None = None


_CONTENT_TYPES = {
    "jpg": "image/jpeg",
    "png": "image/png",
    "gif": "image/gif",
    "webp": "image/webp",
    "tiff": "image/tiff",
    "tif": "image/tiff",
    "bmp": "image/bmp",
    "avif": "image/avif",
    "ico": "image/vnd.microsoft.icon",
    "ppm": "image/x-portable-pixmap",
    "svg": "image/svg+xml",
    "html": "text/html; charset=utf-8",
    "bin": "application/octet-stream",
}

# Source name -> (skimage file, size and mode of its synthetic stand-in).
_SOURCES = {
    "astronaut": ("astronaut.png", (512, 512), "RGB"),
    "chelsea": ("chelsea.png", (451, 300), "RGB"),
    "coffee": ("coffee.png", (600, 400), "RGB"),
    "motorcycle": ("motorcycle_left.png", (741, 500), "RGB"),
    "camera": ("camera.png", (512, 512), "L"),
    "brick": ("brick.png", (512, 512), "L"),
    "horse": ("horse.png", (400, 328), "RGBA"),
    "logo": ("logo.png", (500, 500), "RGBA"),
}
_ORIGINALS = (
    # name, file, size, quality (see the module docstring), EXIF subset
    ("original-rocket.jpg", "rocket.jpg", (640, 427), 96, None),
    ("original-retina.jpg", "retina.jpg", (1411, 1411), 94, None),
    (
        "original-hubble.jpg",
        "hubble_deep_field.jpg",
        (1000, 872),
        94,
        {
            "0x131": "Adobe Photoshop CS5 Macintosh",
            "0x132": "2012-09-17T15:53:45-04:00",
            "0x11a": 300.0,
            "0x9000": "0220",
        },
    ),
)

_ARTIST = "Alden Page"


def skimage_data_dir() -> Path | None:
    """scikit-image's data folder, found without importing skimage; None if absent."""
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "data"
    return path if path.is_dir() else None


@functools.cache
def _cached() -> tuple[CorpusImage, ...]:
    return tuple(build(skimage_data_dir()))


def build_corpus() -> list[CorpusImage]:
    """All entries, good then broken; built once per process (about 1 s)."""
    return list(_cached())


def good_images() -> list[CorpusImage]:
    """Entries that must give a ProcessedImage."""
    return [image for image in _cached() if image.expected_status is None]


def broken_images() -> list[CorpusImage]:
    """Entries that must give an ImageFailure with `expected_status`."""
    return [image for image in _cached() if image.expected_status is not None]


def build(data_dir: Path | None) -> list[CorpusImage]:
    """Build the corpus from `data_dir` (scikit-image's data) or synthetic sources."""
    sources = {name: _load_source(data_dir, name) for name in _SOURCES}
    images = _good(sources)
    if data_dir is not None:
        images += _originals(data_dir)
    images += _broken(sources)
    names = [image.name for image in images]
    assert len(names) == len(set(names)), "corpus names must be unique"
    return images


# --- sources -------------------------------------------------------------------------


def _load_source(data_dir: Path | None, name: str) -> Image.Image:
    filename, size, mode = _SOURCES[name]
    path = data_dir / filename if data_dir is not None else None
    if path is not None and path.is_file():
        with Image.open(path) as im:
            return im.convert(mode)
    return _synthetic(name, size, mode)


def _synthetic(name: str, size: tuple[int, int], mode: str) -> Image.Image:
    rng = random.Random(name)
    width, height = size
    noise = Image.frombytes("L", size, rng.randbytes(width * height))
    horizontal = Image.linear_gradient("L").rotate(90).resize(size)
    radial = Image.radial_gradient("L").resize(size)
    gray = Image.blend(Image.blend(horizontal, radial, 0.5), noise, 0.2)
    if mode == "L":
        return gray
    rgb = Image.merge("RGB", (horizontal, radial, Image.blend(gray, noise, 0.5)))
    if mode == "RGB":
        return rgb
    alpha = Image.new("L", size, 0)
    ImageDraw.Draw(alpha).ellipse((width // 8, height // 8, width * 7 // 8, height * 7 // 8), 255)
    rgb.putalpha(alpha)
    return rgb


# --- encoding helpers ----------------------------------------------------------------


def _encode(im: Image.Image, fmt: str, **params: Any) -> bytes:
    out = io.BytesIO()
    im.save(out, fmt, **params)
    return out.getvalue()


def _entry(
    name: str,
    body: bytes,
    size: tuple[int, int],
    fmt: str,
    *,
    quality: int | None = None,
    exif: dict[str, Any] | None = None,
) -> CorpusImage:
    return CorpusImage(
        name=name,
        body=body,
        content_type=_content_type(name),
        width=size[0],
        height=size[1],
        quality=quality,
        exif=exif,
        expected_status=None,
        format=fmt,
    )


def _content_type(name: str) -> str:
    return _CONTENT_TYPES[name.rsplit(".", 1)[-1]]


def _jpeg(name: str, im: Image.Image, quality: int, **params: Any) -> CorpusImage:
    body = _encode(im, "JPEG", quality=quality, **params)
    return _entry(name, body, im.size, "JPEG", quality=quality)


def _resized(im: Image.Image, size: tuple[int, int]) -> Image.Image:
    return im.resize(size, Image.Resampling.BICUBIC)


# --- good images ---------------------------------------------------------------------


def _good(src: dict[str, Image.Image]) -> list[CorpusImage]:
    astronaut, chelsea, coffee = src["astronaut"], src["chelsea"], src["coffee"]
    motorcycle, camera, brick = src["motorcycle"], src["camera"], src["brick"]
    horse, logo = src["horse"], src["logo"]
    images = [_jpeg(f"astronaut-q{q}.jpg", astronaut, q) for q in (10, 50, 75, 90, 95, 100)]
    images += [
        _jpeg("chelsea-q5.jpg", chelsea, 5),
        _jpeg("chelsea-q30.jpg", chelsea, 30),
        _jpeg("chelsea-444-q90.jpg", chelsea, 90, subsampling=0),
        # Sizes: tiny, exactly-one-pixel, just over the thumbnail, partial DCT blocks
        # when drafted, portrait, square, panorama, tall, and a few megapixels.
        _jpeg("tiny-7x5-q75.jpg", _resized(astronaut, (7, 5)), 75),
        _jpeg("pixel-1x1-q75.jpg", _resized(coffee, (1, 1)), 75),
        _jpeg("odd-641x479-q80.jpg", _resized(motorcycle, (641, 479)), 80),
        _jpeg("odd-1281x961-q80.jpg", _resized(motorcycle, (1281, 961)), 80),
        _jpeg("motorcycle-1600x1200-q85.jpg", _resized(motorcycle, (1600, 1200)), 85),
        _jpeg("motorcycle-portrait-1000x1500-q80.jpg", _portrait(motorcycle, (1000, 1500)), 80),
        _jpeg("astronaut-square-1200-q70.jpg", _resized(astronaut, (1200, 1200)), 70),
        _jpeg("panorama-3000x300-q75.jpg", _resized(coffee, (3000, 300)), 75),
        _jpeg("tall-320x2560-q75.jpg", _resized(chelsea, (320, 2560)), 75),
        _jpeg("coffee-2048x1536-q90.jpg", _resized(coffee, (2048, 1536)), 90),
        _jpeg(
            "progressive-1300x1000-q70.jpg", _resized(astronaut, (1300, 1000)), 70, progressive=True
        ),
        _jpeg("camera-gray-q75.jpg", camera, 75),
        _jpeg("brick-gray-1024-q60.jpg", _resized(brick, (1024, 1024)), 60),
        _jpeg("coffee-cmyk-q90.jpg", coffee.convert("CMYK"), 90),
        _jpeg("coffee-cmyk-1200x800-q90.jpg", _resized(coffee, (1200, 800)).convert("CMYK"), 90),
        _entry(
            "astronaut-mpo-q80.jpg",
            _encode(
                _resized(astronaut, (900, 900)),
                "MPO",
                quality=80,
                save_all=True,
                append_images=[_resized(astronaut, (300, 300))],
            ),
            (900, 900),
            "MPO",
            quality=80,
        ),
    ]
    images += _exif_images(astronaut, coffee, chelsea)
    images += _png_images(astronaut, coffee, camera, chelsea, horse, logo)
    images += _other_formats(astronaut, coffee, camera, chelsea, horse)
    return images


def _portrait(im: Image.Image, size: tuple[int, int]) -> Image.Image:
    width, height = im.size
    crop_width = height * size[0] // size[1]
    left = (width - crop_width) // 2
    return im.crop((left, 0, left + crop_width, height)).resize(size, Image.Resampling.BICUBIC)


def _png_images(
    astronaut: Image.Image,
    coffee: Image.Image,
    camera: Image.Image,
    chelsea: Image.Image,
    horse: Image.Image,
    logo: Image.Image,
) -> list[CorpusImage]:
    def png(name: str, im: Image.Image, **params: Any) -> CorpusImage:
        return _entry(name, _encode(im, "PNG", compress_level=1, **params), im.size, "PNG")

    sixteen_bit = camera.convert("I").point(lambda value: value * 257).convert("I;16")
    return [
        png("astronaut.png", astronaut),
        png("tiny-5x7.png", _resized(astronaut, (5, 7))),
        png("pixel-1x1.png", _resized(chelsea, (1, 1))),
        png("coffee-1500x1000.png", _resized(coffee, (1500, 1000))),
        png("horse-alpha.png", horse),
        png("logo-alpha.png", logo),
        png("camera-gray.png", camera),
        png("camera-la.png", _with_alpha(camera)),
        png("camera-16bit.png", sixteen_bit),
        png("camera-1bit.png", camera.convert("1")),
        png("chelsea-palette.png", chelsea.quantize(64)),
        png("horse-palette-trns.png", horse.quantize(32)),
        png("camera-gray-trns.png", camera, transparency=0),
    ]


def _with_alpha(im: Image.Image) -> Image.Image:
    alpha = Image.linear_gradient("L").resize(im.size)
    out = im.convert("LA") if im.mode == "L" else im.convert("RGBA")
    out.putalpha(alpha)
    return out


def _other_formats(
    astronaut: Image.Image,
    coffee: Image.Image,
    camera: Image.Image,
    chelsea: Image.Image,
    horse: Image.Image,
) -> list[CorpusImage]:
    frames = [_resized(chelsea, (180, 120)), _resized(chelsea, (180, 120)).rotate(180)]
    palette_frames = [frame.quantize(64) for frame in frames]
    return [
        _entry("chelsea.gif", _encode(chelsea.quantize(128), "GIF"), chelsea.size, "GIF"),
        _entry("horse-trns.gif", _encode(horse.quantize(32), "GIF"), horse.size, "GIF"),
        _entry(
            "anim-2frames.gif",
            _encode(
                palette_frames[0],
                "GIF",
                save_all=True,
                append_images=palette_frames[1:],
                duration=200,
                loop=0,
            ),
            (180, 120),
            "GIF",
        ),
        _entry("coffee-lossy.webp", _encode(coffee, "WEBP", quality=80), coffee.size, "WEBP"),
        _entry("horse-lossless.webp", _encode(horse, "WEBP", lossless=True), horse.size, "WEBP"),
        _entry(
            "anim-2frames.webp",
            _encode(frames[0], "WEBP", save_all=True, append_images=frames[1:], duration=200),
            (180, 120),
            "WEBP",
        ),
        _entry(
            "astronaut-lzw.tiff",
            _encode(astronaut, "TIFF", compression="tiff_lzw"),
            astronaut.size,
            "TIFF",
        ),
        _entry(
            "coffee-cmyk.tiff",
            _encode(_resized(coffee, (300, 200)).convert("CMYK"), "TIFF"),
            (300, 200),
            "TIFF",
        ),
        _entry("chelsea.bmp", _encode(chelsea, "BMP"), chelsea.size, "BMP"),
        # AVIF at libaom's fastest speed: the corpus is built again in every test process.
        _entry("coffee.avif", _encode(coffee, "AVIF", quality=70, speed=10), coffee.size, "AVIF"),
        _entry(
            "horse-alpha.avif", _encode(horse, "AVIF", quality=70, speed=10), horse.size, "AVIF"
        ),
        _entry(
            "anim-2frames.avif",
            _encode(
                frames[0], "AVIF", save_all=True, append_images=frames[1:], duration=200, speed=10
            ),
            (180, 120),
            "AVIF",
        ),
        # Pillow writes each of its standard sizes up to the image's: 16, 24, 32 and 48.
        _entry("astronaut-48.ico", _encode(_resized(astronaut, (48, 48)), "ICO"), (48, 48), "ICO"),
        _entry(
            "camera-palette.bmp",
            _encode(_resized(camera, (256, 256)).quantize(16), "BMP"),
            (256, 256),
            "BMP",
        ),
    ]


# --- EXIF ----------------------------------------------------------------------------


def _exif_images(
    astronaut: Image.Image, coffee: Image.Image, chelsea: Image.Image
) -> list[CorpusImage]:
    makernote_60k = random.Random("makernote-60k").randbytes(60_000)
    makernote_100k = random.Random("makernote-100k").randbytes(100_000)

    artist_only = Image.Exif()
    artist_only[0x013B] = _ARTIST

    full, full_expected = _full_exif(makernote_60k)
    awkward, awkward_expected = _awkward_exif()

    rotated = Image.Exif()
    rotated[0x0112] = 6  # Orientation: rotate 90 CW to display; the stored size is kept
    rotated[0x013B] = _ARTIST

    def with_makernote(makernote: bytes) -> Image.Exif:
        exif = Image.Exif()
        exif[0x013B] = _ARTIST
        exif.get_ifd(0x8769)[0x9003] = "2023:11:02 09:15:00"
        exif.get_ifd(0x8769)[0x927C] = makernote
        gps = exif.get_ifd(0x8825)
        gps[0x1] = "S"
        gps[0x2] = (IFDRational(33, 1), IFDRational(51, 1), IFDRational(2154, 100))
        return exif

    makernote_expected = {
        "0x13b": _ARTIST,
        "0x9003": "2023:11:02 09:15:00",
        "0x8825": {"0x1": "S", "0x2": [33.0, 51.0, 21.54]},
    }

    coffee_small = _resized(coffee, (480, 320))
    corrupt_body = _corrupt_exif_jpeg(_encode(chelsea, "JPEG", quality=80, exif=artist_only))
    return [
        _entry(
            "exif-artist-q80.jpg",
            _encode(chelsea, "JPEG", quality=80, exif=artist_only),
            chelsea.size,
            "JPEG",
            quality=80,
            exif={"0x13b": _ARTIST},
        ),
        _entry(
            "exif-full-q90.jpg",
            _encode(coffee, "JPEG", quality=90, exif=full),
            coffee.size,
            "JPEG",
            quality=90,
            exif=full_expected,
        ),
        _entry(
            "exif-awkward-q85.jpg",
            _encode(astronaut, "JPEG", quality=85, exif=awkward),
            astronaut.size,
            "JPEG",
            quality=85,
            exif=awkward_expected,
        ),
        _entry(
            "exif-orientation6-1200x900-q75.jpg",
            _encode(_resized(coffee, (1200, 900)), "JPEG", quality=75, exif=rotated),
            (1200, 900),
            "JPEG",
            quality=75,
            exif={"0x112": 6, "0x13b": _ARTIST},
        ),
        _entry(
            "exif-makernote.png",
            _encode(coffee_small, "PNG", compress_level=1, exif=with_makernote(makernote_100k)),
            coffee_small.size,
            "PNG",
            exif=makernote_expected,
        ),
        _entry(
            "exif-makernote.webp",
            _encode(coffee_small, "WEBP", quality=80, exif=with_makernote(makernote_100k)),
            coffee_small.size,
            "WEBP",
            exif=makernote_expected,
        ),
        _entry("exif-corrupt.jpg", corrupt_body, chelsea.size, "JPEG", quality=80),
    ]


def _full_exif(makernote: bytes) -> tuple[Image.Exif, dict[str, Any]]:
    exif = Image.Exif()
    exif[0x010F] = "Canon"
    exif[0x0110] = "Canon EOS 5D Mark IV"
    exif[0x011A] = IFDRational(300, 1)  # XResolution
    exif[0x011B] = IFDRational(300, 1)
    exif[0x0128] = 2  # ResolutionUnit: inch
    exif[0x013B] = _ARTIST
    sub = exif.get_ifd(0x8769)
    sub[0x829A] = IFDRational(1, 250)  # ExposureTime
    sub[0x829D] = IFDRational(28, 10)  # FNumber
    sub[0x8827] = 400  # ISO
    sub[0x9000] = b"0232"  # ExifVersion (UNDEFINED, printable)
    sub[0x9003] = "2024:05:17 14:03:22"  # DateTimeOriginal
    sub[0x9101] = b"\x01\x02\x03\x00"  # ComponentsConfiguration (binary)
    sub[0x9209] = 0  # Flash: did not fire
    sub[0x9286] = b"ASCII\x00\x00\x00Shot on a tripod"  # UserComment
    sub[0x927C] = makernote
    gps = exif.get_ifd(0x8825)
    gps[0x0] = b"\x02\x03\x00\x00"  # GPSVersionID
    gps[0x1] = "N"
    gps[0x2] = (IFDRational(40, 1), IFDRational(26, 1), IFDRational(46302, 1000))
    gps[0x3] = "W"
    gps[0x4] = (IFDRational(79, 1), IFDRational(58, 1), IFDRational(56, 1))
    gps[0x6] = IFDRational(2315, 10)  # GPSAltitude
    expected = {
        "0x10f": "Canon",
        "0x110": "Canon EOS 5D Mark IV",
        "0x11a": 300.0,
        "0x11b": 300.0,
        "0x128": 2,
        "0x13b": _ARTIST,
        "0x829a": 0.004,
        "0x829d": 2.8,
        "0x8827": 400,
        "0x9000": "0232",
        "0x9003": "2024:05:17 14:03:22",
        "0x9101": "hex:01020300",
        "0x9209": 0,
        "0x9286": "Shot on a tripod",
        "0x8825": {
            "0x0": "hex:02030000",
            "0x1": "N",
            "0x2": [40.0, 26.0, 46.302],
            "0x3": "W",
            "0x4": [79.0, 58.0, 56.0],
            "0x6": 231.5,
        },
    }
    return exif, expected


def _awkward_exif() -> tuple[Image.Exif, dict[str, Any]]:
    exif = Image.Exif()
    exif[0x010E] = "A caption\x00\x00\x00"  # ImageDescription padded with NULs
    exif[0x013B] = b"J\xfcrgen"  # Artist in Latin-1, not ASCII
    exif[0x9C9B] = "Über den Wolken".encode("utf-16-le") + b"\x00\x00"  # XPTitle
    sub = exif.get_ifd(0x8769)
    sub[0x829A] = IFDRational(0, 0)  # ExposureTime 0/0
    sub[0x9286] = b"UNICODE\x00" + "naïve ☃".encode("utf-16-be")  # big-endian Exif
    sub[0xA005] = {0x1: "R98", 0x2: b"0100"}  # Interop IFD
    expected = {
        "0x10e": "A caption",
        "0x13b": "Jürgen",
        "0x9c9b": "Über den Wolken",
        "0x829a": None,
        "0x9286": "naïve ☃",
        "0xa005": {"0x1": "R98", "0x2": "0100"},
    }
    return exif, expected


def _corrupt_exif_jpeg(body: bytes) -> bytes:
    # Replace the TIFF byte-order mark after "Exif\0\0" so that the block cannot parse.
    start = body.index(b"Exif\x00\x00") + 6
    return body[:start] + b"QQ" + body[start + 2 :]


# --- originals -----------------------------------------------------------------------


def _originals(data_dir: Path) -> list[CorpusImage]:
    images = []
    for name, filename, size, quality, exif in _ORIGINALS:
        path = data_dir / filename
        if path.is_file():
            images.append(_entry(name, path.read_bytes(), size, "JPEG", quality=quality, exif=exif))
    return images


# --- broken --------------------------------------------------------------------------


def _broken(src: dict[str, Image.Image]) -> list[CorpusImage]:
    astronaut, chelsea = src["astronaut"], src["chelsea"]
    jpeg = _encode(_resized(astronaut, (1024, 768)), "JPEG", quality=80)
    png = _encode(chelsea, "PNG")
    gif = _encode(chelsea.quantize(64), "GIF")
    webp = _encode(chelsea, "WEBP", quality=80)
    avif = _encode(chelsea, "AVIF", quality=70, speed=10)
    scan = jpeg.index(b"\xff\xda")
    scan_header_end = scan + 2 + struct.unpack(">H", jpeg[scan + 2 : scan + 4])[0]
    garbage = random.Random("garbage").randbytes(20_000)
    unidentified = "UnidentifiedImageError"
    decode = "ImageDecodeError"
    bomb = "DecompressionBombError"
    broken = [
        ("random-4k.bin", random.Random("random").randbytes(4096), unidentified),
        ("not-found.html", _HTML, unidentified),
        ("empty.jpg", b"", unidentified),
        ("vector.svg", _SVG, unidentified),
        ("pixmap.ppm", _encode(_resized(astronaut, (32, 32)), "PPM"), unidentified),  # not allowed
        ("jpeg-soi-garbage.jpg", jpeg[:20] + garbage, unidentified),  # no frame header
        ("jpeg-header-garbage.jpg", jpeg[:scan_header_end] + garbage + b"\xff\xd9", decode),
        ("truncated-half.jpg", _truncated(jpeg), decode),
        ("truncated-half.png", _truncated(png), decode),
        ("truncated-half.gif", _truncated(gif), decode),
        ("truncated-half.webp", _truncated(webp), decode),
        ("truncated-half.avif", _truncated(avif), decode),
        ("corrupt-idat.png", _corrupt_idat(png), decode),
        # Over the default max_pixels: 1.1x (Pillow alone would only warn) and 4.5x.
        ("bomb-10000x10000.png", bilevel_png(10_000, 10_000), bomb),
        ("bomb-20000x20000.png", bilevel_png(20_000, 20_000), bomb),
    ]
    return [
        CorpusImage(
            name=name,
            body=body,
            content_type=_content_type(name),
            width=None,
            height=None,
            quality=None,
            exif=None,
            expected_status=status,
        )
        for name, body, status in broken
    ]


_HTML = b"""<!DOCTYPE html>
<html><head><title>404 Not Found</title></head>
<body><h1>Not Found</h1><p>The requested image was not found.</p></body></html>
"""
_SVG = b"""<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="64" height="64">
  <circle cx="32" cy="32" r="30"/>
</svg>
"""


def _truncated(body: bytes) -> bytes:
    """Cut `body` at half, moving the cut earlier until Pillow really fails to decode it."""
    cut = len(body) // 2
    while cut > 64:
        if _fails_to_decode(body[:cut]):
            return body[:cut]
        cut = cut * 9 // 10
    raise AssertionError("could not find a truncation that Pillow rejects")


def _fails_to_decode(body: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(body)) as im:
            im.load()
    except (OSError, SyntaxError, ValueError, EOFError):
        return True
    return False


def _corrupt_idat(png: bytes) -> bytes:
    """Scramble the middle of the first IDAT chunk's deflate stream (CRC left stale)."""
    start = png.index(b"IDAT") + 4
    length = struct.unpack(">I", png[start - 8 : start - 4])[0]
    data = bytearray(png)
    rng = random.Random("idat")
    for offset in range(start + length // 4, start + length // 2, 5):
        data[offset] ^= rng.randrange(1, 256)
    corrupted = bytes(data)
    assert _fails_to_decode(corrupted), "corrupted IDAT still decodes"
    return corrupted


def bilevel_png(width: int, height: int) -> bytes:
    """A valid all-black 1-bit PNG, written row by row so that it never sits in memory."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    compressor = zlib.compressobj(9)
    row = bytes(1 + (width + 7) // 8)  # filter byte 0, then black pixels
    idat = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )
