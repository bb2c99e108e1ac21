"""``python -m bench.dedup [--hashes N]``: the deduplication index at catalog scale.

Loads N random 64-bit hashes (32 bits set each, as imagehash's pHash) as canonicals in
one bulk load, with ``--planted`` near-duplicates of random ones at 0-4 bits; checks that
every planted copy finds its original; then places ``--place`` more images through the
stage's placement (dedup/placement.py) on one core, alone and in batches of each of
``--batches``, past ``--recent`` canonicals not yet in the tables (a steady crawl's
average), and reports the memory (the process's resident set, /proc/self/status)
per hash, the placements a second and each placement's p99 (in a batch, the batch's:
its answer comes with the others'); then times a merge of the tables (one every
MERGE_AT new canonicals, which the placements above are too few to meet) and spreads it
over the placements as a sustained rate. Writes ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from dedup.index import RECORD, NearIndex
from dedup.placement import Image, Placer
from dedup.tables import MERGE_AT

RESULTS = Path(__file__).with_name("results")


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def random_hashes(rng: np.random.Generator, n: int) -> np.ndarray:
    """n hashes of 32 set bits each, as (n, 8) bytes, most significant first."""
    out = np.empty((n, 8), dtype=np.uint8)
    chunk = 1 << 20
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        keys = rng.random((m, 64))
        bits = keys < np.median(keys, axis=1, keepdims=True)  # 32 of 64 per row
        out[start : start + m] = np.packbits(bits, axis=1)
    return out


def flipped(rng: np.random.Generator, codes: np.ndarray, distances: np.ndarray) -> np.ndarray:
    bits = np.unpackbits(codes, axis=1)
    for row, d in enumerate(distances):
        which = rng.choice(64, size=int(d), replace=False)
        bits[row, which] ^= 1
    return np.packbits(bits, axis=1)


def load(n: int, rng: np.random.Generator) -> tuple[NearIndex, np.ndarray, float]:
    records = np.zeros(n, dtype=RECORD)
    records["phash"] = random_hashes(rng, n)
    records["identifier"] = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
    records["aspect"] = 1.5
    records["sha"] = rng.integers(0, 2**32, size=n, dtype=np.uint32)
    started = time.perf_counter()
    index = NearIndex.of_records(4, ["bench"], records)
    return index, records["phash"].copy(), time.perf_counter() - started


def check_planted(
    index: NearIndex, codes: np.ndarray, planted: int, rng: np.random.Generator
) -> dict[str, Any]:
    rows = rng.choice(len(codes), size=planted, replace=False)
    distances = rng.integers(0, 5, size=planted)
    copies = flipped(rng, codes[rows], distances)
    found = index.within([c.tobytes().hex() for c in copies])
    missed = sum(
        1
        for row, d, hits in zip(rows, distances, found, strict=True)
        if (int(row), int(d)) not in hits
    )
    return {"planted": planted, "missed": missed, "by_distance": np.bincount(distances).tolist()}


def images_of(rng: np.random.Generator, codes: np.ndarray) -> list[Image]:
    return [
        Image(str(uuid.UUID(bytes=rng.bytes(16))), "bench", 1500, 1000, "0" * 64, c.tobytes().hex())
        for c in codes
    ]


def place(
    placer: Placer, rng: np.random.Generator, count: int, batches: list[int]
) -> dict[str, Any]:
    """``count`` more images placed: a fifth alone, the rest shared among the batch sizes.
    A placement in a batch is answered when its batch is: its latency is the batch's."""
    images = images_of(rng, random_hashes(rng, count))
    alone = count // 5
    latencies = []
    started = time.perf_counter()
    for one in images[:alone]:
        t = time.perf_counter()
        placer.place([one])
        latencies.append(time.perf_counter() - t)
    alone_s = time.perf_counter() - started
    result: dict[str, Any] = {
        "alone_per_s": alone / alone_s,
        "alone_p50_ms": float(np.percentile(latencies, 50) * 1000),
        "alone_p99_ms": float(np.percentile(latencies, 99) * 1000),
        "batched": [],
    }
    share = (count - alone) // len(batches)
    for n, batch in enumerate(batches):
        mine = images[alone + n * share : alone + (n + 1) * share]
        times = []
        for start in range(0, len(mine), batch):
            t = time.perf_counter()
            placer.place(mine[start : start + batch])
            times.append(time.perf_counter() - t)
        result["batched"].append(
            {
                "batch": batch,
                "images": len(mine),
                "per_s": len(mine) / sum(times),
                "batch_p50_ms": float(np.percentile(times, 50) * 1000),
                "batch_p99_ms": float(np.percentile(times, 99) * 1000),
            }
        )
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dedup", description=__doc__)
    parser.add_argument("--hashes", type=int, default=100_000_000)
    parser.add_argument("--planted", type=int, default=10_000)
    parser.add_argument("--place", type=int, default=200_000)
    parser.add_argument("--batches", default="100,200,500", help="batch sizes, comma separated")
    parser.add_argument(
        "--recent",
        type=int,
        default=None,
        help="canonicals added past the tables before placing (default: so many that the"
        " placements meet half of MERGE_AT on the average, as a steady crawl does)",
    )
    parser.add_argument("--seed", type=int, default=54)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    rng = np.random.default_rng(args.seed)
    before = rss_bytes()
    index, codes, load_s = load(args.hashes, rng)
    planted = check_planted(index, codes, args.planted, rng)
    del codes
    loaded = rss_bytes()
    result: dict[str, Any] = {
        "hashes": args.hashes,
        "load_s": load_s,
        "rss_bytes": loaded,
        "bytes_per_hash": (loaded - before) / args.hashes,
        "planted": planted,
    }
    batches = [int(b) for b in args.batches.split(",")]
    # A steady crawl meets the recent rows (those past the tables) anywhere from none to
    # MERGE_AT, half of that on the average: so many added first that the placements'
    # middle meets that half.
    recent = max(0, MERGE_AT // 2 - args.place // 2) if args.recent is None else args.recent
    placer = Placer(index)
    for start in range(0, recent, 10_000):
        for image in images_of(rng, random_hashes(rng, min(10_000, recent - start))):
            placer.keep(image)
    result["recent_before_placing"] = recent
    result["placing"] = place(placer, rng, args.place, batches)
    # The tables take the recent rows every MERGE_AT canonicals, moving every old row:
    # a cost the placements above never met (they are fewer), timed here and spread.
    started = time.perf_counter()
    index.merge()
    merge_s = time.perf_counter() - started
    result["merge"] = {"seconds": merge_s, "every": MERGE_AT, "rows": len(index)}
    for row in result["placing"]["batched"]:
        row["sustained_per_s"] = 1 / (1 / row["per_s"] + merge_s / MERGE_AT)
    result["rss_after_placing_bytes"] = rss_bytes()
    print(json.dumps(result, indent=1))
    out = args.out or RESULTS / f"dedup-{args.hashes}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
