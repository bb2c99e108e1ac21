"""Reading a feed file into inbound messages: formats (the original crawler's TSV, catalog
dumps with more columns, Parquet), validation, line and row numbers; and the command
against a real broker."""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import json
import sys
import uuid as uuidlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from crawlctl import cli
from crawlctl.commands import produce as produce_module
from crawlctl.commands.produce import (
    BadRow,
    FeedError,
    GoodRow,
    Ignored,
    Item,
    add_scheme,
    count_lines,
    format_of,
    read_parquet,
    read_rows,
)
from image_crawler.contract import INBOUND_TOPIC, InboundImage
from test.crawlctl.test_cli import everything_in
from test.harness.services import LOOPBACK, KafkaBroker, free_port


def rows(text: str, fmt: str = "jsonl", source: str | None = None) -> list[Item]:
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
        ("catalog.parquet", None, "parquet"),
        ("catalog.PQ", None, "parquet"),
        ("catalog.bin", "parquet", "parquet"),
    ],
)
def test_format_by_extension_or_explicit(name: str, explicit: str | None, fmt: str) -> None:
    assert format_of(Path(name), explicit) == fmt


def test_an_unknown_extension_asks_for_format() -> None:
    with pytest.raises(FeedError, match=r"--format jsonl\|csv\|tsv\|parquet"):
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
        ('{"url": "/a.jpg", "uuid": "u", "source": "s"}', "not an http(s) URL: '/a.jpg'"),
        ('{"url": "http://x/a.jpg", "uuid": 7, "source": "s"}', "uuid is not a string: 7"),
        ('{"url": "http://x/a.jpg", "uuid": "u"}', "missing source"),
        ('{"url": "http://x/a.jpg", "uuid": "u", "source": "has space"}', "invalid source name"),
        ('{"url": "http://x/a.jpg", "uuid": "u", "source": "é"}', "invalid source name"),
        ('{"url": "http://x/a.jpg", "identifier": 7, "source": "s"}', "uuid is not a string: 7"),
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
        ("link,uuid,source\nhttp://x/a.jpg,u,s\n", None, "line 1: unknown column(s) 'link' and "
         "no url column; the columns used are url, uuid (or identifier), source"),
        ("uuid,source\nu,s\n", None, "line 1: no url column"),
        ("url,uuid\nhttp://x/a.jpg,u\n", None, "no source column; give --source"),
        ("url,url,source\na,b,c\n", None, "column(s) url given twice"),
        ("URL,Identifier,identifier,source\na,b,c,d\n", None, "column(s) identifier given twice"),
        ("\n\nfoo,url\n", None, "line 3: no source column; give --source"),
    ],
)  # fmt: skip
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


# --- the original crawler's TSV and catalog dumps -----------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("example.com/a.jpg", "http://example.com/a.jpg"),
        ("example.com:8080/a.jpg", "http://example.com:8080/a.jpg"),
        ("localhost:8080", "http://localhost:8080"),
        ("//cdn.example/a.jpg", "http://cdn.example/a.jpg"),
        ("a.jpg", "http://a.jpg"),
        ("/a.jpg", "http:///a.jpg"),  # no host: then refused as no http(s) URL
        ("http://example.com/a.jpg", "http://example.com/a.jpg"),
        ("HTTPS://example.com/a.jpg", "HTTPS://example.com/a.jpg"),
        ("ftp://example.com/a.jpg", "ftp://example.com/a.jpg"),
        ("mailto:someone", "mailto:someone"),
    ],
)
def test_a_url_without_scheme_gets_http(url: str, expected: str) -> None:
    assert add_scheme(url) == expected


def write_original_tsv(path: Path) -> None:
    """A file as the original crawler's ``tsv_producer.py`` read it: a header of ``url``,
    ``identifier`` and ``source``, URLs with and without their scheme."""
    path.write_text(
        "url\tidentifier\tsource\n"
        "https://images.example/1.jpg\t7563efd4-58d0-41eb-9a4f-3903d36a5225\tflickr\n"
        "images.example/2.jpg\t2fd5a3b2-1c9e-4a39-93f8-4f3b8f0e8c11\tflickr\n"
        "cdn.example:8080/3.jpg\t0c7e3d4a-5f60-4b2a-8c1d-9e8f7a6b5c4d\tmet\n"
        "\t9a8b7c6d-0000-4000-8000-000000000004\tmet\n"
    )


def test_the_original_crawlers_tsv(tmp_path: Path) -> None:
    path = tmp_path / "original.tsv"
    write_original_tsv(path)
    with path.open(newline="") as text:
        result = list(read_rows(text, "tsv"))
    assert result == [
        GoodRow(2, image("https://images.example/1.jpg",
                         "7563efd4-58d0-41eb-9a4f-3903d36a5225", "flickr")),
        GoodRow(3, image("http://images.example/2.jpg",
                         "2fd5a3b2-1c9e-4a39-93f8-4f3b8f0e8c11", "flickr"), added_scheme=True),
        GoodRow(4, image("http://cdn.example:8080/3.jpg",
                         "0c7e3d4a-5f60-4b2a-8c1d-9e8f7a6b5c4d", "met"), added_scheme=True),
        BadRow(5, "missing url"),
    ]  # fmt: skip


# The image table of a catalog, as a PostgreSQL COPY (text format) writes it: tabs, no
# quoting, \N for null; JSON and quotes in columns the crawler does not read.
CATALOG_COLUMNS = (
    "identifier", "created_on", "provider", "source", "foreign_identifier",
    "foreign_landing_url", "url", "thumbnail", "width", "height", "license", "creator",
    "title", "meta_data", "tags", "removed_from_source",
)  # fmt: skip


def catalog_line(identifier: str, source: str, url: str, title: str) -> str:
    values = {
        "identifier": identifier,
        "created_on": "2020-08-17 12:00:00+00",
        "provider": source,
        "source": source,
        "foreign_identifier": f"f-{identifier}",
        "foreign_landing_url": f"https://{source}.example/photos/{identifier}",
        "url": url,
        "thumbnail": "\\N",
        "width": "\\N",
        "height": "640",
        "license": "by",
        "creator": "Alden Page",
        "title": title,
        "meta_data": '{"description": "a \\"quoted\\" word", "license_url": null}',
        "tags": '[{"name": "sunset"}]',
        "removed_from_source": "f",
    }
    return "\t".join(values[name] for name in CATALOG_COLUMNS)


def test_a_catalog_dump_with_more_columns(tmp_path: Path) -> None:
    path = tmp_path / "image.tsv"
    lines = [
        "\t".join(CATALOG_COLUMNS),
        catalog_line("u1", "flickr", "https://live.example/1.jpg", "Sunset"),
        # A quote that opens a title and never closes: one row all the same.
        catalog_line("u2", "flickr", "live.example/2.jpg", '"Sunset at dusk'),
        catalog_line("\\N", "met", "https://met.example/3.jpg", "no identifier"),
        catalog_line("u4", "\\N", "https://met.example/4.jpg", "no source"),
        catalog_line("u5", "met", "https://met.example/5.jpg", 'a "fine" title'),
        "u6\ttoo\tfew\tcolumns",
    ]
    path.write_text("\n".join(lines) + "\n")
    counter = itertools.count(1)
    with path.open(newline="") as text:
        result = list(read_rows(text, "tsv", new_uuid=lambda: f"generated-{next(counter)}"))
    ignored = [name for name in CATALOG_COLUMNS if name not in ("identifier", "source", "url")]
    assert result == [
        Ignored(1, tuple(ignored)),  # named once, where the header is
        GoodRow(2, image("https://live.example/1.jpg", "u1", "flickr")),
        GoodRow(3, image("http://live.example/2.jpg", "u2", "flickr"), added_scheme=True),
        GoodRow(4, image("https://met.example/3.jpg", "generated-1", "met"),
                generated_uuid=True),
        BadRow(5, "missing source (give the field, or --source)"),
        GoodRow(6, image("https://met.example/5.jpg", "u5", "met")),
        BadRow(7, "4 fields, but the header (line 1) has 16"),
    ]  # fmt: skip
    assert str(result[0]).startswith("line 1: ignored column(s) 'created_on', 'provider', ")
    assert str(result[0]).endswith("(used: url, uuid (or identifier), source)")


def test_a_csv_dump_with_quoted_columns_and_both_uuid_and_identifier() -> None:
    text = (
        "identifier,title,url,uuid,source,meta_data\n"
        'old-1,"Sunset, at dusk",https://a.example/1.jpg,new-1,nasa,"{""a"": 1}"\n'
        'old-2,"two\nlines",a.example/2.jpg,,nasa,{}\n'
    )
    assert rows(text, "csv") == [
        Ignored(1, ("identifier", "title", "meta_data")),  # uuid is the uuid
        GoodRow(2, image("https://a.example/1.jpg", "new-1", "nasa")),
        GoodRow(3, image("http://a.example/2.jpg", "generated-1", "nasa"),
                generated_uuid=True, added_scheme=True),
    ]  # fmt: skip


def test_jsonl_takes_identifier_and_names_each_ignored_field_once() -> None:
    text = (
        '{"url": "a.example/1.jpg", "identifier": "i1", "source": "s", "title": "t"}\n'
        '{"url": "https://a.example/2.jpg", "identifier": "i2", "source": "s", "title": "u"}\n'
        '{"url": "https://a.example/3.jpg", "uuid": "u3", "identifier": "i3", "source": "s", '
        '"attempts": 2}\n'
    )
    result = rows(text)
    assert result == [
        Ignored(1, ("title",), kind="field"),
        GoodRow(1, image("http://a.example/1.jpg", "i1", "s"), added_scheme=True),
        GoodRow(2, image("https://a.example/2.jpg", "i2", "s")),
        # A fresh feed: its attempts are not the crawler's to take.
        Ignored(3, ("identifier", "attempts"), kind="field"),
        GoodRow(3, image("https://a.example/3.jpg", "u3", "s")),
    ]
    assert str(result[3]) == (
        "line 3: ignored field(s) 'identifier', 'attempts' (used: url, uuid (or identifier), "
        "source)"
    )


def test_a_file_of_ignored_columns_only_is_still_empty() -> None:
    with pytest.raises(FeedError, match="empty: no rows"):
        rows("url,source,title\n", "csv")


# --- Parquet --------------------------------------------------------------------------------


def write_parquet(path: Path, columns: dict[str, list[Any]], **options: Any) -> Path:
    table = pa.table(columns)
    pq.write_table(table, path, **options)
    return path


def parquet_items(path: Path, source: str | None = None, **options: Any) -> list[Item]:
    counter = itertools.count(1)
    return list(
        read_parquet(
            path, default_source=source, new_uuid=lambda: f"generated-{next(counter)}", **options
        )
    )


def test_parquet_rows_with_nulls_numbered_across_row_groups_and_batches(tmp_path: Path) -> None:
    path = write_parquet(
        tmp_path / "catalog.parquet",
        {
            "identifier": ["u1", None, "u3", "u4", "u5", "u6", "u7"],
            "URL": ["https://a.example/1.jpg", "a.example/2.jpg", None,
                    "https://a.example/4.jpg", "ftp://a.example/5.jpg",
                    "https://a.example/6.jpg", "https://a.example/7.jpg"],
            "source": ["flickr", "flickr", "flickr", None, "met", "bad source", "met"],
            "width": [640, 480, None, 1, 2, 3, 4],
            "title": ["a", None, "c", "d", "e", "f", "g"],
        },
        row_group_size=3,
    )  # fmt: skip
    result = parquet_items(path, batch_rows=2)
    assert result == [
        Ignored(None, ("width", "title")),
        GoodRow(1, image("https://a.example/1.jpg", "u1", "flickr")),
        GoodRow(2, image("http://a.example/2.jpg", "generated-1", "flickr"),
                generated_uuid=True, added_scheme=True),
        BadRow(3, "missing url", "row"),
        BadRow(4, "missing source (give the field, or --source)", "row"),
        BadRow(5, "url is not an http(s) URL: 'ftp://a.example/5.jpg'", "row"),
        BadRow(6, "invalid source name 'bad source' (at most 244 of the letters a-z, A-Z, "
                  "digits, '.', '_' and '-')", "row"),
        GoodRow(7, image("https://a.example/7.jpg", "u7", "met")),
    ]  # fmt: skip
    assert str(result[3]) == "row 3: missing url"
    assert str(result[0]).startswith("ignored column(s) 'width', 'title' (used: ")
    # --source fills a null source.
    assert parquet_items(path, source="fallback")[4] == GoodRow(
        4, image("https://a.example/4.jpg", "u4", "fallback")
    )


def test_parquet_reads_dictionary_strings_and_a_column_of_nulls(tmp_path: Path) -> None:
    sources = pa.array(["nasa", "nasa"]).dictionary_encode()
    path = tmp_path / "dict.parquet"
    pq.write_table(
        pa.table(
            {
                "url": pa.array(["https://a.example/1.jpg", "https://a.example/2.jpg"]),
                "source": sources,
                "uuid": pa.nulls(2),
            }
        ),
        path,
    )
    assert parquet_items(path) == [
        GoodRow(1, image("https://a.example/1.jpg", "generated-1", "nasa"), generated_uuid=True),
        GoodRow(2, image("https://a.example/2.jpg", "generated-2", "nasa"), generated_uuid=True),
    ]


def test_parquet_streams_in_batches_of_the_used_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_parquet(
        tmp_path / "big.parquet",
        {
            "url": [f"https://a.example/{i}.jpg" for i in range(1000)],
            "source": ["s"] * 1000,
            "description": ["x" * 100] * 1000,
        },
        row_group_size=400,
    )
    reads: list[dict[str, Any]] = []
    iter_batches = pq.ParquetFile.iter_batches

    def spy(self: pq.ParquetFile, *args: Any, **kwargs: Any) -> Any:
        reads.append(kwargs)
        return iter_batches(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    items = read_parquet(path, batch_rows=100)
    first = [next(items) for _ in range(2)]  # the ignored column, then the first row
    assert isinstance(first[1], GoodRow) and first[1].line == 1
    assert reads == [{"batch_size": 100, "row_groups": [0], "columns": ["url", "source"]}]
    rest = list(items)
    assert [r.line for r in rest if isinstance(r, GoodRow)] == list(range(2, 1001))
    assert [read["row_groups"] for read in reads] == [[0], [1], [2]]


@pytest.mark.parametrize(
    ("columns", "source", "message"),
    [
        ({"link": ["https://a.example/1.jpg"], "source": ["s"]}, None,
         "unknown column(s) 'link' and no url column"),
        ({"url": ["https://a.example/1.jpg"]}, None, "no source column; give --source"),
        ({"url": [1], "source": ["s"]}, None, "column 'url' (url) holds int64, not strings"),
        ({"url": ["https://a.example/1.jpg"], "identifier": [7]}, "s",
         "column 'identifier' (uuid) holds int64, not strings"),
        ({"url": pa.array([], pa.string()), "source": pa.array([], pa.string())}, None,
         "empty: no rows to send"),
    ],
)  # fmt: skip
def test_a_parquet_file_that_cannot_feed_is_a_clear_error(
    tmp_path: Path, columns: dict[str, Any], source: str | None, message: str
) -> None:
    path = write_parquet(tmp_path / "bad.parquet", columns)
    with pytest.raises(FeedError) as caught:
        parquet_items(path, source=source)
    assert message in str(caught.value)


def test_a_file_that_is_not_parquet(tmp_path: Path) -> None:
    path = tmp_path / "urls.parquet"
    path.write_text("url,source\nhttps://a.example/1.jpg,s\n")
    with pytest.raises(FeedError, match="not a Parquet file"):
        parquet_items(path)


def test_parquet_without_pyarrow_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_parquet(tmp_path / "a.parquet", {"url": ["https://a.example/1.jpg"]})
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # import fails
    with pytest.raises(FeedError) as caught:
        parquet_items(path, source="s")
    assert str(caught.value) == (
        "reading Parquet needs pyarrow: pip install 'image-crawler[parquet]'"
    )


def test_a_row_group_that_cannot_be_read_is_reported_and_the_next_is_read(
    tmp_path: Path,
) -> None:
    path = write_parquet(
        tmp_path / "damaged.parquet",
        {
            "url": [f"https://a.example/{i}.jpg" for i in range(30)],
            "source": ["s"] * 30,
        },
        row_group_size=10,
        compression="snappy",
        use_dictionary=False,
    )
    # Scribble over the middle row group's column data (the metadata stays whole).
    meta = pq.ParquetFile(path).metadata.row_group(1).column(0)
    data = bytearray(path.read_bytes())
    start = meta.data_page_offset + 20
    data[start : start + 40] = b"\xff" * 40
    path.write_bytes(bytes(data))
    result = parquet_items(path)
    assert [r.line for r in result if isinstance(r, GoodRow)] == [*range(1, 11), *range(21, 31)]
    (bad,) = [r for r in result if isinstance(r, BadRow)]
    assert (bad.line, bad.count, bad.unit) == (11, 10, "row")
    assert str(bad).startswith("row 11: rows 11-20 (row group 1) cannot be read: ")


# --- the command, against a broker ----------------------------------------------------------


async def produce_file(
    path: Path, bootstrap: str, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, list[str], list[str]]:
    code = await asyncio.to_thread(cli.run, ["produce", str(path), "--kafka", bootstrap, *args])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err.splitlines()


async def test_produce_sends_the_original_tsv_and_a_parquet_catalog(
    kafka: KafkaBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    original = tmp_path / "original.tsv"
    write_original_tsv(original)
    code, out, err = await produce_file(original, kafka.bootstrap, capsys)
    assert code == 1  # a bad row
    assert err == ["line 5: missing url"]
    assert out == ["sent 3, bad 1 (2 without a scheme got http://)"]

    catalog = write_parquet(
        tmp_path / "catalog.parquet",
        {
            "identifier": ["c1", "c2", None],
            "url": ["https://cat.example/1.jpg", None, "cat.example/3.jpg"],
            "provider": ["nasa", "nasa", "nasa"],
            "title": ["one", "two", "three"],
        },
    )
    code, out, err = await produce_file(catalog, kafka.bootstrap, capsys, "--source", "nasa")
    assert code == 1
    assert err == [
        "ignored column(s) 'provider', 'title' (used: url, uuid (or identifier), source)",
        "row 2: missing url",
    ]
    assert out == ["sent 2, bad 1 (1 without uuid got a new uuid4; 1 without a scheme got http://)"]

    records = await everything_in(kafka.bootstrap, INBOUND_TOPIC)
    sent = {InboundImage.from_json(r.value).url: (r.key, InboundImage.from_json(r.value))
            for r in records}  # fmt: skip
    assert len(records) == len(sent) == 5  # the good rows, and nothing else
    assert sent["http://images.example/2.jpg"] == (
        b"2fd5a3b2-1c9e-4a39-93f8-4f3b8f0e8c11",
        image("http://images.example/2.jpg", "2fd5a3b2-1c9e-4a39-93f8-4f3b8f0e8c11", "flickr"),
    )
    assert sent["http://cdn.example:8080/3.jpg"][1].source == "met"
    assert sent["https://cat.example/1.jpg"][1] == image("https://cat.example/1.jpg", "c1", "nasa")
    key, generated = sent["http://cat.example/3.jpg"]
    assert uuidlib.UUID(generated.uuid).version == 4 and key == generated.uuid.encode()


def test_produce_refuses_a_parquet_file_it_cannot_feed_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_parquet(tmp_path / "catalog.parquet", {"link": ["https://a.example/1.jpg"]})
    # Nothing listens there: the file is judged before any connection is tried.
    code = cli.run(["produce", str(path), "--source", "s", "--kafka", f"{LOOPBACK}:{free_port()}"])
    captured = capsys.readouterr()
    assert code == 1
    assert "unknown column(s) 'link' and no url column" in captured.err
    assert captured.out.strip() == "sent 0, bad 0"


def test_produce_refuses_a_file_of_ignored_columns_only_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "titles.csv"
    path.write_text("url,source,title\n")
    # The first item read is the note on the ignored column, not a row: the file is read
    # on to its first row (or its end) before any connection is tried.
    code = cli.run(["produce", str(path), "--kafka", f"{LOOPBACK}:{free_port()}"])
    captured = capsys.readouterr()
    assert code == 1
    assert captured.err.strip() == f"image-crawler: error: {path}: empty: no rows to send"
    assert captured.out.strip() == "sent 0, bad 0"


# --- a caption and kept columns (issue 52) -------------------------------------------------


def _kept_items(path: Path, fmt: str, kept: produce_module.Kept) -> list[Any]:
    with contextlib.ExitStack() as stack:
        return list(produce_module.open_feed(path, fmt, "example", stack, kept))  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_a_caption_and_kept_columns_go_into_each_message(tmp_path: Path, fmt: str) -> None:
    rows = [
        {"url": "http://127.0.0.2/a.jpg", "TEXT": "a fox «ü»", "similarity": 0.25, "other": 1},
        {"url": "http://127.0.0.2/b.jpg", "TEXT": "x" * 17_000, "similarity": 0.5, "other": 2},
    ]
    path = tmp_path / f"list.{fmt}"
    if fmt == "csv":
        path.write_text(
            "url,TEXT,similarity,other\n"
            + "".join(f"{r['url']},{r['TEXT']},{r['similarity']},{r['other']}\n" for r in rows)
        )
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    kept = produce_module.Kept("TEXT", ("similarity",))
    items = [i for i in _kept_items(path, fmt, kept) if not isinstance(i, produce_module.Ignored)]
    good, bad = items
    assert isinstance(good, produce_module.GoodRow)
    assert good.image.row is not None and good.image.row.caption == "a fox «ü»"
    assert good.image.row.columns == {"similarity": "0.25" if fmt == "csv" else 0.25}
    # Too large for a message: the row is reported, never cut.
    assert isinstance(bad, produce_module.BadRow)
    assert "over the limit of 16384" in bad.reason


def test_a_caption_column_that_is_not_there_is_refused_before_anything_is_sent(
    tmp_path: Path,
) -> None:
    path = tmp_path / "list.csv"
    path.write_text("url\nhttp://127.0.0.2/a.jpg\n")
    with pytest.raises(
        produce_module.FeedError, match=r"no column\(s\) 'caption', which were asked"
    ):
        _kept_items(path, "csv", produce_module.Kept("caption"))
