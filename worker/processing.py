"""Running the image kernel off the event loop, in a pool of processes.

Decoding and thumbnailing are CPU work; done on the loop they would stall downloads,
Kafka heartbeats and token waits behind a large image. Processes, not threads, so that
an image that crashes the decoder costs one pool process and one URL, not the worker.

The pool is small and direct: each process has its own pipe, which the event loop
watches itself, and is given one image at a time. ``concurrent.futures``' process pool
was measured (bench/) to spend about 1 ms of the worker's CPU per image in its feeder
and manager threads, their locks and wake-ups; the loop reading the pipe directly spends
none of that. A body does not travel through the pipe either: pickled, a 2 MB body costs
about 3 ms of CPU (the pipe holds 64 KiB, so it crosses in 30-odd pieces, each copied
twice). It is copied into the process's own anonymous in-memory file (``memfd_create``,
reused, so its pages are not faulted in again for every image), which the process reads
through ``/proc/{pid}/fd``. Where that path is closed (no memfd, a hardened /proc), the
first refusal switches the pool back to sending bodies through the pipe.

The worker maps that file and copies a body into it in the pieces it was downloaded in
(``Body``): joining the pieces first and then writing the result with ``pwrite`` cost about
1 ms of the main process's CPU per 1 MB body (a fresh 1 MB allocation, and the kernel's
page-by-page copy), a profile showed; copying straight into the mapped, resident pages
took the benchmark's main process from 7.3-7.7 to 6.3 ms per image.
"""

from __future__ import annotations

import asyncio
import dataclasses
import mmap
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Final, Protocol

from image_crawler.logs import get_logger
from worker.image import DEFAULT_LIMITS, ImageFailure, ImageLimits, ProcessedImage, process_image

log = get_logger(__name__)

ImageOutcome = ProcessedImage | ImageFailure
# What a pool process sends back: an outcome, "unreadable", or for a body it read from
# the memfd, the thumbnail's length with the image (its thumbnail is in the memfd).
Answer = ImageOutcome | str | tuple[int, ProcessedImage]

# What a pool process answers when it cannot read the parent's file: send the bytes.
_UNREADABLE: Final = "unreadable"
# A process's memfd is kept at the size of the largest body it held (in whole steps), up to
# this; a larger one is shrunk after its image, so one huge body does not pin its memory.
_KEEP_MEMFD_BYTES = 16 * 1024 * 1024
# A memfd grows in steps of this, so bodies of similar sizes do not remap it each time.
_MEMFD_STEP_BYTES = 1024 * 1024

# A downloaded body: whole, or the pieces it arrived in, in order.
Body = bytes | Sequence[bytes]


def body_size(body: Body) -> int:
    return len(body) if isinstance(body, bytes) else sum(len(piece) for piece in body)


def joined(body: Body) -> bytes:
    return body if isinstance(body, bytes) else b"".join(body)


class ImageProcessor(Protocol):
    async def process(self, body: Body) -> ImageOutcome: ...


class InlineProcessor:
    """Processes on the calling thread: for unit tests and tools, not for the worker."""

    def __init__(self, limits: ImageLimits = DEFAULT_LIMITS) -> None:
        self._limits = limits

    async def process(self, body: Body) -> ImageOutcome:
        return process_image(joined(body), self._limits)


class ProcessDied(Exception):
    """A pool process ended (killed, or crashed in a decoder) before it answered."""


def process_shared(
    owner_pid: int,
    fd: int,
    size: int,
    limits: ImageLimits,
    opened: dict[tuple[int, int], int] | None = None,
) -> ImageOutcome | str:
    """``process_image`` of the first ``size`` bytes of file descriptor ``fd`` of
    ``owner_pid``, or ``"unreadable"``. With ``opened``, the file stays open there for
    the next call (a pool process's memfd is the same for its whole life)."""
    own_fd = _open_shared(owner_pid, fd, opened)
    if own_fd is None:
        return _UNREADABLE
    try:
        body = os.pread(own_fd, size, 0)
    finally:
        if opened is None:
            os.close(own_fd)
    if len(body) != size:
        return _UNREADABLE
    return process_image(body, limits)


def _open_shared(owner_pid: int, fd: int, opened: dict[tuple[int, int], int] | None) -> int | None:
    if opened is not None and (owner_pid, fd) in opened:
        return opened[owner_pid, fd]
    try:
        own_fd = os.open(f"/proc/{owner_pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    if opened is not None:
        opened[owner_pid, fd] = own_fd
    return own_fd


def _serve(conn: Connection) -> None:
    """A pool process: one job in, one outcome out, until the worker closes the pipe."""
    # The worker decides when to stop; a Ctrl-C reaching the whole process group must
    # not kill images midway. A worker killed outright closes the pipe: EOF ends us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    opened: dict[tuple[int, int], int] = {}
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        if job[0] != "fd":
            _, body, limits = job
            conn.send(process_image(body, limits))
            continue
        _, owner_pid, fd, size, limits = job
        outcome = process_shared(owner_pid, fd, size, limits, opened)
        if isinstance(outcome, ProcessedImage):
            # The thumbnail goes back the way the body came (the body is read by now):
            # only its length crosses the pipe.
            thumbnail = outcome.thumbnail
            try:
                _write_all(opened[owner_pid, fd], thumbnail)
            except OSError:
                conn.send(outcome)  # through the pipe, then
            else:
                conn.send((len(thumbnail), dataclasses.replace(outcome, thumbnail=b"")))
        else:
            conn.send(outcome)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    offset = 0
    while offset < len(view):
        offset += os.pwrite(fd, view[offset:], offset)


def _new_memfd() -> int | None:
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is None:
        return None
    try:
        fd: int = memfd_create("image-body", getattr(os, "MFD_CLOEXEC", 0))
    except OSError:
        return None
    return fd


class _PoolProcess:
    """One pool process, its end of the pipe, and its memfd."""

    def __init__(self, context: multiprocessing.context.BaseContext) -> None:
        ours, theirs = context.Pipe(duplex=True)
        self.process: BaseProcess = context.Process(  # type: ignore[attr-defined]
            target=_serve, args=(theirs,), daemon=True, name="image-process"
        )
        self.process.start()
        theirs.close()  # only the process holds its end: its death is our EOF
        self.conn = ours
        self.memfd = _new_memfd()
        self._map: mmap.mmap | None = None  # the memfd, mapped; as long as the file

    def write_body(self, body: Body) -> bool:
        """Copy ``body`` to the start of the memfd; False where that is not possible."""
        if self.memfd is None:
            return False
        pieces = (body,) if isinstance(body, bytes) else body
        try:
            view = self._mapped(body_size(body))
        except (OSError, ValueError):
            return False
        offset = 0
        for piece in pieces:
            view[offset : offset + len(piece)] = piece
            offset += len(piece)
        return True

    def _mapped(self, size: int) -> mmap.mmap:
        """The memfd mapped, at least ``size`` bytes long (grown in whole steps)."""
        assert self.memfd is not None
        if self._map is not None and len(self._map) >= size:
            return self._map
        self._unmap()
        length = max(_MEMFD_STEP_BYTES, -(-size // _MEMFD_STEP_BYTES) * _MEMFD_STEP_BYTES)
        os.ftruncate(self.memfd, length)
        self._map = mmap.mmap(self.memfd, length)
        return self._map

    def _unmap(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None

    def trim(self) -> None:
        if self.memfd is not None and self._map is not None and len(self._map) > _KEEP_MEMFD_BYTES:
            self._unmap()
            os.ftruncate(self.memfd, 0)

    def read_thumbnail(self, size: int) -> bytes:
        assert self.memfd is not None
        thumbnail = os.pread(self.memfd, size, 0)
        if len(thumbnail) != size:
            raise ProcessDied(f"thumbnail of {size} bytes, {len(thumbnail)} in the memfd")
        return thumbnail

    async def ask(self, job: tuple[object, ...]) -> Answer:
        """Send ``job`` and wait for the answer, without blocking the loop meanwhile."""
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[None] = loop.create_future()
        fd = self.conn.fileno()

        def on_readable() -> None:
            if not readable.done():
                readable.set_result(None)

        try:
            self.conn.send(job)  # the process is idle and reading: this does not wait
            loop.add_reader(fd, on_readable)
            try:
                await readable
            finally:
                loop.remove_reader(fd)
            # The answer is one message written at once: what is not there yet follows.
            answer: Answer = self.conn.recv()
        except (EOFError, OSError, BrokenPipeError) as e:
            raise ProcessDied(repr(e)) from e
        return answer

    def alive(self) -> bool:
        return self.process.is_alive()

    def close(self, *, kill: bool = False) -> None:
        if kill and self.process.is_alive():
            self.process.kill()
        self.conn.close()  # EOF: an idle process exits
        self._unmap()
        if self.memfd is not None:
            os.close(self.memfd)
            self.memfd = None
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)


class PoolProcessor:
    """``processes`` pool processes (one per CPU by default) running ``process_image``.

    Started on first use; a process that dies is replaced, and the image it had is a
    ``ProcessCrashed`` failure.
    """

    def __init__(
        self, processes: int = 0, limits: ImageLimits = DEFAULT_LIMITS, *, share: bool = True
    ) -> None:
        self._size = processes or os.cpu_count() or 1
        self._limits = limits
        # forkserver: forking a process that runs an event loop and threads is unsafe.
        self._context = multiprocessing.get_context("forkserver")
        self._owner_pid = os.getpid()  # whose /proc/{pid}/fd the pool processes open
        self.shares_memory = share  # False once a pool process could not read a memfd
        self._idle: list[_PoolProcess] = []
        self._waiting: deque[asyncio.Future[_PoolProcess]] = deque()
        self._started = 0
        self._all: set[_PoolProcess] = set()

    @property
    def pids(self) -> list[int]:
        """The pool's processes, for tools and tests."""
        return [p.process.pid for p in self._all if p.process.pid is not None]

    async def process(self, body: Body) -> ImageOutcome:
        worker = await self._acquire()
        healthy = False
        try:
            outcome = await self._run(worker, body)
            healthy = True
            return outcome
        except ProcessDied as e:
            log.error("image_process_died", pid=worker.process.pid, error=str(e))
            return ImageFailure(status="ProcessCrashed", detail="an image process died")
        finally:
            # Cancelled midway, a process may still be working on the image: it is not
            # given another one, it is replaced.
            self._release(worker, healthy)

    async def _run(self, worker: _PoolProcess, body: Body) -> ImageOutcome:
        if self.shares_memory:
            if worker.write_body(body):
                assert worker.memfd is not None
                answer = await worker.ask(
                    ("fd", self._owner_pid, worker.memfd, body_size(body), self._limits)
                )
                if isinstance(answer, tuple):  # the thumbnail is in the memfd
                    size, image = answer
                    answer = dataclasses.replace(image, thumbnail=worker.read_thumbnail(size))
                worker.trim()
                if not isinstance(answer, str):
                    return answer
                self._stop_sharing(f"a pool process cannot read /proc/{self._owner_pid}/fd")
            else:
                self._stop_sharing("memfd_create or writing to it failed")
        answer = await worker.ask(("bytes", joined(body), self._limits))
        if isinstance(answer, str | tuple):  # only the memfd path answers with those
            raise ProcessDied(f"unexpected answer {answer!r}")
        return answer

    async def _acquire(self) -> _PoolProcess:
        if self._idle:
            return self._idle.pop()
        if self._started < self._size:
            return self._spawn()
        waiter: asyncio.Future[_PoolProcess] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release(waiter.result(), healthy=True)  # handed over as we left
            else:
                self._waiting.remove(waiter)
            raise

    def _spawn(self) -> _PoolProcess:
        worker = _PoolProcess(self._context)
        self._started += 1
        self._all.add(worker)
        return worker

    def _release(self, worker: _PoolProcess, healthy: bool) -> None:
        if not healthy or not worker.alive():
            self._all.discard(worker)
            self._started -= 1
            worker.close(kill=True)
            if not self._waiting:
                return  # started again when next needed
            worker = self._spawn()
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(worker)
                return
        self._idle.append(worker)

    def _stop_sharing(self, reason: str) -> None:
        if self.shares_memory:
            log.warning("image_pool_uses_pipe", reason=reason)
            self.shares_memory = False

    def close(self) -> None:
        for worker in list(self._all):
            worker.close()
        self._all.clear()
        self._idle.clear()
        self._started = 0
