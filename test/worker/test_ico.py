"""The size Pillow decodes from an ICO, read from its headers (worker/images/ico.py)."""

from __future__ import annotations

import io
import mmap
import os

import pytest
from PIL import Image

from test.harness.real_images import dib_header, ico_entries, ico_file, png_header
from worker.images.ico import decoded_size


def _pillow_ico(sizes: list[tuple[int, int]]) -> bytes:
    out = io.BytesIO()
    Image.new("RGBA", max(sizes), (10, 20, 30, 255)).save(out, "ICO", sizes=sizes)
    return out.getvalue()


def _png(size: tuple[int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (10, 20, 30)).save(out, "PNG")
    return out.getvalue()


@pytest.mark.parametrize(
    ("body", "size"),
    [
        (_pillow_ico([(16, 16), (48, 48), (32, 32)]), (48, 48)),
        (_pillow_ico([(256, 256), (16, 16)]), (256, 256)),
        # The directory says 256x256; the entries' own headers are what Pillow decodes.
        (ico_file([_png((300, 20))]), (300, 20)),
        (ico_file([png_header(100_000, 3)]), (100_000, 3)),
        # A DIB in an ICO stacks the image and its mask: the header's height is doubled.
        (ico_file([dib_header(40, 30)]), (40, 30)),
        (ico_file([dib_header(20_000, 20_001)]), (20_000, 20_001)),
    ],
    ids=["pillow", "pillow-256", "png-300x20", "png-100000x3", "dib-40x30", "dib-huge"],
)
def test_the_size_of_the_entry_pillow_decodes(body: bytes, size: tuple[int, int]) -> None:
    fp = io.BytesIO(body)
    assert decoded_size(fp) == size
    assert fp.tell() == 0


def test_it_is_the_size_pillow_gives() -> None:
    # Every entry is listed as 256x256 (32 bits a pixel): Pillow takes the first listed,
    # whatever the entries' own headers say.
    body = ico_file([_png((60, 40)), _png((300, 20)), _png((16, 16))])
    with (
        pytest.warns(UserWarning, match="not the expected size"),
        Image.open(io.BytesIO(body)) as im,
    ):
        assert decoded_size(io.BytesIO(body)) == im.size == (60, 40)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        _png((16, 16)),
        _pillow_ico([(16, 16)])[:10],  # the directory cut short
        ico_file([b"\x89PNG\r\n\x1a\n"]),  # an entry that stops after its signature
        ico_file([b"nothing like an image header"]),
    ],
    ids=["empty", "a-png", "cut-directory", "cut-png", "garbage-entry"],
)
def test_none_for_what_is_not_an_ico_or_does_not_parse(body: bytes) -> None:
    fp = io.BytesIO(body)
    assert decoded_size(fp) is None
    assert fp.tell() == 0


def test_an_entry_past_the_end_is_an_error_on_a_file_and_on_a_map() -> None:
    # Pillow would seek to it: a file allows that (and reads nothing), a map refuses.
    body = _pillow_ico([(16, 16), (32, 32)])
    largest = max(ico_entries(body), key=lambda entry: entry.width)
    cut = body[: largest.offset]
    fd = os.memfd_create("test-ico")
    try:
        os.write(fd, cut)
        with mmap.mmap(fd, len(cut), access=mmap.ACCESS_READ) as mapped:
            for fp in (io.BytesIO(cut), mapped):
                with pytest.raises(OSError, match="past its end"):
                    decoded_size(fp)
                assert fp.tell() == 0
    finally:
        os.close(fd)
