import io
import json
import random
import warnings
from fractions import Fraction
from typing import Any

import pytest
from PIL import Image
from PIL.TiffImagePlugin import IFDRational

from worker.images.exif import ExifLimits, exif_to_json

_COMPACT = (",", ":")


def _round_trip(exif: Image.Exif, fmt: str = "JPEG") -> Image.Exif:
    """Write `exif` into a small image and read it back, as the crawler sees it.

    JPEG holds at most 64 KB of EXIF; PNG has no such limit.
    """
    out = io.BytesIO()
    Image.new("RGB", (8, 8)).save(out, fmt, exif=exif)
    with Image.open(out) as im:
        return im.getexif()


def _single(tag: int, value: Any) -> Image.Exif:
    exif = Image.Exif()
    exif[tag] = value
    return exif


class _Odd:
    def __str__(self) -> str:
        return "odd" * 1000


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("Alden Page", "Alden Page"),
        ("padded\x00\x00\x00", "padded"),
        ("in\x00side", "inside"),
        ("lone \udc80 surrogate", "lone  surrogate"),
        ("Jürgen ☃", "Jürgen ☃"),
        (7, 7),
        (True, True),
        (1.5, 1.5),
        (float("nan"), None),
        (float("inf"), None),
        (IFDRational(1, 250), 0.004),
        (IFDRational(0, 0), None),
        (IFDRational(5, 0), None),
        (Fraction(1, 4), 0.25),
        ((1, 2, 3), [1, 2, 3]),
        ([IFDRational(1, 2), 3, "x"], [0.5, 3, "x"]),
        (b"0230", "0230"),
        (b"text\x00\x00", "text"),
        ("café".encode(), "café"),
        (b"", ""),
        (b"\x00", "hex:00"),
        (b"\x01\x02\x03\x00", "hex:01020300"),
        (b"\xff\xfe", "hex:fffe"),
        (b"line\nbreak\ttab", "line\nbreak\ttab"),
        ({1: "a", 0x9003: (1, 2)}, {"0x1": "a", "0x9003": [1, 2]}),
        (None, None),
        (_Odd(), "odd" * 66 + "od"),
    ],
)
def test_value_conversion(value: Any, expected: Any) -> None:
    assert exif_to_json(_single(0xC000, value)) == {"0xc000": expected}


@pytest.mark.parametrize(
    ("tag", "raw", "expected"),
    [
        (0x9286, b"ASCII\x00\x00\x00Shot on a tripod", "Shot on a tripod"),
        (0x9286, b"ASCII\x00\x00\x00padded   \x00\x00", "padded"),
        (0x9286, b"ASCII\x00\x00\x00" + b"\x00" * 20, ""),
        (0x9286, b"\x00" * 8 + b"undefined code", "undefined code"),
        (0x9286, b"UNICODE\x00\xff\xfe" + "bom ☃".encode("utf-16-le"), "bom ☃"),
        (0x9286, b"JIS\x00\x00\x00\x00\x00\x1b$B", "hex:4a495300000000001b2442"),
        (0x9C9B, "Titel".encode("utf-16-le") + b"\x00\x00", "Titel"),
        (0x9C9F, "☃".encode("utf-16-le"), "☃"),
    ],
)
def test_text_tags(tag: int, raw: bytes, expected: str) -> None:
    assert exif_to_json(_single(tag, raw))[hex(tag)] == expected


def test_shape_like_getexif() -> None:
    exif = Image.Exif()
    exif[0x013B] = "Alden Page"
    exif[0x011A] = IFDRational(72, 1)
    sub = exif.get_ifd(0x8769)
    sub[0x9003] = "2024:01:02 03:04:05"
    sub[0x9209] = 0
    sub[0x829A] = IFDRational(1, 125)
    sub[0xA005] = {0x1: "R98"}
    gps = exif.get_ifd(0x8825)
    gps[0x1] = "N"
    gps[0x2] = (IFDRational(52, 1), IFDRational(22, 1), IFDRational(61, 2))

    result = exif_to_json(_round_trip(exif))

    assert result == {
        "0x11a": 72.0,
        "0x13b": "Alden Page",
        "0x829a": 0.008,
        "0x9003": "2024:01:02 03:04:05",
        "0x9209": 0,
        "0x8825": {"0x1": "N", "0x2": [52.0, 22.0, 30.5]},
        "0xa005": {"0x1": "R98"},
    }
    assert "0x8769" not in result  # pointers are not values


def test_empty_exif() -> None:
    assert exif_to_json(Image.Exif()) == {}
    assert exif_to_json(_round_trip(Image.Exif())) == {}


def test_exif_ifd_wins_over_ifd0_like_pillow() -> None:
    exif = Image.Exif()
    exif[0x9003] = "from IFD0"
    exif.get_ifd(0x8769)[0x9003] = "from Exif IFD"
    assert exif_to_json(_round_trip(exif))["0x9003"] == "from Exif IFD"


@pytest.mark.parametrize(
    ("size", "kept"),
    [(100, True), (4000, True), (4095, False), (100_000, False)],
)
def test_value_cap(size: int, kept: bool) -> None:
    # A str of n ASCII characters encodes to n + 2 bytes of JSON.
    exif = Image.Exif()
    exif[0x013B] = "Alden Page"
    exif.get_ifd(0x8769)[0x927C] = b"a" * size
    result = exif_to_json(_round_trip(exif, "PNG"))
    assert ("0x927c" in result) is kept
    assert result["0x13b"] == "Alden Page"


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_binary_makernote_is_dropped_not_hexed(fmt: str) -> None:
    exif = Image.Exif()
    exif[0x013B] = "Alden Page"  # Pillow's PNG writer skips an Exif whose IFD0 is empty
    exif.get_ifd(0x8769)[0x927C] = random.Random(0).randbytes(60_000)
    exif.get_ifd(0x8769)[0x9209] = 0
    assert exif_to_json(_round_trip(exif, fmt)) == {"0x13b": "Alden Page", "0x9209": 0}


@pytest.mark.parametrize(
    ("max_value_bytes", "max_total_bytes"),
    [(4096, 65536), (64, 65536), (4096, 300), (4096, 2), (1, 1000), (200, 50)],
)
def test_caps_hold(max_value_bytes: int, max_total_bytes: int) -> None:
    exif = Image.Exif()
    for index in range(40):
        exif[0xC000 + index] = f"value {index} " * (index * 3)
    exif.get_ifd(0x8769)[0x9209] = 0
    gps = exif.get_ifd(0x8825)
    for index in range(10):
        gps[0x100 + index] = "G" * (index * 20)  # ids unknown to Pillow: typed by value
    limits = ExifLimits(max_value_bytes=max_value_bytes, max_total_bytes=max_total_bytes)

    result = exif_to_json(_round_trip(exif), limits)

    assert len(json.dumps(result, separators=_COMPACT)) <= max_total_bytes
    for key, value in result.items():
        values = value.values() if key == "0x8825" else [value]
        for item in values:
            assert len(json.dumps(item, separators=_COMPACT)) <= max_value_bytes


def test_total_cap_skips_big_tags_but_keeps_small_later_ones() -> None:
    exif = Image.Exif()
    exif[0xC000] = "x" * 3000
    exif[0xC001] = "y" * 3000
    exif[0xC002] = "z"
    result = exif_to_json(exif, ExifLimits(max_total_bytes=4000))
    assert result == {"0xc000": "x" * 3000, "0xc002": "z"}


@pytest.mark.parametrize("seed", range(25))
def test_corrupt_exif_never_raises(seed: int) -> None:
    exif = Image.Exif()
    exif[0x013B] = "Alden Page"
    exif[0x011A] = IFDRational(300, 1)
    sub = exif.get_ifd(0x8769)
    sub[0x829A] = IFDRational(1, 250)
    sub[0x9286] = b"ASCII\x00\x00\x00comment"
    sub[0x927C] = bytes(range(256)) * 2
    sub[0xA005] = {0x1: "R98"}
    exif.get_ifd(0x8825)[0x2] = (IFDRational(1, 1), IFDRational(2, 1), IFDRational(3, 1))
    blob = bytearray(exif.tobytes())
    rng = random.Random(seed)
    for _ in range(40):
        mutated = bytearray(blob)
        for _ in range(rng.randint(1, 6)):
            mutated[rng.randrange(14, min(len(mutated), 400))] = rng.randrange(256)
        corrupt = Image.Exif()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # Pillow's own complaints on load
            corrupt.load(bytes(mutated))  # the TIFF header is intact, so this parses
        result = exif_to_json(corrupt)
        json.dumps(result, allow_nan=False)


@pytest.mark.parametrize(("max_value_bytes", "max_total_bytes"), [(0, 100), (10, 1), (-1, -1)])
def test_limits_validate(max_value_bytes: int, max_total_bytes: int) -> None:
    with pytest.raises(ValueError, match="ExifLimits"):
        ExifLimits(max_value_bytes=max_value_bytes, max_total_bytes=max_total_bytes)
