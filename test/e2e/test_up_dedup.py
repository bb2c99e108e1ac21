"""``image-crawler up`` runs the deduplication stage and archives its topic: copies of an
image (its very bytes under other URLs, from another source too) end in
``DATA/outputs/image_duplicates.jsonl`` as ``exact`` duplicates of the first, each image
placed once, and the stage stops cleanly with the rest.

The originals are fed first and placed before their copies are fed: the stage places
what it reads in the order of the topic's partitions, not of the crawl, so "the first"
is made unambiguous that way.
"""

from __future__ import annotations

import asyncio
import io
import json
import random
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from crawlctl.commands.demo import image_count_for_rate
from image_crawler import contract as c
from test.e2e.test_up_restart import Up
from test.harness.origin import Origin
from test.harness.services import produce, wait_until

MUSEUM, MIRROR = "museum", "mirror"
# Fast enough that pacing never holds the few images up.
RATE_RPS = 50.0
TIMEOUT_S = 60.0


@pytest.fixture
def started() -> Iterator[list[Up]]:
    runs: list[Up] = []
    yield runs
    for run in runs:
        run.kill()


def photograph(seed: int) -> bytes:
    """A JPEG of noise: detail enough for a perceptual hash of about 32 bits set (a flat
    image's is degenerate and never clustered); another seed, another photograph."""
    rng = random.Random(seed)
    pixels = bytes(rng.randrange(256) for _ in range(96 * 64 * 3))
    out = io.BytesIO()
    Image.frombytes("RGB", (96, 64), pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def placements(outputs: Path) -> dict[str, list[dict]]:
    """identifier -> its messages in the archive of image_duplicates."""
    path = outputs / f"{c.DUPLICATES_TOPIC}.jsonl"
    found: dict[str, list[dict]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        message = json.loads(line)
        found.setdefault(message["identifier"], []).append(message)
    return found


async def feed(run: Up, origin: Origin, images: dict[str, tuple[str, bytes]]) -> None:
    """One inbound message per uuid: its image at /img/{uuid}.jpg, from its source."""
    broker = (await asyncio.to_thread(run.wait_for_line, r"^\s+broker\s+(\S+)", 60)).group(1)
    messages = []
    for uuid, (source, body) in sorted(images.items()):
        url = origin.add(f"/img/{uuid}.jpg", body, "image/jpeg")
        messages.append(json.dumps({"url": url, "uuid": uuid, "source": source}).encode())
    await produce(broker, c.INBOUND_TOPIC, messages)


async def placed(outputs: Path, uuids: set[str], what: str) -> None:
    await asyncio.to_thread(
        wait_until, lambda: uuids <= placements(outputs).keys(), TIMEOUT_S, what=what
    )


async def test_up_places_copies_as_exact_duplicates_of_the_first_and_archives_them(
    origin: Origin, tmp_path: Path, started: list[Up]
) -> None:
    count = image_count_for_rate(RATE_RPS)
    sources = tmp_path / "sources.json"
    sources.write_text(
        json.dumps([{"source_name": s, "image_count": count} for s in (MUSEUM, MIRROR)])
    )
    data = tmp_path / "data"
    outputs = data / "outputs"
    run = Up(
        "--workers", "1", "--sources-file", str(sources), "--data-dir", str(data), cwd=tmp_path
    )
    started.append(run)
    first, second = photograph(1), photograph(2)
    originals = {"a0": (MUSEUM, first), "b0": (MUSEUM, second)}
    copies = {"a1": (MUSEUM, first), "a2": (MIRROR, first), "b1": (MIRROR, second)}

    await feed(run, origin, originals)
    state = run.wait_for_line(r"^\s+dedup\s+(\S+)", 1).group(1)
    assert state == str(data / "dedup")
    await placed(outputs, set(originals), "the originals' placements archived")
    await feed(run, origin, copies)
    await placed(outputs, set(originals) | set(copies), "the copies' placements archived")
    assert await asyncio.to_thread(run.stop, signal.SIGINT) == 0, run.stderr
    assert "not every process stopped cleanly" not in run.stderr

    final = placements(outputs)
    assert final.keys() == originals.keys() | copies.keys()
    assert all(len(messages) == 1 for messages in final.values()), final
    for uuid in originals:
        assert final[uuid][0]["kind"] == "unique", final[uuid]
    for uuid, (source, _) in copies.items():
        (message,) = final[uuid]
        canonical = f"{uuid[0]}0"
        assert message == {
            "identifier": uuid,
            "source": source,
            "kind": "exact",
            "duplicate_of": canonical,
            "duplicate_of_source": MUSEUM,
            "distance": 0,
        }
    # The journal of the two canonicals, kept in the data folder for the next start.
    assert any(p.stat().st_size for p in (data / "dedup").iterdir())
    assert (data / "logs" / "dedup.log").is_file()
