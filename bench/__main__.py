"""``python -m bench``: the crawler's benchmark (see bench/README.md).

Builds (or reuses) the corpus, times the image kernel, starts the origin, runs one crawl
per ``--sources`` count on a fresh local stack, times the monitor's loop, then prints a
table and writes ``--out`` (JSON) and the same table as markdown next to it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import logging
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

import structlog
from PIL import features

from bench.corpus import DEFAULT_DIR, Corpus, ensure_corpus
from bench.crawl import RunConfig, run_crawl
from bench.kernel import measure_kernel
from bench.monitor_loop import measure_monitor
from bench.report import render_markdown, render_text, verdicts
from bench.services import ROOT, Origin
from worker.settings import WorkerSettings


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--images", type=int, default=10_000, help="images per crawl")
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    parser.add_argument(
        "--image-processes",
        type=int,
        default=0,
        help="pool processes per worker (0: one per CPU, the default)",
    )
    parser.add_argument(
        "--sources", default="1", help="comma-separated source counts, one crawl each (e.g. 1,1000)"
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=0,
        help="partitions per source topic (0: 4 for one source, else 1)",
    )
    parser.add_argument(
        "--s3",
        choices=("sink", "moto"),
        default="sink",
        help="where thumbnails go: bench.s3sink (default) or moto",
    )
    parser.add_argument(
        "--max-tasks",
        type=int,
        default=WorkerSettings().max_tasks,
        help="MAX_TASKS of each worker (default: the worker's)",
    )
    parser.add_argument(
        "--rate", type=float, default=100_000.0, help="override_rate of every source, requests/s"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=64,
        help="images crawled before measuring (at least one per partition)",
    )
    parser.add_argument(
        "--timeout", type=float, default=0.0, help="deadline of a crawl in s (0: 600 + images / 5)"
    )
    parser.add_argument("--corpus-files", type=int, default=300)
    parser.add_argument("--corpus-dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument(
        "--photos", type=Path, default=None, help="a folder with the photographs already unpacked"
    )
    parser.add_argument("--kernel-rounds", type=int, default=2)
    parser.add_argument(
        "--monitor-sources",
        default="1000,10000",
        help="source counts of the monitor loop ('' to skip)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the first worker (main + pool) during each crawl",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "latest.json")
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="service and worker logs (default: a new temporary folder)",
    )
    return parser.parse_args(argv)


def _machine() -> dict[str, Any]:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "pillow": features.version("PIL"),
        "libjpeg_turbo": features.check_feature("libjpeg_turbo"),
        "platform": platform.platform(),
    }


def _kernel(corpus: Corpus, rounds: int) -> dict[str, Any]:
    bodies = corpus.bodies()  # read again each time: not held in memory during a crawl
    print(f"kernel: {rounds} rounds over {len(bodies)} bodies", file=sys.stderr)
    return measure_kernel(bodies, rounds=rounds)


def _quiet_logs() -> None:
    # The monitor's regulator runs in this process for the loop measurement: its halts
    # of the seeded failing sources are expected, not news.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    logging.basicConfig(level=logging.ERROR)


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="bench-"))
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    machine = _machine()
    print(f"logs in {log_dir}", file=sys.stderr)
    corpus = ensure_corpus(args.corpus_dir, args.corpus_files, args.photos)
    print(f"corpus: {corpus.summary()}", file=sys.stderr)
    # The kernel is measured before each crawl and after the last, and each crawl is
    # compared with the mean of the two measurements around it: the machine's speed
    # drifts over minutes (19.1, 18.4 and 17.8 ms within 15 minutes).
    kernels = [_kernel(corpus, args.kernel_rounds)]
    runs = []
    with Origin(corpus.directory, log_dir) as origin:
        for count in [int(s) for s in args.sources.split(",") if s.strip()]:
            partitions = args.partitions or (4 if count == 1 else 1)
            config = RunConfig(
                images=args.images,
                workers=args.workers,
                image_processes=args.image_processes,
                sources=count,
                partitions=partitions,
                max_tasks=args.max_tasks,
                rate_rps=args.rate,
                warmup=args.warmup,
                timeout_s=args.timeout or 600 + args.images / 5,
                profile=args.profile,
                s3=args.s3,
                log_dir=log_dir / f"run-{count}-sources",
            )
            print(f"crawl: {count} source(s), {args.images} images", file=sys.stderr)
            run = await run_crawl(config, origin.url, len(corpus.files))
            kernels.append(_kernel(corpus, args.kernel_rounds))
            around = (kernels[-2]["cpu_s_per_image"], kernels[-1]["cpu_s_per_image"])
            run["kernel_cpu_s_per_image_around"] = list(around)
            run["kernel_cpu_s_per_image"] = sum(around) / 2
            runs.append(run)
    monitor_sizes = [int(s) for s in args.monitor_sources.split(",") if s.strip()]
    print(f"monitor loop: {monitor_sizes}", file=sys.stderr)
    monitor = await measure_monitor(monitor_sizes, log_dir) if monitor_sizes else []
    result: dict[str, Any] = {
        "started": started,
        "command": " ".join(["python -m bench", *sys.argv[1:]]),
        "machine": machine,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "corpus": corpus.summary(),
        # The first measurement; all of them, in order, in kernel_measurements.
        "kernel": kernels[0],
        "kernel_measurements": kernels,
        "runs": runs,
        "monitor": monitor,
        "log_dir": str(log_dir),
    }
    result["verdicts"] = verdicts(result)
    return result


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    _quiet_logs()
    result = asyncio.run(_main(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    args.out.with_suffix(".md").write_text(render_markdown(result))
    print(render_text(result))
    print(f"\nwrote {args.out} and {args.out.with_suffix('.md')}")
    return 0 if all(v["ok"] for v in result["verdicts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
