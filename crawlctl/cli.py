"""``image-crawler``: run a crawl on this machine, feed it, watch it, operate it.

Subcommands (each has ``--help``)::

    up        start broker, redis-server, monitor and workers on loopback; Ctrl-C stops them
    demo      ``up`` plus a local origin of bundled samples, crawled end to end
    download  a URL list crawled into a dataset, with img2dataset's options and output
    produce   feed inbound_images from a JSON Lines, CSV, TSV or Parquet file
    recheck   re-check an earlier crawl's images (its etag, last_modified, sha256)
    status    a live table of every source's backlog, ETA, pacing, counters and halt state
    halt      halt a source now (the permanent breaker, set by hand)
    resume    resume a halted source (the original redis-cli procedure, done right)
    override  set or clear a source's rate override
    robots-exempt  stop (or, --remove, resume) obeying robots.txt for sources; list them

Connections come from the environment the crawler's processes read (``KAFKA_HOSTS``,
``REDIS_URL`` or ``REDIS_HOST``/``REDIS_PORT``), or ``--kafka``/``--redis``. Errors go to
stderr. Exit statuses: 0 done; 1 failed (bad rows, URLs not done, a process died); 2 bad
arguments or configuration; 3 Kafka or Redis unreachable; 130 interrupted (``demo``).

This module is the parser and the dispatch: each module of ``crawlctl.commands``
registers its subcommand(s), with a ``run(args) -> int`` as the parser's default. A
command line that names a subcommand imports that subcommand's module alone: the others
bring the broker's, S3's and the local stack's code, a third of a second of imports that
``image-crawler status`` (meant to answer within a second) has no use for.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Final

from crawlctl.console import EXIT_INTERRUPTED, EXIT_USAGE, PROG, Parser, UsageError, error, note

# Each subcommand's module in crawlctl.commands, in the order ``--help`` lists them.
COMMANDS: Final = {
    "up": "up",
    "demo": "demo",
    "download": "download",
    "produce": "produce",
    "recheck": "recheck",
    "status": "status",
    "halt": "controls",
    "resume": "controls",
    "override": "controls",
    "robots-exempt": "controls",
}


def modules_for(argv: Sequence[str] | None) -> list[str]:
    """The modules whose subcommands the parser of ``argv`` needs: the named
    subcommand's alone, else all (``--help``, ``--version``, a typo: they list them)."""
    named = next((arg for arg in argv or () if not arg.startswith("-")), None)
    if named in COMMANDS:
        return [COMMANDS[named]]
    return list(dict.fromkeys(COMMANDS.values()))


def _version() -> str:
    try:
        return metadata.version("image-crawler")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_parser(argv: Sequence[str] | None = None) -> Parser:
    """The command line's parser, with the subcommands ``argv`` needs (None: all)."""
    parser = Parser(
        prog=PROG,
        description="Run a polite image crawl on this machine, feed it, watch it, operate it.",
        epilog=(
            "Connections: KAFKA_HOSTS, REDIS_URL (or REDIS_HOST/REDIS_PORT), as the crawler's "
            "processes read them, or --kafka/--redis. Exit statuses: 0 done, 1 failed, "
            "2 usage or configuration, 3 Kafka/Redis unreachable, 130 interrupted."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    subcommands.required = True
    for module in modules_for(argv):
        importlib.import_module(f"crawlctl.commands.{module}").register(subcommands)
    return parser


def run(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the subcommand; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args.run(args))
    except UsageError as e:
        error(str(e))
        return EXIT_USAGE
    except KeyboardInterrupt:
        note("interrupted")
        return EXIT_INTERRUPTED


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
