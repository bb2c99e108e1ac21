"""A full disk under ``up``: the rule that pauses and resumes the crawl, the guard that
applies it to Redis's ``crawl_paused``, ``up``'s event log, and the archive's appends that
a full disk leaves whole or not at all."""

from __future__ import annotations

import json
import os
import resource
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from redis.exceptions import ConnectionError as RedisConnectionError

from crawlctl.localstack import archive as archive_module
from crawlctl.localstack.archive import OutputArchive
from crawlctl.localstack.disk import (
    MIB,
    DiskGuard,
    disk_reserve_bytes,
    resume_at_bytes,
    should_pause,
)
from crawlctl.localstack.events import EventLog
from crawlctl.localstack.files import append_whole, cut_to_last_line
from image_crawler import contract as c

RESERVE = 8 * MIB


@pytest.mark.parametrize(
    ("free", "paused", "after"),
    [
        (RESERVE, False, False),  # at the reserve: still running
        (RESERVE - 1, False, True),  # below it: paused
        (0, False, True),
        (RESERVE, True, True),  # back at the reserve: not yet (the margin)
        (resume_at_bytes(RESERVE) - 1, True, True),
        (resume_at_bytes(RESERVE), True, False),  # at the margin: resumed
        (100 * MIB, True, False),
    ],
)
def test_the_crawl_pauses_below_the_reserve_and_resumes_above_its_margin(
    free: int, paused: bool, after: bool
) -> None:
    assert should_pause(free, RESERVE, paused=paused) is after


def test_a_reserve_of_zero_never_pauses() -> None:
    assert should_pause(0, 0, paused=False) is False
    assert should_pause(0, 0, paused=True) is False


def test_the_margin_is_a_quarter_of_the_reserve_and_at_least_one_mib() -> None:
    assert resume_at_bytes(256 * MIB) == 320 * MIB
    assert resume_at_bytes(2 * MIB) == 3 * MIB


@pytest.mark.parametrize(
    ("environ", "expected"),
    [({}, 256 * MIB), ({"DISK_RESERVE_MB": "8"}, 8 * MIB), ({"DISK_RESERVE_MB": "0.5"}, MIB // 2)],
)
def test_the_reserve_comes_from_the_environment(environ: dict[str, str], expected: int) -> None:
    assert disk_reserve_bytes(environ) == expected


@pytest.mark.parametrize("raw", ["-1", "lots", "nan", "inf"])
def test_a_reserve_that_is_not_a_size_fails_with_its_name(raw: str) -> None:
    with pytest.raises(ValueError, match="DISK_RESERVE_MB must be a number of MiB >= 0"):
        disk_reserve_bytes({"DISK_RESERVE_MB": raw})


class FakeRedis:
    """``get``/``set``/``delete`` on a dict; ``down`` makes every call fail."""

    def __init__(self) -> None:
        self.keys: dict[str, Any] = {}
        self.down = False
        self.sets = 0

    def _check(self) -> None:
        if self.down:
            raise RedisConnectionError("Redis is away")

    def get(self, name: str) -> Any:
        self._check()
        return self.keys.get(name)

    def set(self, name: str, value: bytes) -> None:
        self._check()
        self.sets += 1
        self.keys[name] = value

    def delete(self, *names: str) -> None:
        self._check()
        for name in names:
            self.keys.pop(name, None)


class Events:
    def __init__(self) -> None:
        self.written: list[dict[str, Any]] = []

    def write(self, event: str, level: str = "info", **fields: Any) -> None:
        self.written.append({"event": event, "level": level, **fields})

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.written if e["event"] == event]


class Disk:
    """The guard's seams: the free space, the clock, the data folder's parts."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.now = 1_700_000_000.0
        self.measured = 0

    def measure(self, folders: Any) -> tuple[tuple[str, int], ...]:
        self.measured += 1
        return (("/data/broker", 20 * MIB), ("/data/redis", 3 * MIB), ("/data/logs", MIB))


@pytest.fixture
def setup() -> Iterator[tuple[DiskGuard, FakeRedis, Events, Disk, list[str]]]:
    redis, events, disk, said = FakeRedis(), Events(), Disk(100 * MIB), []
    guard = DiskGuard(
        [Path("/data")],
        RESERVE,
        redis,
        events,
        said.append,
        free=lambda _: disk.free,
        clock=lambda: disk.now,
        measure=disk.measure,
    )
    yield guard, redis, events, disk, said


def check_at(guard: DiskGuard, disk: Disk, after_s: float, free: int | None = None) -> None:
    disk.now += after_s
    if free is not None:
        disk.free = free
    guard.check()


def test_a_short_disk_pauses_the_crawl_in_redis_and_says_why(setup) -> None:
    guard, redis, events, disk, said = setup
    check_at(guard, disk, 0)
    assert redis.keys == {} and events.written == []
    check_at(guard, disk, 1, free=3 * MIB)
    pause = c.CrawlPause.from_json(redis.keys[c.CRAWL_PAUSED_KEY])
    assert pause.reason == c.PAUSE_DISK_FULL and pause.path == "/data"
    assert (pause.free_bytes, pause.reserve_bytes) == (3 * MIB, RESERVE)
    assert pause.needed_bytes == resume_at_bytes(RESERVE) - 3 * MIB == 7 * MIB
    assert pause.since_s == disk.now
    assert pause.biggest[0] == ("/data/broker", 20 * MIB)
    assert pause.message.startswith("the disk of /data is full: 3.0 MiB free, below the reserve")
    assert "free 7.0 MiB more" in pause.message
    assert "biggest parts: broker 20.0 MiB, redis 3.0 MiB" in pause.message
    (full,) = events.named("disk_full")
    assert full["level"] == "warning" and full["needed_bytes"] == 7 * MIB
    assert full["biggest"][0] == {"path": "/data/broker", "bytes": 20 * MIB}
    assert said == [f"crawl paused: {pause.message}"]


def test_while_paused_the_key_is_rewritten_every_few_seconds_and_measured_each_minute(
    setup,
) -> None:
    guard, redis, events, disk, _ = setup
    check_at(guard, disk, 0, free=3 * MIB)
    check_at(guard, disk, 0.5)  # checked at most every second
    check_at(guard, disk, 1, free=2 * MIB)
    assert redis.sets == 1 and disk.measured == 1
    check_at(guard, disk, 4.5)
    assert redis.sets == 2
    assert c.CrawlPause.from_json(redis.keys[c.CRAWL_PAUSED_KEY]).free_bytes == 2 * MIB
    check_at(guard, disk, 60)
    assert disk.measured == 2
    assert len(events.named("disk_full")) == 1


def test_space_back_above_the_margin_resumes_the_crawl(setup) -> None:
    guard, redis, events, disk, said = setup
    check_at(guard, disk, 0, free=3 * MIB)
    check_at(guard, disk, 1, free=RESERVE + MIB)  # above the reserve, not its margin
    assert c.CRAWL_PAUSED_KEY in redis.keys
    check_at(guard, disk, 10, free=resume_at_bytes(RESERVE))
    assert redis.keys == {}
    (recovered,) = events.named("disk_space_recovered")
    assert recovered["paused_s"] == 11.0 and recovered["free_bytes"] == 10 * MIB
    assert said[-1] == "crawl resumed: 10.0 MiB free on the disk of /data"
    assert guard.paused is None


def test_a_redis_that_does_not_answer_gets_the_pause_at_the_next_check(setup) -> None:
    guard, redis, events, disk, _ = setup
    redis.down = True
    check_at(guard, disk, 0, free=3 * MIB)
    assert events.named("crawl_pause_unwritten")
    redis.down = False
    check_at(guard, disk, 1)
    assert c.CRAWL_PAUSED_KEY in redis.keys
    redis.down = True
    check_at(guard, disk, 1, free=50 * MIB)
    assert guard.paused is not None  # not resumed until Redis has it
    redis.down = False
    check_at(guard, disk, 1)
    assert redis.keys == {} and guard.paused is None


def test_a_disk_pause_an_earlier_run_left_is_lifted_an_operators_is_not(setup) -> None:
    guard, redis, _, disk, said = setup
    left = c.CrawlPause(c.PAUSE_DISK_FULL, "the disk of /data is full", since_s=1.0)
    redis.keys[c.CRAWL_PAUSED_KEY] = left.to_json()
    check_at(guard, disk, 0)
    assert redis.keys == {} and said
    redis.keys[c.CRAWL_PAUSED_KEY] = b"maintenance until 3pm"
    check_at(guard, disk, 1)
    assert redis.keys[c.CRAWL_PAUSED_KEY] == b"maintenance until 3pm"
    pause = c.CrawlPause.from_json(b"maintenance until 3pm")
    assert (pause.reason, pause.message) == (c.PAUSE_OPERATOR, "maintenance until 3pm")


def test_a_pause_round_trips_through_json() -> None:
    pause = c.CrawlPause(c.PAUSE_DISK_FULL, "full", 12.5, "/data", 1, 2, 3, (("/data/broker", 4),))
    assert c.CrawlPause.from_json(pause.to_json()) == pause
    assert json.loads(pause.to_json())["biggest"] == [{"path": "/data/broker", "bytes": 4}]


def test_ups_events_are_json_lines(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "up.log")
    log.write("disk_full", "warning", path="/data", free_bytes=3)
    (line,) = (tmp_path / "up.log").read_text().splitlines()
    event = json.loads(line)
    assert (event["event"], event["level"], event["free_bytes"]) == ("disk_full", "warning", 3)
    assert event["time"].endswith("Z")
    EventLog(tmp_path / "no-such-folder" / "up.log").write("disk_full")  # dropped, not raised


def _append_under_a_size_limit(path: Path, limit: int) -> int:
    """In a child process whose files may not grow past ``limit`` bytes (EFBIG, as a full
    disk refuses a write), append 900 bytes and then 180 more; returns the child's exit
    code: 0 when the second append raised and the file is back to its 900 bytes. A child,
    because the limit binds every file its process writes, pytest's own output (sent to a
    file in CI) among them."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports by its exit code
        code = 1
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
            append_whole(fd, b'{"a": 1}\n' * 100)
            try:
                append_whole(fd, b'{"b": 2}\n' * 20)  # only 100 of the 180 bytes fit
            except OSError:
                code = 0 if path.read_bytes() == b'{"a": 1}\n' * 100 else 3
            else:
                code = 2
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_an_append_the_disk_refuses_in_part_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    assert _append_under_a_size_limit(path, 1000) == 0  # 2: not refused, 3: left cut
    assert path.read_bytes() == b'{"a": 1}\n' * 100


def test_a_line_cut_by_a_crash_is_cut_off(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"a": 1}\n' * 10_000 + b'{"b": ')
    fd = os.open(path, os.O_RDWR)
    try:
        assert cut_to_last_line(fd) == 6
        assert cut_to_last_line(fd) == 0
    finally:
        os.close(fd)
    assert path.read_bytes() == b'{"a": 1}\n' * 10_000
    path.write_bytes(b"no newline at all")
    fd = os.open(path, os.O_RDWR)
    try:
        cut_to_last_line(fd)
    finally:
        os.close(fd)
    assert path.read_bytes() == b""


class Record:
    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self.topic, self.partition, self.offset = topic, partition, offset
        self.value = json.dumps({"identifier": f"{topic}-{partition}-{offset}"}).encode()


class Consumer:
    def __init__(self) -> None:
        self.seeks: list[tuple[TopicPartition, int]] = []

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))


def test_records_the_disk_refused_are_read_again_and_none_is_half_archived(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = OutputArchive("unused:9092", tmp_path)
    archive._files = {
        topic: os.open(tmp_path / f"{topic}.jsonl", os.O_RDWR | os.O_APPEND | os.O_CREAT)
        for topic in archive.topics
    }
    metadata, link_rot = TopicPartition(c.METADATA_TOPIC, 0), TopicPartition(c.LINK_ROT_TOPIC, 0)
    batch = {
        metadata: [Record(c.METADATA_TOPIC, 0, n) for n in range(3)],
        link_rot: [Record(c.LINK_ROT_TOPIC, 0, n) for n in range(5, 7)],
    }
    full = {"disk": True}

    def append(fd: int, data: bytes) -> None:
        if full["disk"] and fd == archive._files[c.LINK_ROT_TOPIC]:
            raise OSError(28, "No space left on device")
        append_whole(fd, data)

    monkeypatch.setattr(archive_module, "append_whole", append)
    consumer = Consumer()
    try:
        refused = archive._write_batch(consumer, batch)  # type: ignore[arg-type]
        assert isinstance(refused, OSError)
        assert consumer.seeks == [(link_rot, 5)]
        assert archive._positions == {metadata: 3}
        assert archive.counts[c.LINK_ROT_TOPIC] == 0
        full["disk"] = False
        assert archive._write_batch(consumer, {link_rot: batch[link_rot]}) is None  # type: ignore[arg-type]
        assert archive._positions == {metadata: 3, link_rot: 7}
    finally:
        archive._close()
    lines = (tmp_path / f"{c.LINK_ROT_TOPIC}.jsonl").read_text().splitlines()
    assert [json.loads(line)["identifier"] for line in lines] == [
        f"{c.LINK_ROT_TOPIC}-0-5",
        f"{c.LINK_ROT_TOPIC}-0-6",
    ]
