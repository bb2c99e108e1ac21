"""From the crawl's output messages to each row's ending (crawlctl/dataset/outcomes.py),
and the progress line (run.Tally)."""

from __future__ import annotations

import json

from crawlctl.dataset.layout import DUPLICATE, Duplicate, Ending, verdict
from crawlctl.dataset.outcomes import Joiner, Keeper
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


# --- --dedup: an image ends with its placement ------------------------------------------


def _placement(identifier: str, kind: str, of: str | None = None, distance: int = 0) -> bytes:
    return json.dumps(
        {"identifier": identifier, "source": "dataset", "kind": kind, "duplicate_of": of,
         "duplicate_of_source": None if of is None else "dataset",
         "distance": None if of is None else distance}
    ).encode()  # fmt: skip


def test_with_dedup_an_image_ends_once_its_placement_has_come_whichever_first() -> None:
    joiner = Joiner(RUN.key_of, Keeper("exact", RUN.key_of))
    assert joiner.add(c.METADATA_TOPIC, _resolution("abc123-000001")) is None
    assert joiner.waiting == 1
    ended = joiner.add(c.DUPLICATES_TOPIC, _placement("abc123-000001", "unique"))
    assert ended is not None and ended[1].duplicate is None
    placement = _placement("abc123-000002", "exact", "abc123-000001")
    assert joiner.add(c.DUPLICATES_TOPIC, placement) is None
    ended = joiner.add(c.METADATA_TOPIC, _resolution("abc123-000002"))
    assert ended is not None and ended[1].duplicate == Duplicate("000001", "exact", 0)
    assert joiner.waiting == 0
    # A failure has no placement and ends at once.
    rot = c.LinkRotMessage("abc123-000003", "t").to_json()
    assert joiner.add(c.LINK_ROT_TOPIC, rot) == ("000003", Ending("404"))


def test_without_dedup_placements_are_passed_over() -> None:
    joiner = Joiner(RUN.key_of)
    assert joiner.add(c.DUPLICATES_TOPIC, _placement("abc123-000002", "exact", "x")) is None
    assert joiner.add(c.METADATA_TOPIC, _resolution("abc123-000002")) is not None


def test_exact_mode_keeps_near_copies_and_near_mode_does_not() -> None:
    near = json.loads(_placement("abc123-000002", "near", "abc123-000001", 4))
    assert Keeper("exact", RUN.key_of).duplicate("000002", near) is None
    assert Keeper("near", RUN.key_of).duplicate("000002", near) == Duplicate("000001", "near", 4)
    assert Duplicate("000001", "near", 4).words() == "a near duplicate of 000001 (4 bits)"


def test_a_cluster_of_another_crawl_keeps_this_run_s_first_row_of_it_across_reruns() -> None:
    keeper = Keeper("exact", RUN.key_of)
    first = json.loads(_placement("abc123-000005", "exact", "other-crawl-uuid"))
    second = json.loads(_placement("abc123-000007", "exact", "other-crawl-uuid"))
    assert keeper.duplicate("000005", first) is None
    assert keeper.duplicate("000007", second) == Duplicate("000005", "exact", 0)
    assert keeper.duplicate("000005", first) is None  # the first placed again: kept still
    again = Keeper("exact", RUN.key_of, keeper.kept)  # a rerun, from the saved state
    assert again.duplicate("000007", second) == Duplicate("000005", "exact", 0)


def test_a_duplicate_is_its_own_status_with_the_kept_key_and_not_a_failure() -> None:
    resolution = c.ResolutionMessage.from_json(_resolution("abc123-000002"))
    ending = Ending("200", resolution, duplicate=Duplicate("000001", "exact", 0))
    assert verdict(ending) == (DUPLICATE, "an exact duplicate of 000001", "200")
    assert Ending.from_obj(json.loads(json.dumps(ending.to_obj()))) == ending
    tally = Tally(3)
    tally.add(ending, True)
    tally.add(Ending("200", resolution), True)
    assert (tally.images, tally.duplicates, sum(tally.failed.values())) == (1, 1, 0)
    assert "1 images, 1 duplicates, 0 failed" in tally.line()
