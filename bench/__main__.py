"""``python -m bench``: the crawler's benchmark (see bench/README.md).

Builds (or reuses) the corpus, times the image kernel, starts the origin, runs one crawl
per ``--sources`` count on a fresh local stack (with ``--recheck``, each followed by a
re-check of its images), with ``--hosts N`` two more (one source on one unlimited host,
then over N hosts at a robots.txt Crawl-delay of 1 s), with ``--long-tail`` two more
(``--urls`` images on one host, then on as many new hosts, names of a local dnsmasq's
wildcard zone), then compares the worker with img2dataset and with a bare Pillow
pipeline on the corpus's "mixed" files, with ``--dataset`` runs ``image-crawler
download`` beside img2dataset (``bench.dataset``), measures the thumbnails' PSNR, times the
monitor's loop, then prints a table and writes ``--out`` (JSON) and the same table as
markdown next to it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
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

from bench import peer as img2dataset
from bench.bare import measure_bare
from bench.corpus import DEFAULT_DIR, Corpus, ensure_corpus
from bench.crawl import RunConfig, run_crawl
from bench.dataset import measure_dataset
from bench.hosts import measure_hosts
from bench.kernel import measure_kernel
from bench.longtail import TAIL_ZONE, measure_long_tail
from bench.monitor_loop import measure_monitor
from bench.origin import MAX_HOSTS
from bench.quality import measure_quality
from bench.report import render_markdown, render_text, verdicts
from bench.services import ROOT, Origin
from bench.tail_origin import TailOrigin
from worker.settings import WorkerSettings


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    _crawl_options(parser)
    _many_hosts_options(parser)
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
    _comparison_options(parser)
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
    args = parser.parse_args(argv)
    if args.compare_images == 1 or args.compare_images < 0:
        parser.error("--compare-images must be 0 (no comparison) or at least 2")
    if args.peer_repeats < 1 or args.bare_rounds < 1:
        parser.error("--peer-repeats and --bare-rounds must be at least 1")
    if not 0 <= args.hosts <= MAX_HOSTS:
        parser.error(f"--hosts must be between 0 and {MAX_HOSTS}")
    if args.urls < 1:
        parser.error("--urls must be at least 1")
    return args


def _many_hosts_options(parser: argparse.ArgumentParser) -> None:
    """The crawls of one source over many hosts: Crawl-delayed addresses, a long tail."""
    parser.add_argument(
        "--hosts",
        type=int,
        default=0,
        help="after the --sources crawls, crawl the images of one source on one unlimited "
        "host, then over this many loopback hosts at a robots.txt Crawl-delay of 1 s "
        "(0: not)",
    )
    parser.add_argument(
        "--long-tail",
        action="store_true",
        help="after the --hosts crawls, crawl --urls images on one host, then on as many new "
        "hosts (one image each), names of a local dnsmasq's wildcard zone",
    )
    parser.add_argument(
        "--urls", type=int, default=100_000, help="images of each --long-tail crawl"
    )
    parser.add_argument(
        "--tail-origin",
        choices=("nginx", "aiohttp"),
        default="nginx",
        help="the --long-tail crawls' web server: nginx (bench/tail_origin.py), or "
        "bench.origin as before",
    )


def _crawl_options(parser: argparse.ArgumentParser) -> None:
    """What each measured crawl runs: its images, workers, sources and their rate."""
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
    parser.add_argument(
        "--opt-outs",
        action="store_true",
        help="the origin sends X-Robots-Tag and TDMRep headers with every image",
    )
    parser.add_argument(
        "--recheck",
        action="store_true",
        help="after each crawl, re-check its images (their first crawl's ETag, Last-Modified "
        "and sha256) in a second measured pass",
    )


def _comparison_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "comparison", "the worker against img2dataset and the bare Pillow pipeline, and PSNR"
    )
    group.add_argument(
        "--compare-images",
        type=int,
        default=3000,
        help="images of the comparison on the mixed files: the worker's crawl and each "
        "img2dataset run (0 skips the comparison)",
    )
    group.add_argument(
        "--no-peer", action="store_true", help="compare without img2dataset (no venv, no runs)"
    )
    group.add_argument(
        "--peer-repeats", type=int, default=3, help="img2dataset run pairs (1 and N images)"
    )
    group.add_argument(
        "--peer-cache",
        type=Path,
        default=img2dataset.DEFAULT_CACHE,
        help="img2dataset's virtual environment (made there when missing)",
    )
    group.add_argument(
        "--bare-rounds",
        type=int,
        default=5,
        help="timed rounds of the bare Pillow pipeline and the kernel over the mixed files",
    )
    group.add_argument(
        "--no-quality", action="store_true", help="skip the thumbnails' PSNR over the corpus"
    )
    group.add_argument(
        "--dataset",
        action="store_true",
        help="also `image-crawler download` beside img2dataset (bench.dataset): a 2,000-row "
        "list over 40 hosts, one disallowing, one answering 429; then download unbound",
    )


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


def _crawl_config(args: argparse.Namespace, sources: int, images: int, log_dir: Path) -> RunConfig:
    return RunConfig(
        images=images,
        workers=args.workers,
        image_processes=args.image_processes,
        sources=sources,
        partitions=args.partitions or (4 if sources == 1 else 1),
        max_tasks=args.max_tasks,
        rate_rps=args.rate,
        warmup=args.warmup,
        timeout_s=args.timeout or 600 + images / 5,
        profile=args.profile,
        s3=args.s3,
        log_dir=log_dir,
        recheck=args.recheck,
    )


def _mean_of(measured: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "cpu_s_per_image": sum(m["cpu_s_per_image"] for m in measured) / len(measured),
        "measurements": measured,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


async def _comparison(
    args: argparse.Namespace, mixed: Corpus, log_dir: Path, venv: dict[str, Any] | None
) -> dict[str, Any]:
    """The worker, img2dataset, the bare Pillow pipeline and the kernel on the mixed
    files: the pipeline and the kernel before and after, img2dataset then the worker's
    crawl in between, both fed by the same origin (``bench.origin --kind mixed``)."""
    bodies = mixed.bodies()
    load_before = [round(x, 2) for x in os.getloadavg()]
    print(f"comparison: bare Pillow and kernel over {len(bodies)} mixed bodies", file=sys.stderr)
    bare = [measure_bare(bodies, rounds=args.bare_rounds)]
    kernel = [measure_kernel(bodies, rounds=args.bare_rounds)]
    peer: dict[str, Any] | None = None
    with Origin(mixed.directory, log_dir, kind="mixed") as origin:
        if venv is not None:
            print(
                f"comparison: img2dataset, {args.peer_repeats} x (1 + {args.compare_images}) "
                "images",
                file=sys.stderr,
            )
            peer = await asyncio.to_thread(
                img2dataset.measure_img2dataset,
                Path(venv["venv"]),
                origin.url,
                images=args.compare_images,
                repeats=args.peer_repeats,
                work_dir=log_dir / "img2dataset",
            )
            peer["venv"] = venv
            peer["packages"] = img2dataset.venv_packages(Path(venv["venv"]))
        print(f"comparison: crawl of {args.compare_images} mixed images", file=sys.stderr)
        config = dataclasses.replace(
            _crawl_config(args, 1, args.compare_images, log_dir / "run-mixed"),
            workers=1,
            profile=False,
            recheck=False,
        )
        crawl = await run_crawl(config, origin.url, len(mixed.files))
    bare.append(measure_bare(bodies, rounds=args.bare_rounds))
    kernel.append(measure_kernel(bodies, rounds=args.bare_rounds))
    worker = crawl["worker_cpu_s_per_image"]
    bare_mean, kernel_mean = _mean_of(bare), _mean_of(kernel)
    return {
        "corpus": {"kind": "mixed", **mixed.summary()},
        "load_average": [load_before, [round(x, 2) for x in os.getloadavg()]],
        "worker_cpu_s_per_image": worker,
        "crawl": crawl,
        "peer": peer,
        "bare": bare_mean,
        "kernel_on_mixed": kernel_mean,
        "ratios": {
            "worker_over_peer": _ratio(worker, peer["cpu_s_per_image"] if peer else None),
            "worker_over_bare": _ratio(worker, bare_mean["cpu_s_per_image"]),
            "kernel_over_bare": _ratio(
                kernel_mean["cpu_s_per_image"], bare_mean["cpu_s_per_image"]
            ),
            "peer_over_bare": _ratio(
                peer["cpu_s_per_image"] if peer else None, bare_mean["cpu_s_per_image"]
            ),
        },
    }


def _quiet_logs() -> None:
    # The monitor's regulator runs in this process for the loop measurement: its halts
    # of the seeded failing sources are expected, not news.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    logging.basicConfig(level=logging.ERROR)


async def _peer_venv(args: argparse.Namespace, log_dir: Path) -> dict[str, Any] | None:
    """img2dataset's venv, made if missing; None when the run does not compare with it."""
    if not args.compare_images or args.no_peer:
        return None
    print(f"img2dataset: venv {args.peer_cache}", file=sys.stderr)
    try:
        return await asyncio.to_thread(
            img2dataset.ensure_img2dataset, args.peer_cache, log=log_dir / "img2dataset-install.log"
        )
    except img2dataset.PeerError as err:
        raise SystemExit(f"{err}\n(--no-peer runs the benchmark without img2dataset)") from err


async def _crawls(
    args: argparse.Namespace, corpus: Corpus, log_dir: Path, kernels: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, Any] | None, dict[str, Any] | None]:
    """One crawl per ``--sources`` count, the kernel measured after each (appended to
    ``kernels``), then with ``--hosts`` the one-host and many-host crawls, then with
    ``--long-tail`` the one-host and long-tail crawls."""
    runs = []
    hosts = long_tail = None
    with Origin(
        corpus.directory,
        log_dir,
        opt_outs=args.opt_outs,
        hosts=args.hosts,
        tail_zone=TAIL_ZONE if args.long_tail and args.tail_origin == "aiohttp" else "",
    ) as origin:
        for count in [int(s) for s in args.sources.split(",") if s.strip()]:
            config = _crawl_config(args, count, args.images, log_dir / f"run-{count}-sources")
            print(f"crawl: {count} source(s), {args.images} images", file=sys.stderr)
            run = await run_crawl(config, origin.url, len(corpus.files))
            kernels.append(_kernel(corpus, args.kernel_rounds))
            around = (kernels[-2]["cpu_s_per_image"], kernels[-1]["cpu_s_per_image"])
            run["kernel_cpu_s_per_image_around"] = list(around)
            run["kernel_cpu_s_per_image"] = sum(around) / 2
            runs.append(run)
        if args.hosts:
            config = _crawl_config(args, 1, args.images, log_dir / "run-hosts")
            hosts = await measure_hosts(config, origin, len(corpus.files))
        if args.long_tail:
            config = _crawl_config(args, 1, args.urls, log_dir / "run-long-tail")
            long_tail = await _long_tail(args, config, corpus, origin, log_dir)
    return runs, hosts, long_tail


async def _long_tail(
    args: argparse.Namespace, config: RunConfig, corpus: Corpus, origin: Origin, log_dir: Path
) -> dict[str, Any]:
    """The --long-tail crawls, answered by ``origin`` or by nginx (``--tail-origin``)."""
    files = len(corpus.files)
    if args.tail_origin == "aiohttp":
        return await measure_long_tail(config, origin, files)
    # The warm-up's URL indexes too (bench.longtail: at least one a partition).
    urls = max(config.images, config.warmup, config.sources * config.partitions)
    with TailOrigin(corpus.directory, log_dir / "tail-origin", urls, TAIL_ZONE) as nginx:
        return await measure_long_tail(config, nginx, files)


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="bench-"))
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    machine = _machine()
    print(f"logs in {log_dir}", file=sys.stderr)
    corpus = ensure_corpus(args.corpus_dir, args.corpus_files, args.photos)
    print(f"corpus: {corpus.summary()}", file=sys.stderr)
    # First, so that an install failure shows before any crawl.
    venv = await _peer_venv(args, log_dir)
    # The kernel is measured before each crawl and after the last, and each crawl is
    # compared with the mean of the two measurements around it: the machine's speed
    # drifts over minutes (19.1, 18.4 and 17.8 ms within 15 minutes).
    kernels = [_kernel(corpus, args.kernel_rounds)]
    runs, hosts, long_tail = await _crawls(args, corpus, log_dir, kernels)
    comparison = (
        await _comparison(args, corpus.of_kind("mixed"), log_dir, venv)
        if args.compare_images
        else None
    )
    dataset = None
    if args.dataset:
        dataset = await asyncio.to_thread(
            measure_dataset,
            args.corpus_dir,
            corpus_files=args.corpus_files,
            peer_cache=args.peer_cache,
            work_dir=log_dir / "dataset",
            unbound=True,
        )
    quality = None
    if not args.no_quality:
        print(f"quality: PSNR of {len(corpus.files)} thumbnails", file=sys.stderr)
        quality = measure_quality(corpus)
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
        "hosts": hosts,
        "long_tail": long_tail,
        "monitor": monitor,
        "comparison": comparison,
        "dataset": dataset,
        "quality": quality,
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
