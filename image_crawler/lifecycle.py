"""The process lifecycle ``python -m crawl_monitor`` and ``python -m worker`` share.

Settings come from the environment (a bad value exits 2 with the variable named, before
anything starts); logs go to stdout as JSON; SIGTERM and SIGINT set the stop event the
process's ``run`` watches, so both stop the same way.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Protocol, TypeVar

from aiokafka.errors import KafkaError

from image_crawler.config import ConfigError, DeprecatedSetting, log_deprecated
from image_crawler.logs import configure_logging, get_logger
from image_crawler.retry import Backoff, sleep_unless_stopped

log = get_logger(__name__)

# Waits between tries to start a Kafka client (``image_crawler.retry.Backoff``).
KAFKA_MIN_BACKOFF_S = 0.5
KAFKA_MAX_BACKOFF_S = 10.0


class _Settings(Protocol):
    @property
    def log_level(self) -> str: ...

    @property
    def deprecated(self) -> tuple[DeprecatedSetting, ...]: ...


S = TypeVar("S", bound=_Settings)


async def _serve(
    name: str,
    load_settings: Callable[[], S],
    run: Callable[[S, asyncio.Event], Awaitable[int | None]],
) -> int:
    try:
        settings = load_settings()
    except ConfigError as e:
        print(f"{name}: configuration error: {e}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    log_deprecated(settings.deprecated)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return (await run(settings, stop)) or 0


def serve(
    name: str,
    load_settings: Callable[[], S],
    run: Callable[[S, asyncio.Event], Awaitable[int | None]],
) -> None:
    """Run a process until SIGTERM/SIGINT; exits with ``run``'s status (0 when None)."""
    sys.exit(asyncio.run(_serve(name, load_settings, run)))


async def start_kafka_clients(
    starts: Sequence[tuple[str, Callable[[], Awaitable[None]]]], stop: asyncio.Event
) -> bool:
    """Start each Kafka client in turn, retrying while Kafka is away (``kafka_unavailable``).

    Returns False if ``stop`` was set first. Register each client's ``stop`` before
    calling this, so a half-started set is closed either way.
    """
    for name, start in starts:
        backoff = Backoff(base_s=KAFKA_MIN_BACKOFF_S, cap_s=KAFKA_MAX_BACKOFF_S)
        while True:
            if stop.is_set():
                return False
            try:
                await start()
                break
            except KafkaError as e:
                log.warning("kafka_unavailable", op=f"start_{name}", error=repr(e))
                await sleep_unless_stopped(stop, backoff.next_s())
    return True


# Stopping asyncio tasks for certain, on a Python that can lose a cancellation.
#
# On Python 3.11, ``asyncio.wait_for`` returns normally when the task running it is
# cancelled in the same loop iteration in which the awaited operation completes
# (CPython gh-86296, fixed in 3.12 by rewriting ``wait_for`` on ``asyncio.timeout``).
# redis-py wraps every socket write in ``wait_for``, so a loop that talks to Redis can
# swallow the one ``cancel()`` meant to stop it and run on forever, as the test suite saw.
# ``cancel_and_wait`` cancels again until the tasks are done.

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
