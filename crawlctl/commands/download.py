"""``image-crawler download``: a URL list in, a dataset out, as img2dataset writes it.

The options are img2dataset's, with its names (dashes for underscores; its own spelling is
accepted too) and its defaults, plus the crawler's politeness: ``--max-host-rate``. The
list is cut into shards once (``crawlctl.dataset.plan``) into the output folder's hidden
state; the local stack (``up``'s, durable, in that state) crawls the rows; each shard is
written once all its rows have ended (``crawlctl.dataset.run``). Run again on the same
folder, it goes on: complete shards are kept, what is missing is crawled.

With ``--kafka`` or ``--redis`` no stack is started: the rows go to an existing cluster
(the compose stack), whose monitor must rate the source and whose workers store the
images in its S3 bucket; ``--output-folder s3://bucket/prefix`` puts the dataset in S3
(``crawlctl.dataset.stores``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any, Final

import redis.asyncio as aioredis
from aiokafka.errors import KafkaError
from botocore.exceptions import BotoCoreError, ClientError
from redis.exceptions import RedisError

from crawlctl.commands.produce import FeedError, column_list
from crawlctl.commands.up import with_stack
from crawlctl.connections import (
    kafka_option,
    kafka_settings,
    redis_client,
    redis_option,
    redis_settings,
)
from crawlctl.console import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    Subcommands,
    UsageError,
    error,
    note,
    out,
)
from crawlctl.dataset.layout import OUTPUT_FORMATS, Layout
from crawlctl.dataset.outcomes import DEDUP_MODES
from crawlctl.dataset.plan import plan_list
from crawlctl.dataset.rows import INPUT_FORMATS, ListColumns, parquet_types, read_list
from crawlctl.dataset.run import Dataset, DownloadRun
from crawlctl.dataset.shards import ShardFormat
from crawlctl.dataset.state import DatasetState, RunInfo
from crawlctl.dataset.stores import (
    Destination,
    FolderDestination,
    FolderImages,
    Images,
    S3Destination,
    S3Images,
    S3Location,
    is_s3,
    s3_client,
)
from crawlctl.localstack.stack import LocalStack, StackSettings
from crawlctl.signals import loop_signals
from image_crawler.config import ConfigError, KafkaSettings, RedisSettings, S3Settings
from image_crawler.contract import (
    ENCODE_FORMATS,
    MAX_IMAGES,
    RATES_HASH,
    RESIZE_MODES,
    Encoding,
    host_rate_key,
)

DEFAULT_SOURCE: Final = "dataset"
# One request a second to any one host, whatever its robots.txt allows: a dataset's list
# holds a host's images by the thousand, and img2dataset's users' webmasters have asked
# for no more since 2021 (its issues #48, #62, #331). The crawler's slow start begins a
# host there and, while it answers well, would climb to the source's rate.
DEFAULT_MAX_HOST_RATE: Final = 1.0
DEFAULT_WINDOW: Final = 8
DOWNLOAD_LINGER_MS: Final = 1000
# A worker that keeps dying (a bad deploy, no memory) ends the run after this many starts.
MAX_WORKER_RESTARTS: Final = 5


def _flag(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _option(parser: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    """``--name-with-dashes``, and img2dataset's ``--name_with_underscores`` too."""
    spellings = [f"--{name}"]
    if "-" in name:
        spellings.append(f"--{name.replace('-', '_')}")
    parser.add_argument(*spellings, dest=name.replace("-", "_"), **kwargs)


def register(subcommands: Subcommands) -> None:
    download = subcommands.add_parser(
        "download",
        parents=[kafka_option(), redis_option()],
        help="crawl a URL list into a dataset (img2dataset's options and output)",
        description=(
            "Crawl every row of URL_LIST on a local stack (as `up` runs it, durable) and write "
            "a dataset in img2dataset's layout to --output-folder: per shard a .tar of "
            "{key}.jpg|png|webp, {key}.txt (the caption) and {key}.json (webdataset; or a "
            "folder, or Parquet), a .parquet of every row (successes and failures) and a "
            "_stats.json. Polite: robots.txt obeyed, each host paced (--max-host-rate), 429 "
            "and Retry-After heeded. Shows progress, prints a summary, exits 0 once every row "
            "has ended and every shard is written; run again on the same folder, it goes on "
            "where it stopped (complete shards kept, nothing written twice). With --kafka "
            "or --redis, the crawl is an existing cluster's (the compose stack): its monitor "
            "must rate --source, and its workers' images are read from its S3_BUCKET. "
            "--output-folder s3://bucket/prefix writes the dataset to S3 (S3_ENDPOINT_URL)."
        ),
    )
    download.add_argument("url_list", metavar="URL_LIST", help="the list of URLs (a file)")
    _option(
        download, "output-folder", required=True, metavar="DIR",
        help="where the dataset goes: a folder, or s3://bucket/prefix",
    )  # fmt: skip
    _option(download, "input-format", choices=INPUT_FORMATS, default="txt", help="default: txt")
    _option(download, "url-col", default="url", metavar="NAME", help="default: url")
    _option(download, "caption-col", metavar="NAME", help="default: none (no captions)")
    _option(
        download,
        "save-additional-columns",
        metavar="A,B",
        help='columns kept beside the caption: comma separated, or a JSON list ["a","b"]',
    )
    _option(
        download, "output-format", choices=OUTPUT_FORMATS, default="files", help="default: files"
    )
    image_options(download)
    _option(
        download, "number-sample-per-shard", type=int, default=10_000, metavar="N",
        help="rows a shard (default: 10000)",
    )  # fmt: skip
    crawl_options(download)
    download.set_defaults(run=run)


def crawl_options(download: argparse.ArgumentParser) -> None:
    """Ours: how the list is crawled."""
    _option(
        download, "max-host-rate", type=float, metavar="RPS",
        help=f"requests a second to any one host, at most (default: {DEFAULT_MAX_HOST_RATE:g}; "
        "on a cluster, its host_rate:SOURCE if an operator set one)",
    )  # fmt: skip
    _option(
        download, "state-folder", metavar="DIR",
        help="where the run's own state is kept (default: the output folder's hidden "
        ".image-crawler/; for s3:// a folder of ~/.cache/image-crawler/download/)",
    )  # fmt: skip
    _option(
        download, "workers", type=int, default=1, metavar="N", help="worker processes (default: 1)"
    )
    _option(
        download, "source", default=DEFAULT_SOURCE, metavar="NAME", help="the crawl's source name"
    )
    _option(
        download, "shards-in-flight", type=int, default=DEFAULT_WINDOW, metavar="N",
        help=f"shards sent and not yet written, at most (default: {DEFAULT_WINDOW})",
    )  # fmt: skip
    _option(
        download, "dedup", choices=DEDUP_MODES,
        help="keep the first image of each cluster only (exact: the same bytes; near: also "
        "the same photograph re-encoded or resized, docs/deduplication.md); the others are "
        "rows of status duplicate, with the key of the kept one in duplicate_of",
    )  # fmt: skip


def image_options(download: argparse.ArgumentParser) -> None:
    """img2dataset's options of the image: what the workers make of it."""
    _option(download, "image-size", type=int, default=256, metavar="PX", help="default: 256")
    _option(download, "resize-mode", choices=RESIZE_MODES, default="border", help="default: border")
    _option(
        download, "resize-only-if-bigger", type=_flag, nargs="?", const=True, default=False,
        metavar="BOOL", help="leave images not bigger than --image-size as they are",
    )  # fmt: skip
    _option(download, "encode-format", choices=ENCODE_FORMATS, default="jpg", help="default: jpg")
    _option(
        download, "encode-quality", type=int, metavar="Q",
        help="1-100 for jpg and webp (default: 95); png: the compression level 0-9 (default: 9)",
    )  # fmt: skip
    _option(download, "min-image-size", type=int, default=0, metavar="PX", help="default: 0")
    _option(download, "max-image-area", type=float, metavar="PX", help="default: no limit")
    _option(download, "max-aspect-ratio", type=float, metavar="R", help="default: no limit")


def encoding_of(args: argparse.Namespace) -> Encoding:
    quality = args.encode_quality
    if quality is None:
        quality = 9 if args.encode_format == "png" else 95
    area = args.max_image_area
    try:
        return Encoding(
            image_size=args.image_size,
            resize_mode=args.resize_mode,
            resize_only_if_bigger=args.resize_only_if_bigger,
            encode_format=args.encode_format,
            encode_quality=quality,
            min_image_size=args.min_image_size,
            max_image_area=None if area is None or area == float("inf") else int(area),
            max_aspect_ratio=None
            if args.max_aspect_ratio in (None, float("inf"))
            else args.max_aspect_ratio,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None


def _checked(args: argparse.Namespace) -> tuple[Path, ListColumns, Encoding, Layout]:
    path = Path(args.url_list).expanduser()
    if not path.is_file():
        raise UsageError(f"no such file: {args.url_list}")
    columns = ListColumns(args.url_col, args.caption_col, column_list(args.save_additional_columns))
    if (problem := columns.problem()) is not None:
        raise UsageError(problem)
    for name in ("workers", "shards_in_flight", "number_sample_per_shard"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_host_rate is not None and not args.max_host_rate > 0:
        raise UsageError("--max-host-rate must be above 0")
    try:
        layout = Layout(args.number_sample_per_shard)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return path.resolve(), columns, encoding_of(args), layout


def _options(
    args: argparse.Namespace, path: Path, columns: ListColumns, encoding: Encoding
) -> dict[str, Any]:
    """What makes the dataset: a rerun with other ones would mix two datasets."""
    return {
        "url_list": str(path),
        "input_format": args.input_format,
        "url_col": columns.url,
        "caption_col": columns.caption,
        "save_additional_columns": list(columns.kept),
        "number_sample_per_shard": args.number_sample_per_shard,
        "output_format": args.output_format,
        "encoding": encoding.to_obj(),
    } | ({} if args.dedup is None else {"dedup": args.dedup})


def run(args: argparse.Namespace) -> int:
    try:
        import pyarrow  # noqa: F401 - every shard has its Parquet file
    except ImportError:
        raise UsageError("download needs pyarrow: pip install 'image-crawler[local]'") from None
    path, columns, encoding, layout = _checked(args)
    cluster = _cluster(args)
    s3 = _s3_settings() if cluster is not None or is_s3(args.output_folder) else None
    client = None if s3 is None else s3_client(s3)
    destination, state = _destination(args, client)
    options = _options(args, path, columns, encoding)
    with state:
        info = _run_info(state, str(destination), args, path, columns, layout, options)
        if info is None:
            return EXIT_FAILED
        fmt = ShardFormat(
            output_format=args.output_format,
            extension=encoding.extension,
            save_caption=columns.caption is not None,
            columns=columns.kept,
            column_types=parquet_types(path, columns) if args.input_format == "parquet" else {},
        )
        images: Images = (
            FolderImages(state.images_dir)
            if cluster is None or s3 is None
            else S3Images(client, s3.bucket)
        )
        dataset = Dataset(destination, info, layout, fmt, encoding, images, args.dedup)
        if len(destination.complete()) == info.shards:
            out(f"download: {destination} is whole: {info.shards} shard(s) of {info.rows} rows")
            state.clear_crawl()
            return EXIT_OK
        if cluster is None:
            code = _crawl(args, dataset, state)
        else:
            code = asyncio.run(_crawl_on(cluster, args, dataset, state))
    if code == EXIT_OK:
        state.clear_crawl()
    return code


@dataclasses.dataclass(frozen=True, slots=True)
class Cluster:
    kafka: KafkaSettings
    redis: RedisSettings


def _cluster(args: argparse.Namespace) -> Cluster | None:
    """The existing cluster to crawl on (--kafka or --redis given), or None: a local stack."""
    if not (args.kafka or args.redis):
        return None
    return Cluster(kafka_settings(args), redis_settings(args))


def _s3_settings() -> S3Settings:
    try:
        return S3Settings.from_env(os.environ)
    except ConfigError as e:
        raise UsageError(str(e)) from None


def _destination(args: argparse.Namespace, client: Any) -> tuple[Destination, DatasetState]:
    """Where the dataset goes, and where the run's own state is kept."""
    state_folder = (
        None if args.state_folder is None else Path(args.state_folder).expanduser().resolve()
    )
    if not is_s3(args.output_folder):
        folder = Path(args.output_folder).expanduser().resolve()
        folder.mkdir(parents=True, exist_ok=True)
        return FolderDestination(folder), DatasetState(folder, root=state_folder)
    try:
        location = S3Location.parse(args.output_folder)
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        client.head_bucket(Bucket=location.bucket)
    except (BotoCoreError, ClientError) as e:
        raise UsageError(f"cannot write to {location}: {e}") from None
    if state_folder is None:
        cache = Path.home() / ".cache"
        digest = hashlib.sha256(str(location).encode()).hexdigest()[:12]
        state_folder = cache / "image-crawler" / "download" / f"{location.bucket}-{digest}"
    state_folder.mkdir(parents=True, exist_ok=True)
    return S3Destination(client, location), DatasetState(state_folder, root=state_folder)


def _run_info(
    state: DatasetState,
    where: str,
    args: argparse.Namespace,
    path: Path,
    columns: ListColumns,
    layout: Layout,
    options: dict[str, Any],
) -> RunInfo | None:
    """The run of this folder: an earlier one's (same options), or a new one, its list
    cut into shards now."""
    info = state.load_run()
    if info is not None:
        if dict(info.options) != options:
            changed = sorted(k for k in options if info.options.get(k) != options[k])
            error(
                f"{where} holds a dataset made with other options "
                f"({', '.join(changed)}); use another --output-folder, or the same options"
            )
            return None
        note(f"download: going on with {where} ({info.rows} rows, {info.shards} shards)")
        return info
    if state.root.exists():  # a cut that did not finish: start it again
        shutil.rmtree(state.root)
    try:
        planned = plan_list(read_list(path, args.input_format, columns), layout, state, note)
    except FeedError as e:
        raise UsageError(f"{path}: {e}") from None
    info = RunInfo(secrets.token_hex(6), args.source, planned.rows, planned.shards, options)
    state.save_run(info)
    note(
        f"download: {planned.rows} rows in {planned.shards} shard(s) of up to "
        f"{layout.per_shard}; {planned.failed} cannot be crawled (ended at once)"
    )
    return info


def worker_defaults(max_host_rate: float | None) -> dict[str, str]:
    """The workers' ceiling per host, and their producers' linger: a dataset's rows are
    not waited for one by one, and on the local broker each produce request is objects
    written, listed and read in S3 (1000 ms took a 400-row run from 59 to 42 ms of CPU an
    image, docs/datasets.md). An operator's own values beat both (``crawler_env``)."""
    return {
        "MAX_HOST_RATE": f"{max_host_rate or DEFAULT_MAX_HOST_RATE:g}",
        "PRODUCER_LINGER_MS": str(DOWNLOAD_LINGER_MS),
    }


def _crawl(args: argparse.Namespace, dataset: Dataset, state: DatasetState) -> int:
    sources = state.root / "sources.json"
    sources.write_text(
        json.dumps([{"source_name": dataset.info.source, "image_count": MAX_IMAGES}])
    )
    settings = StackSettings(
        data_dir=state.stack_dir,
        thumbnails_dir=state.images_dir,
        workers=args.workers,
        sources_file=sources,
        defaults=worker_defaults(args.max_host_rate),
    )

    def body(stack: LocalStack) -> int:
        return asyncio.run(_follow(stack, dataset, state, args.shards_in_flight))

    return with_stack(settings, body, interrupted=EXIT_INTERRUPTED)


class Supervisor:
    """Whether the stack can go on: a worker that exits is started again (its work was
    handed back, or is delivered again: nothing is lost), up to MAX_WORKER_RESTARTS
    times in all; any other process that exits ends the run."""

    def __init__(self, stack: LocalStack) -> None:
        self.stack = stack
        self.restarts = 0

    def __call__(self) -> str | None:
        exited = self.stack.exited()
        others = [c for c in exited if c not in self.stack.workers]
        if others:
            names = ", ".join(f"{c.name} (status {c.returncode})" for c in others)
            return f"{names} exited unexpectedly; see {self.stack.settings.log_dir}"
        for worker in self.stack.workers:
            if worker not in exited:
                continue
            if self.restarts >= MAX_WORKER_RESTARTS:
                return (
                    f"workers exited {self.restarts + 1} times; see {self.stack.settings.log_dir}"
                )
            self.restarts += 1
            note(
                f"download: {worker.name} exited with status {worker.returncode}; starting it again"
            )
            worker.wait(0)
            worker.start()
        return None


async def _follow(stack: LocalStack, dataset: Dataset, state: DatasetState, window: int) -> int:
    stop = asyncio.Event()
    failed = Supervisor(stack)
    download = DownloadRun(
        dataset, state, KafkaSettings(stack.broker.bootstrap),
        window=window, stop=stop, failed=failed, note=note,
    )  # fmt: skip
    with loop_signals(stop):
        why = await download.run()
    return _ended(download, dataset, why)


async def _crawl_on(
    cluster: Cluster, args: argparse.Namespace, dataset: Dataset, state: DatasetState
) -> int:
    """The crawl on an existing cluster: its monitor must rate the source (it crawls only
    the sources of its SOURCES_FILE or SOURCES_URL); the source's ceiling per host is
    host_rate:SOURCE in its Redis."""
    source = dataset.info.source
    redis = redis_client(cluster.redis)
    try:
        if not await redis.hexists(RATES_HASH, source):
            error(
                f"download: the cluster's monitor does not rate the source {source!r}: add "
                f'{{"source_name": "{source}", "image_count": {MAX_IMAGES}}} to its '
                "SOURCES_FILE (or SOURCES_URL; the count sets the source's rate, this one "
                "the most there is), or give --source one it rates"
            )
            return EXIT_FAILED
        await _set_host_rate(redis, source, args.max_host_rate)
    except RedisError as e:
        error(f"download: the cluster's Redis ({cluster.redis.redacted_url}): {e}")
        return EXIT_FAILED
    finally:
        await redis.aclose()
    if dataset.dedup is not None:
        note(
            "download: --dedup: each image ends with its placement by the cluster's "
            "deduplication stage (docker-compose.yml's dedup service), which must run"
        )
    stop = asyncio.Event()
    download = DownloadRun(
        dataset, state, cluster.kafka, window=args.shards_in_flight, stop=stop, note=note
    )
    with loop_signals(stop):
        try:
            why = await download.run()
        except KafkaError as e:
            why = f"the cluster's broker ({cluster.kafka.bootstrap_servers}): {e!r}"
    return _ended(download, dataset, why)


async def _set_host_rate(redis: aioredis.Redis, source: str, rate: float | None) -> None:
    """--max-host-rate as host_rate:SOURCE; without it, an operator's value stays."""
    key = host_rate_key(source)
    if rate is not None:
        await redis.set(key, f"{rate:g}")
    elif not await redis.set(key, f"{DEFAULT_MAX_HOST_RATE:g}", nx=True):
        note(f"download: keeping the cluster's {key} (--max-host-rate sets it)")
    current = await redis.get(key)
    text = current.decode() if isinstance(current, bytes) else current
    note(f"download: at most {text} request(s)/s to any one host ({key})")


def _ended(download: DownloadRun, dataset: Dataset, why: str | None) -> int:
    _summary(download, dataset)
    if why is None:
        return EXIT_OK
    if why == "stopped":
        note("download: stopped; run the same command again to go on")
        return EXIT_INTERRUPTED
    error(f"download: {why}")
    return EXIT_FAILED


def _summary(download: DownloadRun, dataset: Dataset) -> None:
    tally = download.tally
    out(f"download: {tally.line()}")
    out(
        f"  shards      {tally.shards_written} of {dataset.info.shards} written to "
        f"{dataset.destination} ({dataset.fmt.output_format})"
    )
    if dataset.dedup is not None:
        out(f"  duplicates  {tally.duplicates} ({dataset.dedup}), not in the shards")
    for status, count in tally.failed.most_common():
        out(f"  failed      {count} {status}")
