"""One stack per data folder: a lock that its processes hold as long as any of them lives.

Two stacks on one folder would have two redis-servers appending to one file and two
SeaweedFS servers writing one broker's volumes. ``DataDirLock`` is an exclusive
``flock`` on ``DATA/.lock``; the stack's children inherit its descriptor, so a stack
whose ``up`` was SIGKILLed, leaving its children running, still holds the folder until
they are gone too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from crawlctl.localstack.processes import ServiceError


class DataDirInUse(ServiceError):
    """Another stack (or what is left of one) holds the data folder."""


class DataDirLock:
    """``acquire()`` or raise ``DataDirInUse``; ``fd`` is the descriptor to pass to children."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / ".lock"
        self.fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise DataDirInUse(
                f"the data folder {self.path.parent} is in use by another local stack "
                f"(started by pid {holder}; if that one was killed, processes it started "
                f"still run: `fuser -v {self.path}` lists them)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd

    def release(self) -> None:
        """Close this process's descriptor; the lock is free once no child holds it. Idempotent."""
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
