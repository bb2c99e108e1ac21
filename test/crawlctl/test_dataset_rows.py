"""Reading a URL list as img2dataset reads it (crawlctl/dataset/rows.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from crawlctl.commands.produce import FeedError, Ignored
from crawlctl.dataset.rows import FailedRow, ListColumns, ListRow, parquet_types, read_list

# LAION's names: URL, TEXT, and a similarity kept beside them.
LAION = ListColumns(url="URL", caption="TEXT", kept=("similarity",))
ROWS = [
    {"URL": "http://127.0.0.2/a.jpg", "TEXT": "a fox", "similarity": 0.31, "other": 1},
    {"URL": "", "TEXT": "no url", "similarity": 0.2, "other": 2},
    {"URL": "ftp://127.0.0.2/b.jpg", "TEXT": "not http", "similarity": 0.1, "other": 3},
    {"URL": "https://127.0.0.3/c.png", "TEXT": "ünï «c»", "similarity": None, "other": 4},
]


def _rows(items):
    return [i for i in items if not isinstance(i, Ignored)]


def _write(path: Path, fmt: str) -> Path:
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n\n" for r in ROWS))  # blank lines: no rows
    elif fmt == "json":
        path.write_text(json.dumps(ROWS))
    elif fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(ROWS), path)
    else:
        sep = "," if fmt == "csv" else "\t"
        lines = [sep.join(["url", "TEXT", "Similarity", "other"])]  # header in another case
        for r in ROWS:
            sim = "" if r["similarity"] is None else str(r["similarity"])
            lines.append(sep.join([r["URL"], r["TEXT"], sim, str(r["other"])]))
        path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("fmt", ["csv", "tsv", "json", "jsonl", "parquet"])
def test_every_row_is_an_item_in_file_order_the_failed_ones_too(tmp_path, fmt) -> None:
    rows = _rows(read_list(_write(tmp_path / f"list.{fmt}", fmt), fmt, LAION))
    assert [type(r) for r in rows] == [ListRow, FailedRow, FailedRow, ListRow]
    assert rows[0].url == "http://127.0.0.2/a.jpg" and rows[0].caption == "a fox"
    assert rows[1].reason == "no url" and rows[1].caption == "no url"
    assert rows[2].columns["similarity"] in (0.1, "0.1")  # a failed row keeps its columns
    assert rows[2].reason.startswith("not an http(s) URL") and rows[2].url.startswith("ftp:")
    assert rows[3].caption == "ünï «c»"
    similarity = rows[0].columns["similarity"]
    # Text lists keep the text; JSON and Parquet their values.
    assert similarity == ("0.31" if fmt in ("csv", "tsv") else 0.31)
    assert list(rows[0].columns) == ["similarity"]


def test_a_text_list_is_one_url_a_line(tmp_path) -> None:
    path = tmp_path / "urls.txt"
    path.write_text("http://127.0.0.2/a.jpg\n\n  https://127.0.0.2/b.jpg  \nnot a url\n")
    rows = list(read_list(path, "txt", ListColumns()))
    assert [getattr(r, "url", None) for r in rows] == [
        "http://127.0.0.2/a.jpg",
        "https://127.0.0.2/b.jpg",
        "not a url",
    ]
    assert isinstance(rows[2], FailedRow)


def test_a_csv_without_the_url_column_is_refused_naming_the_columns(tmp_path) -> None:
    path = _write(tmp_path / "list.csv", "csv")
    with pytest.raises(FeedError, match="no 'link' column"):
        list(read_list(path, "csv", ListColumns(url="link")))
    with pytest.raises(FeedError, match=r"no column\(s\) 'caption', which were asked for"):
        list(read_list(path, "csv", ListColumns(url="url", caption="caption")))


def test_columns_not_used_are_named_once(tmp_path) -> None:
    path = _write(tmp_path / "list.csv", "csv")
    ignored = [i for i in read_list(path, "csv", LAION) if isinstance(i, Ignored)]
    assert [i.names for i in ignored] == [("other",)]


def test_a_parquet_list_gives_its_kept_columns_types(tmp_path) -> None:
    path = _write(tmp_path / "list.parquet", "parquet")
    assert parquet_types(path, LAION) == {"similarity": pa.float64()}


@pytest.mark.parametrize(
    ("columns", "problem"),
    [
        (ListColumns(url="url", caption="URL"), "named twice"),
        (ListColumns(kept=("status", "license")), "may not keep status"),
        (ListColumns(caption="caption", kept=("license",)), None),
    ],
)
def test_columns_that_cannot_make_a_dataset_say_why(columns, problem) -> None:
    found = columns.problem()
    assert (found is None) if problem is None else (problem in (found or ""))


def test_an_empty_list_is_refused(tmp_path) -> None:
    path = tmp_path / "urls.txt"
    path.write_text("\n\n")
    with pytest.raises(FeedError, match="empty"):
        list(read_list(path, "txt", ListColumns()))
