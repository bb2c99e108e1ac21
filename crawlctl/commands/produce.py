"""Feeding ``inbound_images`` from a file: ``image-crawler produce``.

Reading is pure and in two steps, shared with ``recheck``: ``read_records`` turns JSON
Lines, CSV or TSV, and ``read_parquet_records`` a Parquet file, into ``Record`` (the
values of the fields a command reads, named by ``Fields``), ``BadRow`` (where and why)
and, once per column or field not used, ``Ignored``; one at a time, so a file of any size
streams. Then each command judges its records: ``read_rows`` and ``read_parquet`` give
produce's ``GoodRow`` (an ``InboundImage`` that the contract's own decoder accepts) or
``BadRow``. produce's columns are ``url``, ``uuid`` (or ``identifier``, the original
crawler's TSV and the catalog's name) and ``source``; any other is ignored, as a catalog
dump has many. A URL without a scheme gets ``http://``, as the original's producer added
it. Sending is ``send_images``: one producer, acks=all, batches of sends whose
acknowledgements are awaited before the next; ``send_feed`` sends the good rows of a
stream of items, counted and shown by a ``Tally``. The command sends the good rows of a
file with bad ones all the same, reports each bad row by line (or Parquet row) number on
stderr, and ends with the counts.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
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
class Fields:
    """The fields a command reads from a file, and their other names.

    ``aliases`` maps another name to its field; a field's own name wins, then its aliases
    in the order given. ``used`` names the fields in the note on ignored columns.
    ``quiet`` are names known and not used, never named as ignored (the other fields of a
    message whose file a command reads). A Parquet column of a field must hold strings,
    but one of ``loose`` may hold any type, converted as pyarrow converts it (a timestamp
    to a ``datetime``), for the command's judging to accept or refuse.
    """

    names: tuple[str, ...]
    aliases: Mapping[str, str]
    used: str
    quiet: frozenset[str] = frozenset()
    loose: frozenset[str] = frozenset()

    def spellings(self, field: str) -> list[str]:
        """The names that give ``field``, the first found winning."""
        return [field, *(alias for alias, target in self.aliases.items() if target == field)]


# What produce reads.
FEED: Final = Fields(FIELDS, ALIASES, USED)


def plain_value(value: Any) -> Any:
    """A value as JSON carries it: a Parquet file's date or decimal as its text."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [plain_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain_value(v) for k, v in value.items()}
    return str(value)


@dataclasses.dataclass(frozen=True, slots=True)
class Kept:
    """What produce carries of each row beyond url, uuid and source (``--caption-col``,
    ``--save-additional-columns``): the caption's column and the kept columns, by name.
    A header matches them without case (JSON Lines: as written); they go into the
    message's ``caption`` and ``columns``."""

    caption: str | None = None
    columns: tuple[str, ...] = ()

    def _names(self) -> list[str]:
        return [*([self.caption] if self.caption else []), *self.columns]

    def fields(self, *, exact: bool = False) -> Fields:
        """produce's fields and these (lower-cased unless ``exact``)."""
        if not self._names():
            return FEED
        extra = tuple(n if exact else n.lower() for n in self._names())
        used = ", ".join([USED, *self._names()])
        loose = frozenset(n if exact else n.lower() for n in self.columns)
        return Fields((*FIELDS, *extra), ALIASES, used, loose=loose)

    def message_fields(self, values: Mapping[str, Any], *, exact: bool = False) -> dict[str, Any]:
        """The ``caption`` and ``columns`` of a record's values (none when not asked)."""

        def value(name: str) -> Any:
            return values.get(name if exact else name.lower())

        found: dict[str, Any] = {}
        if self.caption:
            caption = value(self.caption)
            if caption is not None:
                found["caption"] = caption if isinstance(caption, str) else str(caption)
        if self.columns:
            found["columns"] = {name: plain_value(value(name)) for name in self.columns}
        return found


@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    """One record of a file, not yet judged: the values of the fields it gives (a field it
    does not give is absent; ``\\N`` in TSV is None), and where it is."""

    line: int
    values: dict[str, Any]
    # What ``line`` counts: lines of a text file, or rows of a Parquet file.
    unit: str = "line"


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
    # The fields that are used, as Fields.used says them.
    used: str = USED

    def __str__(self) -> str:
        names = ", ".join(map(repr, self.names))
        where = "" if self.line is None else f"line {self.line}: "
        return f"{where}ignored {self.kind}(s) {names} (used: {self.used})"


@dataclasses.dataclass(frozen=True, slots=True)
class Skipped:
    """A row read and, on purpose, not sent (``recheck``: not due); counted by ``reason``."""

    line: int
    reason: str


Row = GoodRow | BadRow
Item = GoodRow | BadRow | Ignored
# What ``send_feed`` and a ``Tally`` take.
FeedItem = GoodRow | BadRow | Ignored | Skipped
Records = Iterator[Record | BadRow | Ignored]


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


def is_blank(value: Any) -> bool:
    """A value that counts as missing: None, or a string of blanks."""
    return value is None or (isinstance(value, str) and not value.strip())


def validate(
    fields: Mapping[str, Any],
    line: int,
    *,
    default_source: str | None,
    new_uuid: Callable[[], str],
    unit: str = "line",
    row_fields: Mapping[str, Any] | None = None,
) -> Row:
    """One record's ``url``, ``uuid`` and ``source`` -> a row the crawler accepts, or the
    reason it would not. A None or blank value is a missing one."""
    url = fields.get("url")
    if is_blank(url):
        return BadRow(line, "missing url", unit)
    if not isinstance(url, str):
        return BadRow(line, f"url is not a string: {url!r}", unit)
    full_url = add_scheme(url.strip())
    parts = urlsplit(full_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return BadRow(line, f"url is not an http(s) URL: {url.strip()!r}", unit)
    raw_uuid = fields.get("uuid")
    generated = is_blank(raw_uuid)
    if generated:
        raw_uuid = new_uuid()
    elif not isinstance(raw_uuid, str):
        return BadRow(line, f"uuid is not a string: {raw_uuid!r}", unit)
    source = fields.get("source")
    if is_blank(source):
        if default_source is None:
            return BadRow(line, "missing source (give the field, or --source)", unit)
        source = default_source
    if not isinstance(source, str):
        return BadRow(line, f"source is not a string: {source!r}", unit)
    if not is_valid_source_name(source.strip()):
        return BadRow(line, f"invalid source name {source.strip()!r} ({SOURCE_NAME_RULE})", unit)
    candidate = {"url": full_url, "uuid": raw_uuid, "source": source, **(row_fields or {})}
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


# A command's rule for a header: raises FeedError when the columns cannot feed it.
HeaderRule = Callable[[Columns], None]


def pick_columns(names: Sequence[str], fields: Fields) -> Columns:
    """The columns of ``fields`` among ``names`` (compared without case and surrounding
    blanks; a field's own name first, then its aliases); ``FeedError`` when a used column
    is there twice. Columns that are ``quiet`` are neither used nor ignored."""
    cleaned = [name.strip().lower() for name in names]
    used: dict[str, int] = {}
    for field in fields.names:
        for spelling in fields.spellings(field):
            where = [i for i, name in enumerate(cleaned) if name == spelling]
            if len(where) > 1:
                raise FeedError(f"column(s) {spelling} given twice")
            if where:
                used[field] = where[0]
                break
    taken = set(used.values())
    ignored = tuple(
        names[i].strip()
        for i in range(len(names))
        if i not in taken and cleaned[i] not in fields.quiet
    )
    return Columns(used, ignored)


def no_column(columns: Columns, name: str, fields: Fields) -> FeedError:
    """The error for a header without the column ``name``, naming the columns not used
    (a misspelt one is among them)."""
    unknown = ", ".join(map(repr, columns.ignored))
    return FeedError(
        (f"unknown column(s) {unknown} and " if columns.ignored else "")
        + f"no {name} column; the columns used are {fields.used}"
    )


def feed_header(default_source: str | None) -> HeaderRule:
    """produce's rule: a ``url`` column, and a ``source`` column unless ``default_source``."""

    def check(columns: Columns) -> None:
        if "url" not in columns.used:
            raise no_column(columns, "url", FEED)
        if "source" not in columns.used and default_source is None:
            raise FeedError("no source column; give --source")

    return check


def read_records(text: TextIO, fmt: Format, fields: Fields, check_header: HeaderRule) -> Records:
    """Every record of ``text`` as a ``Record`` (or a ``BadRow`` when it cannot be read), in
    file order, with an ``Ignored`` for the columns (fields) not used, before the first
    record that has them.

    Blank lines are skipped. CSV and TSV need a header row that ``check_header`` accepts
    (its ``FeedError`` is raised with the header's line number), and ``FeedError`` is
    raised for a file with no record at all. TSV is read as PostgreSQL's COPY writes it:
    one line a row, no quoting, ``\\N`` for null.
    """
    if fmt == "jsonl":
        records = _jsonl_records(text, fields)
    elif fmt in ("csv", "tsv"):
        records = _delimited_records(text, fmt, fields, check_header)
    else:
        raise FeedError(f"{fmt} is not a text format")
    yield from _not_empty(records)


def validate_record(
    record: Record, *, default_source: str | None, new_uuid: Callable[[], str]
) -> Row:
    """``validate`` of one record's values, where the record is."""
    return validate(
        record.values,
        record.line,
        default_source=default_source,
        new_uuid=new_uuid,
        unit=record.unit,
    )


def _validated(
    records: Records, default_source: str | None, new_uuid: Callable[[], str]
) -> Iterator[Item]:
    for record in records:
        if isinstance(record, Record):
            yield validate_record(record, default_source=default_source, new_uuid=new_uuid)
        else:
            yield record


def read_rows(
    text: TextIO,
    fmt: Format,
    *,
    default_source: str | None = None,
    new_uuid: Callable[[], str] = lambda: str(uuid.uuid4()),
) -> Iterator[Item]:
    """Every record of ``text`` as a ``GoodRow`` or a ``BadRow``, in file order, with an
    ``Ignored`` for the columns (fields) not used, before the first row that has them.

    As ``read_records`` reads them; CSV and TSV need a ``url`` column, and ``source``
    unless ``default_source``.
    """
    records = read_records(text, fmt, FEED, feed_header(default_source))
    yield from _validated(records, default_source, new_uuid)


def _not_empty(items: Iterator[Any]) -> Iterator[Any]:
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


def _jsonl_records(text: TextIO, fields: Fields) -> Records:
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
        given = _json_names(value, fields)
        new = tuple(
            name
            for name in value
            if name not in given.values() and name not in fields.quiet and name not in reported
        )
        if new:
            reported.update(new)
            yield Ignored(line_number, new, kind="field", used=fields.used)
        yield Record(line_number, {field: value[name] for field, name in given.items()})


def _json_names(value: Mapping[str, Any], fields: Fields) -> dict[str, str]:
    """field -> the name that gives it in ``value``: its own, else its first alias there."""
    given = {}
    for field in fields.names:
        name = next((n for n in fields.spellings(field) if n in value), None)
        if name is not None:
            given[field] = name
    return given


def _delimited_records(
    text: TextIO, fmt: Format, fields: Fields, check_header: HeaderRule
) -> Records:
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
                columns = pick_columns(record, fields)
                check_header(columns)
            except FeedError as e:
                raise FeedError(f"line {header_line}: {e}") from None
            if columns.ignored:
                yield Ignored(header_line, columns.ignored, used=fields.used)
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
        values = {
            field: None if fmt == "tsv" and record[i] == TSV_NULL else record[i]
            for field, i in columns.used.items()
        }
        yield Record(first_line, values)


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


def read_parquet_records(
    path: Path,
    fields: Fields,
    check_header: HeaderRule,
    *,
    batch_rows: int = PARQUET_BATCH_ROWS,
) -> Records:
    """Every row of the Parquet file at ``path`` as a ``Record`` (rows counted from 1),
    after an ``Ignored`` for its columns not used; only the used columns are read,
    ``batch_rows`` at a time. A row group that cannot be read is one ``BadRow`` for all its
    rows, and the next is read. ``FeedError`` for no pyarrow, a file that is not Parquet, a
    schema ``check_header`` refuses, a used column (not ``loose``) that does not hold
    strings, or no row at all."""
    pq = _parquet()
    import pyarrow as pa

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise FeedError(f"not a Parquet file: {e}") from None
    schema = parquet.schema_arrow
    columns = pick_columns(schema.names, fields)
    check_header(columns)
    for field, index in columns.used.items():
        data_type = schema.field(index).type
        if field not in fields.loose and not _string_like(data_type):
            raise FeedError(
                f"column {schema.names[index]!r} ({field}) holds {data_type}, not strings"
            )
    return _not_empty(_parquet_records(parquet, columns, fields, batch_rows))


def read_parquet(
    path: Path,
    *,
    default_source: str | None = None,
    new_uuid: Callable[[], str] = lambda: str(uuid.uuid4()),
    batch_rows: int = PARQUET_BATCH_ROWS,
) -> Iterator[Item]:
    """Every row of the Parquet file at ``path`` as a ``GoodRow`` or a ``BadRow``, as
    ``read_parquet_records`` reads them; the columns are produce's, as in ``read_rows``."""
    records = read_parquet_records(path, FEED, feed_header(default_source), batch_rows=batch_rows)
    return _validated(records, default_source, new_uuid)


def _parquet_records(parquet: Any, columns: Columns, fields: Fields, batch_rows: int) -> Records:
    import pyarrow as pa

    if columns.ignored:
        yield Ignored(None, columns.ignored, used=fields.used)
    names = parquet.schema_arrow.names
    wanted = [names[i] for i in columns.used.values()]
    used = list(columns.used)
    row = 0
    for group in range(parquet.metadata.num_row_groups):
        group_rows = parquet.metadata.row_group(group).num_rows
        group_end = row + group_rows
        try:
            for batch in parquet.iter_batches(
                batch_size=batch_rows, row_groups=[group], columns=wanted
            ):
                values = [batch.column(i).to_pylist() for i in range(len(used))]
                for record in zip(*values, strict=True):
                    row += 1
                    yield Record(row, dict(zip(used, record, strict=True)), "row")
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
        **settings.kafka.producer_options(),
        acks="all",
        linger_ms=20,
        request_timeout_ms=int(settings.request_timeout_s * 1000),
    )
    sent = 0
    try:
        # Inside: a producer that could not start is closed all the same.
        await producer.start()
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


# --- sending a file, shown as it goes -------------------------------------------------------


def progress_bar() -> Progress:
    """A progress display on stderr, one bar a task (its description in front), shown only
    when stderr is a terminal."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=not err.is_terminal,
    )


class Tally:
    """The counts of one file being sent, shown as it goes: each bad row and the ignored
    columns on stderr, and a progress bar of the rows done (a bad or skipped row at once, a
    good one once acknowledged)."""

    def __init__(self, progress: Progress, task: TaskID) -> None:
        self._progress = progress
        self._task = task
        self.sent = 0
        self.bad = 0
        self.generated = 0
        self.schemes = 0
        self.skipped: collections.Counter[str] = collections.Counter()

    def images(self, items: Iterable[FeedItem]) -> Iterator[InboundImage]:
        """The images of the good rows; the bad ones are counted and reported, the skipped
        ones counted, and the columns ignored reported."""
        for item in items:
            if isinstance(item, GoodRow):
                self.generated += item.generated_uuid
                self.schemes += item.added_scheme
                yield item.image
            elif isinstance(item, Skipped):
                self.skipped[item.reason] += 1
                self._progress.advance(self._task, 1)
            else:
                self._progress.console.print(str(item), markup=False)
                if isinstance(item, BadRow):
                    self.bad += item.count
                    self._progress.advance(self._task, item.count)

    def acked(self, n: int) -> None:
        self.sent += n
        self._progress.advance(self._task, n)

    def notes(self) -> list[str]:
        """What was done to rows to send them, for the summary."""
        notes = []
        if self.generated:
            notes.append(f"{self.generated} without uuid got a new uuid4")
        if self.schemes:
            notes.append(f"{self.schemes} without a scheme got {DEFAULT_SCHEME}")
        return notes


async def send_feed(items: Iterable[FeedItem], tally: Tally, kafka: KafkaSettings) -> bool:
    """Send the images of ``items`` (``send_images``), counted and shown by ``tally``; False
    when Kafka is away or refuses, which is then reported on stderr."""
    try:
        await send_images(SendSettings(kafka), tally.images(items), on_acked=tally.acked)
    except KafkaError as e:
        acknowledged = f"(after {tally.sent} acknowledged)"
        error(f"Kafka at {kafka.bootstrap_servers}: {e!r} {acknowledged}")
        return False
    return True


def judged_start(items: Iterator[FeedItem]) -> Iterator[FeedItem]:
    """``items`` with their start read: up to the first item that is not an ``Ignored``,
    so that a header that cannot feed, and a file with no row, raise ``FeedError`` here,
    before anything is sent."""
    start: list[FeedItem] = []
    for item in items:
        start.append(item)
        if not isinstance(item, Ignored):
            break
    return itertools.chain(start, items)


def open_records(
    path: Path, fmt: Format, fields: Fields, check_header: HeaderRule, stack: contextlib.ExitStack
) -> Records:
    """The records of the file at ``path`` (``read_records``, ``read_parquet_records``),
    its text kept open by ``stack``."""
    if fmt == "parquet":
        return read_parquet_records(path, fields, check_header)
    text = path.open(encoding="utf-8-sig", errors="surrogateescape", newline="")
    return read_records(stack.enter_context(text), fmt, fields, check_header)


def size_of(path: Path, fmt: Format) -> int:
    """How many rows the file at ``path`` holds at most (its lines, or its Parquet rows),
    for a progress bar's total."""
    if fmt == "parquet":
        return int(_parquet().ParquetFile(path).metadata.num_rows)
    return count_lines(path)


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
    produce.add_argument(
        "--caption-col",
        metavar="NAME",
        help="a column to send as each message's caption (img2dataset's name)",
    )
    produce.add_argument(
        "--save-additional-columns",
        metavar="A,B",
        help='columns to send as each message\'s columns: comma separated, or ["a","b"]',
    )
    produce.set_defaults(run=run)


def column_list(raw: str | None) -> tuple[str, ...]:
    """``--save-additional-columns``: ``a,b`` or img2dataset's JSON list ``["a","b"]``."""
    if not raw:
        return ()
    text = raw.strip()
    if text.startswith("["):
        try:
            names = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"--save-additional-columns is not a JSON list: {e}") from None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise UsageError("--save-additional-columns must list column names")
    else:
        names = text.split(",")
    return tuple(n.strip() for n in names if n.strip())


def kept_option(args: argparse.Namespace) -> Kept:
    """``--caption-col`` and ``--save-additional-columns``, checked."""
    kept = Kept(args.caption_col, column_list(args.save_additional_columns))
    names = [n.lower() for n in kept._names()]
    if any(names.count(n) > 1 for n in names) or set(names) & {*FIELDS, *ALIASES}:
        raise UsageError(
            "--caption-col and --save-additional-columns must name other columns than each "
            f"other and than {USED}"
        )
    return kept


def file_format(name: str, explicit: str | None) -> Format:
    """The format of the file ``name`` a command was given; ``UsageError`` when it is not a
    file or its format is unknown."""
    if not Path(name).is_file():
        raise UsageError(f"no such file: {name}")
    try:
        return format_of(Path(name), explicit)
    except FeedError as e:
        raise UsageError(str(e)) from None


def source_option(source: str | None) -> str | None:
    """``--source``, checked; ``UsageError`` when it cannot be a source's name."""
    if source is not None and not is_valid_source_name(source):
        raise UsageError(f"--source is not a valid source name: {source!r}")
    return source


def run(args: argparse.Namespace) -> int:
    path = Path(args.file)
    fmt = file_format(args.file, args.format)
    source = source_option(args.source)
    kept = kept_option(args)
    return asyncio.run(_produce(path, fmt, source, kafka_settings(args), kept))


def open_feed(
    path: Path,
    fmt: Format,
    default_source: str | None,
    stack: contextlib.ExitStack,
    kept: Kept = Kept(),
) -> Iterator[Item]:
    """The items of the file at ``path``, its text kept open by ``stack``; each message
    with what ``kept`` asks of its row."""
    exact = fmt == "jsonl"
    fields = kept.fields(exact=exact)
    records = open_records(path, fmt, fields, _kept_header(default_source, kept, fields), stack)
    if fields is FEED:
        return _validated(records, default_source, lambda: str(uuid.uuid4()))
    return _validated_with(records, default_source, kept, exact)


def _kept_header(default_source: str | None, kept: Kept, fields: Fields) -> HeaderRule:
    base = feed_header(default_source)

    def check(columns: Columns) -> None:
        base(columns)
        missing = [n for n in fields.names[len(FIELDS) :] if n not in columns.used]
        if missing:
            raise FeedError(f"no column(s) {', '.join(map(repr, missing))}, which were asked for")

    return check


def _validated_with(
    records: Records, default_source: str | None, kept: Kept, exact: bool
) -> Iterator[Item]:
    for record in records:
        if not isinstance(record, Record):
            yield record
            continue
        yield validate(
            record.values,
            record.line,
            default_source=default_source,
            new_uuid=lambda: str(uuid.uuid4()),
            unit=record.unit,
            row_fields=kept.message_fields(record.values, exact=exact),
        )


async def _produce(
    path: Path,
    fmt: Format,
    default_source: str | None,
    kafka: KafkaSettings,
    kept: Kept = Kept(),
) -> int:
    with contextlib.ExitStack() as stack:
        try:
            items = judged_start(open_feed(path, fmt, default_source, stack, kept))
        except FeedError as e:
            error(f"{path}: {e}")
            out("sent 0, bad 0")
            return EXIT_FAILED
        progress = stack.enter_context(progress_bar())
        tally = Tally(progress, progress.add_task(INBOUND_TOPIC, total=size_of(path, fmt)))
        if not await send_feed(items, tally, kafka):
            out(f"sent {tally.sent}, bad {tally.bad}")
            return EXIT_UNAVAILABLE
    summary = f"sent {tally.sent}, bad {tally.bad}"
    notes = tally.notes()
    out(f"{summary} ({'; '.join(notes)})" if notes else summary)
    return EXIT_FAILED if tally.bad else EXIT_OK
