"""What a dataset holds, in img2dataset 1.47's layout: shards, keys and each row's record.

Rows are cut into shards of ``number_sample_per_shard`` in input order; shard ``s`` is
``{s:05d}.tar`` (or a folder, or a Parquet file of images), ``{s:05d}.parquet`` (one row
per input row, successes and failures) and ``{s:05d}_stats.json``. A row's key is its
shard and its place in it, ``(10 ** ceil(log10(per_shard))) * shard + index`` in
``5 + ceil(log10(per_shard))`` digits (``000420031``: shard 42, row 31), so a row keeps its
key across reruns. Its record carries img2dataset's fields, in its order (the kept
columns, ``caption``, ``url``, then ``key``, ``status``, ``error_message``, the sizes,
``exif`` and ``sha256``), and the crawler's beside them.

Pure: no I/O (``crawlctl.dataset.shards`` writes).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any, Final

from image_crawler.contract import OPT_OUTS, ResolutionMessage, Status

# img2dataset's oom_shard_count: shard names and the front of every key.
SHARD_DIGITS: Final = 5
OUTPUT_FORMATS: Final = ("files", "webdataset", "parquet")
# img2dataset's statuses, the Parquet files' ``status``.
SUCCESS: Final = "success"
FAILED_TO_DOWNLOAD: Final = "failed_to_download"
FAILED_TO_RESIZE: Final = "failed_to_resize"
# Ours beside them (``--dedup``): an image of a cluster whose kept image is another row;
# ``duplicate_of`` is that row's key, and the image is not in the shards.
DUPLICATE: Final = "duplicate"
# The statuses of an image that came but gave no image (img2dataset: failed_to_resize),
# with img2dataset's own error messages for its filters.
_IMAGE_STATUSES: Final[dict[str, str | None]] = {
    Status.UNIDENTIFIED_IMAGE: None,
    Status.IMAGE_DECODE_ERROR: None,
    Status.DECOMPRESSION_BOMB: None,
    Status.PROCESS_CRASHED: None,
    Status.IMAGE_TOO_SMALL: "image too small",
    Status.IMAGE_AREA_TOO_LARGE: "image area too large",
    Status.ASPECT_RATIO_TOO_LARGE: "aspect ratio too large",
}
# The crawler's status of a row whose server reserved the image's use: not in the shards.
OPTED_OUT: Final = "OptedOut"
# Names img2dataset keeps for itself, and the crawler's beside them: no kept column may
# take one.
RESERVED_COLUMNS: Final = frozenset(
    {
        "url",
        "caption",
        "key",
        "status",
        "error_message",
        "width",
        "height",
        "original_width",
        "original_height",
        "exif",
        "md5",
        "sha256",
        "sha512",
        "phash",
        "opt_outs",
        "tdm_policy",
        "etag",
        "last_modified",
        "crawl_status",
        "duplicate_of",
    }
)


@dataclasses.dataclass(frozen=True, slots=True)
class Layout:
    """How rows are cut into shards and named."""

    per_shard: int

    def __post_init__(self) -> None:
        if self.per_shard < 1:
            raise ValueError(f"number_sample_per_shard must be at least 1, got {self.per_shard}")

    @property
    def _index_digits(self) -> int:
        return math.ceil(math.log10(self.per_shard))

    def place(self, row: int) -> tuple[int, int]:
        """(shard, index in it) of the input's ``row``-th row, counted from 0."""
        return divmod(row, self.per_shard)

    def key(self, shard: int, index: int) -> str:
        digits = self._index_digits
        return f"{(10**digits) * shard + index:0{SHARD_DIGITS + digits}d}"

    def shard_of(self, key: str) -> int:
        """The shard of a key this layout made."""
        return int(key) // (10**self._index_digits)

    def rows_in(self, shard: int, rows: int) -> int:
        """How many of ``rows`` rows in all are in ``shard``."""
        return max(0, min(self.per_shard, rows - shard * self.per_shard))

    def shards(self, rows: int) -> int:
        return -(-rows // self.per_shard)

    @staticmethod
    def name(shard: int) -> str:
        return f"{shard:0{SHARD_DIGITS}d}"


@dataclasses.dataclass(frozen=True, slots=True)
class InputRow:
    """One row of the URL list: where it is, its URL, caption and kept columns by name."""

    shard: int
    index: int
    url: str | None  # None: the row gave none
    caption: str | None = None
    columns: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_obj(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"shard": self.shard, "index": self.index}
        if self.url is not None:
            obj["url"] = self.url
        if self.caption is not None:
            obj["caption"] = self.caption
        if self.columns:
            obj["columns"] = dict(self.columns)
        return obj

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> InputRow:
        return cls(
            shard=obj["shard"],
            index=obj["index"],
            url=obj.get("url"),
            caption=obj.get("caption"),
            columns=obj.get("columns") or {},
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Duplicate:
    """An image's cluster kept another row (``key``): ``kind`` exact or near, and the
    Hamming ``distance`` of their perceptual hashes (image_duplicates' placement)."""

    key: str
    kind: str
    distance: int

    def words(self) -> str:
        if self.kind == "exact":
            return f"an exact duplicate of {self.key}"
        return f"a near duplicate of {self.key} ({self.distance} bits)"


@dataclasses.dataclass(frozen=True, slots=True)
class Ending:
    """How a row ended: ``status`` the crawler's (``"200"`` for an image), and for an
    image its resolution message and EXIF (None: none); ``detail`` a failure's words;
    ``duplicate``, with ``--dedup``, the row its cluster kept when that is another."""

    status: str
    resolution: ResolutionMessage | None = None
    exif: Mapping[str, Any] | None = None
    detail: str | None = None
    duplicate: Duplicate | None = None

    @property
    def crawled(self) -> bool:
        return self.resolution is not None

    def to_obj(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"status": self.status}
        if self.resolution is not None:
            obj["resolution"] = json.loads(self.resolution.to_json())
        if self.exif is not None:
            obj["exif"] = dict(self.exif)
        if self.detail is not None:
            obj["detail"] = self.detail
        if self.duplicate is not None:
            obj["duplicate"] = dataclasses.asdict(self.duplicate)
        return obj

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> Ending:
        resolution = obj.get("resolution")
        return cls(
            status=obj["status"],
            resolution=None
            if resolution is None
            else ResolutionMessage.from_json(json.dumps(resolution)),
            exif=obj.get("exif"),
            detail=obj.get("detail"),
            duplicate=None if obj.get("duplicate") is None else Duplicate(**obj["duplicate"]),
        )


def verdict(ending: Ending, skip_opted_out: bool = True) -> tuple[str, str | None, str]:
    """(img2dataset's status, its error_message, the crawler's status) of a row.

    An image whose server reserved its use (X-Robots-Tag noai or noimageai, TDMRep,
    robots.txt Content Signals) is a failure, ``OptedOut``, unless ``skip_opted_out`` is
    False (img2dataset's ``--disallowed_header_directives '[]'``). An image whose
    cluster kept another row is a ``duplicate``, with the crawler's status of its crawl."""
    resolution = ending.resolution
    if resolution is not None:
        if resolution.opt_outs and skip_opted_out:
            said = ", ".join(name for name in OPT_OUTS if name in resolution.opt_outs)
            return FAILED_TO_DOWNLOAD, f"the server opted out: {said}", OPTED_OUT
        if ending.duplicate is not None:
            return DUPLICATE, ending.duplicate.words(), ending.status
        return SUCCESS, None, ending.status
    status = ending.status
    if status in _IMAGE_STATUSES:
        words = _IMAGE_STATUSES[status] or _worded(status, ending.detail)
        return FAILED_TO_RESIZE, words, status
    return FAILED_TO_DOWNLOAD, _worded(status, ending.detail), status


def _worded(status: str, detail: str | None) -> str:
    return status if not detail else f"{status}: {detail}"


def record(row: InputRow, key: str, ending: Ending, skip_opted_out: bool = True) -> dict[str, Any]:
    """The row's record, its ``.json`` in the shard and its row of the Parquet file:
    img2dataset's fields in its order, then the crawler's (``phash``, ``opt_outs``,
    ``tdm_policy``, ``etag``, ``last_modified``, ``crawl_status`` and, with ``--dedup``,
    ``duplicate_of``, the key of the row a duplicate's cluster kept). ``width`` and
    ``height`` are the stored image's, the ``original_`` ones the downloaded one's; ``exif``
    is a JSON string, as img2dataset writes it, of the EXIF message's tags."""
    status, error_message, crawl_status = verdict(ending, skip_opted_out)
    resolution = ending.resolution if status == SUCCESS else None
    stored = resolution.image if resolution is not None else None
    obj: dict[str, Any] = dict(row.columns)
    obj["caption"] = row.caption
    obj["url"] = row.url
    obj["key"] = key
    obj["status"] = status
    obj["error_message"] = error_message
    obj["width"] = stored.width if stored is not None else None
    obj["height"] = stored.height if stored is not None else None
    obj["original_width"] = resolution.width if resolution is not None else None
    obj["original_height"] = resolution.height if resolution is not None else None
    obj["exif"] = (
        json.dumps(ending.exif, ensure_ascii=False)
        if resolution is not None and ending.exif is not None
        else None
    )
    # Of what was downloaded, also for an image not kept (an opted-out one was fetched).
    crawled = ending.resolution
    obj["sha256"] = crawled.sha256 if crawled is not None else None
    obj["phash"] = crawled.phash if crawled is not None else None
    obj["opt_outs"] = list(crawled.opt_outs) if crawled is not None else []
    obj["tdm_policy"] = crawled.tdm_policy if crawled is not None else None
    obj["etag"] = crawled.etag if crawled is not None else None
    obj["last_modified"] = crawled.last_modified if crawled is not None else None
    obj["crawl_status"] = crawl_status
    obj["duplicate_of"] = ending.duplicate.key if ending.duplicate is not None else None
    return obj
