"""robots.txt against a real Redis and real HTTP origins on loopback: what is fetched, how
often, what its answers mean, and what hostile files cost."""

import asyncio
import functools
import json
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from redis.asyncio import Redis
from structlog.testing import capture_logs
from yarl import URL

from image_crawler import contract as c
from image_crawler.config import ConfigError
from test.harness.fakes import FakeFetcher, FakePacer, FakeSink, FakeStats, FakeStore
from test.harness.origin import DISCONNECT, Reply
from test.harness.services import wait_for
from worker.download.fetch import Fetcher, FetchResult, new_session
from worker.download.netguard import AddressPolicy, parse_networks
from worker.images.pool import InlineProcessor
from worker.pipeline import DEAD_LETTERED, Ending, Pipeline
from worker.politeness.hosts import HostKey
from worker.politeness.robots import Robots, RobotsEntry, RobotsGuard, file_digest, origin_of
from worker.politeness.signals import NO_SIGNALS, Signals
from worker.settings import FetchSettings, RobotsSettings, WorkerSettings

FETCH = FetchSettings(
    connect_timeout_s=1, read_timeout_s=1, total_timeout_s=3, max_body_bytes=1_000_000
)
LOOPBACK = AddressPolicy(parse_networks("127.0.0.0/8"))
# Short waits: the backoff's shape is test_retry_after.py's business.
FAST = RobotsSettings(
    token="image-crawler",
    retry_base_s=0.2,
    retry_cap_s=0.4,
    poll_s=0.02,
    slot_recheck_s=0.1,
    fetch_timeout_s=3,
)
SOURCE = "example"
ROBOTS = "User-agent: *\nDisallow: /private/\n\nUser-agent: Image-Crawler\nDisallow: /secret\n"


@pytest.fixture
async def session() -> AsyncIterator[object]:
    http = new_session(FETCH, LOOPBACK)
    yield http
    await http.close()


def make_guard(redis, session, pacer=None, address=LOOPBACK, **changes) -> RobotsGuard:
    settings = RobotsSettings(**{**_fields(FAST), **changes})
    return RobotsGuard(redis, Fetcher(session, FETCH, address), pacer or FakePacer(), settings)


def _fields(settings: RobotsSettings) -> dict[str, object]:
    return {name: getattr(settings, name) for name in settings.__slots__}


# --- what the file says ------------------------------------------------------------------
async def test_our_group_decides_and_urls_are_not_requested_to_learn_it(redis, session, origin):
    origin.set_robots(ROBOTS)
    guard = make_guard(redis, session)
    assert await guard.verdict(SOURCE, origin.url("/secret/a.jpg")) == c.Status.ROBOTS_DISALLOWED
    # The `*` group's rule is not ours: our product token has a group of its own.
    assert await guard.verdict(SOURCE, origin.url("/private/a.jpg")) is None
    assert await guard.verdict(SOURCE, origin.url("/robots.txt")) is None
    assert origin.requests("/robots.txt") == 1
    # And the host's TDMRep file, once, with it: nothing else is requested.
    assert origin.requests("/.well-known/tdmrep.json") == 1
    assert origin.total_requests == 2
    (headers,) = origin.request_headers("/robots.txt")
    assert headers["User-Agent"] == FETCH.user_agent


async def test_the_entry_is_cached_in_redis_for_the_cache_period(redis, session, origin):
    origin.set_robots(ROBOTS)
    guard = make_guard(redis, session, cache_s=600)
    await guard.verdict(SOURCE, origin.url("/a.jpg"))
    where = origin_of(origin.url("/a.jpg"))
    assert where is not None
    key = c.robots_key(where[0])
    assert key == f"robots:http://127.0.0.1:{origin.port}"
    entry = RobotsEntry.from_json(await redis.get(key))
    assert entry is not None and entry.status == "200"
    # What applies to our token (our group, not the `*` one), and the whole file's digest.
    assert entry.text == "User-agent: *\ndisallow: /secret\n"
    assert entry.token == "image-crawler" and entry.digest == file_digest(ROBOTS)
    assert 600 * 1000 <= await redis.pttl(key) <= 661 * 1000
    assert not await redis.exists(c.robots_lock_key(where[0]))


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 451])
async def test_a_4xx_allows_everything(redis, session, origin, status):
    origin.add_status("/robots.txt", status)
    guard = make_guard(redis, session)
    assert await guard.verdict(SOURCE, origin.url("/secret/a.jpg")) is None
    assert await guard.verdict(SOURCE, origin.url("/anything")) is None
    assert origin.requests("/robots.txt") == 1


# --- one fetch per host for the cluster -----------------------------------------------------
async def test_concurrent_workers_and_a_restart_fetch_it_once(redis_url, session, origin):
    # Slow to answer, so that every worker's first requests arrive while it is fetched.
    origin.add_slow("/robots.txt", ROBOTS.encode(), 0.3, "text/plain")
    clients = [Redis.from_url(redis_url, decode_responses=True) for _ in range(3)]
    try:
        workers = [make_guard(client, session) for client in clients[:2]]
        urls = [origin.url(f"/secret/{i}.jpg") for i in range(20)]
        answers = await asyncio.gather(*(w.verdict(SOURCE, u) for w in workers for u in urls))
        assert set(answers) == {c.Status.ROBOTS_DISALLOWED}
        assert origin.requests("/robots.txt") == 1
        assert sorted(w.fetches for w in workers) == [0, 1]
        restarted = make_guard(clients[2], session)
        assert await restarted.verdict(SOURCE, urls[0]) == c.Status.ROBOTS_DISALLOWED
        assert restarted.fetches == 0 and origin.requests("/robots.txt") == 1
    finally:
        for client in clients:
            await client.aclose()


async def test_a_robots_fetch_waits_for_the_sources_pacing_slot(redis, session, origin):
    origin.set_robots(ROBOTS)
    pacer = FakePacer(granted=set())
    guard = make_guard(redis, session, pacer=pacer)
    verdict = asyncio.create_task(guard.verdict(SOURCE, origin.url("/secret/a.jpg")))
    await wait_for(lambda: pacer.waiting, 5, what="a slot to be asked for")
    await asyncio.sleep(0.1)
    assert origin.requests("/robots.txt") == 0 and not verdict.done()
    pacer.grant_all()
    # The host's tdmrep.json waits for a slot of its own.
    await wait_for(
        lambda: origin.requests("/robots.txt") and pacer.waiting[1:], 5, what="a 2nd slot"
    )
    assert origin.requests("/.well-known/tdmrep.json") == 0 and not verdict.done()
    pacer.grant_all()
    assert await asyncio.wait_for(verdict, 5) == c.Status.ROBOTS_DISALLOWED
    assert origin.requests("/robots.txt") == 1
    assert origin.requests("/.well-known/tdmrep.json") == 1


async def test_a_source_without_a_rate_does_not_hold_back_another_on_the_same_host(
    redis, session, origin
):
    origin.set_robots(ROBOTS)
    pacer = FakePacer(granted={"paid"})
    guard = make_guard(redis, session, pacer=pacer)
    starved = asyncio.create_task(guard.verdict("starved", origin.url("/secret/a.jpg")))
    await wait_for(lambda: pacer.waiting, 5, what="the starved source to ask for a slot")
    paid = await asyncio.wait_for(guard.verdict("paid", origin.url("/secret/b.jpg")), 5)
    assert paid == c.Status.ROBOTS_DISALLOWED
    # The file is known now, for every source: the starved one's URL is answered too.
    assert await asyncio.wait_for(starved, 5) == c.Status.ROBOTS_DISALLOWED
    # One slot for robots.txt, one for tdmrep.json: both the paid source's.
    assert pacer.taken == ["paid", "paid"] and origin.requests("/robots.txt") == 1


# --- unreachable ---------------------------------------------------------------------------
@pytest.mark.timing("asserts the verdict at least 0.05 s after the failed check")
@pytest.mark.parametrize(
    "failure",
    [500, 502, 503, 429, DISCONNECT, Reply(b"late", "text/plain", delay_s=10)],
    ids=["500", "502", "503", "429", "disconnect", "timeout"],
)
async def test_an_unreachable_file_holds_its_urls_until_it_answers(redis, session, origin, failure):
    origin.add_sequence("/robots.txt", [failure, Reply(ROBOTS.encode(), "text/plain")])
    guard = make_guard(redis, session)
    url = origin.url("/secret/a.jpg")
    with capture_logs() as logs:
        assert await guard.check(SOURCE, url) is Robots.UNAVAILABLE
        started = time.monotonic()
        assert await asyncio.wait_for(guard.verdict(SOURCE, url), 10) == c.Status.ROBOTS_DISALLOWED
    assert time.monotonic() - started >= 0.05  # it waited for the retry, about 0.1-0.2 s
    assert origin.requests("/robots.txt") == 2
    assert origin.requests("/secret/a.jpg") == 0
    (unavailable,) = [e for e in logs if e["event"] == "robots_unavailable"]
    assert unavailable["failures"] == 1 and unavailable["source"] == SOURCE


@pytest.mark.timing("asserts the seconds until giving up and the robots.txt asks made in that time")
async def test_urls_of_a_host_unreachable_too_long_end_as_robots_unavailable(
    redis, session, origin
):
    origin.add_status("/robots.txt", 503)
    guard = make_guard(redis, session, unavailable_max_s=0.8)
    started = time.monotonic()
    verdict = await asyncio.wait_for(guard.verdict(SOURCE, origin.url("/a.jpg")), 10)
    assert verdict == c.Status.ROBOTS_UNAVAILABLE
    assert time.monotonic() - started >= 0.8
    # Asked again with backoff meanwhile (0.1-0.2 s, then 0.2-0.4 s ...), not in a loop.
    assert 2 <= origin.requests("/robots.txt") <= 6
    assert origin.requests("/a.jpg") == 0


@pytest.mark.timing("asserts the second robots.txt fetch at least 1 s after the first")
async def test_a_429s_retry_after_is_obeyed_and_pauses_the_source(redis, session, origin):
    origin.add_sequence(
        "/robots.txt",
        [
            Reply(b"slow down", "text/plain", status=429, headers={"Retry-After": "1"}),
            Reply(ROBOTS.encode(), "text/plain"),
        ],
    )
    pacer = FakePacer()
    guard = make_guard(redis, session, pacer=pacer)
    started = time.monotonic()
    assert await guard.verdict(SOURCE, origin.url("/secret/a.jpg")) == c.Status.ROBOTS_DISALLOWED
    assert time.monotonic() - started >= 1.0
    assert pacer.pauses == [(SOURCE, 1.0)]
    assert origin.requests("/robots.txt") == 2


# --- redirects -----------------------------------------------------------------------------
async def test_redirects_are_followed_and_the_rules_apply_to_the_first_host(
    redis, session, origin, second_host
):
    second_host.add("/rules.txt", b"User-agent: *\nDisallow: /x\n", "text/plain")
    origin.add("/robots.txt", b"", "text/plain", 301, {"Location": "/r1"})
    for hop in range(1, 4):
        origin.add(f"/r{hop}", b"", "text/plain", 302, {"Location": f"/r{hop + 1}"})
    origin.add("/r4", b"", "text/plain", 307, {"Location": second_host.url("/rules.txt")})
    guard = make_guard(redis, session)
    assert await guard.verdict(SOURCE, origin.url("/x/a.jpg")) == c.Status.ROBOTS_DISALLOWED
    assert await guard.verdict(SOURCE, origin.url("/y/a.jpg")) is None
    # The second host's own robots.txt was never asked: its rules were not what we read.
    assert second_host.requests("/robots.txt") == 0


async def test_a_redirect_loop_allows_everything(redis, session, origin):
    origin.add("/robots.txt", b"", "text/plain", 301, {"Location": "/loop"})
    origin.add("/loop", b"", "text/plain", 301, {"Location": "/robots.txt"})
    guard = make_guard(redis, session)
    assert await guard.verdict(SOURCE, origin.url("/secret/a.jpg")) is None
    # The first request and five redirects, then RFC 9309 2.3.1.2: as if no file.
    assert origin.total_requests - origin.requests("/.well-known/tdmrep.json") == 6


async def test_a_redirect_to_a_private_address_is_not_followed(redis, session, origin):
    only_origin = AddressPolicy(parse_networks("127.0.0.1/32"))
    origin.add("/robots.txt", b"", "text/plain", 302, {"Location": "http://127.0.0.9/robots.txt"})
    guard = make_guard(redis, session, address=only_origin, unavailable_max_s=0.3)
    assert await guard.check(SOURCE, origin.url("/a.jpg")) is Robots.UNAVAILABLE
    assert await guard.verdict(SOURCE, origin.url("/a.jpg")) == c.Status.ROBOTS_UNAVAILABLE


async def test_a_host_the_fetcher_refuses_is_left_to_the_fetcher(redis, session, second_host):
    # Its URLs end as Blocked without a request; they must not wait for a robots.txt that
    # will never be asked for.
    only_origin = AddressPolicy(parse_networks("127.0.0.1/32"))
    guard = make_guard(redis, session, address=only_origin)
    assert await guard.verdict(SOURCE, second_host.url("/a.jpg")) is None
    assert second_host.total_requests == 0


async def test_an_image_redirect_is_checked_against_its_hosts_robots(
    redis, session, origin, second_host
):
    second_host.set_robots("User-agent: *\nDisallow: /hidden\n")
    second_host.add("/hidden/a.jpg", b"x", "image/jpeg")
    origin.add("/a.jpg", b"", "text/plain", 302, {"Location": second_host.url("/hidden/a.jpg")})
    guard = make_guard(redis, session)
    fetcher = Fetcher(session, FETCH, LOOPBACK)
    permit = functools.partial(guard.hop_status, SOURCE)
    result = await fetcher.fetch(origin.url("/a.jpg"), permit)
    assert result.status == c.Status.ROBOTS_DISALLOWED
    assert second_host.requests("/robots.txt") == 1
    assert second_host.requests("/hidden/a.jpg") == 0


# --- Crawl-delay ---------------------------------------------------------------------------
@pytest.mark.parametrize(("asked", "kept"), [("7", "7.0"), ("0.5", "0.5"), ("3600", "60.0")])
async def test_a_crawl_delay_is_noted_for_its_host_capped(redis, session, origin, asked, kept):
    origin.set_robots(f"User-agent: *\nCrawl-delay: {asked}\nDisallow: /x\n")
    pacer = FakePacer()
    guard = make_guard(redis, session, pacer)
    with capture_logs() as logs:
        assert await guard.verdict(SOURCE, origin.url("/a.jpg")) is None
    host = URL(origin.url("/")).host
    assert pacer.crawl_delays == [(HostKey(SOURCE, host), float(kept))]
    capped = [e for e in logs if e["event"] == "crawl_delay_capped"]
    assert len(capped) == (asked == "3600")


async def test_each_host_keeps_its_own_crawl_delay(redis, session, origin, second_host):
    origin.set_robots("User-agent: *\nCrawl-delay: 9\n")
    second_host.set_robots("User-agent: *\nCrawl-delay: 2\n")
    pacer = FakePacer()
    guard = make_guard(redis, session, pacer)
    await guard.verdict(SOURCE, origin.url("/a.jpg"))
    await guard.verdict(SOURCE, second_host.url("/a.jpg"))
    assert sorted(d for _, d in pacer.crawl_delays) == [2.0, 9.0]
    assert len({key.host for key, _ in pacer.crawl_delays}) == 2


async def test_a_tdmrep_file_the_robots_txt_disallows_is_not_asked_for(redis, session, origin):
    origin.set_robots(f"User-agent: *\nDisallow: {c.TDMREP_PATH}\n")
    pacer = FakePacer()
    guard = make_guard(redis, session, pacer)
    assert await guard.verdict(SOURCE, origin.url("/a.jpg")) is None
    assert origin.requests("/robots.txt") == 1
    assert origin.requests(c.TDMREP_PATH) == 0
    # The robots.txt answer was reported to its host's pace, like any answer.
    assert [status for _, status, _ in pacer.reports] == ["200"]


# --- operators decide ----------------------------------------------------------------------
async def test_an_exempt_source_skips_robots_txt(redis, session, origin):
    origin.set_robots("User-agent: *\nDisallow: /\nCrawl-delay: 5\n")
    await redis.sadd(c.ROBOTS_EXEMPT_SET, SOURCE)
    guard = make_guard(redis, session)
    assert await guard.verdict(SOURCE, origin.url("/a.jpg")) is None
    assert await guard.verdict("other", origin.url("/a.jpg")) == c.Status.ROBOTS_DISALLOWED
    assert origin.requests("/robots.txt") == 1  # for "other" only
    assert not await redis.keys(f"{c.PACE_HOST_PREFIX}*")


async def test_the_exempt_set_is_read_again(redis, session, origin):
    origin.set_robots("User-agent: *\nDisallow: /\n")
    guard = make_guard(redis, session, exempt_refresh_s=0.05)
    assert await guard.verdict(SOURCE, origin.url("/a.jpg")) == c.Status.ROBOTS_DISALLOWED
    await redis.sadd(c.ROBOTS_EXEMPT_SET, SOURCE)
    await asyncio.sleep(0.1)
    assert await guard.verdict(SOURCE, origin.url("/a.jpg")) is None


async def test_policy_ignore_fetches_nothing(redis, session, origin):
    origin.set_robots("User-agent: *\nDisallow: /\n")
    guard = make_guard(redis, session, policy="ignore")
    assert await guard.verdict(SOURCE, origin.url("/a.jpg")) is None
    assert origin.total_requests == 0


# --- hostile files -------------------------------------------------------------------------
def _trickle(seconds: float):
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await response.write(b"#")
            await asyncio.sleep(0.5)
        return response

    return handler


HEAD = b"User-agent: *\nDisallow: /blocked\n"


@pytest.mark.parametrize(
    ("body", "blocked"),
    [
        (HEAD + b"# filler line\n" * (50 * 1024 * 1024 // 14), True),  # 50 MB
        (HEAD + b"Disallow: /" + b"a" * (1024 * 1024), True),  # one line of 1 MB
        (bytes(range(256)) * 4096, False),  # binary garbage, NULs included
        (b"<!DOCTYPE html><html><body><p>Disallow: /blocked</p></body></html>", False),
        (b"User-agent: *\nDisallow: /caf\xe9\nDisallow: /blocked\n", True),  # Latin-1
        (b"\xef\xbb\xbf" + HEAD, True),  # a byte-order mark
    ],
    ids=["50MB", "1MB-line", "binary", "html", "latin-1", "bom"],
)
async def test_hostile_files_cost_little_and_break_nothing(redis, session, origin, body, blocked):
    origin.set_robots(body)
    guard = make_guard(redis, session)
    verdict = await guard.verdict(SOURCE, origin.url("/blocked/a.jpg"))
    assert verdict == (c.Status.ROBOTS_DISALLOWED if blocked else None)
    assert await guard.verdict(SOURCE, origin.url("/open/a.jpg")) is None
    entry = RobotsEntry.from_json(await redis.get(c.robots_key(f"http://127.0.0.1:{origin.port}")))
    assert entry is not None and entry.text is not None
    # One character per byte read at most (undecodable bytes become U+FFFD).
    assert len(entry.text) <= c.ROBOTS_MAX_BYTES


@pytest.mark.timing("asserts the verdict comes within 5 s against a 1 s fetch timeout")
async def test_a_trickling_server_times_out_and_is_unreachable(redis, session, origin):
    origin.add_handler("/robots.txt", _trickle(30))
    guard = make_guard(redis, session, fetch_timeout_s=1.0, unavailable_max_s=60)
    started = time.monotonic()
    assert await guard.check(SOURCE, origin.url("/a.jpg")) is Robots.UNAVAILABLE
    assert time.monotonic() - started < 5


async def test_an_entry_that_is_not_ours_is_fetched_again(redis, session, origin):
    origin.set_robots(ROBOTS)
    await redis.set(c.robots_key(f"http://127.0.0.1:{origin.port}"), "not json")
    guard = make_guard(redis, session)
    assert await guard.verdict(SOURCE, origin.url("/secret/a.jpg")) == c.Status.ROBOTS_DISALLOWED
    assert origin.requests("/robots.txt") == 1


async def test_an_entry_of_the_format_before_is_obeyed_not_fetched_again(redis, session, origin):
    # Written by a worker before the upgrade: the whole file, long names.
    origin.set_robots("User-agent: *\nAllow: /\n")
    now = time.time()
    old = {"status": "200", "text": ROBOTS, "fetched_at": now, "expires_at": now + 600}
    await redis.set(c.robots_key(f"http://127.0.0.1:{origin.port}"), json.dumps(old))
    guard = make_guard(redis, session)
    assert await guard.verdict(SOURCE, origin.url("/secret/a.jpg")) == c.Status.ROBOTS_DISALLOWED
    assert await guard.verdict(SOURCE, origin.url("/private/a.jpg")) is None
    assert origin.requests("/robots.txt") == 0


async def test_an_entry_decided_for_another_token_is_fetched_again(redis, session, origin):
    origin.set_robots(ROBOTS)
    now = time.time()
    theirs = RobotsEntry("200", "User-agent: *\ndisallow: /\n", now, now + 600, token="otherbot")
    await redis.set(c.robots_key(f"http://127.0.0.1:{origin.port}"), theirs.to_json())
    guard = make_guard(redis, session)
    assert await guard.verdict(SOURCE, origin.url("/private/a.jpg")) is None
    assert await guard.verdict(SOURCE, origin.url("/secret/a.jpg")) == c.Status.ROBOTS_DISALLOWED
    assert origin.requests("/robots.txt") == 1


async def test_a_file_fetched_again_a_day_later_is_told_changed_by_its_digest(
    redis, session, origin
):
    origin.set_robots(ROBOTS)
    now = [time.time()]
    settings = RobotsSettings(**_fields(FAST))
    guard = RobotsGuard(
        redis, Fetcher(session, FETCH, LOOPBACK), FakePacer(), settings, clock=lambda: now[0]
    )
    url = origin.url("/secret/a.jpg")
    with capture_logs() as logs:
        assert await guard.verdict(SOURCE, url) == c.Status.ROBOTS_DISALLOWED
        now[0] += settings.cache_s + 1  # the entry is stale: fetched again
        assert await guard.verdict(SOURCE, url) == c.Status.ROBOTS_DISALLOWED
        origin.set_robots(ROBOTS + "Disallow: /more\n")
        now[0] += settings.cache_s + 1
        assert await guard.verdict(SOURCE, url) == c.Status.ROBOTS_DISALLOWED
    fetched = [e for e in logs if e["event"] == "robots_fetched"]
    assert [e["changed"] for e in fetched] == [False, False, True]
    assert fetched[2]["digest"] == file_digest(ROBOTS + "Disallow: /more\n")
    assert origin.requests("/robots.txt") == 3


# --- in the pipeline -----------------------------------------------------------------------
async def test_a_disallowed_url_is_dead_lettered_counted_and_never_requested(
    redis, session, origin
):
    origin.set_robots(ROBOTS)
    origin.add("/secret/a.jpg", b"x", "image/jpeg")
    sink, stats = FakeSink(), FakeStats()
    pipeline = Pipeline(
        pacer=FakePacer(),
        fetcher=Fetcher(session, FETCH, LOOPBACK),
        processor=InlineProcessor(),
        store=FakeStore(),
        sink=sink,
        stats=stats,
        robots=make_guard(redis, session),
    )
    url = origin.url("/secret/a.jpg")
    message = c.SourceTask(url=url, uuid="u-1", attempts=0).to_json()
    ending = await pipeline.handle(SOURCE, message, "urls.example")
    assert ending == Ending(c.Status.ROBOTS_DISALLOWED, DEAD_LETTERED, 0)
    (error,) = sink.messages[c.CRAWL_ERRORS_TOPIC]
    assert (error["status"], error["url"], error["source"]) == (
        c.Status.ROBOTS_DISALLOWED,
        url,
        SOURCE,
    )
    assert stats.outcomes == [(SOURCE, c.Status.ROBOTS_DISALLOWED)]
    assert origin.requests("/secret/a.jpg") == 0


# --- a host whose name does not resolve -----------------------------------------------------
class FilesFetcher:
    """A fetcher of hosts' files that answers ``results`` in turn (the last one again once
    they run out), and records what it was asked."""

    def __init__(self, *results: FetchResult) -> None:
        self.results = list(results)
        self.fetched: list[str] = []

    async def fetch_text(self, url: str, max_bytes: int, max_redirects: int) -> FetchResult:
        self.fetched.append(url)
        return self.results.pop(0) if len(self.results) > 1 else self.results[0]


def unresolved(kind: str) -> FetchResult:
    return FetchResult(c.Status.DNS_ERROR, detail=f"gone.example: {kind} (...)", dns_failure=kind)


GONE = [f"http://gone.example/{i}.jpg" for i in range(30)]
GONE_ROBOTS = "http://gone.example/robots.txt"


def dns_guard(redis, fetcher, pacer=None, **changes) -> RobotsGuard:
    settings = RobotsSettings(**{**_fields(FAST), **changes})
    return RobotsGuard(redis, fetcher, pacer or FakePacer(), settings)


@pytest.mark.timing("asserts 30 verdicts within 2 s")
@pytest.mark.parametrize("kind", ["nxdomain", "nodata"])
async def test_urls_of_a_name_that_does_not_exist_end_as_dns_error_at_once(redis, kind):
    fetcher, pacer = FilesFetcher(unresolved(kind)), FakePacer()
    guard = dns_guard(redis, fetcher, pacer)
    started = time.monotonic()
    with capture_logs() as logs:
        verdicts = await asyncio.wait_for(
            asyncio.gather(*(guard.verdict(SOURCE, url) for url in GONE)), 10
        )
    assert set(verdicts) == {c.Status.DNS_ERROR}
    assert time.monotonic() - started < 2.0
    # One lookup for all its URLs, no request reached the host: nothing told its pace.
    assert fetcher.fetched == [GONE_ROBOTS]
    assert pacer.reports == []
    (logged,) = [e for e in logs if e["event"] == "robots_unresolved"]
    assert (logged["kind"], logged["tries"], logged["ends_urls"]) == (kind, 2, True)
    # Remembered until it is asked again, not for the day a robots.txt is waited for.
    key = c.robots_key("http://gone.example:80")
    entry = RobotsEntry.from_json(await redis.get(key))
    assert entry is not None and entry.status == c.Status.DNS_ERROR
    assert 0 < await redis.pttl(key) <= (FAST.dns_retry_s + 60) * 1000
    # Another worker ends the host's URLs from that entry, without a lookup of its own.
    other = FilesFetcher(unresolved(kind))
    assert await dns_guard(redis, other).verdict(SOURCE, GONE[0]) == c.Status.DNS_ERROR
    assert other.fetched == []


@pytest.mark.timing("asserts the seconds to the verdict between 0.2 s and 5 s")
@pytest.mark.parametrize("kind", ["servfail", "timeout", "refused", "other"])
async def test_a_name_that_got_no_answer_is_asked_once_more_before_its_urls_end(redis, kind):
    fetcher = FilesFetcher(unresolved(kind))
    guard = dns_guard(redis, fetcher, dns_retry_s=0.3)
    assert await guard.check(SOURCE, GONE[0]) is Robots.UNAVAILABLE
    started = time.monotonic()
    verdicts = await asyncio.wait_for(
        asyncio.gather(*(guard.verdict(SOURCE, url) for url in GONE)), 10
    )
    assert set(verdicts) == {c.Status.DNS_ERROR}
    assert 0.2 <= time.monotonic() - started < 5
    assert fetcher.fetched == [GONE_ROBOTS] * 2


async def test_a_name_that_answers_at_its_second_try_is_crawled(redis):
    fetcher = FilesFetcher(unresolved("servfail"), FetchResult("200", body=ROBOTS.encode()))
    guard = dns_guard(redis, fetcher, dns_retry_s=0.2)
    verdict = await asyncio.wait_for(guard.verdict(SOURCE, "http://gone.example/secret/a"), 10)
    assert verdict == c.Status.ROBOTS_DISALLOWED
    assert await guard.verdict(SOURCE, GONE[0]) is None
    assert fetcher.fetched[:2] == [GONE_ROBOTS] * 2


async def test_a_name_that_did_not_resolve_is_asked_again_after_the_retry_time(redis):
    now = [1000.0]
    fetcher = FilesFetcher(unresolved("nxdomain"))
    settings = RobotsSettings(**_fields(FAST))
    guard = RobotsGuard(redis, fetcher, FakePacer(), settings, clock=lambda: now[0])
    assert await guard.verdict(SOURCE, GONE[0]) == c.Status.DNS_ERROR
    now[0] += settings.dns_retry_s - 0.1
    assert await guard.verdict(SOURCE, GONE[1]) == c.Status.DNS_ERROR
    assert len(fetcher.fetched) == 1
    now[0] += 0.1
    assert await guard.verdict(SOURCE, GONE[2]) == c.Status.DNS_ERROR
    assert len(fetcher.fetched) == 2


async def test_urls_of_a_host_that_does_not_resolve_go_to_crawl_errors(redis):
    sink, stats, images = FakeSink(), FakeStats(), FakeFetcher({})
    pipeline = Pipeline(
        pacer=FakePacer(),
        fetcher=images,
        processor=InlineProcessor(),
        store=FakeStore(),
        sink=sink,
        stats=stats,
        robots=dns_guard(redis, FilesFetcher(unresolved("nxdomain"))),
    )
    messages = [c.SourceTask(url=url, uuid=f"u-{i}").to_json() for i, url in enumerate(GONE)]
    endings = await asyncio.wait_for(
        asyncio.gather(*(pipeline.handle(SOURCE, m, "urls.example") for m in messages)), 10
    )
    assert set(endings) == {Ending(c.Status.DNS_ERROR, DEAD_LETTERED, 0)}
    errors = sink.messages[c.CRAWL_ERRORS_TOPIC]
    assert sorted(e["identifier"] for e in errors) == sorted(f"u-{i}" for i in range(30))
    assert {e["status"] for e in errors} == {c.Status.DNS_ERROR}
    assert stats.outcomes == [(SOURCE, c.Status.DNS_ERROR)] * 30
    assert images.requests == []


def test_entries_round_trip_and_bad_ones_are_none():
    entry = RobotsEntry("503", None, 1.0, 2.0, unavailable_since=1.0, failures=3)
    assert RobotsEntry.from_json(entry.to_json()) == entry
    for raw in ["", "[]", "{}", json.dumps({"status": 1, "fetched_at": "x"}), "null"]:
        assert RobotsEntry.from_json(raw) is None


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("http://Example.COM/a.jpg", "http://example.com:80"),
        ("https://example.com/a", "https://example.com:443"),
        ("http://example.com:8080/a?b#c", "http://example.com:8080"),
        ("http://[::1]:81/a", "http://::1:81"),
        ("ftp://example.com/a", None),
        ("not a url", None),
        ("http:///nohost", None),
    ],
)
def test_origin_of(url, origin):
    where = origin_of(url)
    assert (where and where[0]) == origin


# --- settings ------------------------------------------------------------------------------
def _settings(**env: str) -> RobotsSettings:
    return WorkerSettings.from_env({"AWS_ACCESS_KEY_ID": "x", **env}).robots


def test_the_settings_default_to_obeying_as_the_user_agents_product_token():
    settings = _settings()
    assert (settings.policy, settings.token) == ("obey", "image-crawler")
    assert (settings.cache_s, settings.unavailable_max_s) == (86400.0, 86400.0)
    assert settings.max_crawl_delay_s == 60.0
    assert _settings(USER_AGENT="PhotoBot/2.0 (+mailto:ops@example.org)").token == "PhotoBot"
    assert _settings(ROBOTS_USER_AGENT="Our_Bot", USER_AGENT="x/1").token == "Our_Bot"
    assert _settings(ROBOTS_POLICY=" IGNORE ").policy == "ignore"
    assert _settings(ROBOTS_POLICY="").policy == "obey"  # empty means the default
    changed = _settings(ROBOTS_CACHE_S="600", ROBOTS_UNAVAILABLE_MAX_S="7", MAX_CRAWL_DELAY_S="5")
    assert (changed.cache_s, changed.unavailable_max_s, changed.max_crawl_delay_s) == (600, 7, 5)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ROBOTS_POLICY": "sometimes"}, "ROBOTS_POLICY must be one of obey, ignore"),
        ({"ROBOTS_USER_AGENT": "image-crawler/1.0"}, "ROBOTS_USER_AGENT must be a product token"),
        ({"ROBOTS_USER_AGENT": "two words"}, "ROBOTS_USER_AGENT must be a product token"),
        ({"ROBOTS_CACHE_S": "0"}, "ROBOTS_CACHE_S must be a number of seconds above 0"),
        ({"MAX_CRAWL_DELAY_S": "-1"}, "MAX_CRAWL_DELAY_S"),
        ({"ROBOTS_UNAVAILABLE_MAX_S": "soon"}, "ROBOTS_UNAVAILABLE_MAX_S"),
    ],
)
def test_bad_settings_are_refused_with_their_name(env, message):
    with pytest.raises(ConfigError, match=message):
        _settings(**env)


# --- what the host's files say of the images' use ---------------------------------------
TDMREP = json.dumps(
    [
        {"location": "/public/*", "tdm-reservation": 0},
        {"location": "/images/", "tdm-reservation": 1, "tdm-policy": "https://e.org/p.json"},
    ]
)


async def test_content_signals_of_our_group_say_what_may_be_done(redis, session, origin):
    origin.set_robots(
        "User-agent: *\nContent-Signal: search=yes, ai-train=no, ai-input=no\nAllow: /\n"
    )
    guard = make_guard(redis, session)
    status, said = await guard.consult(SOURCE, origin.url("/a.jpg"))
    assert status is None and said == Signals(opt_outs=("ai-train", "ai-input"))


async def test_content_signal_search_no_keeps_urls_out_of_the_index_unrequested(
    redis, session, origin
):
    origin.set_robots("User-agent: image-crawler\nContent-Signal: search=no\nAllow: /\n")
    guard = make_guard(redis, session)
    status, said = await guard.consult(SOURCE, origin.url("/a.jpg"))
    assert status == c.Status.NO_INDEX and said.noindex == ("content-signal: search=no",)
    assert await guard.verdict(SOURCE, origin.url("/b.jpg")) == c.Status.NO_INDEX
    assert origin.requests("/a.jpg") == origin.requests("/b.jpg") == 0


async def test_a_hosts_tdmrep_json_reserves_the_paths_its_rules_cover(redis_url, session, origin):
    origin.set_robots("User-agent: *\nAllow: /\n")
    origin.add("/.well-known/tdmrep.json", TDMREP.encode(), "application/json")
    clients = [Redis.from_url(redis_url, decode_responses=True) for _ in range(2)]
    try:
        guard = make_guard(clients[0], session)
        reserved = Signals(opt_outs=("tdm-reservation",), tdm_policy="https://e.org/p.json")
        assert await guard.consult(SOURCE, origin.url("/images/a.jpg")) == (None, reserved)
        assert await guard.consult(SOURCE, origin.url("/public/images/a.jpg")) == (None, NO_SIGNALS)
        assert await guard.consult(SOURCE, origin.url("/other.jpg")) == (None, NO_SIGNALS)
        # Cached with robots.txt, for the cluster: another worker fetches neither.
        other = make_guard(clients[1], session)
        assert await other.consult(SOURCE, origin.url("/images/b.jpg")) == (None, reserved)
        assert other.fetches == other.tdmrep_fetches == 0
        assert origin.requests("/.well-known/tdmrep.json") == 1 == guard.tdmrep_fetches
    finally:
        for client in clients:
            await client.aclose()


@pytest.mark.parametrize(
    "answer",
    [
        Reply(b"not json", "application/json"),
        Reply(b'{"location": "/", "tdm-reservation": 1}', "application/json"),
        Reply(TDMREP.encode(), "application/json", status=500),
        Reply(TDMREP.encode(), "application/json", status=403),
        DISCONNECT,
        Reply(b"[" * 600_000, "application/json"),  # past the size limit, and deep
    ],
    ids=["not-json", "not-an-array", "500", "403", "disconnect", "huge"],
)
async def test_a_tdmrep_json_that_cannot_be_read_reserves_nothing(redis, session, origin, answer):
    origin.set_robots("User-agent: *\nAllow: /\n")
    origin.add_sequence("/.well-known/tdmrep.json", [answer])
    guard = make_guard(redis, session)
    assert await guard.consult(SOURCE, origin.url("/images/a.jpg")) == (None, NO_SIGNALS)
    # And it is not asked again for every URL: it is cached with robots.txt.
    assert await guard.consult(SOURCE, origin.url("/images/b.jpg")) == (None, NO_SIGNALS)
    assert origin.requests("/.well-known/tdmrep.json") == 1


async def test_an_unreachable_robots_txt_asks_for_no_tdmrep_json(redis, session, origin):
    origin.add_sequence("/robots.txt", [Reply(b"", "text/plain", status=503)])
    guard = make_guard(redis, session)
    assert await guard.check(SOURCE, origin.url("/a.jpg")) is Robots.UNAVAILABLE
    assert origin.requests("/.well-known/tdmrep.json") == 0
