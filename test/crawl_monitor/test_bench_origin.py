"""bench.origin --kind: only the manifest's files of one kind, in manifest order (what
the comparison's crawl and img2dataset are both served), and Corpus.of_kind alike."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench.corpus import Corpus, CorpusFile
from bench.origin import load


def _corpus(tmp_path: Path) -> Corpus:
    files = []
    for i, kind in enumerate(["large", "large", "mixed", "large", "mixed"]):
        name = f"{i:04d}-p-{kind}.jpg"
        (tmp_path / name).write_bytes(f"body {i}".encode())
        files.append(CorpusFile(name, "p", kind, 1024, 768, 80, "4:2:0", 0.0, "none", 6))
    manifest = {"files": [dataclasses.asdict(f) for f in files]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return Corpus(tmp_path, tuple(files))


def test_one_kind_is_served_in_manifest_order(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path)
    assert load(tmp_path) == [f"body {i}".encode() for i in range(5)]
    assert load(tmp_path, "mixed") == [b"body 2", b"body 4"]
    assert corpus.of_kind("mixed").bodies() == load(tmp_path, "mixed")
    assert corpus.of_kind("mixed").summary()["files"] == 2
    with pytest.raises(SystemExit):
        load(tmp_path, "tiny")
