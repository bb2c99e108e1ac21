"""``image-crawler up``: run a whole crawl on this machine until Ctrl-C.

The local stack (``crawlctl.localstack.stack``) starts on loopback; ``up`` says where each
part listens and how to feed it, then watches that every process stays alive. Whatever
ends it (Ctrl-C, SIGTERM, a process that died), the stack stops in order. ``demo`` runs
its crawl on the same stack, through ``with_stack``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Final

from crawlctl.console import (
    EXIT_FAILED,
    EXIT_OK,
    PROG,
    Parser,
    Subcommands,
    UsageError,
    error,
    note,
    out,
)
from crawlctl.localstack.processes import ServiceError
from crawlctl.localstack.services import LOOPBACK, redis_cli_binary
from crawlctl.localstack.stack import LocalStack, StackSettings
from crawlctl.signals import raise_interrupt, signals_to
from image_crawler.contract import INBOUND_TOPIC, LOG_FREQUENCY_S, RATES_HASH

DEFAULT_DATA_DIR: Final = "image-crawler-data"
# How often ``up`` checks that its processes are alive.
SUPERVISE_INTERVAL_S: Final = 0.25


def register(subcommands: Subcommands) -> None:
    up = subcommands.add_parser(
        "up",
        parents=[stack_options()],
        help="run a crawl on loopback: broker, redis-server, monitor, workers, dedup",
        description=(
            "Start a tansu broker, a redis-server, the crawl monitor, N workers and the "
            "deduplication stage on 127.0.0.1, print where they listen and how to feed "
            "them, and wait. Ctrl-C or SIGTERM stops them in order (workers, monitor and "
            "deduplication, broker and redis-server) and exits 0; a process that dies "
            "meanwhile stops everything with exit status 1. Thumbnails go to a local "
            "folder (THUMBNAIL_STORE=local). The data folder keeps the work across any "
            "stop, a crash or a SIGKILL included: the broker's topics (DATA/broker, a "
            "SeaweedFS), Redis's state (append-only file), the deduplication journal "
            "(DATA/dedup) and the outputs (DATA/outputs/TOPIC.jsonl, image_duplicates "
            "among them); the next start goes on where it stopped."
        ),
    )
    up.add_argument(
        "--sources-file",
        metavar="F",
        help="JSON list of {source_name, image_count} (default: SOURCES_FILE)",
    )
    up.set_defaults(run=run)


def stack_options() -> Parser:
    """The options of a local stack (``up`` and ``demo``), as a parent parser."""
    stack = Parser(add_help=False)
    stack.add_argument(
        "--workers", type=int, default=1, metavar="N", help="worker processes (default: 1)"
    )
    stack.add_argument(
        "--thumbnails",
        metavar="DIR",
        help="where thumbnails are written (default: DATA_DIR/thumbnails)",
    )
    stack.add_argument(
        "--data-dir",
        default=DEFAULT_DATA_DIR,
        metavar="DIR",
        help="logs, Redis's state, queued URLs and outputs, kept across restarts"
        f" (default: ./{DEFAULT_DATA_DIR})",
    )
    stack.add_argument(
        "--log-frequency",
        type=float,
        default=LOG_FREQUENCY_S,
        metavar="S",
        help="seconds between the monitor's monitoring_update events"
        f" (default: {LOG_FREQUENCY_S:g})",
    )
    return stack


def run(args: argparse.Namespace) -> int:
    settings = stack_settings(args, _sources_file(args.sources_file))
    if settings.sources_file is None:
        note(
            "warning: no --sources-file (or SOURCES_FILE): no source is known, so nothing "
            "is crawled; messages wait in their queues until a source becomes known"
        )

    def body(stack: LocalStack) -> int:
        describe(stack)
        return _supervise(stack)

    return with_stack(settings, body, interrupted=EXIT_OK)


def stack_settings(args: argparse.Namespace, sources_file: Path | None) -> StackSettings:
    """The stack that ``stack_options`` describe, crawling the sources of ``sources_file``."""
    if args.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {args.workers}")
    data_dir = Path(args.data_dir).expanduser().resolve()
    thumbnails = Path(args.thumbnails).expanduser().resolve() if args.thumbnails else None
    return StackSettings(
        data_dir=data_dir,
        thumbnails_dir=thumbnails or data_dir / "thumbnails",
        workers=args.workers,
        sources_file=sources_file,
        log_frequency_s=args.log_frequency,
    )


def _sources_file(raw: str | None) -> Path | None:
    value = raw or os.environ.get("SOURCES_FILE", "").strip() or None
    if value is None:
        return None
    path = Path(value).expanduser().resolve()
    if not path.is_file():
        raise UsageError(f"the sources file is not a readable file: {value}")
    return path


def with_stack(
    settings: StackSettings, body: Callable[[LocalStack], int], *, interrupted: int
) -> int:
    """Start the stack, run ``body``, and stop the stack in order whatever happens.

    Returns ``body``'s exit status (``interrupted`` after Ctrl-C or SIGTERM), or
    ``EXIT_FAILED`` when the stack did not start or a crawler process did not stop cleanly.
    """
    stack = LocalStack(settings, notify=note)
    code = EXIT_OK
    statuses: dict[str, int | None] = {}
    with signals_to(raise_interrupt):
        try:
            note(f"starting the local stack with {settings.workers} worker(s)...")
            stack.start()
            code = body(stack)
        except KeyboardInterrupt:
            code = interrupted
        except ServiceError as e:
            error(f"the local stack did not start: {e}")
            code = EXIT_FAILED
        finally:
            with signals_to(_still_stopping):
                note(
                    "stopping: workers, then the monitor and the deduplication stage, "
                    "then the broker and redis-server"
                )
                statuses = stack.stop()
    return _stopped(stack, statuses, code)


def _still_stopping(signum: int, frame: FrameType | None) -> None:
    note("still stopping the local stack, in order; please wait")


def _stopped(stack: LocalStack, statuses: dict[str, int | None], code: int) -> int:
    """Say how the crawler's processes stopped; a crawl that ended well fails if one did
    not stop cleanly."""
    crawlers = {p.name for p in stack.crawler_processes}
    unclean = {n: s for n, s in statuses.items() if n in crawlers and s not in (0, None)}
    if unclean:
        listed = ", ".join(f"{n} ({s})" for n, s in sorted(unclean.items()))
        error(f"not every process stopped cleanly: {listed}; see {stack.settings.log_dir}")
        return code or EXIT_FAILED
    note("stopped")
    return code


def describe(stack: LocalStack) -> None:
    """Where each part of the running stack listens, and how to feed and watch it."""
    settings = stack.settings
    bootstrap, redis_url = stack.broker.bootstrap, stack.redis.url
    processes = ", ".join(f"{p.name} (pid {p.pid})" for p in stack.crawler_processes)
    out(f"{PROG}: a local crawl is running; Ctrl-C stops it")
    if settings.persistent:
        out(f"  broker      {bootstrap}    (KAFKA_HOSTS, tansu, stored in {settings.broker_dir})")
        out(f"  redis       {redis_url}    (REDIS_URL, append-only file in {settings.redis_dir})")
        out(f"  outputs     {settings.outputs_dir}    (TOPIC.jsonl, appended as they come)")
        out(f"  dedup       {settings.dedup_state_dir}    (DEDUP_STATE_DIR, the stage's journal)")
    else:
        out(f"  broker      {bootstrap}    (KAFKA_HOSTS, tansu, in memory)")
        out(f"  redis       {redis_url}    (REDIS_URL)")
    out(f"  thumbnails  {settings.thumbnails_dir}")
    out(f"  logs        {settings.log_dir}")
    out(f"  sources     {settings.sources_file or '(none: nothing will be crawled)'}")
    out(f"  processes   {processes}")
    if stack.monitor is not None:
        port = stack.monitor.env["METRICS_PORT"]
        out(f"  dashboard   http://{LOOPBACK}:{port}/    (and its /metrics)")
    workers = ", ".join(w.env["METRICS_PORT"] for w in stack.workers)
    dedup = stack.dedup
    also = f"; dedup's on {dedup.env['METRICS_PORT']}" if dedup is not None else ""
    out(f"  metrics     workers' /metrics on {LOOPBACK} ports {workers}{also}")
    redis_cli = redis_cli_binary() or "redis-cli"
    out("feed it (JSON lines of url, uuid, source; the source must be in the sources file):")
    out(f"  {PROG} produce urls.jsonl --kafka {bootstrap}")
    out(f"  kcat -P -b {bootstrap} -t {INBOUND_TOPIC} -l urls.jsonl")
    out("watch and operate it:")
    out(f"  {PROG} status --redis {redis_url}")
    out(f"  {redis_cli} -u {redis_url} hgetall {RATES_HASH}")
    out(f"  export KAFKA_HOSTS={bootstrap} REDIS_URL={redis_url}")


def _supervise(stack: LocalStack) -> int:
    """Wait until a process of the stack exits (EXIT_FAILED) or a signal interrupts;
    meanwhile, pause the crawl while the data folder's disk is short."""
    while True:
        exited = stack.exited()
        if exited:
            for child in exited:
                error(
                    f"{child.name} exited unexpectedly with status {child.returncode}; "
                    f"the end of its log ({child.log_path}):\n{child.log_tail(2000)}"
                )
            return EXIT_FAILED
        stack.check_disk()
        time.sleep(SUPERVISE_INTERVAL_S)
