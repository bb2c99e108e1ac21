"""A rolling deploy costs no image twice (issue 53).

One source over 20 hosts (each its own loopback address), two of them with
``Crawl-delay: 4`` in robots.txt, so that their URLs wait and hold every partition's
commit back while the other hosts' URLs finish past it. Three workers crawl it; each in
turn is stopped (SIGTERM) and started again, every rebalance waited out before the next
step (tansu's group wedges if a member leaves while it still rebalances). Every
rebalance rewinds every partition to its commit: before the finished offsets were kept
in Redis, the workers fetched again every image finished past a waiting URL. Now no
image is requested twice, and none is published twice.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from image_crawler import contract as c
from test.harness.crawl import PARTITIONS, Crawl, Outputs, tiny_jpeg
from test.harness.origin import Origin
from test.harness.processes import CrawlerProcess
from test.harness.services import wait_for

SOURCE = "rolling"
HOSTS, DELAYED = 20, 2
# The delayed hosts' URLs take DELAYED_URLS * CRAWL_DELAY_S (120 s): the deploy's three
# steps happen while they wait (each step checks that the crawl has not ended).
URLS_A_HOST, DELAYED_URLS = 20, 30
CRAWL_DELAY_S = 4.0
WORKERS = 3
# Environment of every worker: 20 slots; robots.txt on loopback.
ENV: dict[str, Any] = {"MAX_TASKS": 20, "ALLOWED_PRIVATE_NETWORKS": "127.0.0.0/8"}


def urls_of(origins: Sequence[Origin]) -> list[str]:
    """Row-major over the hosts (every host early in every partition), the delayed ones'
    URLs first so that they wait from the start."""
    body = tiny_jpeg()
    for origin in origins[:DELAYED]:
        origin.set_robots(f"User-agent: *\nCrawl-delay: {CRAWL_DELAY_S:g}\n")
    delayed = [
        o.add(f"/d/{i}.jpg", body, "image/jpeg")
        for i in range(DELAYED_URLS)
        for o in origins[:DELAYED]
    ]
    healthy = [
        o.add(f"/h/{i}.jpg", body, "image/jpeg")
        for i in range(URLS_A_HOST)
        for o in origins[DELAYED:]
    ]
    return delayed + healthy


def settled(workers: Sequence[CrawlerProcess]) -> bool:
    """Every live worker's last assignment, together, is every partition once."""
    held: list[str] = []
    for worker in workers:
        assert worker.process.poll() is None, f"a worker exited:\n{worker.tail()}"
        events = worker.events("partitions_assigned")
        if not events:
            return False
        held += events[-1]["topic_partitions"]
    return sorted(held) == sorted(f"{c.source_topic(SOURCE)}:{p}" for p in range(PARTITIONS))


async def wait_settled(crawl: Crawl, what: str) -> None:
    live = [w for w in crawl.workers if w.process.poll() is None]
    await wait_for(lambda: settled(live), 120, interval_s=0.2, what=what)


@pytest.mark.timeout(600)
async def test_a_rolling_deploy_requests_and_publishes_no_image_twice(
    kafka, redis, redis_url, tmp_path
):
    origins = [Origin(host=f"127.0.4.{i + 2}").start() for i in range(HOSTS)]
    crawl = Crawl(kafka, redis_url, tmp_path)
    try:
        urls = urls_of(origins)
        uuids = {f"{SOURCE}-{i}" for i in range(len(urls))}
        async with Outputs(kafka.bootstrap) as outputs:
            await crawl.queue(redis, SOURCE, 20.0, urls)
            await crawl.start(redis, [SOURCE], workers=1, **ENV)
            for _ in range(WORKERS - 1):
                crawl.workers.append(_worker_like(crawl, len(crawl.workers)))
            await wait_settled(crawl, "three workers sharing the partitions")
            for step in range(WORKERS):
                old = crawl.workers[step]
                old.signal(signal.SIGTERM)
                assert old.wait(60) == 0, old.tail()
                await wait_settled(crawl, f"the others taking worker {step}'s partitions")
                crawl.workers.append(_worker_like(crawl, len(crawl.workers)))
                await wait_settled(crawl, f"worker {step}'s successor assigned")
                ended = len(outputs.uuids() & uuids)
                assert ended < len(uuids), f"the crawl ended before step {step}: {ended}"
            await wait_for(lambda: outputs.uuids() >= uuids, 240, what="every URL ended")
        again = {
            o.url(path): o.requests(path)
            for o in origins
            for path in {p for _, p in o.request_log if p.endswith(".jpg")}
            if o.requests(path) > 1
        }
        published = Counter((o.uuid, tuple(sorted(o.message))) for o in outputs.records)
        twice = {k: n for k, n in published.items() if n > 1}
        loaded = [e["offsets"] for e in crawl.events("finished_loaded")]
        print(
            f"\nrolling deploy: {len(uuids)} URLs, {len(crawl.events('partitions_assigned'))} "
            f"assignments, finished offsets loaded {loaded}; {len(again)} images requested "
            f"again, {len(twice)} messages published twice"
        )
        assert loaded, "no finished offsets were handed over: the test did not test"
        assert again == {}
        assert twice == {}
        assert outputs.resolved >= uuids
    finally:
        crawl.stop()
        for origin in origins:
            origin.stop()


def _worker_like(crawl: Crawl, index: int) -> CrawlerProcess:
    """One more worker with the environment of the first."""
    first = crawl.workers[0]
    return CrawlerProcess("worker", first.env, crawl.tmp_path / f"worker{index}.log")
