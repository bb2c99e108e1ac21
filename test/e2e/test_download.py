"""``image-crawler download``, as a user runs it: a Parquet list in, a dataset out, read
by webdataset, Hugging Face ``datasets`` and pyarrow; run again, it goes on; killed with
every process it started, and run again, every row is in the dataset once.

The list's rows cover every way a row ends: images, 404s, a body that is no image, a
path robots.txt disallows, an image whose server opted out (X-Robots-Tag: noai), and a
URL the crawler cannot fetch (ended before anything is sent).
"""

from __future__ import annotations

import asyncio
import collections
import gc
import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from image_crawler import contract as c
from test.harness.crawl import Gate, sources_file, worker_env
from test.harness.origin import Origin
from test.harness.processes import Command, CrawlerProcess, kill_all
from test.harness.services import create_bucket, s3_client, wait_for, wait_until

PER_SHARD = 4
IMAGES = 12
# How each row of the list ends: its path on the origin (None: a URL not crawled).
ROWS: list[tuple[str, str | None]] = [
    *((f"image{n}", f"/img/{n}.jpg") for n in range(IMAGES)),
    ("404", "/gone/1.jpg"),
    ("UnidentifiedImageError", "/bad/1.jpg"),
    ("RobotsDisallowed", "/private/1.jpg"),
    ("OptedOut", "/opted/1.jpg"),
    ("InvalidURL", None),
    ("404", "/gone/2.jpg"),
]
SHARDS = -(-len(ROWS) // PER_SHARD)


def _photo(n: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (120 + 7 * n, 90 + 3 * n), (20 * n % 256, 90, 160)).save(out, "JPEG")
    return out.getvalue()


def serve(origin: Origin, held: Gate | None = None, held_from: int = IMAGES) -> None:
    """The list's paths on ``origin``; the images from ``held_from`` on behind ``held``."""
    origin.set_robots("User-agent: *\nDisallow: /private/\n")
    for n in range(IMAGES):
        if held is not None and n >= held_from:
            origin.add_handler(f"/img/{n}.jpg", held)
        else:
            origin.add(f"/img/{n}.jpg", _photo(n), "image/jpeg")
    origin.add("/bad/1.jpg", b"<html>not an image</html>", "image/jpeg")
    origin.add("/private/1.jpg", _photo(1), "image/jpeg")
    origin.add("/opted/1.jpg", _photo(2), "image/jpeg", headers={"X-Robots-Tag": "noai"})


def write_list(path: Path, origin: Origin) -> None:
    """LAION's column names; a caption and two kept columns a row."""
    urls = [origin.url(p) if p else "ftp://127.0.0.1/x.jpg" for _, p in ROWS]
    table = pa.table(
        {
            "URL": urls,
            "TEXT": [f"row {i}: «{name}» ü\n" for i, (name, _) in enumerate(ROWS)],
            "license": [f"cc-{i}" for i in range(len(ROWS))],
            "similarity": [i / 100 for i in range(len(ROWS))],
            "ignored": list(range(len(ROWS))),
        }
    )
    pq.write_table(table, path)


def download_args(list_path: Path, out: Path | str, *extra: str) -> tuple[str, ...]:
    return (
        str(list_path),
        "--input-format", "parquet",
        "--url-col", "URL",
        "--caption_col", "TEXT",  # img2dataset's own spelling is taken too
        "--save-additional-columns", '["license","similarity"]',
        "--output-format", "webdataset",
        "--output-folder", str(out),
        "--image-size", "64",
        "--resize-mode", "center_crop",
        "--encode-format", "webp",
        "--number-sample-per-shard", str(PER_SHARD),
        "--max-host-rate", "20",
        *extra,
    )  # fmt: skip


class Download(Command):
    def __init__(self, *args: str, cwd: Path, env: dict[str, str] | None = None) -> None:
        super().__init__("download", *args, cwd=cwd, env=env)


@pytest.fixture
def started() -> Iterator[list[Download]]:
    runs: list[Download] = []
    yield runs
    for run in runs:
        run.kill()


def dataset_files(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if not p.name.startswith("."))


def expected_files() -> list[str]:
    names = [
        f"{s:05d}{suffix}" for s in range(SHARDS) for suffix in (".parquet", ".tar", "_stats.json")
    ]
    return sorted(names)


def check_dataset(out: Path) -> None:
    """Every row in the Parquet files once, in order, ending as its row says; every image
    in the tars once, 64 x 64 WebP, beside its caption byte for byte and its record."""
    assert dataset_files(out) == expected_files()
    table = pq.read_table(sorted(out.glob("*.parquet")))
    rows = table.to_pylist()
    keys = [f"{s:05d}{i}" for s in range(SHARDS) for i in range(PER_SHARD)][: len(ROWS)]
    assert [r["key"] for r in rows] == keys
    assert table.schema.field("similarity").type == pa.float64()
    for (name, _), r, i in zip(ROWS, rows, range(len(ROWS)), strict=True):
        assert r["caption"] == f"row {i}: «{name}» ü\n" and r["license"] == f"cc-{i}"
        want = "200" if name.startswith("image") else name
        assert r["crawl_status"] == want, r
        assert (r["status"] == "success") == name.startswith("image"), r
    statuses = collections.Counter(r["status"] for r in rows)
    assert statuses == {"success": IMAGES, "failed_to_download": 5, "failed_to_resize": 1}
    # The opted-out image was fetched (its header said so) and is not in the shards.
    opted = next(r for r in rows if r["crawl_status"] == "OptedOut")
    assert opted["opt_outs"] == ["noai"] and opted["width"] is None

    members: collections.Counter[str] = collections.Counter()
    for tar_path in sorted(out.glob("*.tar")):
        with tarfile.open(tar_path) as tar:
            for member in tar.getmembers():
                members[member.name] += 1
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                key, ext = member.name.split(".", 1)
                row = rows[keys.index(key)]
                if ext == "webp":
                    assert Image.open(io.BytesIO(data)).size == (64, 64)
                elif ext == "txt":
                    assert data == row["caption"].encode()
                else:
                    assert json.loads(data)["key"] == key
    successes = {r["key"] for r in rows if r["status"] == "success"}
    assert set(members) == {f"{k}.{e}" for k in successes for e in ("webp", "txt", "json")}
    assert set(members.values()) == {1}


def read_by_the_clients(out: Path, cache: Path) -> None:
    import datasets
    import webdataset as wds

    tars = [str(p) for p in sorted(out.glob("*.tar"))]
    samples = list(wds.WebDataset(tars, shardshuffle=False).decode("pil"))
    gc.collect()  # webdataset's open tar files closed here, where their warnings are ignored
    assert len(samples) == IMAGES
    assert all(s["webp"].size == (64, 64) for s in samples)
    loaded = datasets.load_dataset(
        "webdataset", data_files={"train": str(out / "*.tar")}, split="train", cache_dir=str(cache)
    )
    assert loaded.num_rows == IMAGES


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_list_becomes_a_dataset_and_a_rerun_finds_it_whole(
    origin: Origin, tmp_path: Path, started: list[Download]
) -> None:
    serve(origin)
    write_list(tmp_path / "list.parquet", origin)
    out = tmp_path / "out"
    run = Download(*download_args(tmp_path / "list.parquet", out), cwd=tmp_path)
    started.append(run)
    assert await asyncio.to_thread(run.process.wait, 240) == 0, run.stderr
    run.kill()
    assert f"{len(ROWS)}/{len(ROWS)} rows ended: {IMAGES} images, 6 failed" in "\n".join(run.out)
    assert "ignored column(s) 'ignored'" in run.stderr
    check_dataset(out)
    read_by_the_clients(out, tmp_path / "hf-cache")
    # Its own state, once whole: only what says what it was made of.
    assert [p.name for p in (out / ".image-crawler").iterdir()] == ["run.json"]
    # Each image fetched once; robots.txt kept the disallowed one from being asked.
    assert all(origin.requests(f"/img/{n}.jpg") == 1 for n in range(IMAGES))
    assert origin.requests("/private/1.jpg") == 0

    requests = origin.total_requests
    again = Download(*download_args(tmp_path / "list.parquet", out), cwd=tmp_path)
    started.append(again)
    assert await asyncio.to_thread(again.process.wait, 60) == 0, again.stderr
    again.kill()
    assert "is whole" in "\n".join(again.out)
    assert origin.total_requests == requests
    other = Download(
        *download_args(tmp_path / "list.parquet", out, "--image-size", "32"), cwd=tmp_path
    )
    started.append(other)
    assert await asyncio.to_thread(other.process.wait, 60) == 1
    other.kill()
    assert "made with other options (encoding)" in other.stderr


async def test_a_kill_9_of_download_and_all_it_started_then_a_rerun_makes_each_row_once(
    origin: Origin, tmp_path: Path, started: list[Download]
) -> None:
    # The images of the last shards are held until the first run is gone: it cannot end.
    held = Gate(_photo(0))
    serve(origin, held, held_from=IMAGES - 5)
    write_list(tmp_path / "list.parquet", origin)
    out = tmp_path / "out"
    args = download_args(tmp_path / "list.parquet", out)
    first = Download(*args, cwd=tmp_path)
    started.append(first)
    await asyncio.to_thread(
        wait_until,
        lambda: (out / "00000_stats.json").exists() or first.process.poll() is not None,
        180,
        what="a first shard written",
    )
    assert first.process.poll() is None, first.stderr
    await asyncio.to_thread(wait_until, lambda: held.waiting > 0, 60, what="a held request")
    killed = kill_all(first)
    assert len(killed) >= 7  # download, SeaweedFS, tansu, redis-server, monitor, worker, ...
    written_first = [n for n in dataset_files(out) if n.endswith("_stats.json")]
    assert 1 <= len(written_first) < SHARDS
    held.opened.set()

    second = Download(*args, cwd=tmp_path)
    started.append(second)
    assert await asyncio.to_thread(second.process.wait, 240) == 0, second.stderr
    second.kill()
    assert "going on with" in second.stderr
    check_dataset(out)
    # A row of a shard written before the kill is in the dataset once (checked above),
    # though it may be fetched once more: a worker commits its queue only up to its
    # oldest unfinished message, here a held one, and the killed worker's finished
    # messages past it are delivered again (failed 2 of 5 whole runs as "== 1"; issue 53
    # is about that second fetch). Never a third.
    assert all(origin.requests(f"/img/{n}.jpg") <= 2 for n in range(IMAGES))
    print(
        f"first run wrote {len(written_first)} of {SHARDS} shards; requests {origin.total_requests}"
    )


async def test_a_worker_killed_mid_run_is_started_again_and_the_dataset_is_whole(
    origin: Origin, tmp_path: Path, started: list[Download]
) -> None:
    held = Gate(_photo(0))
    serve(origin, held, held_from=IMAGES - 5)
    write_list(tmp_path / "list.parquet", origin)
    out = tmp_path / "out"
    run = Download(*download_args(tmp_path / "list.parquet", out), cwd=tmp_path)
    started.append(run)
    await asyncio.to_thread(wait_until, lambda: held.waiting > 0, 180, what="a held request")
    children = psutil.Process(run.process.pid).children(recursive=True)
    (worker,) = [p for p in children if p.cmdline()[-2:] == ["-m", "worker"]]
    worker.kill()
    await asyncio.to_thread(
        run.wait_for_line, r"worker-1 exited with status -9; starting it again", 60, stderr=True
    )
    held.opened.set()
    assert await asyncio.to_thread(run.process.wait, 240) == 0, run.stderr
    run.kill()
    check_dataset(out)
    # What the killed worker had in flight, or had finished past its partitions' commits,
    # was fetched again (at least once inside: issue 53 is about the second); once in the
    # dataset all the same.
    assert max(origin.requests(f"/img/{n}.jpg") for n in range(IMAGES)) <= 2


@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_on_an_existing_cluster_a_list_becomes_a_dataset_in_s3(
    origin: Origin, tmp_path: Path, started: list[Download], kafka, redis, redis_url, s3_server,
    s3_bucket: str,
) -> None:  # fmt: skip
    """--kafka and --redis: the crawl is a running cluster's (its monitor, its worker, the
    workers' images in its S3 bucket); --output-folder s3://: the dataset goes to S3."""
    serve(origin)
    write_list(tmp_path / "list.parquet", origin)
    monitor_env = {
        **kafka.env,
        "REDIS_URL": redis_url,
        "SOURCES_FILE": sources_file(tmp_path, dataset=c.MAX_IMAGES),
    }
    processes = [CrawlerProcess("crawl_monitor", monitor_env, tmp_path / "monitor.log")]
    try:
        await wait_for(
            lambda: redis.hexists(c.RATES_HASH, "dataset"), 30, what="the monitor's rates"
        )
        env = {**s3_server.env, "S3_BUCKET": s3_bucket}
        cluster = ("--kafka", kafka.bootstrap, "--redis", redis_url)
        # A source the monitor does not rate is never crawled: said, and nothing sent.
        unknown = Download(
            *download_args(tmp_path / "list.parquet", tmp_path / "unused"),
            *cluster, "--source", "nobody", cwd=tmp_path, env=env,
        )  # fmt: skip
        started.append(unknown)
        assert await asyncio.to_thread(unknown.process.wait, 60) == 1
        assert "does not rate the source 'nobody'" in unknown.stderr
        processes.append(
            CrawlerProcess(
                "worker",
                worker_env(kafka, redis_url, s3_server, s3_bucket, IMAGE_PROCESSES=1),
                tmp_path / "worker.log",
            )
        )
        out_bucket = f"{s3_bucket}-out"
        create_bucket(s3_server.endpoint_url, out_bucket)
        args = (
            *download_args(tmp_path / "list.parquet", f"s3://{out_bucket}/sets/one"),
            *cluster, "--state-folder", str(tmp_path / "state"),
        )  # fmt: skip
        run = Download(*args, cwd=tmp_path, env=env)
        started.append(run)
        assert await asyncio.to_thread(run.process.wait, 240) == 0, run.stderr
        run.kill()
        assert "keeping the cluster's" not in run.stderr
        requests = origin.total_requests
        again = Download(*args, cwd=tmp_path, env=env)
        started.append(again)
        assert await asyncio.to_thread(again.process.wait, 60) == 0, again.stderr
        assert "is whole" in "\n".join(again.out) and origin.total_requests == requests
    finally:
        for process in processes:
            process.stop()
    assert await redis.get(c.host_rate_key("dataset")) == "20"
    # The dataset, read back from S3: as on a disk, and nothing else under its prefix.
    out = tmp_path / "from-s3"
    out.mkdir()
    client = s3_client(s3_server.endpoint_url)
    listed = client.list_objects_v2(Bucket=out_bucket, Prefix="sets/one/")["Contents"]
    for obj in listed:
        body = client.get_object(Bucket=out_bucket, Key=obj["Key"])["Body"].read()
        (out / obj["Key"].removeprefix("sets/one/")).write_bytes(body)
    check_dataset(out)
    # The workers' images are gone from their bucket once in the shards.
    assert client.list_objects_v2(Bucket=s3_bucket).get("KeyCount", 0) == 0
    assert all(origin.requests(f"/img/{n}.jpg") == 1 for n in range(IMAGES))
