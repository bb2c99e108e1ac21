"""The fetcher against a real HTTP origin on loopback."""

import asyncio
import dataclasses
import time

import pytest
from aiohttp import web
from multidict import CIMultiDict

from image_crawler.config import ConfigError
from test.harness.origin import Reply
from test.harness.services import wait_for
from worker.download.budget import ByteBudget
from worker.download.fetch import RETRY_AFTER_MAX_CHARS, Fetcher, new_session
from worker.download.netguard import AddressPolicy, parse_networks
from worker.images.pool import joined
from worker.settings import DEFAULT_USER_AGENT, FetchSettings, WorkerSettings

SETTINGS = FetchSettings(
    connect_timeout_s=1, read_timeout_s=0.5, total_timeout_s=3, max_body_bytes=100_000
)


# The origin listens on 127.0.0.1: exempt exactly that address, nothing else.
ORIGIN_ONLY = AddressPolicy(parse_networks("127.0.0.1/32"))


@pytest.fixture
async def fetch():
    session = new_session(SETTINGS, ORIGIN_ONLY)
    yield Fetcher(session, SETTINGS, ORIGIN_ONLY).fetch
    await session.close()


@pytest.fixture
async def strict_fetch():
    session = new_session(SETTINGS, AddressPolicy())
    yield Fetcher(session, SETTINGS, AddressPolicy()).fetch
    await session.close()


async def test_a_200_returns_the_whole_body(origin, fetch):
    body = bytes(range(256)) * 300
    url = origin.add("/a.jpg", body, "image/jpeg")
    result = await fetch(url)
    assert result.status == "200"
    assert result.body is not None and joined(result.body) == body
    assert result.ok


@pytest.mark.parametrize("status", [404, 500, 403, 429, 410])
async def test_http_errors_are_their_status(origin, fetch, status):
    result = await fetch(origin.add_status("/x", status))
    assert (result.status, result.body, result.ok) == (str(status), None, False)


async def test_a_dropped_connection_is_server_disconnected_after_exactly_one_request(origin, fetch):
    url = origin.add_disconnect("/drop")
    result = await fetch(url)
    assert result.status == "ServerDisconnected"
    # aiohttp would silently repeat the GET outside pacing; the session forbids it.
    assert origin.requests("/drop") == 1


async def test_a_connection_dropped_after_it_was_reused_is_not_repeated_either(origin, fetch):
    # aiohttp's repeat is meant for a kept-alive connection the server closed meanwhile.
    assert (await fetch(origin.add("/a.jpg", b"img", "image/jpeg"))).ok
    result = await fetch(origin.add_disconnect("/drop"))
    assert result.status == "ServerDisconnected"
    assert origin.requests("/drop") == 1


async def test_a_silent_server_times_out(origin, fetch):
    url = origin.add_slow("/slow", b"late", delay_s=5)
    result = await fetch(url)
    assert result.status == "Timeout"


async def test_a_body_over_the_cap_is_refused_from_its_content_length(origin, fetch):
    url = origin.add("/big", b"x" * (SETTINGS.max_body_bytes + 1), "image/jpeg")
    result = await fetch(url)
    assert result.status == "TooLarge" and "Content-Length" in result.detail


async def test_a_streamed_body_over_the_cap_is_aborted(origin, fetch):
    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "image/jpeg"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(1000):
            await response.write(b"x" * 10_000)
        return response

    url = origin.add_handler("/stream", endless)
    result = await fetch(url)
    assert result.status == "TooLarge"


async def test_redirects_are_followed_up_to_the_limit(origin, fetch):
    origin.add("/final.jpg", b"img", "image/jpeg")
    origin.add("/r1", b"", "text/plain", status=302, headers={"Location": "/final.jpg"})
    assert (await fetch(origin.url("/r1"))).body == b"img"
    for i in range(10):
        origin.add(
            f"/loop{i}", b"", "text/plain", status=302, headers={"Location": f"/loop{i + 1}"}
        )
    result = await fetch(origin.url("/loop0"))
    assert result.status == "TooManyRedirects"
    assert origin.requests("/loop6") == 0


@pytest.mark.parametrize(
    ("url", "status"),
    [
        ("ftp://example.com/a.jpg", "Blocked"),
        ("file:///etc/passwd", "Blocked"),
        ("http://[::1/a", "InvalidURL"),
        ("not a url", "Blocked"),
    ],
)
async def test_urls_that_are_not_http_are_refused_without_a_request(fetch, url, status):
    assert (await fetch(url)).status == status


async def test_nothing_listening_is_a_connection_error(fetch):
    from test.harness.services import free_port

    result = await fetch(f"http://127.0.0.1:{free_port()}/a.jpg")
    assert result.status == "ConnectionError"


def test_settings_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SETTINGS.max_body_bytes = 1  # type: ignore[misc]


async def test_loopback_is_refused_without_a_request(origin, strict_fetch):
    url = origin.add("/a.jpg", b"img", "image/jpeg")
    result = await strict_fetch(url)
    assert result.status == "Blocked"
    assert origin.total_requests == 0


@pytest.mark.parametrize(
    "host", ["localhost", "2130706433", "0177.0.0.1", "0x7f.0.0.1", "127.1", "[::ffff:127.0.0.1]"]
)
async def test_every_spelling_of_loopback_is_refused(origin, strict_fetch, host):
    origin.add("/a.jpg", b"img", "image/jpeg")
    result = await strict_fetch(f"http://{host}:{origin.port}/a.jpg")
    assert result.status == "Blocked", result
    assert origin.total_requests == 0


@pytest.mark.parametrize(
    "location",
    [
        "http://127.0.0.2:{port}/x.jpg",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:10.0.0.1]/x.jpg",
        "http://2130706434:{port}/x.jpg",
        "file:///etc/passwd",
        "gopher://127.0.0.1/",
    ],
)
async def test_every_redirect_hop_is_checked(origin, fetch, location):
    url = origin.add(
        "/r", b"", "text/plain", status=302, headers={"Location": location.format(port=origin.port)}
    )
    result = await fetch(url)
    assert result.status == "Blocked", result
    assert origin.total_requests == 1


async def test_proxy_variables_are_ignored(origin, fetch, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9/")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9/")
    url = origin.add("/a.jpg", b"img", "image/jpeg")
    assert (await fetch(url)).body == b"img"


async def test_cookies_are_neither_kept_nor_sent(origin, fetch):
    cookies: list[str | None] = []

    async def handler(request: web.Request) -> web.Response:
        cookies.append(request.headers.get("Cookie"))
        response = web.Response(body=b"img", content_type="image/jpeg")
        response.set_cookie("session", "abc", max_age=3600)
        return response

    # By name: aiohttp's default jar ignores cookies of hosts given as addresses.
    url = origin.add_handler("/c.jpg", handler).replace("127.0.0.1", "localhost")
    for _ in range(2):
        assert (await fetch(url)).body == b"img"
    assert cookies == [None, None]


@pytest.mark.parametrize("header_bytes", [20_000, 200_000])
async def test_oversized_headers_are_refused(origin, fetch, header_bytes):
    url = origin.add("/a.jpg", b"img", "image/jpeg", headers={"X-Padding": "x" * header_bytes})
    result = await fetch(url)
    assert result.status == "BadResponse", result
    assert result.body is None


async def _budgeted(budget):
    session = new_session(SETTINGS, ORIGIN_ONLY)
    return session, Fetcher(session, SETTINGS, ORIGIN_ONLY, budget).fetch


async def test_a_body_holds_its_bytes_of_the_budget_until_released(origin):
    budget = ByteBudget(50_000)
    session, fetch = await _budgeted(budget)
    try:
        url = origin.add("/a.jpg", b"x" * 30_000, "image/jpeg")
        first = await fetch(url)
        assert first.ok and budget.used == 30_000
        # A second fetch waits for room before it sends its request (not with a response
        # open, whose read timeout would run out while it waits).
        second = asyncio.create_task(fetch(origin.add("/b.jpg", b"y" * 30_000, "image/jpeg")))
        await wait_for(lambda: budget.waiting == 1, 5, what="the second fetch waiting")
        assert origin.requests("/b.jpg") == 0 and budget.used == 30_000
        first.release()
        first.release()  # twice is harmless
        assert (await second).ok and budget.used == 30_000
    finally:
        await session.close()


async def test_failed_and_undeclared_bodies_give_back_what_they_held(origin):
    budget = ByteBudget(50_000)
    session, fetch = await _budgeted(budget)

    async def chunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "image/jpeg"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(int(request.query["chunks"])):
            await response.write(b"x" * 10_000)
        return response

    try:
        url = origin.add_handler("/stream", chunked)
        too_large = await fetch(url + "?chunks=20")
        assert too_large.status == "TooLarge" and budget.used == 0
        # 70 KB, more than the whole budget: the excess is taken as it comes.
        undeclared = await fetch(url + "?chunks=7")
        assert undeclared.ok and budget.used == 70_000
        undeclared.release()
        assert budget.used == 0
    finally:
        await session.close()


async def test_a_refused_or_failed_fetch_holds_nothing(origin):
    budget = ByteBudget(50_000)
    session, fetch = await _budgeted(budget)
    try:
        assert (await fetch("http://10.0.0.1/a.jpg")).status == "Blocked"
        assert (await fetch(origin.add_status("/gone", 404))).status == "404"
        assert budget.used == 0
    finally:
        await session.close()


# --- Retry-After and response times --------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "retry_after"),
    [
        (429, "120"),
        (503, "120"),
        (429, "Wed, 21 Oct 2015 07:28:00 GMT"),
        (503, "Wed, 21 Oct 2015 07:28:00 GMT"),
        (503, "in a while"),  # passed on as it came: the caller judges it
        (429, None),
        (503, None),
    ],
)
async def test_a_final_response_carries_its_retry_after(origin, fetch, status, retry_after):
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    url = origin.add("/busy", b"busy", "text/plain", status=status, headers=headers)
    result = await fetch(url)
    assert (result.status, result.retry_after, result.body) == (str(status), retry_after, None)
    assert result.response_s is not None and 0 <= result.response_s < SETTINGS.total_timeout_s


async def test_a_long_retry_after_is_cut_short(origin, fetch):
    url = origin.add("/busy", b"", "text/plain", status=503, headers={"Retry-After": "9" * 5000})
    result = await fetch(url)
    assert result.retry_after == "9" * RETRY_AFTER_MAX_CHARS


async def test_retry_after_is_kept_only_from_a_final_refusal(origin, fetch):
    later = {"Retry-After": "60"}
    ok = await fetch(origin.add("/a.jpg", b"img", "image/jpeg", headers=later))
    assert ok.ok and ok.retry_after is None
    origin.add("/b.jpg", b"img", "image/jpeg")
    origin.add("/r", b"", "text/plain", status=302, headers={"Location": "/b.jpg", **later})
    redirected = await fetch(origin.url("/r"))
    assert redirected.ok and redirected.retry_after is None


@pytest.mark.timing("asserts the measured response seconds against 0.3 s and 2 s bounds")
async def test_the_response_time_is_the_final_hops_wait_for_headers(origin, fetch):
    origin.add_sequence("/late.jpg", [Reply(b"img", "image/jpeg", delay_s=0.3)])
    origin.add("/r", b"", "text/plain", status=302, headers={"Location": "/late.jpg"})
    result = await fetch(origin.url("/r"))
    assert result.ok
    assert result.response_s is not None and 0.3 <= result.response_s < 2.0
    fast = await fetch(origin.add("/a.jpg", b"img", "image/jpeg"))
    assert fast.response_s is not None and fast.response_s < 0.3


@pytest.mark.timing("asserts the connection wait >= 0.5 s and the response time under half of it")
async def test_the_response_time_leaves_out_the_wait_for_a_connection(origin):
    # One connection: the second fetch waits for the first one's slow answer before its
    # request is even sent. Its response time is the server's, not that wait.
    settings = dataclasses.replace(SETTINGS, max_connections=1, read_timeout_s=5)
    session = new_session(settings, ORIGIN_ONLY)
    fetch = Fetcher(session, settings, ORIGIN_ONLY).fetch
    try:
        origin.add_sequence("/slow.jpg", [Reply(b"img", "image/jpeg", delay_s=1.0)])
        url = origin.add("/fast.jpg", b"img", "image/jpeg")
        slow = asyncio.create_task(fetch(origin.url("/slow.jpg")))
        await wait_for(lambda: origin.requests("/slow.jpg") == 1, 5, what="the slow request")
        started = time.monotonic()
        fast = await fetch(url)
        waited = time.monotonic() - started
        assert (await slow).ok and fast.ok
        assert fast.response_s is not None
        assert waited >= 0.5 and fast.response_s < waited / 2, (waited, fast.response_s)
    finally:
        await session.close()


@pytest.mark.parametrize("failure", ["disconnect", "timeout", "refused", "blocked"])
async def test_no_response_no_response_time(origin, fetch, failure):
    from test.harness.services import free_port

    url = {
        "disconnect": lambda: origin.add_disconnect("/drop"),
        "timeout": lambda: origin.add_slow("/slow", b"late", delay_s=5),
        "refused": lambda: f"http://127.0.0.1:{free_port()}/a.jpg",
        "blocked": lambda: "http://10.0.0.1/a.jpg",
    }[failure]()
    result = await fetch(url)
    assert not result.ok and result.status != "200"
    assert (result.response_s, result.retry_after) == (None, None)


# --- Identity ------------------------------------------------------------------------------


async def test_every_request_carries_the_configured_user_agent(origin):
    ua = "image-crawler/0.1 (+https://example.org/crawl; crawl-ops@example.org)"
    settings = WorkerSettings.from_env(
        {"USER_AGENT": f"  {ua} ", "ALLOWED_PRIVATE_NETWORKS": "127.0.0.1/32"}
    ).fetch
    assert settings.user_agent == ua
    session = new_session(settings, settings.address_policy)
    fetch = Fetcher(session, settings, settings.address_policy).fetch
    try:
        origin.add("/a.jpg", b"img", "image/jpeg")
        origin.add("/r", b"", "text/plain", status=302, headers={"Location": "/a.jpg"})
        origin.add_status("/gone", 404)
        origin.add_status("/busy", 429)
        for path in ("/a.jpg", "/r", "/gone", "/busy", "/a.jpg"):
            await fetch(origin.url(path))
    finally:
        await session.close()
    seen = [headers.getall("User-Agent") for headers in origin.request_headers()]
    assert len(seen) == 6  # the redirect's two hops included
    assert seen == [[ua]] * 6


async def test_the_default_user_agent_names_the_project_its_version_and_url(origin, fetch):
    await fetch(origin.add("/a.jpg", b"img", "image/jpeg"))
    (headers,) = origin.request_headers("/a.jpg")
    assert headers.getall("User-Agent") == [DEFAULT_USER_AGENT]
    assert WorkerSettings.from_env({}).fetch.user_agent == DEFAULT_USER_AGENT
    for unset in ("", "   "):  # as docker-compose passes an unset variable
        assert WorkerSettings.from_env({"USER_AGENT": unset}).fetch.user_agent == DEFAULT_USER_AGENT
    name, version = DEFAULT_USER_AGENT.split(" ", 1)[0].split("/")
    assert name == "image-crawler" and version[0].isdigit()
    assert DEFAULT_USER_AGENT.endswith("(+https://github.com/cc-archive/image-crawler)")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("crawler\r\nX-Injected: 1", "carriage return"),
        ("crawler\nX-Injected: 1", "line feed"),
        ("crawler\x00", "control character"),
    ],
)
def test_a_user_agent_that_is_not_a_header_value_is_refused(value, message):
    with pytest.raises(ConfigError, match=f"USER_AGENT.*{message}"):
        WorkerSettings.from_env({"USER_AGENT": value})


# --- what an image's answer says of its use -------------------------------------------------
@pytest.mark.parametrize(
    ("headers", "directives"),
    [
        ([("X-Robots-Tag", "noindex")], ("noindex",)),
        ([("X-Robots-Tag", "nofollow"), ("x-robots-tag", "NOIMAGEINDEX")], ("noimageindex",)),
        ([("X-Robots-Tag", "image-crawler: none")], ("image-crawler: none",)),
    ],
)
async def test_an_answer_that_asks_not_to_be_indexed_is_no_index_and_its_body_unread(
    origin, fetch, headers, directives
):
    url = origin.add("/a.jpg", b"x" * 5_000_000, "image/jpeg", headers=CIMultiDict(headers))
    result = await fetch(url)
    assert (result.status, result.body, result.ok) == ("NoIndex", None, False)
    assert result.signals.noindex == directives and result.detail == ", ".join(directives)


@pytest.mark.parametrize(
    ("headers", "opt_outs", "policy"),
    [
        ([], (), None),
        ([("X-Robots-Tag", "otherbot: noindex, nofollow")], (), None),
        ([("X-Robots-Tag", "noai, noimageai")], ("noai", "noimageai"), None),
        (
            [("tdm-reservation", "1"), ("tdm-policy", "https://e.org/p")],
            ("tdm-reservation",),
            "https://e.org/p",
        ),
        ([("tdm-reservation", "0"), ("tdm-policy", "https://e.org/p")], (), None),
    ],
)
async def test_opt_outs_of_an_answer_come_with_its_body(origin, fetch, headers, opt_outs, policy):
    url = origin.add("/a.jpg", b"img", "image/jpeg", headers=CIMultiDict(headers))
    result = await fetch(url)
    assert result.ok and joined(result.body) == b"img"
    assert (result.signals.opt_outs, result.signals.tdm_policy) == (opt_outs, policy)


async def test_a_text_fetch_reads_no_signals(origin):
    session = new_session(SETTINGS, ORIGIN_ONLY)
    try:
        fetcher = Fetcher(session, SETTINGS, ORIGIN_ONLY)
        url = origin.add(
            "/robots.txt", b"User-agent: *\n", "text/plain", headers={"X-Robots-Tag": "noindex"}
        )
        result = await fetcher.fetch_text(url, 1000, 5)
    finally:
        await session.close()
    assert result.ok and not result.signals


async def test_x_robots_tag_groups_are_read_for_the_fetchers_token(origin):
    session = new_session(SETTINGS, ORIGIN_ONLY)
    try:
        fetcher = Fetcher(session, SETTINGS, ORIGIN_ONLY, token="mybot")
        url = origin.add("/a.jpg", b"img", "image/jpeg", headers={"X-Robots-Tag": "MyBot: noindex"})
        assert (await fetcher.fetch(url)).status == "NoIndex"
        url = origin.add(
            "/b.jpg", b"img", "image/jpeg", headers={"X-Robots-Tag": "image-crawler: noindex"}
        )
        assert (await fetcher.fetch(url)).ok
    finally:
        await session.close()


async def test_a_200_reports_its_etag_and_last_modified_as_sent(origin, fetch):
    headers = {"ETag": 'W/"5f3-1a2b"', "Last-Modified": "Tue, 03 Nov 2026 10:00:00 GMT"}
    url = origin.add("/v.jpg", b"img", "image/jpeg", headers=headers)
    result = await fetch(url)
    assert (result.status, result.etag, result.last_modified) == (
        "200",
        'W/"5f3-1a2b"',
        "Tue, 03 Nov 2026 10:00:00 GMT",
    )


async def test_a_200_without_validators_reports_none(origin, fetch):
    result = await fetch(origin.add("/n.jpg", b"img", "image/jpeg"))
    assert (result.ok, result.etag, result.last_modified) == (True, None, None)


async def test_a_validator_no_header_could_carry_back_is_not_reported(origin, fetch):
    url = origin.add("/long.jpg", b"img", "image/jpeg", headers={"ETag": '"' + "x" * 2000 + '"'})
    result = await fetch(url)
    assert (result.ok, result.etag) == (True, None)


async def test_conditions_go_with_the_request_and_a_304_has_no_body(origin, fetch):
    url = origin.add_sequence("/c.jpg", [Reply(status=304, headers={"ETag": '"e"'})])
    conditions = {"If-None-Match": '"e"', "If-Modified-Since": "Tue, 03 Nov 2026 10:00:00 GMT"}
    result = await fetch(url, None, conditions)
    assert (result.status, result.body, result.ok) == ("304", None, False)
    sent = origin.request_headers("/c.jpg")[-1]
    assert sent["If-None-Match"] == '"e"'
    assert sent["If-Modified-Since"] == "Tue, 03 Nov 2026 10:00:00 GMT"


async def test_conditions_go_with_every_redirect_hop(origin, fetch):
    target = origin.add("/final.jpg", b"img", "image/jpeg")
    url = origin.add_sequence("/moved.jpg", [Reply(status=301, headers={"Location": target})])
    result = await fetch(url, None, {"If-None-Match": '"e"'})
    assert result.ok
    assert [h.get("If-None-Match") for h in origin.request_headers()][-2:] == ['"e"', '"e"']


async def test_a_plain_fetch_sends_no_condition(origin, fetch):
    url = origin.add("/p.jpg", b"img", "image/jpeg")
    assert (await fetch(url)).ok
    sent = origin.request_headers("/p.jpg")[-1]
    assert "If-None-Match" not in sent and "If-Modified-Since" not in sent
