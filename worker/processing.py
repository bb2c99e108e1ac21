"""Running the image kernel off the event loop, in a pool of processes.

Decoding and thumbnailing are CPU work; done on the loop they would stall downloads,
Kafka heartbeats and token waits behind a large image.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Protocol

from image_crawler.logs import get_logger
from worker.image import DEFAULT_LIMITS, ImageFailure, ImageLimits, ProcessedImage, process_image

log = get_logger(__name__)

ImageOutcome = ProcessedImage | ImageFailure


class ImageProcessor(Protocol):
    async def process(self, body: bytes) -> ImageOutcome: ...


class InlineProcessor:
    """Processes on the calling thread: for unit tests and tools, not for the worker."""

    def __init__(self, limits: ImageLimits = DEFAULT_LIMITS) -> None:
        self._limits = limits

    async def process(self, body: bytes) -> ImageOutcome:
        return process_image(body, self._limits)


def _ignore_signals() -> None:
    # The parent decides when to stop; a Ctrl-C reaching the whole process group must not
    # kill pool processes mid-image.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class PoolProcessor:
    """A process pool running ``process_image``; rebuilt if a process dies."""

    def __init__(self, processes: int = 0, limits: ImageLimits = DEFAULT_LIMITS) -> None:
        self._processes = processes or os.cpu_count() or 1
        self._limits = limits
        self._executor = self._new_executor()

    def _new_executor(self) -> ProcessPoolExecutor:
        # forkserver: forking a process that runs an event loop and threads is unsafe.
        return ProcessPoolExecutor(
            max_workers=self._processes,
            mp_context=multiprocessing.get_context("forkserver"),
            initializer=_ignore_signals,
        )

    async def process(self, body: bytes) -> ImageOutcome:
        executor = self._executor
        try:
            return await asyncio.get_running_loop().run_in_executor(
                executor, process_image, body, self._limits
            )
        except BrokenProcessPool as e:
            if executor is self._executor:
                log.error("image_pool_broken", error=repr(e))
                executor.shutdown(wait=False, cancel_futures=True)
                self._executor = self._new_executor()
            return ImageFailure(status="ProcessCrashed", detail="an image process died")

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
