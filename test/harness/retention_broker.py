"""A tansu broker whose log start a test can move, as retention does.

tansu 0.6 (the broker of the tests and of ``image-crawler up``) neither applies a topic's
``retention.ms`` nor implements DeleteRecords (its storage answers "not yet implemented"
and drops the connection). What it does have is a storage that lives in S3: each record
batch is an object, and each partition's ``watermark.json`` holds its low (log start) and
high offsets, which tansu reads back on every request. ``delete_records_before`` does to
that storage what a broker's retention does to its segments: the batches go, and the log
start moves past them. The broker then answers with the new log start (ListOffsets), and
serves the records from there to a consumer that asks for an earlier offset, exactly the
situation of a worker whose committed offset the retention overtook.
"""

from __future__ import annotations

import contextlib
import json
import os

from test.harness.services import KafkaBroker, S3Server, s3_client


class S3StoredBroker(KafkaBroker):
    """The tests' tansu, storing in ``bucket`` (which must exist) on ``s3``."""

    def __init__(
        self, s3: S3Server, bucket: str, *, log_dir: str | os.PathLike[str] | None = None
    ) -> None:
        # tansu's object store reads the AWS_* names, and where S3 is (AWS_ENDPOINT) and
        # that plain HTTP is fine.
        client = {k: v for k, v in s3.env.items() if k.startswith("AWS_")}
        client |= {"AWS_ENDPOINT": s3.endpoint_url, "AWS_ALLOW_HTTP": "true"}
        super().__init__(log_dir=log_dir, storage=f"s3://{bucket}/", storage_env=client)
        self.s3 = s3
        self.bucket = bucket

    def delete_records_before(self, topic: str, partition: int, offset: int) -> int:
        """Delete the record batches of a partition that begin below ``offset`` and move
        its log start there; answers how many batches went. ``offset`` must begin a batch
        (one record each, as ``produce`` sends them one send at a time)."""
        folder = f"/topics/{topic}/partitions/{partition:010d}/"
        with contextlib.closing(s3_client(self.s3.endpoint_url)) as client:
            keys = [
                item["Key"]
                for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket)
                for item in page.get("Contents", [])
                if folder in item["Key"]
            ]
            (watermark,) = [k for k in keys if k.endswith(folder + "watermark.json")]
            batches = {
                k: int(k.rsplit("/", 1)[1].split(".", 1)[0]) for k in keys if "/records/" in k
            }
            if offset not in batches.values():
                raise ValueError(f"no batch of {topic}:{partition} begins at {offset}")
            doomed = [k for k, base in batches.items() if base < offset]
            for key in doomed:
                client.delete_object(Bucket=self.bucket, Key=key)
            mark = json.loads(client.get_object(Bucket=self.bucket, Key=watermark)["Body"].read())
            mark["low"] = offset
            client.put_object(Bucket=self.bucket, Key=watermark, Body=json.dumps(mark).encode())
        return len(doomed)
