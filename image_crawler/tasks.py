"""Stopping asyncio tasks for certain, on a Python that can lose a cancellation.

On Python 3.11, ``asyncio.wait_for`` returns normally when the task running it is
cancelled in the same loop iteration in which the awaited operation completes
(CPython gh-86296, fixed in 3.12 by rewriting ``wait_for`` on ``asyncio.timeout``).
redis-py wraps every socket write in ``wait_for``, so a loop that talks to Redis can
swallow the one ``cancel()`` meant to stop it and run on forever; the test suite hit this
about once in six runs. ``cancel_and_wait`` cancels again until the tasks are done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

# Long enough for a cancelled task's own clean-up (a commit, a flush) to run undisturbed;
# a lost cancellation is retried after it.
RECANCEL_AFTER_S = 1.0


async def cancel_and_wait(
    tasks: Iterable[asyncio.Task[object]], *, recancel_after_s: float = RECANCEL_AFTER_S
) -> None:
    """Cancel ``tasks`` and return once every one of them is done.

    A task still running ``recancel_after_s`` after its cancellation is cancelled again.
    Like ``gather(return_exceptions=True)``, it raises nothing: a task's exception stays
    on the task, marked as retrieved.
    """
    tasks = list(tasks)
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=recancel_after_s)
    for task in tasks:
        if not task.cancelled():
            task.exception()
