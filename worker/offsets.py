"""At-least-once bookkeeping: which offset of a partition may be committed, and how many
messages the broker deleted before the group read them.

Messages of one partition finish out of order; the committed offset may only move past a
message once it and every message before it have finished.
"""

from __future__ import annotations

from collections import deque


class OffsetTracker:
    """Offsets of one partition taken for work, in the order they were taken."""

    __slots__ = ("_done", "_next_commit", "_order", "_unfinished")

    def __init__(self) -> None:
        self._order: deque[int] = deque()
        self._done: dict[int, bool] = {}
        self._next_commit: int | None = None
        self._unfinished = 0

    def __len__(self) -> int:
        """Offsets taken and not yet finished."""
        return self._unfinished

    def __contains__(self, offset: int) -> bool:
        return offset in self._done

    def start(self, offset: int) -> None:
        """Record that the message at ``offset`` was taken for work."""
        if offset in self._done:
            return
        if self._order and offset < self._order[-1]:
            raise ValueError(f"offset {offset} taken after {self._order[-1]}")
        self._order.append(offset)
        self._done[offset] = False
        self._unfinished += 1

    def finish(self, offset: int) -> None:
        """Record that the message at ``offset`` is finished (stored, published or recorded)."""
        if self._done.get(offset, True):
            return
        self._done[offset] = True
        self._unfinished -= 1
        while self._order and self._done[self._order[0]]:
            finished = self._order.popleft()
            del self._done[finished]
            self._next_commit = finished + 1

    def committable(self) -> int | None:
        """The offset to commit (the next message to read), or None if nothing finished yet."""
        return self._next_commit


def lost_before(next_offset: int | None, log_start: int) -> int:
    """Messages of a partition deleted unread: from ``next_offset``, the next one the
    group was to read (None or negative: it has none, and nothing can be said), up to
    ``log_start``, the first one the partition still holds."""
    if next_offset is None or next_offset < 0:
        return 0
    return max(0, log_start - next_offset)
