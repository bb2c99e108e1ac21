"""Where a download's images come from and where its dataset goes: a local folder, or S3.

The workers store each image at ``object_key(uuid, encoding)``: in a folder on the local
stack (``THUMBNAIL_STORE=local``), in the cluster's ``S3_BUCKET`` otherwise. A dataset
goes to a folder (each shard's files renamed into it, ``shards.write_shard``) or under
``s3://bucket/prefix``: written whole in a local folder first, then each file PUT, the
stats last. An S3 object appears whole or not at all, so there too a reader never sees
part of a file, and a shard whose stats object is there is complete.

The S3 clients are botocore's own (synchronous: a shard is written in a thread, one
request at a time), configured as the workers' are: ``S3_ENDPOINT_URL``,
``AWS_DEFAULT_REGION``, ``AWS_CA_BUNDLE`` and the usual credentials.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Protocol

from crawlctl.dataset.layout import Layout
from crawlctl.dataset.shards import (
    STATS_SUFFIX,
    ShardFormat,
    ShardRow,
    complete_shards,
    stats_path,
    write_shard,
)
from image_crawler.config import S3Settings

S3_SCHEME: Final = "s3://"
# delete_objects takes at most this many keys a request.
_DELETE_BATCH: Final = 1000


def s3_client(settings: S3Settings) -> Any:
    """A botocore S3 client on ``settings``' endpoint (path style there, as the workers'
    requests are: MinIO, SeaweedFS and test servers need it)."""
    import botocore.config
    import botocore.session

    config = botocore.config.Config(
        s3={"addressing_style": "path"} if settings.endpoint_url else {},
        retries={"max_attempts": 5, "mode": "standard"},
    )
    return botocore.session.get_session().create_client(
        "s3",
        endpoint_url=settings.endpoint_url,
        region_name=settings.region or "us-east-1",
        verify=settings.ca_bundle,
        config=config,
    )


def is_s3(location: str) -> bool:
    return location.startswith(S3_SCHEME)


@dataclasses.dataclass(frozen=True, slots=True)
class S3Location:
    bucket: str
    prefix: str  # "" or a path without its slashes at either end

    @classmethod
    def parse(cls, location: str) -> S3Location:
        """``s3://bucket`` or ``s3://bucket/some/prefix``; ValueError if not that."""
        if not is_s3(location):
            raise ValueError(f"not an s3:// URL: {location!r}")
        bucket, _, prefix = location.removeprefix(S3_SCHEME).partition("/")
        if not bucket:
            raise ValueError(f"no bucket in {location!r}: s3://bucket/prefix")
        return cls(bucket, prefix.strip("/"))

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def __str__(self) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.prefix}".rstrip("/")


# --- the images the workers stored -----------------------------------------------------------


class Images(Protocol):
    def read(self, key: str) -> bytes: ...

    def delete(self, keys: Sequence[str]) -> None: ...


class FolderImages:
    """The local stack's: files in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def read(self, key: str) -> bytes:
        return (self.folder / key).read_bytes()

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            (self.folder / key).unlink(missing_ok=True)


class S3Images:
    """A cluster's: objects in the workers' bucket."""

    def __init__(self, client: Any, bucket: str) -> None:
        self.client = client
        self.bucket = bucket

    def read(self, key: str) -> bytes:
        response = self.client.get_object(Bucket=self.bucket, Key=key)
        with response["Body"] as body:
            data: bytes = body.read()
        return data

    def delete(self, keys: Sequence[str]) -> None:
        for start in range(0, len(keys), _DELETE_BATCH):
            batch = keys[start : start + _DELETE_BATCH]
            self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
            )


# --- where the dataset goes ------------------------------------------------------------------


class Destination(Protocol):
    def complete(self) -> set[int]:
        """The shards written whole (their stats are there)."""
        ...

    def stats(self, shard: int) -> dict[str, Any]:
        """A complete shard's stats."""
        ...

    def write(
        self,
        shard: int,
        rows: Sequence[ShardRow],
        layout: Layout,
        fmt: ShardFormat,
        staging: Path,
        *,
        start_time: float,
        end_time: float,
    ) -> None:
        """Write ``shard`` whole, through the local folder ``staging``."""
        ...


class FolderDestination:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __str__(self) -> str:
        return str(self.folder)

    def complete(self) -> set[int]:
        return complete_shards(self.folder)

    def stats(self, shard: int) -> dict[str, Any]:
        stats: dict[str, Any] = json.loads(stats_path(self.folder, shard).read_text())
        return stats

    def write(
        self,
        shard: int,
        rows: Sequence[ShardRow],
        layout: Layout,
        fmt: ShardFormat,
        staging: Path,
        *,
        start_time: float,
        end_time: float,
    ) -> None:
        write_shard(
            self.folder, staging, shard, rows, layout, fmt,
            start_time=start_time, end_time=end_time,
        )  # fmt: skip


class S3Destination:
    def __init__(self, client: Any, location: S3Location) -> None:
        self.client = client
        self.location = location

    def __str__(self) -> str:
        return str(self.location)

    def _names(self) -> list[str]:
        """The names of every object under the prefix."""
        prefix = self.location.key("")
        names = []
        for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.location.bucket, Prefix=prefix
        ):
            names += [o["Key"].removeprefix(prefix) for o in page.get("Contents", ())]
        return names

    def complete(self) -> set[int]:
        done = set()
        for name in self._names():
            number = name.removesuffix(STATS_SUFFIX)
            if name.endswith(STATS_SUFFIX) and number.isdigit():
                done.add(int(number))
        return done

    def stats(self, shard: int) -> dict[str, Any]:
        key = self.location.key(f"{Layout.name(shard)}{STATS_SUFFIX}")
        response = self.client.get_object(Bucket=self.location.bucket, Key=key)
        with response["Body"] as body:
            stats: dict[str, Any] = json.loads(body.read())
        return stats

    def write(
        self,
        shard: int,
        rows: Sequence[ShardRow],
        layout: Layout,
        fmt: ShardFormat,
        staging: Path,
        *,
        start_time: float,
        end_time: float,
    ) -> None:
        # The shard whole in a local folder, then each file up, the stats last: until
        # they are there the shard is not complete, and a rerun writes it again whole.
        local = staging.with_name(f"{staging.name}-upload")
        if local.exists():
            shutil.rmtree(local)
        local.mkdir(parents=True)
        write_shard(
            local, staging, shard, rows, layout, fmt, start_time=start_time, end_time=end_time
        )
        stats = f"{Layout.name(shard)}{STATS_SUFFIX}"
        files = sorted(p for p in local.rglob("*") if p.is_file() and p.name != stats)
        for path in [*files, local / stats]:
            name = path.relative_to(local).as_posix()
            with path.open("rb") as body:
                self.client.put_object(
                    Bucket=self.location.bucket, Key=self.location.key(name), Body=body
                )
        shutil.rmtree(local)
