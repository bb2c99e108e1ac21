"""EXIF as plain, size-capped JSON for the `image_metadata_updates` message."""

from __future__ import annotations

import json
import math
import numbers
import struct
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from PIL import Image

# The tags of IFD0 that point to the Exif and GPS sub-IFDs.
EXIF_IFD = 0x8769
GPS_IFD = 0x8825
_INTEROP_IFD = 0xA005
_POINTERS = frozenset({EXIF_IFD, GPS_IFD, _INTEROP_IFD})
_USER_COMMENT = 0x9286
# Windows' XPTitle, XPComment, XPAuthor, XPKeywords, XPSubject: UTF-16LE in BYTE tags.
_XP_TAGS = frozenset(range(0x9C9B, 0x9CA0))

# Errors Pillow raises while lazily decoding tags of a corrupt EXIF block (bad offsets,
# impossible counts, wrong types). Anything else is a bug and propagates.
_TAG_ERRORS = (
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    ArithmeticError,
    OSError,
    SyntaxError,
    struct.error,
)

_UNKNOWN_TYPE_MAX_CHARS = 200
_MAX_DEPTH = 4
# What `json.dumps(value, allow_nan=False, separators=(",", ":"))` would build for every
# tag, made once: building it cost 0.6 us a tag, about 13 us an EXIF block of 20 tags.
_COMPACT_JSON = json.JSONEncoder(allow_nan=False, separators=(",", ":"))
_PRINTABLE_WHITESPACE = str.maketrans("", "", "\t\n\r")


@dataclass(frozen=True, slots=True)
class ExifLimits:
    """Size caps, in bytes of compact JSON (`json.dumps(..., separators=(",", ":"))`).

    `max_value_bytes` applies to each tag's value (a nested IFD's tags are capped one by
    one); a larger value is dropped. `max_total_bytes` caps the whole object; tags that
    would push it over are skipped.
    """

    max_value_bytes: int = 4096
    max_total_bytes: int = 65536

    def __post_init__(self) -> None:
        if self.max_value_bytes < 1 or self.max_total_bytes < 2:
            raise ValueError(
                "ExifLimits needs max_value_bytes >= 1 and max_total_bytes >= 2, got "
                f"{self.max_value_bytes} and {self.max_total_bytes}"
            )


def exif_to_json(exif: Image.Exif, limits: ExifLimits = ExifLimits()) -> dict[str, Any]:
    """Convert Pillow EXIF to plain JSON, shaped like Pillow's `_getexif()`.

    Keys are lower-case hex tag ids (`"0x13b"`). IFD0 and the Exif sub-IFD share the top
    level; the GPS and Interop IFDs are nested objects under `"0x8825"` and `"0xa005"`;
    the pointer integers themselves are left out. Values, recursively:

    - str: trailing NULs stripped, other NULs and lone surrogates removed;
    - int and bool as they are; float, and IFDRational as float, with NaN, infinities
      and zero denominators as null;
    - bytes: text when, with trailing NULs stripped, they are non-empty printable UTF-8
      (empty bytes give ""); otherwise `"hex:"` and the lower-case hex of all the bytes.
      UserComment (0x9286) is decoded by its 8-byte character-code prefix and the XP*
      tags (0x9c9b..0x9c9f) as UTF-16LE, falling back to the same rule;
    - tuples and lists as lists, dicts as objects with hex keys;
    - anything else as `str(value)`, cut at 200 characters.

    Never raises on odd or corrupt data: unreadable tags and IFDs are skipped. The result
    always survives `json.dumps(result, allow_nan=False)`. Pure apart from Pillow's lazy
    decoding inside `exif`; Pillow's warnings about corrupt tags are suppressed.
    """
    with warnings.catch_warnings():
        # Pillow warns, then skips, when a tag points outside the block; skipping is right.
        warnings.simplefilter("ignore", UserWarning)
        top = _read_tags(exif)
        top.update(_read_tags(_read_ifd(exif, EXIF_IFD)))
        gps = _read_tags(_read_ifd(exif, GPS_IFD))
        interop = _read_tags(_read_ifd(exif, _INTEROP_IFD))

    packer = _Packer(limits, exif.endian)
    result: dict[str, Any] = {}
    for tag, value in top.items():
        packer.add(result, tag, value)
    for tag, ifd in ((GPS_IFD, gps), (_INTEROP_IFD, interop)):
        if ifd:
            packer.add_nested(result, tag, ifd)
    return result


def _read_tags(ifd: Mapping[int, Any]) -> dict[int, Any]:
    """Decode each tag of one IFD, sorted by id, leaving out pointers and broken tags."""
    tags: dict[int, Any] = {}
    try:
        ids = sorted(tag for tag in ifd if isinstance(tag, int) and tag not in _POINTERS)
    except _TAG_ERRORS:
        return tags
    for tag in ids:
        try:
            tags[tag] = ifd[tag]
        except _TAG_ERRORS:
            continue
    return tags


def _read_ifd(exif: Image.Exif, tag: int) -> Mapping[int, Any]:
    try:
        pointer = exif.get(tag) if tag != _INTEROP_IFD else None
        if isinstance(pointer, dict):
            # An Exif built in code may hold the sub-IFD itself instead of an offset.
            return pointer
        return exif.get_ifd(tag)
    except _TAG_ERRORS:
        return {}


class _Packer:
    """Adds converted tags to a result while keeping both size caps."""

    def __init__(self, limits: ExifLimits, endian: str | None) -> None:
        self._limits = limits
        self._endian = endian
        self._total = 2  # the enclosing "{}"

    def add(self, target: dict[str, Any], tag: int, value: Any) -> None:
        encoded = self._encode(tag, value)
        if encoded is None:
            return
        key, converted, size = encoded
        if self._total + size > self._limits.max_total_bytes:
            return
        self._total += size
        target[key] = converted

    def add_nested(self, target: dict[str, Any], tag: int, ifd: Mapping[int, Any]) -> None:
        # '"0x8825":{}' plus a comma, paid only if at least one entry fits.
        overhead = len(hex(tag)) + 6
        if self._total + overhead > self._limits.max_total_bytes:
            return
        self._total += overhead
        nested: dict[str, Any] = {}
        for sub_tag, value in ifd.items():
            self.add(nested, sub_tag, value)
        if nested:
            target[hex(tag)] = nested
        else:
            self._total -= overhead

    def _encode(self, tag: int, value: Any) -> tuple[str, Any, int] | None:
        """The key, the JSON value and its cost in the total, or None if it is too big."""
        cap = self._limits.max_value_bytes
        if _min_json_size(value) > cap:
            return None  # never hex-encode a large MakerNote only to drop it
        converted = _convert(value, tag, self._endian, 0)
        size = len(_COMPACT_JSON.encode(converted))
        if size > cap:
            return None
        key = hex(tag)
        return key, converted, len(key) + size + 4  # quotes, colon and comma


def _min_json_size(value: Any) -> int:
    """A cheap lower bound of the JSON size of `value` once converted."""
    if isinstance(value, bytes | bytearray | memoryview | str):
        return len(value) + 2
    if isinstance(value, tuple | list | dict):
        return 2 * len(value) + 1
    return 1


def _convert(value: Any, tag: int | None, endian: str | None, depth: int) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, numbers.Rational):
        # IFDRational; Pillow keeps 0/0 and x/0 as NaN.
        if value.denominator == 0:
            return None
        number = float(value)
        return number if math.isfinite(number) else None
    if isinstance(value, str):
        return _clean_text(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return _bytes_to_json(bytes(value), tag, endian)
    if depth >= _MAX_DEPTH:
        return None
    if isinstance(value, tuple | list):
        return [_convert(item, None, endian, depth + 1) for item in value]
    if isinstance(value, dict):
        return {
            (hex(key) if isinstance(key, int) else _clean_text(str(key))): _convert(
                item, key if isinstance(key, int) else None, endian, depth + 1
            )
            for key, item in value.items()
        }
    if isinstance(value, numbers.Real):
        return _convert(float(value), tag, endian, depth)
    return _clean_text(str(value)[:_UNKNOWN_TYPE_MAX_CHARS])


def _clean_text(text: str) -> str:
    text = text.rstrip("\x00")
    if "\x00" in text:
        # JSON allows \u0000, but PostgreSQL's jsonb, where this ends up, rejects it.
        text = text.replace("\x00", "")
    if not text.isascii():
        text = text.encode("utf-8", "ignore").decode("utf-8")  # drops lone surrogates
    return text


def _bytes_to_json(raw: bytes, tag: int | None, endian: str | None) -> str:
    if not raw:
        return ""
    text: str | None = None
    if tag == _USER_COMMENT:
        text = _user_comment(raw, endian)
    elif tag in _XP_TAGS:
        text = _printable(_decode(raw, "utf-16-le"))
    if text is None:
        text = _printable(_decode(raw.rstrip(b"\x00"), "utf-8")) or None
    return text if text is not None else "hex:" + raw.hex()


def _user_comment(raw: bytes, endian: str | None) -> str | None:
    """Decode UserComment by its character code (Exif 2.3, section 4.6.5)."""
    code, body = raw[:8], raw[8:]
    if code == b"ASCII\x00\x00\x00" or code == b"\x00" * 8:
        text = _decode(body.rstrip(b"\x00 "), "utf-8")
    elif code == b"UNICODE\x00":
        if body[:2] in (b"\xff\xfe", b"\xfe\xff"):
            encoding = "utf-16"
        else:
            encoding = "utf-16-be" if endian == ">" else "utf-16-le"
        text = _decode(body, encoding)
        text = text.rstrip("\x00 ") if text is not None else None
    else:
        return None
    return _printable(text)


def _decode(raw: bytes, encoding: str) -> str | None:
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError:
        return None


def _printable(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.rstrip("\x00")
    if text.isprintable() or text.translate(_PRINTABLE_WHITESPACE).isprintable():
        return text
    return None
