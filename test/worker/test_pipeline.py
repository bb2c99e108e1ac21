import asyncio
import hashlib
import json
import re
from typing import Any

import pytest
from structlog.testing import capture_logs

from image_crawler import contract as c
from test.harness.corpus import good_images
from test.harness.fakes import FakeFetcher, FakePacer, FakeSink, FakeStats, FakeStore
from test.harness.services import wait_for
from worker.download.fetch import FetchResult
from worker.images.pool import InlineProcessor
from worker.pipeline import (
    CRAWLED,
    DEAD_LETTERED,
    LINK_ROT,
    MALFORMED,
    UNCHANGED,
    Ending,
    Pipeline,
    RetryPolicy,
)
from worker.politeness.hosts import HostKey
from worker.politeness.pacing import HostWaits
from worker.politeness.signals import NO_SIGNALS, Signals

TOPIC = "urls.example"


def task(uuid="u-1", url="http://origin.test/a.jpg", attempts=0):
    return c.SourceTask(url=url, uuid=uuid, attempts=attempts).to_json()


# Backoffs of a few milliseconds: the delays themselves are checked in test_retry_after.py.
FAST_RETRIES = RetryPolicy(backoff_base_s=0.001, backoff_cap_s=0.004)


def make(
    results=None, *, pacer=None, store=None, timeout_s=3600.0, retries=FAST_RETRIES, encoding=None
):
    parts = {
        "pacer": pacer or FakePacer(),
        "fetcher": FakeFetcher(results or {}),
        "processor": InlineProcessor(),
        "store": store or FakeStore(),
        "sink": FakeSink(),
        "stats": FakeStats(),
    }
    pipeline = Pipeline(
        **parts,
        retries=retries,
        rate_limit_timeout_s=timeout_s,
        max_backoff_s=0.01,
        encoding=encoding,
    )
    return pipeline, parts


def jpeg_with_exif():
    return next(i for i in good_images() if i.exif and i.content_type == "image/jpeg")


async def test_a_crawled_image_is_stored_published_and_counted():
    image = jpeg_with_exif()
    pipeline, p = make({"http://origin.test/a.jpg": FetchResult("200", body=image.body)})
    ending = await pipeline.handle("example", task(), TOPIC)
    assert ending == Ending("200", CRAWLED)
    assert set(p["store"].objects) == {"u-1.jpg"}
    resolution, exif = p["sink"].messages[c.METADATA_TOPIC]
    assert resolution == {
        "identifier": "u-1",
        "source": "example",
        "width": image.width,
        "height": image.height,
        "filesize": len(image.body),
        "compression_quality": image.quality,
        "sha256": hashlib.sha256(image.body).hexdigest(),
        "phash": resolution["phash"],  # worker/images/phash.py's tests hold its value
        "has_exif": True,
    }
    assert exif["identifier"] == "u-1"
    assert exif["exif"].items() >= image.exif.items()
    assert p["sink"].keys[c.METADATA_TOPIC] == [b"u-1", b"u-1"]
    assert p["stats"].outcomes == [("example", "200")]
    assert p["pacer"].taken == ["example"]


async def test_an_image_without_exif_sends_no_exif_message():
    image = next(i for i in good_images() if not i.exif)
    pipeline, p = make({"http://origin.test/a.jpg": FetchResult("200", body=image.body)})
    await pipeline.handle("example", task(), TOPIC)
    assert [set(m) for m in p["sink"].messages[c.METADATA_TOPIC]] == [
        {
            "identifier",
            "source",
            "width",
            "height",
            "filesize",
            "compression_quality",
            "sha256",
            "phash",
        }
    ]


ROW = c.RowData(caption="a fox", columns={"license": "cc-by"})
CROP = c.Encoding(image_size=64, resize_mode="center_crop", encode_format="webp")


async def test_a_dataset_row_is_stored_as_asked_and_its_caption_and_columns_published():
    image = jpeg_with_exif()
    pipeline, p = make({"http://origin.test/a.jpg": FetchResult("200", body=image.body)})
    message = c.SourceTask(url="http://origin.test/a.jpg", uuid="u-1", row=ROW, encoding=CROP)
    assert await pipeline.handle("example", message.to_json(), TOPIC) == Ending("200", CRAWLED)
    assert set(p["store"].objects) == {"u-1.webp"}
    assert p["store"].objects["u-1.webp"][:4] == b"RIFF"
    resolution = p["sink"].messages[c.METADATA_TOPIC][0]
    assert (resolution["width"], resolution["height"]) == (image.width, image.height)
    assert resolution["image"] == {"key": "u-1.webp", "width": 64, "height": 64}
    assert (resolution["caption"], resolution["columns"]) == (ROW.caption, ROW.columns)


async def test_a_worker_s_encoding_is_for_the_messages_that_ask_none():
    image = jpeg_with_exif()
    results = {
        f"http://origin.test/{n}.jpg": FetchResult("200", body=image.body) for n in ("a", "b")
    }
    pipeline, p = make(results, encoding=c.Encoding(encode_format="png", encode_quality=1))
    await pipeline.handle("example", task(url="http://origin.test/a.jpg"), TOPIC)
    asked = c.SourceTask(url="http://origin.test/b.jpg", uuid="u-2", encoding=CROP)
    await pipeline.handle("example", asked.to_json(), TOPIC)
    assert set(p["store"].objects) == {"u-1.png", "u-2.webp"}
    assert [m["image"]["key"] for m in p["sink"].messages[c.METADATA_TOPIC][::2]] == [
        "u-1.png",
        "u-2.webp",
    ]


async def test_an_image_an_encoding_refuses_is_dead_lettered_with_the_filter_s_status():
    image = jpeg_with_exif()
    pipeline, p = make({"http://origin.test/a.jpg": FetchResult("200", body=image.body)})
    small = c.Encoding(min_image_size=image.width + image.height)
    message = c.SourceTask(url="http://origin.test/a.jpg", uuid="u-1", encoding=small)
    ending = await pipeline.handle("example", message.to_json(), TOPIC)
    assert ending == Ending("ImageTooSmall", DEAD_LETTERED)
    assert not p["store"].objects
    assert [e["status"] for e in p["sink"].messages[c.CRAWL_ERRORS_TOPIC]] == ["ImageTooSmall"]


async def test_404_goes_to_link_rot():
    pipeline, p = make({})
    ending = await pipeline.handle("example", task(), TOPIC)
    assert ending.destination == LINK_ROT
    (message,) = p["sink"].messages[c.LINK_ROT_TOPIC]
    assert message["identifier"] == "u-1" and "T" in message["timestamp"]
    assert p["stats"].outcomes == [("example", "404")]
    assert not p["store"].objects


@pytest.mark.parametrize("status", sorted(c.RETRYABLE_STATUSES))
async def test_retryable_statuses_are_tried_up_to_max_attempts_then_dead_lettered(status):
    url = "http://origin.test/a.jpg"
    pipeline, p = make({url: FetchResult(status)})
    with capture_logs() as logs:
        ending = await pipeline.handle("example", task(url=url), TOPIC)
    assert ending == Ending(status, DEAD_LETTERED, attempts=c.MAX_ATTEMPTS)
    (error,) = p["sink"].messages[c.CRAWL_ERRORS_TOPIC]
    assert error["status"] == status and error["source"] == "example"
    assert error["attempts"] == c.MAX_ATTEMPTS
    assert p["fetcher"].requests == [url] * c.MAX_ATTEMPTS
    # Every try waited for its own slot and was counted.
    assert p["pacer"].taken == ["example"] * c.MAX_ATTEMPTS
    assert p["stats"].outcomes == [("example", status)] * c.MAX_ATTEMPTS
    retries = [e for e in logs if e["event"] == "retry_scheduled"]
    assert [e["attempts"] for e in retries] == list(range(1, c.MAX_ATTEMPTS))
    assert c.INBOUND_TOPIC not in p["sink"].messages  # retried here, not republished


def signals(p: dict[str, Any]) -> list[tuple[str, str]]:
    """The backoff signals reported to the hosts' pace: (source, status)."""
    return [
        (key.source, status)
        for key, status, slow in p["pacer"].reports
        if slow or status in c.BACKOFF_STATUSES
    ]


async def test_a_retry_that_succeeds_ends_with_the_image():
    url = "http://origin.test/a.jpg"
    image = jpeg_with_exif()
    pipeline, p = make({url: [FetchResult("503"), FetchResult("200", body=image.body)]})
    ending = await pipeline.handle("example", task(url=url), TOPIC)
    assert ending == Ending("200", CRAWLED, attempts=2)
    assert "u-1.jpg" in p["store"].objects
    assert p["stats"].outcomes == [("example", "503"), ("example", "200")]
    assert signals(p) == [("example", "503")]  # the 503 asked us to slow down
    assert c.CRAWL_ERRORS_TOPIC not in p["sink"].messages


async def test_the_attempts_of_an_inbound_message_count_towards_the_limit():
    url = "http://origin.test/a.jpg"
    pipeline, p = make({url: FetchResult("500")})
    ending = await pipeline.handle("example", task(url=url, attempts=3), TOPIC)
    assert ending.attempts == c.MAX_ATTEMPTS
    assert len(p["fetcher"].requests) == c.MAX_ATTEMPTS - 3
    assert p["sink"].messages[c.CRAWL_ERRORS_TOPIC][0]["attempts"] == c.MAX_ATTEMPTS


async def test_max_attempts_is_a_setting():
    url = "http://origin.test/a.jpg"
    retries = RetryPolicy(max_attempts=1, backoff_base_s=0.001, backoff_cap_s=0.001)
    pipeline, p = make({url: FetchResult("429")}, retries=retries)
    ending = await pipeline.handle("example", task(url=url), TOPIC)
    assert ending == Ending("429", DEAD_LETTERED, attempts=1)
    assert len(p["fetcher"].requests) == 1


@pytest.mark.parametrize(
    ("status", "header", "pause_s", "logged"),
    [
        ("429", "7", 7.0, {"retry_after"}),
        ("503", "120", 120.0, {"retry_after"}),
        ("429", "99999", c.MAX_RETRY_AFTER_S, {"retry_after_capped", "retry_after"}),
        (
            "503",
            "Wed, 21 Oct 2099 07:28:00 GMT",
            c.MAX_RETRY_AFTER_S,
            {"retry_after_capped", "retry_after"},
        ),
        ("429", "soon", None, {"retry_after_malformed"}),
        ("503", "-5", None, {"retry_after_malformed"}),
        ("429", "Wed, 21 Oct 2015 07:28:00 GMT", None, set()),  # already past: no wait
        ("500", "30", None, set()),  # only 429 and 503 speak for the whole source
    ],
)
async def test_a_retry_after_pauses_the_whole_source(status, header, pause_s, logged):
    url = "http://origin.test/a.jpg"
    image = jpeg_with_exif()
    answers = [FetchResult(status, retry_after=header), FetchResult("200", body=image.body)]
    pipeline, p = make({url: answers})
    with capture_logs() as logs:
        ending = await pipeline.handle("example", task(url=url), TOPIC)
    assert ending == Ending("200", CRAWLED, attempts=2)  # tried again after it
    assert p["pacer"].pauses == ([] if pause_s is None else [("example", pause_s)])
    events = {e["event"] for e in logs}
    assert events & {"retry_after", "retry_after_capped", "retry_after_malformed"} == logged


async def test_a_response_much_slower_than_usual_is_a_backoff_signal():
    url = "http://origin.test/a.jpg"
    image = jpeg_with_exif()
    usual = [FetchResult("200", body=image.body, response_s=0.05)] * 20
    slow = FetchResult("200", body=image.body, response_s=5.0)
    pipeline, p = make({url: [*usual, slow]})
    for _ in range(21):
        await pipeline.handle("example", task(url=url), TOPIC)
    assert signals(p) == [("example", "200")]  # the last one only


@pytest.mark.parametrize("status", ["410", "Timeout", "TooLarge", "Blocked", "DnsError"])
async def test_other_failures_go_straight_to_crawl_errors(status):
    pipeline, p = make({"http://origin.test/a.jpg": FetchResult(status)})
    ending = await pipeline.handle("example", task(), TOPIC)
    assert ending.destination == DEAD_LETTERED
    assert p["sink"].messages[c.CRAWL_ERRORS_TOPIC][0]["status"] == status
    assert p["sink"].messages[c.CRAWL_ERRORS_TOPIC][0]["attempts"] == 1
    assert len(p["fetcher"].requests) == 1
    assert c.INBOUND_TOPIC not in p["sink"].messages
    # A timeout is a backoff signal too, though it is not tried again.
    assert signals(p) == ([("example", status)] if status == "Timeout" else [])
    # A fetch that reached no server (an address refused, a name that did not resolve)
    # says nothing of the host's server: nothing reported.
    reported = [status for _, status, _ in p["pacer"].reports]
    assert reported == ([] if status in {"Blocked", "DnsError"} else [status])


async def test_a_body_pillow_cannot_identify_is_counted_and_dead_lettered():
    pipeline, p = make({"http://origin.test/a.jpg": FetchResult("200", body=b"<html>nope</html>")})
    ending = await pipeline.handle("example", task(), TOPIC)
    assert ending == Ending("UnidentifiedImageError", DEAD_LETTERED)
    assert p["stats"].outcomes == [("example", "UnidentifiedImageError")]
    assert not p["store"].objects


@pytest.mark.parametrize(
    "raw", [b"not json", b"[]", b'{"url": "x"}', b'{"uuid": "", "url": "x"}', None]
)
async def test_malformed_messages_are_dead_lettered_and_counted_without_a_request(raw):
    pipeline, p = make({})
    ending = await pipeline.handle("example", raw, TOPIC)
    assert ending.destination == MALFORMED
    (error,) = p["sink"].messages[c.CRAWL_ERRORS_TOPIC]
    assert set(error) == {"raw", "error", "topic", "time"} and error["topic"] == TOPIC
    assert p["stats"].malformed == 1
    assert p["fetcher"].requests == [] and p["pacer"].taken == []


async def test_without_a_slot_no_request_is_made_and_the_wait_is_reported():
    pacer = FakePacer(granted=set())
    image = jpeg_with_exif()
    pipeline, p = make(
        {"http://origin.test/a.jpg": FetchResult("200", body=image.body)},
        pacer=pacer,
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
        pacer.grant_all()
        ending = await asyncio.wait_for(running, 5)
    assert ending.destination == CRAWLED
    timeout = next(e for e in logs if e["event"] == "rate_limit_timeout")
    assert timeout["source"] == "example" and timeout["identifier"] == "u-1"


async def test_a_store_that_is_away_stalls_the_url_instead_of_losing_it():
    image = jpeg_with_exif()
    pipeline, p = make(
        {"http://origin.test/a.jpg": FetchResult("200", body=image.body)},
        store=FakeStore(failures=3),
    )
    with capture_logs() as logs:
        ending = await pipeline.handle("example", task(), TOPIC)
    assert ending.destination == CRAWLED
    assert "u-1.jpg" in p["store"].objects
    assert sum(e["event"] == "dependency_unavailable" for e in logs) == 3
    assert json.loads(c.ResolutionMessage(**p["sink"].messages[c.METADATA_TOPIC][0]).to_json())


class AwayStore(FakeStore):
    """Fails every put until ``back`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.back = asyncio.Event()
        self.tries = 0

    async def put(self, key: str, data: bytes) -> None:
        self.tries += 1
        if not self.back.is_set():
            self.failures = 1
        await super().put(key, data)


async def test_no_request_starts_while_a_store_that_is_away_holds_a_fetched_image():
    # A fetched image waits for the store in memory; another fetched meanwhile would be
    # requested twice if the worker died before the store came back.
    image = jpeg_with_exif()
    urls = ["http://origin.test/a.jpg", "http://origin.test/b.jpg"]
    store = AwayStore()
    pipeline, p = make({u: FetchResult("200", body=image.body) for u in urls}, store=store)
    with capture_logs() as logs:
        first = asyncio.ensure_future(pipeline.handle("example", task("u-1", urls[0]), TOPIC))
        await wait_for(lambda: store.tries >= 2, 5, what="the store failing")
        second = asyncio.ensure_future(pipeline.handle("example", task("u-2", urls[1]), TOPIC))
        await wait_for(lambda: any(e["event"] == "requests_held" for e in logs), 5)
        assert p["fetcher"].requests == urls[:1]
        store.back.set()
        endings = await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert [e.destination for e in endings] == [CRAWLED, CRAWLED]
    assert p["fetcher"].requests == urls
    assert set(store.objects) == {"u-1.jpg", "u-2.jpg"}
    assert any(e["event"] == "requests_resumed" for e in logs)


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


# --- what the server says of the image's use -------------------------------------------------
class ConsultingRobots:
    """What a host's robots.txt and tdmrep.json say, as RobotsGuard.consult answers."""

    def __init__(self, status: str | None = None, signals: Signals = NO_SIGNALS) -> None:
        self.answer = (status, signals)

    async def consult(self, source: str, url: str) -> tuple[str | None, Signals]:
        return self.answer

    async def hop_status(self, source: str, hop: object) -> str | None:
        return None


async def test_an_answer_that_asks_not_to_be_indexed_ends_in_crawl_errors_with_its_directives():
    said = Signals(noindex=("noindex", "image-crawler: noimageindex"))
    fetched = FetchResult(c.Status.NO_INDEX, detail="noindex, ...", signals=said)
    pipeline, p = make({"http://origin.test/a.jpg": fetched})
    ending = await pipeline.handle("example", task(), TOPIC)
    assert ending == Ending("NoIndex", DEAD_LETTERED, 1)  # tried once: never again
    assert not p["store"].objects and c.METADATA_TOPIC not in p["sink"].messages
    (error,) = p["sink"].messages[c.CRAWL_ERRORS_TOPIC]
    assert error["status"] == "NoIndex"
    assert error["directives"] == ["noindex", "image-crawler: noimageindex"]
    assert p["stats"].outcomes == [("example", "NoIndex")]
    assert not c.Status.retried("NoIndex") and c.Status.expected("NoIndex")


async def test_a_host_whose_robots_txt_says_search_no_is_not_requested():
    said = Signals(noindex=("content-signal: search=no",), opt_outs=("ai-train",))
    pipeline, p = make({})
    pipeline._robots = ConsultingRobots(c.Status.NO_INDEX, said)
    ending = await pipeline.handle("example", task(), TOPIC)
    assert ending == Ending("NoIndex", DEAD_LETTERED, 0)
    assert p["fetcher"].requests == [] and p["pacer"].taken == []
    (error,) = p["sink"].messages[c.CRAWL_ERRORS_TOPIC]
    assert error["directives"] == ["content-signal: search=no"]


@pytest.mark.parametrize(
    ("host", "answer", "opt_outs", "policy"),
    [
        (NO_SIGNALS, Signals(opt_outs=("noai", "noimageai")), ["noai", "noimageai"], None),
        (
            Signals(opt_outs=("ai-train",)),
            Signals(opt_outs=("tdm-reservation",), tdm_policy="https://e.org/p.json"),
            ["ai-train", "tdm-reservation"],
            "https://e.org/p.json",
        ),
        (
            Signals(opt_outs=("tdm-reservation",), tdm_policy="https://host/p"),
            NO_SIGNALS,
            ["tdm-reservation"],
            "https://host/p",
        ),
    ],
)
async def test_opt_outs_are_published_with_the_image(host, answer, opt_outs, policy):
    image = next(i for i in good_images() if not i.exif)
    fetched = FetchResult("200", body=image.body, signals=answer)
    pipeline, p = make({"http://origin.test/a.jpg": fetched})
    pipeline._robots = ConsultingRobots(None, host)
    assert await pipeline.handle("example", task(), TOPIC) == Ending("200", CRAWLED)
    (resolution,) = p["sink"].messages[c.METADATA_TOPIC]
    assert resolution["opt_outs"] == opt_outs
    assert resolution.get("tdm_policy") == policy
    assert c.ResolutionMessage.from_json(json.dumps(resolution)).opt_outs == tuple(opt_outs)


# --- re-checks ---------------------------------------------------------------------------------
URL = "http://origin.test/a.jpg"
ETAG = '"5f3-1a2b"'
DATE = "Tue, 03 Nov 2026 10:00:00 GMT"


def recheck(earlier=None, uuid="u-1"):
    earlier = earlier or c.Earlier(etag=ETAG, last_modified=DATE)
    return c.SourceTask(url=URL, uuid=uuid, earlier=earlier).to_json()


def the_check(p):
    (check,) = p["sink"].messages[c.LINK_CHECKS_TOPIC]
    assert p["sink"].keys[c.LINK_CHECKS_TOPIC] == [b"u-1"]
    assert (
        c.LinkCheckMessage.from_json(json.dumps(check)).to_json()
        == json.dumps(check, separators=(",", ":")).encode()
    )
    return {k: v for k, v in check.items() if k != "time"}


async def test_a_crawl_publishes_the_body_hashes_and_the_validators_as_sent():
    image = next(i for i in good_images() if not i.exif)
    fetched = FetchResult("200", body=image.body, etag=ETAG, last_modified=DATE)
    pipeline, p = make({URL: fetched})
    assert await pipeline.handle("example", task(), TOPIC) == Ending("200", CRAWLED)
    (resolution,) = p["sink"].messages[c.METADATA_TOPIC]
    assert resolution["sha256"] == hashlib.sha256(image.body).hexdigest()
    assert re.fullmatch("[0-9a-f]{16}", resolution["phash"])
    assert (resolution["etag"], resolution["last_modified"]) == (ETAG, DATE)
    assert p["fetcher"].conditions == [None]  # a plain crawl asks for the file as is
    assert c.LINK_CHECKS_TOPIC not in p["sink"].messages and p["stats"].checks == []


async def test_an_unchanged_file_answered_304_is_reported_and_nothing_else():
    pipeline, p = make({URL: FetchResult("304")})
    assert await pipeline.handle("example", recheck(), TOPIC) == Ending("304", UNCHANGED)
    assert p["fetcher"].conditions == [{"If-None-Match": ETAG, "If-Modified-Since": DATE}]
    assert the_check(p) == {
        "identifier": "u-1",
        "url": URL,
        "status": "unchanged",
        "http_status": 304,
    }
    assert set(p["sink"].messages) == {c.LINK_CHECKS_TOPIC} and not p["store"].objects
    # A success for the breakers (an expected status) and for pacing (no backoff signal).
    assert p["stats"].outcomes == [("example", "304")] and signals(p) == []
    assert p["stats"].checks == [("example", "unchanged")]
    assert p["pacer"].taken == ["example"]  # paced like any request


async def test_a_server_that_ignores_the_condition_and_sends_the_same_body_is_unchanged():
    image = next(i for i in good_images() if not i.exif)
    earlier = c.Earlier(etag=ETAG, sha256=hashlib.sha256(image.body).hexdigest())
    released = []
    fetched = FetchResult(
        "200", body=(image.body[:10], image.body[10:]), release=lambda: released.append(1)
    )
    pipeline, p = make({URL: fetched})
    assert await pipeline.handle("example", recheck(earlier), TOPIC) == Ending("200", UNCHANGED)
    assert the_check(p)["status"] == "unchanged" and the_check(p)["http_status"] == 200
    assert set(p["sink"].messages) == {c.LINK_CHECKS_TOPIC} and not p["store"].objects
    assert released == [1]


async def test_a_changed_file_is_crawled_again_with_its_new_metadata():
    image = next(i for i in good_images() if not i.exif)
    earlier = c.Earlier(etag='"old"', sha256="0" * 64)
    fetched = FetchResult("200", body=image.body, etag='"new"', last_modified=DATE)
    pipeline, p = make({URL: fetched})
    assert await pipeline.handle("example", recheck(earlier), TOPIC) == Ending("200", CRAWLED)
    (resolution,) = p["sink"].messages[c.METADATA_TOPIC]
    assert resolution["etag"] == '"new"'
    assert resolution["sha256"] == hashlib.sha256(image.body).hexdigest()
    assert set(p["store"].objects) == {"u-1.jpg"}
    assert the_check(p) == {
        "identifier": "u-1",
        "url": URL,
        "status": "changed",
        "http_status": 200,
    }
    assert p["stats"].checks == [("example", "changed")]


@pytest.mark.parametrize("code", ["404", "410"])
async def test_a_deleted_file_is_gone_and_on_link_rot(code):
    pipeline, p = make({URL: FetchResult(code)})
    assert await pipeline.handle("example", recheck(), TOPIC) == Ending(code, LINK_ROT)
    assert [m["identifier"] for m in p["sink"].messages[c.LINK_ROT_TOPIC]] == ["u-1"]
    assert the_check(p)["status"] == "gone" and the_check(p)["http_status"] == int(code)
    assert c.CRAWL_ERRORS_TOPIC not in p["sink"].messages


async def test_a_410_of_a_plain_crawl_is_still_a_crawl_error():
    pipeline, p = make({URL: FetchResult("410")})
    assert await pipeline.handle("example", task(), TOPIC) == Ending("410", DEAD_LETTERED)
    assert c.LINK_CHECKS_TOPIC not in p["sink"].messages


async def test_a_304_to_a_plain_crawl_is_a_crawl_error():
    pipeline, p = make({URL: FetchResult("304")})
    assert await pipeline.handle("example", task(), TOPIC) == Ending("304", DEAD_LETTERED)
    assert c.LINK_CHECKS_TOPIC not in p["sink"].messages


@pytest.mark.parametrize(
    ("fetched", "status", "http", "destination"),
    [
        (FetchResult("500"), "500", 500, DEAD_LETTERED),
        (FetchResult("Timeout"), "Timeout", None, DEAD_LETTERED),
        (FetchResult("200", body=b"not an image"), "UnidentifiedImageError", 200, DEAD_LETTERED),
    ],
)
async def test_a_failed_re_check_is_a_crawl_error_and_a_failed_check(
    fetched, status, http, destination
):
    pipeline, p = make({URL: fetched})
    ending = await pipeline.handle("example", recheck(), TOPIC)
    assert (ending.status, ending.destination) == (status, destination)
    (error,) = p["sink"].messages[c.CRAWL_ERRORS_TOPIC]
    assert error["status"] == status
    assert the_check(p) == {
        "identifier": "u-1",
        "url": URL,
        "status": "failed",
        "http_status": http,
        "error": status,
    }
    assert p["stats"].checks == [("example", "failed")]


async def test_a_re_check_robots_txt_refuses_is_a_failed_check_without_a_request():
    pipeline, p = make({})
    pipeline._robots = ConsultingRobots(c.Status.ROBOTS_DISALLOWED)
    ending = await pipeline.handle("example", recheck(), TOPIC)
    assert ending == Ending("RobotsDisallowed", DEAD_LETTERED, 0)
    assert p["fetcher"].requests == []
    assert the_check(p)["status"] == "failed" and the_check(p)["http_status"] is None


async def test_a_url_of_a_host_given_up_ends_without_a_request():
    pipeline, p = make({"http://origin.test/a.jpg": FetchResult("200")})
    p["pacer"].gone.add("origin.test")
    ending = await pipeline.handle("example", task(), TOPIC)
    assert ending == Ending(c.Status.HOST_UNAVAILABLE, DEAD_LETTERED, attempts=1)
    assert p["fetcher"].requests == []
    assert p["sink"].messages[c.CRAWL_ERRORS_TOPIC][0]["status"] == "HostUnavailable"


async def test_a_url_of_a_blocked_host_goes_back_to_the_scheduler_without_a_request():
    pipeline, p = make({"http://origin.test/a.jpg": FetchResult("200")})
    p["pacer"].halted["origin.test"] = 30.0
    with pytest.raises(HostWaits) as waits:
        await pipeline.handle("example", task(), TOPIC)
    assert waits.value.key == HostKey("example", "origin.test") and waits.value.wait_s == 30
    assert p["fetcher"].requests == [] and p["stats"].outcomes == []
    assert p["sink"].messages == {}


async def test_the_scheduler_knows_a_message_s_host_and_parks_it_on_its_topic():
    pipeline, p = make({})
    raw = task(url="http://Images.Origin.test:8080/a.jpg")
    assert pipeline.host_key("example", raw) == HostKey("example", "images.origin.test")
    assert pipeline.host_key("example", b"{not json") is None
    await pipeline.park("example", raw, TOPIC)
    assert p["sink"].messages[TOPIC] == [json.loads(raw)]
    assert p["sink"].keys[TOPIC] == [json.loads(raw)["uuid"].encode()]


async def test_a_request_waits_for_memory_before_its_slot_never_between_them():
    pipeline, p = make({"http://origin.test/a.jpg": FetchResult("200", body=jpeg_with_exif().body)})
    fetcher, gate = p["fetcher"], asyncio.Event()
    reserve = fetcher.reserve

    async def reserve_when_open():
        await gate.wait()  # the byte budget is spent
        return await reserve()

    fetcher.reserve = reserve_when_open
    handled = asyncio.create_task(pipeline.handle("example", task(), TOPIC))
    await asyncio.sleep(0.01)
    assert p["pacer"].keys == [] and fetcher.requests == []  # no slot taken yet
    gate.set()
    assert (await handled).status == "200"
    assert p["pacer"].keys == [HostKey("example", "origin.test")]
    assert fetcher.reserved == fetcher.released == 1
    # A URL whose host was given up gives its reservation back unused.
    p["pacer"].gone.add("origin.test")
    await pipeline.handle("example", task(uuid="u2"), TOPIC)
    assert fetcher.reserved == fetcher.released == 2


async def test_each_redirect_hop_takes_a_slot_of_its_own_host():
    url = "http://origin.test/a.jpg"
    pipeline, p = make({url: FetchResult("200", body=jpeg_with_exif().body)})
    p["fetcher"].hops[url] = ["http://cdn.test/a.jpg", "http://cdn.test/b.jpg"]
    await pipeline.handle("example", task(url=url), TOPIC)
    origin, cdn = HostKey("example", "origin.test"), HostKey("example", "cdn.test")
    assert p["pacer"].keys == [origin, cdn, cdn]
    # A hop to a host given up ends the URL as HostUnavailable, with no request.
    p["pacer"].gone.add("cdn.test")
    ending = await pipeline.handle("example", task(url=url, uuid="u2"), TOPIC)
    assert ending.status == c.Status.HOST_UNAVAILABLE


async def test_each_answer_is_reported_to_its_host_and_a_retry_after_pauses_the_host():
    url = "http://Images.Origin.test:8080/a.jpg"
    limited = FetchResult("429", retry_after="2")
    pipeline, p = make({url: [limited, FetchResult("404")]})
    await pipeline.handle("example", task(url=url), TOPIC)
    key = HostKey("example", "images.origin.test")
    assert [(k, status) for k, status, _ in p["pacer"].reports] == [(key, "429"), (key, "404")]
    assert p["pacer"].paused_keys == [key]
