"""The pure rules of re-checks: the conditions sent, what a status says of the file."""

import hashlib

import pytest

from image_crawler import contract as c
from worker.download import recheck

BODY = b"\xff\xd8 an image \xff\xd9"
DIGEST = hashlib.sha256(BODY).hexdigest()


@pytest.mark.parametrize(
    ("earlier", "headers"),
    [
        (c.Earlier(etag='"abc"'), {"If-None-Match": '"abc"'}),
        (c.Earlier(etag='W/"abc"'), {"If-None-Match": 'W/"abc"'}),
        (
            c.Earlier(last_modified="Tue, 03 Nov 2026 10:00:00 GMT"),
            {"If-Modified-Since": "Tue, 03 Nov 2026 10:00:00 GMT"},
        ),
        (
            c.Earlier(etag='"e"', last_modified="Tue, 03 Nov 2026 10:00:00 GMT"),
            {"If-None-Match": '"e"', "If-Modified-Since": "Tue, 03 Nov 2026 10:00:00 GMT"},
        ),
        (c.Earlier(sha256=DIGEST), {}),  # only the hash: an unconditional GET
    ],
)
def test_conditions_send_back_what_the_earlier_crawl_saw(earlier, headers):
    assert recheck.conditions(earlier) == headers


@pytest.mark.parametrize("body", [BODY, (BODY[:3], BODY[3:]), (BODY[:1], b"", BODY[1:])])
def test_the_body_hash_is_the_same_whole_or_in_pieces(body):
    assert recheck.body_sha256(body) == DIGEST


@pytest.mark.parametrize(
    ("earlier", "body", "same"),
    [
        (c.Earlier(sha256=DIGEST), BODY, True),
        (c.Earlier(sha256=DIGEST), (BODY[:5], BODY[5:]), True),
        (c.Earlier(sha256=DIGEST), BODY + b"x", False),
        (c.Earlier(etag='"e"'), BODY, False),  # no hash known: a 200 is a change
    ],
)
def test_same_body_needs_the_earlier_hash(earlier, body, same):
    assert recheck.same_body(earlier, body) is same


@pytest.mark.parametrize(
    ("status", "unchanged_body", "check"),
    [
        ("304", False, c.CHECK_UNCHANGED),
        ("200", True, c.CHECK_UNCHANGED),
        ("200", False, c.CHECK_CHANGED),
        ("404", False, c.CHECK_GONE),
        ("410", False, c.CHECK_GONE),
        ("500", False, c.CHECK_FAILED),
        ("403", False, c.CHECK_FAILED),
        ("Timeout", False, c.CHECK_FAILED),
        ("UnidentifiedImageError", False, c.CHECK_FAILED),
        ("RobotsDisallowed", False, c.CHECK_FAILED),
        ("NoIndex", False, c.CHECK_FAILED),
    ],
)
def test_what_a_status_says_of_the_file(status, unchanged_body, check):
    assert recheck.check_of(status, unchanged_body=unchanged_body) == check


@pytest.mark.parametrize(
    ("status", "code"), [("304", 304), ("410", 410), ("Timeout", None), ("", None)]
)
def test_http_status(status, code):
    assert recheck.http_status(status) == code


def test_a_failed_check_names_its_status_and_others_do_not():
    task = c.SourceTask(url="http://h.test/a.jpg", uuid="u", earlier=c.Earlier(etag='"e"'))
    failed = recheck.link_check(task, "Timeout", c.CHECK_FAILED, None, "t")
    assert c.LinkCheckMessage.from_json(failed.to_json()) == failed
    assert failed.error == "Timeout"
    gone = recheck.link_check(task, "410", c.CHECK_GONE, 410, "t")
    assert gone.to_json() == (
        b'{"identifier":"u","url":"http://h.test/a.jpg","status":"gone","http_status":410,'
        b'"time":"t"}'
    )
