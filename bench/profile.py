"""Where a worker's CPU goes: a py-spy profile (collapsed stacks) summed by library.

py-spy samples every thread of the worker's main process and of its children (the pool)
100 times a second, idle threads left out, so a sample is CPU time spent in that stack.
Each sample is put in one category by its innermost frame that belongs to a known
library ("self" view: json called from structlog is json), and counted once for every
category that appears anywhere on its stack ("inclusive" view).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

# (category, pattern on a frame's file path or name); the first match wins, inner first.
CATEGORIES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        (
            "kernel: worker/images/kernel.py + Pillow",
            r"[(/]worker/(image|quality|exif)\.py|[(/]PIL/",
        ),
        ("pickling / pool IPC", r"multiprocessing/|concurrent/futures/|pickle|_posixsubprocess"),
        ("aiokafka", r"[(/]aiokafka/|[(/]kafka/"),
        ("redis", r"[(/]redis/"),
        ("aioboto3 / botocore (S3)", r"[(/](aiobotocore|botocore|aioboto3|boto3|s3transfer)/"),
        ("aiohttp (fetch)", r"[(/]aiohttp/|[(/]yarl/|[(/]multidict/|[(/]aiohappyeyeballs/"),
        ("json", r"[(/]json/"),
        ("structlog (logging)", r"[(/]structlog/|[(/]logging/"),
        ("ssl / hashing", r"[(/]ssl\.py|hashlib|hmac"),
        ("asyncio event loop", r"[(/]asyncio/|selectors\.py"),
        ("worker's own code", r"[(/]worker/|[(/]image_crawler/"),
    )
)

_PROCESS = re.compile(r"^process (\d+):")


# Innermost frames of a thread that waits (py-spy's idle detection misses some of these
# when it samples without pausing the process): not CPU, left out of the percentages.
IDLE = re.compile(
    r"^(_PollLikeSelector\.select|EpollSelector\.select|select) \(selectors\.py|"
    r"^(Condition|Event|Semaphore)\.wait \(threading\.py|^sleep \("
)


def _category(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, pattern in CATEGORIES:
            if pattern.search(frame):
                return name
    return "other"


def summarise(path: Path, main_pid: int, top: int = 25) -> dict[str, Any]:
    """Percentages by category for the main process (``main_pid``) and for its children
    (the image pool), and the top innermost frames."""
    by_role: dict[str, Counter[str]] = {"main": Counter(), "pool": Counter()}
    inclusive: dict[str, Counter[str]] = {"main": Counter(), "pool": Counter()}
    leaves: dict[str, Counter[str]] = {"main": Counter(), "pool": Counter()}
    idle: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        # With --subprocesses each stack starts with the chain of processes from the
        # profiled one down to the sampled one.
        processes = [f for f in frames if _PROCESS.match(f)]
        role = (
            "pool" if processes and not processes[-1].startswith(f"process {main_pid}:") else "main"
        )
        frames = frames[len(processes) :]
        if frames and IDLE.search(frames[-1]):
            idle[role] += count
            continue
        by_role[role][_category(frames)] += count
        for name in {_category([f]) for f in frames}:
            inclusive[role][name] += count
        if frames:
            leaves[role][frames[-1]] += count
    return {
        role: {
            "samples": sum(counts.values()),
            "idle_samples_left_out": idle[role],
            "self_percent": _percent(counts),
            "inclusive_percent": _percent(inclusive[role], total=sum(counts.values())),
            "top_leaf_frames_percent": _percent(leaves[role], top=top, total=sum(counts.values())),
        }
        for role, counts in by_role.items()
    } | {"raw": str(path)}


def _percent(counts: Counter[str], *, top: int | None = None, total: int | None = None) -> dict:
    total = total or sum(counts.values()) or 1
    return {name: round(100 * n / total, 1) for name, n in counts.most_common(top)}
