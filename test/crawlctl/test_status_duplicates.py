"""`image-crawler status` and the deduplication stage's counts (the hash
``dedup_placements``, field ``{source}:{kind}``): read in the one script, a "duplicates"
column (exact + near, and their share of the images placed) only once there are any,
the crawl's in the caption, and every figure in ``--json``."""

from __future__ import annotations

import re
from typing import Any

import pytest
from redis.asyncio import Redis

from crawlctl.status.json_view import status_json
from crawlctl.status.model import duplicates, placements_by_source, read_status
from crawlctl.status.terminal import duplicates_text
from image_crawler import contract as c
from test.crawlctl.test_status_model import seed
from test.crawlctl.test_status_terminal import render, render_fitted, row


async def seed_placements(redis: Redis) -> None:
    """flickr: 12 duplicates of 290 placed; met: none; a source in no set: counted in
    the crawl's figures, no row."""
    await redis.hset(
        c.PLACEMENTS_HASH,
        mapping={
            c.placements_field("flickr", "exact"): 10,
            c.placements_field("flickr", "near"): 2,
            c.placements_field("flickr", "unique"): 278,
            c.placements_field("met", "unique"): 5,
            c.placements_field("nowhere", "near"): 3,
        },
    )


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"flickr:near": "2", "flickr:exact": "1"}, {"flickr": {"exact": 1, "near": 2}}),
        ({"a:b:unique": "4"}, {"a:b": {"unique": 4}}),  # split at the last ':'
        ({":exact": "1"}, {"": {"exact": 1}}),  # an older worker's, no source named
        ({"a:teapot": "1", "a:near": "many", "a:exact": "-1", "a:unique": "0"}, {}),
    ],
)
def test_placements_by_source(fields: dict[str, Any], expected: dict[str, Any]) -> None:
    assert placements_by_source(fields) == expected


@pytest.mark.parametrize(
    ("placements", "text"),
    [
        ({}, "-"),
        ({"unique": 5}, "0 (0.0%)"),
        ({"exact": 10, "near": 2, "unique": 278}, "12 (4.1%)\n10 exact, 2 near"),
    ],
)
def test_duplicates_text(placements: dict[str, int], text: str) -> None:
    assert duplicates_text(placements) == text


async def test_the_counts_are_read_with_the_rest(redis: Redis) -> None:
    await seed(redis)
    await seed_placements(redis)
    status = await read_status(redis)
    by_name = {s.name: s for s in status.sources}
    assert list(by_name["flickr"].placements.items()) == [
        ("exact", 10),
        ("near", 2),
        ("unique", 278),
    ]
    assert by_name["met"].placements == {"unique": 5}
    assert "nowhere" not in by_name
    assert status.placements == {"exact": 10, "near": 5, "unique": 283}
    assert duplicates(status.placements).share == pytest.approx(15 / 298)


async def test_the_table_has_a_duplicates_column_only_once_there_are_any(redis: Redis) -> None:
    await seed(redis)
    assert "duplicates" not in render(await read_status(redis))
    await seed_placements(redis)
    status = await read_status(redis)
    text = render(status, width=220)
    header = next(line for line in text.splitlines() if line.startswith("source "))
    assert re.search(r"\serrors\s+duplicates\s+last 50 statuses\s", header), header
    flickr = row(text, "flickr")
    assert re.search(r"\s12 \(4\.1%\)\s", flickr[0]), flickr
    assert any("10 exact, 2 near" in line for line in flickr[1:]), flickr
    assert re.search(r"\s0 \(0\.0%\)\s", row(text, "met")[0])
    assert (
        "duplicates: 15 of 298 images placed (5.0%): 10 exact, 5 near (the deduplication "
        "stage, dedup_placements)"
    ) in " ".join(text.split())
    # Hidden in a narrow terminal after the last 50 statuses; the caption keeps the crawl's.
    narrow = render_fitted(status, 100)
    assert "duplicates" in re.search(r"too narrow for: ([^(]+)", narrow).group(1)  # type: ignore[union-attr]
    assert "duplicates: 15 of 298 images placed" in " ".join(narrow.split())


async def test_the_json_has_the_placements_the_duplicates_and_their_share(redis: Redis) -> None:
    await seed(redis)
    await seed_placements(redis)
    document = status_json(await read_status(redis))
    general = document["general"]
    assert general["placements"] == {"exact": 10, "near": 5, "unique": 283}
    assert general["duplicates"] == 15
    assert general["duplicate_share"] == pytest.approx(15 / 298)
    by_name = {s["name"]: s for s in document["sources"]}
    assert by_name["flickr"]["placements"] == {"exact": 10, "near": 2, "unique": 278}
    assert (by_name["flickr"]["duplicates"], by_name["met"]["duplicates"]) == (12, 0)
    assert by_name["flickr"]["duplicate_share"] == pytest.approx(12 / 290)
    assert by_name["met"]["duplicate_share"] == 0.0
    busy = by_name["busy"]  # none placed
    assert (busy["placements"], busy["duplicates"], busy["duplicate_share"]) == ({}, 0, None)
