"""Running the image kernel off the event loop, in a pool of processes.

Decoding and thumbnailing are CPU work; done on the loop they would stall downloads,
Kafka heartbeats and pacing waits behind a large image. Processes, not threads, so that
an image that crashes the decoder costs one pool process and one URL, not the worker.

The pool is small and direct: each process has its own pipe, which the event loop
watches itself, and holds at most four images: the one it works on and the next three,
queued in its pipe (``PoolProcessor``'s ``depth``). ``concurrent.futures``' process pool spends
the worker's CPU on every image in its feeder and manager threads, their locks and
wake-ups; the loop reading the pipe directly spends none of that. A body does not travel
through the pipe either: pickled, it would cross in pipe-sized pieces, each copied twice.
It is copied into an anonymous in-memory file (``memfd_create``; one per lane, reused, so
its pages are not faulted in again for every image), which the process opens through
``/proc/{pid}/fd`` and maps to decode from. Where that path is closed (no memfd, a
hardened /proc), the first refusal switches the pool back to sending bodies through the
pipe.

The worker maps that file and copies a body straight into its mapped, resident pages, in
the pieces it was downloaded in (``Body``): joining the pieces first would allocate a
fresh buffer for every body, and writing that with ``pwrite`` would copy it again, page
by page.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import mmap
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Final, Protocol

from image_crawler.contract import Encoding, Status
from image_crawler.logs import get_logger
from worker.images.kernel import (
    DEFAULT_LIMITS,
    ImageFailure,
    ImageLimits,
    ProcessedImage,
    process_image,
)

log = get_logger(__name__)

# What the kernel made of one body: the image described, or why it could not be.
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

# glibc's mallopt parameters (malloc.h), and what a pool process sets them to: buffers up
# to this size come from the heap, not a fresh map of their own, and up to this much free
# heap is kept instead of being given back. An image's buffers (its decode at the smallest
# n/8 scale that covers the thumbnail, at most about 5 MB; the thumbnail; Pillow's and
# numpy's temporaries) then reuse pages already in the process. With glibc's adaptive
# defaults a pool process faulted in 30-80 pages an image (about 1.1 us each) and spent
# 0.06-0.14 ms more per image in the benchmark's crawl. A larger buffer (a full decode by
# Pillow) still gets a map of its own, and is given back whole when freed.
_M_TRIM_THRESHOLD: Final = -1
_M_MMAP_THRESHOLD: Final = -3
_HEAP_MMAP_THRESHOLD_BYTES: Final = 8 * 1024 * 1024
_HEAP_TRIM_THRESHOLD_BYTES: Final = 32 * 1024 * 1024

# How much lower a pool process's priority is than the worker's (``os.nice``). Decoding
# takes every CPU it is given; the event loop that paces requests, reads the answers and
# feeds the pool needs one briefly and often. At the same priority, with the pool keeping
# the CPUs busy, the worker's main thread waited for a CPU about as long as it ran, and
# its pacing slots came late and were given up (figures: bench/README.md, "Long-tail
# figures"). Lower, the pool fills what the loop leaves.
POOL_NICENESS: Final = 5

# A downloaded body: whole, or the pieces it arrived in, in order.
Body = bytes | Sequence[bytes]


def body_size(body: Body) -> int:
    return len(body) if isinstance(body, bytes) else sum(len(piece) for piece in body)


def joined(body: Body) -> bytes:
    return body if isinstance(body, bytes) else b"".join(body)


class ImageProcessor(Protocol):
    async def process(self, body: Body, encoding: Encoding | None = None) -> ImageOutcome: ...


class InlineProcessor:
    """Processes on the calling thread: for unit tests and tools, not for the worker."""

    def __init__(self, limits: ImageLimits = DEFAULT_LIMITS) -> None:
        self._limits = limits

    async def process(self, body: Body, encoding: Encoding | None = None) -> ImageOutcome:
        return process_image(joined(body), self._limits, encoding)


class ProcessDied(Exception):
    """A pool process ended (killed, or crashed in a decoder) before it answered."""


def process_shared(
    owner_pid: int,
    fd: int,
    size: int,
    limits: ImageLimits,
    opened: dict[tuple[int, int], int] | None = None,
    encoding: Encoding | None = None,
) -> ImageOutcome | str:
    """``process_image`` of the first ``size`` bytes of file descriptor ``fd`` of
    ``owner_pid``, or ``"unreadable"``. With ``opened``, the file stays open there for
    the next call (a pool process's memfd is the same for its whole life).

    The bytes are mapped, not read: Pillow reads them straight from the worker's pages,
    where a copy (``pread`` into a fresh buffer, whose pages fault in every time) would
    cost the pool CPU on every image (docs/benchmark.md says how much). The
    mapping is exactly ``size`` bytes long, so what lies beyond (the tail of a larger
    earlier body) is past the end of the file for the decoder."""
    own_fd = _open_shared(owner_pid, fd, opened)
    if own_fd is None:
        return _UNREADABLE
    try:
        if size == 0:  # mmap's length 0 would map the whole file
            return process_image(b"", limits, encoding)
        try:
            view = mmap.mmap(own_fd, size, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # ValueError: the file is shorter than ``size``
            return _UNREADABLE
        try:
            return process_image(view, limits, encoding)
        finally:
            view.close()
    finally:
        if opened is None:
            os.close(own_fd)


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


def _serve(conn: Connection, limits: ImageLimits) -> None:
    """A pool process: one job in, one outcome out, until the worker closes the pipe.

    ``limits`` are the pool's, for its whole life: given once, not pickled with every job;
    a job's encoding (None, the thumbnail, for most) comes with it.
    """
    # The worker decides when to stop; a Ctrl-C reaching the whole process group must
    # not kill images midway. A worker killed outright closes the pipe: EOF ends us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(POOL_NICENESS)
    keep_heap()
    opened: dict[tuple[int, int], int] = {}
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        if job[0] != "fd":
            _, body, encoding = job
            conn.send(process_image(body, limits, encoding))
            continue
        _, owner_pid, fd, size, encoding = job
        outcome = process_shared(owner_pid, fd, size, limits, opened, encoding)
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


def keep_heap() -> bool:
    """Tune this process's C allocator for a pool process (see ``_M_MMAP_THRESHOLD``);
    False where the C library has no glibc ``mallopt`` (it then keeps its defaults)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(
        mallopt(_M_MMAP_THRESHOLD, _HEAP_MMAP_THRESHOLD_BYTES)
        and mallopt(_M_TRIM_THRESHOLD, _HEAP_TRIM_THRESHOLD_BYTES)
    )


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


class _PoolClosed(Exception):
    """The pool was closed while a caller waited for, or asked for, a lane."""


class _NotStarted(Exception):
    """A job queued behind another in a process that died: it never ran, so it is tried
    again in another process rather than counted as the crash."""


class _Lane:
    """One of a pool process's job slots, with its own memfd for the body it holds."""

    def __init__(self, process: _PoolProcess) -> None:
        self.process = process
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

    def close(self) -> None:
        self._unmap()
        if self.memfd is not None:
            os.close(self.memfd)
            self.memfd = None


class _PoolProcess:
    """One pool process, its end of the pipe, its lanes, and the jobs it was sent.

    The process works through its pipe in order, so the answers come back in the order
    of ``_pending``, and the first pending job is the one it is working on. The pipe is
    watched by the event loop for the process's whole life, not per job.
    """

    def __init__(
        self,
        context: multiprocessing.context.BaseContext,
        limits: ImageLimits,
        lanes: int,
        abandoned: Callable[[_Lane], None],
        died: Callable[[_PoolProcess], None],
    ) -> None:
        ours, theirs = context.Pipe(duplex=True)
        self.process: BaseProcess = context.Process(  # type: ignore[attr-defined]
            target=_serve, args=(theirs, limits), daemon=True, name="image-process"
        )
        self.process.start()
        theirs.close()  # only the process holds its end: its death is our EOF
        self.conn = ours
        self.lanes = [_Lane(self) for _ in range(lanes)]
        self.dead = False
        # (lane, future of its answer), oldest first; a cancelled future is a job whose
        # caller left: its lane is handed to ``abandoned`` once its answer is in.
        self._pending: deque[tuple[_Lane, asyncio.Future[Answer]]] = deque()
        self._abandoned = abandoned
        self._died = died
        self._watched: asyncio.AbstractEventLoop | None = None

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    def has_job(self, lane: _Lane) -> bool:
        return any(queued is lane for queued, _ in self._pending)

    def working_on(self, lane: _Lane) -> bool:
        """Whether ``lane``'s job is the one the process is on (not queued behind it)."""
        return bool(self._pending) and self._pending[0][0] is lane

    def submit(self, lane: _Lane, job: tuple[object, ...]) -> asyncio.Future[Answer]:
        """Send ``job`` for ``lane``; the future is its answer. A job behind another
        waits in the pipe, so the process starts it without waiting for the event loop."""
        if self.dead:
            raise _NotStarted("the process had ended")
        loop = asyncio.get_running_loop()
        if self._watched is None:
            loop.add_reader(self.conn.fileno(), self._on_readable)
            self._watched = loop
        try:
            # A job naming a memfd is a few dozen bytes: the pipe takes it at once.
            self.conn.send(job)
        except OSError as e:
            self.fail(repr(e))
            raise _NotStarted(repr(e)) from e
        answer: asyncio.Future[Answer] = loop.create_future()
        self._pending.append((lane, answer))
        return answer

    def _on_readable(self) -> None:
        try:
            while True:
                # Each answer is one message written at once: what is not there yet follows.
                answer: Answer = self.conn.recv()
                lane, future = self._pending.popleft()
                if future.done():  # its caller left
                    self._abandoned(lane)
                else:
                    future.set_result(answer)
                if not self._pending or not self.conn.poll():
                    return
        except (EOFError, OSError, IndexError) as e:
            self.fail(repr(e))

    def fail(self, reason: str) -> None:
        """The process is gone: its current job crashed it, the ones queued never ran."""
        if self.dead:
            return
        self.dead = True
        self._unwatch()
        pending, self._pending = self._pending, deque()
        for i, (_, future) in enumerate(pending):
            if not future.done():
                future.set_exception(ProcessDied(reason) if i == 0 else _NotStarted(reason))
        self._died(self)

    def _unwatch(self) -> None:
        if self._watched is not None:
            if not self._watched.is_closed():
                self._watched.remove_reader(self.conn.fileno())
            self._watched = None

    def alive(self) -> bool:
        return not self.dead and self.process.is_alive()

    def close(self, *, kill: bool = False) -> None:
        if kill and self.process.is_alive():
            self.process.kill()
        self.fail("the pool closed the process")
        self.conn.close()  # EOF: an idle process exits
        for lane in self.lanes:
            lane.close()
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)


class PoolProcessor:
    """``processes`` pool processes (one per CPU by default) running ``process_image``.

    Each process has ``depth`` lanes: it is sent its next images while it works on the
    current one, so it never waits for the event loop between images: a process that
    blocks even briefly between images lets its CPU idle, and its next image then costs
    more CPU (docs/architecture.md, "Inside a worker", says how much). A lane comes back
    to a waiting image two turns of the loop after its answer, and a turn can be long:
    a long tail of hosts starts hundreds of URLs at once (each a DNS query, a robots.txt
    and a tdmrep.json), and they move in step, a second apart. With one image queued
    (``depth`` 2) the machine idled 2.2-2.6 % of the time in the benchmark's long-tail
    crawl, with hundreds of bodies waiting; with three (4), 0.9 %, the same as with
    seven (bench/README.md, session 33). Only bodies shared through memory are queued;
    a body that must go through the pipe goes to an idle process, so that sending it
    never waits.

    Started on first use; a process that dies is replaced, the image it was working on
    is a ``ProcessCrashed`` failure and an image queued behind it is tried again.
    """

    def __init__(
        self,
        processes: int = 0,
        limits: ImageLimits = DEFAULT_LIMITS,
        *,
        share: bool = True,
        depth: int = 4,
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._size = processes or os.cpu_count() or 1
        self._depth = depth
        self._limits = limits
        # forkserver: forking a process that runs an event loop and threads is unsafe.
        self._context = multiprocessing.get_context("forkserver")
        self._owner_pid = os.getpid()  # whose /proc/{pid}/fd the pool processes open
        self.shares_memory = share  # False once a pool process could not read a memfd
        self._idle: list[_Lane] = []
        self._waiting: deque[asyncio.Future[_Lane]] = deque()
        self._all: set[_PoolProcess] = set()
        self._closed = False
        self._queued = 0

    @property
    def queued(self) -> int:
        """Images waiting for a pool process, or in one, now (``crawler_image_pool_queue``)."""
        return self._queued

    @property
    def pids(self) -> list[int]:
        """The pool's processes, for tools and tests."""
        return [p.process.pid for p in self._all if p.process.pid is not None]

    async def process(self, body: Body, encoding: Encoding | None = None) -> ImageOutcome:
        self._queued += 1
        try:
            return await self._process(body, encoding)
        finally:
            self._queued -= 1

    async def _process(self, body: Body, encoding: Encoding | None) -> ImageOutcome:
        while True:
            try:
                lane = await self._acquire()
            except _PoolClosed:
                return ImageFailure(Status.PROCESS_CRASHED, "the image pool is closed")
            try:
                outcome = await self._run(lane, body, encoding)
                if outcome is None:  # it goes through the pipe now: to an idle process
                    self._release(lane)
                    continue
            except _NotStarted:
                if self._closed:
                    return ImageFailure(Status.PROCESS_CRASHED, "the image pool is closed")
                continue  # its process ended before reaching it: another one takes it
            except ProcessDied as e:
                log.error("image_process_died", pid=lane.process.process.pid, error=str(e))
                self._retire(lane.process)
                return ImageFailure(status=Status.PROCESS_CRASHED, detail="an image process died")
            except BaseException:
                self._leave(lane)
                raise
            self._release(lane)
            return outcome

    async def _run(self, lane: _Lane, body: Body, encoding: Encoding | None) -> ImageOutcome | None:
        """The outcome of ``body`` through ``lane``, which holds no job when this returns;
        None when the body must go through the pipe and ``lane`` cannot take it."""
        if self.shares_memory:
            if lane.write_body(body):
                assert lane.memfd is not None
                answer = await lane.process.submit(
                    lane, ("fd", self._owner_pid, lane.memfd, body_size(body), encoding)
                )
                if isinstance(answer, tuple):  # the thumbnail is in the memfd
                    size, image = answer
                    answer = dataclasses.replace(image, thumbnail=lane.read_thumbnail(size))
                lane.trim()
                if not isinstance(answer, str):
                    return answer
                self._stop_sharing(f"a pool process cannot read /proc/{self._owner_pid}/fd")
            else:
                self._stop_sharing("memfd_create or writing to it failed")
            if not self._usable(lane):
                return None
        answer = await lane.process.submit(lane, ("bytes", joined(body), encoding))
        if isinstance(answer, str | tuple):  # only the memfd path answers with those
            raise ProcessDied(f"unexpected answer {answer!r}")
        return answer

    def _usable(self, lane: _Lane) -> bool:
        # A body through the pipe is sent whole: only to a process with nothing to do.
        return self.shares_memory or (
            lane is lane.process.lanes[0] and not lane.process.outstanding
        )

    async def _acquire(self) -> _Lane:
        if self._closed:
            raise _PoolClosed("the image pool is closed")
        if not self._waiting:
            lane = self._take()
            if lane is not None:
                return lane
        waiter: asyncio.Future[_Lane] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        self._dispatch()
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release(waiter.result())  # handed over as we left
            elif waiter in self._waiting:  # ``_dispatch`` may have dropped it already
                self._waiting.remove(waiter)
            raise

    def _take(self) -> _Lane | None:
        """The idle lane of the least busy process (spawning one while under size)."""
        usable = [lane for lane in self._idle if self._usable(lane)]
        if not usable and len(self._all) < self._size and not self._closed:
            usable = [lane for lane in self._spawn().lanes if self._usable(lane)]
        if not usable:
            return None
        lane = min(usable, key=lambda lane: lane.process.outstanding)
        self._idle.remove(lane)
        return lane

    def _spawn(self) -> _PoolProcess:
        process = _PoolProcess(
            self._context, self._limits, self._depth, self._release, self._retire
        )
        self._all.add(process)
        self._idle.extend(process.lanes)
        return process

    def _dispatch(self) -> None:
        """Hand idle lanes to the callers waiting for one, in order."""
        while self._waiting:
            if self._waiting[0].done():  # its caller left
                self._waiting.popleft()
                continue
            lane = self._take()
            if lane is None:
                return
            self._waiting.popleft().set_result(lane)

    def _release(self, lane: _Lane) -> None:
        """``lane`` holds no job any more: idle again, or gone with its process."""
        if lane.process not in self._all:
            return
        if not lane.process.alive():
            self._retire(lane.process)
            return
        self._idle.append(lane)
        self._dispatch()

    def _leave(self, lane: _Lane) -> None:
        """The caller holding ``lane`` left (cancelled) with its job maybe under way."""
        process = lane.process
        if process.working_on(lane):
            # The process is busy with an image nobody waits for: it is replaced, and an
            # image queued behind it is tried again elsewhere.
            self._retire(process)
        elif not process.has_job(lane):
            self._release(lane)
        # else: queued, the process will still do it; the lane comes back with the answer.

    def _retire(self, process: _PoolProcess) -> None:
        """Kill ``process`` (if it is not dead already) and forget it and its lanes."""
        if process not in self._all:
            return
        self._all.discard(process)
        self._idle = [lane for lane in self._idle if lane.process is not process]
        process.close(kill=True)
        self._dispatch()  # a waiter gets a new process

    def _stop_sharing(self, reason: str) -> None:
        if self.shares_memory:
            log.warning("image_pool_uses_pipe", reason=reason)
            self.shares_memory = False

    def close(self) -> None:
        self._closed = True
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_exception(_PoolClosed("the image pool is closed"))
        for process in list(self._all):
            self._all.discard(process)
            process.close()
        self._idle.clear()
