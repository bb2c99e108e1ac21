"""What the check crawls: three sources of images served by a local origin on 127.0.0.1.

Each source gets every bundled sample image (``crawlctl/samples``, the demo's) under
paths of its own, repeated up to ``per_source`` URLs, of which a few are the broken sample
(an image that cannot be decoded: ``crawl_errors``) and a few answer 404 (``link_rot``).
The origin also serves the sources list in the shape of Openverse's stats endpoint, which
the monitor reads as ``SOURCES_URL``; each source's image count gives it ``RATE_RPS``
(crawling takes about ``per_source / RATE_RPS`` seconds, long enough to stop the workers
in the middle of it).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from crawlctl.commands.demo import image_count_for_rate
from crawlctl.commands.demo_plan import BROKEN_SAMPLE, Sample, load_samples
from image_crawler.contract import Status
from test.harness.origin import Origin

SOURCES: Final = ("alpha", "beta", "gamma")
RATE_RPS: Final = 2.0
# Of every source's URLs: this many broken images and this many missing ones.
BROKEN_PER_SOURCE: Final = 5
MISSING_PER_SOURCE: Final = 5
# How each kind of URL ends: a resolution message, link_rot (404) or crawl_errors.
OK: Final = "ok"
BROKEN_STATUS: Final = "UnidentifiedImageError"


@dataclasses.dataclass(frozen=True, slots=True)
class Item:
    uuid: str
    source: str
    path: str
    sample: Sample | None  # None: the origin answers 404
    expected: str  # OK, "404" or BROKEN_STATUS


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    items: tuple[Item, ...]

    def by_expected(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for item in self.items:
            counts[item.expected] = counts.get(item.expected, 0) + 1
        return counts

    def write(self, folder: Path, origin: Origin) -> None:
        """``urls.jsonl`` (what is fed to inbound_images) and ``plan.json`` (what the
        outcome reader waits for), readable by the containers' unprivileged user."""
        lines = [
            json.dumps({"url": origin.url(i.path), "uuid": i.uuid, "source": i.source})
            for i in self.items
        ]
        (folder / "urls.jsonl").write_text("\n".join(lines) + "\n")
        expected = [
            {"uuid": i.uuid, "source": i.source, "expected": i.expected} for i in self.items
        ]
        (folder / "plan.json").write_text(json.dumps(expected))
        for name in ("urls.jsonl", "plan.json"):
            (folder / name).chmod(0o644)


def make_plan(per_source: int) -> Plan:
    samples = load_samples()
    good = [s for s in samples if s.name != BROKEN_SAMPLE]
    (broken,) = [s for s in samples if s.name == BROKEN_SAMPLE]
    items = []
    for source in SOURCES:
        for n in range(per_source):
            if n < BROKEN_PER_SOURCE:
                sample, expected, name = broken, BROKEN_STATUS, f"broken-{n}.jpg"
            elif n < BROKEN_PER_SOURCE + MISSING_PER_SOURCE:
                sample, expected, name = None, str(Status.NOT_FOUND), f"missing-{n}.jpg"
            else:
                sample = good[n % len(good)]
                expected, name = OK, f"{n}-{sample.name}"
            items.append(Item(str(uuid.uuid4()), source, f"/{source}/{name}", sample, expected))
    return Plan(tuple(items))


def sources_list() -> list[dict[str, object]]:
    """The stats endpoint's answer: each source with the image count that gives RATE_RPS."""
    count = image_count_for_rate(RATE_RPS)
    return [{"source_name": source, "media_count": count} for source in SOURCES]


def serve(plan: Plan, origin: Origin) -> str:
    """Put the plan's images and the sources list on ``origin``; the sources list's URL."""
    for item in plan.items:
        if item.sample is not None:
            origin.add(item.path, item.sample.body, item.sample.content_type)
    origin.add("/stats/", json.dumps(sources_list()).encode(), "application/json")
    # Any robots.txt that allows everything; without one (404) the same, by RFC 9309.
    origin.add("/robots.txt", b"User-agent: *\nAllow: /\n", "text/plain")
    return origin.url("/stats/")


def expected_ends(plan: Plan) -> Mapping[str, str]:
    return {item.uuid: item.expected for item in plan.items}
