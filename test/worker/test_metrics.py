"""The worker's metrics and health: what each part counts, with fakes (the crawl that
checks them end to end is test/e2e/test_metrics_crawl.py)."""

from __future__ import annotations

import asyncio
import io
import itertools
import json
from collections import Counter
from typing import Any

import aiohttp
import pytest
from PIL import Image
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client import Counter as PromCounter
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from image_crawler import contract as c
from image_crawler.config import ConfigError
from image_crawler.metrics import serving
from test.harness.fakes import FakeFetcher, FakePacer, FakeSink, FakeStats, FakeStore
from test.harness.services import wait_for
from worker.download.fetch import FetchResult
from worker.health import OUTAGE_MAX_S, WorkerHealth, health_problems
from worker.images.pool import ImageOutcome, InlineProcessor, PoolProcessor
from worker.pipeline import Pipeline, RetryPolicy
from worker.politeness.signals import NO_SIGNALS, Signals
from worker.settings import WorkerSettings
from worker.sinks.base import DependencyStates, Outage, Stalls

TOPIC = "urls.example"
URL = "http://origin.test/a.jpg"
_names = itertools.count()


def unique(name: str) -> str:
    """A label value no other test uses: the metrics are the process's, shared by all."""
    return f"{name}-{next(_names)}"


def sample(name: str, **labels: str) -> float:
    """A sample of the default registry, 0 when it does not exist (yet)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


def task(uuid: str = "u-1", url: str = URL) -> bytes:
    return c.SourceTask(url=url, uuid=uuid).to_json()


def jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (40, 30), (10, 200, 30)).save(out, "JPEG")
    return out.getvalue()


def make(results: dict[str, Any], **parts: Any) -> tuple[Pipeline, FakeStats]:
    stats = FakeStats()
    pipeline = Pipeline(
        pacer=parts.pop("pacer", FakePacer()),
        fetcher=FakeFetcher(results),
        processor=InlineProcessor(),
        store=parts.pop("store", FakeStore()),
        sink=FakeSink(),
        stats=stats,
        retries=RetryPolicy(backoff_base_s=0.001, backoff_cap_s=0.002),
        max_backoff_s=0.01,
        **parts,
    )
    return pipeline, stats


def outcomes_of(source: str) -> Counter[str]:
    """crawler_outcomes_total of ``source``, by status."""
    counts: Counter[str] = Counter()
    for metric in REGISTRY.collect():
        for s in metric.samples:
            if s.name == "crawler_outcomes_total" and s.labels["source"] == source:
                counts[s.labels["status"]] += int(s.value)
    return counts


# --- the pipeline: requests, outcomes, bytes ----------------------------------------------


async def test_an_image_counts_one_request_one_outcome_and_its_bytes() -> None:
    source, body = unique("image"), jpeg()
    pipeline, stats = make({URL: FetchResult("200", body=body)})
    await pipeline.handle(source, task(), TOPIC)
    assert sample("crawler_requests_total", source=source) == 1
    assert outcomes_of(source) == {"200": 1}
    assert sample("crawler_downloaded_bytes_total", source=source) == len(body)
    assert stats.outcomes == [(source, "200")]


async def test_a_body_in_pieces_counts_every_piece() -> None:
    source, body = unique("pieces"), jpeg()
    pieces = [body[:100], body[100:]]
    pipeline, _ = make({URL: FetchResult("200", body=pieces)})
    await pipeline.handle(source, task(), TOPIC)
    assert sample("crawler_downloaded_bytes_total", source=source) == len(body)


async def test_every_try_is_a_request_and_an_outcome_with_the_status_the_stats_get() -> None:
    source, body = unique("retried"), jpeg()
    results = {
        URL: [FetchResult("503"), FetchResult("ServerDisconnected"), FetchResult("200", body=body)],
        "http://origin.test/gone.jpg": FetchResult("404"),
        "http://origin.test/broken.jpg": FetchResult("200", body=b"not an image"),
    }
    pipeline, stats = make(results)
    await pipeline.handle(source, task("a"), TOPIC)
    await pipeline.handle(source, task("b", "http://origin.test/gone.jpg"), TOPIC)
    await pipeline.handle(source, task("c", "http://origin.test/broken.jpg"), TOPIC)
    assert sample("crawler_requests_total", source=source) == 5
    assert outcomes_of(source) == Counter(status for _, status in stats.outcomes)
    assert outcomes_of(source) == {
        "503": 1,
        "ServerDisconnected": 1,
        "200": 1,
        "404": 1,
        "UnidentifiedImageError": 1,
    }
    # Both bodies were downloaded, the one that is no image too.
    assert sample("crawler_downloaded_bytes_total", source=source) == len(body) + 12


async def test_a_url_still_waiting_for_its_slot_is_no_request() -> None:
    source = unique("waiting")
    pacer = FakePacer(granted=set())  # no slot, ever
    pipeline, _ = make({}, pacer=pacer)
    handling = asyncio.create_task(pipeline.handle(source, task(), TOPIC))
    await wait_for(lambda: pacer.waiting, 5, what="the URL waiting for its slot")
    assert sample("crawler_requests_total", source=source) == 0
    handling.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handling


class RefusingRobots:
    async def consult(self, source: str, url: str) -> tuple[str | None, Signals]:
        return c.Status.ROBOTS_DISALLOWED, NO_SIGNALS


async def test_a_url_robots_txt_refuses_is_an_outcome_without_a_request() -> None:
    source = unique("refused")
    pipeline, stats = make({}, robots=RefusingRobots())
    await pipeline.handle(source, task(), TOPIC)
    assert stats.outcomes == [(source, "RobotsDisallowed")]
    assert outcomes_of(source) == {"RobotsDisallowed": 1}
    assert sample("crawler_requests_total", source=source) == 0


# --- dependencies: outages and their metrics ----------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_overlapping_outages_of_one_dependency_are_one_outage() -> None:
    dep, clock = unique("dep"), Clock()
    states = DependencyStates(clock)
    states.known(dep)
    assert sample("crawler_dependency_up", dependency=dep) == 1
    assert REGISTRY.get_sample_value("crawler_dependency_outages_total", {"dependency": dep}) == 0
    # The pacer's and the statistics' outages of the same Redis.
    pacer = Outage("down", "up", clock=clock, dependency=dep, states=states)
    stats = Outage("down", "up", clock=clock, dependency=dep, states=states)
    with capture_logs():
        pacer.report(error="refused")
        clock.now += 10
        stats.report(error="refused")
        stats.report(error="still refused")
        assert sample("crawler_dependency_up", dependency=dep) == 0
        assert sample("crawler_dependency_outages_total", dependency=dep) == 1
        clock.now += 5
        assert states.away_s() == {dep: 15}
        pacer.end()
        assert sample("crawler_dependency_up", dependency=dep) == 0  # stats still failing
        stats.end()
    assert sample("crawler_dependency_up", dependency=dep) == 1
    assert states.away_s() == {}
    with capture_logs():
        pacer.report(error="again")
    assert sample("crawler_dependency_outages_total", dependency=dep) == 2
    assert states.away_s() == {dep: 0}


def test_an_outage_that_began_earlier_is_away_since_then() -> None:
    dep, clock = unique("dep"), Clock()
    states = DependencyStates(clock)
    # Stalls begins an outage when a call has been stuck for after_s: since then.
    outage = Outage("down", "up", clock=lambda: 50.0, dependency=dep, states=states)
    outage.begin(since=45.0)
    assert states.away_s() == {dep: 5.0}


def test_an_outage_without_a_dependency_counts_nowhere() -> None:
    states = DependencyStates()
    with capture_logs():
        outage = Outage("down", "up", states=states)
        outage.report()
    assert states.away_s() == {}


async def test_a_stalled_call_is_an_outage_of_its_service() -> None:
    dep = unique("stalled")
    stalls = Stalls(dep, after_s=0.02)
    back = asyncio.Event()

    async def stuck() -> None:
        await back.wait()

    with capture_logs():
        call = asyncio.create_task(stalls.watch("publish", stuck()))
        await wait_for(lambda: stalls.stuck == 1, 5, what="a stuck call")
        assert sample("crawler_dependency_up", dependency=dep) == 0
        assert sample("crawler_dependency_outages_total", dependency=dep) == 1
        back.set()
        await call
    assert sample("crawler_dependency_up", dependency=dep) == 1


async def test_a_store_that_fails_is_one_outage_ended_by_the_retry_that_succeeds() -> None:
    before = sample("crawler_dependency_outages_total", dependency="s3")
    pipeline, _ = make({URL: FetchResult("200", body=jpeg())}, store=FakeStore(failures=3))
    with capture_logs() as logs:
        await pipeline.handle(unique("store"), task(), TOPIC)
    outage = [(e["event"], e["service"]) for e in logs if e["event"].startswith("dependency_")]
    assert outage == [("dependency_unavailable", "s3")] * 3 + [("dependency_recovered", "s3")]
    assert sample("crawler_dependency_outages_total", dependency="s3") == before + 1
    assert sample("crawler_dependency_up", dependency="s3") == 1


# --- the image pool's queue ---------------------------------------------------------------


async def test_the_pool_queue_counts_images_waiting_or_in_the_pool() -> None:
    pool = PoolProcessor(1)
    release = asyncio.Event()

    async def slow(body: Any, encoding: Any = None) -> ImageOutcome:
        await release.wait()
        if body == b"bad":
            raise RuntimeError("a bug")
        return await InlineProcessor().process(body)

    pool._process = slow  # type: ignore[method-assign]
    try:
        calls = [asyncio.create_task(pool.process(b)) for b in (b"x", b"y", b"bad", b"z")]
        await wait_for(lambda: pool.queued == 4, 5, what="4 queued")
        calls[1].cancel()
        await wait_for(lambda: pool.queued == 3, 5, what="3 queued")
        release.set()
        await asyncio.gather(*calls, return_exceptions=True)
        assert pool.queued == 0
    finally:
        pool.close()


# --- health ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "away_s", "problems"),
    [
        ("running", {}, []),
        ("running", {"redis": OUTAGE_MAX_S}, []),  # not longer than the limit
        ("running", {"redis": 61.2}, ["redis unavailable for 61 s (more than 60 s)"]),
        (
            "running",
            {"s3": 500.0, "kafka": 90.0, "redis": 3.0},
            [
                "kafka unavailable for 90 s (more than 60 s)",
                "s3 unavailable for 500 s (more than 60 s)",
            ],
        ),
        (
            "starting",
            {},
            ["starting: the Kafka clients are not started (is the broker reachable?)"],
        ),
        ("stopping", {}, ["stopping: draining in-flight work"]),
    ],
)
def test_health_problems(phase: Any, away_s: dict[str, float], problems: list[str]) -> None:
    assert health_problems(phase, away_s) == problems


def test_a_worker_is_healthy_from_its_start_to_its_stop_while_its_dependencies_answer() -> None:
    stop, clock = asyncio.Event(), Clock()
    states = DependencyStates(clock)
    health = WorkerHealth(stop, states=states, outage_max_s=30)
    assert health.phase == "starting" and health.problems()
    health.running()
    assert health.problems() == []
    states.began("redis")
    clock.now += 31
    assert health.problems() == ["redis unavailable for 31 s (more than 30 s)"]
    states.ended("redis")
    assert health.problems() == []
    stop.set()
    assert health.phase == "stopping" and health.problems()


# --- the HTTP side and the setting ------------------------------------------------------------


async def test_metrics_and_healthz_are_served_on_a_free_port() -> None:
    registry = CollectorRegistry()
    PromCounter("crawler_test_things", "Things.", ["source"], registry=registry).labels("a").inc(3)
    problems: list[str] = []
    async with (
        serving(0, "127.0.0.1", registry, health=lambda: problems) as port,
        aiohttp.ClientSession() as http,
    ):
        assert port
        base = f"http://127.0.0.1:{port}"
        async with http.get(f"{base}/metrics") as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            families = {f.name: f for f in text_string_to_metric_families(await response.text())}
        (s,) = families["crawler_test_things"].samples
        assert (s.name, s.labels, s.value) == ("crawler_test_things_total", {"source": "a"}, 3)
        async with http.get(f"{base}/healthz") as response:
            assert response.status == 200
            assert json.loads(await response.text()) == {"ok": True, "problems": []}
        problems.append("redis unavailable for 61 s (more than 60 s)")
        async with http.get(f"{base}/healthz") as response:
            assert response.status == 503
            assert json.loads(await response.text()) == {"ok": False, "problems": problems}


async def test_no_port_serves_nothing() -> None:
    async with serving(None, "127.0.0.1") as port:
        assert port is None


def test_the_worker_reads_metrics_port_and_host() -> None:
    assert WorkerSettings.from_env({}).metrics.port is None
    settings = WorkerSettings.from_env({"METRICS_PORT": "9100", "METRICS_HOST": "127.0.0.1"})
    assert (settings.metrics.port, settings.metrics.host) == (9100, "127.0.0.1")
    with pytest.raises(ConfigError, match="METRICS_PORT"):
        WorkerSettings.from_env({"METRICS_PORT": "70000"})


async def test_an_image_not_to_be_indexed_is_a_request_and_a_no_index_outcome() -> None:
    source = unique("noindex")
    said = Signals(noindex=("noindex",))
    pipeline, _ = make({URL: FetchResult(c.Status.NO_INDEX, signals=said)})
    await pipeline.handle(source, task(), TOPIC)
    assert outcomes_of(source) == {"NoIndex": 1}
    assert sample("crawler_requests_total", source=source) == 1
    assert sample("crawler_downloaded_bytes_total", source=source) == 0  # its body unread
