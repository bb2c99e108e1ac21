"""Feeding ``inbound_images`` from a file: ``image-crawler produce``.

Reading is pure: ``read_rows`` turns JSON Lines, CSV or TSV into ``GoodRow`` (an
``InboundImage`` that the contract's own decoder accepts) or ``BadRow`` (a line number and
a reason), one at a time, so a file of any size streams. Sending is ``send_images``: one
producer, acks=all, batches of sends whose acknowledgements are awaited before the next.
The command sends the good rows of a file with bad ones all the same, reports each bad row
by line number on stderr, and ends with the counts.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import dataclasses
import itertools
import json
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Final, Literal, TextIO
from urllib.parse import urlsplit

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from crawlctl.connections import kafka_option, kafka_settings
from crawlctl.console import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    Subcommands,
    UsageError,
    error,
    out,
)
from image_crawler.config import KafkaSettings
from image_crawler.contract import (
    INBOUND_TOPIC,
    MAX_SOURCE_NAME_LENGTH,
    InboundImage,
    MalformedMessage,
    is_valid_source_name,
)

Format = Literal["jsonl", "csv", "tsv"]
FORMATS: Final[tuple[Format, ...]] = ("jsonl", "csv", "tsv")
_EXTENSIONS: Final[dict[str, Format]] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
}
FIELDS: Final = ("url", "uuid", "source")
SOURCE_NAME_RULE: Final = (
    f"at most {MAX_SOURCE_NAME_LENGTH} of the letters a-z, A-Z, digits, '.', '_' and '-'"
)


class FeedError(ValueError):
    """The file as a whole cannot be read (unknown format, bad header, no rows)."""


@dataclasses.dataclass(frozen=True, slots=True)
class GoodRow:
    line: int
    image: InboundImage
    # True when the uuid was generated here (the file had none for this row).
    generated_uuid: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class BadRow:
    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


Row = GoodRow | BadRow


def format_of(path: Path, explicit: str | None = None) -> Format:
    """The format named by ``explicit``, else by the file's extension; ``FeedError`` if none."""
    if explicit is not None:
        if explicit not in FORMATS:
            raise FeedError(f"unknown format {explicit!r}; expected one of {', '.join(FORMATS)}")
        return explicit
    found = _EXTENSIONS.get(path.suffix.lower())
    if found is None:
        known = ", ".join(sorted(_EXTENSIONS))
        raise FeedError(
            f"cannot tell the format of {path.name!r} from its extension (known: {known}); "
            "use --format jsonl|csv|tsv"
        )
    return found


def validate(
    fields: dict[str, Any],
    line: int,
    *,
    default_source: str | None,
    new_uuid: Callable[[], str],
) -> Row:
    """One record's fields -> a row the crawler accepts, or the reason it would not."""
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        return BadRow(line, f"unknown field(s) {', '.join(map(repr, unknown))}")
    url = fields.get("url")
    if url is None or (isinstance(url, str) and not url.strip()):
        return BadRow(line, "missing url")
    if not isinstance(url, str):
        return BadRow(line, f"url is not a string: {url!r}")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return BadRow(line, f"url is not an http(s) URL: {url.strip()!r}")
    raw_uuid = fields.get("uuid")
    generated = raw_uuid is None or (isinstance(raw_uuid, str) and not raw_uuid.strip())
    if generated:
        raw_uuid = new_uuid()
    elif not isinstance(raw_uuid, str):
        return BadRow(line, f"uuid is not a string: {raw_uuid!r}")
    source = fields.get("source")
    if source is None or (isinstance(source, str) and not source.strip()):
        if default_source is None:
            return BadRow(line, "missing source (give the field, or --source)")
        source = default_source
    if not isinstance(source, str):
        return BadRow(line, f"source is not a string: {source!r}")
    if not is_valid_source_name(source.strip()):
        return BadRow(line, f"invalid source name {source.strip()!r} ({SOURCE_NAME_RULE})")
    candidate = {"url": url, "uuid": raw_uuid, "source": source}
    # The contract's decoder is the judge: what passes here is what the splitter accepts.
    try:
        image = InboundImage.from_json(json.dumps(candidate))
    except MalformedMessage as e:
        return BadRow(line, str(e))
    return GoodRow(line, image, generated_uuid=generated)


def read_rows(
    text: TextIO,
    fmt: Format,
    *,
    default_source: str | None = None,
    new_uuid: Callable[[], str] = lambda: str(uuid.uuid4()),
) -> Iterator[Row]:
    """Every record of ``text`` as a ``GoodRow`` or a ``BadRow``, in file order.

    Blank lines are skipped. CSV and TSV need a header row naming columns among ``url``,
    ``uuid`` and ``source`` (``url`` required; ``source`` unless ``default_source``); a
    header that does not raises ``FeedError``, as does a file with no record at all.
    """
    if fmt == "jsonl":
        rows = _jsonl_rows(text, default_source, new_uuid)
    else:
        rows = _delimited_rows(text, "," if fmt == "csv" else "\t", default_source, new_uuid)
    empty = True
    for row in rows:
        empty = False
        yield row
    if empty:
        raise FeedError("empty: no rows to send")


def _undecodable(value: str) -> bool:
    # Files are read with errors="surrogateescape": bytes that are not UTF-8 show up as
    # lone surrogates, which no URL or name may contain.
    return any("\udc80" <= ch <= "\udcff" for ch in value)


def _jsonl_rows(
    text: TextIO, default_source: str | None, new_uuid: Callable[[], str]
) -> Iterator[Row]:
    for line_number, line in enumerate(text, start=1):
        if not line.strip():
            continue
        if _undecodable(line):
            yield BadRow(line_number, "not valid UTF-8")
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            yield BadRow(line_number, f"not JSON: {e.msg} (column {e.colno})")
            continue
        if not isinstance(value, dict):
            yield BadRow(line_number, f"not a JSON object but {type(value).__name__}")
            continue
        yield validate(value, line_number, default_source=default_source, new_uuid=new_uuid)


def _delimited_rows(
    text: TextIO, delimiter: str, default_source: str | None, new_uuid: Callable[[], str]
) -> Iterator[Row]:
    reader = csv.reader(text, delimiter=delimiter)
    header: list[str] | None = None
    header_line = 0
    last_line = 0
    for record in reader:
        first_line, last_line = last_line + 1, reader.line_num
        if not record or all(not cell.strip() for cell in record):
            continue
        if header is None:
            header, header_line = [cell.strip().lower() for cell in record], first_line
            _check_header(header, header_line, default_source)
            continue
        if any(_undecodable(cell) for cell in record):
            yield BadRow(first_line, "not valid UTF-8")
            continue
        if len(record) != len(header):
            yield BadRow(
                first_line,
                f"{len(record)} fields, but the header (line {header_line}) has {len(header)}",
            )
            continue
        fields = {name: cell for name, cell in zip(header, record, strict=True) if cell.strip()}
        yield validate(fields, first_line, default_source=default_source, new_uuid=new_uuid)


def _check_header(header: list[str], line: int, default_source: str | None) -> None:
    unknown = [name for name in header if name not in FIELDS]
    if unknown:
        raise FeedError(
            f"line {line}: unknown column(s) {', '.join(map(repr, unknown))} in the header; "
            f"the columns are {', '.join(FIELDS)}"
        )
    duplicated = sorted({name for name in header if header.count(name) > 1})
    if duplicated:
        raise FeedError(f"line {line}: column(s) {', '.join(duplicated)} given twice")
    if "url" not in header:
        raise FeedError(f"line {line}: the header has no url column")
    if "source" not in header and default_source is None:
        raise FeedError(f"line {line}: the header has no source column; give --source")


def count_lines(path: Path) -> int:
    """Lines in ``path`` (for a progress bar's total); a last line without newline counts."""
    count = 0
    last = b"\n"
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")


@dataclasses.dataclass(frozen=True, slots=True)
class SendSettings:
    """How ``send_images`` talks to Kafka. Sizes in messages, times in seconds."""

    kafka: KafkaSettings
    batch_size: int = 500
    request_timeout_s: float = 30.0


async def send_images(
    settings: SendSettings,
    images: Iterable[InboundImage],
    on_acked: Callable[[int], None] = lambda n: None,
) -> int:
    """Produce every image to ``inbound_images`` (key: its uuid) and wait for every ack.

    Sends go out ``batch_size`` at a time; the acknowledgements of one batch are awaited
    before the next, so memory stays bounded and a failure stops the feed early.
    ``on_acked(n)`` is called with each batch's size once acknowledged. Returns the count
    sent; raises aiokafka's ``KafkaError`` when Kafka is away or refuses.
    """
    producer = AIOKafkaProducer(
        **settings.kafka.client_options(),
        acks="all",
        linger_ms=20,
        request_timeout_ms=int(settings.request_timeout_s * 1000),
    )
    await producer.start()
    sent = 0
    try:
        batch: list[asyncio.Future[Any]] = []
        for image in images:
            batch.append(
                await producer.send(INBOUND_TOPIC, image.to_json(), key=image.uuid.encode())
            )
            if len(batch) >= settings.batch_size:
                await asyncio.gather(*batch)
                sent += len(batch)
                on_acked(len(batch))
                batch = []
        if batch:
            await asyncio.gather(*batch)
            sent += len(batch)
            on_acked(len(batch))
    finally:
        await producer.stop()
    return sent


# --- the command --------------------------------------------------------------------------


def register(subcommands: Subcommands) -> None:
    produce = subcommands.add_parser(
        "produce",
        parents=[kafka_option()],
        help="feed inbound_images from a JSON Lines, CSV or TSV file",
        description=(
            "Send one inbound_images message per row of FILE: JSON Lines (objects), or CSV "
            "or TSV with a header row; the fields are url, uuid and source. A missing uuid "
            "gets a new uuid4; --source fills a missing source. Bad rows are reported by "
            "line number on stderr and not sent; the good ones are sent all the same "
            "(acks=all, every acknowledgement awaited), then the exit status is 1."
        ),
    )
    produce.add_argument("file", metavar="FILE")
    produce.add_argument("--source", metavar="S", help="the source of rows that name none")
    produce.add_argument(
        "--format", choices=FORMATS, help="the file's format (default: by its extension)"
    )
    produce.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise UsageError(f"no such file: {args.file}")
    try:
        fmt = format_of(path, args.format)
    except FeedError as e:
        raise UsageError(str(e)) from None
    if args.source is not None and not is_valid_source_name(args.source):
        raise UsageError(f"--source is not a valid source name: {args.source!r}")
    return asyncio.run(_produce(path, fmt, args.source, kafka_settings(args)))


async def _produce(
    path: Path, fmt: Format, default_source: str | None, kafka: KafkaSettings
) -> int:
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    progress = Progress(
        TextColumn(f"{INBOUND_TOPIC}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=not err.is_terminal,
    )
    with path.open(encoding="utf-8-sig", errors="surrogateescape", newline="") as text:
        rows = read_rows(text, fmt, default_source=default_source)
        try:
            first = next(rows)  # the header and an empty file are judged before connecting
        except FeedError as e:
            error(f"{path}: {e}")
            out("sent 0, bad 0")
            return EXIT_FAILED
        with progress:
            feed = _Feed(progress, progress.add_task("sending", total=count_lines(path)))
            images = feed.images(itertools.chain([first], rows))
            try:
                await send_images(SendSettings(kafka), images, on_acked=feed.acked)
            except KafkaError as e:
                acknowledged = f"(after {feed.sent} acknowledged)"
                error(f"Kafka at {kafka.bootstrap_servers}: {e!r} {acknowledged}")
                out(f"sent {feed.sent}, bad {feed.bad}")
                return EXIT_UNAVAILABLE
    out(feed.summary())
    return EXIT_FAILED if feed.bad else EXIT_OK


class _Feed:
    """The counts of one file being sent, shown as it goes: each bad row on stderr, and a
    progress bar of the lines done (a bad row at once, a good one once acknowledged)."""

    def __init__(self, progress: Progress, task: TaskID) -> None:
        self._progress = progress
        self._task = task
        self.sent = 0
        self.bad = 0
        self.generated = 0

    def images(self, rows: Iterable[Row]) -> Iterator[InboundImage]:
        """The images of the good rows; the bad ones are counted and reported."""
        for row in rows:
            if isinstance(row, BadRow):
                self.bad += 1
                self._progress.console.print(f"line {row.line}: {row.reason}", markup=False)
                self._progress.advance(self._task)
                continue
            self.generated += row.generated_uuid
            yield row.image

    def acked(self, n: int) -> None:
        self.sent += n
        self._progress.advance(self._task, n)

    def summary(self) -> str:
        summary = f"sent {self.sent}, bad {self.bad}"
        if self.generated:
            summary += f" ({self.generated} without uuid got a new uuid4)"
        return summary
