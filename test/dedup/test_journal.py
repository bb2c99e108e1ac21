"""The index's journal: what was kept survives a restart, a torn last row is cut, and the
index read back answers as the one written (dedup/journal.py)."""

from __future__ import annotations

import dataclasses
import random

from dedup.index import RECORD
from dedup.journal import ROWS, SOURCES, Journal
from dedup.placement import Placer
from test.dedup.test_placement import corpus, image, random_phash


def test_the_index_read_back_places_as_the_one_written(tmp_path):
    images = corpus(random.Random(9), 200)
    journal = Journal(tmp_path / "journal")
    placer = Placer(journal.load(radius=4))
    first = placer.place(images[:120])
    journal.append(placer.index)
    first += placer.place(images[120:])
    journal.append(placer.index)
    again = Placer(Journal(tmp_path / "journal").load(radius=4))
    assert len(again.index) == len(placer.index)
    assert again.place(images) == first
    assert len(again.index) == len(placer.index)
    assert (tmp_path / "journal" / ROWS).stat().st_size == len(placer.index) * RECORD.itemsize


def test_an_append_writes_only_what_is_new_and_sources_once(tmp_path):
    journal = Journal(tmp_path)
    placer = Placer(journal.load(radius=4))
    rng = random.Random(10)
    placer.place([image(0, random_phash(rng), source="a"), image(1, random_phash(rng))])
    assert journal.append(placer.index) == 2
    assert journal.append(placer.index) == 0
    placer.place([image(2, random_phash(rng), source="a")])
    assert journal.append(placer.index) == 1
    assert (tmp_path / SOURCES).read_text() == "a\nmuseum\n"
    loaded = Journal(tmp_path).load(radius=4)
    assert [loaded.canonical(r).source for r in range(3)] == ["a", "museum", "a"]


def test_a_torn_last_row_is_cut_and_the_rows_before_it_kept(tmp_path):
    journal = Journal(tmp_path)
    placer = Placer(journal.load(radius=4))
    rng = random.Random(11)
    placer.place([image(n, random_phash(rng)) for n in range(5)])
    journal.append(placer.index)
    rows = tmp_path / ROWS
    with rows.open("ab") as f:
        f.write(b"\x01" * 13)  # a crash mid-write
    (tmp_path / SOURCES).write_text("museum\nhalf-writ")
    loaded = Journal(tmp_path).load(radius=4)
    assert len(loaded) == 5
    assert rows.stat().st_size == 5 * RECORD.itemsize
    assert (tmp_path / SOURCES).read_text() == "museum\n"


def test_identifiers_that_are_not_uuids_are_kept_whole_and_read_back(tmp_path):
    # A dataset's rows are {run}-{key}; a producer may send anything, or a UUID spelt
    # otherwise than uuid.UUID spells it, which must come back as it was sent; and a UUID
    # whose first 8 bytes are those that mark a name.
    rng = random.Random(11)
    odd = [
        "abc123-000001",
        "B7C1E2D4-0000-4000-8000-000000000001",
        'a "quoted"\nline',
        "ff",
        "{b7c1e2d4-0000-4000-8000-000000000001}",
        "b7c1e2d4000040008000000000000001",
        "b7c1e2d4-0000-4000-8000-000000000001\n",
        "ffffffff-ffff-ffff-0000-000000000000",
    ]
    images = [dataclasses.replace(image(n, random_phash(rng)), identifier=i) for n, i in
              enumerate(odd)] + [image(99, random_phash(rng))]  # fmt: skip
    journal = Journal(tmp_path)
    placer = Placer(journal.load(radius=4))
    assert [p.kind for p in placer.place(images)] == ["unique"] * len(images)
    journal.append(placer.index)
    loaded = Journal(tmp_path).load(radius=4)
    assert [loaded.canonical(r).identifier for r in range(len(images))] == [
        *odd,
        images[-1].identifier,
    ]
    copy = dataclasses.replace(images[0], identifier="abc123-000002")
    (placed,) = Placer(loaded).place([copy])
    assert (placed.kind, placed.duplicate_of) == ("exact", "abc123-000001")
