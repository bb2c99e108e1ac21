"""Appending to files that a full disk must not leave half-written."""

from __future__ import annotations

import os

# How far back from a file's end a cut line is looked for, a read at a time.
_CHUNK = 64 * 1024


def append_whole(fd: int, data: bytes) -> None:
    """Append ``data`` to the file open on ``fd`` (``O_APPEND``) whole or not at all: when
    the disk refuses part of it, the file is cut back to where it was and the ``OSError``
    raised (cutting a file back needs no free space)."""
    size = os.fstat(fd).st_size
    written = 0
    try:
        while written < len(data):
            written += os.write(fd, data[written:])
    except OSError:
        os.ftruncate(fd, size)
        raise


def cut_to_last_line(fd: int) -> int:
    """Cut what follows the last newline of the file open on ``fd`` (a line a crash left
    unfinished); returns how many bytes were cut."""
    size = end = os.fstat(fd).st_size
    while end > 0:
        start = max(0, end - _CHUNK)
        newline = os.pread(fd, end - start, start).rfind(b"\n")
        if newline >= 0:
            end = start + newline + 1
            break
        end = start
    if end < size:
        os.ftruncate(fd, end)
    return size - end
