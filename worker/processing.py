"""Running the image kernel off the event loop, in a pool of processes.

Decoding and thumbnailing are CPU work; done on the loop they would stall downloads,
Kafka heartbeats and token waits behind a large image. Processes, not threads, so that
an image that crashes the decoder costs one pool process and one URL, not the worker.

A body does not travel through the pool's pipe: pickled, a 2 MB body costs about 3 ms of
CPU there (the pipe holds 64 KiB, so it crosses in 30-odd pieces, each copied twice).
It is written once to an anonymous in-memory file (``memfd_create``) that the pool
process reads through ``/proc/{pid}/fd``: about a third of that. Where that path is
closed (no memfd, a hardened /proc), the first refusal switches back to the pipe.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import select
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Final, Protocol

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


# What a pool process answers when it cannot open the parent's file: send the bytes.
_UNREADABLE: Final = "unreadable"


def process_shared(owner_pid: int, fd: int, size: int, limits: ImageLimits) -> ImageOutcome | str:
    """``process_image`` of the ``size`` bytes in file descriptor ``fd`` of ``owner_pid``."""
    try:
        own_fd = os.open(f"/proc/{owner_pid}/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return _UNREADABLE
    try:
        body = os.pread(own_fd, size, 0)
    finally:
        os.close(own_fd)
    if len(body) != size:
        return _UNREADABLE
    return process_image(body, limits)


def _write_memfd(body: bytes) -> int | None:
    """An anonymous in-memory file holding ``body``, or None where there is none."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is None:
        return None
    try:
        fd: int = memfd_create("image-body", getattr(os, "MFD_CLOEXEC", 0))
    except OSError:
        return None
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        os.close(fd)
        return None
    return fd


def _start_pool_process(owner_pid: int) -> None:
    # The parent decides when to stop; a Ctrl-C reaching the whole process group must not
    # kill pool processes mid-image.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # ...but a parent killed with SIGKILL says nothing: the pool's queues stay open (each
    # pool process holds both ends) and it would wait for work forever, with the
    # forkserver behind it. A thread watches the owner and ends the process with it.
    threading.Thread(target=_exit_with, args=(owner_pid,), daemon=True).start()


def _exit_with(owner_pid: int) -> None:
    try:
        pidfd = os.pidfd_open(owner_pid)
    except (AttributeError, OSError):  # no pidfd (old kernel): look every second
        while _alive(owner_pid):
            time.sleep(1.0)
    else:
        select.select([pidfd], [], [])  # readable once the process has exited
    os._exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class PoolProcessor:
    """A process pool running ``process_image``; rebuilt if a process dies."""

    def __init__(
        self, processes: int = 0, limits: ImageLimits = DEFAULT_LIMITS, *, share: bool = True
    ) -> None:
        self._processes = processes or os.cpu_count() or 1
        self._limits = limits
        self._executor = self._new_executor()
        self.shares_memory = share  # False once a pool process could not read a memfd
        self._owner_pid = os.getpid()  # whose /proc/{pid}/fd the pool processes open
        # Bodies in memfds at once: those being processed and one queued per process.
        # The others wait as the bytes they already are, not as a second copy.
        self._shared_slots = asyncio.Semaphore(2 * self._processes)

    def _new_executor(self) -> ProcessPoolExecutor:
        # forkserver: forking a process that runs an event loop and threads is unsafe.
        return ProcessPoolExecutor(
            max_workers=self._processes,
            mp_context=multiprocessing.get_context("forkserver"),
            initializer=_start_pool_process,
            initargs=(os.getpid(),),
        )

    async def process(self, body: bytes) -> ImageOutcome:
        executor = self._executor
        try:
            if self.shares_memory:
                outcome = await self._process_shared(executor, body)
                if outcome is not None:
                    return outcome
            return await asyncio.get_running_loop().run_in_executor(
                executor, process_image, body, self._limits
            )
        except BrokenProcessPool as e:
            if executor is self._executor:
                log.error("image_pool_broken", error=repr(e))
                executor.shutdown(wait=False, cancel_futures=True)
                self._executor = self._new_executor()
            return ImageFailure(status="ProcessCrashed", detail="an image process died")

    async def _process_shared(
        self, executor: ProcessPoolExecutor, body: bytes
    ) -> ImageOutcome | None:
        async with self._shared_slots:
            return await self._process_in_memfd(executor, body)

    async def _process_in_memfd(
        self, executor: ProcessPoolExecutor, body: bytes
    ) -> ImageOutcome | None:
        fd = _write_memfd(body)
        if fd is None:
            self._stop_sharing("memfd_create failed")
            return None
        try:
            outcome = await asyncio.get_running_loop().run_in_executor(
                executor, process_shared, self._owner_pid, fd, len(body), self._limits
            )
        finally:
            # After the pool process is done with it (or the await was cancelled, and the
            # process fails to open it: the result is dropped anyway).
            os.close(fd)
        if isinstance(outcome, str):
            self._stop_sharing(f"a pool process cannot read /proc/{self._owner_pid}/fd")
            return None
        return outcome

    def _stop_sharing(self, reason: str) -> None:
        if self.shares_memory:
            log.warning("image_pool_uses_pipe", reason=reason)
            self.shares_memory = False

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
