"""What ``python -m crawl_monitor`` and ``python -m worker`` share at the process boundary.

Settings come from the environment (a bad value exits 2 with the variable named, before
anything starts); logs go to stdout as JSON; SIGTERM and SIGINT set the stop event the
process's ``run`` watches, so both stop the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from aiokafka.errors import KafkaError

from image_crawler.config import ConfigError
from image_crawler.logs import configure_logging, get_logger

log = get_logger(__name__)

KAFKA_MAX_BACKOFF_S = 10.0


class _Settings(Protocol):
    @property
    def log_level(self) -> str: ...


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
        backoff_s = 0.5
        while True:
            if stop.is_set():
                return False
            try:
                await start()
                break
            except KafkaError as e:
                log.warning("kafka_unavailable", op=f"start_{name}", error=repr(e))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), backoff_s)
                backoff_s = min(backoff_s * 2, KAFKA_MAX_BACKOFF_S)
    return True
