"""One URL from its source queue to its results: slot, download, image, S3, Kafka, stats.

``Pipeline.handle`` returns only once the message is finished, meaning its thumbnail is
stored and its messages are acknowledged, or its failure is recorded and sent where the
contract says (``link_rot`` or ``crawl_errors``). Only then may the caller commit the
message's offset.

Every request is paced by its URL's host within its source (``HostKey``, see
worker/politeness/hosts.py). A retryable failure (``RETRYABLE_STATUSES``) is tried again
here, after an exponential backoff with jitter, up to ``RetryPolicy.max_attempts`` tries
in all; each try waits for its own slot, so it is paced like any request and never
starts before a server's Retry-After has passed. A Retry-After holds back every worker's
requests to the host (``Pacer.pause``), not only this URL's. Every answer is reported to
the host's pace (``Pacer.report``), with whether it was a backoff signal (a status of
``BACKOFF_STATUSES``, or a response much slower than the host's usual): the host's rate is
cut on those, and its breaker counts its server's failures. A URL of a host given up by
its breaker ends as ``HostUnavailable``, without a request.

Before any of that, the URL's host's robots.txt is asked (``RobotsGuard``; so is each
redirect hop's): a URL it disallows ends as ``RobotsDisallowed`` without a request, a URL
whose host's name does not resolve as ``DnsError`` (in ``crawl_errors``, not retried),
and a URL whose host's robots.txt cannot be fetched waits for it.

What the server says of the image's use (worker.politeness.signals) is obeyed and
published: a URL whose host's robots.txt says ``Content-Signal: search=no``, or whose
answer's X-Robots-Tag keeps it out of the index, ends as ``NoIndex`` in ``crawl_errors``
with the directives, nothing stored; the opt-outs of the host's files and of the answer
go with the image's resolution message (``opt_outs``, ``tdm_policy``).

A message that carries an earlier crawl's validators (``SourceTask.earlier``) is a
re-check (worker.download.recheck): its GET is conditional, a 304 or a 200 with the
earlier body ends it with nothing stored or published, and every re-check, whatever its
end, publishes one ``link_checks`` message and counts its verdict (the hash
``rechecks``). A 410 seen by a re-check goes to ``link_rot`` as a 404 does.

The worker's per-source metrics (worker/metrics.py) are counted here: a request once
pacing grants its slot, the bytes of each body downloaded, and each recorded status as
the statistics get it (an outcome).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import random
import time
from collections.abc import Awaitable, Callable
from typing import Final

import prometheus_client
from yarl import URL

from image_crawler.contract import (
    CRAWL_ERRORS_TOPIC,
    LINK_CHECKS_TOPIC,
    LINK_ROT_TOPIC,
    MAX_ATTEMPTS,
    MAX_RETRY_AFTER_S,
    METADATA_TOPIC,
    RETRYABLE_STATUSES,
    CrawlError,
    Encoding,
    ExifMessage,
    LinkRotMessage,
    MalformedMessage,
    ResolutionMessage,
    SourceTask,
    Status,
    StoredImage,
    UnparseableMessage,
    object_key,
    utc_now_iso,
)
from image_crawler.logs import get_logger
from image_crawler.retry import Backoff, backoff_delay
from worker.download import recheck
from worker.download.fetch import FetchResult, Reservation, UrlFetcher
from worker.host_queues import slot_taken
from worker.images.kernel import ImageFailure
from worker.images.pool import ImageProcessor, body_size
from worker.metrics import DOWNLOADED_BYTES, OUTCOMES, RECHECKS, REQUESTS
from worker.politeness.hosts import HostKey, key_of
from worker.politeness.latency import LatencyWatch
from worker.politeness.pacing import Pacer
from worker.politeness.retry_after import obey_retry_after
from worker.politeness.robots import ROBOTS_PENDING, RobotsGuard
from worker.politeness.signals import NO_SIGNALS, Signals
from worker.settings import WorkerSettings
from worker.sinks.base import DependencyError, MetadataSink, Outage, ThumbnailStore
from worker.sinks.gate import FinishGate
from worker.stats import StatsRecorder

log = get_logger(__name__)

# Where a finished message went.
CRAWLED = "crawled"
LINK_ROT = "link_rot"
DEAD_LETTERED = "dead_lettered"
MALFORMED = "malformed"
UNCHANGED = "unchanged"  # a re-check that found the file as it was: link_checks only

# A fetch that ended before any request: nothing to report of the host.
_NOT_ASKED: Final = frozenset(
    {Status.BLOCKED, Status.INVALID_URL, Status.DNS_ERROR, Status.ROBOTS_DISALLOWED, ROBOTS_PENDING}
)

# A store or broker that fails (rather than hangs: see worker.sinks.base) is tried again
# at once, nearly: most failures are a dropped connection, and the URL waits meanwhile.
DEPENDENCY_RETRY_BASE_S: Final = 0.1
# The calls that finishing an image needs: while one fails or hangs, no request starts
# (worker/sinks/gate.py).
FINISHING_OPS: Final = frozenset({"s3_put", "publish"})


@dataclasses.dataclass(frozen=True, slots=True)
class Ending:
    """How one message ended: its last ``status``, where it went (``destination``: one of
    CRAWLED, LINK_ROT, DEAD_LETTERED, MALFORMED, UNCHANGED), and its tries of the URL in
    all, the inbound message's earlier attempts included."""

    status: str
    destination: str
    attempts: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class Tried:
    """How one try ended: its ``status`` as recorded; ``answered``, the status of the
    fetch itself (the HTTP code when an answer came, "" when no request was made);
    ``directives``, for ``NoIndex``, what said so; ``unchanged``, a re-check's 200 with
    the earlier body."""

    status: str
    answered: str = ""
    directives: tuple[str, ...] = ()
    unchanged: bool = False


class SourceMetrics:
    """One source's children of the per-source metrics, each looked up once: ``labels()``
    (a lock and a lookup by a tuple of label values) costs more than the increment."""

    __slots__ = ("_checks", "_outcomes", "_source", "downloaded_bytes", "requests")

    def __init__(self, source: str) -> None:
        self._source = source
        self.requests = REQUESTS.labels(source)
        self.downloaded_bytes = DOWNLOADED_BYTES.labels(source)
        self._outcomes: dict[str, prometheus_client.Counter] = {}
        self._checks: dict[str, prometheus_client.Counter] = {}

    def outcome(self, status: str) -> prometheus_client.Counter:
        child = self._outcomes.get(status)
        if child is None:
            child = self._outcomes[status] = OUTCOMES.labels(self._source, status)
        return child

    def check(self, status: str) -> prometheus_client.Counter:
        child = self._checks.get(status)
        if child is None:
            child = self._checks[status] = RECHECKS.labels(self._source, status)
        return child


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How retryable failures are tried again. Times in seconds."""

    max_attempts: int = MAX_ATTEMPTS
    max_retry_after_s: float = MAX_RETRY_AFTER_S
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 60.0


class Pipeline:
    def __init__(
        self,
        *,
        pacer: Pacer,
        fetcher: UrlFetcher,
        processor: ImageProcessor,
        store: ThumbnailStore,
        sink: MetadataSink,
        stats: StatsRecorder,
        retries: RetryPolicy = RetryPolicy(),
        response_times: LatencyWatch | None = None,
        robots: RobotsGuard | None = None,
        rate_limit_timeout_s: float = WorkerSettings().rate_limit_timeout_s,
        max_backoff_s: float = 10.0,
        rng: random.Random | None = None,
        pacing_key: str = "host",
        encoding: Encoding | None = None,
    ) -> None:
        self._pacer = pacer
        # A message's own encoding wins; without one, this (the worker's settings), and
        # without that, the original's thumbnail.
        self._encoding = encoding
        self._pacing_key = pacing_key
        self._fetcher = fetcher
        self._processor = processor
        self._store = store
        self._sink = sink
        self._stats = stats
        self._retries = retries
        self._response_times = response_times or LatencyWatch()
        self._robots = robots
        self._rate_limit_timeout_s = rate_limit_timeout_s
        self._max_backoff_s = max_backoff_s
        self._rng = rng or random.Random()
        self._metrics: dict[str, SourceMetrics] = {}
        self._outages: dict[str, Outage] = {}
        self.gate = FinishGate()

    def host_key(self, source: str, raw: bytes | None) -> HostKey | None:
        """The politeness key of a message's URL, for the scheduler's queues; None for a
        message that does not parse (``handle`` reports it)."""
        try:
            task = SourceTask.from_json(raw or b"")
            return key_of(source, task.url, self._pacing_key)
        except (MalformedMessage, ValueError):
            return None

    async def park(self, source: str, raw: bytes | None, topic: str) -> None:
        """Append a message again to the end of its topic (the scheduler parks a URL whose
        host cannot take it for long); returns once the broker has it."""
        task = SourceTask.from_json(raw or b"")
        log.debug("url_parked", source=source, identifier=task.uuid)
        await self._publish(topic, raw or b"", task.uuid)

    async def handle(self, source: str, raw: bytes | None, topic: str) -> Ending:
        """Process one message of ``urls.{source}``; returns once it is finished."""
        try:
            task = SourceTask.from_json(raw or b"")
        except MalformedMessage as e:
            await self.reject(raw, str(e), topic)
            return Ending(Status.MALFORMED, MALFORMED)
        host = NO_SIGNALS
        if self._robots is not None:
            refused, host = await self._robots.consult(source, task.url)
            if refused is not None:
                ending = await self._refuse(source, task, refused, host.noindex)
                if task.earlier is not None:
                    await self._report_check(source, task, Tried(refused))
                return ending
        conditions = None if task.earlier is None else recheck.conditions(task.earlier)
        attempts = task.attempts
        while True:
            attempts += 1
            tried = await self._attempt(source, task, host, conditions)
            if tried.status == ROBOTS_PENDING:  # a redirect's host now answers: not a try
                attempts -= 1
                continue
            if tried.status not in RETRYABLE_STATUSES or attempts >= self._retries.max_attempts:
                break
            await self._back_off(source, task, tried.status, attempts)
        destination = await self._route(source, task, tried, attempts)
        if task.earlier is not None:
            await self._report_check(source, task, tried)
        return Ending(tried.status, destination, attempts)

    async def reject(self, raw: bytes | None, error: str, topic: str) -> None:
        """Dead-letter a message that cannot be parsed, and count it."""
        message = UnparseableMessage.from_raw(raw, error, topic)
        log.warning("malformed_message", topic=topic, error=error, raw=message.raw[:200])
        await self._reliably(
            "publish", lambda: self._sink.publish(CRAWL_ERRORS_TOPIC, message.to_json())
        )
        await self._reliably("record_stats", self._stats.record_malformed)

    async def dead_letter(
        self,
        source: str,
        task: SourceTask,
        status: str,
        attempts: int | None = None,
        directives: tuple[str, ...] = (),
    ) -> None:
        error = CrawlError(
            identifier=task.uuid,
            url=task.url,
            source=source,
            status=status,
            attempts=task.attempts + 1 if attempts is None else attempts,
            time=utc_now_iso(),
            directives=directives,
        )
        await self._publish(CRAWL_ERRORS_TOPIC, error.to_json(), task.uuid)

    async def _refuse(
        self, source: str, task: SourceTask, status: str, directives: tuple[str, ...]
    ) -> Ending:
        """End a URL robots.txt keeps us from requesting (or indexing): counted, and
        dead-lettered."""
        log.debug("robots_refused", source=source, identifier=task.uuid, status=status)
        await self._record(source, status, self._host_of(source, task.url))
        await self.dead_letter(source, task, status, task.attempts, directives)
        return Ending(status, DEAD_LETTERED, task.attempts)

    async def _attempt(
        self,
        source: str,
        task: SourceTask,
        host: Signals,
        conditions: dict[str, str] | None = None,
    ) -> Tried:
        """One try: a slot, the download, the image; its status recorded. ``host``: what
        the host's robots.txt and tdmrep.json say of the URL; ``conditions``: a
        re-check's request headers.

        ``ROBOTS_PENDING`` (not recorded): a redirect led to a host whose robots.txt
        could not be fetched; it has been waited for, and the URL may be tried again.
        """
        key = key_of(source, task.url, self._pacing_key)
        await self.gate.wait_open()
        reserved = await self._reserved_slot(key, task)
        if isinstance(reserved, str):  # the host was given up: no request
            await self._record(source, reserved, key.host)
            return Tried(reserved)
        metrics = self._source_metrics(source)
        metrics.requests.inc()
        robots = self._robots
        permit = functools.partial(self._hop, source)
        fetched = await self._fetcher.fetch(task.url, permit, conditions, reserved)
        if fetched.body is not None:
            metrics.downloaded_bytes.inc(body_size(fetched.body))
        if fetched.status == ROBOTS_PENDING and robots is not None:
            refused, hop = await robots.consult(source, fetched.detail)
            if refused is None:
                return Tried(ROBOTS_PENDING)
            fetched = FetchResult(refused, detail=fetched.detail, signals=hop)
        await self._heed(key, fetched)
        unchanged = False
        status: str
        if fetched.ok:
            assert fetched.body is not None
            try:
                earlier = task.earlier
                if earlier is not None and recheck.same_body(earlier, fetched.body):
                    status, unchanged = Status.OK, True
                else:
                    status = await self._finish(source, task, fetched, host)
            finally:
                fetched.release()  # the body's bytes go back to the download budget
        else:
            status = fetched.status
            if fetched.detail:
                log.debug(
                    "fetch_failed",
                    source=source,
                    identifier=task.uuid,
                    status=status,
                    detail=fetched.detail,
                )
        await self._record(source, status, key.host)
        directives = fetched.signals.noindex if status == Status.NO_INDEX else ()
        return Tried(status, fetched.status, directives, unchanged)

    def _source_metrics(self, source: str) -> SourceMetrics:
        metrics = self._metrics.get(source)
        if metrics is None:
            metrics = self._metrics[source] = SourceMetrics(source)
        return metrics

    def _host_of(self, source: str, url: str) -> str | None:
        try:
            return key_of(source, url, self._pacing_key).host or None
        except ValueError:
            return None

    async def _record(self, source: str, status: str, host: str | None) -> None:
        """An attempt's end: its outcome counted, and stored in the statistics with the
        host that answered (for the breakers' count of hosts)."""
        self._source_metrics(source).outcome(status).inc()
        await self._reliably("record_stats", lambda: self._stats.record(source, status, host=host))

    async def _heed(self, key: HostKey, fetched: FetchResult) -> None:
        """Act on what a response says of its server's load: obey a Retry-After, and
        report the answer to its host's pace (a backoff signal when it was much slower
        than the host's usual). A fetch that made no request reports nothing."""
        if fetched.status in _NOT_ASKED:
            return
        if fetched.retry_after is not None:  # most responses have none: no call
            await obey_retry_after(
                self._pacer,
                key,
                fetched.status,
                fetched.retry_after,
                now_unix_s=time.time(),
                max_s=self._retries.max_retry_after_s,
            )
        slow = fetched.response_s is not None and self._response_times.observe(
            key, fetched.response_s
        )
        self._pacer.report(key, fetched.status, signal=slow)

    async def _back_off(self, source: str, task: SourceTask, status: str, attempts: int) -> None:
        retries = self._retries
        delay_s = backoff_delay(
            attempts, base_s=retries.backoff_base_s, cap_s=retries.backoff_cap_s, rng=self._rng
        )
        log.info(
            "retry_scheduled",
            source=source,
            identifier=task.uuid,
            status=status,
            attempts=attempts,
            delay_s=round(delay_s, 3),
        )
        await asyncio.sleep(delay_s)

    async def _finish(
        self, source: str, task: SourceTask, fetched: FetchResult, host: Signals
    ) -> str:
        assert fetched.body is not None
        encoding = task.encoding or self._encoding
        image = await self._processor.process(fetched.body, encoding)
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
        key = object_key(task.uuid, encoding)
        await self._reliably("s3_put", lambda: self._store.put(key, thumbnail))
        stored = None if encoding is None else StoredImage(key, *image.thumbnail_size)
        resolution = ResolutionMessage(
            identifier=task.uuid,
            width=image.width,
            height=image.height,
            filesize=body_size(fetched.body),
            compression_quality=image.compression_quality,
            sha256=image.sha256,
            phash=image.phash,
            etag=fetched.etag,
            last_modified=fetched.last_modified,
            row=task.row,
            image=stored,
            has_exif=bool(image.exif),
            source=source,
        )
        said = host | fetched.signals
        if said:
            resolution = dataclasses.replace(
                resolution, opt_outs=said.opt_outs, tdm_policy=said.tdm_policy
            )
        sent = self._publish(METADATA_TOPIC, resolution.to_json(), task.uuid)
        if image.exif:
            exif = ExifMessage(identifier=task.uuid, exif=image.exif)
            await asyncio.gather(sent, self._publish(METADATA_TOPIC, exif.to_json(), task.uuid))
        else:
            await sent  # no gather, which would wrap the one publish in a task
        return Status.OK

    async def _route(self, source: str, task: SourceTask, tried: Tried, attempts: int) -> str:
        status = tried.status
        rechecked = task.earlier is not None
        if tried.unchanged or (rechecked and status == Status.NOT_MODIFIED):
            return UNCHANGED
        if status == Status.OK:
            return CRAWLED
        if status == Status.NOT_FOUND or (rechecked and status == Status.GONE):
            link_rot = LinkRotMessage(identifier=task.uuid, timestamp=utc_now_iso())
            await self._publish(LINK_ROT_TOPIC, link_rot.to_json(), task.uuid)
            return LINK_ROT
        await self.dead_letter(source, task, status, attempts, tried.directives)
        return DEAD_LETTERED

    async def _report_check(self, source: str, task: SourceTask, tried: Tried) -> None:
        """A re-check's end: its ``link_checks`` message, and its verdict counted."""
        check = recheck.check_of(tried.status, unchanged_body=tried.unchanged)
        http = recheck.http_status(tried.answered)
        message = recheck.link_check(task, tried.status, check, http, utc_now_iso())
        await self._publish(LINK_CHECKS_TOPIC, message.to_json(), task.uuid)
        self._source_metrics(source).check(check).inc()
        await self._reliably("record_stats", lambda: self._stats.record_check(source, check))

    async def _reserved_slot(self, key: HostKey, task: SourceTask) -> Reservation | str:
        """Memory first, then the slot (between a slot and its request nothing may
        wait): the reservation, or the status the URL ends with instead."""
        reserved = await self._fetcher.reserve()
        try:
            ended = await self._take_slot(key, task)
        except BaseException:
            reserved.release()
            raise
        if ended is not None:
            reserved.release()
            return ended
        slot_taken()  # its host need not wait for this download to start its next URL
        return reserved

    async def _hop(self, source: str, hop: URL) -> str | None:
        """Before a redirect hop: its host's robots.txt, then a slot of its host (a hop is a
        request to that host like any other). None lets it go ahead; a status ends the
        fetch (``RobotsDisallowed``, ``ROBOTS_PENDING``, ``HostUnavailable``)."""
        if self._robots is not None:
            refused = await self._robots.hop_status(source, hop)
            if refused is not None:
                return refused
        try:
            key = key_of(source, hop, self._pacing_key)
        except ValueError:
            return None  # the fetcher refuses what it cannot request
        while True:
            granted = self._pacer.acquire(key)
            status = await granted
            if status is not None or not self._pacer.started_late(granted):
                return status

    async def _take_slot(self, key: HostKey, task: SourceTask) -> str | None:
        """Wait for the host's slot; None, or the status the URL ends with instead."""
        while True:
            future = asyncio.ensure_future(self._pacer.acquire(key, defer=True))
            status = await self._slot_or_status(key, task, future)
            # A slot the loop resumed this request too late for is given up (the pacer's
            # late limit): the request asks again.
            if status is not None or not self._pacer.started_late(future):
                return status

    async def _slot_or_status(
        self, key: HostKey, task: SourceTask, future: asyncio.Future[str | None]
    ) -> str | None:
        source = key.source
        # Deferrable: a host that will not be served for long raises HostWaits, and the
        # URL waits in the scheduler's queue of its host, not in a task slot.
        waited_s = 0.0
        try:
            # ``wait``, not ``wait_for``: it leaves the slot's future alone at the timeout
            # (the URL keeps its place: a source without a rate, halted, unknown or with no
            # monitor running, keeps its messages until it gets one again) without a
            # ``shield``, whose extra future costs a turn of the loop for every slot.
            while not (await asyncio.wait((future,), timeout=self._rate_limit_timeout_s))[0]:
                waited_s += self._rate_limit_timeout_s
                log.warning(
                    "rate_limit_timeout", source=source, identifier=task.uuid, waited_s=waited_s
                )
            # A slot's future that failed raises here, as it did when awaited.
            return future.result()
        except asyncio.CancelledError:
            future.cancel()
            raise

    async def _publish(self, topic: str, value: bytes, identifier: str) -> None:
        key = identifier.encode()
        await self._reliably("publish", lambda: self._sink.publish(topic, value, key))

    async def _reliably(self, op: str, action: Callable[[], Awaitable[None]]) -> None:
        """Run ``action`` until it succeeds: a dependency that is away stalls, never loses.

        A failure begins an outage of its service (``dependency_unavailable``), which the
        first success of a call that saw it fail ends (``dependency_recovered``). A call
        of ``FINISHING_OPS`` is watched by the gate all along."""
        if op not in FINISHING_OPS:
            await self._retrying(op, action, lambda: None)
            return
        with self.gate.call(op) as failed:
            await self._retrying(op, action, failed)

    async def _retrying(
        self, op: str, action: Callable[[], Awaitable[None]], failed: Callable[[], None]
    ) -> None:
        retry: Backoff | None = None  # made at the first failure: most calls have none
        outage: Outage | None = None
        while True:
            try:
                await action()
            except DependencyError as e:
                if not e.retriable:
                    if outage is not None:  # it answered, with a refusal: it is back
                        outage.end(op=op)
                    raise
                if retry is None:
                    cap_s = self._max_backoff_s
                    retry = Backoff(
                        base_s=min(DEPENDENCY_RETRY_BASE_S, cap_s), cap_s=cap_s, rng=self._rng
                    )
                    failed()
                wait_s = retry.next_s()
                outage = self._outage(e.service)
                outage.report(op=op, error=str(e), retry_in_s=round(wait_s, 3))
            else:
                if outage is not None:
                    outage.end(op=op)
                return
            await asyncio.sleep(wait_s)

    def _outage(self, service: str) -> Outage:
        outage = self._outages.get(service)
        if outage is None:
            outage = self._outages[service] = Outage(
                "dependency_unavailable",
                "dependency_recovered",
                dependency=service,
                service=service,
            )
        return outage
