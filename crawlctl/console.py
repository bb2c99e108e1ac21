"""How the ``image-crawler`` command talks to its caller: exit statuses, messages, and
argument errors.

Results go to stdout (``out``), so that scripts can read them; errors and notes go to
stderr with the program's name in front. A ``UsageError`` raised by a subcommand becomes
exit status 2, as argparse's own errors do.
"""

from __future__ import annotations

import argparse
import sys
from typing import Final, NoReturn, TypeAlias

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNAVAILABLE: Final = 3
EXIT_INTERRUPTED: Final = 130

PROG: Final = "image-crawler"


class UsageError(Exception):
    """A bad argument or setting: reported on stderr, exit status 2."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors exit with ``EXIT_USAGE``."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


# What each subcommand module registers its parser(s) with.
Subcommands: TypeAlias = "argparse._SubParsersAction[Parser]"


def error(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)


def note(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def out(message: str = "") -> None:
    print(message, flush=True)
