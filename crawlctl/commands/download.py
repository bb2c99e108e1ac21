"""``image-crawler download``: a URL list in, a dataset out, as img2dataset writes it.

The options are img2dataset's, with its names (dashes for underscores; its own spelling is
accepted too) and its defaults, plus the crawler's politeness: ``--max-host-rate``. The
list is cut into shards once (``crawlctl.dataset.plan``) into the output folder's hidden
state; the local stack (``up``'s, durable, in that state) crawls the rows; each shard is
written once all its rows have ended (``crawlctl.dataset.run``). Run again on the same
folder, it goes on: complete shards are kept, what is missing is crawled.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
from pathlib import Path
from typing import Any, Final

from crawlctl.commands.produce import FeedError, column_list
from crawlctl.commands.up import with_stack
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
from crawlctl.dataset.plan import plan_list
from crawlctl.dataset.rows import INPUT_FORMATS, ListColumns, parquet_types, read_list
from crawlctl.dataset.run import Dataset, DownloadRun
from crawlctl.dataset.shards import ShardFormat, complete_shards
from crawlctl.dataset.state import DatasetState, RunInfo
from crawlctl.localstack.stack import LocalStack, StackSettings
from crawlctl.signals import loop_signals
from image_crawler.config import KafkaSettings
from image_crawler.contract import ENCODE_FORMATS, MAX_IMAGES, RESIZE_MODES, Encoding

DEFAULT_SOURCE: Final = "dataset"
# One request a second to any one host, whatever its robots.txt allows: a dataset's list
# holds a host's images by the thousand, and img2dataset's users' webmasters have asked
# for no more since 2021 (its issues #48, #62, #331). The crawler's slow start begins a
# host there and, while it answers well, would climb to the source's rate.
DEFAULT_MAX_HOST_RATE: Final = 1.0
DEFAULT_WINDOW: Final = 8
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
        help="crawl a URL list into a dataset (img2dataset's options and output)",
        description=(
            "Crawl every row of URL_LIST on a local stack (as `up` runs it, durable) and write "
            "a dataset in img2dataset's layout to --output-folder: per shard a .tar of "
            "{key}.jpg|png|webp, {key}.txt (the caption) and {key}.json (webdataset; or a "
            "folder, or Parquet), a .parquet of every row (successes and failures) and a "
            "_stats.json. Polite: robots.txt obeyed, each host paced (--max-host-rate), 429 "
            "and Retry-After heeded. Shows progress, prints a summary, exits 0 once every row "
            "has ended and every shard is written; run again on the same folder, it goes on "
            "where it stopped (complete shards kept, nothing written twice)."
        ),
    )
    download.add_argument("url_list", metavar="URL_LIST", help="the list of URLs (a file)")
    _option(download, "output-folder", required=True, metavar="DIR", help="where the dataset goes")
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
    _option(
        download, "max-host-rate", type=float, default=DEFAULT_MAX_HOST_RATE, metavar="RPS",
        help=f"requests a second to any one host, at most (default: {DEFAULT_MAX_HOST_RATE:g})",
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
    download.set_defaults(run=run)


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
    if not args.max_host_rate > 0:
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
    }


def run(args: argparse.Namespace) -> int:
    try:
        import pyarrow  # noqa: F401 - every shard has its Parquet file
    except ImportError:
        raise UsageError("download needs pyarrow: pip install 'image-crawler[local]'") from None
    path, columns, encoding, layout = _checked(args)
    folder = Path(args.output_folder).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    options = _options(args, path, columns, encoding)
    with DatasetState(folder) as state:
        info = _run_info(state, args, path, columns, layout, options)
        if info is None:
            return EXIT_FAILED
        fmt = ShardFormat(
            output_format=args.output_format,
            extension=encoding.extension,
            save_caption=columns.caption is not None,
            columns=columns.kept,
            column_types=parquet_types(path, columns) if args.input_format == "parquet" else {},
        )
        dataset = Dataset(folder, info, layout, fmt, encoding, state.images_dir)
        if len(complete_shards(folder)) == info.shards:
            out(f"download: {folder} is whole: {info.shards} shard(s) of {info.rows} rows")
            state.clear_crawl()
            return EXIT_OK
        code = _crawl(args, dataset, state)
    if code == EXIT_OK:
        state.clear_crawl()
    return code


def _run_info(
    state: DatasetState,
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
                f"{state.root.parent} holds a dataset made with other options "
                f"({', '.join(changed)}); use another --output-folder, or the same options"
            )
            return None
        note(
            f"download: going on with {state.root.parent} ({info.rows} rows, {info.shards} shards)"
        )
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
        # The workers' ceiling per host (an operator's own MAX_HOST_RATE beats it).
        defaults={"MAX_HOST_RATE": f"{args.max_host_rate:g}"},
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
        f"{dataset.folder} ({dataset.fmt.output_format})"
    )
    for status, count in tally.failed.most_common():
        out(f"  failed      {count} {status}")
