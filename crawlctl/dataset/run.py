"""One download on a running crawl: send the shards' rows, follow them to their ends,
write each shard once all its rows have ended.

At most ``window`` shards are in flight (sent, not yet written), so that what is kept
(each row's key until it ends, and its ending on disk) is bounded by the window, not by
the list. Endings are read from the output topics in no consumer group (every
partition, from the offsets the state saved, a first run's from the topics' ends:
tansu's slow group protocol stays out of it), joined (``outcomes.Joiner``), appended to
the shard's ledger, and every ``CHECKPOINT_S`` the ledgers go to disk and then the
offsets. A shard whose rows have all ended is written (to a folder or S3, whole or not at
all: ``stores``) from its rows, its ledger and the images the workers stored, which are
then deleted with its state.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, TopicPartition

from crawlctl.commands.produce import SendSettings, send_images
from crawlctl.dataset.layout import DUPLICATE, SUCCESS, Ending, Layout, verdict
from crawlctl.dataset.outcomes import Joiner, Keeper, outcome_topics
from crawlctl.dataset.shards import ShardFormat, ShardRow
from crawlctl.dataset.state import DatasetState, RunInfo
from crawlctl.dataset.stores import Destination, Images
from image_crawler.config import KafkaSettings
from image_crawler.contract import Encoding, InboundImage, RowData, object_key

CHECKPOINT_S: Final = 1.0
PROGRESS_S: Final = 10.0
# The rate and ETA are over the last minute of endings.
RATE_WINDOW_S: Final = 60.0


@dataclasses.dataclass(frozen=True, slots=True)
class Dataset:
    """What a download makes, where, and how its rows are sent; where the workers'
    images are read from; ``dedup``, the clusters whose first image alone is kept
    (``exact``, ``near``; None: every image)."""

    destination: Destination
    info: RunInfo
    layout: Layout
    fmt: ShardFormat
    encoding: Encoding
    images: Images
    dedup: str | None = None


class Tally:
    """The rows ended so far, for the progress line and the summary."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.ended = 0
        self.images = 0
        self.duplicates = 0
        self.failed: collections.Counter[str] = collections.Counter()
        self.shards_written = 0
        self.began = time.monotonic()
        self._recent: collections.deque[float] = collections.deque()

    def add(self, ending: Ending, skip_opted_out: bool, *, now: float | None = None) -> None:
        status, _, crawl_status = verdict(ending, skip_opted_out)
        self.ended += 1
        if status == SUCCESS:
            self.images += 1
        elif status == DUPLICATE:
            self.duplicates += 1
        else:
            self.failed[crawl_status] += 1
        self._recent.append(time.monotonic() if now is None else now)

    def rate(self, now: float | None = None) -> float:
        """Rows ended a second over the last minute (since the start, if shorter)."""
        now = time.monotonic() if now is None else now
        while self._recent and self._recent[0] < now - RATE_WINDOW_S:
            self._recent.popleft()
        span = min(RATE_WINDOW_S, now - self.began)
        return len(self._recent) / span if span > 0 else 0.0

    def line(self, now: float | None = None) -> str:
        rate = self.rate(now)
        left = self.total - self.ended
        eta = f"ETA {left / rate:.0f} s" if rate > 0 and left else "ETA -"
        reasons = ", ".join(f"{s} {n}" for s, n in self.failed.most_common(4))
        failed = sum(self.failed.values())
        duplicates = f", {self.duplicates} duplicates" if self.duplicates else ""
        return (
            f"{self.ended}/{self.total} rows ended: {self.images} images{duplicates}, "
            f"{failed} failed"
            + (f" ({reasons})" if reasons else "")
            + f"; {rate:.1f} rows/s; {eta}"
        )

    def add_written(self, stats: dict[str, Any]) -> None:
        """A shard an earlier run wrote, from its stats file."""
        self.ended += stats["count"]
        self.images += stats["successes"]
        self.duplicates += stats.get("duplicates", 0)
        for status, count in stats.get("crawl_statuses", {}).items():
            if status not in ("200", "304"):
                self.failed[status] += count
        self.shards_written += 1


class DownloadRun:
    """Send, follow and write until every shard is written or ``stop`` is set."""

    def __init__(
        self,
        dataset: Dataset,
        state: DatasetState,
        kafka: KafkaSettings,
        *,
        window: int,
        stop: asyncio.Event,
        failed: Callable[[], str | None] = lambda: None,
        note: Callable[[str], None] = print,
    ) -> None:
        self.dataset = dataset
        self.state = state
        self.kafka = kafka
        self.window = window
        self.stop = stop
        self._failed = failed
        self._note = note
        self.tally = Tally(dataset.info.rows)
        key_of = dataset.info.key_of
        self._keeper = (
            None if dataset.dedup is None else Keeper(dataset.dedup, key_of, state.load_kept())
        )
        self._kept_saved = 0 if self._keeper is None else len(self._keeper.kept)
        self._topics = outcome_topics(dataset.dedup)
        self._joiner = Joiner(key_of, self._keeper)
        self._complete = dataset.destination.complete()
        # Each shard in flight: the keys of its rows not ended yet.
        self._pending: dict[int, set[str]] = {}
        self._next: dict[tuple[str, int], int] = {}
        self._sent_at: dict[int, float] = {}

    @property
    def done(self) -> bool:
        return len(self._complete) == self.dataset.info.shards

    async def run(self) -> str | None:
        """Until the dataset is whole: None; or why not (stopped, a process died)."""
        self._resume()
        consumer = AIOKafkaConsumer(
            **self.kafka.client_options(),
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            metadata_max_age_ms=1000,
        )
        consumer.subscribe(list(self._topics))
        await consumer.start()
        try:
            if not self._next and not self.state.sent():
                await self._start_at_ends(consumer)
            return await self._follow(consumer)
        finally:
            self._checkpoint()
            await consumer.stop()

    def _resume(self) -> None:
        """What an earlier run left: the complete shards counted and their state dropped,
        the sent ones in flight again, with what of them has ended."""
        for shard in set(self.state.ended_shards()) | self.state.sent():
            if shard in self._complete:
                self.state.forget(shard)
        for shard in sorted(self._complete):
            self.tally.add_written(self.dataset.destination.stats(shard))
        for shard in sorted(self.state.sent() - self._complete):
            self._load(shard)
        self._next = self.state.load_offsets()

    async def _start_at_ends(self, consumer: AIOKafkaConsumer) -> None:
        """Nothing sent yet: every ending to come is past the topics' ends now. On a
        cluster the output topics hold every other crawl's messages (weeks of them), none
        of which is this run's. Saved before anything is sent, so that a rerun reads from
        here; a partition that appears later is read from its start."""
        await consumer.topics()  # the cluster's metadata, the output topics' partitions
        partitions = [
            TopicPartition(topic, p)
            for topic in self._topics
            for p in consumer.partitions_for_topic(topic) or ()
        ]
        if partitions:
            ends = await consumer.end_offsets(partitions)
            self._next = {(tp.topic, tp.partition): offset for tp, offset in ends.items()}
        self.state.save_offsets(self._next)

    def _load(self, shard: int) -> list[str]:
        """Put ``shard`` in flight: its rows not ended; returns their keys."""
        layout = self.dataset.layout
        keys = [layout.key(r.shard, r.index) for r in self.state.read_input(shard)]
        ended = self.state.endings(shard)
        for ending in ended.values():
            self.tally.add(ending, self.dataset.fmt.skip_opted_out)
        self._pending[shard] = {k for k in keys if k not in ended}
        self._sent_at[shard] = time.time()
        return [k for k in keys if k not in ended]

    async def _follow(self, consumer: AIOKafkaConsumer) -> str | None:
        seeked: set[TopicPartition] = set()
        last_checkpoint = last_progress = time.monotonic()
        while not self.done:
            if self.stop.is_set():
                return "stopped"
            if (why := self._failed()) is not None:
                return why
            await self._fill_window()
            await self._write_ready()
            self._seek_new(consumer, seeked)
            batch = await consumer.getmany(timeout_ms=200)
            for partition, records in batch.items():
                for record in records:
                    self._add(partition.topic, record.value)
                    self._next[partition.topic, partition.partition] = record.offset + 1
            now = time.monotonic()
            if now - last_checkpoint >= CHECKPOINT_S:
                self._checkpoint()
                last_checkpoint = now
            if now - last_progress >= PROGRESS_S:
                self._note(f"progress: {self.tally.line()}")
                last_progress = now
        return None

    def _seek_new(self, consumer: AIOKafkaConsumer, seeked: set[TopicPartition]) -> None:
        # Partitions appear as workers first write to their topics; each starts where the
        # state's offsets say (a replay is harmless: a row ends once).
        for tp in consumer.assignment() - seeked:
            offset = self._next.get((tp.topic, tp.partition))
            if offset is not None:
                consumer.seek(tp, offset)
            seeked.add(tp)

    def _add(self, topic: str, value: bytes | None) -> None:
        joined = self._joiner.add(topic, value)
        if joined is None:
            return
        key, ending = joined
        shard = self.dataset.layout.shard_of(key)
        pending = self._pending.get(shard)
        if pending is None or key not in pending:
            return  # a shard written, or a row that ended already (a duplicate)
        pending.discard(key)
        self.state.record(shard, key, ending)
        self.tally.add(ending, self.dataset.fmt.skip_opted_out)

    def _checkpoint(self) -> None:
        self.state.flush()
        keeper = self._keeper
        # Before the offsets, as the endings that rest on it; it only grows.
        if keeper is not None and len(keeper.kept) != self._kept_saved:
            self.state.save_kept(keeper.kept)
            self._kept_saved = len(keeper.kept)
        self.state.save_offsets(self._next)

    async def _fill_window(self) -> None:
        info = self.dataset.info
        while len(self._pending) < self.window:
            unsent = [
                s for s in range(info.shards) if s not in self._complete and s not in self._pending
            ]
            if not unsent:
                return
            shard = unsent[0]
            keys = self._load(shard)
            await self._send(shard, keys)
            self.state.mark_sent(shard)

    async def _send(self, shard: int, keys: Sequence[str]) -> None:
        if not keys:
            return
        info, encoding = self.dataset.info, self.dataset.encoding
        wanted = set(keys)
        messages = []
        for row in self.state.read_input(shard):
            key = self.dataset.layout.key(row.shard, row.index)
            if key in wanted and row.url is not None:
                data = RowData(row.caption, dict(row.columns) or None)
                messages.append(
                    InboundImage(
                        url=row.url,
                        uuid=info.identifier(key),
                        source=info.source,
                        row=None if data == RowData() else data,
                        encoding=encoding,
                    )
                )
        await send_images(SendSettings(self.kafka), messages)

    async def _write_ready(self) -> None:
        for shard in sorted(s for s, keys in self._pending.items() if not keys):
            self.state.flush()  # its endings on disk before its input is read back
            await asyncio.to_thread(self._write, shard)
            del self._pending[shard]
            self._complete.add(shard)
            self.tally.shards_written += 1

    def _write(self, shard: int) -> None:
        dataset, state = self.dataset, self.state
        endings = state.endings(shard)
        rows = []
        stored: list[str] = []
        for row in state.read_input(shard):
            key = dataset.layout.key(row.shard, row.index)
            ending = endings[key]
            image = None
            if ending.crawled:  # stored, a success or not (an opted-out image is)
                name = object_key(dataset.info.identifier(key), dataset.encoding)
                stored.append(name)
                if verdict(ending, dataset.fmt.skip_opted_out)[0] == SUCCESS:
                    image = dataset.images.read(name)
            rows.append(ShardRow(row, ending, image))
        dataset.destination.write(
            shard, rows, dataset.layout, dataset.fmt, state.staging_dir,
            start_time=self._sent_at.get(shard, time.time()), end_time=time.time(),
        )  # fmt: skip
        state.forget(shard)
        dataset.images.delete(stored)
