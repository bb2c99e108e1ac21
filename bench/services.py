"""The benchmark's own services: the image origin and the S3 sink, each its own process."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.origin import host_addresses
from crawlctl.localstack.services import LOOPBACK, Service
from test.harness.services import (
    S3_ACCESS_KEY_ID,
    S3_REGION,
    S3_SECRET_ACCESS_KEY,
    S3Server,
    list_keys,
)

ROOT = Path(__file__).resolve().parent.parent


class _BenchModule(Service):
    """``python -m bench.MODULE ARGS... PORT``, answering ``GET probe_path``."""

    module = ""
    probe_path = "/"

    def _args(self) -> list[str]:
        return []

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def _command(self) -> list[str]:
        return [sys.executable, "-m", self.module, *self._args(), str(self.port)]

    def _env(self) -> Mapping[str, str]:
        return {**os.environ, "PYTHONPATH": str(ROOT)}

    def _probe(self) -> bool:
        with urllib.request.urlopen(f"{self.url}{self.probe_path}", timeout=1.0) as response:
            return bool(response.read())


class Origin(_BenchModule):
    """``bench.origin``: the corpus (or only its files of ``kind``) over HTTP from memory;
    with ``hosts``, also on that many more loopback addresses, each with a robots.txt
    Crawl-delay of ``crawl_delay_s`` (``host_urls``); with ``tail_zone``, every host name
    of that DNS zone as a site with a robots.txt of its own (``bench.tail_hosts``)."""

    name = "origin"
    module = "bench.origin"
    probe_path = "/health"
    start_timeout_s = 60.0  # reads a few hundred MB first

    def __init__(
        self,
        corpus_dir: Path,
        log_dir: Path,
        kind: str | None = None,
        opt_outs: bool = False,
        hosts: int = 0,
        crawl_delay_s: float = 1.0,
        tail_zone: str = "",
    ) -> None:
        if kind is not None:
            self.name = f"origin-{kind}"  # its own log file, next to the full origin's
        super().__init__(log_dir=log_dir)
        self.corpus_dir = corpus_dir
        self.kind = kind
        self.opt_outs = opt_outs
        self.hosts = hosts
        self.crawl_delay_s = crawl_delay_s
        self.tail_zone = tail_zone

    @property
    def host_urls(self) -> tuple[str, ...]:
        """The base URL of each Crawl-delayed host (the port is known once started)."""
        return tuple(f"http://{a}:{self.port}" for a in host_addresses(self.hosts))

    def _args(self) -> list[str]:
        return [
            str(self.corpus_dir),
            *(["--kind", self.kind] if self.kind else []),
            *(["--opt-outs"] if self.opt_outs else []),
            *(self._host_args() if self.hosts else []),
            *(["--tail-zone", self.tail_zone] if self.tail_zone else []),
        ]

    def _host_args(self) -> list[str]:
        return ["--hosts", str(self.hosts), "--crawl-delay", str(self.crawl_delay_s)]


def origin_stats(origin_url: str) -> dict[str, Any]:
    """What the origin at ``origin_url`` was asked so far (``bench.origin.Requests``)."""
    with urllib.request.urlopen(f"{origin_url}/_stats", timeout=10.0) as response:
        return dict(json.loads(response.read()))


class S3Sink(_BenchModule):
    """``bench.s3sink``: S3 PUTs answered and counted, nothing kept."""

    name = "s3sink"
    module = "bench.s3sink"
    probe_path = "/_stats"

    @property
    def endpoint_url(self) -> str:
        return self.url

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": S3_SECRET_ACCESS_KEY,
            "AWS_DEFAULT_REGION": S3_REGION,
            "S3_ENDPOINT_URL": self.endpoint_url,
        }

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/_stats", timeout=10.0) as response:
            return dict(json.loads(response.read()))


def s3_service(kind: str, log_dir: Path) -> S3Server | S3Sink:
    if kind == "moto":
        return S3Server(log_dir=log_dir)
    if kind == "sink":
        return S3Sink(log_dir=log_dir)
    raise ValueError(f"--s3 must be moto or sink, not {kind!r}")


def thumbnails_stored(s3: S3Server | S3Sink, bucket: str) -> dict[str, Any]:
    """How many thumbnails the S3 service holds (moto) or was sent (sink)."""
    if isinstance(s3, S3Sink):
        stats = s3.stats()
        return {"objects": stats["objects"], "bytes": stats["bytes"], "not_jpeg": stats["not_jpeg"]}
    return {"objects": len(list_keys(s3.endpoint_url, bucket))}
