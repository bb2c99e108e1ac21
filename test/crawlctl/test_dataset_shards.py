"""A dataset's shards (crawlctl/dataset): img2dataset's keys and records, written whole,
and read back by the clients that read img2dataset's datasets: webdataset, Hugging Face
``datasets`` and pyarrow."""

from __future__ import annotations

import gc
import io
import json
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from crawlctl.dataset.layout import Ending, InputRow, Layout, record, verdict
from crawlctl.dataset.shards import ShardFormat, ShardRow, complete_shards, write_shard
from image_crawler.contract import Encoding, ResolutionMessage, StoredImage
from worker.images.kernel import ProcessedImage, process_image


@pytest.mark.parametrize(
    ("per_shard", "shard", "index", "key"),
    [
        (10_000, 42, 31, "000420031"),  # img2dataset's own example
        (10_000, 0, 0, "000000000"),
        (1000, 7, 999, "00007999"),
        (100, 123456, 5, "12345605"),  # more shards than five digits: the key grows
        (1, 3, 0, "00003"),
    ],
)
def test_keys_are_img2dataset_s(per_shard, shard, index, key) -> None:
    assert Layout(per_shard).key(shard, index) == key


def test_rows_are_cut_into_shards_in_input_order() -> None:
    layout = Layout(3)
    assert [layout.place(row) for row in range(7)] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (1, 0),
        (1, 1),
        (1, 2),
        (2, 0),
    ]
    assert (layout.shards(7), layout.shards(6), Layout.name(12)) == (3, 2, "00012")


def _resolution(**fields) -> ResolutionMessage:
    base = {
        "identifier": "u",
        "width": 1024,
        "height": 768,
        "filesize": 5000,
        "compression_quality": 90,
        "sha256": "ab" * 32,
        "phash": "d1c4b2a3f0e19887",
        "image": StoredImage("u.webp", 256, 256),
    }
    return ResolutionMessage(**{**base, **fields})


@pytest.mark.parametrize(
    ("ending", "expected"),
    [
        (Ending("200", _resolution()), ("success", None, "200")),
        (
            Ending("200", _resolution(opt_outs=("tdm-reservation", "noai"))),
            ("failed_to_download", "the server opted out: noai, tdm-reservation", "OptedOut"),
        ),
        (Ending("404"), ("failed_to_download", "404", "404")),
        (
            Ending("RobotsDisallowed"),
            ("failed_to_download", "RobotsDisallowed", "RobotsDisallowed"),
        ),
        (
            Ending("429", detail="after 5 tries"),
            ("failed_to_download", "429: after 5 tries", "429"),
        ),
        (
            Ending("ImageTooSmall", detail="10x10"),
            ("failed_to_resize", "image too small", "ImageTooSmall"),
        ),
        (
            Ending("UnidentifiedImageError", detail="not an image"),
            ("failed_to_resize", "UnidentifiedImageError: not an image", "UnidentifiedImageError"),
        ),
    ],
)
def test_each_ending_is_one_of_img2dataset_s_statuses(ending, expected) -> None:
    assert verdict(ending) == expected


def test_an_opted_out_image_is_kept_when_asked() -> None:
    ending = Ending("200", _resolution(opt_outs=("noai",)))
    assert verdict(ending, skip_opted_out=False) == ("success", None, "200")


def test_a_record_has_img2dataset_s_fields_in_its_order_then_the_crawler_s() -> None:
    row = InputRow(0, 31, "http://a/x.jpg", "a fox", {"license": "cc-by", "similarity": 0.3})
    obj = record(row, "000000031", Ending("200", _resolution(), exif={"0x13b": "Ann"}))
    assert list(obj) == [
        "license", "similarity", "caption", "url", "key", "status", "error_message",
        "width", "height", "original_width", "original_height", "exif", "sha256",
        "phash", "opt_outs", "tdm_policy", "etag", "last_modified", "crawl_status",
        "duplicate_of",
    ]  # fmt: skip
    assert (obj["width"], obj["height"], obj["original_width"]) == (256, 256, 1024)
    assert json.loads(obj["exif"]) == {"0x13b": "Ann"}
    failed = record(row, "000000031", Ending("404"))
    assert (failed["width"], failed["sha256"], failed["exif"], failed["opt_outs"]) == (
        None, None, None, []
    )  # fmt: skip


# --- shards on disk, read back -------------------------------------------------------------

CROP = Encoding(resize_mode="center_crop", encode_format="webp")
CAPTIONS = ["a red fox", "", "ünïcødé, «quoted»\nand a second line", None]


def _photo(seed: int) -> bytes:
    im = Image.new("RGB", (400 + seed * 10, 300), (seed * 40 % 256, 120, 200))
    out = io.BytesIO()
    im.save(out, "JPEG", quality=90)
    return out.getvalue()


def _shard_rows(shard: int, layout: Layout) -> list[ShardRow]:
    """Four rows: three images (one opted out), one 404; the captions above."""
    rows = []
    for index, caption in enumerate(CAPTIONS):
        row = InputRow(shard, index, f"http://127.0.0.2/{shard}/{index}.jpg", caption,
                       {"license": f"cc-{index}", "similarity": index / 10})  # fmt: skip
        if index == 3:
            rows.append(ShardRow(row, Ending("404")))
            continue
        made = process_image(_photo(index), encoding=CROP)
        assert isinstance(made, ProcessedImage)
        key = layout.key(shard, index)
        resolution = _resolution(
            identifier=key,
            width=made.width,
            height=made.height,
            sha256=made.sha256,
            phash=made.phash,
            image=StoredImage(f"{key}.webp", *made.thumbnail_size),
            opt_outs=("noai",) if index == 1 else (),
        )
        rows.append(ShardRow(row, Ending("200", resolution), made.thumbnail))
    return rows


FORMAT = ShardFormat(
    output_format="webdataset",
    extension="webp",
    columns=("license", "similarity"),
    column_types={"license": pa.string(), "similarity": pa.float64()},
)


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    layout = Layout(4)
    out = tmp_path / "out"
    out.mkdir()
    for shard in (0, 1):
        write_shard(
            out, tmp_path / ".staging", shard, _shard_rows(shard, layout), layout, FORMAT,
            start_time=1000.0, end_time=1010.0 + shard,
        )  # fmt: skip
    return out


def test_a_shard_is_a_tar_a_parquet_file_and_its_stats(dataset: Path) -> None:
    assert sorted(p.name for p in dataset.iterdir()) == [
        "00000.parquet", "00000.tar", "00000_stats.json",
        "00001.parquet", "00001.tar", "00001_stats.json",
    ]  # fmt: skip
    assert complete_shards(dataset) == {0, 1}
    stats = json.loads((dataset / "00001_stats.json").read_text())
    counts = ("count", "successes", "failed_to_download", "failed_to_resize")
    assert [stats[k] for k in counts] == [4, 2, 2, 0]
    assert stats["status_dict"] == {"success": 2, "the server opted out: noai": 1, "404": 1}
    assert stats["crawl_statuses"] == {"200": 2, "OptedOut": 1, "404": 1}
    assert stats["duration"] == 11.0
    with tarfile.open(dataset / "00000.tar") as tar:
        names = tar.getnames()
        caption = tar.extractfile("000002.txt").read()  # type: ignore[union-attr]
    # Successes only, each sample's files together; the opted-out image is not there.
    assert names == ["000000.webp", "000000.txt", "000000.json",
                     "000002.webp", "000002.txt", "000002.json"]  # fmt: skip
    assert caption == CAPTIONS[2].encode()


# webdataset 1.0 leaves each tar file it read open, to be closed by the garbage collector.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_webdataset_iterates_every_sample(dataset: Path) -> None:
    import webdataset as wds

    urls = [str(dataset / f"0000{s}.tar") for s in (0, 1)]
    samples = list(wds.WebDataset(urls, shardshuffle=False).decode("pil"))
    gc.collect()  # its warnings here, where they are ignored, not in the next test
    assert [s["__key__"] for s in samples] == ["000000", "000002", "000010", "000012"]
    for sample in samples:
        assert sample["webp"].size == (256, 256)
        assert sample["json"]["key"] == sample["__key__"]
        assert sample["json"]["status"] == "success"
    assert samples[1]["txt"] == CAPTIONS[2]


def test_hugging_face_datasets_loads_the_tars(dataset: Path, tmp_path: Path) -> None:
    import datasets

    loaded = datasets.load_dataset(
        "webdataset",
        data_files={"train": str(dataset / "*.tar")},
        split="train",
        cache_dir=str(tmp_path / "hf-cache"),
    )
    assert loaded.num_rows == 4
    assert sorted(loaded["__key__"]) == ["000000", "000002", "000010", "000012"]
    assert loaded[0]["webp"].size == (256, 256)


def test_pyarrow_reads_every_row_of_every_parquet_file(dataset: Path) -> None:
    table = pq.read_table(sorted(dataset.glob("*.parquet")))
    assert table.num_rows == 8
    assert table.column("key").to_pylist() == [
        "000000", "000001", "000002", "000003",
        "000010", "000011", "000012", "000013",
    ]  # fmt: skip
    assert table.column("status").to_pylist()[:4] == [
        "success", "failed_to_download", "success", "failed_to_download"
    ]  # fmt: skip
    assert table.column("caption").to_pylist()[:4] == CAPTIONS
    assert table.schema.field("similarity").type == pa.float64()
    assert table.column("width").to_pylist()[:4] == [256, None, 256, None]


def test_a_parquet_dataset_carries_the_images_in_a_column(tmp_path: Path) -> None:
    layout = Layout(4)
    fmt = ShardFormat(output_format="parquet", extension="webp", columns=("license", "similarity"))
    write_shard(tmp_path, tmp_path / ".staging", 0, _shard_rows(0, layout), layout, fmt,
                start_time=0.0, end_time=1.0)  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000.parquet", "00000_stats.json"]
    table = pq.read_table(tmp_path / "00000.parquet")
    images = table.column("webp").to_pylist()
    assert [image is not None for image in images] == [True, False, True, False]
    assert Image.open(io.BytesIO(images[0])).size == (256, 256)


def test_a_files_dataset_is_a_folder_a_shard(tmp_path: Path) -> None:
    layout = Layout(4)
    fmt = ShardFormat(output_format="files", extension="webp", save_caption=False)
    write_shard(tmp_path, tmp_path / ".staging", 0, _shard_rows(0, layout), layout, fmt,
                start_time=0.0, end_time=1.0)  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "00000").iterdir()) == [
        "000000.json", "000000.webp", "000002.json", "000002.webp"
    ]  # fmt: skip


def test_a_shard_written_again_replaces_the_first_whole(dataset: Path, tmp_path: Path) -> None:
    layout = Layout(4)
    before = (dataset / "00000.tar").read_bytes()
    (dataset / "00000_stats.json").unlink()  # as if a run had stopped before its last rename
    write_shard(dataset, tmp_path / ".staging", 0, _shard_rows(0, layout), layout, FORMAT,
                start_time=1000.0, end_time=1010.0)  # fmt: skip
    assert (dataset / "00000.tar").read_bytes() == before
    assert complete_shards(dataset) == {0, 1}
    assert not (tmp_path / ".staging").exists()


def test_a_success_without_its_image_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    layout = Layout(4)
    rows = _shard_rows(0, layout)
    rows[0] = ShardRow(rows[0].row, rows[0].ending, None)
    with pytest.raises(ValueError, match="000000 is a success without its image"):
        write_shard(tmp_path / "out", tmp_path / ".staging", 0, rows, layout, FORMAT,
                    start_time=0.0, end_time=1.0)  # fmt: skip
    assert not (tmp_path / "out").exists()
