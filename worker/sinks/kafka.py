"""Messages to Kafka: the metadata, link-rot and crawl-error topics."""

from __future__ import annotations

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, KafkaTimeoutError, UnknownError

from worker.sinks.base import DependencyError, Stalls


class KafkaSink:
    def __init__(self, producer: AIOKafkaProducer, *, stalls: Stalls | None = None) -> None:
        self._producer = producer
        self._stalls = stalls or Stalls("kafka")

    async def publish(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        try:
            await self._stalls.watch("publish", self._send(topic, value, key))
        except KafkaError as e:
            raise DependencyError("kafka", e, retriable=_retriable(e)) from e

    async def _send(self, topic: str, value: bytes, key: bytes | None) -> None:
        # send() itself waits while the producer's buffer is full (a broker that is away).
        delivery = await self._producer.send(topic, value, key=key)
        await delivery


def _retriable(error: KafkaError) -> bool:
    """Whether to publish again. aiokafka's own verdict, but for UNKNOWN_SERVER_ERROR (-1),
    which it calls final: the broker failed inside, and may well not the next time. The
    fault campaign saw tansu answer it to every produce in flight when it was continued
    after 38 s stopped (SIGSTOP); called final, the URLs whose outputs were being
    published ended in crawl_errors as InternalError, good images among them. A URL
    whose output cannot be published waits, as for a broker that is away. So does
    KafkaTimeoutError, which send() raises when the producer's buffer stayed full (the
    broker away) longer than its timeout, and which aiokafka calls final too: the
    60-minute campaign dead-lettered 107 good images with it (InternalError)."""
    if isinstance(error, (UnknownError, KafkaTimeoutError)):
        return True
    return bool(getattr(error, "retriable", True))
