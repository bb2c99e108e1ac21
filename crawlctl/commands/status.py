"""``image-crawler status``: the command. The crawl's state, its read and its two views
are in ``crawlctl/status``.

The command prints the table once (``--once``), or as JSON (``--json``, ``status_json``),
or keeps it live, read again every ``--interval`` seconds; while Redis is away it keeps
the last state read, and says so. ``--sort`` and ``--top`` choose the rows shown. With
``--hosts SOURCE`` it prints that source's hosts once instead (``--top`` per state).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from rich.console import Console
from rich.live import Live

from crawlctl.commands.controls import InvalidArgument, source_name, unknown
from crawlctl.connections import redis_client, redis_option, redis_settings
from crawlctl.console import (
    EXIT_OK,
    EXIT_UNAVAILABLE,
    Subcommands,
    UsageError,
    error,
    note,
    out,
)
from crawlctl.signals import loop_signals
from crawlctl.status.hosts import read_source_hosts
from crawlctl.status.json_view import hosts_json, status_json
from crawlctl.status.model import DEFAULT_SORT, SORT_KEYS, CrawlStatus, View, read_status
from crawlctl.status.terminal import FittedTable, hosts_table
from image_crawler.config import RedisSettings


def register(subcommands: Subcommands) -> None:
    status = subcommands.add_parser(
        "status",
        parents=[redis_option()],
        help="a live table of every source: backlog, ETA, pacing, errors, halts",
        description=(
            "Show, per source, its backlog (URLs split but not yet taken, as the monitor "
            "last measured it) and the ETA at its effective rate; its pacing: the effective "
            "rate of the configured one (crawl_rates), the rate workers are paced at now "
            "(pace_rate:SOURCE; none without a monitor), why (backoff, recovering, floor, "
            "halted...), and when the next request may start if a server's Retry-After put "
            "it off (pace_next:SOURCE); then its successes, its errors and their top "
            "reasons, its re-checks by status (when there are any), a histogram of its "
            "last 50 statuses, its halt state and override, its hosts (how many were "
            "asked about in the last minute, and of them how many are paced below its "
            "rate, backed off and halted), and the crawl's totals (the "
            "ETA of the crawl is its slowest source's), with the workers' DNS: queries, "
            "cache hits, failures by kind and names cached, summed and per worker, and the "
            "URLs ended as DnsError. Refreshed "
            "every --interval seconds until Ctrl-C. With --hosts SOURCE, that source's "
            "troubled hosts (halted, backed off, paced below its rate) and busiest hosts, "
            "with their rate, why they are paced, their last answer and failures, once."
        ),
    )
    status.add_argument(
        "--hosts",
        metavar="SOURCE",
        help="list SOURCE's troubled and busiest hosts (--top of each state, default 10)",
    )
    status.add_argument("--once", action="store_true", help="print the table once and exit")
    status.add_argument(
        "--json",
        action="store_true",
        help="print the status once as JSON (every field; see docs/operating.md) and exit",
    )
    status.add_argument(
        "--sort",
        choices=SORT_KEYS,
        default=DEFAULT_SORT,
        help=f"order of the sources, largest first except name (default: {DEFAULT_SORT})",
    )
    status.add_argument(
        "--top", type=int, metavar="N", help="show the first N sources only (default: all)"
    )
    status.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="refresh period (default: 1)"
    )
    status.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise UsageError(f"--interval must be > 0, got {args.interval}")
    if args.top is not None and args.top < 1:
        raise UsageError(f"--top must be at least 1, got {args.top}")
    settings = redis_settings(args)
    if args.hosts is not None:
        try:
            source = source_name(args.hosts)
        except InvalidArgument as e:
            raise UsageError(str(e)) from None
        return asyncio.run(_hosts(settings, source, args.top or 10, as_json=args.json))
    view = View(sort=args.sort, top=args.top, as_json=args.json)
    try:
        return asyncio.run(_status(settings, view, once=args.once, interval_s=args.interval))
    except KeyboardInterrupt:
        return EXIT_OK


async def _status(settings: RedisSettings, view: View, *, once: bool, interval_s: float) -> int:
    console = Console()
    redis = redis_client(settings)
    try:
        try:
            status = await read_status(redis)
        except RedisError as e:
            error(f"Redis at {settings.redacted_url}: {e}")
            return EXIT_UNAVAILABLE
        if view.as_json:
            out(json.dumps(status_json(status, sort=view.sort, top=view.top), indent=2))
            return EXIT_OK
        if once:
            console.print(FittedTable(status, view))
            return EXIT_OK
        await _watch(redis, settings, status, view, interval_s, console)
        return EXIT_OK
    finally:
        await redis.aclose()


async def _hosts(settings: RedisSettings, source: str, top: int, *, as_json: bool) -> int:
    redis = redis_client(settings)
    try:
        hosts = await read_source_hosts(redis, source, top)
        unknown_source = bool(await unknown(redis, [source]))
    except RedisError as e:
        error(f"Redis at {settings.redacted_url}: {e}")
        return EXIT_UNAVAILABLE
    finally:
        await redis.aclose()
    if as_json:
        out(json.dumps(hosts_json(hosts), indent=2))
    else:
        Console().print(hosts_table(hosts))
    if unknown_source:
        note(
            f"note: {source!r} is not a source the monitor rates or the splitter has seen "
            "(yet); check the name"
        )
    return EXIT_OK


async def _watch(
    redis: aioredis.Redis,
    settings: RedisSettings,
    status: CrawlStatus,
    view: View,
    interval_s: float,
    console: Console,
) -> None:
    """Show ``status`` and read it again every ``interval_s`` until Ctrl-C or SIGTERM;
    while Redis is away, the last state read stays, with a note that says so."""
    stop = asyncio.Event()

    def table(note: str | None = None) -> FittedTable:
        return FittedTable(status, view, note, fit_height=True)

    with loop_signals(stop), Live(table(), console=console) as live:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)
            note = f"{settings.redacted_url}, every {interval_s:g} s; Ctrl-C quits"
            try:
                status = await read_status(redis)
            except RedisError as e:
                note = f"Redis unavailable ({e}); showing the last state read"
            live.update(table(note))
