"""Re-checking an earlier crawl's images: ``image-crawler recheck``.

A re-check is an ``inbound_images`` message that carries what an earlier crawl reported
of the file (``contract.Earlier``: its ``etag``, ``last_modified`` and ``sha256``); the
worker asks the server conditionally and reports on ``link_checks``. This command turns
an earlier crawl's output into re-checks, read, judged and sent as ``produce`` does (its
``read_records``, ``Tally`` and ``send_feed``): bad rows reported by line (Parquet: row)
number and not sent, the good ones sent all the same.

FILE is JSON Lines, CSV, TSV or Parquet with the fields of ``RECHECK``: ``uuid`` (or
``identifier``), ``url``, ``source``, and ``etag``, ``last_modified``, ``sha256``, each
optional but not all three (a row with none is not a re-check: a bad row). Or it is
``up``'s archive of ``image_metadata_updates``
(``DATA/outputs/image_metadata_updates.jsonl``), whose resolution messages carry the
validators but neither URL nor source: ``--urls FEED``, the file that was given to
``produce`` (any format it reads), supplies them, joined on the uuid. The archive's EXIF
messages are not re-checks: ignored, counted.

Memory and passes. Without ``--urls``, FILE streams in one pass, as produce streams: a
uuid given twice is re-checked twice. With ``--urls``, the join holds a dict of the
feed's uuids, each with its URL, its source (one string per source) and a line number:
300 bytes a feed row with 36-character uuids and 66-character URLs (measured with
tracemalloc; 300 MB a million rows, more with longer URLs), whatever FILE's size. FILE
is then read twice: once to find each uuid's last re-check, since at-least-once delivery
or a later crawl of the image puts several resolution messages of it in the archive (the
last that can be sent wins; the ones before it are skipped as superseded), and once to
send. ``--checks`` holds one time per uuid it names (only the feed's, with ``--urls``).

``--older-than DATE`` selects rows last checked before DATE (``is_due``): when a row was
checked is its ``checked_at`` (or ``time``, the ``link_checks`` message's field, or
``last_checked``), and the latest ``time`` of its uuid's messages in ``--checks``, a
``link_checks`` archive. A row checked at or after DATE is skipped; a row that does not
say is due (never checked). A ``link_checks`` archive is no FILE: its messages carry no
validator, so every row of it would be a re-check of nothing (a bad row), and no
source; it says when, which is what ``--checks`` takes from it. A ``failed`` check
learned nothing of the file, so it does not count as one.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, Final

from rich.progress import Progress

from crawlctl.commands.produce import (
    FEED,
    FORMATS,
    PARQUET_EXTRA,
    BadRow,
    Columns,
    FeedError,
    Fields,
    Format,
    GoodRow,
    HeaderRule,
    Ignored,
    Item,
    Record,
    Records,
    Skipped,
    Tally,
    feed_header,
    file_format,
    is_blank,
    judged_start,
    no_column,
    open_records,
    progress_bar,
    send_feed,
    size_of,
    source_option,
    validate,
    validate_record,
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
from image_crawler.contract import CHECK_FAILED, INBOUND_TOPIC, Earlier, MalformedMessage

VALIDATORS: Final = ("etag", "last_modified", "sha256")
# What FILE's rows give. ``exif`` is read only to tell an EXIF message of the metadata
# archive; the resolution message's other fields are known and not used.
RECHECK: Final = Fields(
    names=("url", "uuid", "source", *VALIDATORS, "checked_at", "exif"),
    aliases={"identifier": "uuid", "time": "checked_at", "last_checked": "checked_at"},
    used=(
        "url, uuid (or identifier), source, etag, last_modified, sha256, "
        "checked_at (or time, last_checked)"
    ),
    quiet=frozenset(
        {"width", "height", "filesize", "compression_quality", "phash", "opt_outs", "tdm_policy"}
    ),
    loose=frozenset({"checked_at", "exif"}),
)
# What --checks gives: a link_checks message's identifier, time and status.
CHECKS: Final = Fields(
    names=("uuid", "checked_at", "status"),
    aliases={"identifier": "uuid", "time": "checked_at", "last_checked": "checked_at"},
    used="uuid (or identifier), checked_at (or time, last_checked), status",
    quiet=frozenset({"url", "http_status", "error"}),
    loose=frozenset({"checked_at"}),
)

NOTHING_TO_CHECK: Final = "nothing to re-check against: no etag, last_modified or sha256"
# Why a row is not sent (Skipped.reason): an EXIF message (ignored), or not due (skipped).
EXIF: Final = "exif"
SUPERSEDED: Final = "superseded"
RECENT: Final = "recent"
# How much of a value a bad row's reason shows.
SHOWN_CHARS: Final = 60


@dataclasses.dataclass(frozen=True, slots=True)
class Recheck(GoodRow):
    """A row to re-check (``image.earlier`` is set), and when it says it was last checked
    (None: it does not say, or ``--older-than`` was not given and it was not read)."""

    checked_at: datetime | None = None


@dataclasses.dataclass(slots=True)
class FeedEntry:
    """What the ``--urls`` feed says of one uuid, and the line (Parquet: row) of FILE's
    last re-check of it, once ``mark_latest`` has read FILE (0: none)."""

    url: str
    source: str
    last_line: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Rules:
    """How FILE's records become re-checks: what fills a missing source (``--source``),
    the feed that fills a missing URL and source (``--urls``), and whether a row's
    ``checked_at`` is read (``--older-than``)."""

    default_source: str | None = None
    feed: Mapping[str, FeedEntry] | None = None
    dated: bool = False


def parse_time(value: Any) -> datetime:
    """An ISO 8601 date, or date and time (a string, or a Parquet timestamp or date), as an
    aware datetime: without an offset it is UTC. ``ValueError`` for anything else."""
    if isinstance(value, datetime):
        when = value
    elif isinstance(value, date):
        when = datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        when = datetime.fromisoformat(value.strip())
    else:
        raise ValueError(f"not a date: {value!r}")
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def is_due(checked_at: datetime | None, older_than: datetime) -> bool:
    """A re-check is due when it was never checked, or last checked before ``older_than``."""
    return checked_at is None or checked_at < older_than


def _shown(value: Any) -> str:
    """``value`` for a reason: its repr, cut short (a hostile file's values can be long)."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text)} chars)"


def _uuid_problem(value: Any) -> str:
    """Why ``value``, not a string or blank, is no uuid."""
    if is_blank(value):
        return "missing uuid"
    return f"uuid is not a string: {_shown(value)}"


def _no_new_uuid() -> str:
    raise AssertionError("a re-check's uuid is the earlier crawl's, never a new one")


def recheck_row(record: Record, rules: Rules) -> Recheck | BadRow | Skipped:
    """One record of FILE -> a re-check, the reason it cannot be one, or an EXIF message
    of the metadata archive, skipped. A None or blank value is a missing one."""
    values, line, unit = record.values, record.line, record.unit
    validators = {name: values[name] for name in VALIDATORS if not is_blank(values.get(name))}
    if not validators and isinstance(values.get("exif"), dict):
        return Skipped(line, EXIF)
    uuid = values.get("uuid")
    if not isinstance(uuid, str) or is_blank(uuid):
        return BadRow(line, f"{_uuid_problem(uuid)} (a re-check needs the earlier crawl's)", unit)
    try:
        earlier = Earlier.from_fields(validators)
    except MalformedMessage as e:
        return BadRow(line, str(e), unit)
    if earlier is None:
        return BadRow(line, NOTHING_TO_CHECK, unit)
    checked_at = None
    if rules.dated and not is_blank(values.get("checked_at")):
        try:
            checked_at = parse_time(values["checked_at"])
        except ValueError:
            reason = f"checked_at is not an ISO 8601 date or time: {_shown(values['checked_at'])}"
            return BadRow(line, reason, unit)
    fields = {"url": values.get("url"), "uuid": uuid, "source": values.get("source")}
    if rules.feed is None and is_blank(fields["url"]):
        return BadRow(line, "missing url (give the field, or --urls FEED)", unit)
    if rules.feed is not None and (is_blank(fields["url"]) or is_blank(fields["source"])):
        entry = rules.feed.get(uuid.strip())
        if entry is None and is_blank(fields["url"]):
            return BadRow(line, f"uuid {_shown(uuid.strip())} is not in the --urls feed", unit)
        if entry is not None:
            fields["url"] = entry.url if is_blank(fields["url"]) else fields["url"]
            fields["source"] = entry.source if is_blank(fields["source"]) else fields["source"]
    row = validate(
        fields, line, default_source=rules.default_source, new_uuid=_no_new_uuid, unit=unit
    )
    if isinstance(row, BadRow):
        return row
    image = dataclasses.replace(row.image, earlier=earlier)
    return Recheck(line, image, added_scheme=row.added_scheme, checked_at=checked_at)


RecheckItem = Recheck | BadRow | Ignored | Skipped


def recheck_items(
    records: Iterable[Record | BadRow | Ignored], rules: Rules
) -> Iterator[RecheckItem]:
    """FILE's records judged by ``recheck_row``; the others as they are."""
    for record in records:
        yield recheck_row(record, rules) if isinstance(record, Record) else record


def recheck_header(rules: Rules) -> HeaderRule:
    """FILE's columns: a uuid, a validator, and a URL and source unless the feed or
    ``--source`` gives them."""

    def check(columns: Columns) -> None:
        if "uuid" not in columns.used:
            raise no_column(columns, "uuid", RECHECK)
        if not any(name in columns.used for name in VALIDATORS):
            raise FeedError(f"no etag, last_modified or sha256 column: {NOTHING_TO_CHECK}")
        if rules.feed is None and "url" not in columns.used:
            raise FeedError(f"{no_column(columns, 'url', RECHECK)}; or give --urls FEED")
        if rules.feed is None and "source" not in columns.used and rules.default_source is None:
            raise FeedError("no source column; give --source, or --urls FEED")

    return check


# --- the latest re-check of a uuid, and --older-than ----------------------------------------


def mark_latest(items: Iterable[RecheckItem], feed: Mapping[str, FeedEntry]) -> None:
    """The first of FILE's two passes: note in each feed entry the line of its uuid's last
    re-check (a row that cannot be sent never supersedes one that can)."""
    for item in items:
        if isinstance(item, Recheck):
            entry = feed.get(item.image.uuid)
            if entry is not None:
                entry.last_line = item.line


def latest_only(
    items: Iterable[RecheckItem], feed: Mapping[str, FeedEntry]
) -> Iterator[RecheckItem]:
    """The second pass: a re-check of a feed's uuid that is not its last is skipped."""
    for item in items:
        if isinstance(item, Recheck):
            entry = feed.get(item.image.uuid)
            if entry is not None and entry.last_line != item.line:
                yield Skipped(item.line, SUPERSEDED)
                continue
        yield item


@dataclasses.dataclass
class Selection:
    """``--older-than``: the re-checks due (``is_due``) pass, the others are skipped.
    ``checks`` holds when each uuid was last checked according to ``--checks``; ``dated``
    counts the re-checks whose check time was known, from either."""

    older_than: datetime
    checks: Mapping[str, datetime]
    dated: int = 0

    def select(self, items: Iterable[RecheckItem]) -> Iterator[RecheckItem]:
        for item in items:
            if isinstance(item, Recheck):
                known = [item.checked_at, self.checks.get(item.image.uuid)]
                checked_at = max((t for t in known if t is not None), default=None)
                self.dated += checked_at is not None
                if not is_due(checked_at, self.older_than):
                    yield Skipped(item.line, RECENT)
                    continue
            yield item


# --- the files joined to FILE ------------------------------------------------------------------


def feed_rows(records: Records, default_source: str | None) -> Iterator[Item]:
    """The ``--urls`` feed's records judged as produce judged them, except that a row
    without uuid is a bad one: its uuid was generated when it was sent, and cannot be joined."""
    for record in records:
        if not isinstance(record, Record):
            yield record
        elif is_blank(record.values.get("uuid")):
            yield BadRow(record.line, "missing uuid: nothing to join on", record.unit)
        else:
            yield validate_record(record, default_source=default_source, new_uuid=_no_new_uuid)


Feed = dict[str, FeedEntry]


def load_feed(items: Iterable[Item], on_bad: Callable[[BadRow], None]) -> Feed:
    """The feed's good rows by uuid (a uuid's last row wins); its bad rows go to ``on_bad``.
    Each source is one string, however many rows name it."""
    feed: Feed = {}
    sources: dict[str, str] = {}
    for item in items:
        if isinstance(item, GoodRow):
            image = item.image
            feed[image.uuid] = FeedEntry(image.url, sources.setdefault(image.source, image.source))
        elif isinstance(item, BadRow):
            on_bad(item)
    return feed


def uuid_header(columns: Columns) -> None:
    """A joined file needs a uuid to join on."""
    if "uuid" not in columns.used:
        raise FeedError("no uuid (or identifier) column: nothing to join on")


def joined_feed_header(default_source: str | None) -> HeaderRule:
    """The ``--urls`` feed's columns: produce's, and a uuid."""
    produce_rule = feed_header(default_source)

    def check(columns: Columns) -> None:
        produce_rule(columns)
        uuid_header(columns)

    return check


def load_checks(
    records: Iterable[Record | BadRow | Ignored],
    on_bad: Callable[[BadRow], None],
    wanted: Callable[[str], bool] = lambda uuid: True,
) -> dict[str, datetime]:
    """When each ``wanted`` uuid was last checked: the latest ``checked_at`` (``time``) of its
    ``link_checks`` messages, a ``failed`` check not counting. Bad rows go to ``on_bad``."""
    checks: dict[str, datetime] = {}
    for record in records:
        if isinstance(record, BadRow):
            on_bad(record)
        if not isinstance(record, Record):
            continue
        values, line, unit = record.values, record.line, record.unit
        uuid = values.get("uuid")
        if not isinstance(uuid, str) or is_blank(uuid):
            on_bad(BadRow(line, _uuid_problem(uuid), unit))
            continue
        if values.get("status") == CHECK_FAILED or not wanted(uuid.strip()):
            continue
        if is_blank(values.get("checked_at")):
            on_bad(BadRow(line, "missing time (or checked_at)", unit))
            continue
        try:
            at = parse_time(values["checked_at"])
        except ValueError:
            shown = _shown(values["checked_at"])
            on_bad(BadRow(line, f"time is not an ISO 8601 date or time: {shown}", unit))
            continue
        key = uuid.strip()
        if key not in checks or at > checks[key]:
            checks[key] = at
    return checks


def checks_header(columns: Columns) -> None:
    uuid_header(columns)
    if "checked_at" not in columns.used:
        raise FeedError("no time (or checked_at) column: it does not say when")


# --- the command ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class InputFile:
    """One file the command reads, and its format."""

    path: Path
    fmt: Format

    def records(self, fields: Fields, rule: HeaderRule, stack: contextlib.ExitStack) -> Records:
        """Its records (``open_records``); a ``FeedError`` names the file."""
        try:
            records = open_records(self.path, self.fmt, fields, rule, stack)
        except FeedError as e:
            raise FeedError(f"{self.path}: {e}") from None
        return self._named(records)

    def _named(self, records: Records) -> Records:
        try:
            yield from records
        except FeedError as e:
            raise FeedError(f"{self.path}: {e}") from None


@dataclasses.dataclass(frozen=True, slots=True)
class Inputs:
    """What ``recheck`` was given."""

    file: InputFile
    urls: InputFile | None = None
    checks: InputFile | None = None
    default_source: str | None = None
    older_than: datetime | None = None


def register(subcommands: Subcommands) -> None:
    recheck = subcommands.add_parser(
        "recheck",
        parents=[kafka_option()],
        help="re-check an earlier crawl's images (its etag, last_modified, sha256)",
        description=(
            "Send one re-check per row of FILE to inbound_images: the url, uuid (or "
            "identifier) and source of an image an earlier crawl saw, and what it reported "
            "of the file (etag, last_modified, sha256: at least one), which the worker asks "
            "the server about conditionally, reporting on link_checks. FILE is JSON Lines, "
            "CSV, TSV or Parquet, read as produce reads it; or up's archive "
            "DATA/outputs/image_metadata_updates.jsonl, whose messages have no url and "
            "source: --urls FEED, the file given to produce, supplies them by uuid (and the "
            "last message of a uuid wins; EXIF messages are ignored). --older-than DATE "
            "keeps the rows last checked before DATE, as FILE's checked_at (or time, "
            "last_checked) column says, or --checks, up's link_checks archive. Bad rows are "
            "reported by line (Parquet: row) number on stderr and not sent; the good ones "
            "are sent all the same, then the exit status is 1. Parquet needs pyarrow "
            f"({PARQUET_EXTRA})."
        ),
    )
    recheck.add_argument("file", metavar="FILE")
    recheck.add_argument(
        "--urls",
        metavar="FEED",
        help="the file given to produce: url and source of FILE's rows that have none, by uuid",
    )
    recheck.add_argument(
        "--older-than",
        metavar="DATE",
        help="only rows last checked before DATE (ISO 8601 date or date and time; UTC when "
        "it has no offset); rows that do not say are due",
    )
    recheck.add_argument(
        "--checks",
        metavar="LINK_CHECKS",
        help="when each uuid was last checked, for --older-than: up's "
        "DATA/outputs/link_checks.jsonl, or any file of identifier, time and status",
    )
    recheck.add_argument("--source", metavar="S", help="the source of rows that name none")
    for option, what in (
        ("--format", "FILE"),
        ("--urls-format", "FEED"),
        ("--checks-format", "LINK_CHECKS"),
    ):
        recheck.add_argument(
            option, choices=FORMATS, help=f"{what}'s format (default: by its extension)"
        )
    recheck.set_defaults(run=run)


def older_than_option(value: str | None) -> datetime | None:
    """``--older-than``, parsed; ``UsageError`` when it is not an ISO 8601 date."""
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError:
        raise UsageError(
            f"--older-than is not an ISO 8601 date or date and time: {value!r}"
        ) from None


def run(args: argparse.Namespace) -> int:
    if args.checks is not None and args.older_than is None:
        raise UsageError("--checks says when rows were checked: it goes with --older-than")
    inputs = Inputs(
        file=InputFile(Path(args.file), file_format(args.file, args.format)),
        urls=None
        if args.urls is None
        else InputFile(Path(args.urls), file_format(args.urls, args.urls_format)),
        checks=None
        if args.checks is None
        else InputFile(Path(args.checks), file_format(args.checks, args.checks_format)),
        default_source=source_option(args.source),
        older_than=older_than_option(args.older_than),
    )
    return asyncio.run(_recheck(inputs, kafka_settings(args)))


class _Reading:
    """The files read before sending, shown as they are read; the bad rows of the files
    joined to FILE, on stderr after the file's name, counted by file."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self.bad: collections.Counter[Path] = collections.Counter()

    def shown(self, source: InputFile, records: Records) -> Records:
        task = self._progress.add_task(
            f"reading {source.path.name}", total=size_of(source.path, source.fmt)
        )
        for record in records:
            if not isinstance(record, Ignored):
                self._progress.advance(task, record.count if isinstance(record, BadRow) else 1)
            yield record

    def on_bad(self, source: InputFile) -> Callable[[BadRow], None]:
        def report(row: BadRow) -> None:
            self._progress.console.print(f"{source.path}: {row}", markup=False)
            self.bad[source.path] += row.count

        return report

    def notes(self, inputs: Inputs) -> list[str]:
        notes = []
        for flag, joined in (("--urls", inputs.urls), ("--checks", inputs.checks)):
            if joined is not None and self.bad[joined.path]:
                notes.append(f"{flag} {joined.path}: {self.bad[joined.path]} bad")
        return notes


def _load_feed(inputs: Inputs, reading: _Reading, stack: contextlib.ExitStack) -> Feed | None:
    if inputs.urls is None:
        return None
    rule = joined_feed_header(inputs.default_source)
    records = reading.shown(inputs.urls, inputs.urls.records(FEED, rule, stack))
    return load_feed(feed_rows(records, inputs.default_source), reading.on_bad(inputs.urls))


def _load_checks(
    inputs: Inputs, feed: Feed | None, reading: _Reading, stack: contextlib.ExitStack
) -> dict[str, datetime]:
    if inputs.checks is None:
        return {}
    records = reading.shown(inputs.checks, inputs.checks.records(CHECKS, checks_header, stack))
    # With a feed, only its uuids can be re-checked: the others are not kept.
    wanted = (lambda uuid: True) if feed is None else feed.__contains__
    return load_checks(records, reading.on_bad(inputs.checks), wanted)


async def _recheck(inputs: Inputs, kafka: KafkaSettings) -> int:
    with contextlib.ExitStack() as stack:
        progress = stack.enter_context(progress_bar())
        reading = _Reading(progress)
        try:
            feed = _load_feed(inputs, reading, stack)
            checks = _load_checks(inputs, feed, reading, stack)
            rules = Rules(inputs.default_source, feed, dated=inputs.older_than is not None)
            header = recheck_header(rules)
            items: Iterator[RecheckItem]
            if feed is None:
                items = recheck_items(inputs.file.records(RECHECK, header, stack), rules)
            else:
                # Two passes; FILE is judged whole before connecting.
                first_pass = reading.shown(inputs.file, inputs.file.records(RECHECK, header, stack))
                mark_latest(recheck_items(first_pass, rules), feed)
                second_pass = inputs.file.records(RECHECK, header, stack)
                items = latest_only(recheck_items(second_pass, rules), feed)
            selection = None
            if inputs.older_than is not None:
                selection = Selection(inputs.older_than, checks)
                items = selection.select(items)
            sending = judged_start(items)
        except FeedError as e:
            error(str(e))
            out("sent 0, bad 0, ignored 0, skipped 0")
            return EXIT_FAILED
        total = size_of(inputs.file.path, inputs.file.fmt)
        tally = Tally(progress, progress.add_task(INBOUND_TOPIC, total=total))
        if not await send_feed(sending, tally, kafka):
            out(_counts(tally))
            return EXIT_UNAVAILABLE
    notes = _notes(tally, selection) + reading.notes(inputs)
    out(f"{_counts(tally)} ({'; '.join(notes)})" if notes else _counts(tally))
    return EXIT_FAILED if tally.bad else EXIT_OK


def _counts(tally: Tally) -> str:
    ignored = tally.skipped[EXIF]
    skipped = tally.skipped.total() - ignored
    return f"sent {tally.sent}, bad {tally.bad}, ignored {ignored}, skipped {skipped}"


def _notes(tally: Tally, selection: Selection | None) -> list[str]:
    notes = tally.notes()
    if tally.skipped[EXIF]:
        notes.append(f"{tally.skipped[EXIF]} EXIF message(s) ignored")
    if tally.skipped[SUPERSEDED]:
        notes.append(f"{tally.skipped[SUPERSEDED]} superseded by a later row of the same uuid")
    if selection is not None:
        since = selection.older_than.isoformat()
        if tally.skipped[RECENT]:
            notes.append(f"{tally.skipped[RECENT]} checked since {since}, skipped")
        if not selection.dated:
            notes.append(
                "--older-than selected every row: the input does not say when rows were checked"
            )
    return notes
