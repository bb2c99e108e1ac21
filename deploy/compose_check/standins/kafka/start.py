"""The Kafka stand-in's entry point: apache/kafka's settings, run by tansu.

Reads the compose file's ``KAFKA_LISTENERS`` and ``KAFKA_ADVERTISED_LISTENERS`` (the
PLAINTEXT listener: where to listen, what to advertise), ``KAFKA_LOG_DIRS`` and
``CLUSTER_ID``. tansu has one listener, so the EXTERNAL one (for producers on the host) is
not served, and it has no per-topic configuration: the other ``KAFKA_*`` settings are
named once on stderr and not applied. Its log is kept in S3: a private SeaweedFS, started
here on loopback ports of its own, stores it under the log folder.

Stays PID 1: forwards SIGTERM to tansu, then stops SeaweedFS once tansu has exited, and
exits with tansu's status; if either dies, the other is stopped too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

# SeaweedFS's own ports, away from the seaweedfs service's (9333, 8080, 8888, 8333 and
# their gRPC ports, 10000 above): both share the host's network in the check.
WEED_PORTS = {"master": 9433, "volume": 8180, "filer": 8988, "s3": 8433}
BUCKET = "tansu"
APPLIED = {"KAFKA_LISTENERS", "KAFKA_ADVERTISED_LISTENERS", "KAFKA_LOG_DIRS"}
START_TIMEOUT_S = 60.0


def say(message: str) -> None:
    print(f"kafka-standin: {message}", file=sys.stderr, flush=True)


def plaintext(listeners: str, default: str) -> tuple[str, int]:
    """(host, port) of the PLAINTEXT listener in a KAFKA_*LISTENERS value."""
    for listener in filter(None, (part.strip() for part in listeners.split(","))):
        name, _, address = listener.partition("://")
        if name == "PLAINTEXT":
            parts = urlsplit(f"tcp://{address}")
            return parts.hostname or default, parts.port or 9092
    raise SystemExit(f"kafka-standin: no PLAINTEXT listener in {listeners!r}")


def start_weed(folder: str) -> subprocess.Popen[bytes]:
    """SeaweedFS on its own ports, logging to weed.log beside its data (one start's log)."""
    os.makedirs(folder, exist_ok=True)
    log = open(os.path.join(folder, "weed.log"), "wb")  # noqa: SIM115 (the child keeps it)
    return subprocess.Popen(
        [
            "weed",
            "server",
            f"-dir={folder}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={WEED_PORTS['master']}",
            f"-volume.port={WEED_PORTS['volume']}",
            f"-filer.port={WEED_PORTS['filer']}",
            "-volume.max=0",
            "-master.volumeSizeLimitMB=1024",
            "-volume.index=leveldb",
            "-s3",
            f"-s3.port={WEED_PORTS['s3']}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            # No usage report to seaweedfs.com: the check's traffic stays on loopback.
            "-master.telemetry=false",
        ],
        stdout=log,
        stderr=log,
    )


def wait_for_bucket(endpoint: str, weed: subprocess.Popen[bytes]) -> None:
    """Wait for the S3 gateway, then make the bucket (an existing one is fine)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if weed.poll() is not None:
            raise SystemExit(
                f"kafka-standin: SeaweedFS exited with {weed.returncode} (see weed.log)"
            )
        try:
            urllib.request.urlopen(f"{endpoint}/healthz", timeout=2).close()
            request = urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT")
            try:
                urllib.request.urlopen(request, timeout=5).close()
            except urllib.error.HTTPError as error:
                if error.code != 409:  # BucketAlreadyExists / OwnedByYou
                    raise
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit("kafka-standin: SeaweedFS did not start in time") from None
            time.sleep(0.5)


def start_tansu(
    env: os._Environ[str], listen: tuple[str, int], advertised: tuple[str, int], endpoint: str
) -> subprocess.Popen[bytes]:
    """tansu on ``listen``, advertising ``advertised``, its log in ``endpoint``'s bucket."""
    return subprocess.Popen(
        [
            "tansu",
            "broker",
            "--cluster-id",
            env.get("CLUSTER_ID", "tansu_cluster"),
            "--listener-url",
            f"tcp://{listen[0]}:{listen[1]}",
            "--advertised-listener-url",
            f"tcp://{advertised[0]}:{advertised[1]}",
            "--storage-engine",
            f"s3://{BUCKET}/",
        ],
        # tansu's object store: where S3 is, that plain HTTP is fine, and keys (the
        # private SeaweedFS has no identities, so any will do).
        env={
            **env,
            "AWS_ENDPOINT": endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": "tansu",
            "AWS_SECRET_ACCESS_KEY": "tansu",
            "AWS_DEFAULT_REGION": "us-east-1",
        },
    )


def main() -> int:
    env = os.environ
    folder = env.get("KAFKA_LOG_DIRS", "/var/lib/kafka/data").split(",")[0]
    listen = plaintext(env.get("KAFKA_LISTENERS", "PLAINTEXT://:9092"), "0.0.0.0")
    advertised = plaintext(env.get("KAFKA_ADVERTISED_LISTENERS", "PLAINTEXT://:9092"), "localhost")
    ignored = sorted(name for name in env if name.startswith("KAFKA_") and name not in APPLIED)
    if ignored:
        say("not applied by tansu: " + ", ".join(ignored))

    endpoint = f"http://127.0.0.1:{WEED_PORTS['s3']}"
    weed = start_weed(os.path.join(folder, "objects"))
    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        wait_for_bucket(endpoint, weed)
        tansu = start_tansu(env, listen, advertised, endpoint)
        while not stopping and tansu.poll() is None and weed.poll() is None:
            time.sleep(0.2)
        if tansu.poll() is None:
            tansu.terminate()
        code = tansu.wait()
        if weed.poll() is not None and not stopping:
            say(f"SeaweedFS exited with {weed.returncode}")
            code = code or 1
        return code if not stopping else 0
    finally:
        if weed.poll() is None:
            weed.terminate()
            try:
                weed.wait(timeout=10)
            except subprocess.TimeoutExpired:
                weed.kill()


if __name__ == "__main__":
    sys.exit(main())
