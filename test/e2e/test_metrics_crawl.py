"""Every ``/metrics`` and ``/healthz`` of a real crawl, checked against what the crawl did.

A monitor and two workers (broker, redis-server, S3 server, a local HTTP origin), each with
``METRICS_PORT=0`` (a free loopback port, read from its ``metrics_serving`` event), crawl
two sources whose every URL's outcome is known: good images, a 404, a URL that fails
once with a 500, one that always does, a body that is no image, and on one source a few
downloads the origin holds until the test lets them go. Scraped while those are held,
then once everything has ended; the workers' counters are summed over the workers, as
Prometheus would. And a worker that cannot reach its broker serves a 503 ``/healthz``.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from test.harness.corpus import broken_images, good_images
from test.harness.crawl import Crawl, Gate, Outputs, sources_file
from test.harness.origin import Reply
from test.harness.processes import CrawlerProcess
from test.harness.services import free_port, wait_for

RATE_RPS = 200.0
GOOD = 20  # good images per source
HELD = 4  # beta's downloads held at the origin
MAX_ATTEMPTS = 2
SOURCES = ("alpha", "beta")
METRICS_ENV = {"METRICS_PORT": "0", "METRICS_HOST": "127.0.0.1"}


class Scrape:
    """One endpoint's ``/metrics``, as samples by name and labels."""

    def __init__(self, text: str) -> None:
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                self.samples[s.name, frozenset(s.labels.items())] = s.value

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def by(self, name: str, label: str, **where: str) -> dict[str, float]:
        """``name``'s samples among those with ``where``, summed by the value of ``label``."""
        found: dict[str, float] = {}
        for (sample, labels), value in self.samples.items():
            named = dict(labels)
            if sample == name and label in named and where.items() <= named.items():
                found[named[label]] = found.get(named[label], 0) + value
        return found


class Endpoint:
    """A process's metrics server, found from its ``metrics_serving`` event."""

    def __init__(self, base: str, http: aiohttp.ClientSession) -> None:
        self.base = base
        self._http = http

    @classmethod
    async def of(cls, process: CrawlerProcess, http: aiohttp.ClientSession) -> Endpoint:
        def serving() -> dict[str, Any] | None:
            assert process.process.poll() is None, process.tail()
            events = process.events("metrics_serving")
            return events[-1] if events else None

        event = await wait_for(serving, 30, what=f"{process.module} serving its metrics")
        return cls(f"http://127.0.0.1:{event['port']}", http)

    async def metrics(self) -> Scrape:
        async with self._http.get(f"{self.base}/metrics") as response:
            assert response.status == 200, await response.text()
            assert response.headers["Content-Type"].startswith("text/plain")
            return Scrape(await response.text())

    async def health(self) -> tuple[int, dict[str, Any]]:
        async with self._http.get(f"{self.base}/healthz") as response:
            return response.status, json.loads(await response.text())


def total(scrapes: Sequence[Scrape], name: str, label: str, **where: str) -> Counter[str]:
    """A counter summed over the workers, by ``label``."""
    summed: Counter[str] = Counter()
    for scrape in scrapes:
        for value, count in scrape.by(name, label, **where).items():
            summed[value] += int(count)
    return summed


class Corpus:
    """Each source's URLs, served by the origin, and what the crawl of them must count.

    ``first`` are queued at the start: good images, and beta's held downloads; ``later``,
    the failures, once those have ended. The breakers count errors among the last minute's
    statuses: after 24 successes, beta's two 500s are 8% of them, under the 10% that
    halts a source; early in the crawl they could be most of them.
    """

    def __init__(self, origin: Any) -> None:
        jpegs = [i for i in good_images() if i.content_type == "image/jpeg"]
        corrupt = next(i for i in broken_images() if i.expected_status == "UnidentifiedImageError")
        self.gate = Gate(jpegs[0].body)
        self.first: dict[str, list[str]] = {}
        self.later: dict[str, list[str]] = {}
        self.outcomes: dict[str, Counter[str]] = {}
        self.body_bytes: dict[str, int] = {}
        for n, source in enumerate(SOURCES):
            images = [jpegs[(n * GOOD + i) % len(jpegs)] for i in range(GOOD)]
            first = [f"/{source}/{i}.jpg" for i in range(GOOD)]
            for path, image in zip(first, images, strict=True):
                origin.add(path, image.body, image.content_type)
            outcomes = Counter({"200": GOOD})
            served = sum(len(i.body) for i in images)
            if source == "alpha":
                flaky = Reply(images[0].body, "image/jpeg")
                origin.add_sequence(f"/{source}/flaky.jpg", [500, flaky])
                origin.add(f"/{source}/corrupt.jpg", corrupt.body, corrupt.content_type)
                later = [f"/{source}/gone.jpg", f"/{source}/corrupt.jpg", f"/{source}/flaky.jpg"]
                outcomes.update({"404": 1, "UnidentifiedImageError": 1, "500": 1, "200": 1})
                served += len(corrupt.body) + len(flaky.body)
            else:
                origin.add_handler(f"/{source}/held.jpg", self.gate)
                origin.add_status(f"/{source}/down.jpg", 500)
                first += [f"/{source}/held.jpg"] * HELD
                later = [f"/{source}/down.jpg"]
                outcomes.update({"200": HELD, "500": MAX_ATTEMPTS})
                served += HELD * len(self.gate.body)
            self.first[source], self.later[source] = first, later
            self.outcomes[source] = outcomes
            self.body_bytes[source] = served

    def ended(self, source: str) -> int:
        return sum(self.outcomes[source].values())

    def successes(self) -> dict[str, int]:
        return {source: self.outcomes[source]["200"] for source in SOURCES}

    def uuids(self, which: Mapping[str, list[str]], first_index: int = 0) -> set[str]:
        return {f"{s}-{first_index + i}" for s, paths in which.items() for i in range(len(paths))}

    def requests_served(self, origin: Any, source: str) -> int:
        """Requests the origin answered for ``source``'s URLs (robots.txt not among them)."""
        paths = set(self.first[source]) | set(self.later[source])
        return sum(origin.requests(p) for p in paths)


async def test_every_endpoint_reports_what_the_crawl_did(
    kafka, redis, redis_url, s3_server, s3_bucket, origin, tmp_path: Path
) -> None:
    corpus = Corpus(origin)
    crawl = Crawl(kafka, redis_url, tmp_path)
    try:
        async with Outputs(kafka.bootstrap) as outputs, aiohttp.ClientSession() as http:
            for source in SOURCES:
                urls = [origin.url(p) for p in corpus.first[source]]
                await crawl.queue(redis, source, RATE_RPS, urls[:GOOD])
                # One record a batch: tansu's end offset is that of a partition's last
                # batch (crawl_monitor/backlog.py), so the held ones must each be their own
                # for the backlog to count them all.
                for index in range(GOOD, len(urls)):
                    await crawl.queue_more(source, [urls[index]], index)
            # The monitor as Crawl.start runs it, with its metrics served.
            crawl.monitor = CrawlerProcess(
                "crawl_monitor",
                {
                    **kafka.env,
                    "REDIS_URL": redis_url,
                    "SOURCES_FILE": sources_file(tmp_path, **dict.fromkeys(SOURCES, 10**6)),
                    "LOG_FREQUENCY_S": "1",
                    **METRICS_ENV,
                },
                tmp_path / "monitor.log",
            )
            monitor = await Endpoint.of(crawl.monitor, http)
            await crawl.add_workers(
                SOURCES,
                2,
                THUMBNAIL_STORE="s3",
                S3_BUCKET=s3_bucket,
                MAX_ATTEMPTS=MAX_ATTEMPTS,
                **s3_server.env,
                **METRICS_ENV,
            )
            workers = [await Endpoint.of(w, http) for w in crawl.workers]

            # --- during the crawl: beta's held downloads are in flight ----------------------
            good = corpus.uuids(corpus.first) - {f"beta-{GOOD + i}" for i in range(HELD)}
            await wait_for(lambda: outputs.uuids() >= good, 120, what="the good images")
            await wait_for(lambda: corpus.gate.waiting == HELD, 30, what="the held downloads")
            for endpoint in [monitor, *workers]:
                assert await endpoint.health() == (200, {"ok": True, "problems": []})
            # A task ends a moment after its output, once its outcome is stored.
            during = await wait_for(
                lambda: _in_flight(workers, HELD), 10, what="only the held tasks in flight"
            )
            assert total(during, "crawler_requests_total", "source") == {
                "alpha": GOOD,
                "beta": GOOD + HELD,
            }
            for scrape in during:
                assert scrape.value("crawler_task_slots") == 300
                assert scrape.value("crawler_image_pool_queue") is not None
                assert scrape.by("crawler_dependency_up", "dependency") == {
                    "kafka": 1,
                    "redis": 1,
                    "s3": 1,
                }
            # The held URLs are not committed: the backlog counts them.
            await wait_for(
                lambda: _backlog_at_least(monitor, "beta", HELD), 30, what="beta's backlog"
            )

            # --- the failures, then every URL ended ------------------------------------------
            corpus.gate.opened.set()
            await wait_for(
                lambda: outputs.uuids() >= corpus.uuids(corpus.first), 60, what="the held ones"
            )
            for source in SOURCES:
                urls = [origin.url(p) for p in corpus.later[source]]
                await crawl.queue_more(source, urls, len(corpus.first[source]))
            everything = corpus.uuids(corpus.first) | {
                f"{s}-{len(corpus.first[s]) + i}"
                for s in SOURCES
                for i in range(len(corpus.later[s]))
            }
            await wait_for(lambda: outputs.uuids() >= everything, 60, what="every URL")
            final = await wait_for(
                lambda: _workers_done(workers, corpus), 30, what="every outcome counted"
            )
            requests = total(final, "crawler_requests_total", "source")
            downloaded = total(final, "crawler_downloaded_bytes_total", "source")
            for source in SOURCES:
                # Every try was a request (robots.txt refused nothing), and reached the origin.
                assert requests[source] == corpus.ended(source), source
                assert requests[source] == corpus.requests_served(origin, source), source
                outcomes = total(final, "crawler_outcomes_total", "status", source=source)
                assert outcomes == corpus.outcomes[source], source
                assert downloaded[source] == corpus.body_bytes[source], source
            for scrape in final:
                assert scrape.value("crawler_tasks_in_flight") == 0
                assert scrape.value("crawler_image_pool_queue") == 0
                assert scrape.by("crawler_dependency_outages_total", "dependency") == {
                    "kafka": 0,
                    "redis": 0,
                    "s3": 0,
                }
            for endpoint in workers:
                assert await endpoint.health() == (200, {"ok": True, "problems": []})

            # --- the monitor -------------------------------------------------------------------
            settled = await wait_for(
                lambda: _monitor_settled(monitor, corpus), 60, what="the monitor's metrics"
            )
            successes = corpus.successes()
            for source in SOURCES:
                assert (
                    settled.value("crawler_source_successes_total", source=source)
                    == (successes[source])
                )
                errors = corpus.ended(source) - successes[source]
                assert settled.value("crawler_source_errors_total", source=source) == errors
                assert settled.value(
                    "crawler_source_configured_requests_per_second", source=source
                ) == pytest.approx(RATE_RPS)
                effective = settled.value(
                    "crawler_source_effective_requests_per_second", source=source
                )
                assert effective is not None and 0 <= effective <= RATE_RPS
                assert settled.value("crawler_source_eta_seconds", source=source) == 0
                assert settled.value("crawler_source_halted", source=source) == 0
                assert settled.value("crawler_source_permanently_halted", source=source) == 0
            ended = sum(corpus.ended(s) for s in SOURCES)
            assert settled.value("crawler_successes_total") == sum(successes.values())
            assert settled.value("crawler_errors_total") == ended - sum(successes.values())
            assert settled.value("crawler_backlog_urls") == 0
            assert settled.value("crawler_eta_seconds") == 0
            assert settled.value("crawler_sources") == len(SOURCES)
            assert (settled.value("crawler_backlog_measured_timestamp_seconds") or 0) > 0
            assert (settled.value("crawler_monitor_loop_seconds_count") or 0) > 0
            assert await monitor.health() == (200, {"ok": True, "problems": []})

        for process in crawl.workers:
            process.signal(signal.SIGTERM)
        for process in crawl.workers:
            assert process.wait(30) == 0, process.tail()
    finally:
        crawl.stop()


async def _backlog_at_least(monitor: Endpoint, source: str, count: int) -> bool:
    backlog = (await monitor.metrics()).value("crawler_source_backlog_urls", source=source)
    return backlog is not None and backlog >= count


async def _in_flight(workers: Sequence[Endpoint], count: int) -> list[Scrape] | None:
    """The workers' scrapes once they hold ``count`` tasks in all."""
    scrapes = [await w.metrics() for w in workers]
    held = sum(s.value("crawler_tasks_in_flight") or 0 for s in scrapes)
    return scrapes if held == count else None


async def _workers_done(workers: Sequence[Endpoint], corpus: Corpus) -> list[Scrape] | None:
    """The workers' scrapes once every outcome is counted and no task is left."""
    scrapes = [await w.metrics() for w in workers]
    counted = total(scrapes, "crawler_outcomes_total", "source")
    if any(counted[s] != corpus.ended(s) for s in SOURCES):
        return None
    if any(s.value("crawler_tasks_in_flight") != 0 for s in scrapes):
        return None
    return scrapes


async def _monitor_settled(monitor: Endpoint, corpus: Corpus) -> Scrape | None:
    """The monitor's scrape once it has every success and an empty backlog."""
    scrape = await monitor.metrics()
    successes: Mapping[str, float] = scrape.by("crawler_source_successes_total", "source")
    backlog = scrape.by("crawler_source_backlog_urls", "source")
    if successes != corpus.successes() or backlog != dict.fromkeys(SOURCES, 0):
        return None
    return scrape


async def test_a_worker_is_unhealthy_while_it_cannot_start(tmp_path: Path) -> None:
    # Nothing listens on the broker's port: the worker keeps trying to start its clients.
    env = {
        "KAFKA_HOSTS": f"127.0.0.1:{free_port()}",
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "THUMBNAIL_STORE": "local",
        "THUMBNAIL_DIR": str(tmp_path / "thumbnails"),
        **METRICS_ENV,
    }
    worker = CrawlerProcess("worker", env, tmp_path / "worker.log")
    try:
        async with aiohttp.ClientSession() as http:
            endpoint = await Endpoint.of(worker, http)
            await wait_for(lambda: worker.events("kafka_unavailable"), 30, what="a failed start")
            status, body = await endpoint.health()
            assert (status, body["ok"]) == (503, False)
            assert body["problems"] == [
                "starting: the Kafka clients are not started (is the broker reachable?)"
            ]
            scrape = await endpoint.metrics()  # served, before anything is counted
            assert scrape.value("crawler_tasks_in_flight") == 0
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.tail()
    finally:
        worker.stop()
