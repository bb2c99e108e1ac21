"""``image-crawler download --dedup near``: the same photograph under several URLs (the
same bytes, and a copy re-encoded at half size) is in the dataset once; the other rows
say which row was kept."""

from __future__ import annotations

import asyncio
import collections
import io
import tarfile
from pathlib import Path

import pyarrow.parquet as pq
from PIL import Image

from test.e2e.test_download import Download, started  # noqa: F401 - the fixture
from test.harness.corpus import good_images
from test.harness.origin import Origin

PHOTOS = ("astronaut-q90.jpg", "chelsea-444-q90.jpg", "original-rocket.jpg")
# Each row: its path on the origin, and the photograph it shows (None: a 404).
ROWS: list[tuple[str, int | None]] = [
    ("/a/0.jpg", 0),
    ("/a/1.jpg", 1),
    ("/a/2.jpg", 2),
    ("/b/0.jpg", 0),  # the same bytes
    ("/b/1.jpg", 1),  # half size, JPEG quality 40
    ("/gone.jpg", None),
    ("/b/2.jpg", 2),  # the same bytes
]
PER_SHARD = 3


def _half_q40(body: bytes) -> bytes:
    with Image.open(io.BytesIO(body)) as im:
        half = im.convert("RGB").resize((im.width // 2, im.height // 2), Image.LANCZOS)
    out = io.BytesIO()
    half.save(out, "JPEG", quality=40)
    return out.getvalue()


def serve(origin: Origin) -> None:
    bodies = {i.name: i.body for i in good_images()}
    photos = [bodies[name] for name in PHOTOS]
    for path, photo in ROWS:
        if photo is not None:
            body = _half_q40(photos[photo]) if path == "/b/1.jpg" else photos[photo]
            origin.add(path, body, "image/jpeg")


async def test_download_dedup_near_keeps_one_row_of_each_photograph(
    origin: Origin,
    tmp_path: Path,
    started: list[Download],  # noqa: F811 - the fixture
) -> None:
    serve(origin)
    (tmp_path / "list.txt").write_text("".join(origin.url(p) + "\n" for p, _ in ROWS))
    out = tmp_path / "out"
    args = (
        str(tmp_path / "list.txt"),
        "--output-folder", str(out),
        "--output-format", "webdataset",
        "--number-sample-per-shard", str(PER_SHARD),
        "--max-host-rate", "20",
        "--dedup", "near",
    )  # fmt: skip
    run = Download(*args, cwd=tmp_path)
    started.append(run)
    assert await asyncio.to_thread(run.process.wait, 240) == 0, run.stderr
    run.kill()
    said = "\n".join(run.out)
    assert f"{len(ROWS)}/{len(ROWS)} rows ended: 3 images, 3 duplicates, 1 failed" in said, said

    rows = pq.read_table(sorted(out.glob("*.parquet"))).to_pylist()
    assert [r["url"] for r in rows] == [origin.url(p) for p, _ in ROWS]
    kept: dict[int, str] = {}  # photograph -> the key of its row kept
    for r, (_, photo) in zip(rows, ROWS, strict=True):
        if r["status"] == "success":
            assert photo is not None and photo not in kept, r
            kept[photo] = r["key"]
    assert sorted(kept) == [0, 1, 2]
    for r, (path, photo) in zip(rows, ROWS, strict=True):
        if photo is None or r["key"] == kept[photo]:
            assert r["duplicate_of"] is None
            continue
        # Whichever of a photograph's rows the stage saw first is kept.
        assert r["status"] == "duplicate" and r["duplicate_of"] == kept[photo], r
        words = "a near duplicate of" if path.endswith("/1.jpg") else "an exact duplicate of"
        assert r["error_message"].startswith(f"{words} {kept[photo]}"), r
        assert r["sha256"] and r["phash"] and r["width"] is None
    stats = [(out / f"{s:05d}_stats.json").read_text() for s in range(-(-len(ROWS) // 3))]
    assert sum('"duplicates": ' in text for text in stats) == len(stats)

    members: collections.Counter[str] = collections.Counter()
    for tar_path in sorted(out.glob("*.tar")):
        with tarfile.open(tar_path) as tar:
            members.update(m.name.split(".")[0] for m in tar.getmembers())
    assert set(members) == set(kept.values())
