"""Where a worker's results go: thumbnails to a store, messages to a sink.

Each is one narrow seam: thumbnails go to S3 (production) or a local folder (the local
stack of ``image-crawler up``), messages to Kafka. Adapters turn the failures of their
service into ``DependencyError`` so the pipeline can wait and retry instead of losing the
URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from botocore.exceptions import BotoCoreError, ClientError


class DependencyError(Exception):
    """A service the worker depends on failed; ``retriable`` says whether to try again."""

    def __init__(self, service: str, cause: BaseException, *, retriable: bool = True) -> None:
        super().__init__(f"{service}: {cause!r}")
        self.service = service
        self.retriable = retriable


class ThumbnailStore(Protocol):
    async def put(self, key: str, data: bytes) -> None:
        """Store ``data`` (a JPEG) under ``key``; storing twice is harmless."""
        ...


class MetadataSink(Protocol):
    async def publish(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        """Return once the broker has acknowledged the message."""
        ...


class S3ThumbnailStore:
    def __init__(self, client: Any, bucket: str) -> None:
        self._client = client  # an aioboto3 S3 client, entered by the caller
        self._bucket = bucket

    async def put(self, key: str, data: bytes) -> None:
        try:
            await self._client.put_object(
                Bucket=self._bucket, Key=key, Body=data, ContentType="image/jpeg"
            )
        except (BotoCoreError, ClientError) as e:
            raise DependencyError("s3", e) from e


class LocalThumbnailStore:
    """Thumbnails as files ``{directory}/{key}``, for a crawl on one machine.

    Each write goes to a temporary file in the same folder and is renamed over the target
    (``os.replace``), so a reader never sees half a thumbnail and writing twice is
    harmless. The file system calls run in a thread, off the event loop.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    async def put(self, key: str, data: bytes) -> None:
        try:
            await asyncio.to_thread(self._write, key, data)
        except OSError as e:
            raise DependencyError("local_store", e) from e

    def _write(self, key: str, data: bytes) -> None:
        target = self.directory / key
        if target.parent != self.directory or key in ("", ".", ".."):
            # Keys are `{uuid}.jpg`; anything naming another folder is a bug upstream.
            raise ValueError(f"thumbnail key is not a plain file name: {key!r}")
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=f".{key}.", suffix=".tmp", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(temp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise


class KafkaSink:
    def __init__(self, producer: AIOKafkaProducer) -> None:
        self._producer = producer

    async def publish(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        try:
            delivery = await self._producer.send(topic, value, key=key)
            await delivery
        except KafkaError as e:
            raise DependencyError("kafka", e, retriable=getattr(e, "retriable", True)) from e
