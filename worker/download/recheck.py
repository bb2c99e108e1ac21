"""Re-checks: asking again for a file an earlier crawl saw, and naming what became of it.

A message whose ``earlier`` is set (``contract.Earlier``: the earlier crawl's ``etag``,
``last_modified`` and ``sha256``) is a re-check. It is fetched like any URL, paced and
robots-checked, but conditionally: the ETag goes back as ``If-None-Match`` and the date
as ``If-Modified-Since`` (RFC 9110, 13.1), so that a server whose file has not changed
answers 304 and sends no body. What the check found (``check_of``) is one of
``RECHECK_STATUSES``:

- ``unchanged``: a 304, or a 200 whose body has the earlier ``sha256`` (a server that
  ignores the condition); nothing is stored or published but the check itself;
- ``changed``: any other 200 that gave an image, crawled again as a new crawl;
- ``gone``: a 404 or a 410, also published on ``link_rot``;
- ``failed``: anything else that will not be tried again (in ``crawl_errors`` too).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
from typing import Final

from image_crawler.contract import (
    CHECK_CHANGED,
    CHECK_FAILED,
    CHECK_GONE,
    CHECK_UNCHANGED,
    Earlier,
    LinkCheckMessage,
    SourceTask,
    Status,
)
from worker.images.pool import Body

# What a re-check's final status says of the file, where it says anything.
_CHECKS: Final[dict[str, str]] = {
    Status.NOT_MODIFIED: CHECK_UNCHANGED,
    Status.OK: CHECK_CHANGED,
    Status.NOT_FOUND: CHECK_GONE,
    Status.GONE: CHECK_GONE,
}


def conditions(earlier: Earlier) -> dict[str, str]:
    """The request headers that make a re-check's GET conditional (none when the
    earlier crawl knew only the body's hash: the GET then asks for the file as is)."""
    headers = {}
    if earlier.etag is not None:
        headers["If-None-Match"] = earlier.etag
    if earlier.last_modified is not None:
        headers["If-Modified-Since"] = earlier.last_modified
    return headers


def body_sha256(body: Body) -> str:
    """The hex SHA-256 of a downloaded body, whole or in the pieces it arrived in."""
    if isinstance(body, bytes):
        return hashlib.sha256(body).hexdigest()
    digest = hashlib.sha256()
    for piece in body:
        digest.update(piece)
    return digest.hexdigest()


def same_body(earlier: Earlier, body: Body) -> bool:
    """Whether a 200's ``body`` is the file the earlier crawl saw (False when it did not
    say: a 200 is then a change)."""
    return earlier.sha256 is not None and body_sha256(body) == earlier.sha256


def check_of(status: str, *, unchanged_body: bool = False) -> str:
    """What a re-check that ended with ``status`` found. ``unchanged_body``: it was a 200
    with the earlier body."""
    if unchanged_body:
        return CHECK_UNCHANGED
    return _CHECKS.get(status, CHECK_FAILED)


def http_status(status: str) -> int | None:
    """The HTTP code of a status ("304" -> 304), None for an error name ("Timeout")."""
    return int(status) if status.isdigit() else None


def link_check(
    task: SourceTask, status: str, check: str, http: int | None, time: str
) -> LinkCheckMessage:
    """The ``link_checks`` message of a re-check that ended with ``status`` (the crawl's
    own, as recorded), whose last answer was ``http`` (None: none came) and which found
    ``check``, at ``time`` (ISO 8601). A failed check names its status as ``error``."""
    return LinkCheckMessage(
        identifier=task.uuid,
        url=task.url,
        status=check,
        http_status=http,
        time=time,
        error=status if check == CHECK_FAILED else None,
    )
