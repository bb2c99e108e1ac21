"""Running the crawler's own processes (``python -m worker``) in tests, as operators do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from test.harness.services import wait_until

if TYPE_CHECKING:
    from aiokafka import TopicPartition

ROOT = Path(__file__).resolve().parents[2]


class CrawlerProcess:
    """One ``python -m MODULE`` subprocess with its JSON log in a file."""

    def __init__(self, module: str, env: Mapping[str, str], log_path: Path) -> None:
        self.module = module
        self.log_path = log_path
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
