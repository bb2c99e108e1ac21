"""A bound on the bytes of downloaded bodies a worker holds at once.

Task slots alone do not bound memory: thousands of slots, each holding a body of a few
megabytes while it waits for the image pool, add up to gigabytes. Each body takes its
size from this budget (the fetcher takes an estimate before the request and the rest as
the body turns out larger) and gives it back once its message is finished, so a full
budget stops downloads rather than growing the process.
"""

from __future__ import annotations

import asyncio
from collections import deque


class ByteBudget:
    """``limit`` bytes shared first come, first served.

    A request larger than the whole budget is granted the whole budget, once nothing else
    holds any of it: one huge body is read alone instead of never.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the byte budget must be >= 1, got {limit}")
        self.limit = limit
        self.used = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def waiting(self) -> int:
        """How many requests wait for bytes."""
        return len(self._waiters)

    async def acquire(self, size: int) -> int:
        """Wait until ``size`` bytes are free and take them; returns what was taken."""
        size = min(max(size, 0), self.limit)
        if not self._waiters and self.used + size <= self.limit:
            self.used += size
            return size
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append((size, waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(size)  # granted as it was cancelled: give it straight back
            else:
                self._waiters.remove((size, waiter))
                self._wake()  # a smaller request behind this one may fit now
            raise
        return size

    def take(self, size: int) -> int:
        """Take ``size`` bytes now, even past the limit (a body outgrowing what it
        declared: waiting here, holding bytes, could deadlock with another such body).
        New requests wait until the overdraft is given back."""
        size = max(size, 0)
        self.used += size
        return size

    def release(self, size: int) -> None:
        self.used -= size
        if self.used < 0:
            raise RuntimeError(f"released more than was taken ({self.used} bytes in use)")
        self._wake()

    def _wake(self) -> None:
        # In order: a request that does not fit yet holds back the ones behind it, so a
        # large body is not starved by a stream of small ones.
        while self._waiters:
            size, waiter = self._waiters[0]
            if self.used + size > self.limit:
                return
            self._waiters.popleft()
            self.used += size
            waiter.set_result(None)
