"""Feeding ``inbound_images`` from a file: ``image-crawler produce``.

Reading is pure: ``read_rows`` turns JSON Lines, CSV or TSV, and ``read_parquet`` a
Parquet file, into ``GoodRow`` (an ``InboundImage`` that the contract's own decoder
accepts), ``BadRow`` (where and why) and, once per column or field the crawler does not
use, ``Ignored``; one at a time, so a file of any size streams. The columns are ``url``,
``uuid`` (or ``identifier``, the original crawler's TSV and the catalog's name) and
``source``; any other is ignored, as a catalog dump has many. A URL without a scheme gets
``http://``, as the original's producer added it. Sending is ``send_images``: one
producer, acks=all, batches of sends whose acknowledgements are awaited before the next.
The command sends the good rows of a file with bad ones all the same, reports each bad
row by line (or Parquet row) number on stderr, and ends with the counts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import dataclasses
import itertools
import json
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TextIO
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

if TYPE_CHECKING:
    import pyarrow as pa

Format = Literal["jsonl", "csv", "tsv", "parquet"]
FORMATS: Final[tuple[Format, ...]] = ("jsonl", "csv", "tsv", "parquet")
_EXTENSIONS: Final[dict[str, Format]] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
FIELDS: Final = ("url", "uuid", "source")
# Other names of a field: the original crawler's TSV and the catalog call the uuid
# ``identifier``. The field's own name wins where a file has both.
ALIASES: Final = {"identifier": "uuid"}
USED: Final = "url, uuid (or identifier), source"
SOURCE_NAME_RULE: Final = (
    f"at most {MAX_SOURCE_NAME_LENGTH} of the letters a-z, A-Z, digits, '.', '_' and '-'"
)
# The scheme the original's producer gave a URL that had none.
DEFAULT_SCHEME: Final = "http://"
# PostgreSQL's COPY writes NULL as \N in its text format, which catalog dumps use.
TSV_NULL: Final = "\\N"
PARQUET_BATCH_ROWS: Final = 10_000
PARQUET_EXTRA: Final = "pip install 'image-crawler[parquet]'"


class FeedError(ValueError):
    """The file as a whole cannot be read (unknown format, bad header, no rows)."""


@dataclasses.dataclass(frozen=True, slots=True)
class GoodRow:
    line: int
    image: InboundImage
    # True when the uuid was generated here (the file had none for this row).
    generated_uuid: bool = False
    # True when the file's URL had no scheme and got DEFAULT_SCHEME.
    added_scheme: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class BadRow:
    line: int
    reason: str
    # What ``line`` counts: lines of a text file, or rows of a Parquet file.
    unit: str = "line"
    # Rows it stands for: more than one for a Parquet row group that cannot be read.
    count: int = 1

    def __str__(self) -> str:
        return f"{self.unit} {self.line}: {self.reason}"


@dataclasses.dataclass(frozen=True, slots=True)
class Ignored:
    """Columns (or, in JSON Lines, fields) the crawler does not use, each named once:
    where the header is, or the first line that has it (None: a Parquet schema)."""

    line: int | None
    names: tuple[str, ...]
    kind: str = "column"

    def __str__(self) -> str:
        names = ", ".join(map(repr, self.names))
        where = "" if self.line is None else f"line {self.line}: "
        return f"{where}ignored {self.kind}(s) {names} (used: {USED})"


Row = GoodRow | BadRow
Item = GoodRow | BadRow | Ignored


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
            f"use --format {'|'.join(FORMATS)}"
        )
    return found


# A scheme is letters, digits, '+', '-', '.' after a letter, then ':' (RFC 3986); after
# "host:" comes a port's digit, never "//".
_HOST_PORT = re.compile(r"^[A-Za-z0-9.-]+:[0-9]")


def add_scheme(url: str) -> str:
    """``url`` with ``http://`` in front when it has no scheme, as the original's producer
    did (``example.com/a.jpg``, ``example.com:8080/a.jpg``, ``//example.com/a.jpg``);
    any other URL as it is."""
    if url.startswith("//"):
        return f"http:{url}"
    if not urlsplit(url).scheme or _HOST_PORT.match(url):
        return f"{DEFAULT_SCHEME}{url}"
    return url


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def validate(
    fields: Mapping[str, Any],
    line: int,
    *,
    default_source: str | None,
    new_uuid: Callable[[], str],
    unit: str = "line",
) -> Row:
    """One record's ``url``, ``uuid`` and ``source`` -> a row the crawler accepts, or the
    reason it would not. A None or blank value is a missing one."""
    url = fields.get("url")
    if _blank(url):
        return BadRow(line, "missing url", unit)
    if not isinstance(url, str):
        return BadRow(line, f"url is not a string: {url!r}", unit)
    full_url = add_scheme(url.strip())
    parts = urlsplit(full_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return BadRow(line, f"url is not an http(s) URL: {url.strip()!r}", unit)
    raw_uuid = fields.get("uuid")
    generated = _blank(raw_uuid)
    if generated:
        raw_uuid = new_uuid()
    elif not isinstance(raw_uuid, str):
        return BadRow(line, f"uuid is not a string: {raw_uuid!r}", unit)
    source = fields.get("source")
    if _blank(source):
        if default_source is None:
            return BadRow(line, "missing source (give the field, or --source)", unit)
        source = default_source
    if not isinstance(source, str):
        return BadRow(line, f"source is not a string: {source!r}", unit)
    if not is_valid_source_name(source.strip()):
        return BadRow(line, f"invalid source name {source.strip()!r} ({SOURCE_NAME_RULE})", unit)
    candidate = {"url": full_url, "uuid": raw_uuid, "source": source}
    # The contract's decoder is the judge: what passes here is what the splitter accepts.
    try:
        image = InboundImage.from_json(json.dumps(candidate))
    except MalformedMessage as e:
        return BadRow(line, str(e), unit)
    return GoodRow(line, image, generated_uuid=generated, added_scheme=full_url != url.strip())


@dataclasses.dataclass(frozen=True, slots=True)
class Columns:
    """Which of a file's columns (by position) feed which field, and which are ignored."""

    used: Mapping[str, int]  # field -> column index
    ignored: tuple[str, ...]


def pick_columns(names: Sequence[str], default_source: str | None) -> Columns:
    """The columns ``url``, ``uuid`` (else ``identifier``) and ``source`` among ``names``
    (compared without case and surrounding blanks); ``FeedError`` when ``url`` is missing,
    ``source`` is missing without ``default_source``, or a used column is there twice."""
    cleaned = [name.strip().lower() for name in names]
    used: dict[str, int] = {}
    for field in FIELDS:
        spellings = [field, *(alias for alias, target in ALIASES.items() if target == field)]
        for spelling in spellings:
            where = [i for i, name in enumerate(cleaned) if name == spelling]
            if len(where) > 1:
                raise FeedError(f"column(s) {spelling} given twice")
            if where:
                used[field] = where[0]
                break
    taken = set(used.values())
    ignored = tuple(names[i].strip() for i in range(len(names)) if i not in taken)
    if "url" not in used:
        unknown = ", ".join(map(repr, ignored))
        raise FeedError(
            (f"unknown column(s) {unknown} and " if ignored else "")
            + f"no url column; the columns used are {USED}"
        )
    if "source" not in used and default_source is None:
        raise FeedError("no source column; give --source")
    return Columns(used, ignored)


def read_rows(
    text: TextIO,
    fmt: Format,
    *,
    default_source: str | None = None,
    new_uuid: Callable[[], str] = lambda: str(uuid.uuid4()),
) -> Iterator[Item]:
    """Every record of ``text`` as a ``GoodRow`` or a ``BadRow``, in file order, with an
    ``Ignored`` for the columns (fields) not used, before the first row that has them.

    Blank lines are skipped. CSV and TSV need a header row with a ``url`` column (and
    ``source`` unless ``default_source``); a header that has none raises ``FeedError``,
    as does a file with no record at all. TSV is read as PostgreSQL's COPY writes it: one
    line a row, no quoting, ``\\N`` for null.
    """
    if fmt == "jsonl":
        rows = _jsonl_rows(text, default_source, new_uuid)
    elif fmt in ("csv", "tsv"):
        rows = _delimited_rows(text, fmt, default_source, new_uuid)
    else:
        raise FeedError(f"{fmt} is not a text format")
    yield from _not_empty(rows)


def _not_empty(items: Iterator[Item]) -> Iterator[Item]:
    empty = True
    for item in items:
        empty = empty and isinstance(item, Ignored)
        yield item
    if empty:
        raise FeedError("empty: no rows to send")


def _undecodable(value: str) -> bool:
    # Files are read with errors="surrogateescape": bytes that are not UTF-8 show up as
    # lone surrogates, which no URL or name may contain.
    return any("\udc80" <= ch <= "\udcff" for ch in value)


def _jsonl_rows(
    text: TextIO, default_source: str | None, new_uuid: Callable[[], str]
) -> Iterator[Item]:
    reported: set[str] = set()
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
        new = tuple(name for name in _ignored_fields(value) if name not in reported)
        if new:
            reported.update(new)
            yield Ignored(line_number, new, kind="field")
        yield validate(
            _json_fields(value), line_number, default_source=default_source, new_uuid=new_uuid
        )


def _json_fields(value: Mapping[str, Any]) -> dict[str, Any]:
    fields = {name: value[name] for name in FIELDS if name in value}
    for alias, field in ALIASES.items():
        if field not in fields and alias in value:
            fields[field] = value[alias]
    return fields


def _ignored_fields(value: Mapping[str, Any]) -> list[str]:
    # An alias is used only where its field is absent.
    return [
        name
        for name in value
        if name not in FIELDS and not (name in ALIASES and ALIASES[name] not in value)
    ]


def _delimited_rows(
    text: TextIO, fmt: Format, default_source: str | None, new_uuid: Callable[[], str]
) -> Iterator[Item]:
    if fmt == "tsv":
        reader = csv.reader(text, delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(text)
    columns: Columns | None = None
    width = 0
    header_line = 0
    last_line = 0
    for record in reader:
        first_line, last_line = last_line + 1, reader.line_num
        if not record or all(not cell.strip() for cell in record):
            continue
        if columns is None:
            header_line, width = first_line, len(record)
            try:
                columns = pick_columns(record, default_source)
            except FeedError as e:
                raise FeedError(f"line {header_line}: {e}") from None
            if columns.ignored:
                yield Ignored(header_line, columns.ignored)
            continue
        if any(_undecodable(cell) for cell in record):
            yield BadRow(first_line, "not valid UTF-8")
            continue
        if len(record) != width:
            yield BadRow(
                first_line,
                f"{len(record)} fields, but the header (line {header_line}) has {width}",
            )
            continue
        fields = {
            field: None if fmt == "tsv" and record[i] == TSV_NULL else record[i]
            for field, i in columns.used.items()
        }
        yield validate(fields, first_line, default_source=default_source, new_uuid=new_uuid)


# --- Parquet ------------------------------------------------------------------------------


def _parquet() -> Any:
    """``pyarrow.parquet``, imported when a Parquet file is read: the extra is optional."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise FeedError(f"reading Parquet needs pyarrow: {PARQUET_EXTRA}") from None
    return pq


def _string_like(data_type: pa.DataType) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(data_type):
        return _string_like(data_type.value_type)
    return bool(
        pa.types.is_string(data_type)
        or pa.types.is_large_string(data_type)
        or pa.types.is_string_view(data_type)
        or pa.types.is_null(data_type)  # a column of nulls only
    )


def read_parquet(
    path: Path,
    *,
    default_source: str | None = None,
    new_uuid: Callable[[], str] = lambda: str(uuid.uuid4()),
    batch_rows: int = PARQUET_BATCH_ROWS,
) -> Iterator[Item]:
    """Every row of the Parquet file at ``path`` as a ``GoodRow`` or a ``BadRow`` (rows
    counted from 1), after an ``Ignored`` for its columns not used; only the used columns
    are read, ``batch_rows`` at a time. A row group that cannot be read is one ``BadRow``
    for all its rows, and the next is read. ``FeedError`` for no pyarrow, a file that is
    not Parquet, a missing or non-string column, or no row at all."""
    pq = _parquet()
    import pyarrow as pa

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise FeedError(f"not a Parquet file: {e}") from None
    schema = parquet.schema_arrow
    columns = pick_columns(schema.names, default_source)
    for field, index in columns.used.items():
        data_type = schema.field(index).type
        if not _string_like(data_type):
            raise FeedError(
                f"column {schema.names[index]!r} ({field}) holds {data_type}, not strings"
            )
    return _not_empty(_parquet_rows(parquet, columns, default_source, new_uuid, batch_rows))


def _parquet_rows(
    parquet: Any,
    columns: Columns,
    default_source: str | None,
    new_uuid: Callable[[], str],
    batch_rows: int,
) -> Iterator[Item]:
    import pyarrow as pa

    if columns.ignored:
        yield Ignored(None, columns.ignored)
    names = parquet.schema_arrow.names
    wanted = [names[i] for i in columns.used.values()]
    fields = list(columns.used)
    row = 0
    for group in range(parquet.metadata.num_row_groups):
        group_rows = parquet.metadata.row_group(group).num_rows
        group_end = row + group_rows
        try:
            for batch in parquet.iter_batches(
                batch_size=batch_rows, row_groups=[group], columns=wanted
            ):
                values = [batch.column(i).to_pylist() for i in range(len(fields))]
                for record in zip(*values, strict=True):
                    row += 1
                    yield validate(
                        dict(zip(fields, record, strict=True)),
                        row,
                        default_source=default_source,
                        new_uuid=new_uuid,
                        unit="row",
                    )
        except (pa.ArrowException, OSError) as e:
            yield BadRow(
                row + 1,
                f"rows {row + 1}-{group_end} (row group {group}) cannot be read: {e}",
                "row",
                count=group_end - row,
            )
        row = group_end


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
        help="feed inbound_images from a JSON Lines, CSV, TSV or Parquet file",
        description=(
            "Send one inbound_images message per row of FILE: JSON Lines (objects), CSV or "
            "TSV with a header row, or Parquet; the fields are url, uuid (or identifier, as "
            "in the original crawler's TSV and catalog dumps) and source, and any other "
            "column is ignored (and named once on stderr). A URL without a scheme gets "
            "http://, as the original's producer gave it. A missing uuid gets a new uuid4; "
            "--source fills a missing source. Bad rows are reported by line (Parquet: row) "
            "number on stderr and not sent; the good ones are sent all the same (acks=all, "
            "every acknowledgement awaited), then the exit status is 1. TSV is read as "
            "PostgreSQL's COPY writes it: no quoting, \\N for null. Parquet needs pyarrow "
            f"({PARQUET_EXTRA})."
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


def open_feed(
    path: Path, fmt: Format, default_source: str | None, stack: contextlib.ExitStack
) -> Iterator[Item]:
    """The items of the file at ``path``, its text kept open by ``stack``."""
    if fmt == "parquet":
        return read_parquet(path, default_source=default_source)
    text = path.open(encoding="utf-8-sig", errors="surrogateescape", newline="")
    return read_rows(stack.enter_context(text), fmt, default_source=default_source)


def size_of(path: Path, fmt: Format) -> int:
    """How many rows the file at ``path`` holds at most (its lines, or its Parquet rows),
    for a progress bar's total."""
    if fmt == "parquet":
        return int(_parquet().ParquetFile(path).metadata.num_rows)
    return count_lines(path)


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
    with contextlib.ExitStack() as stack:
        try:
            items = open_feed(path, fmt, default_source, stack)
            first = next(items)  # the header and an empty file are judged before connecting
        except FeedError as e:
            error(f"{path}: {e}")
            out("sent 0, bad 0")
            return EXIT_FAILED
        with progress:
            feed = _Feed(progress, progress.add_task("sending", total=size_of(path, fmt)))
            images = feed.images(itertools.chain([first], items))
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
    """The counts of one file being sent, shown as it goes: each bad row and the ignored
    columns on stderr, and a progress bar of the rows done (a bad row at once, a good one
    once acknowledged)."""

    def __init__(self, progress: Progress, task: TaskID) -> None:
        self._progress = progress
        self._task = task
        self.sent = 0
        self.bad = 0
        self.generated = 0
        self.schemes = 0

    def images(self, items: Iterable[Item]) -> Iterator[InboundImage]:
        """The images of the good rows; the bad ones are counted and reported, and so are
        the columns ignored."""
        for item in items:
            if isinstance(item, GoodRow):
                self.generated += item.generated_uuid
                self.schemes += item.added_scheme
                yield item.image
                continue
            self._progress.console.print(str(item), markup=False)
            if isinstance(item, BadRow):
                self.bad += item.count
                self._progress.advance(self._task, item.count)

    def acked(self, n: int) -> None:
        self.sent += n
        self._progress.advance(self._task, n)

    def summary(self) -> str:
        notes = []
        if self.generated:
            notes.append(f"{self.generated} without uuid got a new uuid4")
        if self.schemes:
            notes.append(f"{self.schemes} without a scheme got {DEFAULT_SCHEME}")
        summary = f"sent {self.sent}, bad {self.bad}"
        return f"{summary} ({'; '.join(notes)})" if notes else summary
