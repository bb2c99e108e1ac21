"""The demo's plan, samples and tally of outcomes (pure; the demo itself runs in
``test_cli.py``)."""

from __future__ import annotations

import io
import json
from importlib import resources

import pytest
from PIL import Image

from crawl_monitor.policy.rates import compute_crawl_rate
from crawlctl.commands.demo import (
    DEMO_SOURCES,
    MISSING_NAME,
    DemoTally,
    image_count_for_rate,
    plan_demo,
)
from crawlctl.commands.demo_plan import BROKEN_SAMPLE, load_samples
from image_crawler.contract import CRAWL_ERRORS_TOPIC, LINK_ROT_TOPIC, METADATA_TOPIC


@pytest.mark.parametrize("rate", [0.2, 0.5, 1.0, 2.0, 10.0, 50.0, 123.4, 200.0])
def test_image_count_for_rate_inverts_compute_crawl_rate(rate: float) -> None:
    count = image_count_for_rate(rate)
    assert compute_crawl_rate(count) >= rate
    assert compute_crawl_rate(count) == pytest.approx(rate, rel=1e-6)
    assert compute_crawl_rate(count - 1) < rate or count <= 5_000


@pytest.mark.parametrize("rate", [0.1, 200.5])
def test_image_count_for_rate_refuses_rates_no_count_gives(rate: float) -> None:
    with pytest.raises(ValueError, match="computed rate"):
        image_count_for_rate(rate)


def test_the_bundled_samples_are_small_real_images_with_a_licence_note() -> None:
    samples = load_samples()
    names = [s.name for s in samples]
    assert BROKEN_SAMPLE in names
    good = [s for s in samples if s.name != BROKEN_SAMPLE]
    assert 15 <= len(good) <= 30
    assert sum(len(s.body) for s in samples) < 1.5 * 1024 * 1024
    formats = set()
    with_exif = 0
    for sample in good:
        with Image.open(io.BytesIO(sample.body)) as im:
            im.load()
            formats.add(im.format)
            assert max(im.size) <= 800, sample.name
            assert sample.content_type == f"image/{im.format.lower()}", sample.name
            with_exif += bool(im.getexif())
    assert formats == {"JPEG", "PNG"}
    assert with_exif >= 3
    with pytest.raises(Image.UnidentifiedImageError):
        Image.open(io.BytesIO(next(s for s in samples if s.name == BROKEN_SAMPLE).body))
    readme = (resources.files("crawlctl") / "samples" / "README.md").read_text()
    for original in ("astronaut", "chelsea", "coffee", "rocket", "hubble", "retina"):
        assert original in readme
    assert "CC0" in readme and "public domain" in readme


def test_the_plan_gives_each_source_every_sample_and_the_last_the_failures() -> None:
    samples = load_samples()
    good = [s for s in samples if s.name != BROKEN_SAMPLE]
    plan = plan_demo(samples)
    grouped = plan.by_source()
    assert list(grouped) == [name for name, _ in DEMO_SOURCES]
    for name, items in grouped.items():
        served = sorted(item.sample.name for item in items if item.sample is not None)
        last = name == DEMO_SOURCES[-1][0]
        expected = sorted([s.name for s in good] + ([BROKEN_SAMPLE] if last else []))
        assert served == expected
        assert any(i.sample is None for i in items) == last
        assert all(item.path.startswith(f"/{name}/") for item in items)
    missing = [i for i in plan.items if i.sample is None]
    assert [i.path for i in missing] == [f"/{DEMO_SOURCES[-1][0]}/{MISSING_NAME}"]
    assert len({i.uuid for i in plan.items}) == len(plan.items)
    assert sum(i.expected_ok for i in plan.items) == len(good) * len(DEMO_SOURCES)


def test_the_sources_file_gives_rates_of_about_2_10_and_50() -> None:
    plan = plan_demo(load_samples())
    rates = {e["source_name"]: compute_crawl_rate(e["image_count"]) for e in plan.sources_file()}
    assert rates == pytest.approx({"demo-small": 2.0, "demo-medium": 10.0, "demo-large": 50.0})


def test_the_tally_ends_each_uuid_once_and_keeps_its_metadata() -> None:
    plan = plan_demo(load_samples()[:3])
    a, b, c = (item.uuid for item in plan.items[:3])
    tally = DemoTally(plan)

    def add(topic: str, message: dict | bytes) -> str | None:
        raw = message if isinstance(message, bytes) else json.dumps(message).encode()
        return tally.add(topic, raw)

    resolution = {"identifier": a, "width": 1, "height": 1, "filesize": 1}
    assert add(METADATA_TOPIC, {"identifier": a, "exif": {"0x13b": "x"}}) is None
    assert add(METADATA_TOPIC, resolution) == plan.items[0].source
    assert add(METADATA_TOPIC, resolution) is None  # a duplicate (at least once)
    assert add(LINK_ROT_TOPIC, {"identifier": b, "timestamp": "t"}) == plan.items[1].source
    assert add(CRAWL_ERRORS_TOPIC, {"identifier": c, "status": "500"}) == plan.items[2].source
    assert add(CRAWL_ERRORS_TOPIC, {"raw": "junk", "error": "e", "topic": "t"}) is None
    assert add(METADATA_TOPIC, {"identifier": "not-ours", "width": 1}) is None
    assert add(METADATA_TOPIC, b"not json") is None

    assert {u: o.status for u, o in tally.ended.items()} == {a: "ok", b: "404", c: "500"}
    assert [m["identifier"] for m in tally.metadata] == [a, a, a]
    assert tally.pending == {i.uuid for i in plan.items} - {a, b, c}
