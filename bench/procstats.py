"""CPU, memory and broker connections of a process and all its descendants, via psutil.

A worker is its main process (the event loop), the forkserver it starts, the image pool
processes the forkserver forks, and multiprocessing's resource tracker. ``ProcessTree``
finds them anew at every call and remembers each one's last reading, so a process that
exits between two readings still counts with its last one (the pool processes live as
long as the worker, so in practice nothing is lost).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil


@dataclasses.dataclass(frozen=True, slots=True)
class MemorySample:
    """One reading of a worker's memory, tagged with how far the run had got."""

    elapsed_s: float
    completed: int
    main_rss: int
    pool_rss_max: int
    tree_rss: int
    pool_processes: int
    # Bodies the worker parks in memfds are not mapped, so not in any RSS: counted apart.
    memfd_bytes: int


def _memfds(pid: int, sizes: dict[str, int]) -> None:
    """Add to ``sizes`` (bytes by inode) the memfds (anonymous in-memory files) the
    process has mapped: the image pool's lanes, which the worker maps whole, and a pool
    process while it decodes from one. Read from its maps, a line a mapping: reading the
    link of every open descriptor instead took the benchmark 1.4 % of the machine more
    on a long tail of hosts, whose worker holds thousands of sockets."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                if "/memfd:" not in line:
                    continue
                span, _perms, _offset, _dev, inode, *_ = line.split()
                start, end = span.split("-")
                sizes[inode] = max(sizes.get(inode, 0), int(end, 16) - int(start, 16))
    except (OSError, ValueError):
        return


def _hwm_bytes(pid: int) -> int:
    """The kernel's high-water mark of the process's resident set (VmHWM), in bytes."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


class ProcessTree:
    """Readings of one process and its descendants."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.root = psutil.Process(pid)
        self._cpu_by_pid: dict[int, float] = {}
        self._system_by_pid: dict[int, float] = {}
        self._hwm_by_pid: dict[int, int] = {}
        self._names: dict[int, str] = {}

    def processes(self) -> list[psutil.Process]:
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of every process of the tree seen so far."""
        for process in self.processes():
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            used = times.user + times.system
            self._cpu_by_pid[process.pid] = max(used, self._cpu_by_pid.get(process.pid, 0.0))
            pid_system = self._system_by_pid.get(process.pid, 0.0)
            self._system_by_pid[process.pid] = max(times.system, pid_system)
        return sum(self._cpu_by_pid.values())

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds so far of the main process and of the rest (pool, forkserver...),
        and the system (kernel) part of each."""
        self.cpu_seconds()
        main = self._cpu_by_pid.get(self.pid, 0.0)
        main_system = self._system_by_pid.get(self.pid, 0.0)
        return {
            "main": main,
            "children": sum(self._cpu_by_pid.values()) - main,
            "main_system": main_system,
            "children_system": sum(self._system_by_pid.values()) - main_system,
        }

    def memory(self, elapsed_s: float, completed: int) -> MemorySample:
        main_rss, pool, tree = 0, [], 0
        memfds: dict[str, int] = {}  # each counted once, however many map it
        for process in self.processes():
            try:
                rss = process.memory_info().rss
                cmdline = " ".join(process.cmdline())
            except psutil.NoSuchProcess:
                continue
            self._hwm_by_pid[process.pid] = max(
                _hwm_bytes(process.pid), self._hwm_by_pid.get(process.pid, 0)
            )
            self._names[process.pid] = _role(process.pid, self.pid, cmdline)
            tree += rss
            _memfds(process.pid, memfds)
            if process.pid == self.pid:
                main_rss = rss
            elif self._names[process.pid] == "pool":
                pool.append(rss)
        return MemorySample(
            elapsed_s=round(elapsed_s, 2),
            completed=completed,
            main_rss=main_rss,
            pool_rss_max=max(pool, default=0),
            tree_rss=tree,
            pool_processes=len(pool),
            memfd_bytes=sum(memfds.values()),
        )

    def peak_rss(self) -> dict[str, Any]:
        """VmHWM (the kernel's peak resident set) of the main process and the largest
        pool process, in bytes; read now and at every memory sample."""
        self.memory(0.0, 0)
        main = self._hwm_by_pid.get(self.pid, 0)
        pool = [v for pid, v in self._hwm_by_pid.items() if self._names.get(pid) == "pool"]
        return {
            "main": main,
            "pool_max": max(pool, default=0),
            "processes": {
                f"{self._names.get(pid, '?')}:{pid}": v for pid, v in self._hwm_by_pid.items()
            },
        }

    def broker_connections(self, port: int) -> int:
        """Established TCP connections from the tree's main process to ``port`` (a
        worker's Kafka clients all live there). psutil reads the machine's whole TCP
        table for each process that holds any socket (35 ms with 3,400 sockets open):
        asking every process of the tree every 2 s made the benchmark's own CPU grow with
        the worker's connections, which only a long tail of hosts has many of."""
        try:
            connections = psutil.Process(self.pid).net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return 0
        return sum(
            1
            for c in connections
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
        )


def _role(pid: int, root_pid: int, cmdline: str) -> str:
    if pid == root_pid:
        return "main"
    # The forkserver and the resource tracker are the main process's children; the pool
    # processes are forked from the forkserver (and keep its command line).
    try:
        parent = psutil.Process(pid).ppid()
    except psutil.NoSuchProcess:
        return "pool"
    if parent != root_pid:
        return "pool"
    if "resource_tracker" in cmdline:
        return "resource_tracker"
    return "forkserver" if "forkserver" in cmdline else "child"


class Sampler:
    """A thread that reads every tree's memory (and broker connections) periodically."""

    def __init__(
        self,
        trees: list[ProcessTree],
        completed: Callable[[], int],
        *,
        broker_port: int,
        interval_s: float = 0.5,
        connections_every: int = 20,  # every 10 s: a count that seldom moves
    ) -> None:
        self.trees = trees
        self._completed = completed
        self._broker_port = broker_port
        self._interval_s = interval_s
        self._connections_every = connections_every
        self.samples: list[list[MemorySample]] = [[] for _ in trees]
        self.connections: list[list[int]] = [[] for _ in trees]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._started = 0.0

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sample(0)  # one last reading at the end

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(self._interval_s):
            tick += 1
            self._sample(tick)

    def _sample(self, tick: int) -> None:
        elapsed = time.monotonic() - self._started
        completed = self._completed()
        for i, tree in enumerate(self.trees):
            self.samples[i].append(tree.memory(elapsed, completed))
            if tick % self._connections_every == 0:
                self.connections[i].append(tree.broker_connections(self._broker_port))


def at_progress(samples: list[MemorySample], total: int, share: float) -> MemorySample | None:
    """The first sample taken once ``share`` of ``total`` images were completed."""
    for sample in samples:
        if sample.completed >= share * total:
            return sample
    return samples[-1] if samples else None


def cpu_of(pid: int | None) -> float:
    """User + system CPU seconds of one process (and its live children), 0 if gone."""
    if pid is None:
        return 0.0
    try:
        return ProcessTree(pid).cpu_seconds()
    except psutil.NoSuchProcess:
        return 0.0
