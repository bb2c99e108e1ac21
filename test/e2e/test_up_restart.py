"""``image-crawler up`` stopped mid-crawl, cleanly or by ``kill -9`` of it and of every
process it started, and started again on the same data folder: every URL produced ends
in an output, and Redis's state is still there.

The command runs as an operator runs it (the console script, a subprocess, SIGTERM then
Ctrl-C), crawling a local origin at a few requests per second so that the first run is
stopped with most URLs still queued in its broker. A few images are held at the origin
until the first run has stopped, so that however fast the machine (or however slow the
archive), the first run cannot end every URL before its stop.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from crawlctl.commands.demo import image_count_for_rate
from image_crawler import contract as c
from test.harness.crawl import Gate, tiny_jpeg
from test.harness.origin import Origin
from test.harness.processes import Command, kill_all
from test.harness.services import produce, wait_until

SOURCE = "restartsrc"
# Slow enough that the first run stops with most URLs queued, fast enough for a short test.
RATE_RPS = 4.0
IMAGES = 40
HELD = 3  # of the images: answered only once the first run has stopped
MISSING = 3  # answer 404: link_rot
BROKEN = 2  # not images: crawl_errors
OUTPUTS = (c.METADATA_TOPIC, c.LINK_ROT_TOPIC, c.CRAWL_ERRORS_TOPIC)


class Up(Command):
    """``image-crawler up`` in a subprocess."""

    def __init__(self, *args: str, cwd: Path) -> None:
        super().__init__("up", *args, cwd=cwd)


@pytest.fixture
def started() -> Iterator[list[Up]]:
    runs: list[Up] = []
    yield runs
    for run in runs:
        run.kill()


def ended(outputs: Path) -> dict[str, set[str]]:
    """The uuids each archived output ends (resolutions only, not the EXIF messages)."""
    found: dict[str, set[str]] = {}
    for topic in OUTPUTS:
        path = outputs / f"{topic}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        messages = [json.loads(line) for line in lines]
        if topic == c.METADATA_TOPIC:
            messages = [m for m in messages if "width" in m]
        found[topic] = {m["identifier"] for m in messages}
    return found


def all_ended(outputs: Path) -> set[str]:
    return set().union(*ended(outputs).values())


def up_args(tmp_path: Path) -> tuple[str, ...]:
    """``up``'s arguments: one worker, one source at RATE_RPS, the data in tmp_path/data."""
    sources = tmp_path / "sources.json"
    count = image_count_for_rate(RATE_RPS)
    sources.write_text(json.dumps([{"source_name": SOURCE, "image_count": count}]))
    data = tmp_path / "data"
    return ("--workers", "1", "--sources-file", str(sources), "--data-dir", str(data))


def serve(origin: Origin, held: Gate | None = None) -> dict[str, str]:
    """uuid -> path on ``origin``: IMAGES images (the last HELD behind ``held``, if given),
    MISSING gone, BROKEN not images."""
    paths = {f"ok{n}": f"/img/{n}.jpg" for n in range(IMAGES)}
    paths |= {f"gone{n}": f"/gone/{n}.jpg" for n in range(MISSING)}
    paths |= {f"bad{n}": f"/bad/{n}.jpg" for n in range(BROKEN)}
    held_uuids = {f"ok{n}" for n in range(IMAGES - HELD, IMAGES)} if held else set()
    body = tiny_jpeg()
    for uuid, path in paths.items():
        if held is not None and uuid in held_uuids:
            origin.add_handler(path, held)
        elif uuid.startswith("ok"):
            origin.add(path, body, "image/jpeg")
        elif uuid.startswith("bad"):
            origin.add(path, b"not an image", "image/jpeg")
    return paths


async def feed(run: Up, origin: Origin, paths: dict[str, str]) -> str:
    """Produce one inbound message per path once ``run`` is up; its Redis URL."""
    broker = (await asyncio.to_thread(run.wait_for_line, r"^\s+broker\s+(\S+)", 60)).group(1)
    messages = [
        json.dumps({"url": origin.url(path), "uuid": uuid, "source": SOURCE}).encode()
        for uuid, path in sorted(paths.items())
    ]
    await produce(broker, c.INBOUND_TOPIC, messages)
    return run.wait_for_line(r"^\s+redis\s+(redis://\S+)", 1).group(1)


def check_outputs(outputs: Path, origin: Origin, paths: dict[str, str]) -> None:
    """Every uuid ended where it should, each crawled at least once."""
    final = ended(outputs)
    assert final[c.METADATA_TOPIC] >= {u for u in paths if u.startswith("ok")}
    assert final[c.LINK_ROT_TOPIC] >= {u for u in paths if u.startswith("gone")}
    assert final[c.CRAWL_ERRORS_TOPIC] >= {u for u in paths if u.startswith("bad")}
    # Crawled at least once each; a URL handed back at the stop may have been fetched twice.
    for uuid, path in paths.items():
        assert origin.requests(path) >= 1, uuid


async def test_a_restart_mid_crawl_loses_no_url_and_keeps_redis_state(
    origin: Origin, tmp_path: Path, started: list[Up]
) -> None:
    args = up_args(tmp_path)
    data = tmp_path / "data"
    outputs = data / "outputs"
    held = Gate(tiny_jpeg())
    paths = serve(origin, held)
    uuids = set(paths)

    # --- the first run: stopped with most URLs still queued --------------------------------
    first = Up(*args, cwd=tmp_path)
    started.append(first)
    redis_url = await feed(first, origin, paths)

    redis = Redis.from_url(redis_url, decode_responses=True)
    try:
        # An operator's state, set while it runs.
        redis.sadd(c.HALTED_SET, "anothersource")
        redis.set(c.override_key("anothersource"), "0.5")
        await asyncio.to_thread(
            wait_until, lambda: len(all_ended(outputs)) >= 5, 60, what="some outputs archived"
        )
        resized_before_stop = int(redis.get(c.num_resized_key(SOURCE)) or 0)
    finally:
        redis.close()
    assert await asyncio.to_thread(first.stop, signal.SIGTERM) == 0, first.stderr
    done_first = all_ended(outputs)
    # Mid-way: outputs exist, and the rest is queued in the broker's storage (no spool).
    assert 5 <= len(done_first) < len(uuids)
    assert not (data / "spool.jsonl").exists()
    assert "queued URLs" not in first.stderr
    held.opened.set()

    # --- the second run: the queue and Redis are where they were; it finishes -------------
    second = Up(*args, cwd=tmp_path)
    started.append(second)
    await asyncio.to_thread(second.wait_for_line, r"^\s+broker\s+(\S+)", 60)
    redis_url = second.wait_for_line(r"^\s+redis\s+(redis://\S+)", 1).group(1)
    redis = Redis.from_url(redis_url, decode_responses=True)
    try:
        assert redis.sismember(c.HALTED_SET, "anothersource")
        assert redis.get(c.override_key("anothersource")) == "0.5"
        assert int(redis.get(c.num_resized_key(SOURCE)) or 0) >= resized_before_stop > 0
    finally:
        redis.close()

    await asyncio.to_thread(
        wait_until, lambda: all_ended(outputs) >= uuids, 90, what="every URL to end"
    )
    assert await asyncio.to_thread(second.stop, signal.SIGINT) == 0, second.stderr
    assert second.stderr.splitlines()[-1] == "image-crawler: stopped"

    check_outputs(outputs, origin, paths)
    print(
        f"first run ended {len(done_first)} of {len(uuids)} URLs; requests {origin.total_requests}"
    )


async def test_a_kill_9_of_up_and_all_it_started_loses_no_url(
    origin: Origin, tmp_path: Path, started: list[Up]
) -> None:
    args = up_args(tmp_path)
    outputs = tmp_path / "data" / "outputs"
    held = Gate(tiny_jpeg())
    paths = serve(origin, held)
    uuids = set(paths)

    first = Up(*args, cwd=tmp_path)
    started.append(first)
    await feed(first, origin, paths)
    await asyncio.to_thread(
        wait_until, lambda: len(all_ended(outputs)) >= 5, 60, what="some outputs archived"
    )
    # up, SeaweedFS, tansu, redis-server, the monitor, the worker and its image processes.
    killed = kill_all(first)
    assert len(killed) >= 7
    done_first = all_ended(outputs)
    assert 5 <= len(done_first) < len(uuids)
    held.opened.set()

    second = Up(*args, cwd=tmp_path)
    started.append(second)
    await asyncio.to_thread(second.wait_for_line, r"^\s+broker\s+(\S+)", 60)
    await asyncio.to_thread(
        wait_until, lambda: all_ended(outputs) >= uuids, 120, what="every URL to end"
    )
    assert await asyncio.to_thread(second.stop, signal.SIGINT) == 0, second.stderr
    check_outputs(outputs, origin, paths)
    print(
        f"killed {len(killed)} processes with {len(done_first)} of {len(uuids)} URLs ended;"
        f" requests {origin.total_requests}"
    )
