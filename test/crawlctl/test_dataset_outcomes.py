"""From the crawl's output messages to each row's ending (crawlctl/dataset/outcomes.py),
and the progress line (run.Tally)."""

from __future__ import annotations

import json

from crawlctl.dataset.layout import Ending
from crawlctl.dataset.outcomes import Joiner
from crawlctl.dataset.run import Tally
from crawlctl.dataset.state import RunInfo
from image_crawler import contract as c

RUN = RunInfo("abc123", "dataset", 10, 1, {})


def _resolution(identifier: str, **fields: object) -> bytes:
    message = c.ResolutionMessage(identifier, 640, 480, 1000, 90, **fields)  # type: ignore[arg-type]
    return message.to_json()


def _exif(identifier: str) -> bytes:
    return json.dumps({"identifier": identifier, "exif": {"0x13b": "Ann"}}).encode()


def test_a_resolution_without_exif_ends_its_row() -> None:
    joiner = Joiner(RUN.key_of)
    key, ending = joiner.add(c.METADATA_TOPIC, _resolution("abc123-000001")) or ("", None)
    assert key == "000001" and ending is not None and ending.crawled and ending.exif is None


def test_a_resolution_with_exif_waits_for_it_whichever_comes_first() -> None:
    joiner = Joiner(RUN.key_of)
    assert joiner.add(c.METADATA_TOPIC, _resolution("abc123-000001", has_exif=True)) is None
    assert joiner.waiting == 1
    ended = joiner.add(c.METADATA_TOPIC, _exif("abc123-000001"))
    assert ended is not None and ended[1].exif == {"0x13b": "Ann"}
    # The other order.
    assert joiner.add(c.METADATA_TOPIC, _exif("abc123-000002")) is None
    ended = joiner.add(c.METADATA_TOPIC, _resolution("abc123-000002", has_exif=True))
    assert ended is not None and ended[1].exif == {"0x13b": "Ann"}
    assert joiner.waiting == 0


def test_link_rot_and_crawl_errors_end_rows_as_failures() -> None:
    joiner = Joiner(RUN.key_of)
    rot = c.LinkRotMessage("abc123-000003", "t").to_json()
    assert joiner.add(c.LINK_ROT_TOPIC, rot) == ("000003", Ending("404"))
    error = c.CrawlError("abc123-000004", "http://x/a", "dataset", "NoIndex", 1, "t", ("noindex",))
    assert joiner.add(c.CRAWL_ERRORS_TOPIC, error.to_json()) == (
        "000004",
        Ending("NoIndex", detail="noindex"),
    )


def test_messages_of_other_crawls_and_unreadable_ones_are_passed_over() -> None:
    joiner = Joiner(RUN.key_of)
    unparsed = c.UnparseableMessage.from_raw(b"{", "not JSON", "inbound_images").to_json()
    for topic, value in [
        (c.METADATA_TOPIC, _resolution("another-000001")),
        (c.METADATA_TOPIC, _resolution("7563efd4-58d0-41eb-9a4f-3903d36a5225")),
        (c.CRAWL_ERRORS_TOPIC, unparsed),
        (c.METADATA_TOPIC, b"not json"),
        (c.LINK_ROT_TOPIC, b"[1, 2]"),
        (c.LINK_ROT_TOPIC, None),
    ]:
        assert joiner.add(topic, value) is None


def test_the_progress_line_counts_failures_by_reason_and_gives_an_eta() -> None:
    tally = Tally(total=100)
    tally.began = 0.0
    image = Ending("200", c.ResolutionMessage("u", 1, 1, 1, None))
    for n in range(30):
        tally.add(image if n % 3 else Ending("404"), True, now=n / 3)
    assert tally.line(now=10.0) == (
        "30/100 rows ended: 20 images, 10 failed (404 10); 3.0 rows/s; ETA 23 s"
    )
