"""Ctrl-C and SIGTERM in the ``image-crawler`` command.

Outside an event loop a signal raises ``KeyboardInterrupt`` where the command happens to
be (``signals_to(raise_interrupt)``); inside one, it sets an event the command's loop
watches (``loop_signals``), so that the loop ends its own way and cleans up.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, NoReturn


def raise_interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt


@contextlib.contextmanager
def signals_to(handler: Callable[[int, FrameType | None], Any]) -> Iterator[None]:
    """SIGINT and SIGTERM go to ``handler`` inside the block."""
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def loop_signals(stop: asyncio.Event) -> Iterator[None]:
    """Inside a running loop: SIGINT and SIGTERM set ``stop`` (then the old handlers)."""
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield
    finally:
        for sig, old in previous.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, old)
