"""One URL from its source queue to its results: token, download, image, S3, Kafka, stats.

``Pipeline.handle`` returns only once the message is finished, meaning its thumbnail is
stored and its messages are acknowledged, or its failure is recorded and sent where the
contract says (``link_rot``, a retry through ``inbound_images``, or ``crawl_errors``).
Only then may the caller commit the message's offset.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

from image_crawler.contract import (
    CRAWL_ERRORS_TOPIC,
    INBOUND_TOPIC,
    LINK_ROT_TOPIC,
    MAX_ATTEMPTS,
    METADATA_TOPIC,
    RETRYABLE_STATUSES,
    CrawlError,
    ExifMessage,
    LinkRotMessage,
    MalformedMessage,
    ResolutionMessage,
    SourceTask,
    UnparseableMessage,
    utc_now_iso,
)
from image_crawler.logs import get_logger
from worker.fetch import FetchResult, UrlFetcher
from worker.image import ImageFailure
from worker.outputs import DependencyError, MetadataSink, ThumbnailStore
from worker.processing import ImageProcessor, body_size
from worker.stats import SUCCESS_STATUS, StatsRecorder
from worker.tokens import TokenBucket

log = get_logger(__name__)

# Where a finished message went.
CRAWLED = "crawled"
LINK_ROT = "link_rot"
RETRIED = "retried"
DEAD_LETTERED = "dead_lettered"
MALFORMED = "malformed"


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    status: str
    destination: str


class Pipeline:
    def __init__(
        self,
        *,
        tokens: TokenBucket,
        fetcher: UrlFetcher,
        processor: ImageProcessor,
        store: ThumbnailStore,
        sink: MetadataSink,
        stats: StatsRecorder,
        rate_limit_timeout_s: float = 6 * 3600.0,
        max_backoff_s: float = 10.0,
    ) -> None:
        self._tokens = tokens
        self._fetcher = fetcher
        self._processor = processor
        self._store = store
        self._sink = sink
        self._stats = stats
        self._rate_limit_timeout_s = rate_limit_timeout_s
        self._max_backoff_s = max_backoff_s

    async def handle(self, source: str, raw: bytes | None, topic: str) -> Outcome:
        """Process one message of ``urls.{source}``; returns once it is finished."""
        try:
            task = SourceTask.from_json(raw or b"")
        except MalformedMessage as e:
            await self.reject(raw, str(e), topic)
            return Outcome("Malformed", MALFORMED)
        status = await self._crawl(source, task)
        destination = await self._route(source, task, status)
        await self._reliably("record_stats", lambda: self._stats.record(source, status))
        return Outcome(status, destination)

    async def reject(self, raw: bytes | None, error: str, topic: str) -> None:
        """Dead-letter a message that cannot be parsed, and count it."""
        message = UnparseableMessage.from_raw(raw, error, topic)
        log.warning("malformed_message", topic=topic, error=error, raw=message.raw[:200])
        await self._reliably(
            "publish", lambda: self._sink.publish(CRAWL_ERRORS_TOPIC, message.to_json())
        )
        await self._reliably("record_stats", self._stats.record_malformed)

    async def dead_letter(self, source: str, task: SourceTask, status: str) -> None:
        error = CrawlError(
            identifier=task.uuid,
            url=task.url,
            source=source,
            status=status,
            attempts=task.attempts + 1,
            time=utc_now_iso(),
        )
        await self._publish(CRAWL_ERRORS_TOPIC, error.to_json(), task.uuid)

    async def _crawl(self, source: str, task: SourceTask) -> str:
        await self._take_token(source, task)
        fetched = await self._fetcher.fetch(task.url)
        if not fetched.ok:
            if fetched.detail:
                log.debug(
                    "fetch_failed",
                    source=source,
                    identifier=task.uuid,
                    status=fetched.status,
                    detail=fetched.detail,
                )
            return fetched.status
        try:
            return await self._finish(source, task, fetched)
        finally:
            fetched.release()  # the body's bytes go back to the download budget

    async def _finish(self, source: str, task: SourceTask, fetched: FetchResult) -> str:
        assert fetched.body is not None
        image = await self._processor.process(fetched.body)
        if isinstance(image, ImageFailure):
            log.info(
                "image_failed",
                source=source,
                identifier=task.uuid,
                status=image.status,
                detail=image.detail,
            )
            return image.status
        thumbnail = image.thumbnail
        await self._reliably("s3_put", lambda: self._store.put(f"{task.uuid}.jpg", thumbnail))
        resolution = ResolutionMessage(
            identifier=task.uuid,
            width=image.width,
            height=image.height,
            filesize=body_size(fetched.body),
            compression_quality=image.compression_quality,
        )
        publishes = [self._publish(METADATA_TOPIC, resolution.to_json(), task.uuid)]
        if image.exif:
            exif = ExifMessage(identifier=task.uuid, exif=image.exif)
            publishes.append(self._publish(METADATA_TOPIC, exif.to_json(), task.uuid))
        await asyncio.gather(*publishes)
        return SUCCESS_STATUS

    async def _route(self, source: str, task: SourceTask, status: str) -> str:
        if status == SUCCESS_STATUS:
            return CRAWLED
        if status == "404":
            link_rot = LinkRotMessage(identifier=task.uuid, timestamp=utc_now_iso())
            await self._publish(LINK_ROT_TOPIC, link_rot.to_json(), task.uuid)
            return LINK_ROT
        attempts = task.attempts + 1
        if status in RETRYABLE_STATUSES and attempts < MAX_ATTEMPTS:
            retry = dataclasses.replace(task, attempts=attempts).with_source(source)
            await self._publish(INBOUND_TOPIC, retry.to_json(), task.uuid)
            return RETRIED
        await self.dead_letter(source, task, status)
        return DEAD_LETTERED

    async def _take_token(self, source: str, task: SourceTask) -> None:
        future = self._tokens.acquire(source)
        waited_s = 0.0
        try:
            while True:
                try:
                    await asyncio.wait_for(asyncio.shield(future), self._rate_limit_timeout_s)
                    return
                except TimeoutError:
                    # The URL keeps its place: a source without tokens (halted, unknown, or
                    # no monitor running) keeps its messages until it gets tokens again.
                    waited_s += self._rate_limit_timeout_s
                    log.warning(
                        "rate_limit_timeout", source=source, identifier=task.uuid, waited_s=waited_s
                    )
        except asyncio.CancelledError:
            if isinstance(future, asyncio.Future):
                future.cancel()
            raise

    async def _publish(self, topic: str, value: bytes, identifier: str) -> None:
        key = identifier.encode()
        await self._reliably("publish", lambda: self._sink.publish(topic, value, key))

    async def _reliably(self, op: str, action: Callable[[], Awaitable[None]]) -> None:
        """Run ``action`` until it succeeds: a dependency that is away stalls, never loses."""
        backoff_s = 0.1
        while True:
            try:
                await action()
                return
            except DependencyError as e:
                if not e.retriable:
                    raise
                log.warning(
                    "dependency_unavailable",
                    service=e.service,
                    op=op,
                    error=str(e),
                    retry_in_s=backoff_s,
                )
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, self._max_backoff_s)
