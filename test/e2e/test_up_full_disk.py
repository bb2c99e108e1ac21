"""``image-crawler up`` on a small filesystem that fills mid-crawl: the crawl pauses, says
why in its log, in ``status``, in Redis and on the dashboard's ``/metrics``, loses and
half-writes nothing, and resumes by itself once space is freed.

The data folder is on a 40 MiB tmpfs the test mounts (root only: skipped otherwise),
with a reserve of 8 MiB (``DISK_RESERVE_MB``). Mid-crawl, a filler file takes all but
4 MiB of it: below the reserve, above what Redis and the logs need meanwhile. A few images
are held at the origin until the space is freed, so that however fast the crawl (or slow
the test), it cannot end every URL before the disk fills.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from PIL import Image
from redis import Redis

from crawlctl.localstack.disk import free_bytes
from image_crawler import contract as c
from test.e2e.test_up_restart import (
    HELD,
    IMAGES,
    SOURCE,
    Up,
    all_ended,
    ended,
    feed,
    serve,
    up_args,
)
from test.harness.crawl import Gate, tiny_jpeg
from test.harness.origin import Origin
from test.harness.processes import SCRIPT
from test.harness.services import wait_until

DISK_MIB = 40
RESERVE_MIB = 8
LEFT_FREE_MIB = 4
MIB = 1024 * 1024
# Once paused: how long the origin's request count must stand still before the pause is
# watched (requests granted before it finish), and how long it is then watched.
SETTLED_S = 1.0
WATCHED_S = 4.0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 40 MiB tmpfs at tmp_path/disk, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MIB}m", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture
def started() -> Iterator[list[Up]]:
    runs: list[Up] = []
    yield runs
    for run in runs:
        run.kill()


def fill(disk: Path, leave_bytes: int) -> Path:
    """A filler file taking all of ``disk``'s free space but ``leave_bytes``."""
    filler = disk / "filler"
    size = free_bytes(disk) - leave_bytes
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)
    return filler


def unchanged_for(read: Callable[[], int], quiet_s: float) -> Callable[[], bool]:
    """A ``wait_until`` predicate: true once ``read()`` has not changed for ``quiet_s``."""
    last, since = read(), time.monotonic()

    def settled() -> bool:
        nonlocal last, since
        now = read()
        if now != last:
            last, since = now, time.monotonic()
        return time.monotonic() - since >= quiet_s

    return settled


def up_events(data: Path, event: str) -> list[dict]:
    path = data / "logs" / "up.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [e for e in map(json.loads, lines) if e["event"] == event]


def log_events(path: Path, event: str) -> list[dict]:
    found = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == event:
            found.append(record)
    return found


def status(redis_url: str, *args: str) -> str:
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "crawlctl"]
    done = subprocess.run(
        [*command, "status", "--once", "--redis", redis_url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def metrics(run: Up) -> str:
    port = run.wait_for_line(r"^\s+dashboard\s+http://127\.0\.0\.1:(\d+)/", 1).group(1)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def check_pause_is_visible(run: Up, data: Path, redis: Redis, redis_url: str) -> None:
    """The pause in up's log and stderr, Redis, the monitor's log, status and /metrics."""
    (full,) = up_events(data, "disk_full")
    print("up.log:", json.dumps(full))
    assert full["path"] == str(data) and full["level"] == "warning"
    assert full["free_bytes"] < RESERVE_MIB * MIB < full["free_bytes"] + full["needed_bytes"]
    assert {Path(b["path"]).name for b in full["biggest"]} >= {"broker", "redis", "logs"}
    run.wait_for_line(r"crawl paused: the disk of .* is full", 5, stderr=True)
    pause = c.CrawlPause.from_json(redis.get(c.CRAWL_PAUSED_KEY))
    assert pause.reason == c.PAUSE_DISK_FULL and pause.needed_bytes
    assert "free" in pause.message and "broker" in pause.message
    wait_until(
        lambda: log_events(data / "logs" / "monitor.log", "crawl_paused"), 10, what="crawl_paused"
    )
    print("monitor.log:", json.dumps(log_events(data / "logs" / "monitor.log", "crawl_paused")[0]))
    document = json.loads(status(redis_url, "--json"))
    assert document["general"]["paused"]["reason"] == c.PAUSE_DISK_FULL
    assert "CRAWL PAUSED: the disk of" in status(redis_url)
    text = wait_until(
        lambda: next((m for m in [metrics(run)] if "crawler_crawl_paused 1.0" in m), None),
        10,
        what="the pause on /metrics",
    )
    assert 'crawler_crawl_pause_info{message="the disk of' in text


def check_nothing_lost_or_half_written(data: Path, paths: dict[str, str]) -> None:
    """Each uuid ended where it should (and nowhere else), every archive line is JSON,
    every thumbnail a whole image, no temporary file left."""
    outputs = data / "outputs"
    for archive in outputs.glob("*.jsonl"):
        for line in archive.read_text().splitlines():
            json.loads(line)
    final = ended(outputs)
    assert final[c.METADATA_TOPIC] == {u for u in paths if u.startswith("ok")}
    assert final[c.LINK_ROT_TOPIC] == {u for u in paths if u.startswith("gone")}
    assert final[c.CRAWL_ERRORS_TOPIC] == {u for u in paths if u.startswith("bad")}
    thumbnails = data / "thumbnails"
    assert sorted(p.name for p in thumbnails.iterdir()) == sorted(
        f"{u}.jpg" for u in paths if u.startswith("ok")
    )
    for thumbnail in thumbnails.iterdir():
        with Image.open(thumbnail) as image:
            image.load()
            assert image.format == "JPEG"


async def test_a_full_disk_pauses_the_crawl_and_space_freed_resumes_it(
    origin: Origin,
    tmp_path: Path,
    small_disk: Path,
    started: list[Up],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DISK_RESERVE_MB", str(RESERVE_MIB))
    args = list(up_args(tmp_path))
    data = small_disk / "data"
    args[args.index("--data-dir") + 1] = str(data)
    held = Gate(tiny_jpeg())
    paths = serve(origin, held)
    uuids = set(paths)
    held_uuids = {f"ok{n}" for n in range(IMAGES - HELD, IMAGES)}  # as serve() holds them

    run = Up(*args, cwd=tmp_path)
    started.append(run)
    redis_url = await feed(run, origin, paths)
    redis = Redis.from_url(redis_url, decode_responses=True)
    try:
        await asyncio.to_thread(
            wait_until, lambda: len(all_ended(data / "outputs")) >= 5, 60, what="5 URLs ended"
        )
        assert not up_events(data, "disk_full")
        filler = fill(small_disk, LEFT_FREE_MIB * MIB)
        await asyncio.to_thread(
            wait_until, lambda: up_events(data, "disk_full"), 10, what="disk_full"
        )
        await asyncio.to_thread(check_pause_is_visible, run, data, redis, redis_url)

        # Paused: every source paced at 0, and no request starts any more.
        await asyncio.to_thread(
            wait_until,
            lambda: redis.get(c.pace_rate_key(SOURCE)) == "0",
            10,
            what="the source paced at 0",
        )
        await asyncio.to_thread(
            wait_until,
            unchanged_for(lambda: origin.total_requests, SETTLED_S),
            30,
            what="the requests granted before the pause to finish",
        )

        # And every URL answered by then has ended (its image processed, published and
        # archived: a busy machine takes seconds), but the held ones, still in flight.
        def answered_ended() -> bool:
            answered = {u for u, path in paths.items() if origin.requests(path)} - held_uuids
            return all_ended(data / "outputs") >= answered

        await asyncio.to_thread(
            wait_until, answered_ended, 60, what="the URLs answered before the pause to end"
        )
        requests, done = origin.total_requests, len(all_ended(data / "outputs"))
        await asyncio.sleep(WATCHED_S)  # a window to see that nothing starts: no event to await
        assert origin.total_requests == requests
        assert len(all_ended(data / "outputs")) == done < len(uuids)
        print(f"paused with {done} of {len(uuids)} URLs ended, {free_bytes(small_disk)} B free")

        filler.unlink()
        held.opened.set()
        await asyncio.to_thread(
            wait_until,
            lambda: up_events(data, "disk_space_recovered"),
            10,
            what="disk_space_recovered",
        )
        assert redis.get(c.CRAWL_PAUSED_KEY) is None
        await asyncio.to_thread(
            wait_until,
            lambda: all_ended(data / "outputs") >= uuids,
            120,
            what="every URL to end",
        )
        assert json.loads(status(redis_url, "--json"))["general"]["paused"] is None
    finally:
        redis.close()
    assert await asyncio.to_thread(run.stop, signal.SIGINT) == 0, run.stderr
    check_nothing_lost_or_half_written(data, paths)
    assert log_events(data / "logs" / "monitor.log", "crawl_pause_lifted")
    assert not re.search(r"exited unexpectedly", run.stderr)
