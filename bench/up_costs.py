"""What ``image-crawler up`` costs: start and stop times, memory idle and holding a
queue, ``produce`` throughput, and the data folder's size.

``python -m bench.up_costs --urls 1000000`` runs ``up`` (one worker) on a new data
folder, as an operator does (the console script, a subprocess), with its one source
halted so that nothing is crawled and the whole queue stays in the broker:

1. the start: from the command to its banner;
2. memory when idle: the resident memory of ``up`` and every process it started,
   summed, after ``--settle`` seconds;
3. ``image-crawler produce`` of ``--urls`` URLs from a JSON Lines file (every
   acknowledgement awaited): its wall time and URLs/s;
4. memory holding the queue, once the monitor has split it all;
5. a clean stop (SIGINT): its wall time, and the data folder's size after it;
6. a start again on the same folder with the queue in it, and the URLs it finds queued.

Run it from another checkout (``--tree``) to measure an earlier version the same way:
the script only drives the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.procstats import ProcessTree

SOURCE = "upcosts"
HALTED_SET = "halted"


def rss_by_program(pid: int) -> dict[str, int]:
    """Resident bytes per program of ``pid``'s tree (``weed``, ``tansu...``, ``-m worker``;
    shared pages counted in each process)."""
    try:
        processes = ProcessTree(pid).processes()
    except psutil.NoSuchProcess:
        return {}
    by: dict[str, int] = {}
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            command = process.cmdline()
            name = Path(command[0]).name if command else process.name()
            if name.startswith("python"):
                name = " ".join(command[1:3])  # -m worker, -m crawl_monitor...
            by[name] = by.get(name, 0) + process.memory_info().rss
    return dict(sorted(by.items()))


def memory_figures(pid: int, prefix: str) -> dict[str, Any]:
    """``{prefix}_rss_mib`` of the whole tree, and per program."""
    by = rss_by_program(pid)
    return {
        f"{prefix}_rss_mib": round(sum(by.values()) / 2**20),
        f"{prefix}_rss_mib_by_program": {name: round(b / 2**20) for name, b in by.items()},
    }


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


class Up:
    """``image-crawler up`` from ``tree``, its stdout and stderr in ``log``."""

    def __init__(self, tree: Path, data: Path, sources: Path, log: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(tree), SHUTDOWN_GRACE_S="1")
        for name in ("KAFKA_HOSTS", "REDIS_URL", "SOURCES_FILE"):
            env.pop(name, None)
        self.log = log
        self.started_at = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "crawlctl", "up", "--workers", "1", "--data-dir", str(data),
             "--sources-file", str(sources)],
            cwd=tree, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
        )  # fmt: skip

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"up exited {self.process.returncode}: see {self.log}")
            found = re.search(pattern, self.log.read_text(), re.MULTILINE)
            if found:
                return found
            time.sleep(0.05)
        raise SystemExit(f"no {pattern!r} in {self.log} after {timeout_s:g} s")

    def stop(self) -> float:
        started = time.monotonic()
        self.process.send_signal(signal.SIGINT)
        self.process.wait(600)
        return time.monotonic() - started


def redis_cli(url: str, *args: str) -> str:
    from redis import Redis

    client = Redis.from_url(url, decode_responses=True)
    try:
        return str(client.execute_command(*args))
    finally:
        client.close()


def queued(url: str) -> int:
    """URLs the monitor split into source queues (its ``num_split`` counter)."""
    from redis import Redis

    client = Redis.from_url(url, decode_responses=True)
    try:
        return int(client.get("num_split") or 0)
    finally:
        client.close()


def wait_split(url: str, count: int, timeout_s: float) -> float:
    started = time.monotonic()
    while queued(url) < count:
        if time.monotonic() - started > timeout_s:
            raise SystemExit(f"only {queued(url):,} of {count:,} URLs split in {timeout_s:g} s")
        time.sleep(0.5)
    return time.monotonic() - started


def measure(tree: Path, work: Path, urls: int, settle_s: float) -> dict[str, Any]:
    sources = work / "sources.json"
    sources.write_text(json.dumps([{"source_name": SOURCE, "image_count": 1_000_000}]))
    feed = work / "urls.jsonl"
    with feed.open("w") as f:
        for i in range(urls):
            f.write(json.dumps({"url": f"http://127.0.0.1:9/{i}.jpg", "uuid": f"u{i}"}) + "\n")
    data = work / "data"
    figures: dict[str, Any] = {"tree": str(tree), "urls": urls}

    up = Up(tree, data, sources, work / "up-1.log")
    banner = up.wait_for(r"^\s+redis\s+(redis://\S+)", 120)
    figures["start_s"] = round(time.monotonic() - up.started_at, 2)
    broker = up.wait_for(r"^\s+broker\s+(\S+)", 1).group(1)
    redis_url = banner.group(1)
    redis_cli(redis_url, "SADD", HALTED_SET, SOURCE)
    time.sleep(settle_s)
    figures |= memory_figures(up.process.pid, "idle")

    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "crawlctl", "produce", "--kafka", broker, "--source", SOURCE,
         str(feed)],
        cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)), check=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    produce_s = time.monotonic() - started
    figures["produce_s"] = round(produce_s, 1)
    figures["produce_urls_per_s"] = round(urls / produce_s)
    figures["split_after_produce_s"] = round(wait_split(redis_url, urls, 1800), 1)
    time.sleep(settle_s)
    figures |= memory_figures(up.process.pid, "queue")
    figures["stop_s"] = round(up.stop(), 1)
    figures["data_mib"] = round(folder_bytes(data) / 2**20, 1)

    again = Up(tree, data, sources, work / "up-2.log")
    again.wait_for(r"^\s+redis\s+(redis://\S+)", 1800)
    figures["restart_s"] = round(time.monotonic() - again.started_at, 2)
    restored = re.search(r"restored ([\d,]+) queued URLs", (work / "up-2.log").read_text())
    figures["restored_from_spool"] = int(restored.group(1).replace(",", "")) if restored else 0
    figures["second_stop_s"] = round(again.stop(), 1)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", type=int, default=1_000_000)
    parser.add_argument("--settle", type=float, default=10.0, help="seconds before memory")
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--work", default=None, help="folder (default: a new temporary one)")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="up-costs-"))
    work.mkdir(parents=True, exist_ok=True)
    print(json.dumps(measure(Path(args.tree), work, args.urls, args.settle), indent=1))


if __name__ == "__main__":
    main()
