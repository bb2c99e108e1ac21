"""Writing one shard of a dataset, whole or not at all.

A shard is written once every one of its rows has ended: its images into ``{s:05d}.tar``
(webdataset), a folder ``{s:05d}/`` (files) or the Parquet file itself (parquet), with
``{key}.txt`` (the caption, byte for byte) and ``{key}.json`` (the row's record); then
``{s:05d}.parquet``, one row per input row in input order; then ``{s:05d}_stats.json``.
Each is written in a staging folder on the same file system and renamed into the output
folder, the stats last: a reader never sees part of a file, and a shard whose stats file
is there is complete (what a rerun keeps, as img2dataset's incremental mode does).
"""

from __future__ import annotations

import collections
import dataclasses
import io
import json
import os
import shutil
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from crawlctl.dataset.layout import (
    DUPLICATE,
    FAILED_TO_DOWNLOAD,
    FAILED_TO_RESIZE,
    SUCCESS,
    Ending,
    InputRow,
    Layout,
    record,
)

if TYPE_CHECKING:
    import pyarrow as pa

STATS_SUFFIX: Final = "_stats.json"
_TAR_MODE: Final = 0o444


@dataclasses.dataclass(frozen=True, slots=True)
class ShardFormat:
    """What a dataset's shards hold: ``output_format`` one of OUTPUT_FORMATS, images with
    the extension ``extension``, a ``.txt`` per image when ``save_caption``, the kept
    ``columns`` in their order (with their Arrow types, where the input had them), and
    whether an opted-out image is a failure (``skip_opted_out``)."""

    output_format: str = "webdataset"
    extension: str = "jpg"
    save_caption: bool = True
    columns: tuple[str, ...] = ()
    column_types: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    skip_opted_out: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class ShardRow:
    """A row of a shard that has ended, and its stored image (None: none is kept)."""

    row: InputRow
    ending: Ending
    image: bytes | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ShardStats:
    """A shard's ``_stats.json``: img2dataset's counts, and the crawler's statuses and
    ``duplicates`` (``--dedup``'s rows not kept)."""

    count: int
    successes: int
    failed_to_download: int
    failed_to_resize: int
    start_time: float
    end_time: float
    status_dict: Mapping[str, int]
    crawl_statuses: Mapping[str, int]
    duplicates: int = 0

    def to_obj(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "successes": self.successes,
            "failed_to_download": self.failed_to_download,
            "failed_to_resize": self.failed_to_resize,
            "duration": self.end_time - self.start_time,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "status_dict": dict(self.status_dict),
            "crawl_statuses": dict(self.crawl_statuses),
            "duplicates": self.duplicates,
        }


def stats_path(folder: Path, shard: int) -> Path:
    return folder / f"{Layout.name(shard)}{STATS_SUFFIX}"


def complete_shards(folder: Path) -> set[int]:
    """The shards of ``folder`` whose stats file is there: complete ones."""
    done = set()
    for path in folder.glob(f"*{STATS_SUFFIX}"):
        number = path.name.removesuffix(STATS_SUFFIX)
        if number.isdigit():
            done.add(int(number))
    return done


def write_shard(
    folder: Path,
    staging: Path,
    shard: int,
    rows: Sequence[ShardRow],
    layout: Layout,
    fmt: ShardFormat,
    *,
    start_time: float,
    end_time: float,
) -> ShardStats:
    """Write shard ``shard`` of ``rows`` (its every row, in input order) into ``folder``,
    through ``staging`` (emptied first); returns its stats. A shard already there is
    written again whole (a run that stopped between renames leaves one without stats)."""
    name = Layout.name(shard)
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    records = []
    images: list[tuple[str, bytes, str | None, dict[str, Any]]] = []
    for item in rows:
        key = layout.key(item.row.shard, item.row.index)
        obj = record(item.row, key, item.ending, fmt.skip_opted_out)
        records.append(obj)
        if obj["status"] == SUCCESS:
            if item.image is None:
                raise ValueError(f"row {key} is a success without its image")
            images.append((key, item.image, item.row.caption, obj))
    stats = _stats(records, start_time, end_time)
    staged: list[tuple[Path, Path]] = []
    if fmt.output_format == "webdataset":
        tar = staging / f"{name}.tar"
        _write_tar(tar, images, fmt, mtime=int(end_time))
        staged.append((tar, folder / tar.name))
    elif fmt.output_format == "files":
        files = staging / name
        _write_files(files, images, fmt)
        staged.append((files, folder / name))
    elif fmt.output_format != "parquet":
        raise ValueError(f"unknown output format {fmt.output_format!r}")
    parquet = staging / f"{name}.parquet"
    image_column = (
        {key: image for key, image, _, _ in images} if fmt.output_format == "parquet" else None
    )
    _write_parquet(parquet, records, fmt, image_column)
    staged.append((parquet, folder / parquet.name))
    stats_file = staging / f"{name}{STATS_SUFFIX}"
    stats_file.write_text(json.dumps(stats.to_obj(), indent=4) + "\n")
    staged.append((stats_file, stats_path(folder, shard)))
    for path in (p for p, _ in staged):
        _fsync(path)
    for source, target in staged:
        if target.is_dir():  # a files shard of a run that stopped midway
            shutil.rmtree(target)
        os.replace(source, target)
    _fsync(folder)
    staging.rmdir()
    return stats


def _stats(records: Sequence[Mapping[str, Any]], start_time: float, end_time: float) -> ShardStats:
    statuses: collections.Counter[str] = collections.Counter()
    status_dict: collections.Counter[str] = collections.Counter()
    crawl: collections.Counter[str] = collections.Counter()
    for obj in records:
        statuses[obj["status"]] += 1
        # One entry for every duplicate, not one per kept row its words name.
        duplicate = obj["status"] == DUPLICATE
        status_dict[DUPLICATE if duplicate else (obj["error_message"] or SUCCESS)] += 1
        crawl[obj["crawl_status"]] += 1
    return ShardStats(
        count=len(records),
        successes=statuses[SUCCESS],
        failed_to_download=statuses[FAILED_TO_DOWNLOAD],
        failed_to_resize=statuses[FAILED_TO_RESIZE],
        start_time=start_time,
        end_time=end_time,
        status_dict=dict(status_dict),
        crawl_statuses=dict(crawl),
        duplicates=statuses[DUPLICATE],
    )


def _members(
    key: str, image: bytes, caption: str | None, obj: Mapping[str, Any], fmt: ShardFormat
) -> list[tuple[str, bytes]]:
    members = [(f"{key}.{fmt.extension}", image)]
    if fmt.save_caption:
        members.append((f"{key}.txt", (caption if caption is not None else "").encode()))
    members.append((f"{key}.json", json.dumps(obj, indent=4, ensure_ascii=False).encode()))
    return members


def _write_tar(
    path: Path,
    images: Sequence[tuple[str, bytes, str | None, dict[str, Any]]],
    fmt: ShardFormat,
    *,
    mtime: int,
) -> None:
    # The sample's files one after another, as webdataset's TarWriter writes them: its
    # readers group consecutive members by the name before the first dot.
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, image, caption, obj in images:
            for name, data in _members(key, image, caption, obj, fmt):
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(data), mtime, _TAR_MODE
                tar.addfile(info, io.BytesIO(data))


def _write_files(
    folder: Path,
    images: Sequence[tuple[str, bytes, str | None, dict[str, Any]]],
    fmt: ShardFormat,
) -> None:
    folder.mkdir()
    for key, image, caption, obj in images:
        for name, data in _members(key, image, caption, obj, fmt):
            (folder / name).write_bytes(data)


def _write_parquet(
    path: Path,
    records: Sequence[Mapping[str, Any]],
    fmt: ShardFormat,
    images: Mapping[str, bytes] | None,
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = parquet_schema(fmt, records)
    columns = {name: [obj.get(name) for obj in records] for name in schema.names}
    if images is not None:
        columns[fmt.extension] = [images.get(obj["key"]) for obj in records]
    table = pa.Table.from_pydict(columns, schema=schema)
    pq.write_table(table, path)


def parquet_schema(fmt: ShardFormat, records: Sequence[Mapping[str, Any]] = ()) -> pa.Schema:
    """The Parquet files' schema: the kept columns (typed as the input typed them, else
    as their values do, a column of nothing but nulls as strings), then img2dataset's
    fields and the crawler's; a parquet dataset's image bytes last, in a column named by
    the format (``jpg``, ...), as img2dataset names it."""
    import pyarrow as pa

    fields = []
    for name in fmt.columns:
        data_type = fmt.column_types.get(name)
        if data_type is None:
            inferred = pa.array([obj.get(name) for obj in records]).type
            data_type = pa.string() if pa.types.is_null(inferred) else inferred
        fields.append(pa.field(name, data_type))
    text, count = pa.string(), pa.int32()
    fields += [
        pa.field("caption", text),
        pa.field("url", text),
        pa.field("key", text),
        pa.field("status", text),
        pa.field("error_message", text),
        pa.field("width", count),
        pa.field("height", count),
        pa.field("original_width", count),
        pa.field("original_height", count),
        pa.field("exif", text),
        pa.field("sha256", text),
        pa.field("phash", text),
        pa.field("opt_outs", pa.list_(text)),
        pa.field("tdm_policy", text),
        pa.field("etag", text),
        pa.field("last_modified", text),
        pa.field("crawl_status", text),
        pa.field("duplicate_of", text),
    ]
    if fmt.output_format == "parquet":
        fields.append(pa.field(fmt.extension, pa.binary()))
    return pa.schema(fields)


def _fsync(path: Path) -> None:
    if path.is_dir():
        for child in path.iterdir():
            if child.is_file():
                _fsync(child)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
