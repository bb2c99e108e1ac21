import dataclasses
import json

import pytest

from image_crawler import contract as c

SHA = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"


@pytest.mark.parametrize(
    "message",
    [
        c.InboundImage(url="https://example.gov/a.jpg", uuid="u-1", source="example"),
        c.InboundImage(url="https://example.gov/a.jpg", uuid="u-1", source="example", attempts=1),
        c.SourceTask(url="https://example.gov/a.jpg", uuid="u-1"),
        c.InboundImage(
            url="https://example.gov/a.jpg",
            uuid="u-1",
            source="example",
            earlier=c.Earlier(etag='W/"5f-1a"', last_modified="Tue, 03 Nov 2026 10:00:00 GMT"),
        ),
        c.SourceTask(url="https://example.gov/a.jpg", uuid="u-1", earlier=c.Earlier(sha256=SHA)),
        c.ResolutionMessage(
            identifier="u",
            width=1,
            height=2,
            filesize=3,
            compression_quality=None,
            sha256=SHA,
            phash="d1c4b2a3f0e19887",
            etag='"5f-1a"',
            last_modified="Tue, 03 Nov 2026 10:00:00 GMT",
        ),
        c.LinkCheckMessage(
            identifier="u", url="http://x/y", status="gone", http_status=410, time="t"
        ),
        c.LinkCheckMessage(
            identifier="u",
            url="http://x/y",
            status="failed",
            http_status=None,
            time="t",
            error="Timeout",
        ),
        c.ResolutionMessage(
            identifier="u", width=640, height=480, filesize=1234, compression_quality=75
        ),
        c.ResolutionMessage(
            identifier="u", width=1, height=2, filesize=3, compression_quality=None
        ),
        c.ExifMessage(identifier="u", exif={"0x13b": "Alden Page", "0x9209": 0}),
        c.LinkRotMessage(identifier="u", timestamp="2026-11-21T00:00:00+00:00"),
        c.CrawlError(
            identifier="u", url="http://x/y", source="s", status="500", attempts=2, time="t"
        ),
        c.UnparseableMessage(raw="{", error="not JSON", topic="urls.s", time="t"),
    ],
)
def test_every_message_round_trips(message):
    assert type(message).from_json(message.to_json()) == message


def test_inbound_without_attempts_omits_the_field():
    raw = c.InboundImage(url="u", uuid="i", source="s").to_json()
    assert json.loads(raw) == {"url": "u", "uuid": "i", "source": "s"}


def test_source_task_drops_the_source_and_keeps_attempts():
    inbound = c.InboundImage(url="u", uuid="i", source="s", attempts=1)
    assert json.loads(inbound.to_source_task().to_json()) == {
        "url": "u",
        "uuid": "i",
        "attempts": 1,
    }


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'"a string"', "not a JSON object"),
        (b'{"uuid": "i"}', "'url'"),
        (b'{"url": "", "uuid": "i"}', "'url'"),
        (b'{"url": "u", "uuid": 7}', "'uuid'"),
        (b'{"url": "u", "uuid": "i", "attempts": -1}', "'attempts'"),
        (b'{"url": "u", "uuid": "i", "attempts": true}', "'attempts'"),
    ],
)
def test_malformed_source_tasks_say_why(raw, reason):
    with pytest.raises(c.MalformedMessage, match=reason):
        c.SourceTask.from_json(raw)


def test_a_re_check_keeps_its_fields_through_the_splitter_and_back():
    earlier = c.Earlier(etag='"e"', last_modified="Tue, 03 Nov 2026 10:00:00 GMT", sha256=SHA)
    inbound = c.InboundImage(url="u", uuid="i", source="s", earlier=earlier)
    task = c.SourceTask.from_json(inbound.to_source_task().to_json())
    assert task.earlier == earlier
    assert task.with_source("s") == inbound
    assert json.loads(task.to_json()) == {
        "url": "u",
        "uuid": "i",
        "etag": '"e"',
        "last_modified": "Tue, 03 Nov 2026 10:00:00 GMT",
        "sha256": SHA,
    }


def test_a_message_without_earlier_fields_is_a_plain_crawl():
    assert c.SourceTask.from_json(b'{"url": "u", "uuid": "i", "etag": null}').earlier is None


def test_a_hash_in_capitals_is_the_same_hash():
    raw = json.dumps({"url": "u", "uuid": "i", "sha256": SHA.upper()})
    assert c.SourceTask.from_json(raw).earlier == c.Earlier(sha256=SHA)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"etag": ""}, "'etag'"),
        ({"etag": 7}, "'etag'"),
        ({"etag": '"a"\r\nX-Injected: 1'}, "'etag'"),
        ({"etag": "x" * (c.MAX_VALIDATOR_CHARS + 1)}, "'etag'"),
        ({"etag": '"\u2603"'}, "'etag'"),  # not Latin-1: no header carries it
        ({"last_modified": "Tue\x00"}, "'last_modified'"),
        ({"last_modified": ["Tue"]}, "'last_modified'"),
        ({"sha256": "abc"}, "'sha256'"),
        ({"sha256": "z" * 64}, "'sha256'"),
        ({"sha256": 12}, "'sha256'"),
    ],
)
def test_hostile_re_check_fields_make_a_malformed_message(fields, reason):
    raw = json.dumps({"url": "u", "uuid": "i", "source": "s", **fields})
    with pytest.raises(c.MalformedMessage, match=reason):
        c.InboundImage.from_json(raw)


def test_a_resolution_message_leaves_out_what_the_server_did_not_send():
    message = c.ResolutionMessage(
        identifier="u",
        width=1,
        height=2,
        filesize=3,
        compression_quality=None,
        sha256=SHA,
        phash="0" * 16,
    )
    assert json.loads(message.to_json()) == {
        "identifier": "u",
        "width": 1,
        "height": 2,
        "filesize": 3,
        "compression_quality": None,
        "sha256": SHA,
        "phash": "0" * 16,
    }


def test_unparseable_message_caps_raw_at_4_kib():
    message = c.UnparseableMessage.from_raw(b"x" * 10_000, "too big", "urls.s")
    assert len(message.raw) == 4096


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        # "é" is two bytes: the cap cuts it in two, and the half is dropped, not replaced.
        ("x" * 4095 + "é" * 10, "x" * 4095),
        ("é" * 3000, "é" * 2048),
        # Invalid bytes are replaced with U+FFFD, three bytes each: as many as fit.
        (b"\xff" * 5000, "\ufffd" * 1365),
        (b"ab\xffcd", "ab\ufffdcd"),
    ],
)
def test_raw_is_at_most_4_kib_of_utf8(raw: str | bytes, expected: str) -> None:
    body = raw.encode() if isinstance(raw, str) else raw
    message = c.UnparseableMessage.from_raw(body, "not JSON", "urls.s")
    assert message.raw == expected
    assert len(message.raw.encode()) <= c.RAW_MESSAGE_CAP_BYTES


@pytest.mark.parametrize(
    ("source", "valid"),
    [
        ("flickr", True),
        ("met-museum_2.0", True),
        ("", False),
        ("has space", False),
        ("slash/y", False),
        ("a" * 244, True),
        ("a" * 245, False),
        ("ünï", False),
    ],
)
def test_source_names_must_make_legal_topic_names(source, valid):
    assert c.is_valid_source_name(source) is valid


def test_topic_and_source_names_invert():
    assert c.source_of_topic(c.source_topic("flickr")) == "flickr"
    assert c.source_of_topic("inbound_images") is None
    assert c.source_of_topic("urls.") is None


def test_window_members_carry_status_and_time():
    member = c.window_member("500", 1700000000.25)
    assert member == "500:1700000000.250000"
    assert c.status_of_window_member(member) == "500"


@pytest.mark.parametrize(
    "info",
    [
        c.PacingInfo(35.0, 50.0, "computed", c.PACE_BACKOFF, "3 backoff signals: cut to 0.7 x"),
        c.PacingInfo(1e-05, 0.2, "override-rate:", c.PACE_FLOOR, 'a "quoted" why \u00e9'),
        c.PacingInfo(0.0, 0.0, "override_rate:", c.PACE_STOPPED, "stopped: configured at 0"),
        c.PacingInfo(17.2, 50.0, "computed", c.PACE_RECOVERING, "recovering", 1764000000.123),
    ],
)
def test_pacing_info_is_encoded_with_every_field_and_decodes_to_itself(info):
    # to_json builds its object by hand: it must still hold every field, as asdict would.
    assert json.loads(info.to_json()) == dataclasses.asdict(info)
    assert c.PacingInfo.from_json(info.to_json()) == info


def test_a_pacing_record_without_its_time_is_one_of_an_older_monitor():
    older = (
        '{"rate_rps": 17.2, "configured_rps": 50, "origin": "computed", "state": "x", "why": ""}'
    )
    assert c.PacingInfo.from_json(older).decided_at_s is None
    with pytest.raises(c.MalformedMessage):
        c.PacingInfo.from_json(older.replace("}", ', "decided_at_s": "yesterday"}'))


def test_every_status_the_sets_name_is_a_member_and_equals_its_string():
    named = c.EXPECTED_STATUSES | c.RETRYABLE_STATUSES | c.BACKOFF_STATUSES | c.RETRY_AFTER_STATUSES
    for status in named:
        assert isinstance(status, c.Status), status
    assert c.Status("404") is c.Status.NOT_FOUND and c.Status.NOT_FOUND == "404"
    assert json.dumps({"status": c.Status.TIMEOUT}) == '{"status": "Timeout"}'
    assert f"{c.Status.ROBOTS_DISALLOWED}" == "RobotsDisallowed"
    assert {c.Status.OK: 1}["200"] == 1  # statuses read back from Redis are strings


@pytest.mark.parametrize(
    ("status", "expected", "retried", "backoff"),
    [
        ("200", True, False, False),
        ("304", True, False, False),  # a re-check's "unchanged": a success
        ("404", True, False, False),
        ("410", False, False, False),
        ("RobotsDisallowed", True, False, False),
        ("RobotsUnavailable", True, False, False),
        # Final, like a 404, and a host's: never a breaker error, never tried again.
        ("DnsError", True, False, False),
        ("NoRateToken", True, False, False),  # the original's, still in old windows
        ("429", False, True, True),
        ("503", False, True, True),
        ("Timeout", False, False, True),
        ("500", False, True, False),
        ("ServerDisconnected", False, True, False),
        ("Blocked", False, False, False),
        ("418", False, False, False),  # an HTTP code nobody named
    ],
)
def test_what_each_status_means(status, expected, retried, backoff):
    assert c.Status.expected(status) is expected
    assert c.Status.retried(status) is retried
    assert c.Status.backoff(status) is backoff


# --- Dataset rows and encodings (issue 52) ------------------------------------------------

ROW = c.RowData(caption="a red fox, «snow»\n", columns={"license": "cc-by", "similarity": 0.31})
WEBP = c.Encoding(image_size=256, resize_mode="center_crop", encode_format="webp")


def test_a_caption_columns_and_encoding_travel_through_the_splitter_and_back() -> None:
    inbound = c.InboundImage(
        url="https://example.gov/a.jpg", uuid="u-1", source="example", row=ROW, encoding=WEBP
    )
    task = c.SourceTask.from_json(inbound.to_source_task().to_json())
    assert (task.row, task.encoding) == (ROW, WEBP)
    assert c.InboundImage.from_json(task.with_source("example").to_json()) == inbound
    # The caption byte for byte, not escaped to ASCII.
    assert "«snow»".encode() in inbound.to_json()


def test_an_encoding_carries_only_what_is_not_its_default() -> None:
    assert json.loads(c.InboundImage("http://x/a", "u", "s", encoding=WEBP).to_json())[
        "encoding"
    ] == {"resize_mode": "center_crop", "encode_format": "webp"}
    assert c.Encoding.from_obj({}) == c.Encoding()  # img2dataset's defaults
    assert c.Encoding().to_obj() == {}


def test_a_message_without_row_or_encoding_is_as_before() -> None:
    raw = b'{"url":"http://x/a","uuid":"u","source":"s"}'
    message = c.InboundImage.from_json(raw)
    assert (message.row, message.encoding) == (None, None)
    assert message.to_json() == raw


def test_the_object_key_names_the_encoded_format() -> None:
    assert c.object_key("u", None) == "u.jpg"
    assert c.object_key("u", WEBP) == "u.webp"


def test_a_resolution_message_carries_the_row_unchanged_and_what_was_stored() -> None:
    message = c.ResolutionMessage(
        identifier="u",
        width=1024,
        height=768,
        filesize=3,
        compression_quality=90,
        row=ROW,
        image=c.StoredImage("u.webp", 256, 256),
    )
    obj = json.loads(message.to_json())
    assert obj["caption"] == ROW.caption
    assert obj["columns"] == ROW.columns
    assert obj["image"] == {"key": "u.webp", "width": 256, "height": 256}
    assert c.ResolutionMessage.from_json(message.to_json()) == message


def test_row_data_over_the_limit_is_malformed_and_never_cut() -> None:
    base = {"url": "http://x/a", "uuid": "u", "source": "s"}
    fits = "x" * (c.MAX_ROW_DATA_BYTES - len('{"caption":""}'))
    assert c.InboundImage.from_json(json.dumps({**base, "caption": fits})).row == c.RowData(fits)
    with pytest.raises(c.MalformedMessage, match="over the limit of 16384"):
        c.InboundImage.from_json(json.dumps({**base, "caption": fits + "x"}))
    with pytest.raises(c.MalformedMessage, match="over the limit"):
        c.SourceTask.from_json(json.dumps({**base, "columns": {"a": "é" * 9000}}))


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"caption": 3}, "'caption' is not a string"),
        ({"columns": ["a"]}, "'columns' is not an object"),
        ({"encoding": "webp"}, "'encoding' is not an object"),
        ({"encoding": {"size": 3}}, "unknown field"),
        ({"encoding": {"image_size": 0}}, "image_size must be an integer 1-16384"),
        ({"encoding": {"image_size": 256.0}}, "image_size must be an integer"),
        ({"encoding": {"resize_mode": "fit"}}, "resize_mode must be one of"),
        ({"encoding": {"resize_only_if_bigger": 1}}, "must be true or false"),
        ({"encoding": {"encode_format": "gif"}}, "encode_format must be one of jpg, png, webp"),
        ({"encoding": {"encode_quality": 0}}, "encode_quality of jpg must be an integer 1-100"),
        ({"encoding": {"encode_format": "png"}}, "encode_quality of png must be an integer 0-9"),
        ({"encoding": {"min_image_size": -1}}, "min_image_size must be"),
        ({"encoding": {"max_image_area": 0}}, "max_image_area must be"),
        ({"encoding": {"max_aspect_ratio": 0.5}}, "max_aspect_ratio must be"),
        ({"encoding": {"max_aspect_ratio": True}}, "max_aspect_ratio must be"),
    ],
)
def test_bad_row_data_and_encodings_make_a_malformed_message(fields, reason) -> None:
    raw = json.dumps({"url": "http://x/a", "uuid": "u", "source": "s", **fields})
    with pytest.raises(c.MalformedMessage, match=reason):
        c.InboundImage.from_json(raw)


def test_an_encoding_that_a_filter_refuses_is_an_expected_status() -> None:
    for status in ("ImageTooSmall", "ImageAreaTooLarge", "AspectRatioTooLarge"):
        assert c.Status.expected(status) and not c.Status.retried(status)


def test_a_duplicate_message_reads_back_as_written_and_names_only_known_kinds():
    near = c.DuplicateMessage("u-2", "flickr", "near", "u-1", "museum", 4)
    assert json.loads(near.to_json()) == {
        "identifier": "u-2",
        "source": "flickr",
        "kind": "near",
        "duplicate_of": "u-1",
        "duplicate_of_source": "museum",
        "distance": 4,
    }
    assert c.DuplicateMessage.from_json(near.to_json()) == near
    unique = c.DuplicateMessage("u-1", "museum", "unique")
    assert c.DuplicateMessage.from_json(unique.to_json()) == unique
    with pytest.raises(c.MalformedMessage, match="kind"):
        c.DuplicateMessage.from_json(b'{"identifier": "u-3", "kind": "similar"}')
