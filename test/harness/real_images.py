"""Pixels to encode, and hostile bodies made from real encoders' files, for the kernel's
format tests (test/worker/test_kernel_formats.py) and the pool's (test/worker/test_pool.py).

``scene()`` draws smooth pixels on which a decoding mistake shows: a flip, a swapped
channel, a shift, the wrong frame or an alpha left unflattened each change most pixels
by far more than a lossy encoder does. ``hostile_bodies()`` cuts real AVIF, ICO and
animated WebP files short, writes headers that claim huge images and puts random bytes
behind an AVIF signature; each comes with the status the kernel gives it under its
default limits.
"""

from __future__ import annotations

import random
import struct
import zlib
from dataclasses import dataclass

from PIL import Image, ImageDraw, ImageOps

from test.harness.corpus import bilevel_png
from test.harness.encoders import Encoders

UNIDENTIFIED = "UnidentifiedImageError"
DECODE = "ImageDecodeError"
BOMB = "DecompressionBombError"

# A colour no scene has much of: a frame or an entry of this colour is told apart at once.
MAGENTA = (230, 0, 160)


def scene(size: tuple[int, int], *, alpha: bool = False) -> Image.Image:
    """RGB (or RGBA) test pixels of ``size``: red rises left to right, green top to bottom,
    blue falls away from the centre, and the top-left corner is dark. With ``alpha``, the
    opacity falls from 255 on the left to about 64 on the right, and the bottom-right
    quarter, black underneath, is fully transparent."""
    width, height = size
    across = Image.linear_gradient("L").rotate(90).resize(size)
    down = Image.linear_gradient("L").resize(size)
    centre = ImageOps.invert(Image.radial_gradient("L").resize(size))
    im = Image.merge("RGB", (across, down, centre))
    ImageDraw.Draw(im).rectangle((0, 0, (width - 1) // 4, (height - 1) // 4), fill=(20, 20, 20))
    if not alpha:
        return im
    opacity = ImageOps.invert(across).point(lambda value: 64 + value * 191 // 255)
    hole = (width // 2, height // 2, width - 1, height - 1)
    if width > 1 and height > 1:
        ImageDraw.Draw(im).rectangle(hole, fill=(0, 0, 0))
        ImageDraw.Draw(opacity).rectangle(hole, fill=0)
    im.putalpha(opacity)
    return im


def distinct_frames(size: tuple[int, int], *, alpha: bool = False) -> list[Image.Image]:
    """Three frames that differ everywhere: the scene, magenta, the scene inverted."""
    first = scene(size, alpha=alpha)
    mode = first.mode
    inverted = ImageOps.invert(first.convert("RGB"))
    if alpha:
        inverted.putalpha(first.getchannel("A"))
    return [first, Image.new(mode, size, (*MAGENTA, 255)[: len(mode)]), inverted]


def av1_config(avif: bytes) -> tuple[int, str]:
    """(bit depth, chroma subsampling "444", "422", "420" or "400") of the colour image of
    ``avif``, from its first av1C box (the AV1 codec configuration)."""
    flags = avif[avif.index(b"av1C") + 6]  # after the type: marker/version, profile/level
    high_bitdepth, twelve_bit = flags >> 6 & 1, flags >> 5 & 1
    monochrome, sub_x, sub_y = flags >> 4 & 1, flags >> 3 & 1, flags >> 2 & 1
    depth = 12 if twelve_bit else 10 if high_bitdepth else 8
    subsampling = (
        "400" if monochrome else {(0, 0): "444", (1, 0): "422", (1, 1): "420"}[sub_x, sub_y]
    )
    return depth, subsampling


# --- hostile bodies --------------------------------------------------------------------


@dataclass(frozen=True)
class Hostile:
    """A body that must end in an ``ImageFailure`` with ``status`` (default limits)."""

    name: str
    body: bytes
    status: str


def hostile_bodies(encoders: Encoders) -> list[Hostile]:
    """Truncated AVIF, ICO and animated WebP files, headers that claim huge images, random
    bytes behind an AVIF signature; made once per ``encoders`` session."""
    avif = encoders.avif("hostile-avif", [scene((333, 77), alpha=True)], depth=10, yuv="444")
    webp = encoders.animated_webp("hostile-webp", distinct_frames((200, 150)), lossy=True)
    many = encoders.avif("hostile-avif-many", many_frames(1000))
    sequence = encoders.avif("hostile-avif-sequence", distinct_frames((120, 80)))
    # ImageMagick writes the 256 px entry as PNG, the others as DIB.
    ico_png = encoders.ico("hostile-ico-png", [scene((s, s), alpha=True) for s in (16, 256, 48)])
    ico_dib = encoders.ico("hostile-ico-dib", [scene((s, s), alpha=True) for s in (16, 128, 48)])
    hostile = [
        Hostile("avif-cut-in-ftyp", avif[:11], UNIDENTIFIED),
        *_cuts("avif", avif, [12, 100, len(avif) // 2, len(avif) - 1], DECODE),
        *_cuts("webp-animated", webp, [40, len(webp) // 2, len(webp) - 1], DECODE),
        *_cuts("avif-1000-frames", many, [len(many) // 2], DECODE),
        Hostile("ico-cut-in-directory", ico_png[:30], UNIDENTIFIED),
        # A PNG cut after its signature does not parse: Pillow's verdict is that no
        # format took the file; a DIB's header cut short is a truncated read.
        *_ico_entry_cuts("ico-png", ico_png, in_header=UNIDENTIFIED),
        *_ico_entry_cuts("ico-dib", ico_dib, in_header=DECODE),
        # The directory lists 256x256; the entry's own PNG header says otherwise.
        Hostile("ico-png-entry-100000x100000", ico_file([png_header(100_000, 100_000)]), BOMB),
        # Over the kernel's limit but under twice Pillow's: Pillow alone would decode it.
        Hostile("ico-png-entry-10000x10000", ico_file([bilevel_png(10_000, 10_000)]), BOMB),
        Hostile("ico-dib-entry-20000x20000", ico_file([dib_header(20_000, 20_000)]), BOMB),
        Hostile("ico-65535-entries", _ico_directory(65_535) + bytes(40), UNIDENTIFIED),
        Hostile("ico-entry-past-the-end", _ico_directory(1, offset=1 << 30), DECODE),
        Hostile("avif-ispe-12000x12000", with_ispe(avif, 12_000, 12_000), BOMB),
        # Over twice Pillow's own limit: Image.open refuses it.
        Hostile("avif-ispe-15000x15000", with_ispe(avif, 15_000, 15_000), BOMB),
        # Pillow divides each frame's time by it.
        Hostile("avif-sequence-timescale-0", with_timescale(sequence, 0), DECODE),
        # Over libavif's own limit (16384 x 16384 pixels): it refuses to parse the file.
        Hostile("avif-ispe-20000x20000", with_ispe(avif, 20_000, 20_000), DECODE),
        Hostile("avif-ftyp-then-random", _ftyp(b"avif") + _random("avif", 5000), DECODE),
        # HEIF's brand: Pillow tries it as AVIF, but it is as often HEIC, not read here.
        Hostile("heif-ftyp-then-random", _ftyp(b"mif1") + _random("mif1", 5000), UNIDENTIFIED),
    ]
    names = [h.name for h in hostile]
    assert len(names) == len(set(names)), "hostile names must be unique"
    return hostile


def many_frames(count: int, size: tuple[int, int] = (64, 48)) -> list[Image.Image]:
    """``count`` small frames: magenta first, then a different flat colour each."""
    colours = [(i * 37 % 256, i * 91 % 256, i * 13 % 256) for i in range(1, count)]
    return [Image.new("RGB", size, colour) for colour in [MAGENTA, *colours]]


def with_ispe(avif: bytes, width: int, height: int) -> bytes:
    """``avif`` with its first ispe box (the image's stated size) saying width x height."""
    start = avif.index(b"ispe") + 8  # after the type, version and flags
    return avif[:start] + struct.pack(">II", width, height) + avif[start + 8 :]


@dataclass(frozen=True)
class IcoEntry:
    """One entry of an ICO's directory: its stated size in pixels, where its data is."""

    width: int
    height: int
    offset: int
    size: int


def with_timescale(avif: bytes, timescale: int) -> bytes:
    """The image sequence ``avif`` with its track's timescale (ticks a second) set."""
    start = avif.index(b"mdhd") + 4
    version = avif[start]
    start += 4 + (16 if version == 1 else 8)  # version, flags, creation and modification
    return avif[:start] + struct.pack(">I", timescale) + avif[start + 4 :]


def ico_entries(ico: bytes) -> list[IcoEntry]:
    """The entries of ``ico``'s directory, in its order."""
    (count,) = struct.unpack_from("<H", ico, 4)
    entries = []
    for i in range(count):
        width, height, *_, size, offset = struct.unpack_from("<BBBBHHII", ico, 6 + 16 * i)
        entries.append(IcoEntry(width or 256, height or 256, offset, size))
    return entries


def _cuts(name: str, body: bytes, cuts: list[int], status: str) -> list[Hostile]:
    return [Hostile(f"{name}-cut-at-{cut}-of-{len(body)}", body[:cut], status) for cut in cuts]


def _ico_entry_cuts(name: str, ico: bytes, in_header: str) -> list[Hostile]:
    """Cuts at the start of the entry Pillow decodes (the largest), in its header, which
    fails with ``in_header``, and in its pixels."""
    largest = max(ico_entries(ico), key=lambda entry: entry.width * entry.height)
    offset, size = largest.offset, largest.size
    return [
        *_cuts(name, ico, [offset], DECODE),
        *_cuts(name, ico, [offset + 8], in_header),
        *_cuts(name, ico, [offset + size // 2, offset + size * 9 // 10], DECODE),
    ]


def _ico_directory(count: int, offset: int = 0) -> bytes:
    entry = struct.pack("<BBBBHHII", 0, 0, 0, 0, 1, 32, 0, offset)
    return struct.pack("<HHH", 0, 1, count) + entry * min(count, 1)


def ico_file(entries: list[bytes]) -> bytes:
    """An ICO whose directory lists each of ``entries`` as 256x256, 32 bits a pixel."""
    offset = 6 + 16 * len(entries)
    directory = struct.pack("<HHH", 0, 1, len(entries))
    for data in entries:
        directory += struct.pack("<BBBBHHII", 0, 0, 0, 0, 1, 32, len(data), offset)
        offset += len(data)
    return directory + b"".join(entries)


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def png_header(width: int, height: int) -> bytes:
    """A PNG signature and header for an RGBA image of width x height, and no pixels."""
    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IEND", b"")


def dib_header(width: int, height: int) -> bytes:
    """A 32-bit BITMAPINFOHEADER as an ICO entry has it (height doubled for the mask)."""
    return struct.pack("<IiiHHIIiiII", 40, width, height * 2, 1, 32, 0, 0, 0, 0, 0, 0)


def _ftyp(brand: bytes) -> bytes:
    return struct.pack(">I", 24) + b"ftyp" + brand + bytes(4) + brand + b"miaf"


def _random(seed: str, size: int) -> bytes:
    return random.Random(seed).randbytes(size)
