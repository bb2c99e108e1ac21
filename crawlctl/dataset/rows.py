"""Reading a URL list as img2dataset reads it: its input formats and column options.

``txt`` is one URL a line; ``csv`` and ``tsv`` have a header row; ``json`` is an array of
objects, ``jsonl`` one object a line; ``parquet`` a Parquet file (pyarrow). The URL is in
``url_col``, the caption in ``caption_col`` (none: no caption), and
``save_additional_columns`` are kept by name beside them. Column names are matched as
written and, failing that, without regard to case.

Every row of the file is an item, in file order, a row that cannot be crawled too (no
URL, not an http(s) URL, a line that cannot be read): it is still a row of the dataset,
one that failed, so that every later row keeps its place and its key. Blank lines are not
rows. The reading of CSV, TSV, JSON Lines and Parquet is ``produce``'s
(``crawlctl.commands.produce``): one row at a time, so a list of any size streams.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from crawlctl.commands.produce import (
    BadRow,
    Columns,
    FeedError,
    Fields,
    Ignored,
    Record,
    no_column,
    plain_value,
    read_parquet_records,
    read_records,
)
from crawlctl.dataset.layout import RESERVED_COLUMNS

INPUT_FORMATS: Final = ("txt", "csv", "tsv", "json", "jsonl", "parquet")


@dataclasses.dataclass(frozen=True, slots=True)
class ListColumns:
    """Which columns a list gives: the URL's, the caption's (None: none) and those kept."""

    url: str = "url"
    caption: str | None = None
    kept: tuple[str, ...] = ()

    def problem(self) -> str | None:
        """Why these columns cannot make a dataset, or None."""
        names = [self.url, *([self.caption] if self.caption else []), *self.kept]
        lowered = [n.lower() for n in names]
        twice = sorted({n for n in names if lowered.count(n.lower()) > 1})
        if twice:
            return f"column(s) {', '.join(twice)} named twice"
        reserved = sorted(n for n in self.kept if n in RESERVED_COLUMNS)
        if reserved:
            return (
                f"--save-additional-columns may not keep {', '.join(reserved)}: the dataset "
                "has fields of those names"
            )
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class ListRow:
    """A row of the list: its URL, caption and kept columns (by their names)."""

    url: str
    caption: str | None
    columns: Mapping[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class FailedRow:
    """A row that cannot be crawled, and why; ``count`` rows (a Parquet row group that
    cannot be read is one item for all its rows). ``url`` is the URL as given, if any."""

    reason: str
    url: str | None = None
    caption: str | None = None
    count: int = 1
    columns: Mapping[str, Any] = dataclasses.field(default_factory=dict)


ListItem = ListRow | FailedRow | Ignored


def read_list(path: Path, fmt: str, columns: ListColumns) -> Iterator[ListItem]:
    """Every row of the list at ``path`` in ``fmt`` (one of INPUT_FORMATS), in file order,
    with an ``Ignored`` for the columns not used; ``FeedError`` when the file as a whole
    cannot be read (no such column, not the format, no row at all)."""
    if fmt not in INPUT_FORMATS:
        raise FeedError(f"unknown input format {fmt!r}; expected one of {', '.join(INPUT_FORMATS)}")
    if fmt == "txt":
        yield from _txt_rows(path)
        return
    if fmt == "json":
        yield from _json_rows(path, columns)
        return
    # A CSV, TSV or Parquet header is matched without case (produce lowers it), a JSON
    # object's names as written.
    fields, names = _fields(columns, exact=fmt == "jsonl")
    check = _header_rule(columns, fields, names)
    with contextlib.ExitStack() as stack:
        if fmt == "parquet":
            records = read_parquet_records(path, fields, check)
        else:
            text = path.open(encoding="utf-8-sig", errors="surrogateescape", newline="")
            records = read_records(stack.enter_context(text), fmt, fields, check)  # type: ignore[arg-type]
        for item in records:
            if isinstance(item, Record):
                yield _row({names[f]: v for f, v in item.values.items()}, columns)
            elif isinstance(item, BadRow):
                yield FailedRow(item.reason, count=item.count)
            else:
                yield item


def parquet_types(path: Path, columns: ListColumns) -> dict[str, Any]:
    """The Arrow types of a Parquet list's kept columns, which the dataset's Parquet files
    keep (a text list's are as its values are)."""
    import pyarrow.parquet as pq

    schema = pq.ParquetFile(path).schema_arrow
    by_lower = {name.lower(): name for name in schema.names}
    found = {}
    for name in columns.kept:
        actual = name if name in schema.names else by_lower.get(name.lower())
        if actual is not None:
            found[name] = schema.field(actual).type
    return found


def _fields(columns: ListColumns, *, exact: bool) -> tuple[Fields, dict[str, str]]:
    """produce's Fields for these columns (lower-cased unless ``exact``), and each field's
    name as the user wrote it."""

    def field(name: str) -> str:
        return name if exact else name.lower()

    names = {field(name): name for name in _wanted(columns)}
    used = ", ".join(names.values())
    # Kept columns may hold anything (a similarity, a date); the URL and caption are text.
    loose = frozenset(field(k) for k in columns.kept)
    return Fields(tuple(names), {}, used, loose=loose), names


def _header_rule(columns: ListColumns, fields: Fields, names: Mapping[str, str]) -> Any:
    def check(found: Columns) -> None:
        url = next(f for f, n in names.items() if n == columns.url)
        if url not in found.used:
            raise no_column(found, repr(columns.url), fields)
        missing = [names[f] for f in fields.names if f not in found.used]
        if missing:
            raise FeedError(f"no column(s) {', '.join(map(repr, missing))}, which were asked for")

    return check


def _row(values: Mapping[str, Any], columns: ListColumns) -> ListRow | FailedRow:
    url = values.get(columns.url)
    caption = values.get(columns.caption) if columns.caption else None
    if caption is not None and not isinstance(caption, str):
        caption = str(caption)
    kept = {name: plain_value(values.get(name)) for name in columns.kept}
    if url is None or (isinstance(url, str) and not url.strip()):
        return FailedRow("no url", caption=caption, columns=kept)
    if not isinstance(url, str):
        return FailedRow(f"the url is not text: {url!r}", caption=caption, columns=kept)
    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        reason = f"not an http(s) URL: {url[:200]!r}"
        return FailedRow(reason, url=url, caption=caption, columns=kept)
    return ListRow(url, caption, kept)


def _txt_rows(path: Path) -> Iterator[ListItem]:
    empty = True
    with path.open(encoding="utf-8-sig", errors="surrogateescape") as text:
        for line in text:
            if not line.strip():
                continue
            empty = False
            yield _row({"url": line.strip()}, ListColumns())
    if empty:
        raise FeedError("empty: no rows")


def _json_rows(path: Path, columns: ListColumns) -> Iterator[ListItem]:
    try:
        value = json.loads(path.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FeedError(f"not a JSON file: {e}") from None
    if not isinstance(value, list) or not value:
        raise FeedError("a json list is a non-empty array of objects (jsonl: one a line)")
    by_lower = _json_names(value, columns)
    if columns.url.lower() not in by_lower:
        raise FeedError(f"no {columns.url!r} field in the first object")
    for obj in value:
        if not isinstance(obj, dict):
            yield FailedRow(f"not a JSON object but {type(obj).__name__}")
            continue
        wanted = {name: obj.get(by_lower.get(name.lower(), name)) for name in _wanted(columns)}
        yield _row(wanted, columns)


def _wanted(columns: ListColumns) -> Sequence[str]:
    return [columns.url, *([columns.caption] if columns.caption else []), *columns.kept]


def _json_names(rows: Sequence[Any], columns: ListColumns) -> dict[str, str]:
    first = next((r for r in rows if isinstance(r, dict)), {})
    names = {}
    for name in _wanted(columns):
        actual = (
            name if name in first else next((k for k in first if k.lower() == name.lower()), None)
        )
        if actual is not None:
            names[name.lower()] = actual
    return names
