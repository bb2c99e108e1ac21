"""The faults, drawn from the seed: what each does to the stack, and when.

One fault starts every ``GAP_S`` (drawn between its bounds); each runs in a task of its
own, so that a pause of 60 s and the faults after it overlap. A fault whose target is
busy with another fault (a service paused, a worker not yet back) is drawn again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Final

from chaos.stack import MONITORS, SHUTDOWN_GRACE_S, WORKERS, Stack

KINDS: Final = (
    "kill_worker",
    "term_worker",
    "kill_monitor",
    "term_monitor",
    "pause_broker",
    "pause_redis",
    "pause_s3",
    "restart_redis",
    "restart_broker",
)
GAP_S: Final = (8.0, 22.0)
PAUSE_S: Final = (5.0, 60.0)
# A killed process is started again after this long (its replacement, as an orchestrator
# would start one).
RESTART_AFTER_S: Final = (1.0, 5.0)


@dataclasses.dataclass(slots=True)
class Fault:
    kind: str
    target: str
    started: float  # unix time
    ended: float = 0.0
    detail: str = ""


class Faults:
    def __init__(self, stack: Stack, seed: int, log: Callable[[str], None]) -> None:
        self.stack = stack
        self.random = random.Random(seed)
        self.done: list[Fault] = []
        self.busy: set[str] = set()
        self._log = log
        self._tasks: set[asyncio.Task[None]] = set()
        self.finished = asyncio.Event()
        # Called after Redis comes back from a fault (the halted source's check).
        self.after_redis: Callable[[str], Awaitable[None]] | None = None

    def counts(self) -> Counter[str]:
        return Counter(f.kind for f in self.done)

    async def run(self, until: float) -> None:
        """Start faults until the unix time ``until``; then wait for the ones running."""
        while True:
            await asyncio.sleep(self.random.uniform(*GAP_S))
            if time.time() >= until:
                break
            self._start_one()
        if self._tasks:
            await asyncio.gather(*self._tasks)
        self.finished.set()

    def _start_one(self) -> None:
        for _ in range(20):
            kind = self.random.choice(KINDS)
            target = self._target(kind)
            if target not in self.busy:
                break
        else:
            return
        self.busy.add(target)
        fault = Fault(kind, target, time.time())
        task = asyncio.create_task(self._run(fault))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _target(self, kind: str) -> str:
        if kind.endswith("_worker"):
            return f"worker{self.random.randrange(WORKERS)}"
        if kind.endswith("_monitor"):
            return f"monitor{self.random.randrange(MONITORS)}"
        return kind.split("_", 1)[1]

    async def _run(self, fault: Fault) -> None:
        self._log(f"fault {fault.kind} {fault.target}")
        try:
            if fault.kind.startswith(("kill_", "term_")):
                await self._stop_process(fault)
            elif fault.kind.startswith("pause_"):
                await self._pause(fault)
            else:
                await self._restart(fault)
        finally:
            fault.ended = time.time()
            self.done.append(fault)
            self.busy.discard(fault.target)
            self._log(f"fault {fault.kind} {fault.target} over {fault.detail}".rstrip())

    async def _stop_process(self, fault: Fault) -> None:
        role, slot = fault.target[:-1], int(fault.target[-1])
        process = (self.stack.workers if role == "worker" else self.stack.monitors)[slot]
        assert process is not None
        if fault.kind.startswith("kill_"):
            process.signal(signal.SIGKILL)
            code = await asyncio.to_thread(process.wait, 10)
            await asyncio.sleep(self.random.uniform(*RESTART_AFTER_S))
        else:
            process.signal(signal.SIGTERM)
            code = await asyncio.to_thread(_wait_or_kill, process, SHUTDOWN_GRACE_S + 30)
        fault.detail = f"exit {code}"
        self.stack.start_process(role, slot)

    async def _pause(self, fault: Fault) -> None:
        service = self._service(fault.target)
        seconds = self.random.uniform(*PAUSE_S)
        service.pause()
        await asyncio.sleep(seconds)
        service.resume()
        fault.detail = f"{seconds:.0f} s"
        if fault.target == "redis" and self.after_redis is not None:
            await self.after_redis(fault.kind)

    async def _restart(self, fault: Fault) -> None:
        service = self._service(fault.target)
        hard = self.random.random() < 0.5
        if hard:
            service.kill()
        else:
            await asyncio.to_thread(service.stop)
        await asyncio.to_thread(service.restart)
        fault.detail = "after kill -9" if hard else "after SIGTERM"
        if fault.target == "redis" and self.after_redis is not None:
            await self.after_redis(fault.kind)

    def _service(self, name: str):  # type: ignore[no-untyped-def]
        return {"broker": self.stack.broker, "redis": self.stack.redis, "s3": self.stack.s3}[name]


def _wait_or_kill(process, timeout_s: float) -> int:  # type: ignore[no-untyped-def]
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.stop()
        return -9
