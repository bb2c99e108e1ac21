"""Thumbnails to a local folder: the store of a crawl on one machine (``image-crawler up``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from pathlib import Path

from worker.sinks.base import DependencyError


class LocalThumbnailStore:
    """Thumbnails as files ``{directory}/{key}``, for a crawl on one machine.

    Each write goes to a temporary file in the same folder and is renamed over the target
    (``os.replace``), so a reader never sees half a thumbnail and writing twice is
    harmless. The file system calls run in a thread, off the event loop.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    async def put(self, key: str, data: bytes) -> None:
        try:
            await asyncio.to_thread(self._write, key, data)
        except OSError as e:
            raise DependencyError("local_store", e) from e

    def _write(self, key: str, data: bytes) -> None:
        target = self.directory / key
        if target.parent != self.directory or key in ("", ".", ".."):
            # Keys are `{uuid}.jpg`; anything naming another folder is a bug upstream.
            raise ValueError(f"thumbnail key is not a plain file name: {key!r}")
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=f".{key}.", suffix=".tmp", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(temp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
