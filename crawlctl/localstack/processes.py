"""Child processes of ``image-crawler up``: each in its own session, its output in a log
file, stopped in order by the parent.

``Child`` is any such subprocess; ``ModuleProcess`` is one of the crawler's own (``python
-m worker``). ``stop()`` sends SIGTERM and SIGKILLs after a deadline. Every child runs in
its own session, so Ctrl-C in a terminal reaches only the parent, which then stops the
children in order; a child left running when the parent exits is killed then.

Waiting is done with ``wait_until`` only: a condition polled against a deadline, never a
fixed sleep.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Self, TypeVar

T = TypeVar("T")


class ServiceError(RuntimeError):
    """A process of the stack did not start, or exited while we waited for it."""


def timeout_error(what: str, timeout_s: float, last_error: BaseException | None) -> TimeoutError:
    """The error of a wait that ran out: what it waited for, and the last error seen."""
    detail = f" (last error: {last_error!r})" if last_error is not None else ""
    return TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}{detail}")


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float,
    interval_s: float = 0.02,
    what: str = "condition",
    *,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``predicate`` every ``interval_s`` seconds until it returns a truthy value.

    Returns that value. Exceptions of the types in ``ignore`` count as "not yet"; any other
    exception propagates at once. Raises ``TimeoutError`` naming ``what`` after
    ``timeout_s`` seconds (the predicate is always tried at least once).
    """
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            result = predicate()
        except ignore as exc:
            last_error = exc
        else:
            if result:
                return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise timeout_error(what, timeout_s, last_error) from last_error
        time.sleep(min(interval_s, remaining))


def log_tail(path: Path, max_bytes: int = 4000) -> str:
    """The last ``max_bytes`` of a log file, decoded leniently (for error messages)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"


# Strong references: a child that was never stopped stays alive until exit (and is then
# killed) instead of being garbage-collected mid-session with a ResourceWarning.
_RUNNING: set[Child] = set()


@atexit.register
def _kill_leftovers() -> None:
    # Callers normally stop every child; this covers a script that died half-way.
    for child in list(_RUNNING):
        with contextlib.suppress(OSError):
            child.kill()


class Child:
    """A subprocess in its own session whose output goes to ``log_path``.

    ``stop()`` is SIGTERM, then SIGKILL after ``stop_timeout_s``; ``kill()`` is SIGKILL.
    Both are idempotent and reap the process.
    """

    name = "child"
    stop_timeout_s = 5.0

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        # Descriptors the process inherits (the stack's data-folder lock).
        self.pass_fds: tuple[int, ...] = ()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """True while the process exists."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit status once the process has exited (negative: killed by that signal)."""
        return self._proc.poll() if self._proc is not None else None

    def _spawn(
        self,
        command: list[str],
        env: Mapping[str, str] | None,
        banner: str | None = None,
    ) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            if banner:
                log.write(f"--- {banner}\n".encode())
                log.flush()
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                pass_fds=self.pass_fds,
            )
        _RUNNING.add(self)

    def _signal(self, sig: int) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(sig)

    def terminate(self) -> None:
        """SIGTERM without waiting (see ``wait``), so several children stop at once."""
        self._signal(signal.SIGTERM)

    def wait(self, timeout_s: float | None = None) -> int | None:
        """Wait up to ``timeout_s`` for the exit, then SIGKILL; returns the exit status."""
        proc = self._proc
        if proc is None:
            return None
        try:
            proc.wait(timeout=self.stop_timeout_s if timeout_s is None else timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self._after_exit()
        return proc.returncode

    def stop(self, timeout_s: float | None = None) -> None:
        """SIGTERM, then SIGKILL if the process is still there after ``timeout_s``. Idempotent."""
        if self._proc is None:
            return
        self.terminate()
        self.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL, no grace period (a start that failed, or a parent that is exiting).
        Idempotent."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        self._after_exit()

    def _after_exit(self) -> None:
        _RUNNING.discard(self)

    def log_tail(self, max_bytes: int = 4000) -> str:
        """The end of the log file, for failure messages."""
        return log_tail(self.log_path, max_bytes)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class ModuleProcess(Child):
    """``python -m MODULE`` (a crawler process) with ``env`` added to this environment."""

    def __init__(self, name: str, module: str, env: Mapping[str, str], log_path: Path) -> None:
        super().__init__(log_path)
        self.name = name
        self.module = module
        self.env = dict(env)

    def _after_exit(self) -> None:
        # Its own children (the image process pool) share its session: whatever outlived
        # it goes too. Once only: the group's id may be reused after it is gone.
        proc = self._proc
        if proc is not None and self in _RUNNING:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        super()._after_exit()

    def start(self) -> Self:
        """Start the process (it checks its own configuration and logs when it is up)."""
        if self.running:
            raise ServiceError(f"{self.name} is already running (pid {self.pid})")
        full_env = dict(os.environ)
        # Warnings-as-errors is for the test suite's own process, not for its children.
        full_env.pop("PYTHONWARNINGS", None)
        full_env.update(self.env)
        self._spawn([sys.executable, "-m", self.module], full_env, banner=f"{self.name} starting")
        return self

    def __repr__(self) -> str:
        state = "running" if self.running else f"exited {self.returncode}"
        return f"<{type(self).__name__} {self.name} {state} log={self.log_path}>"
