"""The image pool: bodies through a shared in-memory file, the pipe as a fallback."""

from __future__ import annotations

import asyncio
import hashlib
import os
import platform
from pathlib import Path

import pytest

from image_crawler.contract import Encoding
from test.harness.corpus import broken_images, good_images
from test.harness.real_images import many_frames
from worker.images import pool as pool_module
from worker.images.kernel import (
    DEFAULT_LIMITS,
    ImageFailure,
    ImageLimits,
    ProcessedImage,
    process_image,
)
from worker.images.pool import PoolProcessor


@pytest.fixture
def pool():
    processor = PoolProcessor(2)
    yield processor
    processor.close()


def a_jpeg():
    return next(i for i in good_images() if i.content_type == "image/jpeg" and (i.width or 0) > 500)


async def test_a_body_shared_through_memory_gives_the_same_result_as_inline(pool):
    image = a_jpeg()
    outcome = await pool.process(image.body)
    assert isinstance(outcome, ProcessedImage)
    assert outcome == process_image(image.body)
    # Hashed from the map, and back through the pipe while the thumbnail takes the memfd.
    assert outcome.sha256 == hashlib.sha256(image.body).hexdigest()
    assert len(outcome.phash) == 16
    assert pool.shares_memory


async def test_an_unreadable_file_falls_back_to_the_pipe_for_good(pool):
    # As if /proc were hardened: the pool process is given a descriptor it cannot open.
    pool._owner_pid = 999_999_999
    image = a_jpeg()
    outcome = await pool.process(image.body)
    assert outcome == process_image(image.body)
    assert not pool.shares_memory


async def test_no_memfd_falls_back_to_the_pipe(pool, monkeypatch):
    monkeypatch.delattr(pool_module.os, "memfd_create")
    assert isinstance(await pool.process(a_jpeg().body), ProcessedImage)
    assert not pool.shares_memory


@pytest.mark.parametrize("share", [True, False])
async def test_the_pools_limits_are_the_ones_its_processes_apply(share):
    limits = ImageLimits(thumbnail_px=64, thumbnail_quality=40)
    processor = PoolProcessor(1, limits, share=share)
    try:
        body = a_jpeg().body
        outcome = await processor.process(body)
        assert outcome == process_image(body, limits) != process_image(body)
        assert processor.shares_memory is share
    finally:
        processor.close()


@pytest.mark.parametrize("share", [True, False])
async def test_each_job_s_encoding_goes_with_it(share):
    processor = PoolProcessor(1, share=share)
    # Bigger than the body: the image made may not fit where the body was.
    large = Encoding(
        image_size=2048, resize_mode="keep_ratio", encode_format="png", encode_quality=0
    )
    try:
        body = a_jpeg().body
        outcomes = []
        for encoding in (large, None, Encoding(encode_format="webp")):
            outcomes.append(await processor.process(body, encoding))
            assert outcomes[-1] == process_image(body, encoding=encoding)
        assert processor.shares_memory is share
        assert len(outcomes[0].thumbnail) > len(body)
    finally:
        processor.close()


def _pages_faulted(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[7])  # minflt


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="no glibc mallopt")
async def test_a_pool_process_reuses_its_heap_from_image_to_image(one_process):
    # glibc's adaptive defaults give an image's buffers back and fault them in again
    # (about 80 pages an image here); a pool process keeps them.
    bodies = [i.body for i in good_images() if i.content_type == "image/jpeg"]
    for body in bodies:  # the heap grows to what the largest needs
        await one_process.process(body)
    (pid,) = one_process.pids
    before = _pages_faulted(pid)
    for _ in range(3):
        for body in bodies:
            await one_process.process(body)
    assert (_pages_faulted(pid) - before) / (3 * len(bodies)) < 20


def test_the_shared_reader_refuses_a_short_file(tmp_path):
    path = tmp_path / "short"
    path.write_bytes(b"abc")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert pool_module.process_shared(os.getpid(), fd, 10, pool_module.DEFAULT_LIMITS) == (
            "unreadable"
        )
    finally:
        os.close(fd)


def test_a_mapped_body_gives_what_its_bytes_give_whatever_follows_it():
    """The pool decodes a map of exactly the body: a larger earlier body's tail, still in
    the file behind it, must not change any outcome (a truncated image stays truncated)."""
    images = good_images() + broken_images()
    tail = max(images, key=lambda image: len(image.body)).body  # a JPEG, as a stale tail
    fd = os.memfd_create("test-body")
    try:
        for image in [*images, None]:
            body = b"" if image is None else image.body
            os.ftruncate(fd, 0)
            os.pwrite(fd, body + tail, 0)
            shared = pool_module.process_shared(os.getpid(), fd, len(body), DEFAULT_LIMITS)
            assert shared == process_image(body), image and image.name
    finally:
        os.close(fd)


async def until(condition, timeout_s=10.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def the_largest_jpeg():
    jpegs = (i for i in good_images() if i.content_type == "image/jpeg")
    return max(jpegs, key=lambda i: (i.width or 0) * (i.height or 0))


def outstanding(pool):
    return sum(p.outstanding for p in pool._all)


async def test_a_pool_process_that_dies_while_idle_costs_no_image(pool):
    await pool.process(a_jpeg().body)  # one process is up, and idle
    (pid,) = pool.pids
    os.kill(pid, 9)
    await until(lambda: pid not in pool.pids)  # its pipe's EOF retires it
    assert isinstance(await pool.process(a_jpeg().body), ProcessedImage)
    assert pid not in pool.pids


async def test_a_pool_process_that_dies_midway_is_one_failed_image_and_is_replaced(pool):
    task = asyncio.create_task(pool.process(the_largest_jpeg().body))
    await until(lambda: outstanding(pool) == 1)
    (pid,) = pool.pids
    os.kill(pid, 9)
    outcome = await task
    assert isinstance(outcome, ImageFailure) and outcome.status == "ProcessCrashed"
    assert isinstance(await pool.process(a_jpeg().body), ProcessedImage)
    assert pid not in pool.pids


@pytest.fixture
def one_process():
    processor = PoolProcessor(1, depth=2)  # two lanes: the tests below fill them
    yield processor
    processor.close()


async def two_jobs_in_one_process(pool, body):
    """Start two images in ``pool``'s one process, the second queued behind the first."""
    first = asyncio.create_task(pool.process(body))
    second = asyncio.create_task(pool.process(body))
    await until(lambda: outstanding(pool) == 2)
    (pid,) = pool.pids
    return first, second, pid


async def test_a_process_is_sent_its_next_image_while_it_works_on_one(one_process):
    body = the_largest_jpeg().body
    first, second, _ = await two_jobs_in_one_process(one_process, body)
    third = asyncio.create_task(one_process.process(body))  # two lanes: this one waits
    assert await asyncio.gather(first, second, third) == [process_image(body)] * 3


async def test_a_process_holds_four_images_by_default_and_a_fifth_waits_for_a_lane():
    pool = PoolProcessor(1)
    try:
        body = the_largest_jpeg().body
        tasks = [asyncio.create_task(pool.process(body)) for _ in range(5)]
        await asyncio.sleep(0)  # each has taken a lane or queued for one; none answered
        assert (outstanding(pool), len(pool._waiting)) == (4, 1)
        assert await asyncio.gather(*tasks) == [process_image(body)] * 5
    finally:
        pool.close()


async def test_the_image_queued_behind_a_crash_is_tried_again_not_failed(one_process):
    body = the_largest_jpeg().body
    first, second, pid = await two_jobs_in_one_process(one_process, body)
    os.kill(pid, 9)
    crashed = await first
    assert isinstance(crashed, ImageFailure) and crashed.status == "ProcessCrashed"
    assert await second == process_image(body)  # in a new process
    assert one_process.pids and pid not in one_process.pids


async def test_an_image_abandoned_while_queued_leaves_the_process_to_finish_the_one_before(
    one_process,
):
    body = the_largest_jpeg().body
    first, queued, pid = await two_jobs_in_one_process(one_process, body)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert await first == process_image(body)
    await until(lambda: len(one_process._idle) == 2)  # the queued lane is back with its answer
    assert await one_process.process(body) == process_image(body)
    assert one_process.pids == [pid]


async def test_an_image_abandoned_while_waiting_for_a_lane_leaves_as_cancelled(one_process):
    # Its place in the queue of waiters is dropped by whoever comes next, before its own
    # task runs again: leaving must not trip over that.
    body = the_largest_jpeg().body
    first, second, _ = await two_jobs_in_one_process(one_process, body)
    waiting = asyncio.create_task(one_process.process(body))
    await until(lambda: len(one_process._waiting) == 1)
    next_one = asyncio.create_task(one_process.process(body))  # runs before `waiting` wakes
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await asyncio.gather(first, second, next_one) == [process_image(body)] * 3


async def test_more_images_than_processes_wait_their_turn(pool):
    bodies = [i.body for i in good_images()][:12]
    outcomes = await asyncio.gather(*(pool.process(b) for b in bodies))
    assert outcomes == [process_image(b) for b in bodies]
    assert len(pool.pids) == 2


async def test_an_image_abandoned_midway_costs_its_process_not_the_pool(pool):
    first = asyncio.create_task(pool.process(a_jpeg().body))
    await asyncio.sleep(0)  # the job is sent
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert isinstance(await pool.process(a_jpeg().body), ProcessedImage)


async def test_pool_processes_run_below_the_worker_s_priority(pool):
    await asyncio.gather(pool.process(a_jpeg().body), pool.process(a_jpeg().body))
    own = os.getpriority(os.PRIO_PROCESS, 0)
    for pid in pool.pids:
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(own + pool_module.POOL_NICENESS, 19)


async def test_closing_the_pool_ends_its_processes(pool):
    await asyncio.gather(pool.process(a_jpeg().body), pool.process(a_jpeg().body))
    pids = pool.pids
    pool.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _pieces(body: bytes, n: int) -> list[bytes]:
    step = -(-len(body) // n)
    return [body[i : i + step] for i in range(0, len(body), step)]


async def test_a_body_in_pieces_gives_the_same_result_as_the_whole_body(pool):
    image = a_jpeg()
    pieces = _pieces(image.body, 7)
    assert len(pieces) == 7 and b"".join(pieces) == image.body
    assert await pool.process(pieces) == process_image(image.body)
    assert await pool_module.InlineProcessor().process(pieces) == process_image(image.body)
    assert pool.shares_memory


async def test_a_short_body_after_a_long_one_sees_none_of_the_long_ones_bytes():
    # One process, so both bodies go through the same memfd: the second, a JPEG cut in
    # half, must fail as it does alone, not be completed by the first body's tail.
    pool = PoolProcessor(1)
    try:
        long_one = max(
            (i for i in good_images() if i.content_type == "image/jpeg"), key=lambda i: len(i.body)
        )
        cut = long_one.body[: len(long_one.body) // 2]
        assert isinstance(process_image(cut), ImageFailure)  # alone, it fails
        assert isinstance(await pool.process(long_one.body), ProcessedImage)
        assert await pool.process(_pieces(cut, 3)) == process_image(cut)
        assert pool.shares_memory
    finally:
        pool.close()


async def test_a_memfd_grown_past_the_keep_size_is_shrunk_after_its_image(pool, monkeypatch):
    monkeypatch.setattr(pool_module, "_KEEP_MEMFD_BYTES", 1024)
    assert isinstance(await pool.process(a_jpeg().body), ProcessedImage)
    (process,) = pool._all
    assert all(lane.memfd is not None for lane in process.lanes)
    assert all(os.fstat(lane.memfd).st_size == 0 for lane in process.lanes)
    assert isinstance(await pool.process(a_jpeg().body), ProcessedImage)


def _peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


# What a pool process's peak memory may grow by over all the hostile bodies: the only
# pixels they get decoded to are their small images' (256x256 at most). Measured: 5.5
# MiB; decoding the ICO entry that claims 10000x10000 alone added 97 MiB.
HOSTILE_PEAK_GROWTH_BYTES = 32 * 1024 * 1024


async def test_hostile_bodies_cost_the_pool_no_process_and_bounded_memory(
    one_process, hostile, encoders
):
    bodies = [h.body for h in hostile] + [
        # Valid, with a thousand frames: the first is thumbnailed.
        encoders.avif("avif-1000-frames", many_frames(1000)),
        encoders.animated_webp("webp-lossy-1000-frames", many_frames(1000), lossy=True),
    ]
    assert isinstance(await one_process.process(a_jpeg().body), ProcessedImage)
    (pid,) = one_process.pids
    before = _peak_rss_bytes(pid)

    outcomes = await asyncio.gather(*(one_process.process(body) for body in bodies))
    assert outcomes == [process_image(body) for body in bodies]
    assert [o.status for o in outcomes[: len(hostile)]] == [h.status for h in hostile]
    assert one_process.pids == [pid]  # no process died on any of them
    growth = _peak_rss_bytes(pid) - before
    assert growth < HOSTILE_PEAK_GROWTH_BYTES, f"peak memory grew by {growth / 2**20:.0f} MiB"
