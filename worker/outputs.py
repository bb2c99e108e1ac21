"""Where a worker's results go: thumbnails to a store, messages to a sink.

Each is one narrow seam with one real adapter (S3, Kafka). Adapters turn the failures of
their service into ``DependencyError`` so the pipeline can wait and retry instead of
losing the URL.
"""

from __future__ import annotations

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


class KafkaSink:
    def __init__(self, producer: AIOKafkaProducer) -> None:
        self._producer = producer

    async def publish(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        try:
            delivery = await self._producer.send(topic, value, key=key)
            await delivery
        except KafkaError as e:
            raise DependencyError("kafka", e, retriable=getattr(e, "retriable", True)) from e
