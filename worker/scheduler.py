"""Taking work from the per-source queues fairly, and committing only what is finished.

One Kafka consumer (group ``image_handlers``) reads every ``urls.{source}`` topic of the
sources in Redis' ``inbound_sources``; the topic list is re-read as the crawl runs. Each
source may hold at most ``fair_share`` unfinished tasks: a source at its share has its
partitions paused, and records fetched beyond a source's share are given back by seeking
its partition to the first record not taken. A partition's offset is committed only up
to its first unfinished message; what is finished past it is written to Redis at each
commit and skipped by the partition's next owner (worker.finished), and a revoke hands
back the URLs still waiting for a slot and lets the requests on the wire end first, so
that a rebalance costs no image twice.

URLs the broker deleted before they were read are not skipped in silence: partitions are
checked when assigned, and whenever a partition's records jump past the offset the
scheduler was to read next (worker.lost_urls).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.protocol.commit import OffsetCommitRequest
from redis.exceptions import RedisError

from image_crawler.contract import INBOUND_SOURCES_SET, source_of_topic, source_topic
from image_crawler.lifecycle import cancel_and_wait
from image_crawler.logs import get_logger
from image_crawler.retry import sleep_unless_stopped
from worker.copies import CrawledLedger, digest
from worker.fair_share import fair_share, resume_threshold
from worker.finished import FINISHED, RUNNING, FinishedLedger, fingerprint
from worker.host_queues import (
    HOLD,
    PARK,
    QUEUED,
    SLOT_TAKEN,
    HostQueues,
    HostQueueSettings,
    Waiting,
)
from worker.lost_urls import LostUrls
from worker.metrics import URLS_COPIES_SKIPPED, URLS_FINISHED_SKIPPED, URLS_PARKED, URLS_WAITING
from worker.offsets import OffsetTracker
from worker.politeness.hosts import HostKey
from worker.politeness.pacing import HostWaits
from worker.settings import WorkerSettings

log = get_logger(__name__)

# Processes one message (source, value, topic); returns when it is finished.
Handler = Callable[[str, bytes | None, str], Awaitable[object]]
# Called when a handler raised: dead-letter the message so it is not lost silently.
FailureHandler = Callable[[str, bytes | None, str, BaseException], Awaitable[None]]
# A message's host (its politeness key); None: not known (it runs at once).
HostOf = Callable[[str, bytes | None], HostKey | None]
# Appends a message (source, value, topic) again to the end of its topic.
Parker = Callable[[str, bytes | None, str], Awaitable[None]]


# Polls of inbound_sources between full reads when its size does not change.
_FULL_READ_EVERY: Final = 12


# The worker's settings hold each default once; a scheduler built without them (tests)
# gets the same.
_DEFAULT: Final = WorkerSettings()
# The longest a commit or an assignment waits for Redis to write or read the finished
# offsets (worker.finished): without them, work is only done again.
LEDGER_TIMEOUT_S: Final = 5.0
# How often a message held back for its previous owner asks whether that one ended it.
ELSEWHERE_POLL_S: Final = 0.5
# The longest a poll's records wait to be checked for copies (worker.copies), and how long
# the check is left off after it failed: it saves requests, and a Redis away holds every
# request anyway (no slot is granted without it), so it never holds up the scheduler.
COPIES_TIMEOUT_S: Final = 0.5
COPIES_OFF_S: Final = 5.0
# How long finished offsets a write failed to write are tried again at each commit: past
# it, the partitions' next owners have read the ledger (a rebalance takes seconds).
UNWRITTEN_KEEP_S: Final = 120.0
# What a worker finished is written to Redis this long after it ends (what ends meanwhile
# goes in the same write), not at the next commit: a worker frozen or killed then costs
# what it finished in that time, not in a commit interval; at most 50 writes a second.
RECORD_DELAY_S: Final = 0.02
# How long a digest of a message crawled here is also kept in memory: a copy checked in
# Redis before the digest's write landed (the write in flight, or the poll's check made
# before it and the copy started later, after waiting for its host up to PARK_AFTER_S)
# is still known for one. About 150 bytes a digest: 18 MB at 1,000 images a second.
CRAWLED_KEEP_S: Final = 120.0


@dataclasses.dataclass(frozen=True, slots=True)
class SchedulerSettings:
    max_tasks: int = _DEFAULT.max_tasks
    sources_poll_s: float = _DEFAULT.sources_poll_s
    commit_interval_s: float = _DEFAULT.commit_interval_s
    poll_timeout_s: float = 0.1
    shutdown_grace_s: float = _DEFAULT.shutdown_grace_s
    # Partitions due to be resumed are resumed together at most this often.
    resume_every_s: float = 0.5
    hosts: HostQueueSettings = dataclasses.field(default_factory=HostQueueSettings)
    # A partition whose last this many URLs read were all parked at once (their hosts'
    # queues full) is paused, for spin_pause_s doubled at each pause in a row up to
    # spin_pause_max_s: reading on would append the same URLs again and again.
    spin_parks: int = 100
    spin_pause_s: float = 1.0
    spin_pause_max_s: float = 30.0
    # A revoke waits this long at most for the requests on the wire of the partitions it
    # takes away (their URLs' slots granted), so that their images count as finished here
    # rather than be fetched again by the partitions' next owner.
    revoke_wait_s: float = 5.0
    # Those still running after revoke_wait_s are marked in Redis (worker/finished.py):
    # the partitions' next owners hold them back until they end here, or this long, when
    # they are given up here: an image in hand is then published once, by the worker that
    # has it. Not longer: each second of it is one the partition's commit waits. At 60 s
    # the frozen-worker test had 40 URLs not ended within 90 s once in five runs (the
    # likely cause, not confirmed: the thawed worker's marked tasks held back 60 s).
    late_hold_s: float = 20.0
    # A message read that is a copy of one of its partition crawled less than this long
    # ago (worker.copies) is counted finished without a request; 0: never.
    copy_window_s: float = _DEFAULT.copy_window_s


class Scheduler:
    """Runs ``handler`` on messages of every source's queue within the fair shares."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        redis: aioredis.Redis,
        handler: Handler,
        on_failure: FailureHandler,
        settings: SchedulerSettings = SchedulerSettings(),
        lost_urls: LostUrls | None = None,
        *,
        host_of: HostOf | None = None,
        interval_of: Callable[[HostKey], float | None] | None = None,
        park: Parker | None = None,
        finished: FinishedLedger | None = None,
        copies: CrawledLedger | None = None,
    ) -> None:
        self._consumer = consumer
        self._redis = redis
        self._handler = handler
        self._on_failure = on_failure
        self._settings = settings
        self._sources: frozenset[str] = frozenset()
        self._trackers: dict[TopicPartition, OffsetTracker] = {}
        self._in_flight: dict[TopicPartition, set[int]] = {}
        self._committed: dict[TopicPartition, int] = {}
        # Per assigned partition: the offset of the first record read since the
        # assignment, and of the next record to read (after a give-back, the one given
        # back), which a record past it shows were skipped.
        self._first_read: dict[TopicPartition, int] = {}
        self._next_read: dict[TopicPartition, int] = {}
        # Per partition: the offset last read again because a fetch skipped it.
        self._reread: dict[TopicPartition, int] = {}
        self._lost = lost_urls if lost_urls is not None else LostUrls(consumer, redis)
        self._unfinished: Counter[str] = Counter()
        # Each running task, and the partition and offset of its message.
        self._tasks: dict[asyncio.Task[None], tuple[TopicPartition, int]] = {}
        self._topic_sources: dict[str, str | None] = {}  # source_of_topic, remembered
        # The assignment as last seen, its partitions by source (None: not a source's
        # topic), which of them are paused, and the sources whose unfinished count changed
        # since pauses were last updated: so that a loop looks at those sources only.
        self._assignment: frozenset[TopicPartition] = frozenset()
        self._partitions_of: dict[str | None, list[TopicPartition]] = {}
        self._paused: set[TopicPartition] = set()
        self._changed: set[str] = set()
        # Free slots (share - unfinished, when positive) of each assigned source, and their
        # sum: the most records a poll may take, kept up to date with the pauses.
        self._free: dict[str, int] = {}
        self._free_total = 0
        self._to_resume: set[TopicPartition] = set()  # due, resumed at _next_resume_at
        self._next_resume_at = 0.0
        self._resync = True  # set by a rebalance: read the consumer's state again
        self._paused_for_share = -1
        self._listener = _Listener(self)
        self.finished = 0
        self._init_finished(finished if finished is not None else FinishedLedger(redis))
        self._init_copies(
            copies if copies is not None else CrawledLedger(redis, settings.copy_window_s)
        )
        self._init_waiting(host_of, interval_of, park)

    def _init_finished(self, ledger: FinishedLedger) -> None:
        # Finished past the commit: what this worker finished since its last commit (to be
        # written), and what the partition's previous owners finished (to be skipped).
        self._ledger = ledger
        self._unrecorded: dict[TopicPartition, list[tuple[int, int]]] = {}
        # And all it finished past its last commit, written or not: written again at a
        # revoke, so that a Redis that lost the set meanwhile (restarted empty) has it
        # again for the partitions' next owners.
        self._past_commit: dict[TopicPartition, dict[int, int]] = {}
        self._skip: dict[TopicPartition, dict[int, int]] = {}
        # What a write of them failed to write (Redis away), tried again at each commit
        # for UNWRITTEN_KEEP_S, whether or not the partitions are still ours: a revoke's
        # write that failed would otherwise cost their next owners all of it again.
        self._unwritten: dict[TopicPartition, dict[int, int]] = {}
        self._unwritten_since = 0.0
        # Set when a message ends: written RECORD_DELAY_S later (and at each commit).
        self._ended = asyncio.Event()
        # Still running at a previous owner's revoke: held back until when (Unix seconds).
        self._elsewhere: dict[TopicPartition, dict[int, float]] = {}
        # Still running here at a revoke, marked so in Redis: until when (Unix ms).
        self._late: dict[tuple[TopicPartition, int], int] = {}
        self._settling: set[asyncio.Task[None]] = set()
        # The tasks whose request may be on the wire (no host queue, or their slot granted).
        self._requesting: set[asyncio.Task[None]] = set()
        self.skipped = 0

    def _init_copies(self, ledger: CrawledLedger) -> None:
        # The digests of the messages crawled here since the last commit (to be written),
        # and those of the last poll's records found to be of messages crawled lately.
        self._copies = ledger
        self._crawled: dict[TopicPartition, set[str]] = {}
        # All crawled here in the last CRAWLED_KEEP_S, written or not, each with when.
        self._recent: dict[TopicPartition, dict[str, float]] = {}
        self._recent_pruned = 0.0
        # The digests of the messages read here and not yet ended (running, waiting for
        # their host), per partition, each with its offset: a copy read meanwhile (in the
        # same poll, or while its first waits) is one too. Not a message being parked:
        # its copy is the one to crawl, and may be read before the broker acknowledges it.
        self._reading: dict[TopicPartition, dict[str, int]] = {}
        self._seen: dict[TopicPartition, set[str]] = {}
        self._copies_off_until = 0.0
        # Counted at each revoke and assignment: a poll's records checked across one are
        # not started (their partitions are read again from their commits).
        self._generation = 0
        self.copies_skipped = 0

    def _init_waiting(
        self,
        host_of: HostOf | None,
        interval_of: Callable[[HostKey], float | None] | None,
        park: Parker | None,
    ) -> None:
        # URLs waiting for their host (worker.host_queues), when the messages' hosts are
        # known; without ``host_of`` every URL runs at once.
        self._host_of = host_of
        self._park_fn = park
        self._queues: HostQueues[TopicPartition] = HostQueues(
            interval_of or (lambda key: None), self._settings.hosts
        )
        self._parking: set[asyncio.Task[None]] = set()
        # Partitions given back for want of room to queue (source -> partitions), and
        # those paused for parking all they read: until when, and their next pause.
        self._held: dict[TopicPartition, tuple[str, float]] = {}
        self._spin_until: dict[TopicPartition, float] = {}
        self._spin_next_s: dict[TopicPartition, float] = {}
        self._parks_in_row: Counter[TopicPartition] = Counter()
        self.parked = 0
        # Set once stop is: nothing new starts (a cancelled URL's host would otherwise
        # start its next one). Checked at each start, not only in ``_drain``: between the
        # stop and the drain the scheduler still closes its own tasks, and URLs ending
        # meanwhile would start their hosts' next ones, new work after a SIGTERM.
        self._stop = asyncio.Event()
        self._draining = False

    @property
    def _stopping(self) -> bool:
        return self._draining or self._stop.is_set()

    @property
    def sources(self) -> frozenset[str]:
        return self._sources

    def unfinished(self, source: str) -> int:
        return self._unfinished[source]

    @property
    def waiting(self) -> int:
        """URLs read and waiting for their host (``crawler_urls_waiting``)."""
        return self._queues.waiting

    @property
    def in_flight(self) -> int:
        """Messages being handled now: the task slots in use (``crawler_tasks_in_flight``)."""
        return len(self._tasks)

    def share(self) -> int:
        return fair_share(self._settings.max_tasks, len(self._sources))

    async def run(self, stop: asyncio.Event) -> None:
        """Schedule until ``stop`` is set, then drain (see ``_drain``) and return."""
        self._stop = stop
        watcher = asyncio.create_task(self._watch_sources(stop), name="watch_sources")
        committer = asyncio.create_task(self._commit_periodically(), name="commit")
        recorder = asyncio.create_task(self._record_soon(), name="record")
        try:
            while not stop.is_set():
                if not self._sources:
                    await sleep_unless_stopped(stop, self._settings.sources_poll_s / 2)
                    continue
                await self._schedule_once()
        finally:
            await cancel_and_wait([watcher, committer, recorder])
            await self._lost.close()
            await self._drain()

    async def _schedule_once(self) -> None:
        share = self.share()
        self._update_pauses(share)
        try:
            batches = await self._consumer.getmany(
                timeout_ms=int(self._settings.poll_timeout_s * 1000),
                max_records=max(1, self._free_total),
            )
        except KafkaError as e:
            log.warning("consume_failed", error=repr(e))
            await asyncio.sleep(self._settings.poll_timeout_s)
            return
        if batches and not await self._check_copies(batches):
            return
        for tp, records in batches.items():
            source = self._source_of(tp.topic)
            if source is None or not records:
                continue
            records = self._unskipped(tp, records)
            if not records:
                continue
            self._note_read(source, tp, records[0].offset)
            next_read = records[-1].offset + 1
            for record in records:
                full = self._unfinished[source] >= share
                # Over this source's share, or no room to queue: give the rest back.
                if full or not self._start(source, tp, record.offset, record.value):
                    self._give_back(tp, record.offset)
                    if not full:
                        until = asyncio.get_running_loop().time() + self._settings.hosts.hold_s
                        self._held[tp] = (source, until)
                    next_read = record.offset
                    break
            self._next_read[tp] = next_read
            self._check_spin(tp)
        self._tend_queues(share)

    def _unskipped(self, tp: TopicPartition, records: list[Any]) -> list[Any]:
        """The records of a fetch up to the first offset it skipped, which is read again.

        The queues are neither compacted nor transactional: their offsets follow each
        other. tansu on S3 was seen answering a fetch with a later batch than asked for
        (a reader of the output topics missed one record of 804, while the broker had
        it), and aiokafka takes records past its position for a compacted topic's. Such a
        URL would be committed past, never crawled. So the fetch is cut at the hole and
        the consumer seeks back to it, once: skipped again, the offset is taken as gone
        (deleted records, which ``_note_read`` counts as lost)."""
        expected = self._next_read.get(tp)
        hole = expected if expected is not None and records[0].offset > expected else None
        if hole is None:
            hole = next(
                (a.offset + 1 for a, b in itertools.pairwise(records) if b.offset != a.offset + 1),
                None,
            )
        if hole is None or self._reread.get(tp) == hole:
            return records
        self._reread[tp] = hole
        log.warning(
            "fetch_skipped",
            topic=tp.topic,
            partition=tp.partition,
            offset=hole,
            got=[r.offset for r in records[:3]],
        )
        self._consumer.seek(tp, hole)
        return [r for r in records if r.offset < hole]

    async def _check_copies(self, batches: dict[TopicPartition, list[Any]]) -> bool:
        """Find which records of a poll are copies of a message crawled lately; False if
        a rebalance came meanwhile (the records are then not to be started)."""
        self._seen = {}
        if self._copies.window_s <= 0 or time.monotonic() < self._copies_off_until:
            return True
        generation = self._generation
        digests = {tp: [digest(r.value) for r in records] for tp, records in batches.items()}
        try:
            async with asyncio.timeout(COPIES_TIMEOUT_S):
                self._seen = await self._copies.seen(digests)
        except (RedisError, TimeoutError) as e:
            log.warning("copies_check_failed", error=repr(e), off_s=COPIES_OFF_S)
            self._copies_off_until = time.monotonic() + COPIES_OFF_S
        return generation == self._generation

    def _is_copy(self, source: str, tp: TopicPartition, offset: int, found: str) -> bool:
        """Whether the message (its digest ``found``) is a copy of one crawled lately, or
        of one read here and not yet ended (counted finished if so)."""
        if self._copies.window_s <= 0:
            return False
        first = self._reading.get(tp, {}).get(found, offset)
        crawled = found in self._seen.get(tp, ()) or found in self._recent.get(tp, ())
        if first == offset and not crawled:
            return False
        self.copies_skipped += 1
        URLS_COPIES_SKIPPED.labels(source).inc()
        log.debug("copy_skipped", source=source, partition=tp.partition, offset=offset)
        return True

    def _note_reading(self, tp: TopicPartition, offset: int, found: str) -> None:
        if self._copies.window_s > 0:
            self._reading.setdefault(tp, {}).setdefault(found, offset)

    def _ended_reading(self, tp: TopicPartition, offset: int, found: str) -> None:
        reading = self._reading.get(tp)
        if reading and reading.get(found) == offset:
            del reading[found]

    def _give_back(self, tp: TopicPartition, offset: int) -> None:
        self._consumer.seek(tp, offset)
        self._consumer.pause(tp)
        self._paused.add(tp)

    def _note_read(self, source: str, tp: TopicPartition, first: int) -> None:
        """Remember the first record read since the assignment; have a jump past the
        next record to read checked for deleted records."""
        self._first_read.setdefault(tp, first)
        expected = self._next_read.get(tp)
        if expected is not None and first > expected:
            self._lost.skipped(source, tp, expected, first)

    def _source_of(self, topic: str) -> str | None:
        try:
            return self._topic_sources[topic]
        except KeyError:
            source = self._topic_sources[topic] = source_of_topic(topic)
            return source

    def _update_pauses(self, share: int) -> None:
        """Pause a source's partitions when it holds its share; resume them once it has
        finished about half of it (``resume_at``), not at the first free slot.

        Each resume wakes the consumer's fetcher, which then walks every assigned
        partition (in Python) a few times before the source is full again: with many
        sources of a small share, resuming at the first free slot cost more of the
        worker's CPU than the images did. Resuming at half the share fetches up to half a
        share at once.

        Only sources whose unfinished count changed are looked at (all of them after a
        rebalance or a change of share): asking the consumer for its paused partitions,
        and walking every partition, in every loop is what the scheduler would otherwise
        spend its time on with many sources. The free slots are counted the same way.

        Resumes are gathered and made at most every ``resume_every_s``: each one wakes
        aiokafka's fetcher, which walks every assigned partition and waits on every paused
        one's future, and with many sources a resume is due in most loops. A fetch waits
        for the long poll in flight anyway (``fetch_max_wait_ms``, see worker.__main__),
        so a resume made a fraction of it later costs little.
        """
        if self._sync_assignment() or share != self._paused_for_share:
            self._paused_for_share = share
            sources: Iterable[str | None] = list(self._partitions_of)
            self._free, self._free_total = {}, 0
        else:
            sources = self._changed
        self._changed = set()
        resume_at = resume_threshold(share)
        to_pause, to_resume = [], []
        for source in sources:
            # A topic that is not a source's is never fetched: "full" at any count.
            unfinished = self._unfinished[source] if source is not None else share
            if source is not None:
                free = max(0, share - unfinished) if source in self._partitions_of else 0
                self._free_total += free - self._free.pop(source, 0)
                if free:
                    self._free[source] = free
            for tp in self._partitions_of.get(source, ()):
                if tp in self._paused:
                    if unfinished <= resume_at and source is not None:
                        to_resume.append(tp)
                elif unfinished >= share:
                    to_pause.append(tp)
        if to_pause:
            self._consumer.pause(*to_pause)
            self._paused.update(to_pause)
        self._to_resume.update(to_resume)
        now = asyncio.get_running_loop().time()
        if self._to_resume and now >= self._next_resume_at:
            # Not a partition given back for want of room to queue, or spinning.
            due = (self._to_resume & self._paused) - self._held.keys() - self._spin_until.keys()
            self._to_resume = set()
            self._next_resume_at = now + self._settings.resume_every_s
            if due:
                self._consumer.resume(*due)
                self._paused.difference_update(due)

    def _sync_assignment(self) -> bool:
        """Rebuild the view of the assignment if it changed; True if it did."""
        assignment = self._consumer.assignment()
        if not self._resync and assignment == self._assignment:
            return False
        self._resync = False
        self._assignment = frozenset(assignment)
        self._partitions_of = {}
        for tp in assignment:
            self._partitions_of.setdefault(self._source_of(tp.topic), []).append(tp)
        # The consumer's own pause state is the truth after a rebalance: it resets it. The
        # resumes due are worked out again, for every source.
        self._paused = set(self._consumer.paused())
        self._to_resume = set()
        return True

    def _start(self, source: str, tp: TopicPartition, offset: int, value: bytes | None) -> bool:
        """Start, queue or park a URL just read; False when there is no room to queue it
        (it is to be given back, unread)."""
        tracker = self._trackers.setdefault(tp, OffsetTracker())
        if offset in tracker:
            return True
        found = digest(value)
        if self._finished_before(source, tp, offset, value) or self._is_copy(
            source, tp, offset, found
        ):
            tracker.start(offset)
            tracker.finish(offset)
            return True
        key = None if self._host_of is None else self._host_of(source, value)
        if key is None:
            tracker.start(offset)
            self._note_reading(tp, offset, found)
            self._launch(source, tp, offset, value, None)
            return True
        now = asyncio.get_running_loop().time()
        entry = Waiting(key, tp, offset, value, now)
        verdict = self._queues.offer(entry, self.share(), now)
        if verdict == HOLD:
            return False
        tracker.start(offset)
        self._note_reading(tp, offset, found)
        if verdict == PARK:
            self._parks_in_row[tp] += 1
            self._park(entry)
            return True
        self._parks_in_row.pop(tp, None)
        self._spin_next_s.pop(tp, None)
        if verdict != QUEUED:
            self._queues.started(key)
            self._launch(source, tp, offset, value, key)
        return True

    def _launch(
        self,
        source: str,
        tp: TopicPartition,
        offset: int,
        value: bytes | None,
        key: HostKey | None,
    ) -> None:
        if self._stopping:
            return  # started in the tracker, never finished: committed before, read again
        in_flight = self._in_flight.setdefault(tp, set())
        if offset in in_flight:
            # Still running from before a rebalance gave this partition back to us: the
            # copy read again gives its host's place back, and the URLs that place lets
            # start do start (dropped, they would never run, and their host would stay
            # full for good).
            if key is not None:
                now = asyncio.get_running_loop().time()
                for entry in self._queues.ended(key, self.share(), now):
                    self._launch(source, entry.partition, entry.offset, entry.value, key)
            return
        in_flight.add(offset)
        log.debug("task_started", source=source, partition=tp.partition, offset=offset)
        self._unfinished[source] += 1
        self._changed.add(source)
        until = self._elsewhere.get(tp, {}).pop(offset, None)
        task = asyncio.create_task(self._run_one(source, tp, offset, value, key, until))
        self._tasks[task] = (tp, offset)
        task.add_done_callback(self._task_done)
        if key is None and until is None:
            self._requesting.add(task)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)
        self._requesting.discard(task)

    async def _run_one(
        self,
        source: str,
        tp: TopicPartition,
        offset: int,
        value: bytes | None,
        key: HostKey | None = None,
        elsewhere_until: float | None = None,
    ) -> None:
        finished = skipped = False
        waits: HostWaits | None = None
        granted = [False]  # its request had its slot (slot_taken)
        if key is not None:
            SLOT_TAKEN.set(functools.partial(self._slot_taken, source, key, granted))
        try:
            if elsewhere_until is not None:
                skipped = await self._ended_elsewhere(source, tp, offset, value, elsewhere_until)
            if not skipped:
                if key is None and (me := asyncio.current_task()) is not None:
                    self._requesting.add(me)  # its request goes out now (held back until then)
                await self._handler(source, value, tp.topic)
                finished = True
        except asyncio.CancelledError:
            raise
        except HostWaits as e:
            waits = e  # back to its host's queue: not finished, not failed
        except Exception as e:
            log.exception(
                "message_failed",
                source=source,
                topic=tp.topic,
                partition=tp.partition,
                offset=offset,
            )
            try:
                await self._on_failure(source, value, tp.topic, e)
                finished = True
            except Exception:
                log.exception("dead_letter_failed", source=source, topic=tp.topic, offset=offset)
        finally:
            self._unfinished[source] -= 1
            if self._unfinished[source] <= 0:
                del self._unfinished[source]
            self._changed.add(source)
            self._in_flight.get(tp, set()).discard(offset)
            if finished or skipped:
                self.finished += finished
                self._note_finished(tp, offset, value)
            found = digest(value)
            if finished and self._copies.window_s > 0:
                self._crawled.setdefault(tp, set()).add(found)
                self._recent.setdefault(tp, {})[found] = time.monotonic()
            if waits is None:  # back to its host's queue: still to be crawled here
                self._ended_reading(tp, offset, found)
            if (until_ms := self._late.pop((tp, offset), None)) is not None:
                self._settle_late(tp, offset, until_ms, fingerprint(value) if finished else None)
            if key is not None:
                self._host_done(source, tp, offset, value, key, waits, granted[0])

    def _slot_taken(self, source: str, key: HostKey, granted: list[bool]) -> None:
        if granted[0] or self._stopping:
            return
        granted[0] = True
        if (task := asyncio.current_task()) in self._tasks:
            self._requesting.add(task)
        now = asyncio.get_running_loop().time()
        for entry in self._queues.granted(key, self.share(), now):
            self._launch(source, entry.partition, entry.offset, entry.value, key)

    def _host_done(
        self,
        source: str,
        tp: TopicPartition,
        offset: int,
        value: bytes | None,
        key: HostKey,
        waits: HostWaits | None,
        granted: bool,
    ) -> None:
        """A URL of ``key`` ended, or must wait (``waits``): the host's next ones start."""
        if self._stopping:
            return
        now = asyncio.get_running_loop().time()
        if waits is not None and tp in self._trackers:
            entry = Waiting(key, tp, offset, value, now)
            self._queues.defer(entry, waits.wait_s, now, granted=granted)
            ready = []
        else:  # ended, or revoked meanwhile (its next owner reads it again)
            ready = self._queues.ended(key, self.share(), now, granted=granted)
        for entry in ready:
            self._launch(source, entry.partition, entry.offset, entry.value, key)

    # --- waiting for hosts ---------------------------------------------------------------
    def _tend_queues(self, share: int) -> None:
        """Start the URLs of hosts whose block ended, park those waiting too long, and
        let held and spinning partitions be read again when their time has come."""
        now = asyncio.get_running_loop().time()
        queues = self._queues
        for entry in queues.due(share, now):
            source = entry.key.source
            self._launch(source, entry.partition, entry.offset, entry.value, entry.key)
        for entry in queues.stale(now):
            self._park(entry)
        URLS_WAITING.set(queues.waiting)
        for tp, (source, until) in list(self._held.items()):
            roomy = queues.waiting_of(source) <= share // 2 and not queues.crowded()
            if roomy or now >= until:
                del self._held[tp]
                self._to_resume.add(tp)
        for tp, until in list(self._spin_until.items()):
            if now >= until:
                del self._spin_until[tp]
                self._to_resume.add(tp)

    def _check_spin(self, tp: TopicPartition) -> None:
        """Pause a partition whose last ``spin_parks`` URLs read were all parked."""
        settings = self._settings
        if self._parks_in_row[tp] < settings.spin_parks:
            return
        del self._parks_in_row[tp]
        pause_s = self._spin_next_s.get(tp, settings.spin_pause_s)
        self._spin_next_s[tp] = min(pause_s * 2, settings.spin_pause_max_s)
        self._spin_until[tp] = asyncio.get_running_loop().time() + pause_s
        if tp not in self._paused:
            self._consumer.pause(tp)
            self._paused.add(tp)
        log.info("parking_paused", topic=tp.topic, partition=tp.partition, pause_s=pause_s)

    def _park(self, entry: Waiting[TopicPartition]) -> None:
        self._ended_reading(entry.partition, entry.offset, digest(entry.value))
        task = asyncio.create_task(self._park_one(entry))
        self._parking.add(task)
        task.add_done_callback(self._parking.discard)

    async def _park_one(self, entry: Waiting[TopicPartition]) -> None:
        """Append the URL again to its topic, then count it finished; if that cannot be
        done, it runs instead (and waits in its task for its host)."""
        tp, source = entry.partition, entry.key.source
        try:
            if self._park_fn is None:
                raise RuntimeError("no way to park")
            await self._park_fn(source, entry.value, tp.topic)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("park_failed", source=source, topic=tp.topic, offset=entry.offset)
            self._note_reading(tp, entry.offset, digest(entry.value))
            self._queues.started(entry.key)
            self._launch(source, tp, entry.offset, entry.value, entry.key)
            return
        self.parked += 1
        URLS_PARKED.labels(source).inc()
        self._note_finished(tp, entry.offset, entry.value)

    async def _watch_sources(self, stop: asyncio.Event) -> None:
        """Follow ``inbound_sources``. The set is read in full only when its size changed,
        and every ``_FULL_READ_EVERY`` polls (a source removed and another added between
        two polls keep the size): with many sources, redis-py parsing every member on
        every poll would cost the worker more than the poll is worth."""
        size_read, polls = -1, 0
        while not stop.is_set():
            polls += 1
            try:
                size = await self._redis.scard(INBOUND_SOURCES_SET)
                if size != size_read or polls % _FULL_READ_EVERY == 0:
                    members = await self._redis.smembers(INBOUND_SOURCES_SET)
                    size_read = len(members)
                    self._add_sources(members)
            except RedisError as e:
                log.warning("redis_unavailable", op="read_sources", error=repr(e))
                size_read = -1
            await sleep_unless_stopped(stop, self._settings.sources_poll_s)

    def _add_sources(self, members: Iterable[str | bytes]) -> None:
        seen = frozenset(m.decode() if isinstance(m, bytes) else m for m in members)
        # Only ever grows, as the set does: a Redis that lost its data (FLUSHALL, a restart
        # without persistence) must not unsubscribe sources still queued.
        sources = self._sources | seen
        if sources != self._sources:
            self._subscribe(sources)

    def _subscribe(self, sources: frozenset[str]) -> None:
        added = sorted(sources - self._sources)
        log.info(
            "sources_changed",
            sources=len(sources),
            added=added[:20],
            share=fair_share(self._settings.max_tasks, len(sources)),
        )
        self._sources = sources
        self._consumer.subscribe(
            topics=sorted(source_topic(s) for s in sources), listener=self._listener
        )

    async def _commit_periodically(self) -> None:
        while True:
            await asyncio.sleep(self._settings.commit_interval_s)
            try:
                await self.commit()
            except Exception:
                log.exception("commit_loop_error")

    async def _record_soon(self) -> None:
        while True:
            await self._ended.wait()
            await asyncio.sleep(RECORD_DELAY_S)
            self._ended.clear()
            try:
                await self._record(self._consumer.assignment())
            except Exception:
                log.exception("record_loop_error")

    async def _record(self, partitions: set[TopicPartition]) -> None:
        await self._record_finished(partitions)
        await self._record_crawled()

    async def commit(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Commit every finished prefix of the given (default: assigned) partitions."""
        assigned = self._consumer.assignment()
        chosen = assigned if partitions is None else set(partitions) & assigned
        await self._record(chosen)
        # Not while their check for deleted records runs: a commit first would hide a loss.
        chosen = chosen - self._lost.held
        offsets: dict[TopicPartition, int] = {}
        for tp in chosen:
            tracker = self._trackers.get(tp)
            offset = tracker.committable() if tracker is not None else None
            if offset is not None and offset != self._committed.get(tp):
                offsets[tp] = offset
        if not offsets:
            return
        if not is_a_member(self._consumer):
            # Dropped from the group (a heartbeat or a commit was answered UnknownMemberId
            # or IllegalGeneration): the partitions are another member's now, and whoever
            # owns them reads them again from their committed offsets (at least once).
            log.warning("commit_skipped", reason="not_a_member", partitions=len(offsets))
            return
        log.debug(
            "committing", offsets={f"{tp.topic}:{tp.partition}": o for tp, o in offsets.items()}
        )
        try:
            await self._consumer.commit(offsets)
        except KafkaError as e:
            # Not fatal: the offsets are committed by a later attempt, or the messages
            # are processed again by whoever owns the partition next (at least once).
            # aiokafka wraps the broker's refusal (UnknownMemberId, IllegalGeneration,
            # RebalanceInProgress) in CommitFailedError; its text is a paragraph, so the
            # event carries the class names.
            cause = e.__cause__
            log.warning(
                "commit_failed",
                error=type(e).__name__,
                cause=type(cause).__name__ if cause is not None else None,
                partitions=len(offsets),
            )
            return
        self._committed.update(offsets)
        for tp, offset in offsets.items():
            if past := self._past_commit.get(tp):
                self._past_commit[tp] = {o: crc for o, crc in past.items() if o >= offset}
        try:
            await self._ledger.trim(offsets)
        except RedisError as e:
            log.warning("finished_trim_failed", error=repr(e), partitions=len(offsets))

    async def on_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        revoked = set(revoked)
        self._generation += 1
        # First, so that no URL of theirs starts as those handed back give up their hosts.
        self._queues.forget(revoked)
        await self._mark_late(await self._await_requests(revoked))
        for tp in revoked:
            if past := self._past_commit.get(tp):
                self._unrecorded[tp] = list(past.items())
        try:
            await self.commit(revoked)
        finally:
            # Forgotten even when the commit failed: whoever owns a partition next starts
            # from its committed offset, and so does this worker if it gets it back.
            for tp in revoked:
                self._trackers.pop(tp, None)
                self._unrecorded.pop(tp, None)
                self._reading.pop(tp, None)
                self._past_commit.pop(tp, None)
                self._skip.pop(tp, None)
                self._elsewhere.pop(tp, None)
                self._committed.pop(tp, None)
                self._first_read.pop(tp, None)
                self._next_read.pop(tp, None)
                self._reread.pop(tp, None)
                self._held.pop(tp, None)
                self._spin_until.pop(tp, None)
                self._spin_next_s.pop(tp, None)
                self._parks_in_row.pop(tp, None)
        if revoked:  # aiokafka also calls this, with nothing, before the first assignment
            log.info("partitions_revoked", partitions=len(revoked), **_names(revoked))

    async def on_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        assigned = set(assigned)
        self._generation += 1
        self._resync = True  # a new assignment starts unpaused, even if it is the same
        await self._load_finished(assigned)
        self._lost.assigned(
            {tp: s for tp in assigned if (s := self._source_of(tp.topic)) is not None},
            self._first_read.get,
        )
        log.info(
            "partitions_assigned",
            partitions=len(assigned),
            sources=len({self._source_of(tp.topic) for tp in assigned}),
            **_names(assigned),
        )

    async def _await_requests(self, revoked: set[TopicPartition]) -> set[asyncio.Task[None]]:
        """Hand back the revoked partitions' URLs still waiting for their slot (left to
        run, each would be requested here and by the partition's next owner both), and
        let those whose request is on the wire end, for a while: those still running
        then are returned."""
        tasks = [t for t, (tp, _) in self._tasks.items() if tp in revoked]
        unasked = [t for t in tasks if t not in self._requesting]
        asked = [t for t in tasks if t in self._requesting]
        if unasked:
            await cancel_and_wait(unasked)
        late: set[asyncio.Task[None]] = set()
        if asked:
            _, late = await asyncio.wait(asked, timeout=self._settings.revoke_wait_s)
        if tasks:
            log.info("revoke_waited", handed_back=len(unasked), tasks=len(asked), late=len(late))
        return late

    async def _mark_late(self, late: set[asyncio.Task[None]]) -> None:
        """Mark the revoked partitions' requests still running as such in Redis, for
        ``late_hold_s``: their next owners hold them back until they end here, and those
        not ended by then are given up here (unless their partition is back)."""
        hold_s = self._settings.late_hold_s
        until_ms = int((time.time() + hold_s) * 1000)
        running: dict[TopicPartition, list[int]] = {}
        loop = asyncio.get_running_loop()
        for task in late:  # not done, with no await since: all still in _tasks
            tp, offset = owned = self._tasks[task]
            self._late[owned] = until_ms
            running.setdefault(tp, []).append(offset)
            loop.call_later(hold_s, self._give_up_late, task)
        if not running:
            return
        try:
            async with asyncio.timeout(LEDGER_TIMEOUT_S):
                await self._ledger.mark_running(running, until_ms)
        except (RedisError, TimeoutError) as e:
            log.warning("finished_record_failed", error=repr(e), partitions=len(running))

    def _give_up_late(self, task: asyncio.Task[None]) -> None:
        if (owned := self._tasks.get(task)) is None:
            return
        tp, offset = owned
        tracker = self._trackers.get(tp)
        if tracker is None or offset not in tracker:  # not read again here: not ours
            log.info("late_given_up", topic=tp.topic, partition=tp.partition, offset=offset)
            task.cancel()

    def _settle_late(self, tp: TopicPartition, offset: int, until_ms: int, crc: int | None) -> None:
        """Replace the running marker of a message that ended here: by its finished member
        (``crc``: finished; even if its partition is ours again, as its copy read again
        here may be waiting for its host and then asks), else by nothing (given up, it
        runs at its next owner at once)."""
        task = asyncio.create_task(self._settle(tp, offset, until_ms, crc))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle(
        self, tp: TopicPartition, offset: int, until_ms: int, crc: int | None
    ) -> None:
        try:
            async with asyncio.timeout(LEDGER_TIMEOUT_S):
                await self._ledger.settle(tp, offset, until_ms, crc)
        except (RedisError, TimeoutError) as e:
            log.warning("finished_record_failed", error=repr(e), partitions=1)

    async def _ended_elsewhere(
        self, source: str, tp: TopicPartition, offset: int, value: bytes | None, until: float
    ) -> bool:
        """Whether the partition's previous owner, still running this message at its
        revoke, finished it; asked until it ended there or ``until`` (Unix s) has passed."""
        crc = fingerprint(value)
        while (left_s := until - time.time()) > 0:
            try:
                async with asyncio.timeout(LEDGER_TIMEOUT_S):
                    state = await self._ledger.state(tp, offset, crc)
            except (RedisError, TimeoutError) as e:
                log.warning("finished_load_failed", error=repr(e), partitions=1)
                return False
            if state == FINISHED:
                self._count_skipped(source, tp, offset)
            if state != RUNNING:
                return state == FINISHED
            await asyncio.sleep(min(ELSEWHERE_POLL_S, left_s))
        return False

    def _note_finished(self, tp: TopicPartition, offset: int, value: bytes | None) -> None:
        tracker = self._trackers.get(tp)
        if tracker is None:
            return  # revoked meanwhile: whoever owns it reads it again
        tracker.finish(offset)
        crc = fingerprint(value)
        self._unrecorded.setdefault(tp, []).append((offset, crc))
        self._past_commit.setdefault(tp, {})[offset] = crc
        self._ended.set()

    def _finished_before(
        self, source: str, tp: TopicPartition, offset: int, value: bytes | None
    ) -> bool:
        """Whether the message at ``offset`` is one a previous owner finished."""
        skip = self._skip.get(tp)
        if not skip:
            return False
        crc = skip.pop(offset, None)
        if crc is None or crc != fingerprint(value):
            return False
        self._count_skipped(source, tp, offset)
        return True

    def _count_skipped(self, source: str, tp: TopicPartition, offset: int) -> None:
        self.skipped += 1
        URLS_FINISHED_SKIPPED.labels(source).inc()
        log.debug("finished_skipped", source=source, partition=tp.partition, offset=offset)

    async def _record_finished(self, partitions: set[TopicPartition]) -> None:
        """Write what was finished past each partition's commit point since the last
        commit. Lost (Redis away): only work done again after a rebalance."""
        if time.monotonic() - self._unwritten_since > UNWRITTEN_KEEP_S:
            self._unwritten = {}
        # Taken, not copied: of two writes at once (the recorder's and a commit's), neither
        # writes the other's entries nor drops those of the other's failure.
        finished, self._unwritten = self._unwritten, {}
        since = self._unwritten_since if finished else time.monotonic()
        for tp in partitions:
            entries = self._unrecorded.pop(tp, None)
            if entries:
                finished.setdefault(tp, {}).update(entries)
        for tp in list(finished):
            # Those below the last commit are covered by it (those below the one about to
            # be made are written too, in case it fails, and trimmed once it is made).
            floor = self._committed.get(tp, 0)
            finished[tp] = {o: crc for o, crc in finished[tp].items() if o >= floor}
            if not finished[tp]:
                del finished[tp]
        if not finished:
            return
        try:
            async with asyncio.timeout(LEDGER_TIMEOUT_S):
                await self._ledger.record({tp: list(e.items()) for tp, e in finished.items()})
        except (RedisError, TimeoutError) as e:
            log.warning("finished_record_failed", error=repr(e), partitions=len(finished))
            self._unwritten_since = min(since, self._unwritten_since) if self._unwritten else since
            for tp, taken in finished.items():
                self._unwritten.setdefault(tp, {}).update(taken)

    async def _record_crawled(self) -> None:
        """Write the digests of what was crawled here since the last commit (whatever
        partition is ours now: a copy is skipped by whoever reads it). Lost: copies
        crawled again."""
        crawled, self._crawled = self._crawled, {}
        if not crawled or self._copies.window_s <= 0:
            return
        now = time.monotonic()
        if now - self._recent_pruned >= CRAWLED_KEEP_S / 10:
            self._prune_recent(now - CRAWLED_KEEP_S)
            self._recent_pruned = now
        try:
            async with asyncio.timeout(LEDGER_TIMEOUT_S):
                await self._copies.record(crawled)
        except (RedisError, TimeoutError) as e:
            log.warning("crawled_record_failed", error=repr(e), partitions=len(crawled))

    def _prune_recent(self, kept_since: float) -> None:
        for tp in list(self._recent):
            recent = {d: t for d, t in self._recent[tp].items() if t >= kept_since}
            if recent:
                self._recent[tp] = recent
            else:
                del self._recent[tp]

    async def _load_finished(self, assigned: set[TopicPartition]) -> None:
        """Read what the partitions' previous owners finished past their commits."""
        try:
            async with asyncio.timeout(LEDGER_TIMEOUT_S):
                loaded = await self._ledger.load(assigned)
        except (RedisError, TimeoutError) as e:
            log.warning("finished_load_failed", error=repr(e), partitions=len(assigned))
            return
        self._skip.update(loaded.finished)
        self._elsewhere.update(loaded.running)
        if loaded.finished or loaded.running:
            log.info(
                "finished_loaded",
                partitions=len(loaded.finished.keys() | loaded.running.keys()),
                offsets=sum(len(v) for v in loaded.finished.values()),
                running=sum(len(v) for v in loaded.running.values()),
            )

    async def _drain(self) -> None:
        """Let in-flight work (and parking) finish for the grace period, hand back the
        rest, commit. URLs waiting for their host are left uncommitted: read again."""
        self._draining = True
        pending = set(self._tasks) | self._parking
        if pending:
            log.info("draining", tasks=len(pending), grace_s=self._settings.shutdown_grace_s)
            _, pending = await asyncio.wait(pending, timeout=self._settings.shutdown_grace_s)
        if pending:
            log.warning("handing_back", tasks=len(pending))
            await cancel_and_wait(pending)
        await self.commit()
        if self._settling:  # the markers of late requests that ended meanwhile
            await asyncio.wait(self._settling, timeout=LEDGER_TIMEOUT_S)


def is_a_member(consumer: Any) -> bool:
    """False while aiokafka has forgotten its member id and generation, from the moment
    the broker says the member was dropped until it has joined again. A commit sent then
    carries generation -1 and no member id, which is how a consumer outside any group
    commits: the broker refuses it while the group has members (UnknownMemberId; tansu
    too), but takes it once the group is empty, and it would then move back the offsets
    the partitions' last owner committed. So it is not sent. (aiokafka has no public
    accessor; a consumer without a coordinator, a test's fake, is taken as a member.)"""
    coordinator = getattr(consumer, "_coordinator", None)
    generation = getattr(coordinator, "generation", None)
    return generation != OffsetCommitRequest.DEFAULT_GENERATION_ID


class _Listener(ConsumerRebalanceListener):
    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._scheduler.on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self._scheduler.on_assigned(assigned)


# At most this many partitions are named in a log event; the count is always there.
LOGGED_PARTITIONS = 100


def _names(partitions: Iterable[TopicPartition]) -> dict[str, list[str]]:
    """``{"topic_partitions": ["urls.a:0", ...]}``, sorted and capped, for a log event."""
    names = sorted(f"{tp.topic}:{tp.partition}" for tp in partitions)
    return {"topic_partitions": names[:LOGGED_PARTITIONS]}
