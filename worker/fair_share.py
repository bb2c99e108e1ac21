"""Fair sharing of a worker's task slots among sources. Pure policy."""

from __future__ import annotations

import math


def fair_share(max_tasks: int, num_sources: int) -> int:
    """Task slots one source may hold: ``min(floor(max_tasks / n), max_tasks / 4)``.

    A source never gets more than a quarter of the worker, so the first sources seen do not
    take every slot; and never fewer than one, so a worker with more sources than slots
    still makes progress on each (rounded down, that share would be zero).
    """
    if num_sources <= 0:
        return 0
    share = min(math.floor(max_tasks / num_sources), math.floor(max_tasks / 4))
    return max(1, share)


def resume_threshold(share: int) -> int:
    """A source paused at ``share`` unfinished messages is resumed at this many or fewer:
    half its share free (rounded up, at least one slot), so that one resume fetches
    several messages rather than one."""
    return share - max(1, (share + 1) // 2)
