"""``image-crawler demo``: a crawl of bundled sample images, from a local origin, end to end.

The plan is pure: ``plan_demo`` spreads the samples (``image_crawler/samples``) over three
sources whose image counts give them rates of about 2, 10 and 50 requests/s (the inverse
of the monitor's ``compute_crawl_rate``), and adds one URL that answers 404. ``DemoOrigin``
serves them from an aiohttp server on loopback, in-process. ``Outcomes`` follows each uuid
to its end in ``image_metadata_updates``, ``link_rot`` or ``crawl_errors``, read without a
consumer group (every partition assigned), so tansu's slow group protocol is not involved.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Final

from aiohttp import web
from aiokafka import AIOKafkaConsumer
from rich.table import Table

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

# (source, target rate in requests/s). Each source serves every sample under its own path,
# so the progress bars show the rates apart; the fast source also gets the broken file and
# a missing URL, so failures show up without slowing the demo down.
DEMO_SOURCES: Final = (
    ("demo-small", 2.0),
    ("demo-medium", 10.0),
    ("demo-large", 50.0),
)
BROKEN_SAMPLE: Final = "broken.jpg"
MISSING_NAME: Final = "missing.jpg"
_CONTENT_TYPES: Final = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png"}
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


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    name: str
    body: bytes
    content_type: str


def load_samples() -> list[Sample]:
    """The bundled sample files (images and the one broken file), by name."""
    folder = resources.files("crawlctl") / "samples"
    samples = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        suffix = Path(entry.name).suffix.lower()
        if entry.is_file() and suffix in _CONTENT_TYPES:
            samples.append(Sample(entry.name, entry.read_bytes(), _CONTENT_TYPES[suffix]))
    return samples


@dataclasses.dataclass(frozen=True, slots=True)
class DemoItem:
    """One URL of the demo: what the origin serves at ``path`` (None: 404) for ``source``."""

    uuid: str
    source: str
    path: str
    sample: Sample | None

    @property
    def expected_ok(self) -> bool:
        return self.sample is not None and self.sample.name != BROKEN_SAMPLE


@dataclasses.dataclass(frozen=True, slots=True)
class DemoPlan:
    items: tuple[DemoItem, ...]
    # Source -> (image count for the sources file, the rate it gives).
    sources: Mapping[str, tuple[int, float]]

    def sources_file(self) -> list[dict[str, Any]]:
        """The ``SOURCES_FILE`` content that gives each source its rate."""
        return [{"source_name": s, "image_count": n} for s, (n, _) in self.sources.items()]

    def by_source(self) -> dict[str, list[DemoItem]]:
        grouped: dict[str, list[DemoItem]] = {s: [] for s in self.sources}
        for item in self.items:
            grouped[item.source].append(item)
        return grouped


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


class DemoOrigin:
    """The demo's web server on 127.0.0.1 (a free port), on the caller's event loop.

    Serves each planned item at its path (404 for the missing one and anything else) and
    remembers when each source was asked, to measure the rate it was crawled at.
    """

    def __init__(self, plan: DemoPlan, host: str = "127.0.0.1") -> None:
        self._routes = {item.path: item.sample for item in plan.items if item.sample is not None}
        self._host = host
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.requests: dict[str, list[float]] = defaultdict(list)

    def url(self, path: str) -> str:
        return f"http://{self._host}:{self.port}{path}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._serve)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _serve(self, request: web.Request) -> web.Response:
        source = request.path.split("/")[1] if request.path.count("/") >= 2 else ""
        self.requests[source].append(time.monotonic())
        sample = self._routes.get(request.path)
        if sample is None:
            return web.Response(status=404, text="not found\n")
        return web.Response(body=sample.body, content_type=sample.content_type)

    def observed_rate(self, source: str) -> float | None:
        """Requests/s the source was crawled at, over at least one second.

        Buckets are refilled once a second, so a source with fewer URLs than its rate is
        crawled in one burst: its figure is then its URL count, not its rate.
        """
        times = self.requests.get(source, [])
        if not times:
            return None
        return len(times) / max(1.0, times[-1] - times[0])


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    """How one uuid ended: ``"ok"``, or a failure status (``"404"``, ``"500"``...)."""

    status: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Outcomes:
    """The end of each planned uuid, from the three outcome topics' messages."""

    def __init__(self, plan: DemoPlan) -> None:
        self._source_of = {item.uuid: item.source for item in plan.items}
        self.ended: dict[str, Outcome] = {}
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
            outcome = Outcome("ok")
        elif topic == LINK_ROT_TOPIC:
            outcome = Outcome(Status.NOT_FOUND)
        else:
            outcome = Outcome(str(message.get("status", "error")))
        previous = self.ended.get(identifier)
        if previous is not None and (previous.ok or not outcome.ok):
            return None  # already ended (at-least-once delivery: duplicates happen)
        self.ended[identifier] = outcome
        return self._source_of[identifier] if previous is None else None

    @property
    def pending(self) -> set[str]:
        return set(self._source_of) - set(self.ended)

    def counts(self, source: str) -> tuple[int, int]:
        """(crawled, failed) uuids of ``source``."""
        ok = failed = 0
        for identifier, outcome in self.ended.items():
            if self._source_of[identifier] == source:
                ok += outcome.ok
                failed += not outcome.ok
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


def summary_table(
    plan: DemoPlan, outcomes: Outcomes, origin: DemoOrigin, elapsed_s: float
) -> Table:
    """Per source: URLs, done, crawled, failed, its configured and observed rate."""
    table = Table(title=f"image-crawler demo: summary after {elapsed_s:.1f} s")
    for column in ("source", "urls", "done", "crawled", "failed"):
        table.add_column(column, justify="left" if column == "source" else "right")
    table.add_column("rate/s (set)", justify="right")
    table.add_column("rate/s (seen)", justify="right")
    totals = [0, 0, 0, 0]
    for source, items in plan.by_source().items():
        ok, failed = outcomes.counts(source)
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
