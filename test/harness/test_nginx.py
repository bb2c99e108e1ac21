"""The nginx harness: Debian's nginx serving a folder, with its own ETag, Last-Modified and
304 answers, as the re-check tests will meet them (requests with aiohttp, as the worker's)."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Iterator, Mapping
from email.utils import formatdate
from pathlib import Path

import aiohttp
import pytest

from test.harness import nginx as harness
from test.harness.nginx import (
    AccessLogEntry,
    Nginx,
    NoNginx,
    VirtualServer,
    find_or_install_nginx,
)
from test.harness.services import ServiceError

pytestmark = pytest.mark.integration

# 2026-01-02 03:04:05 UTC, and a day later.
FIRST_MTIME = 1767323045
SECOND_MTIME = FIRST_MTIME + 86400


@pytest.fixture(scope="session")
def nginx_binary() -> str:
    started = time.monotonic()
    try:
        found = find_or_install_nginx()
    except NoNginx as e:
        pytest.fail(f"the re-check tests need a real nginx: {e}", pytrace=False)
    print(f"\nnginx: {found} (found or installed in {time.monotonic() - started:.1f} s)")
    return found


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    served = tmp_path / "www"
    served.mkdir()
    return served


@pytest.fixture
def nginx(folder: Path, tmp_path: Path, nginx_binary: str) -> Iterator[Nginx]:
    with Nginx(folder, work_dir=tmp_path / "nginx", binary=nginx_binary) as server:
        yield server


def _write(path: Path, body: bytes, mtime: int) -> None:
    path.write_bytes(body)
    os.utime(path, (mtime, mtime))


@dataclasses.dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes


async def _get(url: str, headers: Mapping[str, str] | None = None) -> Answer:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as response:
        return Answer(response.status, response.headers.copy(), await response.read())


async def test_a_file_is_served_with_its_etag_and_last_modified(nginx: Nginx, folder: Path) -> None:
    body = b"\xff\xd8 not quite a jpeg \xff\xd9"
    _write(folder / "cat.jpg", body, FIRST_MTIME)

    asked_at = time.time()
    answer = await _get(nginx.url("/cat.jpg"))

    assert answer.status == 200 and answer.body == body
    assert answer.headers["Content-Type"] == "image/jpeg"
    # nginx's strong ETag: the mtime and the size, in hex.
    assert answer.headers["ETag"] == f'"{FIRST_MTIME:x}-{len(body):x}"'
    assert answer.headers["Last-Modified"] == formatdate(FIRST_MTIME, usegmt=True)
    [entry] = nginx.wait_for_requests(1)
    assert entry == AccessLogEntry(
        method="GET",
        path="/cat.jpg",
        status=200,
        body_bytes=len(body),
        bytes_sent=entry.bytes_sent,
        etag=answer.headers["ETag"],
        if_none_match=None,
        if_modified_since=None,
        host="127.0.0.1",
        time_s=entry.time_s,
        limit_req=None,  # no limiter here
    )
    assert entry.bytes_sent > len(body)
    # When the answer was sent, to the millisecond (the log's clock is the wall clock).
    assert entry.time_s is not None and asked_at - 0.002 <= entry.time_s <= time.time() + 0.002


async def test_a_conditional_get_with_the_etag_gets_304_without_a_body(
    nginx: Nginx, folder: Path
) -> None:
    _write(folder / "cat.jpg", b"cat" * 1000, FIRST_MTIME)
    first = await _get(nginx.url("/cat.jpg"))
    etag, last_modified = first.headers["ETag"], first.headers["Last-Modified"]

    by_etag = await _get(nginx.url("/cat.jpg"), {"If-None-Match": etag})
    by_date = await _get(nginx.url("/cat.jpg"), {"If-Modified-Since": last_modified})
    weak = await _get(nginx.url("/cat.jpg"), {"If-None-Match": f"W/{etag}"})

    for answer in (by_etag, by_date, weak):
        assert answer.status == 304 and answer.body == b""
        assert answer.headers["ETag"] == etag
        assert answer.headers["Last-Modified"] == last_modified
    entries = nginx.wait_for_requests(4)
    assert [(e.status, e.body_bytes) for e in entries] == [
        (200, 3000),
        (304, 0),
        (304, 0),
        (304, 0),
    ]
    assert entries[1].if_none_match == etag
    assert entries[2].if_modified_since == last_modified
    assert all(e.bytes_sent < 300 for e in entries[1:])  # headers only


async def test_if_modified_since_is_exact_and_both_conditions_must_hold(
    nginx: Nginx, folder: Path
) -> None:
    _write(folder / "cat.jpg", b"cat", FIRST_MTIME)
    etag = f'"{FIRST_MTIME:x}-3"'
    same = formatdate(FIRST_MTIME, usegmt=True)
    later = formatdate(SECOND_MTIME, usegmt=True)
    earlier = formatdate(FIRST_MTIME - 1, usegmt=True)

    async def status(headers: Mapping[str, str]) -> int:
        return (await _get(nginx.url("/cat.jpg"), headers)).status

    # `if_modified_since exact` (the default): only the file's own date is "not modified".
    assert await status({"If-Modified-Since": later}) == 200
    assert await status({"If-Modified-Since": "yesterday"}) == 200
    assert await status({"If-None-Match": f'"0-0", {etag}'}) == 304
    assert await status({"If-None-Match": "*"}) == 304
    # Both headers: nginx wants both to hold (RFC 9110 would let If-None-Match decide).
    assert await status({"If-None-Match": etag, "If-Modified-Since": same}) == 304
    assert await status({"If-None-Match": etag, "If-Modified-Since": later}) == 200
    assert await status({"If-None-Match": etag, "If-Modified-Since": earlier}) == 200
    assert await status({"If-None-Match": '"0-0"', "If-Modified-Since": same}) == 200


async def test_if_modified_since_before_answers_304_to_any_later_date(
    folder: Path, tmp_path: Path, nginx_binary: str
) -> None:
    _write(folder / "cat.jpg", b"cat", FIRST_MTIME)
    later = formatdate(SECOND_MTIME, usegmt=True)
    earlier = formatdate(FIRST_MTIME - 1, usegmt=True)
    with Nginx(
        folder, work_dir=tmp_path / "before", if_modified_since="before", binary=nginx_binary
    ) as server:
        assert (await _get(server.url("/cat.jpg"), {"If-Modified-Since": later})).status == 304
        assert (await _get(server.url("/cat.jpg"), {"If-Modified-Since": earlier})).status == 200


async def test_a_replaced_file_gets_a_new_etag_and_200(nginx: Nginx, folder: Path) -> None:
    _write(folder / "cat.jpg", b"old cat", FIRST_MTIME)
    old = await _get(nginx.url("/cat.jpg"))

    _write(folder / "cat.jpg", b"new cat", SECOND_MTIME)  # the same size
    conditional = {
        "If-None-Match": old.headers["ETag"],
        "If-Modified-Since": old.headers["Last-Modified"],
    }
    new = await _get(nginx.url("/cat.jpg"), conditional)

    assert new.status == 200 and new.body == b"new cat"
    assert new.headers["ETag"] == f'"{SECOND_MTIME:x}-7"' != old.headers["ETag"]
    assert new.headers["Last-Modified"] == formatdate(SECOND_MTIME, usegmt=True)
    by_date = {"If-Modified-Since": old.headers["Last-Modified"]}
    assert (await _get(nginx.url("/cat.jpg"), by_date)).status == 200
    assert [e.status for e in nginx.wait_for_requests(3)] == [200, 200, 200]


async def test_a_deleted_file_is_404(nginx: Nginx, folder: Path) -> None:
    _write(folder / "cat.jpg", b"cat", FIRST_MTIME)
    etag = (await _get(nginx.url("/cat.jpg"))).headers["ETag"]
    (folder / "cat.jpg").unlink()

    gone = await _get(nginx.url("/cat.jpg"), {"If-None-Match": etag})

    assert gone.status == 404
    # Two lines: the 200 is logged already, and the 404's may come a moment after its answer.
    assert [e.status for e in nginx.wait_for_requests(2, path="/cat.jpg")] == [200, 404]
    assert (await _get(nginx.url("/never.jpg"))).status == 404


async def test_server_config_adds_locations(
    folder: Path, tmp_path: Path, nginx_binary: str
) -> None:
    gone = "location = /gone.jpg { return 410; }"
    with Nginx(
        folder, work_dir=tmp_path / "gone", server_config=gone, binary=nginx_binary
    ) as server:
        assert (await _get(server.url("/gone.jpg"))).status == 410
        [entry] = server.wait_for_requests(1)
        assert (entry.path, entry.status) == ("/gone.jpg", 410)


async def test_another_loopback_address(folder: Path, tmp_path: Path, nginx_binary: str) -> None:
    _write(folder / "cat.jpg", b"cat", FIRST_MTIME)
    with Nginx(
        folder, host="127.0.0.2", work_dir=tmp_path / "second", binary=nginx_binary
    ) as server:
        assert server.base_url.startswith("http://127.0.0.2:")
        assert (await _get(server.url("/cat.jpg?size=1"))).body == b"cat"
        assert server.wait_for_requests(1)[0].path == "/cat.jpg?size=1"
    with pytest.raises(ValueError, match="loopback"):
        Nginx(folder, host="10.0.0.1")


async def test_several_hosts_on_one_port_each_with_its_own_directives(
    folder: Path, tmp_path: Path, nginx_binary: str
) -> None:
    _write(folder / "cat.jpg", b"cat", FIRST_MTIME)
    also = [
        VirtualServer("127.0.0.3", "location = /gone.jpg { return 410; }"),
        VirtualServer("127.0.0.4"),
    ]
    with Nginx(
        folder, host="127.0.0.2", also=also, work_dir=tmp_path / "w", binary=nginx_binary
    ) as server:
        assert server.hosts == ("127.0.0.2", "127.0.0.3", "127.0.0.4")
        assert server.url("/cat.jpg", "127.0.0.4") == f"http://127.0.0.4:{server.port}/cat.jpg"
        for host in server.hosts:
            assert (await _get(server.url("/cat.jpg", host))).body == b"cat"
        assert (await _get(server.url("/gone.jpg", "127.0.0.3"))).status == 410
        assert (await _get(server.url("/gone.jpg", "127.0.0.4"))).status == 404
        entries = server.wait_for_requests(5)
        assert [(e.host, e.path, e.status) for e in entries] == [
            ("127.0.0.2", "/cat.jpg", 200),
            ("127.0.0.3", "/cat.jpg", 200),
            ("127.0.0.4", "/cat.jpg", 200),
            ("127.0.0.3", "/gone.jpg", 410),
            ("127.0.0.4", "/gone.jpg", 404),
        ]
        with pytest.raises(ValueError, match="does not serve"):
            server.url("/cat.jpg", "127.0.0.5")
    with pytest.raises(ValueError, match="a host of its own"):
        Nginx(folder, host="127.0.0.2", also=[VirtualServer("127.0.0.2")])
    with pytest.raises(ValueError, match="loopback"):
        VirtualServer("192.168.0.1")


@pytest.mark.timing("needs 3 requests inside nginx's 1 r/s limiter window")
async def test_a_limiter_keyed_by_host_refuses_one_host_only(
    folder: Path, tmp_path: Path, nginx_binary: str
) -> None:
    _write(folder / "cat.jpg", b"cat", FIRST_MTIME)
    # 1 request/s, no burst: a request within a second of the last one passed is refused.
    limit = "limit_req_zone $host zone=one:1m rate=1r/s; limit_req_status 429;"
    with Nginx(
        folder,
        host="127.0.0.2",
        http_config=limit,
        server_config="limit_req zone=one;",
        also=[VirtualServer("127.0.0.3")],
        work_dir=tmp_path / "w",
        binary=nginx_binary,
    ) as server:
        limited = [(await _get(server.url("/cat.jpg"))).status for _ in range(3)]
        free = [(await _get(server.url("/cat.jpg", "127.0.0.3"))).status for _ in range(3)]
        assert limited == [200, 429, 429]
        assert free == [200, 200, 200]
        entries = server.wait_for_requests(6)
        assert [(e.host, e.status, e.limit_req) for e in entries] == [
            ("127.0.0.2", 200, "PASSED"),
            ("127.0.0.2", 429, "REJECTED"),
            ("127.0.0.2", 429, "REJECTED"),
            *[("127.0.0.3", 200, None)] * 3,
        ]


def test_the_readiness_probe_is_not_logged(nginx: Nginx) -> None:
    assert nginx._answers()
    assert nginx.requests() == []


def test_stop_is_graceful_and_frees_the_port(nginx: Nginx) -> None:
    pid = nginx.pid
    nginx.stop()
    assert not nginx.running and nginx.returncode == 0
    assert "signal 3 (SIGQUIT)" in nginx.error_log_path.read_text()
    assert pid is not None
    with pytest.raises(OSError):
        socket.create_connection((nginx.host, nginx.port), timeout=0.5).close()


def test_a_taken_port_is_replaced(
    folder: Path, tmp_path: Path, nginx_binary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:
        taken.bind((harness.LOOPBACK, 0))
        taken.listen()
        server = Nginx(folder, work_dir=tmp_path / "w", binary=nginx_binary)
        server.port = taken.getsockname()[1]
        # The race itself: nginx is started on the port and fails to bind it.
        monkeypatch.setattr(harness, "_port_free", lambda host, port: True)
        with server:
            assert server.port != taken.getsockname()[1]
            assert server._answers()
        assert "Address already in use" in server.log_path.read_text()


def test_a_given_port_that_is_taken_is_an_error(
    folder: Path, tmp_path: Path, nginx_binary: str
) -> None:
    with socket.socket() as taken:
        taken.bind((harness.LOOPBACK, 0))
        taken.listen()
        server = Nginx(
            folder, port=taken.getsockname()[1], work_dir=tmp_path / "w", binary=nginx_binary
        )
        with pytest.raises(ServiceError, match="taken"):
            server.start()
        assert not server.running


def test_a_bad_config_fails_with_nginx_s_words(
    folder: Path, tmp_path: Path, nginx_binary: str
) -> None:
    server = Nginx(folder, work_dir=tmp_path / "w", server_config="nonsense;", binary=nginx_binary)
    with pytest.raises(ServiceError, match='unknown directive "nonsense"'):
        server.start()
    assert not server.running


def test_no_nginx_and_no_apt_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "_find", lambda: None)

    def refuse(packages: list[str]) -> None:
        raise harness.AptUnavailable("cannot be installed here (needs root and apt-get)")

    monkeypatch.setattr(harness, "apt_install", refuse)
    with pytest.raises(NoNginx, match="apt-get install nginx"):
        find_or_install_nginx()


def test_paths_nginx_would_read_otherwise_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot be given"):
        harness.render_config(root=tmp_path / "$uri", host="127.0.0.1", port=80, work_dir=tmp_path)
