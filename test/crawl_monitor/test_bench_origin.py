"""bench.origin --kind: only the manifest's files of one kind, in manifest order (what
the comparison's crawl and img2dataset are both served), and Corpus.of_kind alike; each
file's ETag and Last-Modified, and 304 to a GET that names them (what ``--recheck``
meets), from the real origin process."""

from __future__ import annotations

import dataclasses
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from email.message import Message
from email.utils import formatdate
from pathlib import Path

import pytest

from bench.corpus import Corpus, CorpusFile
from bench.origin import File, etag_of, load, not_modified
from bench.services import Origin

# 2026-01-02 03:04:05 UTC: the manifest's modification time, the files' Last-Modified.
CORPUS_DATE_S = 1767323045


def _corpus(tmp_path: Path) -> Corpus:
    files = []
    for i, kind in enumerate(["large", "large", "mixed", "large", "mixed"]):
        name = f"{i:04d}-p-{kind}.jpg"
        (tmp_path / name).write_bytes(f"body {i}".encode())
        files.append(CorpusFile(name, "p", kind, 1024, 768, 80, "4:2:0", 0.0, "none", 6))
    manifest = {"files": [dataclasses.asdict(f) for f in files]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    os.utime(tmp_path / "manifest.json", (CORPUS_DATE_S, CORPUS_DATE_S))
    return Corpus(tmp_path, tuple(files))


def test_one_kind_is_served_in_manifest_order(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path)
    assert [f.body for f in load(tmp_path)] == [f"body {i}".encode() for i in range(5)]
    mixed = load(tmp_path, "mixed")
    assert [f.body for f in mixed] == [b"body 2", b"body 4"]
    assert corpus.of_kind("mixed").bodies() == [f.body for f in mixed]
    assert corpus.of_kind("mixed").summary()["files"] == 2
    with pytest.raises(SystemExit):
        load(tmp_path, "tiny")


def test_validators_are_computed_once_at_load(tmp_path: Path) -> None:
    _corpus(tmp_path)
    files = load(tmp_path)
    etags = [f.etag for f in files]
    assert len(set(etags)) == 5
    assert all(e.startswith('"') and e.endswith('"') and len(e) == 34 for e in etags)
    # The index is in the hash: two files with the same bytes still differ.
    assert etag_of(0, b"same") != etag_of(1, b"same")
    assert etags[0] == etag_of(0, b"body 0")
    # Served by its index in the subset: the subset's first file is index 0.
    assert load(tmp_path, "mixed")[0].etag == etag_of(0, b"body 2")
    assert {f.last_modified for f in files} == {"Fri, 02 Jan 2026 03:04:05 GMT"}
    assert {f.last_modified_s for f in files} == {CORPUS_DATE_S}


FILE = File(b"body", '"abc"', formatdate(CORPUS_DATE_S, usegmt=True), CORPUS_DATE_S)
SAME = formatdate(CORPUS_DATE_S, usegmt=True)
LATER = formatdate(CORPUS_DATE_S + 1, usegmt=True)
EARLIER = formatdate(CORPUS_DATE_S - 1, usegmt=True)


@pytest.mark.parametrize(
    ("if_none_match", "if_modified_since", "expected"),
    [
        (None, None, False),
        ('"abc"', None, True),
        ('W/"abc"', None, True),  # weak comparison, as for any GET
        ('"x", "abc"', None, True),
        ("*", None, True),
        ('"x"', None, False),
        ('"abc"', EARLIER, True),  # If-None-Match decides alone
        ('"x"', SAME, False),
        (None, SAME, True),
        (None, LATER, True),  # not older than the Last-Modified
        (None, EARLIER, False),
        (None, "Fri, 02 Jan 2026 03:04:05 -0000", True),
        (None, "yesterday", False),
        (None, "", False),
    ],
)
def test_not_modified(
    if_none_match: str | None, if_modified_since: str | None, expected: bool
) -> None:
    assert not_modified(if_none_match, if_modified_since, FILE) is expected


@pytest.fixture
def origin(tmp_path: Path) -> Iterator[Origin]:
    (tmp_path / "corpus").mkdir()
    _corpus(tmp_path / "corpus")
    with Origin(tmp_path / "corpus", tmp_path / "logs") as server:
        yield server


def _get(url: str, headers: Mapping[str, str] | None = None) -> tuple[int, Message, bytes]:
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as answer:  # 304 too
        with answer:
            return answer.code, answer.headers, answer.read()


@pytest.mark.integration
def test_the_origin_answers_304_to_a_recheck_of_its_file(origin: Origin) -> None:
    status, headers, body = _get(f"{origin.url}/7/one.jpg")  # file 7 % 5
    assert (status, body) == (200, b"body 2")
    etag, last_modified = headers["ETag"], headers["Last-Modified"]
    assert etag == etag_of(2, b"body 2")
    assert last_modified == "Fri, 02 Jan 2026 03:04:05 GMT"

    for asked in ({"If-None-Match": etag}, {"If-Modified-Since": last_modified}):
        status, headers, body = _get(f"{origin.url}/12/two.jpg", asked)  # file 2 again
        assert (status, body) == (304, b"")
        assert headers["ETag"] == etag and headers["Last-Modified"] == last_modified
        assert headers.get("Content-Length") in (None, "0")

    # Another file's ETag, or an older date: the whole body.
    assert _get(f"{origin.url}/8/three.jpg", {"If-None-Match": etag})[2] == b"body 3"
    older = {"If-Modified-Since": formatdate(CORPUS_DATE_S - 60, usegmt=True)}
    assert _get(f"{origin.url}/7/four.jpg", older)[0] == 200
