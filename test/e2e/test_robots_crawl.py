"""robots.txt as webmasters see it: the real monitor and real workers against local
origins on two loopback addresses (two hosts), every request taken at the origin.

- two workers and a restart fetch each host's robots.txt once; a disallowed URL is never
  requested, goes to crawl_errors as RobotsDisallowed and is counted for its source;
- a host whose robots.txt answers 503 holds its URLs (none requested) until it answers;
  one that never answers ends them as RobotsUnavailable after ROBOTS_UNAVAILABLE_MAX_S;
- a Crawl-delay paces the source at one request per delay from its first request, the
  robots.txt request included, and the monitor reports the cap.
"""

from __future__ import annotations

import time

import pytest

from image_crawler import contract as c
from test.harness.crawl import Crawl, Outputs, tiny_jpeg
from test.harness.origin import Origin, Reply
from test.harness.services import wait_for
from test.harness.windows import over_bound

LOOPBACKS = {"ALLOWED_PRIVATE_NETWORKS": "127.0.0.0/8"}


def errors_with(outputs: Outputs, status: str) -> set[str]:
    return {
        o.uuid
        for o in outputs.records
        if o.topic == c.CRAWL_ERRORS_TOPIC and o.message["status"] == status
    }


ROBOTIC = "robotic"


@pytest.mark.timeout(300)
async def test_two_workers_and_a_restart_ask_each_host_once_and_obey_it(
    kafka, redis, redis_url, origin, second_host, tmp_path
):
    body = tiny_jpeg()
    # Slow to answer: both workers' first URLs for the host arrive while it is fetched.
    origin.add_slow(
        "/robots.txt", b"User-agent: *\nDisallow: /robotic/private/\n", 1.0, "text/plain"
    )
    paths = [f"/robotic/{i}.jpg" for i in range(20)] + [
        f"/robotic/private/{i}.jpg" for i in range(10)
    ]
    urls = [origin.add(p, body, "image/jpeg") for p in paths]
    urls += [second_host.add(f"/robotic/b{i}.jpg", body, "image/jpeg") for i in range(10)]
    disallowed = {f"{ROBOTIC}-{i}" for i in range(20, 30)}
    allowed = {f"{ROBOTIC}-{i}" for i in range(40)} - disallowed
    crawl = Crawl(kafka, redis_url, tmp_path)
    try:
        async with Outputs(kafka.bootstrap) as outputs:
            await crawl.queue(redis, ROBOTIC, 20.0, urls)
            await crawl.start(redis, [ROBOTIC], workers=2, **LOOPBACKS)
            await wait_for(lambda: outputs.resolved >= allowed, 60, what="the allowed URLs")
            await wait_for(
                lambda: errors_with(outputs, c.Status.ROBOTS_DISALLOWED) >= disallowed,
                30,
                what="the disallowed URLs dead-lettered",
            )
            assert outputs.resolved & disallowed == set()
            assert [p for p, _ in _requested(origin) if "/private/" in p] == []
            assert origin.requests("/robots.txt") == 1  # second_host has none: a 404
            assert second_host.requests("/robots.txt") == 1
            fetched = crawl.events("robots_fetched")
            assert len(fetched) == 2, fetched
            counted = await redis.get(c.resize_errors_key(ROBOTIC, c.Status.ROBOTS_DISALLOWED))
            assert counted == "10"

            # Both workers stop; a new one takes over a new batch: the cache holds.
            for worker in crawl.workers:
                worker.stop()
            crawl.workers.clear()
            more = [origin.add(f"/robotic/new{i}.jpg", body, "image/jpeg") for i in range(5)]
            more += [
                origin.add(f"/robotic/private/new{i}.jpg", body, "image/jpeg") for i in range(5)
            ]
            await crawl.queue_more(ROBOTIC, more, first_index=40)
            await crawl.add_workers([ROBOTIC], 1, **LOOPBACKS)
            await wait_for(
                lambda: outputs.resolved >= {f"{ROBOTIC}-{i}" for i in range(40, 45)},
                60,
                what="the new batch",
            )
            await wait_for(
                lambda: (
                    errors_with(outputs, c.Status.ROBOTS_DISALLOWED)
                    >= {f"{ROBOTIC}-{i}" for i in range(45, 50)}
                ),
                30,
                what="the new batch's disallowed URLs",
            )
            assert origin.requests("/robots.txt") == 1
            assert second_host.requests("/robots.txt") == 1
            assert [p for p, _ in _requested(origin) if "/private/" in p] == []
    finally:
        crawl.stop()


def _requested(origin: Origin) -> list[tuple[str, float]]:
    return [(path, t) for t, path in origin.request_log]


WAITING, GONE = "waiting", "gone"


@pytest.mark.timing("asserts the seconds until giving up and the robots.txt asks made in that time")
@pytest.mark.timeout(300)
async def test_urls_wait_for_an_unreachable_robots_txt_and_give_up_after_the_limit(
    kafka, redis, redis_url, origin, second_host, tmp_path
):
    body = tiny_jpeg()
    allow = Reply(b"User-agent: *\nDisallow: /nothing\n", "text/plain")
    origin.add_sequence("/robots.txt", [503, 503, allow])
    second_host.add_status("/robots.txt", 500)
    waiting = [origin.add(f"/{WAITING}/{i}.jpg", body, "image/jpeg") for i in range(10)]
    gone = [second_host.add(f"/{GONE}/{i}.jpg", body, "image/jpeg") for i in range(10)]
    crawl = Crawl(kafka, redis_url, tmp_path)
    try:
        async with Outputs(kafka.bootstrap) as outputs:
            await crawl.queue(redis, WAITING, 20.0, waiting)
            await crawl.queue(redis, GONE, 20.0, gone)
            await crawl.start(
                redis,
                [WAITING, GONE],
                workers=1,
                ROBOTS_RETRY_S=1,
                ROBOTS_UNAVAILABLE_MAX_S=6,
                **LOOPBACKS,
            )
            await wait_for(
                lambda: outputs.resolved >= {f"{WAITING}-{i}" for i in range(10)},
                60,
                what="the waiting URLs crawled once robots.txt answers",
            )
            robots_times = [t for t, p in origin.request_log if p == "/robots.txt"]
            image_times = [t for t, p in origin.request_log if p.startswith(f"/{WAITING}/")]
            assert len(robots_times) == 3
            assert min(image_times) > robots_times[-1]
            assert (
                outputs.count(c.CRAWL_ERRORS_TOPIC)
                .keys()
                .isdisjoint({f"{WAITING}-{i}" for i in range(10)})
            )

            gone_ids = {f"{GONE}-{i}" for i in range(10)}
            await wait_for(
                lambda: errors_with(outputs, c.Status.ROBOTS_UNAVAILABLE) >= gone_ids,
                60,
                what="the unreachable host's URLs to give up",
            )
            first_ask = min(t for t, p in second_host.request_log if p == "/robots.txt")
            assert time.monotonic() - first_ask >= 6
            assert [p for _, p in second_host.request_log if p != "/robots.txt"] == []
            # Asked again with backoff (1, 2, 4 s ...), not hammered.
            assert 2 <= second_host.requests("/robots.txt") <= 5
    finally:
        crawl.stop()


DELAYED = "delayed"
WIDTHS_S = (0.5, 1.0, 2.0, 5.0)


@pytest.mark.timing(
    "asserts requests per window at the origin and the span of 16 crawl-delayed requests"
)
@pytest.mark.timeout(300)
async def test_a_crawl_delay_paces_its_host_from_its_first_request(
    kafka, redis, redis_url, origin, tmp_path
):
    body = tiny_jpeg()
    origin.set_robots("User-agent: *\nCrawl-delay: 0.5\n")
    urls = [origin.add(f"/{DELAYED}/{i}.jpg", body, "image/jpeg") for i in range(16)]
    crawl = Crawl(kafka, redis_url, tmp_path)
    try:
        async with Outputs(kafka.bootstrap) as outputs:
            await crawl.queue(redis, DELAYED, 50.0, urls)
            await crawl.start(redis, [DELAYED], workers=2, **LOOPBACKS)
            ids = {f"{DELAYED}-{i}" for i in range(16)}
            await wait_for(lambda: outputs.resolved >= ids, 60, what="every URL")
            # Every request to the host, its robots.txt included: one per 0.5 s at most.
            times = sorted(t for t, _ in origin.request_log)
            assert over_bound(times, 2.0, WIDTHS_S) == {}
            assert times[-1] - times[0] >= 16 * 0.5 - 0.1
            # The delay is the host's own: its source's rate is not lowered for it.
            pacing = c.PacingInfo.from_json(await redis.hget(c.RATES_HASH, DELAYED))
            assert pacing.rate_rps == pytest.approx(50.0), pacing
            host = await redis.hget(c.pace_host_key(DELAYED, "127.0.0.1"), "delay")
            assert float(host) == 0.5
    finally:
        crawl.stop()


OPTED = "opted"


@pytest.mark.timeout(300)
async def test_what_servers_say_of_their_images_use_is_obeyed_and_published(
    kafka, redis, redis_url, origin, second_host, tmp_path
):
    """X-Robots-Tag, TDMRep (header and file) and Content Signals, through a real monitor
    and worker: a NoIndex image is neither stored nor published, its directives go to
    crawl_errors; opt-outs travel in the resolution message; a host whose robots.txt says
    search=no is not asked for its images at all."""
    body = tiny_jpeg()
    origin.set_robots("User-agent: *\nContent-Signal: search=yes, ai-train=no\nAllow: /\n")
    origin.add(
        "/.well-known/tdmrep.json",
        b'[{"location": "/opted/reserved/", "tdm-reservation": 1,'
        b' "tdm-policy": "https://rights.test/policy.json"}]',
        "application/json",
    )
    second_host.set_robots("User-agent: image-crawler\nContent-Signal: search=no\n")
    answers: list[tuple[str, dict[str, str]]] = [
        ("/opted/plain.jpg", {}),  # 0
        ("/opted/reserved/a.jpg", {}),  # 1
        ("/opted/noindex.jpg", {"X-Robots-Tag": "noimageindex, nofollow"}),  # 2
        ("/opted/ours.jpg", {"X-Robots-Tag": "otherbot: noindex, image-crawler: noai"}),  # 3
        ("/opted/tdm.jpg", {"tdm-reservation": "1"}),  # 4
        ("/opted/past.jpg", {"X-Robots-Tag": "unavailable_after: 1 Jan 2020 00:00:00 GMT"}),  # 5
    ]
    urls = [origin.add(p, body, "image/jpeg", headers=h) for p, h in answers]
    urls += [second_host.add(f"/opted/s{i}.jpg", body, "image/jpeg") for i in range(3)]  # 6-8
    uuids = {f"{OPTED}-{i}" for i in range(len(urls))}
    no_index = {f"{OPTED}-{i}" for i in (2, 5, 6, 7, 8)}
    crawl = Crawl(kafka, redis_url, tmp_path)
    try:
        async with Outputs(kafka.bootstrap) as outputs:
            await crawl.queue(redis, OPTED, 20.0, urls)
            await crawl.start(redis, [OPTED], workers=1, **LOOPBACKS)
            await wait_for(lambda: outputs.uuids() >= uuids, 60, what="every URL to end")
            await outputs.sync()
            assert outputs.resolved == uuids - no_index
            assert errors_with(outputs, c.Status.NO_INDEX) == no_index
            resolutions = {
                o.uuid: o.message for o in outputs.records if o.topic == c.METADATA_TOPIC
            }
            # Each opt-out as said; a message of a server that says nothing is as before.
            assert {u: m.get("opt_outs") for u, m in resolutions.items()} == {
                f"{OPTED}-0": ["ai-train"],
                f"{OPTED}-1": ["ai-train", "tdm-reservation"],
                f"{OPTED}-3": ["ai-train", "noai"],
                f"{OPTED}-4": ["ai-train", "tdm-reservation"],
            }
            assert resolutions[f"{OPTED}-1"]["tdm_policy"] == "https://rights.test/policy.json"
            assert "tdm_policy" not in resolutions[f"{OPTED}-4"]
            directives = {
                o.uuid: o.message["directives"]
                for o in outputs.records
                if o.topic == c.CRAWL_ERRORS_TOPIC
            }
            assert directives[f"{OPTED}-2"] == ["noimageindex"]
            assert directives[f"{OPTED}-5"] == ["unavailable_after: 1 Jan 2020 00:00:00 GMT"]
            assert directives[f"{OPTED}-6"] == ["content-signal: search=no"]
            # Nothing stored of what is not to be indexed; search=no URLs never requested.
            stored = {p.stem for p in (tmp_path / "thumbnails").glob("*.jpg")}
            assert stored == uuids - no_index
            assert [p for p, _ in _requested(second_host) if p.startswith("/opted/")] == []
            assert await redis.get(c.resize_errors_key(OPTED, c.Status.NO_INDEX)) == "5"
            assert origin.requests("/.well-known/tdmrep.json") == 1
            assert second_host.requests("/.well-known/tdmrep.json") == 1
    finally:
        crawl.stop()
