"""The local thumbnail store, the setting that chooses a store, ``Stalls``, and which of the
broker's errors a publish waits out."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from aiokafka import errors as aiokafka_errors
from botocore.exceptions import BotoCoreError
from structlog.testing import capture_logs

from image_crawler.config import ConfigError
from test.harness.services import wait_for
from worker.settings import ThumbnailSettings, WorkerSettings
from worker.sinks.base import DependencyError, Stalls
from worker.sinks.kafka import KafkaSink
from worker.sinks.local import LocalThumbnailStore


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


async def test_put_writes_the_bytes_under_the_key(tmp_path: Path) -> None:
    store = LocalThumbnailStore(tmp_path / "thumbs")  # created on first write
    await store.put("a.jpg", b"first")
    await store.put("b.jpg", b"second")
    assert (tmp_path / "thumbs" / "a.jpg").read_bytes() == b"first"
    assert (tmp_path / "thumbs" / "b.jpg").read_bytes() == b"second"
    assert names(tmp_path / "thumbs") == ["a.jpg", "b.jpg"]


async def test_writing_twice_is_harmless_and_the_last_write_wins(tmp_path: Path) -> None:
    store = LocalThumbnailStore(tmp_path)
    await store.put("same.jpg", b"one")
    await store.put("same.jpg", b"two")
    assert (tmp_path / "same.jpg").read_bytes() == b"two"
    assert names(tmp_path) == ["same.jpg"]


async def test_a_failed_write_leaves_the_old_file_whole_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalThumbnailStore(tmp_path)
    await store.put("kept.jpg", b"old thumbnail")

    def failing_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(DependencyError) as caught:
        await store.put("kept.jpg", b"new thumbnail that never lands")
    assert caught.value.retriable  # the pipeline waits and tries again
    assert caught.value.service == "local_store"
    assert (tmp_path / "kept.jpg").read_bytes() == b"old thumbnail"
    assert names(tmp_path) == ["kept.jpg"]


async def test_the_file_is_written_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[int] = []
    real_replace = os.replace

    def recording_replace(src: str, dst: str) -> None:
        threads.append(threading.get_ident())
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", recording_replace)
    await LocalThumbnailStore(tmp_path).put("x.jpg", b"data")
    assert threads and threads[0] != threading.get_ident()


@pytest.mark.parametrize("key", ["../escape.jpg", "sub/dir.jpg", "", ".."])
async def test_a_key_that_is_not_a_file_name_is_refused(tmp_path: Path, key: str) -> None:
    with pytest.raises(ValueError, match="plain file name"):
        await LocalThumbnailStore(tmp_path / "t").put(key, b"data")
    assert not (tmp_path / "escape.jpg").exists()


async def test_an_unwritable_folder_is_a_retriable_dependency_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")  # a file where the folder should be
    with pytest.raises(DependencyError):
        await LocalThumbnailStore(tmp_path / "file").put("a.jpg", b"data")


@pytest.mark.parametrize(
    ("env", "store", "directory"),
    [
        ({}, "s3", Path("thumbnails")),
        ({"THUMBNAIL_STORE": "s3"}, "s3", Path("thumbnails")),
        ({"THUMBNAIL_STORE": "local"}, "local", Path("thumbnails")),
        ({"THUMBNAIL_STORE": " LOCAL ", "THUMBNAIL_DIR": "/data/t"}, "local", Path("/data/t")),
    ],
)
def test_thumbnail_settings_from_the_environment(
    env: dict[str, str], store: str, directory: Path
) -> None:
    settings = WorkerSettings.from_env(env).thumbnails
    assert settings == ThumbnailSettings(store=store, directory=directory)  # type: ignore[arg-type]


def test_an_unknown_thumbnail_store_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="THUMBNAIL_STORE must be one of s3, local"):
        WorkerSettings.from_env({"THUMBNAIL_STORE": "ftp"})


# --- Stalls: a service that stops answering is reported, not cut short -------------------


async def test_a_prompt_answer_is_not_reported() -> None:
    stalls = Stalls("s3", after_s=0.5)

    async def answer() -> str:
        return "ok"

    with capture_logs() as logs:
        assert await stalls.watch("s3_put", answer()) == "ok"
    assert logs == []


@pytest.mark.timing("asserts a stuck call's reported seconds to 0.05 ± 0.01 s")
async def test_stuck_calls_are_reported_once_and_their_end_once() -> None:
    stalls = Stalls("kafka", after_s=0.05)
    back = asyncio.Event()

    async def stuck(n: int) -> int:
        await back.wait()
        return n

    with capture_logs() as logs:
        calls = [asyncio.create_task(stalls.watch("publish", stuck(n))) for n in range(3)]
        await wait_for(lambda: stalls.stuck == 3, 5, what="3 stuck calls")
        assert [e["event"] for e in logs] == ["dependency_unavailable"]
        assert not any(call.done() for call in calls)  # waited for, not cut short
        back.set()
        assert await asyncio.gather(*calls) == [0, 1, 2]
    down, up = logs
    assert down["service"] == "kafka" and down["op"] == "publish"
    assert down["unavailable_s"] == pytest.approx(0.05, abs=0.01)
    assert up["event"] == "dependency_recovered"
    assert up["service"] == "kafka" and up["stuck_calls"] == 3
    assert up["unavailable_s"] >= 0.05


async def test_a_stuck_call_raises_what_the_call_raises() -> None:
    stalls = Stalls("s3", after_s=0.01)

    async def fails_late() -> None:
        await asyncio.sleep(0.05)
        raise BotoCoreError()

    with capture_logs() as logs, pytest.raises(BotoCoreError):
        await stalls.watch("s3_put", fails_late())
    assert [e["event"] for e in logs] == ["dependency_unavailable", "dependency_recovered"]


async def test_cancelling_the_watch_cancels_the_call() -> None:
    stalls = Stalls("s3", after_s=0.01)
    cancelled = asyncio.Event()

    async def never() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    watch = asyncio.create_task(stalls.watch("s3_put", never()))
    await wait_for(lambda: stalls.stuck == 1, 5, what="a stuck call")
    watch.cancel()
    await asyncio.wait_for(cancelled.wait(), 1)
    assert stalls.stuck == 0


class FailingProducer:
    """An AIOKafkaProducer whose every delivery fails with ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> Any:
        delivery = asyncio.get_running_loop().create_future()
        delivery.set_exception(self.error)
        return delivery


@pytest.mark.parametrize(
    ("error", "retriable"),
    [
        # tansu answers -1 to what was in flight when it is continued after a SIGSTOP
        # (the fault campaign): published again, not a dead letter.
        (aiokafka_errors.UnknownError(), True),
        # send() when the producer's buffer stayed full (a broker away): the same.
        (aiokafka_errors.KafkaTimeoutError(), True),
        (aiokafka_errors.RequestTimedOutError(), True),
        (aiokafka_errors.MessageSizeTooLargeError(), False),
    ],
)
async def test_a_broker_s_unknown_error_is_published_again_a_final_one_is_not(error, retriable):
    sink = KafkaSink(FailingProducer(error))  # type: ignore[arg-type]
    with pytest.raises(DependencyError) as caught:
        await sink.publish("image_metadata_updates", b"{}")
    assert caught.value.retriable is retriable
