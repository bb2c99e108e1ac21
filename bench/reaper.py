"""Run a command as a child subreaper, so that its CPU, as ``wait4`` reports it to this
script's parent, is the whole tree's.

``wait4`` counts a process and the descendants it reaped. A process whose parent dies
first (the worker's image processes when ``download`` SIGKILLs the worker's group) is
reparented to init and reaped there, so its CPU is in nobody's count: measured, half of
``download``'s CPU went missing that way. Here the orphans come to this process instead
(``PR_SET_CHILD_SUBREAPER``), which reaps them all before it exits.

    python bench/reaper.py COMMAND [ARGS...]

Exits with the command's code. Stdlib and psutil only: it runs under the bench's Python
with any command, img2dataset's virtual environment among them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

import psutil

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
# How long descendants still alive when the command exits get to end on their own.
LINGER_S = 30.0


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def reap_all(deadline: float) -> None:
    """Reap every child until none is left; after ``deadline`` SIGKILL those still alive."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            continue
        if time.monotonic() > deadline:
            for child in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child.send_signal(signal.SIGKILL)
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    become_subreaper()
    # A timeout SIGKILLs this process's group, the command's too.
    code = subprocess.call(argv)
    reap_all(time.monotonic() + LINGER_S)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
