"""Where a download's dataset goes (crawlctl/dataset/stores.py): s3:// locations, and a
shard in S3 written whole, its stats last, on a stand-in client that records the calls."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from crawlctl.dataset.layout import Ending, InputRow, Layout
from crawlctl.dataset.shards import ShardFormat, ShardRow
from crawlctl.dataset.stores import S3Destination, S3Images, S3Location, is_s3


@pytest.mark.parametrize(
    ("url", "bucket", "prefix", "key"),
    [
        ("s3://data", "data", "", "00000.tar"),
        ("s3://data/", "data", "", "00000.tar"),
        ("s3://data/laion/part-1/", "data", "laion/part-1", "laion/part-1/00000.tar"),
    ],
)
def test_an_s3_location_is_a_bucket_and_a_prefix(url, bucket, prefix, key) -> None:
    location = S3Location.parse(url)
    assert (location.bucket, location.prefix) == (bucket, prefix)
    assert location.key("00000.tar") == key
    assert S3Location.parse(str(location)) == location


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix", "/data/out", "S3:/x"])
def test_what_is_no_s3_location_is_refused(url) -> None:
    with pytest.raises(ValueError):
        S3Location.parse(url)
    assert is_s3(url) == url.startswith("s3://")


class Objects:
    """The part of botocore's S3 client the stores use, over a dict, in call order."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], bytes] = {}
        self.puts: list[str] = []

    def put_object(self, *, Bucket: str, Key: str, Body: Any) -> None:
        self.objects[Bucket, Key] = Body.read()
        self.puts.append(Key)

    def get_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:
        return {"Body": io.BytesIO(self.objects[Bucket, Key])}

    def delete_objects(self, *, Bucket: str, Delete: dict[str, Any]) -> None:
        assert len(Delete["Objects"]) <= 1000
        for obj in Delete["Objects"]:
            self.objects.pop((Bucket, obj["Key"]), None)

    def get_paginator(self, name: str) -> Any:
        assert name == "list_objects_v2"
        objects = self.objects

        class Pages:
            def paginate(self, *, Bucket: str, Prefix: str) -> list[dict[str, Any]]:
                keys = sorted(k for b, k in objects if b == Bucket and k.startswith(Prefix))
                return [{"Contents": [{"Key": k} for k in keys]}] if keys else [{}]

        return Pages()


def _rows(shard: int) -> list[ShardRow]:
    return [
        ShardRow(InputRow(shard, i, f"http://127.0.0.1/{i}", None, {}), Ending("404"), None)
        for i in range(3)
    ]


def test_a_shard_goes_up_whole_its_stats_last_and_is_then_complete(tmp_path: Path) -> None:
    client = Objects()
    destination = S3Destination(client, S3Location.parse("s3://out/sets/one"))
    assert destination.complete() == set()
    layout, fmt = Layout(3), ShardFormat(output_format="webdataset", save_caption=False)
    for shard in (0, 2):
        destination.write(
            shard, _rows(shard), layout, fmt, tmp_path / "staging", start_time=1.0, end_time=2.0
        )
    assert client.puts == [
        "sets/one/00000.parquet", "sets/one/00000.tar", "sets/one/00000_stats.json",
        "sets/one/00002.parquet", "sets/one/00002.tar", "sets/one/00002_stats.json",
    ]  # fmt: skip
    assert destination.complete() == {0, 2}
    assert destination.stats(2)["count"] == 3
    assert json.loads(client.objects["out", "sets/one/00000_stats.json"])["failed_to_download"] == 3
    # Nothing is left on the local disk once up.
    assert not any(tmp_path.rglob("*.tar"))


def test_the_workers_images_are_read_and_deleted_in_batches_s3_takes() -> None:
    client = Objects()
    for n in range(2500):
        client.objects["images", f"{n}.jpg"] = b"x%d" % n
    images = S3Images(client, "images")
    assert images.read("7.jpg") == b"x7"
    images.delete([f"{n}.jpg" for n in range(2400)])
    assert sorted(k for _, k in client.objects) == sorted(f"{n}.jpg" for n in range(2400, 2500))
