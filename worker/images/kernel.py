"""The image kernel: one downloaded body in, dimensions, quality, EXIF, a thumbnail and the
body's SHA-256 and the image's perceptual hash out.

Pure and picklable so that it can run in a process pool: no asyncio, no I/O, no global
Pillow state touched. Every expected problem with the body (not an image, corrupt,
too big) is an `ImageFailure` value; exceptions are left for bugs.

Pillow reads every body's header (size, format, quantization tables, EXIF). The pixels of
a YCbCr or greyscale JPEG, most of what a crawl sees, take a faster road: libjpeg-turbo
(through simplejpeg) decodes straight to the smallest of its n/8 scales that still covers
the thumbnail, OpenCV's SIMD bicubic resize takes it the rest of the way, and
libjpeg-turbo encodes it. Everything else, and any JPEG that road refuses, goes through
Pillow as before. On the benchmark's photographs of about 270 KB the JPEG road takes
about half the CPU of Pillow's (draft, BICUBIC resize, encode) for thumbnails that differ
from a full-decode Lanczos thumbnail by about as much; bench/README.md has the figures.
Either road hashes the thumbnail's pixels before encoding them (worker/images/phash.py).
"""

from __future__ import annotations

import hashlib
import io
import mmap
import struct
import warnings
import zlib
from dataclasses import dataclass, field
from typing import IO, Any, Final, cast

import cv2
import numpy as np
import simplejpeg
from PIL import AvifImagePlugin, Image, JpegImagePlugin

from image_crawler.contract import Encoding, Status
from worker.images import ico
from worker.images.exif import EXIF_IFD, GPS_IFD, ExifLimits, exif_to_json
from worker.images.phash import phash
from worker.images.quality import estimate_jpeg_quality

_DETAIL_MAX_CHARS = 200
# A reducing gap of 2 is, per Pillow's documentation, very close to fair resampling
# while letting most of the reduction happen in the fast integer box reduce.
_REDUCING_GAP = 2.0

# What Pillow raises on bodies it recognised but cannot decode: truncated data, bad
# chunks, impossible headers, broken compressed streams.
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error)
# What Pillow's AVIF plugin raises besides those: a plain RuntimeError for whatever
# libavif refuses beyond a malformed container (a broken AV1 stream, a feature it lacks,
# a frame over its own size limit), ZeroDivisionError for a sequence whose timescale is 0.
# Caught only for a body that is an ISO BMFF file (AVIF's container: "ftyp" at bytes 4-8),
# where they mean the data; anywhere else they are bugs.
_AVIF_ERRORS = (RuntimeError, ZeroDivisionError)
_FTYP = slice(4, 8)
# The major brands of an AVIF file (bytes 8-12); "mif1" and "msf1", which Pillow also
# tries as AVIF, are HEIF's and as often HEIC, a format not read here.
_AVIF_BRANDS = (b"avif", b"avis")
# What Pillow raises while parsing an EXIF block's header (the tags are parsed lazily,
# and exif_to_json guards those itself).
_EXIF_ERRORS = (SyntaxError, OSError, ValueError, TypeError, struct.error)

# Each pool process is one CPU's worth of work: OpenCV's own threads would only fight the
# other pool processes for the cores.
cv2.setNumThreads(1)
# The n/8 scale libjpeg-turbo decodes at leaves a ratio of decoded size to thumbnail size
# under 1 + 1/(n - 1): under 4/3 for images less than 2.67 times the thumbnail, up to 2 for
# bigger ones. Past 4/3 the pixels are first blurred with bicubic stretched to the ratio,
# as Pillow's own resize does, or the thumbnail aliases: on the benchmark's photographs
# scaled to 2,300-4,900 px that gains 0.5-2.3 dB against a full-decode Lanczos thumbnail.
# Below 4/3 it would gain 0.2-0.35 dB for 0.5 ms more per image (bench/README.md).
_PREFILTER_ABOVE: Final = 4 / 3 + 1e-6


@dataclass(frozen=True, slots=True)
class ImageLimits:
    """What `process_image` accepts and produces.

    `thumbnail_px` is the longest side of the thumbnail in pixels, `max_pixels` the
    largest width * height decoded (a bigger image is a DecompressionBombError; for an
    ICO, the size its largest entry's own header states), `formats` the Pillow format
    names tried, `thumbnail_quality` the JPEG quality of the thumbnail (1..100). Note that
    Pillow itself refuses images over twice its global `Image.MAX_IMAGE_PIXELS` in
    `Image.open`, whatever `max_pixels` says.

    For an AVIF, `max_pixels` bounds the size the file states (its ispe box), which is
    what libavif gives Pillow; the AV1 frame inside is decoded at its own size, bounded
    only by libavif's default limit of 16384 x 16384 pixels, and scaled to the stated one.

    An animated GIF, WebP or AVIF gives its first frame; an ICO its largest entry.
    """

    thumbnail_px: int = 640
    max_pixels: int = 89_478_485
    formats: tuple[str, ...] = ("JPEG", "PNG", "GIF", "WEBP", "TIFF", "BMP", "AVIF", "ICO")
    thumbnail_quality: int = 85
    exif: ExifLimits = field(default_factory=ExifLimits)

    def __post_init__(self) -> None:
        if self.thumbnail_px < 1:
            raise ValueError(f"thumbnail_px must be >= 1, got {self.thumbnail_px}")
        if self.max_pixels < 1:
            raise ValueError(f"max_pixels must be >= 1, got {self.max_pixels}")
        if not self.formats:
            raise ValueError("formats must name at least one Pillow format")
        if not 1 <= self.thumbnail_quality <= 100:
            raise ValueError(f"thumbnail_quality must be 1..100, got {self.thumbnail_quality}")


DEFAULT_LIMITS = ImageLimits()


@dataclass(frozen=True, slots=True)
class ProcessedImage:
    """A decoded image.

    `width` and `height` are the stored pixel size of the original (no EXIF rotation; for
    an ICO, of its largest entry), `format` Pillow's format name ("JPEG", "PNG", "MPO",
    "AVIF"...), `compression_quality` the estimated JPEG quality (1..100) or None for
    other formats, `exif` the EXIF as JSON (see `exif_to_json`) or None when the image
    has none, `thumbnail` a baseline JPEG (RGB or L) whose longest side is at most
    `ImageLimits.thumbnail_px`, same aspect, never upscaled, as stored (not rotated by
    EXIF Orientation). `sha256` is the hex SHA-256 of the body, `phash` the 64-bit DCT
    perceptual hash of the thumbnail's pixels as 16 hex digits (imagehash's `phash`, see
    worker/images/phash.py).
    """

    width: int
    height: int
    format: str
    compression_quality: int | None
    exif: dict[str, Any] | None
    thumbnail: bytes = field(repr=False)
    sha256: str
    phash: str
    # The (width, height) of `thumbnail`: the plan's canvas.
    thumbnail_size: tuple[int, int] = (0, 0)


@dataclass(frozen=True, slots=True)
class _Output:
    """How the image made is encoded: `format` one of ENCODE_FORMATS, and `quality` its
    quality (jpg, webp: 1-100) or compression level (png: 0-9)."""

    format: str
    quality: int


@dataclass(frozen=True, slots=True)
class _Thumbnail:
    """The image made, encoded, and the perceptual hash of its pixels before they were
    cropped, padded or encoded (so that a crop does not change an image's hash much)."""

    jpeg: bytes
    phash: str


@dataclass(frozen=True, slots=True)
class ImageFailure:
    """A body that did not give a thumbnail.

    `status` is "UnidentifiedImageError" (not an image, or a format not allowed),
    "ImageDecodeError" (recognised but truncated or corrupt; an AVIF is recognised by its
    brand) or "DecompressionBombError" (width * height over `ImageLimits.max_pixels`);
    `detail` a short reason, at most 200 characters.
    """

    status: str
    detail: str


def thumbnail_size(width: int, height: int, max_px: int) -> tuple[int, int]:
    """The (width, height) in pixels of a thumbnail whose longest side is at most `max_px`.

    Keeps the aspect ratio (the short side is rounded to the nearest pixel, at least 1)
    and never upscales: an image that already fits keeps its size.
    """
    if width < 1 or height < 1 or max_px < 1:
        raise ValueError(f"sizes must be >= 1, got {width}x{height} and max {max_px}")
    long_side, short_side = max(width, height), min(width, height)
    if long_side <= max_px:
        return width, height
    scaled = max(1, (short_side * max_px + long_side // 2) // long_side)
    return (max_px, scaled) if width >= height else (scaled, max_px)


@dataclass(frozen=True, slots=True)
class Plan:
    """What is made of a `width` x `height` image: it is resized to `resized` (its own
    size: not resized), then placed at `offset` on a canvas of `canvas` pixels, a white
    one: a negative offset crops it (center_crop), a positive one pads it (border)."""

    resized: tuple[int, int]
    canvas: tuple[int, int]
    offset: tuple[int, int] = (0, 0)


def thumbnail_plan(width: int, height: int, max_px: int) -> Plan:
    """The original's thumbnail: `thumbnail_size`, nothing cut or added."""
    size = thumbnail_size(width, height, max_px)
    return Plan(size, size)


def plan_of(width: int, height: int, encoding: Encoding) -> Plan:
    """What `encoding` makes of a `width` x `height` image, as img2dataset's resizer does
    it: the new side is ``round(side * scale)`` in floating point (albumentations' rule,
    Python's rounding half to even), a crop starts at ``(side - size) // 2`` and a border
    at ``(size - side) // 2``. Without resize_only_if_bigger it enlarges too; with it, an
    image that is not bigger is left as it is, crop and border included."""
    size, mode = encoding.image_size, encoding.resize_mode
    original = (width, height)
    if mode == "no":
        return Plan(original, original)
    by_smaller = mode in ("keep_ratio", "center_crop")
    side = min(width, height) if by_smaller else max(width, height)
    if encoding.resize_only_if_bigger and side <= size:
        return Plan(original, original)
    scale = size / side
    resized = (max(1, round(width * scale)), max(1, round(height * scale)))
    if mode == "center_crop":
        rw, rh = resized
        return Plan(resized, (size, size), (-((rw - size) // 2), -((rh - size) // 2)))
    if mode == "border":
        rw, rh = resized
        return Plan(resized, (size, size), ((size - rw) // 2, (size - rh) // 2))
    return Plan(resized, resized)


def refusal(width: int, height: int, encoding: Encoding) -> ImageFailure | None:
    """Why `encoding`'s filters refuse a `width` x `height` image, or None: img2dataset's
    min_image_size, max_image_area and max_aspect_ratio, in its order."""
    short, long = min(width, height), max(width, height)
    if short < encoding.min_image_size:
        return ImageFailure(
            Status.IMAGE_TOO_SMALL,
            f"{width}x{height}: the smaller side is under {encoding.min_image_size} px",
        )
    area = encoding.max_image_area
    if area is not None and width * height > area:
        return ImageFailure(Status.IMAGE_AREA_TOO_LARGE, f"{width}x{height} is over {area} pixels")
    ratio = encoding.max_aspect_ratio
    if ratio is not None and long / short > ratio:
        return ImageFailure(
            Status.ASPECT_RATIO_TOO_LARGE,
            f"{width}x{height}: an aspect ratio of {long / short:.3g}, over {ratio:g}",
        )
    return None


def process_image(
    body: bytes | mmap.mmap,
    limits: ImageLimits = DEFAULT_LIMITS,
    encoding: Encoding | None = None,
) -> ProcessedImage | ImageFailure:
    """Decode `body` once and describe it, or say why it cannot be.

    `body` is the downloaded bytes, or a read-only map of exactly them (how the worker's
    pool processes see a body, without copying it); the results are the same. The image
    made of it is the original's thumbnail (`limits.thumbnail_px`, a JPEG of
    `limits.thumbnail_quality`), or what `encoding` asks (`plan_of`), which may also
    refuse the image (`refusal`).

    CPU only, no I/O. Pillow's warnings about the data (decompression bombs, corrupt
    EXIF) are silenced inside this call only, with `warnings.catch_warnings()`, which is
    process-wide: run it in processes, not in several threads at once.
    `limits.max_pixels` is enforced from the header, before anything is decoded.
    """
    with warnings.catch_warnings():
        # Pillow's data-dependent warnings are UserWarnings, and its bomb warning only
        # restates the limit that we enforce ourselves.
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        fp = _readable(body)
        try:
            # Pillow decodes an ICO inside Image.open, before its size could be checked.
            ico_size = ico.decoded_size(fp) if "ICO" in limits.formats else None
            if ico_size is not None and (too_big := _over_limit(*ico_size, limits)):
                return too_big
            with Image.open(fp, formats=limits.formats) as im:
                return _process(im, body, limits, encoding)
        except Image.UnidentifiedImageError:
            return _unidentified(fp, body, limits)
        except Image.DecompressionBombError as err:
            return _failure(Status.DECOMPRESSION_BOMB, err)
        except _DECODE_ERRORS as err:
            return _failure(Status.IMAGE_DECODE_ERROR, err)
        except _AVIF_ERRORS as err:
            if type(err) not in _AVIF_ERRORS or body[_FTYP] != b"ftyp":
                raise
            return _failure(Status.IMAGE_DECODE_ERROR, err)


def _unidentified(fp: IO[bytes], body: bytes | mmap.mmap, limits: ImageLimits) -> ImageFailure:
    if "AVIF" in limits.formats and body[_FTYP] == b"ftyp" and body[8:12] in _AVIF_BRANDS:
        # An AVIF by its brand that libavif could not parse (cut short, or broken boxes):
        # recognised, so a decode error. Image.open only says that no format took it;
        # libavif says why.
        fp.seek(0)
        try:
            AvifImagePlugin.AvifImageFile(fp).close()
        except SyntaxError as err:
            return _failure(Status.IMAGE_DECODE_ERROR, err)
    return ImageFailure(
        Status.UNIDENTIFIED_IMAGE,
        f"not an image in an allowed format ({', '.join(limits.formats)})",
    )


def _over_limit(width: int, height: int, limits: ImageLimits) -> ImageFailure | None:
    if width * height <= limits.max_pixels:
        return None
    return ImageFailure(
        Status.DECOMPRESSION_BOMB,
        f"{width}x{height} is {width * height} pixels, over the limit of {limits.max_pixels}",
    )


def _readable(body: bytes | mmap.mmap) -> IO[bytes]:
    # Never a str: Image.open would take it for a path and open that file.
    if isinstance(body, bytes):
        return io.BytesIO(body)
    if isinstance(body, mmap.mmap):
        return cast(IO[bytes], body)  # read, seek and tell, as Pillow needs
    raise TypeError(f"body must be bytes or mmap, not {type(body).__name__}")


def _process(
    im: Image.Image, body: bytes | mmap.mmap, limits: ImageLimits, encoding: Encoding | None
) -> ProcessedImage | ImageFailure:
    width, height = im.size
    if (too_big := _over_limit(width, height, limits)) is not None:
        return too_big
    if encoding is not None and (refused := refusal(width, height, encoding)) is not None:
        return refused
    jpeg = im if isinstance(im, JpegImagePlugin.JpegImageFile) else None  # MPO too
    quality = estimate_jpeg_quality(jpeg.quantization) if jpeg is not None else None
    if im.format == "PNG":
        # PNG may keep eXIf after the image data; Pillow would decode the image to find it
        # from inside getexif(), where a decode error would look like bad EXIF.
        im.load()
    exif = _read_exif(im, limits.exif)

    if encoding is None:
        plan = thumbnail_plan(width, height, limits.thumbnail_px)
        output = _Output("jpg", limits.thumbnail_quality)
    else:
        plan = plan_of(width, height, encoding)
        rw, rh = plan.resized
        if rw * rh > limits.max_pixels:
            # keep_ratio enlarges by the smaller side: a 10000 x 1 image to 256 px would
            # be 2,560,000 x 256 before its crop.
            return ImageFailure(
                Status.DECOMPRESSION_BOMB,
                f"{width}x{height} resized to {rw}x{rh} is over {limits.max_pixels} pixels",
            )
        output = _Output(encoding.encode_format, encoding.encode_quality)
    thumbnail = _turbo_thumbnail(im, body, plan, output) if jpeg else None
    if thumbnail is None:
        thumbnail = _pillow_thumbnail(im, jpeg, plan, output)
    return ProcessedImage(
        width=width,
        height=height,
        format=im.format or "",
        compression_quality=quality,
        exif=exif,
        thumbnail=thumbnail.jpeg,
        sha256=hashlib.sha256(body).hexdigest(),  # a map too, without a copy
        phash=thumbnail.phash,
        thumbnail_size=plan.canvas,
    )


def _turbo_thumbnail(
    im: Image.Image, body: bytes | mmap.mmap, plan: Plan, output: _Output
) -> _Thumbnail | None:
    """The image of a YCbCr or greyscale JPEG through libjpeg-turbo and OpenCV, or
    None to let Pillow do it (CMYK, 12-bit, or anything libjpeg-turbo calls damaged:
    Pillow then gives the verdict it always gave, including on files it tolerates)."""
    if im.mode not in ("RGB", "L"):  # Pillow's names for YCbCr (or RGB) and grey JPEGs
        return None
    grey = im.mode == "L"
    width, height = im.size
    tw, th = plan.resized
    try:
        pixels = simplejpeg.decode_jpeg(
            body,
            colorspace="GRAY" if grey else "RGB",
            min_width=min(tw, width),
            min_height=min(th, height),
        )
    except ValueError:
        return None
    pixels = _resize(pixels, width, height, plan.resized)
    hashed = phash(pixels)
    pixels = _placed(pixels, plan)
    if output.format != "jpg":
        return _Thumbnail(_pillow_encoded(Image.fromarray(pixels), output), hashed)
    ch, cw = pixels.shape[:2]
    if grey:
        jpeg = simplejpeg.encode_jpeg(
            pixels.reshape(ch, cw, 1), output.quality, colorspace="GRAY", colorsubsampling="Gray"
        )
    else:
        # 4:2:0, as Pillow writes at this quality.
        jpeg = simplejpeg.encode_jpeg(
            pixels, output.quality, colorspace="RGB", colorsubsampling="420"
        )
    return _Thumbnail(bytes(jpeg), hashed)


def _placed(pixels: Any, plan: Plan) -> Any:
    """`pixels` (the resized image) on the plan's white canvas, at its offset."""
    if plan.canvas == plan.resized:
        return pixels
    (cw, ch), (x, y) = plan.canvas, plan.offset
    if x <= 0 and y <= 0:  # a crop
        return np.ascontiguousarray(pixels[-y : -y + ch, -x : -x + cw])
    canvas = np.full((ch, cw, *pixels.shape[2:]), 255, dtype=pixels.dtype)
    rows, cols = pixels.shape[:2]
    canvas[max(y, 0) : max(y, 0) + rows, max(x, 0) : max(x, 0) + cols] = pixels[
        max(-y, 0) : max(-y, 0) + ch, max(-x, 0) : max(-x, 0) + cw
    ]
    return canvas


def _pillow_encoded(frame: Image.Image, output: _Output) -> bytes:
    out = io.BytesIO()
    if output.format == "jpg":
        frame.save(out, "JPEG", quality=output.quality, optimize=False)
    elif output.format == "png":
        frame.save(out, "PNG", compress_level=output.quality)
    else:
        frame.save(out, "WEBP", quality=output.quality)
    return out.getvalue()


def _resize(pixels: Any, width: int, height: int, target: tuple[int, int]) -> Any:
    """`pixels`, libjpeg-turbo's decode of a `width` x `height` JPEG at some scale n/8,
    resized to `target`, mapping the decoded content exactly onto it."""
    tw, th = target
    rows, cols = pixels.shape[:2]
    if (cols, rows) == target:
        return pixels
    # libjpeg-turbo writes ceil(W * n / 8) pixels of which W * n / 8 are content: for an
    # odd width the last column is half padding. Stretching the padded width onto the
    # thumbnail would shift it by up to half a pixel at the far edge (several dB on detailed
    # images), so the content's own scale is given to OpenCV, which maps pixel centres by
    # fx and fy, and the overhang is cut off.
    n = _scale_eighths(width, height, cols, rows)
    content_w, content_h = width * n / 8, height * n / 8
    ratio_x, ratio_y = content_w / tw, content_h / th
    if ratio_x > _PREFILTER_ABOVE or ratio_y > _PREFILTER_ABOVE:
        pixels = cv2.sepFilter2D(
            pixels,
            -1,
            _stretched_bicubic(max(ratio_x, 1.0)),
            _stretched_bicubic(max(ratio_y, 1.0)),
            borderType=cv2.BORDER_REFLECT,
        )
    resized = cv2.resize(
        pixels, None, fx=tw / content_w, fy=th / content_h, interpolation=cv2.INTER_CUBIC
    )
    if resized.shape[0] < th or resized.shape[1] < tw:  # not expected; stay in bounds
        resized = cv2.resize(pixels, target, interpolation=cv2.INTER_CUBIC)
    return np.ascontiguousarray(resized[:th, :tw])


def _scale_eighths(width: int, height: int, cols: int, rows: int) -> int:
    """The n of libjpeg-turbo's n/8 scale that gave `cols` x `rows`."""
    for n in range(8, 0, -1):
        if -(-width * n // 8) == cols and -(-height * n // 8) == rows:
            return n
    return 8  # not a scale libjpeg-turbo offers; treat the pixels as the whole image


def _stretched_bicubic(ratio: float) -> Any:
    """Taps, at whole-pixel offsets, of a bicubic kernel (a = -0.5, Pillow's) stretched by
    `ratio`: a low-pass filter for a reduction by `ratio`, summing to 1."""
    radius = int(np.ceil(2.0 * ratio))
    x = np.abs(np.arange(-radius, radius + 1) / ratio)
    a = -0.5
    taps = np.where(
        x < 1,
        ((a + 2) * x - (a + 3)) * x * x + 1,
        np.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, 0.0),
    )
    return (taps / taps.sum()).astype(np.float32)


def _pillow_thumbnail(
    im: Image.Image,
    jpeg: JpegImagePlugin.JpegImageFile | None,
    plan: Plan,
    output: _Output,
) -> _Thumbnail:
    width, height = im.size
    target = plan.resized
    box: tuple[float, float, float, float] | None = None
    if jpeg is not None and target != (width, height):
        # DCT scaling: libjpeg decodes straight to 1/2, 1/4 or 1/8 of the size, the
        # smallest of those that is still at least the target.
        drafted = jpeg.draft("RGB", (min(target[0], width), min(target[1], height)))
        if drafted is not None:
            box = drafted[1]
    im.load()

    frame = _resizable(im)
    if frame.size != target:
        frame = frame.resize(target, Image.Resampling.BICUBIC, box=box, reducing_gap=_REDUCING_GAP)
    frame = _flatten(frame)
    # Pillow's own grey: half the CPU of unpacking its RGB into an array for OpenCV.
    hashed = phash(np.asarray(frame.convert("L")))
    if plan.canvas != plan.resized:
        placed = Image.new(frame.mode, plan.canvas, "white")
        placed.paste(frame, plan.offset)
        frame = placed
    return _Thumbnail(_pillow_encoded(frame, output), hashed)


def _read_exif(im: Image.Image, limits: ExifLimits) -> dict[str, Any] | None:
    try:
        exif = im.getexif()
    except _EXIF_ERRORS:
        return None  # a broken EXIF block does not make a broken image
    if not _has_exif_block(im, exif):
        return None
    return exif_to_json(exif, limits) or None


def _has_exif_block(im: Image.Image, exif: Image.Exif) -> bool:
    # getexif() also synthesises Orientation from XMP, and for TIFF returns the file's own
    # structure tags; neither is EXIF the image carries.
    if "exif" in im.info or "Raw profile type exif" in im.info:
        return True
    return im.format == "TIFF" and (EXIF_IFD in exif or GPS_IFD in exif)


def _resizable(im: Image.Image) -> Image.Image:
    """Convert to L, RGB, LA or RGBA: modes Pillow resizes well (it premultiplies alpha)."""
    mode = im.mode
    if mode in ("L", "RGB"):
        if "transparency" in im.info:
            return im.convert(mode + "A" if mode == "L" else "RGBA")
        return im
    if mode in ("LA", "RGBA"):
        return im
    if mode == "1":
        return im.convert("L")
    if mode == "La":
        return im.convert("LA")
    if mode in ("P", "PA"):
        return im.convert("RGBA" if im.has_transparency_data else "RGB")
    if mode.startswith("I;16"):
        # 16-bit samples: map 0..65535 onto 0..255 instead of clipping at 255.
        return im.convert("I").point(lambda value: value / 257).convert("L")
    if mode in ("I", "F"):
        return _stretch_to_l(im)
    return im.convert("RGBA" if im.has_transparency_data else "RGB")


def _stretch_to_l(im: Image.Image) -> Image.Image:
    # Single-band I and F images: getextrema() gives (min, max) numbers.
    low, high = cast(tuple[float, float], im.getextrema())
    if low >= 0 and high <= 255:
        return im.convert("L")
    scale = 255 / (high - low) if high > low else 0.0
    return im.point(lambda value: (value - low) * scale).convert("L")


def _flatten(im: Image.Image) -> Image.Image:
    """Composite alpha onto white; the result is L or RGB, what JPEG stores."""
    if im.mode not in ("LA", "RGBA"):
        return im
    base_mode = im.mode[:-1]
    base = Image.new(base_mode, im.size, "white")
    base.paste(im, (0, 0), im)
    return base


def _failure(status: str, err: BaseException) -> ImageFailure:
    detail = str(err) or type(err).__name__
    return ImageFailure(status, detail[:_DETAIL_MAX_CHARS])
