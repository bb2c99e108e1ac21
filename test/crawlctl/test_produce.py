"""Reading a feed file into inbound messages: formats, validation, line numbers."""

from __future__ import annotations

import io
import itertools
from pathlib import Path

import pytest

from crawlctl.commands.produce import BadRow, FeedError, GoodRow, count_lines, format_of, read_rows
from image_crawler.contract import InboundImage


def rows(text: str, fmt: str = "jsonl", source: str | None = None) -> list[GoodRow | BadRow]:
    counter = itertools.count(1)
    return list(
        read_rows(
            io.StringIO(text),
            fmt,  # type: ignore[arg-type]
            default_source=source,
            new_uuid=lambda: f"generated-{next(counter)}",
        )
    )


def image(url: str, uuid: str, source: str) -> InboundImage:
    return InboundImage(url=url, uuid=uuid, source=source)


@pytest.mark.parametrize(
    ("name", "explicit", "fmt"),
    [
        ("a.jsonl", None, "jsonl"),
        ("a.NDJSON", None, "jsonl"),
        ("a.json", None, "jsonl"),
        ("a.csv", None, "csv"),
        ("a.tsv", None, "tsv"),
        ("a.tab", None, "tsv"),
        ("a.txt", "csv", "csv"),
        ("a.csv", "tsv", "tsv"),
    ],
)
def test_format_by_extension_or_explicit(name: str, explicit: str | None, fmt: str) -> None:
    assert format_of(Path(name), explicit) == fmt


def test_an_unknown_extension_asks_for_format() -> None:
    with pytest.raises(FeedError, match="--format"):
        format_of(Path("urls.txt"))
    with pytest.raises(FeedError, match="unknown format 'xml'"):
        format_of(Path("urls.csv"), "xml")


def test_jsonl_rows_with_generated_uuid_and_default_source() -> None:
    text = (
        '{"url": "https://a.example/1.jpg", "uuid": "u1", "source": "flickr"}\n'
        "\n"  # blank lines are skipped, but counted
        '{"url": "https://a.example/2.jpg", "source": "met"}\n'
        '{"url": "https://a.example/3.jpg", "uuid": "u3"}\n'
    )
    assert rows(text, source="fallback") == [
        GoodRow(1, image("https://a.example/1.jpg", "u1", "flickr")),
        GoodRow(3, image("https://a.example/2.jpg", "generated-1", "met"), generated_uuid=True),
        GoodRow(4, image("https://a.example/3.jpg", "u3", "fallback")),
    ]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"uuid": "u", "source": "s"}', "missing url"),
        ('{"url": "", "uuid": "u", "source": "s"}', "missing url"),
        ('{"url": 5, "uuid": "u", "source": "s"}', "url is not a string: 5"),
        ('{"url": "ftp://x/a.jpg", "uuid": "u", "source": "s"}', "not an http(s) URL"),
        ('{"url": "http:///a.jpg", "uuid": "u", "source": "s"}', "not an http(s) URL"),
        ('{"url": "http://x/a.jpg", "uuid": 7, "source": "s"}', "uuid is not a string: 7"),
        ('{"url": "http://x/a.jpg", "uuid": "u"}', "missing source"),
        ('{"url": "http://x/a.jpg", "uuid": "u", "source": "has space"}', "invalid source name"),
        ('{"url": "http://x/a.jpg", "uuid": "u", "source": "é"}', "invalid source name"),
        ('{"url": "http://x/a.jpg", "uuid": "u", "source": "s", "title": "t"}', "unknown field"),
        ('{"url": "http://x/a.jpg", "uuid": "u", "source": "s", "attempts": 1}', "unknown field"),
        ('{"url": "http://x/a.jpg", "uuid": "u", "source": "s"', "not JSON"),
        ('["http://x/a.jpg", "u", "s"]', "not a JSON object but list"),
        ("null", "not a JSON object but NoneType"),
    ],
)
def test_bad_jsonl_lines_are_reported_by_line_number(line: str, reason: str) -> None:
    good = '{"url": "http://x/ok.jpg", "uuid": "ok", "source": "s"}'
    result = rows(f"{good}\n\n{line}\n{good}\n")
    assert [type(r) for r in result] == [GoodRow, BadRow, GoodRow]
    bad = result[1]
    assert isinstance(bad, BadRow) and bad.line == 3
    assert reason in bad.reason
    assert str(bad).startswith("line 3: ")


def test_csv_with_header_in_any_order_and_quoting() -> None:
    text = (
        "source,URL,uuid\n"
        'flickr,"https://a.example/x,y.jpg",u1\n'
        "\n"
        "met,https://a.example/2.jpg,\n"
        ",https://a.example/3.jpg,u3\n"
    )
    assert rows(text, "csv", source="fallback") == [
        GoodRow(2, image("https://a.example/x,y.jpg", "u1", "flickr")),
        GoodRow(4, image("https://a.example/2.jpg", "generated-1", "met"), generated_uuid=True),
        GoodRow(5, image("https://a.example/3.jpg", "u3", "fallback")),
    ]


def test_tsv_and_its_bad_rows() -> None:
    text = (
        "url\tuuid\tsource\n"
        "https://a.example/1.jpg\tu1\tnasa\n"
        "\tu2\tnasa\n"
        "https://a.example/3.jpg\tu3\tno/slash\n"
        "https://a.example/4.jpg\tu4\n"
        "https://a.example/5.jpg\tu5\tnasa\textra\n"
    )
    result = rows(text, "tsv")
    assert result[0] == GoodRow(2, image("https://a.example/1.jpg", "u1", "nasa"))
    assert [(r.line, r.reason.split(" (")[0]) for r in result[1:] if isinstance(r, BadRow)] == [
        (3, "missing url"),
        (4, "invalid source name 'no/slash'"),
        (5, "2 fields, but the header"),
        (6, "4 fields, but the header"),
    ]


@pytest.mark.parametrize(
    ("text", "source", "message"),
    [
        ("link,uuid,source\nhttp://x/a.jpg,u,s\n", None, "line 1: unknown column(s) 'link'"),
        ("url,uuid,source,title\nhttp://x/a.jpg,u,s,t\n", None, "unknown column(s) 'title'"),
        ("uuid,source\nu,s\n", None, "line 1: the header has no url column"),
        ("url,uuid\nhttp://x/a.jpg,u\n", None, "no source column; give --source"),
        ("url,url,source\na,b,c\n", None, "column(s) url given twice"),
        ("\n\nfoo,url\n", None, "line 3: unknown column(s) 'foo'"),
    ],
)
def test_a_bad_header_is_an_error_for_the_whole_file(
    text: str, source: str | None, message: str
) -> None:
    with pytest.raises(FeedError) as caught:
        rows(text, "csv", source)
    assert message in str(caught.value)


def test_a_header_without_source_is_fine_with_a_default_source() -> None:
    assert rows("url\nhttp://x/a.jpg\n", "csv", source="s") == [
        GoodRow(2, image("http://x/a.jpg", "generated-1", "s"), generated_uuid=True)
    ]


@pytest.mark.parametrize(
    ("text", "fmt"), [("", "jsonl"), ("\n \n", "jsonl"), ("", "csv"), ("url,uuid,source\n", "csv")]
)
def test_a_file_without_rows_is_an_error(text: str, fmt: str) -> None:
    with pytest.raises(FeedError, match="empty: no rows"):
        rows(text, fmt)


def test_bytes_that_are_not_utf8_make_a_bad_row(tmp_path: Path) -> None:
    path = tmp_path / "feed.jsonl"
    path.write_bytes(
        b'{"url": "http://x/\xff.jpg", "uuid": "u", "source": "s"}\n'
        b'{"url": "http://x/ok.jpg", "uuid": "v", "source": "s"}\n'
    )
    with path.open(encoding="utf-8-sig", errors="surrogateescape", newline="") as text:
        result = list(read_rows(text, "jsonl"))
    assert result == [
        BadRow(1, "not valid UTF-8"),
        GoodRow(2, image("http://x/ok.jpg", "v", "s")),
    ]


def test_count_lines(tmp_path: Path) -> None:
    for content, expected in [(b"", 0), (b"a", 1), (b"a\n", 1), (b"a\nb", 2), (b"\n\n", 2)]:
        path = tmp_path / "f"
        path.write_bytes(content)
        assert count_lines(path) == expected, content
