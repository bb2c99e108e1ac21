"""``image-crawler demo``: a crawl of bundled sample images, from a local origin, end to end.

The plan is pure: ``plan_demo`` spreads the samples (``crawlctl/samples``) over three
sources whose image counts give them rates of about 2, 10 and 50 requests/s (the inverse
of the monitor's ``compute_crawl_rate``), and adds one URL that answers 404; the samples
and the plan's types are in ``demo_plan.py``. A ``DemoOrigin`` (``demo_origin.py``)
serves them on loopback, in-process, and ``up``'s local stack crawls them. ``DemoTally``
follows each uuid to its end in ``image_metadata_updates``, ``link_rot`` or
``crawl_errors``, read without a consumer group (every partition assigned), so tansu's
slow group protocol is not involved.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from crawlctl.commands.demo_plan import BROKEN_SAMPLE, DemoItem, DemoPlan, Sample, load_samples
from crawlctl.commands.produce import SendSettings, send_images
from crawlctl.commands.up import describe, stack_options, stack_settings, with_stack
from crawlctl.console import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    Subcommands,
    error,
    out,
)
from crawlctl.localstack.stack import LocalStack
from crawlctl.signals import loop_signals
from image_crawler.config import KafkaSettings
from image_crawler.contract import (
    CRAWL_ERRORS_TOPIC,
    LINK_ROT_TOPIC,
    MAX_IMAGES,
    MAX_RATE_RPS,
    METADATA_TOPIC,
    MIN_IMAGES,
    MIN_RATE_RPS,
    InboundImage,
    Status,
)

if TYPE_CHECKING:
    from crawlctl.commands.demo_origin import DemoOrigin

# (source, target rate in requests/s). Each source serves every sample under its own path,
# so the progress bars show the rates apart; the fast source also gets the broken file and
# a missing URL, so failures show up without slowing the demo down.
DEMO_SOURCES: Final = (
    ("demo-small", 2.0),
    ("demo-medium", 10.0),
    ("demo-large", 50.0),
)
MISSING_NAME: Final = "missing.jpg"
OUTCOME_TOPICS: Final = (METADATA_TOPIC, LINK_ROT_TOPIC, CRAWL_ERRORS_TOPIC)


def image_count_for_rate(rate_rps: float) -> int:
    """The smallest image count whose computed rate is at least ``rate_rps``.

    The inverse of ``compute_crawl_rate`` (linear between its two anchors); ``rate_rps``
    must lie between them.
    """
    if not MIN_RATE_RPS <= rate_rps <= MAX_RATE_RPS:
        raise ValueError(f"a computed rate lies in [{MIN_RATE_RPS}, {MAX_RATE_RPS}]")
    share = (rate_rps - MIN_RATE_RPS) / (MAX_RATE_RPS - MIN_RATE_RPS)
    return math.ceil(MIN_IMAGES + share * (MAX_IMAGES - MIN_IMAGES))


def plan_demo(
    samples: Sequence[Sample],
    sources: Iterable[tuple[str, float]] = DEMO_SOURCES,
    *,
    new_uuid: Callable[[], str] = lambda: str(uuid.uuid4()),
) -> DemoPlan:
    """Every good sample for each of ``sources``; the last source also gets the broken
    file and a URL that answers 404."""
    sources = list(sources)
    good: list[Sample | None] = [s for s in samples if s.name != BROKEN_SAMPLE]
    broken: list[Sample | None] = [s for s in samples if s.name == BROKEN_SAMPLE]
    items = []
    for index, (name, _) in enumerate(sources):
        entries = good + ([*broken, None] if index == len(sources) - 1 else [])
        for sample in entries:
            path = f"/{name}/{sample.name if sample is not None else MISSING_NAME}"
            items.append(DemoItem(new_uuid(), name, path, sample))
    counts = {name: (image_count_for_rate(rate), rate) for name, rate in sources}
    return DemoPlan(tuple(items), counts)


@dataclasses.dataclass(frozen=True, slots=True)
class ItemEnd:
    """How one planned uuid ended: ``"ok"``, or a failure status (``"404"``, ``"500"``...)."""

    status: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class DemoTally:
    """The end of each planned uuid, from the three outcome topics' messages."""

    def __init__(self, plan: DemoPlan) -> None:
        self._source_of = {item.uuid: item.source for item in plan.items}
        self.ended: dict[str, ItemEnd] = {}
        # The metadata messages of planned uuids, as consumed (resolution and EXIF).
        self.metadata: list[dict[str, Any]] = []

    def add(self, topic: str, value: bytes | None) -> str | None:
        """Record one message; returns the source of a uuid that has just ended."""
        try:
            message = json.loads(value or b"")
        except ValueError:
            return None
        if not isinstance(message, dict):
            return None
        identifier = message.get("identifier")
        if identifier not in self._source_of:
            return None  # not ours, or an unparseable-message record
        if topic == METADATA_TOPIC:
            self.metadata.append(message)
            if "exif" in message:
                return None
            end = ItemEnd("ok")
        elif topic == LINK_ROT_TOPIC:
            end = ItemEnd(Status.NOT_FOUND)
        else:
            end = ItemEnd(str(message.get("status", "error")))
        previous = self.ended.get(identifier)
        if previous is not None and (previous.ok or not end.ok):
            return None  # already ended (at-least-once delivery: duplicates happen)
        self.ended[identifier] = end
        return self._source_of[identifier] if previous is None else None

    @property
    def pending(self) -> set[str]:
        return set(self._source_of) - set(self.ended)

    def counts(self, source: str) -> tuple[int, int]:
        """(crawled, failed) uuids of ``source``."""
        ok = failed = 0
        for identifier, end in self.ended.items():
            if self._source_of[identifier] == source:
                ok += end.ok
                failed += not end.ok
        return ok, failed


def outcome_consumer(bootstrap: str) -> AIOKafkaConsumer:
    """A consumer of the outcome topics from their start, with no group and no commits."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        # Outcome topics appear when a worker first writes to them: notice them quickly.
        metadata_max_age_ms=1000,
    )
    # Without a group, subscribing assigns every partition of each topic, also of topics
    # created later.
    consumer.subscribe(list(OUTCOME_TOPICS))
    return consumer


def inbound_messages(plan: DemoPlan, origin: DemoOrigin) -> list[InboundImage]:
    return [
        InboundImage(url=origin.url(item.path), uuid=item.uuid, source=item.source)
        for item in plan.items
    ]


def summary_table(plan: DemoPlan, tally: DemoTally, origin: DemoOrigin, elapsed_s: float) -> Table:
    """Per source: URLs, done, crawled, failed, its configured and observed rate."""
    table = Table(title=f"image-crawler demo: summary after {elapsed_s:.1f} s")
    for column in ("source", "urls", "done", "crawled", "failed"):
        table.add_column(column, justify="left" if column == "source" else "right")
    table.add_column("rate/s (set)", justify="right")
    table.add_column("rate/s (seen)", justify="right")
    totals = [0, 0, 0, 0]
    for source, items in plan.by_source().items():
        ok, failed = tally.counts(source)
        seen = origin.observed_rate(source)
        table.add_row(
            source,
            str(len(items)),
            str(ok + failed),
            str(ok),
            str(failed),
            f"{plan.sources[source][1]:g}",
            "-" if seen is None else f"{seen:.1f}",
        )
        for i, n in enumerate((len(items), ok + failed, ok, failed)):
            totals[i] += n
    table.add_row("total", *map(str, totals), "", "", style="bold")
    return table


def write_jsonl(path: Path, messages: Iterable[Mapping[str, Any]]) -> int:
    """Write one JSON object per line (atomically: temp file, then rename); returns the count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp")
    count = 0
    with temp.open("w", encoding="utf-8") as f:
        for message in messages:
            f.write(json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n")
            count += 1
    temp.replace(path)
    return count


# --- the command --------------------------------------------------------------------------


def register(subcommands: Subcommands) -> None:
    demo = subcommands.add_parser(
        "demo",
        parents=[stack_options()],
        help="crawl bundled sample images from a local origin, end to end",
        description=(
            "Like `up`, plus an HTTP origin on 127.0.0.1 serving bundled sample images as "
            "three sources crawled at about 2, 10 and 50 requests/s (with one broken file "
            "and one missing URL). Shows progress until every URL is done, prints a summary "
            "per source, writes the metadata messages to a JSON Lines file, and stops. Exit "
            "status 0 when every URL was done in time, 1 otherwise."
        ),
    )
    demo.add_argument(
        "--out",
        default="metadata.jsonl",
        metavar="FILE",
        help="where the image_metadata_updates messages go (default: metadata.jsonl)",
    )
    demo.add_argument(
        "--timeout",
        type=float,
        default=240.0,
        metavar="S",
        help="give up when not every URL is done after this many seconds (default: 240)",
    )
    demo.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    plan = plan_demo(load_samples())
    data_dir = Path(args.data_dir).expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    sources_path = data_dir / "demo-sources.json"
    sources_path.write_text(json.dumps(plan.sources_file(), indent=2) + "\n")
    # A demo starts afresh: an earlier demo's queue or breaker state would only get in its way.
    settings = dataclasses.replace(stack_settings(args, sources_path), persistent=False)
    out_path = Path(args.out).expanduser().resolve()

    def body(stack: LocalStack) -> int:
        describe(stack)
        return asyncio.run(_demo(stack, plan, out_path, args.timeout))

    return with_stack(settings, body, interrupted=EXIT_INTERRUPTED)


async def _demo(stack: LocalStack, plan: DemoPlan, out_path: Path, timeout_s: float) -> int:
    # Imported here: aiohttp's server loads only when a demo runs, not for every command.
    from crawlctl.commands.demo_origin import DemoOrigin

    demo = _DemoRun(stack, plan, DemoOrigin(plan), timeout_s)
    with loop_signals(demo.stop):
        await demo.origin.start()
        try:
            code = await demo.crawl()
        finally:
            await demo.origin.stop()
            written = write_jsonl(out_path, demo.tally.metadata)
    return demo.report(out_path, written, code)


class _DemoRun:
    """One demo on a running stack: send every URL, follow each to its end, report."""

    def __init__(
        self, stack: LocalStack, plan: DemoPlan, origin: DemoOrigin, timeout_s: float
    ) -> None:
        self.stack = stack
        self.plan = plan
        self.origin = origin
        self.tally = DemoTally(plan)
        # Set by Ctrl-C or SIGTERM: the demo stops following and reports what it saw.
        self.stop = asyncio.Event()
        self.console = Console()
        self.began = time.monotonic()
        self.deadline = self.began + timeout_s

    async def crawl(self) -> int:
        """Send the plan's URLs, then read outcomes until every URL is done (or time is up)."""
        bootstrap = self.stack.broker.bootstrap
        consumer = outcome_consumer(bootstrap)
        code = EXIT_OK
        try:
            await consumer.start()
            messages = inbound_messages(self.plan, self.origin)
            await send_images(SendSettings(KafkaSettings(bootstrap)), messages)
            out(
                f"demo: sent {len(messages)} URLs of {len(self.plan.sources)} sources, "
                f"served from {self.origin.url('/')}"
            )
            code = await self._follow(consumer)
            if not self.tally.pending:
                await _drain(consumer, self.tally)
        except KafkaError as e:
            error(f"Kafka at {bootstrap}: {e!r}")
            code = EXIT_UNAVAILABLE
        finally:
            await consumer.stop()
        return code

    async def _follow(self, consumer: AIOKafkaConsumer) -> int:
        """Read outcomes with a progress bar per source until every URL is done."""
        columns = (
            TextColumn("{task.description:<12}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=self.console) as progress:
            tasks = {
                source: progress.add_task(f"{source}", total=len(items))
                for source, items in self.plan.by_source().items()
            }
            while (
                self.tally.pending and not self.stop.is_set() and time.monotonic() < self.deadline
            ):
                exited = self.stack.exited()
                if exited:
                    names = ", ".join(f"{c.name} (status {c.returncode})" for c in exited)
                    error(f"{names} exited unexpectedly; see {self.stack.settings.log_dir}")
                    return EXIT_FAILED
                batch = await consumer.getmany(timeout_ms=200)
                for partition, records in batch.items():
                    for record in records:
                        source = self.tally.add(partition.topic, record.value)
                        if source is not None:
                            progress.advance(tasks[source])
        return EXIT_OK

    def report(self, out_path: Path, written: int, code: int) -> int:
        """Print the summary and where everything went; returns the exit status, which is
        a failure when a URL was not done although nothing else went wrong."""
        elapsed_s = time.monotonic() - self.began
        self.console.print(summary_table(self.plan, self.tally, self.origin, elapsed_s))
        settings = self.stack.settings
        thumbnails = sum(
            (settings.thumbnails_dir / f"{item.uuid}.jpg").is_file() for item in self.plan.items
        )
        out(f"metadata    {written} messages written to {out_path}")
        out(f"thumbnails  {thumbnails} written to {settings.thumbnails_dir}")
        out(f"logs        {settings.log_dir}")
        pending = self.tally.pending
        if pending and code == EXIT_OK:
            urls = sorted(item.path for item in self.plan.items if item.uuid in pending)
            shown = ", ".join(urls[:5]) + (" ..." if len(urls) > 5 else "")
            error(f"{len(pending)} URL(s) not done after {elapsed_s:.0f} s: {shown}")
            code = EXIT_INTERRUPTED if self.stop.is_set() else EXIT_FAILED
        return code


async def _drain(consumer: AIOKafkaConsumer, tally: DemoTally, timeout_s: float = 5.0) -> None:
    """Read on until a fetch comes back empty: an EXIF message may trail its resolution.

    (Not up to the end offsets: tansu's in-memory storage does not report them right.)
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = await consumer.getmany(timeout_ms=500)
        if not batch:
            return
        for partition, records in batch.items():
            for record in records:
                tally.add(partition.topic, record.value)
