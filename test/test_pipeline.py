import asyncio
import json

import pytest
from structlog.testing import capture_logs

from image_crawler import contract as c
from test.corpus import good_images
from test.fakes import FakeFetcher, FakeSink, FakeStats, FakeStore, FakeTokens
from test.services import wait_for
from worker.fetch import FetchResult
from worker.pipeline import CRAWLED, DEAD_LETTERED, LINK_ROT, MALFORMED, RETRIED, Pipeline
from worker.processing import InlineProcessor

TOPIC = "urls.example"


def task(uuid="u-1", url="http://origin.test/a.jpg", attempts=0):
    return c.SourceTask(url=url, uuid=uuid, attempts=attempts).to_json()


def make(results=None, *, tokens=None, store=None, timeout_s=3600.0):
    parts = {
        "tokens": tokens or FakeTokens(),
        "fetcher": FakeFetcher(results or {}),
        "processor": InlineProcessor(),
        "store": store or FakeStore(),
        "sink": FakeSink(),
        "stats": FakeStats(),
    }
    return Pipeline(**parts, rate_limit_timeout_s=timeout_s, max_backoff_s=0.01), parts


def jpeg_with_exif():
    return next(i for i in good_images() if i.exif and i.content_type == "image/jpeg")


async def test_a_crawled_image_is_stored_published_and_counted():
    image = jpeg_with_exif()
    pipeline, p = make({"http://origin.test/a.jpg": FetchResult("200", body=image.body)})
    outcome = await pipeline.handle("example", task(), TOPIC)
    assert outcome == pipeline_outcome("200", CRAWLED)
    assert set(p["store"].objects) == {"u-1.jpg"}
    resolution, exif = p["sink"].messages[c.METADATA_TOPIC]
    assert resolution == {
        "identifier": "u-1",
        "width": image.width,
        "height": image.height,
        "filesize": len(image.body),
        "compression_quality": image.quality,
    }
    assert exif["identifier"] == "u-1"
    assert exif["exif"].items() >= image.exif.items()
    assert p["sink"].keys[c.METADATA_TOPIC] == [b"u-1", b"u-1"]
    assert p["stats"].outcomes == [("example", "200")]
    assert p["tokens"].taken == ["example"]


def pipeline_outcome(status, destination):
    from worker.pipeline import Outcome

    return Outcome(status, destination)


async def test_an_image_without_exif_sends_no_exif_message():
    image = next(i for i in good_images() if not i.exif)
    pipeline, p = make({"http://origin.test/a.jpg": FetchResult("200", body=image.body)})
    await pipeline.handle("example", task(), TOPIC)
    assert [set(m) for m in p["sink"].messages[c.METADATA_TOPIC]] == [
        {"identifier", "width", "height", "filesize", "compression_quality"}
    ]


async def test_404_goes_to_link_rot():
    pipeline, p = make({})
    outcome = await pipeline.handle("example", task(), TOPIC)
    assert outcome.destination == LINK_ROT
    (message,) = p["sink"].messages[c.LINK_ROT_TOPIC]
    assert message["identifier"] == "u-1" and "T" in message["timestamp"]
    assert p["stats"].outcomes == [("example", "404")]
    assert not p["store"].objects


@pytest.mark.parametrize("status", sorted(c.RETRYABLE_STATUSES))
async def test_retryable_statuses_are_retried_once_through_inbound_images(status):
    url = "http://origin.test/a.jpg"
    pipeline, p = make({url: FetchResult(status)})
    first = await pipeline.handle("example", task(url=url), TOPIC)
    assert first.destination == RETRIED
    (retry,) = p["sink"].messages[c.INBOUND_TOPIC]
    assert retry == {"url": url, "uuid": "u-1", "source": "example", "attempts": 1}
    second = await pipeline.handle("example", task(url=url, attempts=1), TOPIC)
    assert second.destination == DEAD_LETTERED
    (error,) = p["sink"].messages[c.CRAWL_ERRORS_TOPIC]
    assert error["status"] == status and error["attempts"] == 2 and error["source"] == "example"
    assert p["stats"].outcomes == [("example", status)] * 2


@pytest.mark.parametrize("status", ["410", "503", "Timeout", "TooLarge", "Blocked"])
async def test_other_failures_go_straight_to_crawl_errors(status):
    pipeline, p = make({"http://origin.test/a.jpg": FetchResult(status)})
    outcome = await pipeline.handle("example", task(), TOPIC)
    assert outcome.destination == DEAD_LETTERED
    assert p["sink"].messages[c.CRAWL_ERRORS_TOPIC][0]["status"] == status
    assert c.INBOUND_TOPIC not in p["sink"].messages


async def test_a_body_pillow_cannot_identify_is_counted_and_dead_lettered():
    pipeline, p = make({"http://origin.test/a.jpg": FetchResult("200", body=b"<html>nope</html>")})
    outcome = await pipeline.handle("example", task(), TOPIC)
    assert outcome == pipeline_outcome("UnidentifiedImageError", DEAD_LETTERED)
    assert p["stats"].outcomes == [("example", "UnidentifiedImageError")]
    assert not p["store"].objects


@pytest.mark.parametrize(
    "raw", [b"not json", b"[]", b'{"url": "x"}', b'{"uuid": "", "url": "x"}', None]
)
async def test_malformed_messages_are_dead_lettered_and_counted_without_a_request(raw):
    pipeline, p = make({})
    outcome = await pipeline.handle("example", raw, TOPIC)
    assert outcome.destination == MALFORMED
    (error,) = p["sink"].messages[c.CRAWL_ERRORS_TOPIC]
    assert set(error) == {"raw", "error", "topic", "time"} and error["topic"] == TOPIC
    assert p["stats"].malformed == 1
    assert p["fetcher"].requests == [] and p["tokens"].taken == []


async def test_without_a_token_no_request_is_made_and_the_wait_is_reported():
    tokens = FakeTokens(granted=set())
    image = jpeg_with_exif()
    pipeline, p = make(
        {"http://origin.test/a.jpg": FetchResult("200", body=image.body)},
        tokens=tokens,
        timeout_s=0.05,
    )
    with capture_logs() as logs:
        running = asyncio.create_task(pipeline.handle("example", task(), TOPIC))
        await wait_for(
            lambda: any(e["event"] == "rate_limit_timeout" for e in logs),
            5,
            what="rate_limit_timeout",
        )
        assert p["fetcher"].requests == []
        assert not running.done()
        tokens.grant_all()
        outcome = await asyncio.wait_for(running, 5)
    assert outcome.destination == CRAWLED
    timeout = next(e for e in logs if e["event"] == "rate_limit_timeout")
    assert timeout["source"] == "example" and timeout["identifier"] == "u-1"


async def test_a_store_that_is_away_stalls_the_url_instead_of_losing_it():
    image = jpeg_with_exif()
    pipeline, p = make(
        {"http://origin.test/a.jpg": FetchResult("200", body=image.body)},
        store=FakeStore(failures=3),
    )
    with capture_logs() as logs:
        outcome = await pipeline.handle("example", task(), TOPIC)
    assert outcome.destination == CRAWLED
    assert "u-1.jpg" in p["store"].objects
    assert sum(e["event"] == "dependency_unavailable" for e in logs) == 3
    assert json.loads(c.ResolutionMessage(**p["sink"].messages[c.METADATA_TOPIC][0]).to_json())


@pytest.mark.parametrize("body_kind", ["image", "broken"])
async def test_the_body_is_released_once_its_message_is_finished(body_kind):
    body = jpeg_with_exif().body if body_kind == "image" else b"not an image"
    released = []
    fetched = FetchResult(
        "200", body=body, release=lambda: released.append(len(p["store"].objects))
    )
    pipeline, p = make({"http://origin.test/a.jpg": fetched}, store=FakeStore(failures=2))
    await pipeline.handle("example", task(), TOPIC)
    # Once, and only after the thumbnail was stored (the store failed twice first).
    assert released == ([1] if body_kind == "image" else [0])
