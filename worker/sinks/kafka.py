"""Messages to Kafka: the metadata, link-rot and crawl-error topics."""

from __future__ import annotations

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from worker.sinks.base import DependencyError, Stalls


class KafkaSink:
    def __init__(self, producer: AIOKafkaProducer, *, stalls: Stalls | None = None) -> None:
        self._producer = producer
        self._stalls = stalls or Stalls("kafka")

    async def publish(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        try:
            await self._stalls.watch("publish", self._send(topic, value, key))
        except KafkaError as e:
            raise DependencyError("kafka", e, retriable=getattr(e, "retriable", True)) from e

    async def _send(self, topic: str, value: bytes, key: bytes | None) -> None:
        # send() itself waits while the producer's buffer is full (a broker that is away).
        delivery = await self._producer.send(topic, value, key=key)
        await delivery
