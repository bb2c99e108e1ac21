"""The size of the image Pillow decodes from an ICO, read from headers alone.

An ICO's directory gives each entry's size in one byte a side (0 for 256), but an entry
is a PNG or a BMP (DIB) with a header of its own, and that header is what Pillow decodes:
an entry listed as 256x256 may hold a PNG of 10000x10000. Pillow also decodes the
largest entry inside ``Image.open``, before ``im.size`` can be compared with any limit,
and checks it only against its own global limit (and raises only over twice that). So
the kernel reads the size here, from the same headers Pillow will read, and applies its
pixel limit before opening an ICO.
"""

from __future__ import annotations

import os
import struct
from typing import IO

from PIL import BmpImagePlugin, IcoImagePlugin, PngImagePlugin

ICO_MAGIC = b"\x00\x00\x01\x00"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# What the header parsers raise on a short or malformed ICO (Pillow's image classes turn
# their own IndexError, KeyError and struct.error into SyntaxError; its ICO directory
# reader does not).
_HEADER_ERRORS = (SyntaxError, OSError, ValueError, EOFError, IndexError, struct.error)


def decoded_size(fp: IO[bytes]) -> tuple[int, int] | None:
    """The (width, height) in pixels that Pillow decodes from the ICO in ``fp``, or None
    when ``fp`` holds no ICO or its headers do not parse (``Image.open`` then gives its
    own verdict). Reads headers only; leaves ``fp`` at its start.

    Pillow decodes the first entry of its own ordering (the largest), with the size its
    PNG header states, or for a DIB its header's width and half its height (a DIB in an
    ICO stacks the colour image and its 1-bit mask).

    Raises OSError when that entry starts past the end of ``fp`` (a file cut short):
    Pillow would seek there, which a file allows and a memory map (how the pool's
    processes see a body) refuses, so the two would give different verdicts.
    """
    try:
        if fp.read(len(ICO_MAGIC)) != ICO_MAGIC:
            return None
        fp.seek(0)
        offset = IcoImagePlugin.IcoFile(fp).entry[0].offset
        fp.seek(0, os.SEEK_END)
        length = fp.tell()
        if offset < length:
            return _entry_size(fp, offset)
    except _HEADER_ERRORS:
        return None
    finally:
        fp.seek(0)
    raise OSError(f"the ICO's largest entry starts at byte {offset}, past its end ({length})")


def _entry_size(fp: IO[bytes], offset: int) -> tuple[int, int]:
    fp.seek(offset)
    is_png = fp.read(len(_PNG_MAGIC)) == _PNG_MAGIC
    fp.seek(offset)
    if is_png:
        return PngImagePlugin.PngImageFile(fp).size
    width, height = BmpImagePlugin.DibImageFile(fp).size
    return width, height // 2
