"""The kernel on files made by real encoders: AVIF (libavif's avifenc), animated WebP
(img2webp, gif2webp), animated GIF and ICO (ImageMagick), as Debian ships them.

Each thumbnail is compared with what the kernel's own Pillow road makes of the source
pixels (resized, flattened onto white, saved as a JPEG), by PSNR. The bounds are loose for lossy
encoders, and each test also checks a wrong answer (the scene upside down, the next
frame, the alpha left unflattened) against them: the bound has to tell the two apart.
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageOps, ImageStat

from test.harness.encoders import Encoders
from test.harness.real_images import (
    MAGENTA,
    Hostile,
    av1_config,
    distinct_frames,
    ico_entries,
    many_frames,
    scene,
)
from worker.images.kernel import (
    ImageFailure,
    ImageLimits,
    ProcessedImage,
    process_image,
    thumbnail_size,
)

# A thumbnail this close to its reference is right; the wrong answers each test checks
# against it (the scene upside down, a later frame, the alpha ignored) stay under
# WRONG_DB. Measured: 27.5 dB at the least (a 3x5 AVIF in 4:2:0), 34 dB for GIF's
# dithered palette, 40-49 dB for the rest (no difference at all for lossless files);
# wrong answers 5-11 dB.
RIGHT_DB = 25.0
WRONG_DB = 15.0


def _psnr(a: Image.Image, b: Image.Image) -> float:
    assert a.size == b.size, (a.size, b.size)
    x = np.asarray(a.convert("RGB"), dtype=np.float64)
    y = np.asarray(b.convert("RGB"), dtype=np.float64)
    mse = float(np.mean((x - y) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255**2 / mse)


def _reference(source: Image.Image, size: tuple[int, int]) -> Image.Image:
    """The source as the kernel's Pillow road thumbnails it: resized (alpha premultiplied),
    composited onto white, saved as a JPEG of the thumbnail's quality (on a 3x5 scene,
    that JPEG alone is 20 dB from the source)."""
    resized = source if source.size == size else source.resize(size, Image.Resampling.BICUBIC)
    flat = Image.new("RGB", size, "white")
    flat.paste(resized, (0, 0), resized if resized.mode == "RGBA" else None)
    out = io.BytesIO()
    flat.save(out, "JPEG", quality=ImageLimits().thumbnail_quality)
    return Image.open(out)


def _processed(
    body: bytes, limits: ImageLimits | None = None
) -> tuple[ProcessedImage, Image.Image]:
    result = process_image(body) if limits is None else process_image(body, limits)
    assert isinstance(result, ProcessedImage), result
    thumbnail = Image.open(io.BytesIO(result.thumbnail))
    thumbnail.load()
    assert thumbnail.format == "JPEG" and thumbnail.mode == "RGB"
    return result, thumbnail


def _assert_resembles(thumbnail: Image.Image, source: Image.Image) -> None:
    """``thumbnail`` is ``source``'s, and not the source upside down, nor unflattened."""
    right = _psnr(thumbnail, _reference(source, thumbnail.size))
    assert right >= RIGHT_DB, f"{right:.1f} dB from the source's thumbnail"
    if min(source.size) > 1:
        upside_down = _psnr(thumbnail, _reference(source.rotate(180), thumbnail.size))
        assert upside_down < WRONG_DB, f"{upside_down:.1f} dB from the scene upside down"
    if source.mode == "RGBA" and source.getextrema()[3][0] < 128:  # type: ignore[index]
        unflattened = _psnr(thumbnail, _reference(source.convert("RGB"), thumbnail.size))
        assert unflattened < WRONG_DB, f"{unflattened:.1f} dB from the alpha ignored"


# Each kind of file, made by its real encoder from frames (one frame for a still AVIF;
# an ICO gets each frame as an entry).
Make = Callable[[Encoders, str, list[Image.Image]], bytes]
KINDS: dict[str, Make] = {
    "avif": lambda enc, name, frames: enc.avif(name, frames),
    "webp-lossy": lambda enc, name, frames: enc.animated_webp(name, frames, lossy=True),
    "webp-lossless": lambda enc, name, frames: enc.animated_webp(name, frames, lossy=False),
    "gif": lambda enc, name, frames: enc.gif(name, frames),
    "gif2webp": lambda enc, name, frames: enc.webp_from_gif(name, enc.gif(f"{name}-gif", frames)),
    "ico": lambda enc, name, frames: enc.ico(name, frames),
}
FORMATS = {
    "avif": "AVIF",
    "webp-lossy": "WEBP",
    "webp-lossless": "WEBP",
    "gif": "GIF",
    "gif2webp": "WEBP",
    "ico": "ICO",
}
# GIF keeps one transparent colour, not an alpha channel: its scenes are opaque.
WITH_ALPHA = {"avif", "webp-lossy", "webp-lossless", "ico"}


# --- AVIF: bit depths and chroma subsampling -------------------------------------------


@pytest.mark.parametrize("alpha", [False, True], ids=["rgb", "rgba"])
@pytest.mark.parametrize("yuv", ["420", "422", "444"])
@pytest.mark.parametrize("depth", [8, 10, 12])
def test_avif_of_every_depth_and_subsampling(
    encoders: Encoders, depth: int, yuv: str, alpha: bool
) -> None:
    source = scene((333, 77), alpha=alpha)
    body = encoders.avif(f"avif-{depth}-{yuv}-{alpha}", [source], depth=depth, yuv=yuv)
    assert av1_config(body) == (depth, yuv)  # the file is what the test says it is

    result, thumbnail = _processed(body)
    assert (result.width, result.height, result.format) == (333, 77, "AVIF")
    assert result.compression_quality is None
    assert result.exif is None
    assert thumbnail.size == (333, 77)
    _assert_resembles(thumbnail, source)


# --- every kind, at awkward sizes -------------------------------------------------------


SIZES = [(1, 1), (3, 5), (333, 77), (77, 333), (1280, 719)]


@pytest.mark.parametrize(
    ("kind", "size"),
    # An ICO entry is at most 256 pixels a side.
    [(k, s) for k in sorted(KINDS) for s in SIZES if k != "ico" or max(s) <= 256],
    ids=lambda value: value if isinstance(value, str) else f"{value[0]}x{value[1]}",
)
def test_sizes(encoders: Encoders, kind: str, size: tuple[int, int]) -> None:
    source = scene(size, alpha=kind in WITH_ALPHA)
    body = KINDS[kind](encoders, f"{kind}-{size[0]}x{size[1]}", [source])

    result, thumbnail = _processed(body)
    assert (result.width, result.height, result.format) == (*size, FORMATS[kind])
    assert result.compression_quality is None
    assert thumbnail.size == thumbnail_size(*size, 640)
    _assert_resembles(thumbnail, source)


# --- animations: the first frame -------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(set(KINDS) - {"ico"}))
def test_an_animation_gives_its_first_frame(encoders: Encoders, kind: str) -> None:
    frames = distinct_frames((120, 80), alpha=kind in WITH_ALPHA)
    body = KINDS[kind](encoders, f"{kind}-animated", frames)
    assert getattr(Image.open(io.BytesIO(body)), "n_frames", 1) == 3

    _, thumbnail = _processed(body)
    _assert_resembles(thumbnail, frames[0])
    for later in frames[1:]:
        assert _psnr(thumbnail, _reference(later, thumbnail.size)) < WRONG_DB


@pytest.mark.parametrize("kind", ["avif", "webp-lossy"])
def test_an_animation_of_a_thousand_frames_gives_its_first(encoders: Encoders, kind: str) -> None:
    frames = many_frames(1000)
    body = KINDS[kind](encoders, f"{kind}-1000-frames", frames)
    assert getattr(Image.open(io.BytesIO(body)), "n_frames", 1) == 1000

    result, thumbnail = _processed(body)
    assert (result.width, result.height) == frames[0].size
    assert ImageStat.Stat(thumbnail).mean == pytest.approx(MAGENTA, abs=8)


# --- ICO: the largest entry ------------------------------------------------------------

# Entries as (side, colour): the largest is the scene, every other one a flat colour.
ICO_ENTRIES = {
    "png-largest-in-the-middle": [(16, (255, 0, 0)), (256, None), (48, (0, 0, 255))],
    "png-largest-first": [(256, None), (32, (0, 255, 0)), (16, MAGENTA)],
    "dib-largest-last": [(16, (255, 0, 0)), (48, MAGENTA), (128, None)],
    "dib-only-one": [(64, None)],
}


@pytest.mark.parametrize("case", sorted(ICO_ENTRIES))
def test_an_ico_gives_its_largest_entry(encoders: Encoders, case: str) -> None:
    entries = ICO_ENTRIES[case]
    side = max(s for s, _ in entries)
    images = [
        scene((s, s), alpha=True) if colour is None else Image.new("RGBA", (s, s), colour)
        for s, colour in entries
    ]
    body = encoders.ico(f"ico-{case}", images)
    listed = [(entry.width, entry.height) for entry in ico_entries(body)]
    assert listed == [(s, s) for s, _ in entries]
    # ImageMagick 6 stores a 256-pixel entry as PNG and smaller ones as BMP.
    png = [body[e.offset : e.offset + 4] == b"\x89PNG" for e in ico_entries(body)]
    assert png == [s == 256 for s, _ in entries]

    result, thumbnail = _processed(body)
    assert (result.width, result.height, result.format) == (side, side, "ICO")
    _assert_resembles(thumbnail, scene((side, side), alpha=True))


# --- metadata ----------------------------------------------------------------------------


def test_an_avifs_exif_is_kept(encoders: Encoders) -> None:
    exif = Image.Exif()
    exif[0x013B] = "Alden Page"
    exif.get_ifd(0x8769)[0x9003] = "2024:05:17 14:03:22"
    body = encoders.avif("avif-exif", [scene((90, 60))], exif=exif.tobytes())

    result, _ = _processed(body)
    assert result.exif is not None
    assert result.exif.items() >= {"0x13b": "Alden Page", "0x9003": "2024:05:17 14:03:22"}.items()
    assert result.compression_quality is None


# --- hostile bodies ----------------------------------------------------------------------


def test_hostile_bodies_end_in_their_failure(hostile: list[Hostile]) -> None:
    wrong = {}
    for body in hostile:
        outcome = process_image(body.body)
        if not (
            isinstance(outcome, ImageFailure)
            and outcome.status == body.status
            and 0 < len(outcome.detail) <= 200
        ):
            wrong[body.name] = (body.status, outcome)
    assert wrong == {}
    assert len(hostile) >= 20


def _mutations(body: bytes, rng: random.Random, count: int) -> list[bytes]:
    """``count`` variants of ``body``: bytes overwritten anywhere or in the headers, a
    32-bit field set to an extreme, or the body cut short."""
    variants = []
    for _ in range(count):
        data = bytearray(body)
        how = rng.randrange(4)
        if how == 0:
            for _ in range(rng.randrange(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif how == 1:
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(min(len(data), 400))] = rng.randrange(256)
        elif how == 2:
            at = rng.randrange(min(len(data), 400))
            data[at : at + 4] = rng.choice([b"\xff\xff\xff\xff", bytes(4), b"\x7f\xff\xff\xff"])
        else:
            data = data[: rng.randrange(len(data))]
        variants.append(bytes(data))
    return variants


@pytest.mark.parametrize(
    ("kind", "frames"),
    [
        ("avif", [scene((120, 80), alpha=True)]),
        # A sequence: its track and sample table get damaged too.
        ("avif", distinct_frames((120, 80))),
        ("webp-lossy", distinct_frames((120, 80), alpha=True)),
        ("ico", [scene((s, s), alpha=True) for s in (16, 256, 48)]),
        ("ico", [scene((s, s), alpha=True) for s in (16, 128, 48)]),
    ],
    ids=["avif", "avif-sequence", "webp-animated", "ico-png", "ico-dib"],
)
def test_damaged_files_give_an_outcome_never_an_exception(
    encoders: Encoders, kind: str, frames: list[Image.Image], request: pytest.FixtureRequest
) -> None:
    name = request.node.callspec.id
    body = KINDS[kind](encoders, f"fuzz-{name}", frames)
    outcomes: dict[str, int] = {}
    for variant in _mutations(body, random.Random(name), 400):
        outcome: Any = process_image(variant)
        assert isinstance(outcome, ProcessedImage | ImageFailure)
        key = "thumbnail" if isinstance(outcome, ProcessedImage) else outcome.status
        outcomes[key] = outcomes.get(key, 0) + 1
    assert len(outcomes) >= 2, outcomes  # the damage was not all harmless, nor all fatal


def test_the_scene_tells_wrong_answers_apart() -> None:
    # The controls above rely on the first two; a mirrored, flipped or channel-swapped
    # decode would fail the RIGHT_DB check of every test.
    source = scene((333, 77), alpha=True)
    right = _reference(source, source.size)
    r, g, b, a = source.split()
    controls = (source.rotate(180), source.convert("RGB"))
    others = (ImageOps.mirror(source), ImageOps.flip(source), Image.merge("RGBA", (b, g, r, a)))
    assert all(_psnr(right, _reference(wrong, source.size)) < WRONG_DB for wrong in controls)
    assert all(_psnr(right, _reference(wrong, source.size)) < RIGHT_DB for wrong in others)
