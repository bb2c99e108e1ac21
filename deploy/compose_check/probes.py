"""What the check asks the running stack from the host: S3 with each set of keys,
Prometheus's targets, and which addresses the stack's processes use."""

from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import re
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import botocore.session
from botocore.config import Config
from botocore.exceptions import ClientError
from PIL import Image

from deploy.compose_check.engine import CheckError

S3_ENDPOINT = "http://127.0.0.1:8333"
PROMETHEUS = "http://127.0.0.1:9090"
MONITOR = "http://127.0.0.1:9100"
THUMBNAIL_MAX_PX = 640
# Every port the stack listens on in the check (the compose file's, with SeaweedFS's
# master, volume, filer and gRPC ports, and the Kafka stand-in's private SeaweedFS).
STACK_PORTS = (
    9092,  # Kafka
    6379,  # Redis
    8333, 9333, 8080, 8888, 18333, 19333, 18080, 18888,  # SeaweedFS
    8433, 9433, 8180, 8988, 18433, 19433, 18180, 18988,  # the Kafka stand-in's store
    9100, 9101, 9102, 9103,  # the monitor, the workers
    9104,  # the deduplication stage
    9090,  # Prometheus
)  # fmt: skip


def ports_in_use(ports: Iterable[int] = STACK_PORTS) -> list[int]:
    """The ports of ``ports`` that something on 127.0.0.1 already listens on."""
    taken = []
    for port in ports:
        with socket.socket() as probe:
            probe.settimeout(0.5)
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                taken.append(port)
    return taken


def s3_client(access_key: str, secret_key: str) -> Any:
    return botocore.session.get_session().create_client(
        "s3",
        endpoint_url=S3_ENDPOINT,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}),
    )


def thumbnails(client: Any, bucket: str, uuids: Iterable[str]) -> int:
    """Read back every ``{uuid}.jpg``: each must be a JPEG within 640x640; how many."""
    count = 0
    for identifier in uuids:
        body = client.get_object(Bucket=bucket, Key=f"{identifier}.jpg")["Body"].read()
        with Image.open(io.BytesIO(body)) as image:
            if image.format != "JPEG" or max(image.size) > THUMBNAIL_MAX_PX:
                raise CheckError(f"{identifier}.jpg is a {image.format} of {image.size}")
        count += 1
    return count


def refused(call: Any, **kwargs: Any) -> str:
    """The error code of a call the S3 server must refuse; CheckError when it does not."""
    try:
        call(**kwargs)
    except ClientError as error:
        return str(error.response["Error"]["Code"])
    raise CheckError(f"S3 allowed {call.__name__}({kwargs}) with the crawler's keys")


def crawler_key_limits(crawler: Any, admin: Any, bucket: str, other_bucket: str) -> dict[str, str]:
    """What the crawler's keys may not do, each with the code the server answered: create
    or delete a bucket, list or read another bucket (made and filled with the admin's)."""
    with contextlib.suppress(ClientError):
        admin.create_bucket(Bucket=other_bucket)
    admin.put_object(Bucket=other_bucket, Key="private.txt", Body=b"not the crawler's")
    return {
        "create bucket": refused(crawler.create_bucket, Bucket="made-by-the-crawler"),
        "delete bucket": refused(crawler.delete_bucket, Bucket=bucket),
        "list another bucket": refused(crawler.list_objects_v2, Bucket=other_bucket),
        "read another bucket": refused(crawler.get_object, Bucket=other_bucket, Key="private.txt"),
    }


def prometheus_up() -> dict[str, list[tuple[str, float]]]:
    """``up`` per job from Prometheus's HTTP API: job -> [(instance, value)]."""
    query = urllib.parse.urlencode({"query": "up"})
    with urllib.request.urlopen(f"{PROMETHEUS}/api/v1/query?{query}", timeout=5) as answer:
        result = json.load(answer)["data"]["result"]
    jobs: dict[str, list[tuple[str, float]]] = {}
    for series in result:
        labels = series["metric"]
        jobs.setdefault(labels["job"], []).append((labels["instance"], float(series["value"][1])))
    return {job: sorted(targets) for job, targets in jobs.items()}


def wait_for_targets(
    expected: Mapping[str, int], timeout_s: float
) -> dict[str, list[tuple[str, float]]]:
    """Wait until each job has ``expected[job]`` targets, every one up (1)."""
    deadline = time.monotonic() + timeout_s
    jobs: dict[str, list[tuple[str, float]]] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, KeyError):
            jobs = prometheus_up()
            if all(
                len(jobs.get(job, [])) == count and all(v == 1 for _, v in jobs[job])
                for job, count in expected.items()
            ):
                return jobs
        time.sleep(2.0)
    raise CheckError(f"Prometheus's targets are not all up: {jobs} (expected {dict(expected)})")


_PID = re.compile(r"pid=(\d+)")


def off_loopback(pids: Iterable[int]) -> tuple[int, list[str]]:
    """``sockets_off_loopback`` of every TCP and UDP socket on the machine (``ss``)."""
    listing = subprocess.run(["ss", "-H", "-tuanp"], capture_output=True, text=True, check=True)
    return sockets_off_loopback(listing.stdout.splitlines(), pids)


def sockets_off_loopback(ss_lines: Iterable[str], pids: Iterable[int]) -> tuple[int, list[str]]:
    """(how many of the sockets in ``ss -H -tuanp``'s lines processes ``pids`` hold, the
    lines of those whose local or remote address is outside 127.0.0.0/8 and ::1); the
    wildcard peer of a listening or unconnected socket does not count."""
    pids = set(pids)
    wrong = []
    checked = 0
    for line in ss_lines:
        fields = line.split()
        owners = {int(pid) for pid in _PID.findall(line)}
        if len(fields) < 6 or not owners & pids:
            continue
        checked += 1
        state, local, peer = fields[1], fields[4], fields[5]
        addresses = [local] if state in ("LISTEN", "UNCONN") else [local, peer]
        if not all(_on_loopback(address) for address in addresses):
            wrong.append(line)
    return checked, wrong


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``condition`` (an OSError counts as False) until it holds; CheckError after
    ``timeout_s`` naming ``what`` was waited for."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError):
            if condition():
                return
        if time.monotonic() > deadline:
            raise CheckError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(1.0)


def monitor_metric(name: str, **labels: str) -> float | None:
    """A sample of the monitor's /metrics (127.0.0.1:9100), or None when it has none."""
    wanted = name + (
        "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else ""
    )
    with urllib.request.urlopen(f"{MONITOR}/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            sample, _, value = line.rpartition(" ")
            if sample == wanted:
                return float(value)
    return None


def _on_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]").split("%")[0]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # "*" or 0.0.0.0-like wildcards are every interface
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback
