"""``image-crawler``: run a crawl on this machine, feed it, watch it, operate it.

Subcommands (each has ``--help``)::

    up        start broker, redis-server, monitor and workers on loopback; Ctrl-C stops them
    demo      ``up`` plus a local origin of bundled samples, crawled end to end
    produce   feed inbound_images from a JSON Lines, CSV or TSV file
    status    a live table of every source's pacing, counters and halt state
    halt      halt a source now (the permanent breaker, set by hand)
    resume    resume a halted source (the README's redis-cli procedure, done right)
    override  set or clear a source's rate override
    robots-exempt  stop (or, --remove, resume) obeying robots.txt for sources; list them

Connections come from the environment the crawler's processes read (``KAFKA_HOSTS``,
``REDIS_URL`` or ``REDIS_HOST``/``REDIS_PORT``), or ``--kafka``/``--redis``. Errors go to
stderr. Exit statuses: 0 done; 1 failed (bad rows, URLs not done, a process died); 2 bad
arguments or configuration; 3 Kafka or Redis unreachable; 130 interrupted (``demo``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Final, NoReturn

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from redis.exceptions import RedisError
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from crawlctl.commands import controls
from crawlctl.commands.produce import (
    FORMATS,
    BadRow,
    FeedError,
    Format,
    SendSettings,
    count_lines,
    format_of,
    read_rows,
    send_images,
)
from crawlctl.commands.status import CrawlStatus, read_status, status_table
from crawlctl.localstack.services import ServiceError, redis_cli_binary
from crawlctl.localstack.stack import LocalStack, StackSettings
from image_crawler.config import ConfigError, KafkaSettings, RedisSettings
from image_crawler.contract import INBOUND_TOPIC, RATES_HASH, InboundImage, is_valid_source_name

if TYPE_CHECKING:
    # The demo's modules (aiohttp's server among them) load only when the demo runs.
    from crawlctl.commands.demo import DemoPlan, Outcomes

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNAVAILABLE: Final = 3
EXIT_INTERRUPTED: Final = 130

PROG: Final = "image-crawler"
DEFAULT_DATA_DIR: Final = "image-crawler-data"
# How often ``up`` checks that its processes are alive.
SUPERVISE_INTERVAL_S: Final = 0.25


class UsageError(Exception):
    """A bad argument or setting: reported on stderr, exit status 2."""


def _error(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)


def _note(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def _out(message: str = "") -> None:
    print(message, flush=True)


# --- connections --------------------------------------------------------------------------


def _kafka_settings(args: argparse.Namespace) -> KafkaSettings:
    """The environment's Kafka settings (security included), ``--kafka`` overriding hosts."""
    try:
        settings = KafkaSettings.from_env(os.environ)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    if args.kafka:
        settings = dataclasses.replace(settings, bootstrap_servers=str(args.kafka))
    return settings


def _redis_settings(args: argparse.Namespace) -> RedisSettings:
    env = {**os.environ, "REDIS_URL": args.redis} if args.redis else os.environ
    try:
        return RedisSettings.from_env(env)
    except ConfigError as e:
        raise UsageError(str(e)) from None


def _redis_client(settings: RedisSettings) -> aioredis.Redis:
    return settings.client(decode_responses=True, socket_connect_timeout=5.0, socket_timeout=5.0)


# --- signals ------------------------------------------------------------------------------


def _raise_interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _signals(handler: Callable[[int, FrameType | None], Any]) -> Iterator[None]:
    """SIGINT and SIGTERM go to ``handler`` inside the block."""
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _still_stopping(signum: int, frame: FrameType | None) -> None:
    _note("still stopping the local stack, in order; please wait")


@contextlib.contextmanager
def _loop_signals(stop: asyncio.Event) -> Iterator[None]:
    """Inside a running loop: SIGINT and SIGTERM set ``stop`` (then the old handlers)."""
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield
    finally:
        for sig, old in previous.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, old)


# --- up -----------------------------------------------------------------------------------


def _stack_settings(args: argparse.Namespace, sources_file: Path | None) -> StackSettings:
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


def _describe(stack: LocalStack) -> None:
    settings = stack.settings
    bootstrap, redis_url = stack.broker.bootstrap, stack.redis.url
    processes = ", ".join(f"{p.name} (pid {p.pid})" for p in stack.crawler_processes)
    _out(f"{PROG}: a local crawl is running; Ctrl-C stops it")
    _out(f"  broker      {bootstrap}    (KAFKA_HOSTS, tansu, in memory)")
    _out(f"  redis       {redis_url}    (REDIS_URL)")
    _out(f"  thumbnails  {settings.thumbnails_dir}")
    _out(f"  logs        {settings.log_dir}")
    _out(f"  sources     {settings.sources_file or '(none: nothing will be crawled)'}")
    _out(f"  processes   {processes}")
    redis_cli = redis_cli_binary() or "redis-cli"
    _out("feed it (JSON lines of url, uuid, source; the source must be in the sources file):")
    _out(f"  {PROG} produce urls.jsonl --kafka {bootstrap}")
    _out(f"  kcat -P -b {bootstrap} -t {INBOUND_TOPIC} -l urls.jsonl")
    _out("watch and operate it:")
    _out(f"  {PROG} status --redis {redis_url}")
    _out(f"  {redis_cli} -u {redis_url} hgetall {RATES_HASH}")
    _out(f"  export KAFKA_HOSTS={bootstrap} REDIS_URL={redis_url}")


def _supervise(stack: LocalStack) -> int:
    """Wait until a process of the stack exits (EXIT_FAILED) or a signal interrupts."""
    while True:
        exited = stack.exited()
        if exited:
            for child in exited:
                _error(
                    f"{child.name} exited unexpectedly with status {child.returncode}; "
                    f"the end of its log ({child.log_path}):\n{child.log_tail(2000)}"
                )
            return EXIT_FAILED
        time.sleep(SUPERVISE_INTERVAL_S)


def _with_stack(
    settings: StackSettings, body: Callable[[LocalStack], int], *, interrupted: int
) -> int:
    """Start the stack, run ``body``, and stop the stack in order whatever happens."""
    stack = LocalStack(settings)
    code = EXIT_OK
    statuses: dict[str, int | None] = {}
    with _signals(_raise_interrupt):
        try:
            _note(f"starting the local stack with {settings.workers} worker(s)...")
            stack.start()
            code = body(stack)
        except KeyboardInterrupt:
            code = interrupted
        except ServiceError as e:
            _error(f"the local stack did not start: {e}")
            code = EXIT_FAILED
        finally:
            with _signals(_still_stopping):
                _note("stopping: workers, then the monitor, then the broker and redis-server")
                statuses = stack.stop()
    crawlers = {p.name for p in stack.crawler_processes}
    unclean = {n: s for n, s in statuses.items() if n in crawlers and s not in (0, None)}
    if unclean:
        listed = ", ".join(f"{n} ({s})" for n, s in sorted(unclean.items()))
        _error(f"not every process stopped cleanly: {listed}; see {settings.log_dir}")
        code = code or EXIT_FAILED
    else:
        _note("stopped")
    return code


def _sources_file(raw: str | None) -> Path | None:
    value = raw or os.environ.get("SOURCES_FILE", "").strip() or None
    if value is None:
        return None
    path = Path(value).expanduser().resolve()
    if not path.is_file():
        raise UsageError(f"the sources file is not a readable file: {value}")
    return path


def cmd_up(args: argparse.Namespace) -> int:
    settings = _stack_settings(args, _sources_file(args.sources_file))
    if settings.sources_file is None:
        _note(
            "warning: no --sources-file (or SOURCES_FILE): no source is known, so nothing "
            "is crawled; messages wait in their queues until a source becomes known"
        )

    def body(stack: LocalStack) -> int:
        _describe(stack)
        return _supervise(stack)

    return _with_stack(settings, body, interrupted=EXIT_OK)


# --- demo ---------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    from crawlctl.commands.demo import load_samples, plan_demo

    plan = plan_demo(load_samples())
    data_dir = Path(args.data_dir).expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    sources_path = data_dir / "demo-sources.json"
    sources_path.write_text(json.dumps(plan.sources_file(), indent=2) + "\n")
    settings = _stack_settings(args, sources_path)
    out = Path(args.out).expanduser().resolve()

    def body(stack: LocalStack) -> int:
        _describe(stack)
        return asyncio.run(_demo(stack, plan, out, args.timeout))

    return _with_stack(settings, body, interrupted=EXIT_INTERRUPTED)


async def _demo(stack: LocalStack, plan: DemoPlan, out: Path, timeout_s: float) -> int:
    from crawlctl.commands.demo import (
        DemoOrigin,
        Outcomes,
        inbound_messages,
        outcome_consumer,
        summary_table,
        write_jsonl,
    )

    console = Console()
    stop = asyncio.Event()
    outcomes = Outcomes(plan)
    origin = DemoOrigin(plan)
    began = time.monotonic()
    code = EXIT_OK
    with _loop_signals(stop):
        await origin.start()
        consumer = outcome_consumer(stack.broker.bootstrap)
        try:
            await consumer.start()
            messages = inbound_messages(plan, origin)
            await send_images(SendSettings(KafkaSettings(stack.broker.bootstrap)), messages)
            _out(
                f"demo: sent {len(messages)} URLs of {len(plan.sources)} sources, "
                f"served from {origin.url('/')}"
            )
            code = await _follow(stack, consumer, outcomes, plan, stop, began + timeout_s, console)
            if not outcomes.pending:
                await _drain(consumer, outcomes)
        except KafkaError as e:
            _error(f"Kafka at {stack.broker.bootstrap}: {e!r}")
            code = EXIT_UNAVAILABLE
        finally:
            await consumer.stop()
            await origin.stop()
            written = write_jsonl(out, outcomes.metadata)
    elapsed_s = time.monotonic() - began
    console.print(summary_table(plan, outcomes, origin, elapsed_s))
    thumbnails = sum(
        (stack.settings.thumbnails_dir / f"{item.uuid}.jpg").is_file() for item in plan.items
    )
    _out(f"metadata    {written} messages written to {out}")
    _out(f"thumbnails  {thumbnails} written to {stack.settings.thumbnails_dir}")
    _out(f"logs        {stack.settings.log_dir}")
    pending = outcomes.pending
    if pending and code == EXIT_OK:
        urls = sorted(item.path for item in plan.items if item.uuid in pending)
        shown = ", ".join(urls[:5]) + (" ..." if len(urls) > 5 else "")
        _error(f"{len(pending)} URL(s) not done after {elapsed_s:.0f} s: {shown}")
        code = EXIT_INTERRUPTED if stop.is_set() else EXIT_FAILED
    return code


async def _follow(
    stack: LocalStack,
    consumer: AIOKafkaConsumer,
    outcomes: Outcomes,
    plan: DemoPlan,
    stop: asyncio.Event,
    deadline: float,
    console: Console,
) -> int:
    """Read outcomes with a progress bar per source until every URL is done."""
    columns = (
        TextColumn("{task.description:<12}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        tasks = {
            source: progress.add_task(f"{source}", total=len(items))
            for source, items in plan.by_source().items()
        }
        while outcomes.pending and not stop.is_set() and time.monotonic() < deadline:
            exited = stack.exited()
            if exited:
                names = ", ".join(f"{c.name} (status {c.returncode})" for c in exited)
                _error(f"{names} exited unexpectedly; see {stack.settings.log_dir}")
                return EXIT_FAILED
            batch = await consumer.getmany(timeout_ms=200)
            for partition, records in batch.items():
                for record in records:
                    source = outcomes.add(partition.topic, record.value)
                    if source is not None:
                        progress.advance(tasks[source])
    return EXIT_OK


async def _drain(consumer: AIOKafkaConsumer, outcomes: Outcomes, timeout_s: float = 5.0) -> None:
    """Read on until a fetch comes back empty: an EXIF message may trail its resolution.

    (Not up to the end offsets: tansu's in-memory storage does not report them right.)
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = await consumer.getmany(timeout_ms=500)
        if not batch:
            return
        for partition, records in batch.items():
            for record in records:
                outcomes.add(partition.topic, record.value)


# --- produce ------------------------------------------------------------------------------


def cmd_produce(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise UsageError(f"no such file: {args.file}")
    try:
        fmt = format_of(path, args.format)
    except FeedError as e:
        raise UsageError(str(e)) from None
    if args.source is not None and not is_valid_source_name(args.source):
        raise UsageError(f"--source is not a valid source name: {args.source!r}")
    return asyncio.run(_produce(path, fmt, args.source, _kafka_settings(args)))


async def _produce(
    path: Path, fmt: Format, default_source: str | None, kafka: KafkaSettings
) -> int:
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    bad = 0
    sent = 0
    generated = 0
    progress = Progress(
        TextColumn(f"{INBOUND_TOPIC}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=not err.is_terminal,
    )
    with path.open(encoding="utf-8-sig", errors="surrogateescape", newline="") as text:
        rows = read_rows(text, fmt, default_source=default_source)
        try:
            first = next(rows)  # the header and an empty file are judged before connecting
        except FeedError as e:
            _error(f"{path}: {e}")
            _out("sent 0, bad 0")
            return EXIT_FAILED

        def images() -> Iterator[InboundImage]:
            nonlocal bad, generated
            for row in itertools.chain([first], rows):
                if isinstance(row, BadRow):
                    bad += 1
                    progress.console.print(f"line {row.line}: {row.reason}", markup=False)
                    progress.advance(task)
                    continue
                generated += row.generated_uuid
                yield row.image

        def acked(n: int) -> None:
            nonlocal sent
            sent += n
            progress.advance(task, n)

        with progress:
            task = progress.add_task("sending", total=count_lines(path))
            try:
                await send_images(SendSettings(kafka), images(), on_acked=acked)
            except KafkaError as e:
                _error(f"Kafka at {kafka.bootstrap_servers}: {e!r} (after {sent} acknowledged)")
                _out(f"sent {sent}, bad {bad}")
                return EXIT_UNAVAILABLE
    summary = f"sent {sent}, bad {bad}"
    if generated:
        summary += f" ({generated} without uuid got a new uuid4)"
    _out(summary)
    return EXIT_FAILED if bad else EXIT_OK


# --- status -------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise UsageError(f"--interval must be > 0, got {args.interval}")
    redis_settings = _redis_settings(args)
    try:
        return asyncio.run(_status(redis_settings, once=args.once, interval_s=args.interval))
    except KeyboardInterrupt:
        return EXIT_OK


async def _status(redis_settings: RedisSettings, *, once: bool, interval_s: float) -> int:
    console = Console()
    redis = _redis_client(redis_settings)
    try:
        try:
            status: CrawlStatus = await read_status(redis)
        except RedisError as e:
            _error(f"Redis at {redis_settings.redacted_url}: {e}")
            return EXIT_UNAVAILABLE
        if once:
            console.print(status_table(status))
            return EXIT_OK
        stop = asyncio.Event()
        with _loop_signals(stop), Live(status_table(status), console=console) as live:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval_s)
                note = f"{redis_settings.redacted_url}, every {interval_s:g} s; Ctrl-C quits"
                try:
                    status = await read_status(redis)
                except RedisError as e:
                    note = f"Redis unavailable ({e}); showing the last state read"
                live.update(status_table(status, note=note))
        return EXIT_OK
    finally:
        await redis.aclose()


# --- halt, resume, override ---------------------------------------------------------------


def _operate(
    args: argparse.Namespace,
    action: Callable[[aioredis.Redis, str], Awaitable[list[controls.Done]]],
) -> int:
    try:
        source = controls.source_name(args.source)
    except controls.InvalidArgument as e:
        raise UsageError(str(e)) from None
    redis_settings = _redis_settings(args)

    async def run() -> int:
        redis = _redis_client(redis_settings)
        try:
            known = await controls.is_known(redis, source)
            done = await action(redis, source)
        except RedisError as e:
            _error(f"Redis at {redis_settings.redacted_url}: {e}")
            return EXIT_UNAVAILABLE
        finally:
            await redis.aclose()
        for line in done:
            _out(str(line))
        if not known:
            _note_unknown(source)
        return EXIT_OK

    return asyncio.run(run())


def _note_unknown(source: str) -> None:
    _note(
        f"note: {source!r} is not a source the monitor rates or the splitter has "
        "seen (yet); check the name"
    )


def cmd_halt(args: argparse.Namespace) -> int:
    return _operate(args, controls.halt)


def cmd_resume(args: argparse.Namespace) -> int:
    rate = _rate(args.rate) if args.rate is not None else None
    return _operate(args, lambda redis, source: controls.resume(redis, source, rate))


def cmd_override(args: argparse.Namespace) -> int:
    if args.clear:
        if args.rate is not None:
            raise UsageError("give either RATE or --clear, not both")
        return _operate(args, controls.clear_override)
    if args.rate is None:
        raise UsageError("give a RATE (requests/s), or --clear")
    rate = _rate(args.rate)
    return _operate(args, lambda redis, source: controls.override(redis, source, rate))


def _rate(raw: str) -> float:
    try:
        return controls.parse_rate(raw)
    except controls.InvalidArgument as e:
        raise UsageError(str(e)) from None


# --- robots-exempt ------------------------------------------------------------------------


def cmd_robots_exempt(args: argparse.Namespace) -> int:
    if args.list and (args.remove or args.sources):
        raise UsageError("--list takes no SOURCE and no --remove")
    if args.remove and not args.sources:
        raise UsageError("--remove needs the SOURCEs to obey robots.txt for again")
    try:
        sources = list(dict.fromkeys(controls.source_name(raw) for raw in args.sources))
    except controls.InvalidArgument as e:
        raise UsageError(str(e)) from None
    redis_settings = _redis_settings(args)
    if not sources:
        return asyncio.run(_list_robots_exempt(redis_settings))
    action = controls.robots_obey if args.remove else controls.robots_exempt
    return asyncio.run(_robots_exempt(redis_settings, sources, action))


async def _robots_exempt(
    redis_settings: RedisSettings,
    sources: list[str],
    action: Callable[[aioredis.Redis, list[str]], Awaitable[list[controls.Done]]],
) -> int:
    redis = _redis_client(redis_settings)
    try:
        unknown = await controls.unknown(redis, sources)
        done = await action(redis, sources)
    except RedisError as e:
        _error(f"Redis at {redis_settings.redacted_url}: {e}")
        return EXIT_UNAVAILABLE
    finally:
        await redis.aclose()
    for line in done:
        _out(str(line))
    for source in unknown:
        _note_unknown(source)
    return EXIT_OK


async def _list_robots_exempt(redis_settings: RedisSettings) -> int:
    redis = _redis_client(redis_settings)
    try:
        exempt = await controls.robots_exempted(redis)
    except RedisError as e:
        _error(f"Redis at {redis_settings.redacted_url}: {e}")
        return EXIT_UNAVAILABLE
    finally:
        await redis.aclose()
    # One name a line on stdout, for scripts; the sentence for people goes to stderr.
    for source in exempt:
        _out(source)
    if not exempt:
        _note("no source is robots-exempt: robots.txt is obeyed for every source")
    return EXIT_OK


# --- the parser ---------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _version() -> str:
    try:
        return metadata.version("image-crawler")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Run a polite image crawl on this machine, feed it, watch it, operate it.",
        epilog=(
            "Connections: KAFKA_HOSTS, REDIS_URL (or REDIS_HOST/REDIS_PORT), as the crawler's "
            "processes read them, or --kafka/--redis. Exit statuses: 0 done, 1 failed, "
            "2 usage or configuration, 3 Kafka/Redis unreachable, 130 interrupted."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    kafka = _Parser(add_help=False)
    kafka.add_argument(
        "--kafka", metavar="HOSTS", help="bootstrap servers (default: KAFKA_HOSTS, kafka:9092)"
    )
    redis = _Parser(add_help=False)
    redis.add_argument(
        "--redis",
        metavar="URL",
        help="redis://host:port/db (default: REDIS_URL, else REDIS_HOST and REDIS_PORT)",
    )
    stack = _Parser(add_help=False)
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
        help=f"logs and working files (default: ./{DEFAULT_DATA_DIR})",
    )
    stack.add_argument(
        "--log-frequency",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds between the monitor's monitoring_update events (default: 5)",
    )

    up = commands.add_parser(
        "up",
        parents=[stack],
        help="run a crawl on loopback: broker, redis-server, monitor, workers",
        description=(
            "Start a tansu broker, a redis-server, the crawl monitor and N workers on "
            "127.0.0.1, print where they listen and how to feed them, and wait. Ctrl-C or "
            "SIGTERM stops them in order (workers, monitor, broker and redis-server) and "
            "exits 0; a process that dies meanwhile stops everything with exit status 1. "
            "Thumbnails go to a local folder (THUMBNAIL_STORE=local)."
        ),
    )
    up.add_argument(
        "--sources-file",
        metavar="F",
        help="JSON list of {source_name, image_count} (default: SOURCES_FILE)",
    )
    up.set_defaults(run=cmd_up)

    demo = commands.add_parser(
        "demo",
        parents=[stack],
        help="crawl bundled sample images from a local origin, end to end",
        description=(
            "Like `up`, plus an HTTP origin on 127.0.0.1 serving bundled sample images as "
            "three sources crawled at about 2, 10 and 50 requests/s (with one broken file "
            "and one missing URL). Shows progress until every URL is done, prints a summary "
            "per source, writes the metadata messages to a JSON Lines file, and stops. Exit "
            "status 0 when every URL was done in time, 1 otherwise."
        ),
    )
    demo.add_argument(
        "--out",
        default="metadata.jsonl",
        metavar="FILE",
        help="where the image_metadata_updates messages go (default: metadata.jsonl)",
    )
    demo.add_argument(
        "--timeout",
        type=float,
        default=240.0,
        metavar="S",
        help="give up when not every URL is done after this many seconds (default: 240)",
    )
    demo.set_defaults(run=cmd_demo)

    produce = commands.add_parser(
        "produce",
        parents=[kafka],
        help="feed inbound_images from a JSON Lines, CSV or TSV file",
        description=(
            "Send one inbound_images message per row of FILE: JSON Lines (objects), or CSV "
            "or TSV with a header row; the fields are url, uuid and source. A missing uuid "
            "gets a new uuid4; --source fills a missing source. Bad rows are reported by "
            "line number on stderr and not sent; the good ones are sent all the same "
            "(acks=all, every acknowledgement awaited), then the exit status is 1."
        ),
    )
    produce.add_argument("file", metavar="FILE")
    produce.add_argument("--source", metavar="S", help="the source of rows that name none")
    produce.add_argument(
        "--format", choices=FORMATS, help="the file's format (default: by its extension)"
    )
    produce.set_defaults(run=cmd_produce)

    status = commands.add_parser(
        "status",
        parents=[redis],
        help="a live table of every source: pacing, counters, halts",
        description=(
            "Show, per source, its pacing: the effective rate of the configured one "
            "(crawl_rates), the rate workers are paced at now (pace_rate:SOURCE; none "
            "without a monitor), why (backoff, recovering, floor, halted...), and when the "
            "next request may start if a server's Retry-After put it off (pace_next:SOURCE); "
            "then its successes and errors, a histogram of its last 50 statuses, its halt "
            "state and override, and the crawl's totals. Refreshed every --interval seconds "
            "(one Redis round trip each) until Ctrl-C."
        ),
    )
    status.add_argument("--once", action="store_true", help="print the table once and exit")
    status.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="refresh period (default: 1)"
    )
    status.set_defaults(run=cmd_status)

    halt = commands.add_parser(
        "halt",
        parents=[redis],
        help="halt a source now (SADD halted; SET pace_rate:SOURCE 0)",
        description=(
            "Halt SOURCE until an operator resumes it: add it to the halted set (the "
            "monitor then paces it at 0) and SET pace_rate:SOURCE 0 so that workers stop "
            "within their pacing horizon (about 0.05 s) instead of at the monitor's next "
            "loop; also SET currtokens:SOURCE 0 for workers older than pacing (a rolling "
            "upgrade). One transaction."
        ),
    )
    halt.add_argument("source", metavar="SOURCE")
    halt.set_defaults(run=cmd_halt)

    resume = commands.add_parser(
        "resume",
        parents=[redis],
        help="resume a halted source (clears its error windows)",
        description=(
            "Resume SOURCE: with --rate, SET override_rate:SOURCE first; then DEL "
            "statuslast50req:SOURCE and status60s:SOURCE (so the old errors do not trip a "
            "breaker again), SREM halted and SREM temp_halted, in one transaction. The "
            "monitor paces it again within a second."
        ),
    )
    resume.add_argument("source", metavar="SOURCE")
    resume.add_argument("--rate", metavar="R", help="requests/s to crawl it at from now on")
    resume.set_defaults(run=cmd_resume)

    override = commands.add_parser(
        "override",
        parents=[redis],
        help="set (or --clear) a source's rate override",
        description=(
            "SET override_rate:SOURCE RATE (requests/s, > 0): within a second it is the "
            "source's configured rate instead of the computed one (the effective rate stays "
            "below it while the source's server pushes back). --clear deletes "
            "override_rate:SOURCE and override-rate:SOURCE."
        ),
    )
    override.add_argument("source", metavar="SOURCE")
    override.add_argument("rate", nargs="?", metavar="RATE", help="requests/s, > 0")
    override.add_argument("--clear", action="store_true", help="remove the override")
    override.set_defaults(run=cmd_override)
    _add_robots_exempt(commands, redis)
    return parser


def _add_robots_exempt(commands: argparse._SubParsersAction[_Parser], redis: _Parser) -> None:
    exempt = commands.add_parser(
        "robots-exempt",
        parents=[redis],
        help="stop obeying robots.txt for sources (--remove: obey it again); list them",
        description=(
            "Exempt each SOURCE from robots.txt (SADD robots_exempt SOURCE): workers stop "
            "obeying it for the source's URLs, so none is refused as RobotsDisallowed and "
            "no Crawl-delay caps the source's rate (pacing, backoff and the breakers still "
            "apply). With --remove, obey robots.txt for them again (SREM robots_exempt "
            "SOURCE). With no SOURCE, or --list, print the exempt sources, one a line. "
            "Exempt a source only when its sites have given you permission to crawl what "
            "their robots.txt disallows: having that permission is the operator's "
            "responsibility, not the crawler's."
        ),
    )
    exempt.add_argument(
        "sources", nargs="*", metavar="SOURCE", help="source names, as messages spell them"
    )
    exempt.add_argument(
        "--remove", action="store_true", help="obey robots.txt for the SOURCEs again"
    )
    exempt.add_argument("--list", action="store_true", help="list the exempt sources (default)")
    exempt.set_defaults(run=cmd_robots_exempt)


def run(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the subcommand; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except UsageError as e:
        _error(str(e))
        return EXIT_USAGE
    except KeyboardInterrupt:
        _note("interrupted")
        return EXIT_INTERRUPTED


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
