"""Turning an earlier crawl's output into re-checks: reading and judging rows (JSON Lines,
CSV, TSV, Parquet; hostile validators), the join with the feed, the last message of a
uuid, ``--older-than`` and ``--checks``; and the command against a real broker, its
messages read back with the contract's decoder."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from crawlctl import cli
from crawlctl.commands.produce import (
    FEED,
    BadRow,
    FeedError,
    Ignored,
    Skipped,
    open_records,
    read_parquet_records,
    read_records,
)
from crawlctl.commands.recheck import (
    CHECKS,
    EXIF,
    NOTHING_TO_CHECK,
    RECENT,
    RECHECK,
    SUPERSEDED,
    FeedEntry,
    Recheck,
    RecheckItem,
    Rules,
    Selection,
    checks_header,
    feed_rows,
    is_due,
    joined_feed_header,
    latest_only,
    load_checks,
    load_feed,
    mark_latest,
    parse_time,
    recheck_header,
    recheck_items,
)
from image_crawler.contract import (
    INBOUND_TOPIC,
    MAX_VALIDATOR_CHARS,
    Earlier,
    InboundImage,
    LinkCheckMessage,
    ResolutionMessage,
)
from test.crawlctl.test_cli import everything_in
from test.harness.services import LOOPBACK, KafkaBroker, free_port

SHA = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
LAST_MODIFIED = "Wed, 21 Oct 2015 07:28:00 GMT"
HEADER_VALUE = (
    f"is not a header value (a non-empty string of at most {MAX_VALIDATOR_CHARS} printable "
    "Latin-1 characters)"
)


def items(
    text: str,
    fmt: str = "jsonl",
    *,
    feed: Mapping[str, FeedEntry] | None = None,
    source: str | None = None,
    dated: bool = False,
) -> list[RecheckItem]:
    rules = Rules(default_source=source, feed=feed, dated=dated)
    records = read_records(io.StringIO(text), fmt, RECHECK, recheck_header(rules))  # type: ignore[arg-type]
    return list(recheck_items(records, rules))


def jsonl(*objects: Mapping[str, Any]) -> str:
    return "".join(json.dumps(o) + "\n" for o in objects)


def recheck(
    line: int, url: str, uuid: str, source: str, *, added_scheme: bool = False,
    checked_at: datetime | None = None, **earlier: str,
) -> Recheck:  # fmt: skip
    image = InboundImage(url, uuid, source, earlier=Earlier(**earlier))
    return Recheck(line, image, added_scheme=added_scheme, checked_at=checked_at)


def resolution(uuid: str, **extra: Any) -> dict[str, Any]:
    """A resolution message as ``up`` archives it."""
    message = ResolutionMessage(uuid, 640, 480, 1234, 90, sha256=SHA, phash="c3c3c3c3c3c3c3c3")
    return {**json.loads(message.to_json()), **extra}


def exif(uuid: str) -> dict[str, Any]:
    return {"identifier": uuid, "exif": {"0x13b": "Alden Page", "0x9209": 0}}


# --- dates --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2025-01-01", datetime(2025, 1, 1, tzinfo=UTC)),
        ("2025-01-01T12:30:00", datetime(2025, 1, 1, 12, 30, tzinfo=UTC)),
        ("2025-01-01 12:30", datetime(2025, 1, 1, 12, 30, tzinfo=UTC)),
        ("2025-01-01T12:30:00Z", datetime(2025, 1, 1, 12, 30, tzinfo=UTC)),
        # A link_checks message's time, as utc_now_iso writes it.
        ("2025-01-01T12:30:00.123456+00:00", datetime(2025, 1, 1, 12, 30, 0, 123456, tzinfo=UTC)),
        ("2025-01-01T14:30:00+02:00", datetime(2025, 1, 1, 12, 30, tzinfo=UTC)),
        (" 2025-01-01 ", datetime(2025, 1, 1, tzinfo=UTC)),
        # Parquet timestamps and dates, as pyarrow gives them.
        (datetime(2025, 1, 1, 12, 30), datetime(2025, 1, 1, 12, 30, tzinfo=UTC)),
        (datetime(2025, 1, 1, 12, tzinfo=timezone(timedelta(hours=-5))),
         datetime(2025, 1, 1, 17, tzinfo=UTC)),
        (date(2025, 1, 1), datetime(2025, 1, 1, tzinfo=UTC)),
    ],
)  # fmt: skip
def test_parse_time(value: Any, expected: datetime) -> None:
    parsed = parse_time(value)
    assert parsed == expected
    assert parsed.tzinfo is not None


@pytest.mark.parametrize("value", ["yesterday", "", "01/02/2025", "2025-13-01", 1735689600, None])
def test_parse_time_refuses_what_is_not_iso_8601(value: Any) -> None:
    with pytest.raises(ValueError):
        parse_time(value)


DATE = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("checked_at", "due"),
    [
        (None, True),  # never checked
        (DATE - timedelta(days=30), True),
        (DATE - timedelta(microseconds=1), True),
        (DATE, False),  # at DATE: checked since
        (DATE + timedelta(days=1), False),
    ],
)
def test_is_due(checked_at: datetime | None, due: bool) -> None:
    assert is_due(checked_at, DATE) is due


# --- rows -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"url": "https://a.example/1.jpg", "uuid": "u", "source": "s", "etag": '"v1"'},
         recheck(1, "https://a.example/1.jpg", "u", "s", etag='"v1"')),
        ({"url": "https://a.example/1.jpg", "identifier": "u", "source": "s",
          "last_modified": LAST_MODIFIED},
         recheck(1, "https://a.example/1.jpg", "u", "s", last_modified=LAST_MODIFIED)),
        ({"url": "https://a.example/1.jpg", "uuid": "u", "source": "s", "sha256": SHA.upper()},
         recheck(1, "https://a.example/1.jpg", "u", "s", sha256=SHA)),
        ({"url": "a.example/1.jpg", "uuid": " u ", "source": "s", "etag": ' W/"v1" ',
          "last_modified": LAST_MODIFIED, "sha256": SHA},
         recheck(1, "http://a.example/1.jpg", "u", "s", added_scheme=True, etag='W/"v1"',
                 last_modified=LAST_MODIFIED, sha256=SHA)),
        # A blank or null validator is a missing one; the others make the re-check.
        ({"url": "https://a.example/1.jpg", "uuid": "u", "source": "s", "etag": "",
          "last_modified": None, "sha256": SHA},
         recheck(1, "https://a.example/1.jpg", "u", "s", sha256=SHA)),
        # Latin-1 is what a header may carry.
        ({"url": "https://a.example/1.jpg", "uuid": "u", "source": "s", "etag": '"caf\u00e9"'},
         recheck(1, "https://a.example/1.jpg", "u", "s", etag='"caf\u00e9"')),
    ],
)  # fmt: skip
def test_good_rows(row: dict[str, Any], expected: Recheck) -> None:
    assert items(jsonl(row)) == [expected]


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"url": "https://a.example/1.jpg", "source": "s", "etag": "e"},
         "missing uuid (a re-check needs the earlier crawl's)"),
        ({"url": "https://a.example/1.jpg", "uuid": " ", "source": "s", "etag": "e"},
         "missing uuid (a re-check needs the earlier crawl's)"),
        ({"url": "https://a.example/1.jpg", "uuid": 7, "source": "s", "etag": "e"},
         "uuid is not a string: 7 (a re-check needs the earlier crawl's)"),
        ({"url": "https://a.example/1.jpg", "uuid": "u", "source": "s"}, NOTHING_TO_CHECK),
        ({"url": "https://a.example/1.jpg", "uuid": "u", "source": "s", "etag": " ",
          "sha256": None}, NOTHING_TO_CHECK),
        # Hostile validators: they go into request headers.
        ({"url": "https://a.example/1.jpg", "uuid": "u", "source": "s",
          "etag": '"v1"\r\nX-Injected: 1'}, f"field 'etag' {HEADER_VALUE}"),
        ({"url": "https://a.example/1.jpg", "uuid": "u", "source": "s",
          "last_modified": "Wed\n"}, f"field 'last_modified' {HEADER_VALUE}"),
        ({"url": "https://a.example/1.jpg", "uuid": "u", "source": "s", "etag": "\x00"},
         f"field 'etag' {HEADER_VALUE}"),
        ({"url": "https://a.example/1.jpg", "uuid": "u", "source": "s", "etag": "\u20ac"},
         f"field 'etag' {HEADER_VALUE}"),
        ({"url": "https://a.example/1.jpg", "uuid": "u", "source": "s", "etag": 5},
         f"field 'etag' {HEADER_VALUE}"),
        ({"url": "https://a.example/1.jpg", "uuid": "u", "source": "s",
          "etag": "x" * (MAX_VALIDATOR_CHARS + 1)}, f"field 'etag' {HEADER_VALUE}"),
        ({"url": "https://a.example/1.jpg", "uuid": "u", "source": "s", "sha256": "z" * 64},
         "field 'sha256' is not 64 hex digits"),
        ({"url": "https://a.example/1.jpg", "uuid": "u", "source": "s", "sha256": SHA[:-1]},
         "field 'sha256' is not 64 hex digits"),
        ({"url": "https://a.example/1.jpg", "uuid": "u", "source": "s", "sha256": 12},
         "field 'sha256' is not 64 hex digits"),
        # What produce refuses, recheck refuses.
        ({"uuid": "u", "source": "s", "etag": "e"}, "missing url (give the field, or --urls FEED)"),
        ({"url": " ", "uuid": "u", "source": "s", "etag": "e"}, "missing url (give the field, "),
        ({"url": "ftp://a.example/1.jpg", "uuid": "u", "source": "s", "etag": "e"},
         "url is not an http(s) URL: 'ftp://a.example/1.jpg'"),
        ({"url": "https://a.example/1.jpg", "uuid": "u", "etag": "e"},
         "missing source (give the field, or --source)"),
        ({"url": "https://a.example/1.jpg", "uuid": "u", "source": "a/b", "etag": "e"},
         "invalid source name 'a/b'"),
    ],
)  # fmt: skip
def test_bad_rows_are_reported_by_line_number(row: dict[str, Any], reason: str) -> None:
    good = {"url": "https://a.example/ok.jpg", "uuid": "ok", "source": "s", "etag": "e"}
    result = items(jsonl(good) + "\n" + jsonl(row, good))
    assert [type(r) for r in result] == [Recheck, BadRow, Recheck]
    bad = result[1]
    assert isinstance(bad, BadRow) and bad.line == 3
    assert str(bad).startswith(f"line 3: {reason}")


def test_a_hostile_value_is_not_echoed_whole() -> None:
    huge = "x" * 10_240  # a 10 KB etag, and a uuid and time to match
    result = items(
        jsonl(
            {"url": "https://a.example/1.jpg", "uuid": "u", "source": "s", "etag": huge},
            {"url": "https://a.example/1.jpg", "uuid": [huge], "source": "s", "etag": "e"},
            {"url": "https://a.example/1.jpg", "uuid": "u", "source": "s", "etag": "e",
             "checked_at": huge},
            {"identifier": huge, "etag": "e"},
        ),
        feed={},
        dated=True,
    )  # fmt: skip
    assert all(isinstance(r, BadRow) for r in result)
    assert [len(str(r)) < 200 for r in result] == [True] * 4, [str(r)[:300] for r in result]
    shown = f"... ({len(repr([huge]))} chars) (a re-check needs the earlier crawl's)"
    assert str(result[1]).endswith(shown)
    assert str(result[2]).startswith("line 3: checked_at is not an ISO 8601 date or time: 'xxx")
    assert str(result[3]).startswith("line 4: uuid 'xxx")
    assert str(result[3]).endswith("chars) is not in the --urls feed")


def test_exif_messages_are_skipped_and_their_fields_are_not_reported() -> None:
    text = jsonl(
        resolution("u1", url="https://a.example/1.jpg", source="s", etag='"v1"'),
        exif("u1"),
        # A row with an exif field and a validator is a re-check all the same.
        {**exif("u2"), "url": "https://a.example/2.jpg", "source": "s", "etag": '"v2"'},
        {**resolution("u3", url="https://a.example/3.jpg", source="s"), "opt_outs": ["noai"],
         "tdm_policy": "https://a.example/tdm.json", "title": "an unknown field"},
    )  # fmt: skip
    assert items(text) == [
        recheck(1, "https://a.example/1.jpg", "u1", "s", etag='"v1"', sha256=SHA),
        Skipped(2, EXIF),
        recheck(3, "https://a.example/2.jpg", "u2", "s", etag='"v2"'),
        # The resolution message's own fields are known: only the unknown one is named.
        Ignored(4, ("title",), kind="field", used=RECHECK.used),
        recheck(4, "https://a.example/3.jpg", "u3", "s", sha256=SHA),
    ]


def test_csv_and_tsv_with_blank_and_null_validators() -> None:
    csv_text = (
        "identifier,url,source,etag,last_modified,sha256,title\n"
        f'u1,https://a.example/1.jpg,s,"""v1""",,{SHA},"a, title"\n'
        f'u2,https://a.example/2.jpg,s,,"{LAST_MODIFIED}",,t\n'
        "u3,https://a.example/3.jpg,s,,,,t\n"
    )
    assert items(csv_text, "csv") == [
        Ignored(1, ("title",), used=RECHECK.used),
        recheck(2, "https://a.example/1.jpg", "u1", "s", etag='"v1"', sha256=SHA),
        recheck(3, "https://a.example/2.jpg", "u2", "s", last_modified=LAST_MODIFIED),
        BadRow(4, NOTHING_TO_CHECK),
    ]
    tsv_text = (
        "url\tuuid\tetag\tsha256\n"
        "https://a.example/1.jpg\tu1\t\\N\t" + SHA + "\n"
        "https://a.example/2.jpg\tu2\t\\N\t\\N\n"
    )
    assert items(tsv_text, "tsv", source="nasa") == [
        recheck(2, "https://a.example/1.jpg", "u1", "nasa", sha256=SHA),
        BadRow(3, NOTHING_TO_CHECK),
    ]


@pytest.mark.parametrize(
    ("header", "joined", "source", "message"),
    [
        ("url,source,etag", False, None,
         "line 1: no uuid column; the columns used are url, uuid (or identifier), source, "
         "etag, last_modified, sha256, checked_at (or time, last_checked)"),
        ("url,id,source,etag", False, None, "unknown column(s) 'id' and no uuid column"),
        # A link_checks archive as FILE: nothing to re-check against.
        ("identifier,url,status,http_status,time", False, None,
         f"line 1: no etag, last_modified or sha256 column: {NOTHING_TO_CHECK}"),
        ("uuid,source,etag", False, None, "no url column; the columns used are url, uuid "),
        ("uuid,source,etag", False, None, "; or give --urls FEED"),
        ("uuid,url,etag", False, None, "no source column; give --source, or --urls FEED"),
        ("uuid,etag,etag", True, None, "column(s) etag given twice"),
    ],
)  # fmt: skip
def test_a_header_that_cannot_feed_re_checks(
    header: str, joined: bool, source: str | None, message: str
) -> None:
    with pytest.raises(FeedError) as caught:
        items(f"{header}\n", "csv", feed={} if joined else None, source=source)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("header", "joined", "source"),
    [("uuid,url,etag", False, "s"), ("uuid,etag", True, None), ("uuid,sha256", True, None)],
)
def test_a_header_that_can_feed_re_checks(header: str, joined: bool, source: str | None) -> None:
    with pytest.raises(FeedError, match="empty: no rows to send"):
        items(f"{header}\n", "csv", feed={} if joined else None, source=source)


# --- the join with the feed ---------------------------------------------------------------------


def feed_of(text: str, fmt: str = "jsonl", source: str | None = None) -> dict[str, FeedEntry]:
    bad: list[BadRow] = []
    records = read_records(io.StringIO(text), fmt, FEED, joined_feed_header(source))  # type: ignore[arg-type]
    feed = load_feed(feed_rows(records, source), bad.append)
    assert bad == []
    return feed


def test_the_feed_by_uuid_as_produce_judged_it() -> None:
    text = (
        "url\tidentifier\tsource\n"
        "https://images.example/1.jpg\tu1\tflickr\n"
        "images.example/2.jpg\tu2\t\\N\n"
        "\tu3\tflickr\n"
        "https://images.example/4.jpg\t\\N\tflickr\n"
        "https://images.example/5.jpg\tu1\tmet\n"  # a uuid fed twice: the last row wins
    )
    bad: list[BadRow] = []
    records = read_records(io.StringIO(text), "tsv", FEED, joined_feed_header("met"))
    feed = load_feed(feed_rows(records, "met"), bad.append)
    assert feed == {
        "u1": FeedEntry("https://images.example/5.jpg", "met"),
        "u2": FeedEntry("http://images.example/2.jpg", "met"),
    }
    assert bad == [BadRow(4, "missing url"), BadRow(5, "missing uuid: nothing to join on")]
    assert feed["u1"].source is feed["u2"].source  # one string per source


def test_a_feed_without_uuid_column_cannot_be_joined() -> None:
    with pytest.raises(FeedError, match="line 1: no uuid \\(or identifier\\) column"):
        feed_of("url,source\nhttps://a.example/1.jpg,s\n", "csv")


def test_metadata_rows_take_url_and_source_from_the_feed() -> None:
    feed = feed_of(
        jsonl(
            {"url": "https://a.example/1.jpg", "uuid": "u1", "source": "flickr"},
            {"url": "https://a.example/2.jpg", "uuid": "u2", "source": "met"},
        )
    )
    text = jsonl(
        resolution("u1", etag='"v1"', last_modified=LAST_MODIFIED),
        exif("u1"),
        resolution("u9"),  # not in the feed
        {"identifier": "u2", "sha256": SHA, "url": "https://b.example/2.jpg"},  # its own url
        {"identifier": "u2", "etag": "e", "source": "nasa"},  # its own source
        {"identifier": "u9", "etag": "e", "url": "https://b.example/9.jpg", "source": "s"},
        {"identifier": "u8", "etag": "e", "url": "https://b.example/8.jpg"},  # no source
    )
    assert items(text, feed=feed) == [
        recheck(1, "https://a.example/1.jpg", "u1", "flickr", etag='"v1"',
                last_modified=LAST_MODIFIED, sha256=SHA),
        Skipped(2, EXIF),
        BadRow(3, "uuid 'u9' is not in the --urls feed"),
        recheck(4, "https://b.example/2.jpg", "u2", "met", sha256=SHA),
        recheck(5, "https://a.example/2.jpg", "u2", "nasa", etag="e"),
        recheck(6, "https://b.example/9.jpg", "u9", "s", etag="e"),
        BadRow(7, "missing source (give the field, or --source)"),
    ]  # fmt: skip
    assert items(text, feed=feed, source="fallback")[-1] == recheck(
        7, "https://b.example/8.jpg", "u8", "fallback", etag="e"
    )


def two_passes(text: str, feed: dict[str, FeedEntry]) -> list[RecheckItem]:
    rules = Rules(feed=feed)

    def read() -> Iterable[RecheckItem]:
        return recheck_items(
            read_records(io.StringIO(text), "jsonl", RECHECK, lambda c: None), rules
        )

    mark_latest(read(), feed)
    return list(latest_only(read(), feed))


def test_the_last_resolution_message_of_a_uuid_wins() -> None:
    feed = feed_of(
        jsonl(*({"url": f"https://a.example/{i}.jpg", "uuid": f"u{i}", "source": "s"}
                for i in range(1, 4)))
    )  # fmt: skip
    text = jsonl(
        resolution("u1", etag='"old"'),
        resolution("u2", etag='"v2"'),
        exif("u1"),
        resolution("u1", etag='"new"'),  # a later crawl of u1
        resolution("u2", etag='"v2"'),  # at-least-once: the same message again
        resolution("u3", etag='"v3"'),
        {"identifier": "u3", "etag": '"v3"\r\nX: 1'},  # a bad row never supersedes a good one
        {"identifier": "u1", "width": 1},  # nor does a row with nothing to check against
    )
    assert two_passes(text, feed) == [
        Skipped(1, SUPERSEDED),
        Skipped(2, SUPERSEDED),
        Skipped(3, EXIF),
        recheck(4, "https://a.example/1.jpg", "u1", "s", etag='"new"', sha256=SHA),
        recheck(5, "https://a.example/2.jpg", "u2", "s", etag='"v2"', sha256=SHA),
        recheck(6, "https://a.example/3.jpg", "u3", "s", etag='"v3"', sha256=SHA),
        BadRow(7, f"field 'etag' {HEADER_VALUE}"),
        BadRow(8, NOTHING_TO_CHECK),
    ]


def test_a_join_of_a_few_thousand_rows() -> None:
    feed = feed_of(
        jsonl(*({"url": f"https://a.example/{i}.jpg", "uuid": f"u{i}", "source": f"s{i % 7}"}
                for i in range(3000)))
    )  # fmt: skip
    # Every image crawled once, a third of them twice (the later etag wins), every fifth
    # with an EXIF message, and 100 uuids the feed never had.
    messages = [resolution(f"u{i}", etag=f'"a{i}"') for i in range(3000)]
    messages += [exif(f"u{i}") for i in range(0, 3000, 5)]
    messages += [resolution(f"u{i}", etag=f'"b{i}"') for i in range(0, 3000, 3)]
    messages += [resolution(f"x{i}") for i in range(100)]
    result = two_passes(jsonl(*messages), feed)
    sent = [r for r in result if isinstance(r, Recheck)]
    assert len(sent) == 3000
    assert len({r.image.uuid for r in sent}) == 3000
    by_uuid = {r.image.uuid: r.image for r in sent}
    assert by_uuid["u3"] == InboundImage(
        "https://a.example/3.jpg", "u3", "s3", earlier=Earlier(etag='"b3"', sha256=SHA)
    )
    assert by_uuid["u4"].earlier == Earlier(etag='"a4"', sha256=SHA)
    skipped = [r.reason for r in result if isinstance(r, Skipped)]
    assert (skipped.count(EXIF), skipped.count(SUPERSEDED)) == (600, 1000)
    bad = [r for r in result if isinstance(r, BadRow)]
    assert [r.line for r in bad] == list(range(4601, 4701))
    assert str(bad[0]) == "line 4601: uuid 'x0' is not in the --urls feed"


# --- --older-than and --checks ------------------------------------------------------------------


def selected(
    text: str, older_than: datetime, checks: Mapping[str, datetime] | None = None
) -> tuple[list[RecheckItem], Selection]:
    selection = Selection(older_than, checks or {})
    return list(selection.select(items(text, dated=True))), selection


def test_older_than_selects_by_the_rows_own_time_and_the_checks() -> None:
    def row(uuid: str, **extra: str) -> dict[str, str]:
        return {"url": f"https://a.example/{uuid}.jpg", "uuid": uuid, "source": "s", "etag": "e",
                **extra}  # fmt: skip

    text = jsonl(
        row("old", checked_at="2024-06-01"),
        row("recent", time="2025-02-01T00:00:00+00:00"),  # link_checks' name for it
        row("exactly", last_checked="2025-01-01T00:00:00Z"),
        row("never"),
        row("offset", checked_at="2025-01-01T01:00:00+02:00"),  # 2024-12-31T23:00Z
        row("by-checks"),
        row("both", checked_at="2024-01-01"),  # the latest of the two counts
        row("bad", checked_at="last tuesday"),
    )
    checks = {"by-checks": DATE + timedelta(days=3), "both": DATE + timedelta(days=1)}
    result, selection = selected(text, DATE, checks)
    assert [(r.line, r.image.uuid) for r in result if isinstance(r, Recheck)] == [
        (1, "old"),
        (4, "never"),
        (5, "offset"),
    ]
    assert [r for r in result if isinstance(r, Skipped)] == [
        Skipped(2, RECENT), Skipped(3, RECENT), Skipped(6, RECENT), Skipped(7, RECENT)
    ]  # fmt: skip
    assert [str(r) for r in result if isinstance(r, BadRow)] == [
        "line 8: checked_at is not an ISO 8601 date or time: 'last tuesday'"
    ]
    assert selection.dated == 6


def test_older_than_on_rows_that_do_not_say_selects_everything() -> None:
    text = jsonl(*({"url": f"https://a.example/{i}.jpg", "uuid": f"u{i}", "source": "s",
                    "sha256": SHA} for i in range(3)))  # fmt: skip
    result, selection = selected(text, DATE)
    assert [type(r) for r in result] == [Recheck] * 3
    assert selection.dated == 0


def test_checked_at_is_not_read_without_older_than() -> None:
    row = {"url": "https://a.example/1.jpg", "uuid": "u", "source": "s", "etag": "e",
           "checked_at": "not a date"}  # fmt: skip
    assert items(jsonl(row)) == [recheck(1, "https://a.example/1.jpg", "u", "s", etag="e")]


def test_a_link_checks_archive_is_no_file_to_re_check() -> None:
    """Its messages say when, not what the file was: every row is a re-check of nothing
    (its file goes to --checks)."""
    feed = feed_of(jsonl({"url": "https://a.example/1.jpg", "uuid": "u1", "source": "s"}))
    message = LinkCheckMessage("u1", "https://a.example/1.jpg", "unchanged", 304, "2025-01-01")
    text = jsonl(json.loads(message.to_json()))
    assert items(text, feed=feed) == [
        Ignored(1, ("status", "http_status"), kind="field", used=RECHECK.used),
        BadRow(1, NOTHING_TO_CHECK),
    ]


def test_checks_from_a_link_checks_archive() -> None:
    def check(uuid: str, status: str, time: str) -> dict[str, Any]:
        return json.loads(LinkCheckMessage(uuid, "https://a.example/1.jpg", status, 304, time)
                          .to_json())  # fmt: skip

    text = (
        jsonl(
            check("u1", "unchanged", "2025-01-02T00:00:00+00:00"),
            check("u1", "changed", "2025-01-05T00:00:00+00:00"),
            check("u1", "unchanged", "2025-01-03T00:00:00+00:00"),  # out of order: the latest wins
            check("u2", "failed", "2025-01-09T00:00:00+00:00"),  # learned nothing
            check("u3", "gone", "2025-01-04T00:00:00+00:00"),
            check("u4", "unchanged", "2025-01-04T00:00:00+00:00"),
            {"identifier": "u5", "status": "unchanged", "time": "soon"},
            {"identifier": "u6", "status": "unchanged"},
            {"status": "unchanged", "time": "2025-01-04"},
        )
        + "not json\n"
    )
    bad: list[BadRow] = []
    records = read_records(io.StringIO(text), "jsonl", CHECKS, checks_header)
    checks = load_checks(records, bad.append, wanted=lambda uuid: uuid != "u4")
    assert checks == {
        "u1": datetime(2025, 1, 5, tzinfo=UTC),
        "u3": datetime(2025, 1, 4, tzinfo=UTC),
    }
    assert [str(b) for b in bad] == [
        "line 7: time is not an ISO 8601 date or time: 'soon'",
        "line 8: missing time (or checked_at)",
        "line 9: missing uuid",
        "line 10: not JSON: Expecting value (column 1)",
    ]


def test_a_checks_file_must_say_when() -> None:
    with pytest.raises(FeedError, match="no time \\(or checked_at\\) column"):
        list(read_records(io.StringIO("identifier,status\nu,unchanged\n"), "csv", CHECKS,
                          checks_header))  # fmt: skip


# --- Parquet -------------------------------------------------------------------------------------


def test_parquet_with_timestamps_nulls_and_a_parquet_feed(tmp_path: Path) -> None:
    path = tmp_path / "earlier.parquet"
    pq.write_table(
        pa.table(
            {
                "identifier": ["u1", "u2", "u3", "u4"],
                "etag": pa.array(['"v1"', None, '"v3"\r\n', None], pa.string()),
                "sha256": pa.array([None, SHA, None, None], pa.string()),
                "checked_at": pa.array(
                    [datetime(2024, 1, 1), datetime(2025, 6, 1), None, None],
                    pa.timestamp("us", tz="UTC"),
                ),
                "width": [1, 2, 3, 4],
            }
        ),
        path,
        row_group_size=2,
    )
    feed_path = tmp_path / "feed.parquet"
    pq.write_table(
        pa.table(
            {
                "url": [f"https://a.example/{i}.jpg" for i in range(1, 5)],
                "uuid": [f"u{i}" for i in range(1, 5)],
                "source": ["nasa"] * 4,
            }
        ),
        feed_path,
    )
    bad: list[BadRow] = []
    with contextlib.ExitStack() as stack:
        rule = joined_feed_header(None)
        feed = load_feed(feed_rows(open_records(feed_path, "parquet", FEED, rule, stack), None),
                         bad.append)  # fmt: skip
    assert bad == [] and len(feed) == 4
    rules = Rules(feed=feed, dated=True)
    records = read_parquet_records(path, RECHECK, recheck_header(rules), batch_rows=1)
    selection = Selection(DATE, {})
    result = list(selection.select(recheck_items(records, rules)))
    assert result == [
        recheck(1, "https://a.example/1.jpg", "u1", "nasa", etag='"v1"',
                checked_at=datetime(2024, 1, 1, tzinfo=UTC)),
        Skipped(2, RECENT),
        BadRow(3, f"field 'etag' {HEADER_VALUE}", "row"),
        BadRow(4, NOTHING_TO_CHECK, "row"),
    ]  # fmt: skip
    assert str(result[2]).startswith("row 3: field 'etag' is not a header value")


def test_a_parquet_validator_must_hold_strings(tmp_path: Path) -> None:
    path = tmp_path / "earlier.parquet"
    pq.write_table(pa.table({"uuid": ["u"], "url": ["https://a.example/1.jpg"], "etag": [7]}), path)
    with pytest.raises(FeedError, match="column 'etag' \\(etag\\) holds int64, not strings"):
        read_parquet_records(path, RECHECK, recheck_header(Rules(default_source="s")))


# --- the command ---------------------------------------------------------------------------------


async def recheck_cli(
    capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, list[str], list[str]]:
    code = await asyncio.to_thread(cli.run, ["recheck", *args])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err.splitlines()


async def test_recheck_sends_an_up_archive_joined_with_its_feed(
    kafka: KafkaBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    feed = tmp_path / "urls.tsv"  # what produce was given: the original crawler's TSV
    feed.write_text(
        "url\tidentifier\tsource\n"
        "https://images.example/1.jpg\tu1\tflickr\n"
        "images.example/2.jpg\tu2\tflickr\n"
        "https://images.example/3.jpg\tu3\tmet\n"
        "https://images.example/4.jpg\tu4\tmet\n"
        "\tu5\tmet\n"
    )
    outputs = tmp_path / "outputs"  # as up archives them
    outputs.mkdir()
    metadata = outputs / "image_metadata_updates.jsonl"
    metadata.write_text(
        jsonl(
            resolution("u1", etag='"old"'),
            exif("u1"),
            resolution("u2", last_modified=LAST_MODIFIED),
            resolution("u1", etag='W/"new"', last_modified=LAST_MODIFIED),
            resolution("u3", etag="\r\nX-Injected: 1"),
            resolution("u4"),
            resolution("u9", etag='"v9"'),
        )
    )
    checked = LinkCheckMessage("u4", "https://images.example/4.jpg", "unchanged", 304,
                               "2025-03-01T10:00:00+00:00")  # fmt: skip
    (outputs / "link_checks.jsonl").write_text(checked.to_json().decode() + "\n")
    joined = [str(metadata), "--urls", str(feed), "--kafka", kafka.bootstrap]

    code, out, err = await recheck_cli(capsys, *joined)
    assert code == 1  # bad rows
    assert err == [
        f"{feed}: line 6: missing url",
        f"line 5: field 'etag' {HEADER_VALUE}",
        "line 7: uuid 'u9' is not in the --urls feed",
    ]
    assert out == [
        "sent 3, bad 2, ignored 1, skipped 1 (1 EXIF message(s) ignored; 1 superseded by a "
        f"later row of the same uuid; --urls {feed}: 1 bad)"
    ]

    # Only what was not checked since March: u4 was.
    checks = str(outputs / "link_checks.jsonl")
    code, out, err = await recheck_cli(
        capsys, *joined, "--older-than", "2025-03-01", "--checks", checks
    )
    assert code == 1
    assert out == [
        "sent 2, bad 2, ignored 1, skipped 2 (1 EXIF message(s) ignored; 1 superseded by a "
        "later row of the same uuid; 1 checked since 2025-03-01T00:00:00+00:00, skipped; "
        f"--urls {feed}: 1 bad)"
    ]

    # Without --checks nothing says when: every row is due, and the summary says why.
    code, out, err = await recheck_cli(capsys, *joined, "--older-than", "2025-03-01T12:00+01:00")
    assert out[0].startswith("sent 3, bad 2, ignored 1, skipped 1 (")
    assert out[0].endswith(
        "; --older-than selected every row: the input does not say when rows were checked; "
        f"--urls {feed}: 1 bad)"
    )

    records = await everything_in(kafka.bootstrap, INBOUND_TOPIC)
    assert Counter(r.key for r in records) == {b"u1": 3, b"u2": 3, b"u4": 2}
    sent = {r.key: InboundImage.from_json(r.value) for r in records}
    assert sent == {
        b"u1": InboundImage("https://images.example/1.jpg", "u1", "flickr",
                            earlier=Earlier('W/"new"', LAST_MODIFIED, SHA)),
        b"u2": InboundImage("http://images.example/2.jpg", "u2", "flickr",
                            earlier=Earlier(None, LAST_MODIFIED, SHA)),
        b"u4": InboundImage("https://images.example/4.jpg", "u4", "met",
                            earlier=Earlier(sha256=SHA)),
    }  # fmt: skip
    # A re-check's own fields, as the worker reads them.
    assert {json.loads(r.value)["uuid"]: json.loads(r.value) for r in records}["u1"] == {
        "url": "https://images.example/1.jpg",
        "uuid": "u1",
        "source": "flickr",
        "etag": 'W/"new"',
        "last_modified": LAST_MODIFIED,
        "sha256": SHA,
    }


async def test_recheck_sends_a_self_contained_csv(
    kafka: KafkaBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "earlier.csv"
    path.write_text(
        "identifier,url,etag,sha256,last_checked\n"
        f'c1,https://cat.example/1.jpg,"""x""",{SHA},2024-01-01\n'
        "c2,https://cat.example/2.jpg,,,2024-01-01\n"
        f"c3,cat.example/3.jpg,,{SHA},\n"
        f"c4,https://cat.example/4.jpg,,{SHA},2024-07-01\n"
    )
    code, out, err = await recheck_cli(
        capsys, str(path), "--source", "catalog", "--older-than", "2024-06-01",
        "--kafka", kafka.bootstrap,
    )  # fmt: skip
    assert code == 1
    assert err == [f"line 3: {NOTHING_TO_CHECK}"]
    assert out == [
        "sent 2, bad 1, ignored 0, skipped 1 (1 without a scheme got http://; 1 checked since "
        "2024-06-01T00:00:00+00:00, skipped)"
    ]
    records = await everything_in(kafka.bootstrap, INBOUND_TOPIC)
    sent = sorted((InboundImage.from_json(r.value) for r in records), key=lambda m: m.uuid)
    assert sent == [
        InboundImage("https://cat.example/1.jpg", "c1", "catalog",
                     earlier=Earlier('"x"', None, SHA)),
        InboundImage("http://cat.example/3.jpg", "c3", "catalog", earlier=Earlier(sha256=SHA)),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "content", "args", "message"),
    [
        ("earlier.csv", "uuid,url,source\nu,https://a.example/1.jpg,s\n", [],
         "earlier.csv: line 1: no etag, last_modified or sha256 column"),
        ("earlier.csv", "uuid,url,source,etag,title\n", [], "earlier.csv: empty: no rows to send"),
        ("earlier.jsonl", jsonl(resolution("u1")), ["--urls", "NOFEED"],
         "feed.csv: line 1: no uuid (or identifier) column: nothing to join on"),
    ],
)  # fmt: skip
def test_recheck_judges_its_files_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: str,
    args: list[str], message: str,
) -> None:  # fmt: skip
    path = tmp_path / name
    path.write_text(content)
    (tmp_path / "feed.jsonl").write_text(
        jsonl({"url": "https://a.example/1.jpg", "uuid": "u", "source": "s"})
    )
    (tmp_path / "feed.csv").write_text("url,source\nhttps://a.example/1.jpg,s\n")
    files = {"FEED": str(tmp_path / "feed.jsonl"), "NOFEED": str(tmp_path / "feed.csv")}
    argv = [files.get(arg, arg) for arg in args]
    # Nothing listens there: the files are judged before any connection is tried.
    code = cli.run(["recheck", str(path), *argv, "--kafka", f"{LOOPBACK}:{free_port()}"])
    captured = capsys.readouterr()
    assert code == 1
    assert message in captured.err
    assert captured.out.strip() == "sent 0, bad 0, ignored 0, skipped 0"
