"""Running the crawler's own processes (``python -m worker``) in tests, as operators do."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from test.harness.services import free_port, wait_until

if TYPE_CHECKING:
    from aiokafka import TopicPartition

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).with_name("image-crawler")


class CrawlerProcess:
    """One ``python -m MODULE`` subprocess with its JSON log in a file."""

    def __init__(self, module: str, env: Mapping[str, str], log_path: Path) -> None:
        self.module = module
        self.log_path = log_path
        self.env = dict(env)  # what it was given, for a successor started alike
        full_env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
        full_env.update(env)
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in wait()
        self.process = subprocess.Popen(
            [sys.executable, "-m", module],
            cwd=ROOT,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every JSON log event written so far (or only those named ``name``)."""
        found = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict) and (name is None or event.get("event") == name):
                found.append(event)
        return found

    def wait_for_event(
        self,
        name: str,
        timeout_s: float,
        match: Callable[[dict[str, Any]], bool] = lambda event: True,
    ) -> dict[str, Any]:
        """The latest event ``name`` (of those ``match`` takes), waited for."""

        def seen() -> dict[str, Any] | None:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"{self.module} exited {self.process.returncode}:\n{self.tail()}"
                )
            events = [e for e in self.events(name) if match(e)]
            return events[-1] if events else None

        return wait_until(seen, timeout_s, interval_s=0.05, what=f"{self.module} event {name!r}")

    def signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        try:
            return self.process.wait(timeout_s)
        finally:
            self._log.close()

    def stop(self) -> None:
        """Kill if still running (teardown)."""
        if self.process.poll() is None:
            self.process.kill()
        self.wait(10)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


async def committed_offset(
    bootstrap: str, group: str, topic: str, partition: int = 0
) -> int | None:
    """The group's committed offset of one partition, read without joining the group.

    (aiokafka's admin client cannot decode tansu's OffsetFetch answer; a consumer that never
    subscribes asks the coordinator directly and does not disturb the members.)
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition

    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await reader.start()
    try:
        return await reader.committed(TopicPartition(topic, partition))
    finally:
        await reader.stop()


async def commit(bootstrap: str, group: str, offsets: Mapping[TopicPartition, int]) -> None:
    """Commit ``offsets`` for ``group`` as a consumer with manual assignment does."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign(list(offsets))
        await consumer.commit(dict(offsets))
    finally:
        await consumer.stop()


class Command:
    """``image-crawler COMMAND ...`` in a subprocess, as an operator runs it (the console
    script), its output collected as it comes."""

    def __init__(
        self, command_name: str, *args: str, cwd: Path, env: Mapping[str, str] | None = None
    ) -> None:
        """``env``: variables of the command's own, over the suite's."""
        command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "crawlctl"]
        full_env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
        for name in ("KAFKA_HOSTS", "REDIS_URL", "REDIS_HOST", "REDIS_PORT", "SOURCES_FILE"):
            full_env.pop(name, None)
        # A stop hands back what is in flight at once instead of finishing it; a held
        # image waits for the stop without timing out, however long the first run takes.
        full_env.update(
            SHUTDOWN_GRACE_S="1",
            COMMIT_INTERVAL_S="0.2",
            LOG_FREQUENCY_S="1",
            FETCH_READ_TIMEOUT_S="600",
            FETCH_TOTAL_TIMEOUT_S="600",
            # A dashboard port of its own: the default, 9100, is one a machine, and the
            # suite's tests run side by side.
            METRICS_PORT=str(free_port()),
        )
        full_env.update(env or {})
        self.process = subprocess.Popen(
            [*command, command_name, *args],
            env=full_env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        assert self.process.stdout is not None and self.process.stderr is not None
        self._threads = [
            threading.Thread(target=self._collect, args=(self.process.stdout, self.out)),
            threading.Thread(target=self._collect, args=(self.process.stderr, self.err)),
        ]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _collect(stream: io.TextIOBase, lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    @property
    def stderr(self) -> str:
        return "\n".join(self.err)

    def wait_for_line(
        self, pattern: str, timeout_s: float, *, stderr: bool = False
    ) -> re.Match[str]:
        lines = self.err if stderr else self.out

        def found() -> re.Match[str] | None:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"exited {self.process.returncode}:\n" + "\n".join(self.out + self.err)
                )
            return next(filter(None, (re.search(pattern, line) for line in lines)), None)

        return wait_until(found, timeout_s, interval_s=0.05, what=repr(pattern))

    def stop(self, sig: int, timeout_s: float = 90) -> int:
        self.process.send_signal(sig)
        return self._reap(timeout_s)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self._reap(10)

    def _reap(self, timeout_s: float) -> int:
        code = self.process.wait(timeout_s)
        for thread in self._threads:
            thread.join(5)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        return code


def kill_all(run: Command) -> list[psutil.Process]:
    """``kill -9`` of the command and of every process it started, at once; they are gone."""
    root = psutil.Process(run.process.pid)
    everyone = [root, *root.children(recursive=True)]
    for process in everyone:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    run.kill()
    _, alive = psutil.wait_procs(everyone, timeout=10)
    assert not alive
    return everyone
