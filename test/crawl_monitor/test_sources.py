"""The source list: parsing, merging, and refreshing from a file and a real HTTP origin."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from structlog.testing import capture_logs

from crawl_monitor.policy.rates import compute_crawl_rate
from crawl_monitor.sources import (
    SourceCatalog,
    SourcesUnavailable,
    decode_sources,
    merge_sources,
    parse_sources,
)
from test.harness.services import wait_for


@pytest.mark.parametrize(
    ("payload", "counts", "skipped"),
    [
        ([{"source_name": "flickr", "image_count": 10}], {"flickr": 10}, 0),
        ([{"source_name": "Flickr", "media_count": 10}], {"flickr": 10}, 0),
        ([{"source_name": " MET ", "image_count": 3.0}], {"met": 3}, 0),
        # image_count is preferred; null counts as absent
        ([{"source_name": "a", "image_count": 1, "media_count": 2}], {"a": 1}, 0),
        ([{"source_name": "a", "image_count": None, "media_count": 2}], {"a": 2}, 0),
        # a later entry of the same name replaces an earlier one
        (
            [{"source_name": "a", "image_count": 1}, {"source_name": "A", "image_count": 5}],
            {"a": 5},
            0,
        ),
        (
            [
                {"source_name": "good", "image_count": 7, "display_name": "Good"},
                {"source_name": "nocount"},
                {"source_name": "negative", "image_count": -1},
                {"source_name": "text", "image_count": "many"},
                {"source_name": "flag", "image_count": True},
                {"source_name": "half", "image_count": 2.5},
                {"source_name": "two words", "image_count": 1},
                {"source_name": "", "image_count": 1},
                {"source_name": 12, "image_count": 1},
                {"image_count": 1},
                "flickr",
                None,
                # Non-ASCII, even where lower() would make it ASCII (the Kelvin sign).
                {"source_name": "\u212a", "image_count": 1},
                {"source_name": "mus\u00e9e", "image_count": 1},
            ],
            {"good": 7},
            13,
        ),
    ],
)
def test_parse_sources(payload, counts, skipped):
    parsed = parse_sources(payload)
    assert dict(parsed.image_counts) == counts
    assert len(parsed.skipped) == skipped


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"<html>maintenance</html>",
        b'{"results": []}',
        b"[]",  # an empty list would stop the whole crawl: kept as unavailable
        b'[{"source_name": "x"}]',  # nothing usable
        b"\xff\xfe",
        b"null",
    ],
)
def test_garbage_is_unavailable(raw):
    with pytest.raises(SourcesUnavailable):
        decode_sources(raw)


def test_merge_prefers_the_url():
    assert merge_sources({"a": 1, "b": 2}, {"b": 20, "c": 30}) == {"a": 1, "b": 20, "c": 30}
    assert merge_sources(None, {"c": 3}) == {"c": 3}
    assert merge_sources({"a": 1}, None) == {"a": 1}
    assert merge_sources(None, None) == {}


def source_list(**counts: int) -> bytes:
    return json.dumps([{"source_name": n, "media_count": c} for n, c in counts.items()]).encode()


@pytest.fixture
async def http():
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        yield session


async def test_file_and_url_are_merged_and_outages_keep_the_last_list(tmp_path, origin, http):
    sources_file = tmp_path / "sources.json"
    sources_file.write_text(
        json.dumps(
            [
                {"source_name": "local", "image_count": 5_000},
                {"source_name": "shared", "image_count": 5_000},
            ]
        )
    )
    url = origin.add("/v1/sources", source_list(shared=1_000_000, flickr=500_000_000), "text/json")
    catalog = SourceCatalog(file=sources_file, url=url, http=http, refresh_s=60)
    await catalog.refresh()
    expected = {"local": 5_000, "shared": 1_000_000, "flickr": 500_000_000}
    assert dict(catalog.image_counts) == expected
    assert dict(catalog.rates) == {n: compute_crawl_rate(c) for n, c in expected.items()}

    outages = [
        lambda: origin.add_status("/v1/sources", 500),
        lambda: origin.add("/v1/sources", b"<html>oops</html>", "text/html"),
        lambda: origin.add("/v1/sources", b"[]", "application/json"),
        lambda: origin.remove("/v1/sources"),  # 404
    ]
    for outage in outages:
        outage()
        with capture_logs() as logs:
            await catalog.refresh()
        unavailable = [e for e in logs if e["event"] == "sources_unavailable"]
        assert [e["input"] for e in unavailable] == ["url"]
        assert unavailable[0]["keeping"] == 2
        assert dict(catalog.image_counts) == expected

    # The file goes away too: still the last known lists.
    sources_file.unlink()
    await catalog.refresh()
    assert dict(catalog.image_counts) == expected

    # Back, with a change.
    origin.add("/v1/sources", source_list(flickr=250_000_000), "application/json")
    sources_file.write_text(json.dumps([{"source_name": "local", "image_count": 10}]))
    await catalog.refresh()
    assert dict(catalog.image_counts) == {"local": 10, "flickr": 250_000_000}


async def test_an_unreachable_endpoint_is_unavailable(http):
    catalog = SourceCatalog(file=None, url="http://127.0.0.1:9/sources", http=http, refresh_s=60)
    with capture_logs() as logs:
        await catalog.refresh()
    assert [e["event"] for e in logs] == ["sources_unavailable"]
    assert catalog.rates == {}
    assert not catalog.complete


async def test_a_list_that_is_down_at_start_is_retried_soon(origin, http):
    origin.add_status("/sources", 503)
    catalog = SourceCatalog(
        file=None, url=origin.url("/sources"), http=http, refresh_s=3600, first_load_retry_s=0.05
    )
    stop = asyncio.Event()
    task = asyncio.create_task(catalog.run(stop))
    try:
        await wait_for(lambda: origin.requests("/sources") >= 2, 5, what="a retry")
        origin.add("/sources", source_list(late=10), "application/json")
        await wait_for(lambda: catalog.rates, 5, what="the list once it is back")
        assert dict(catalog.image_counts) == {"late": 10}
        assert catalog.complete
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


async def test_no_inputs_warns_and_returns():
    catalog = SourceCatalog(file=None, url=None, http=None, refresh_s=1)
    with capture_logs() as logs:
        await asyncio.wait_for(catalog.run(asyncio.Event()), 1)
    assert [e["event"] for e in logs] == ["no_sources_configured"]
    assert logs[0]["log_level"] == "warning"
