"""The local thumbnail store and the setting that chooses a store."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from image_crawler.config import ConfigError
from worker.outputs import DependencyError, LocalThumbnailStore
from worker.settings import ThumbnailSettings, WorkerSettings


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
