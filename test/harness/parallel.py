"""The suite on several pytest-xdist workers, and its timing-bound tests on a CPU of their own.

Most of the suite's time is waiting, not computing (a broker group's rebalance, a service
paused for 30 s, a pacing window), and waiting overlaps even on two cores, so
``python -m pytest`` runs ``-n auto`` workers: ``workers_for(cores)`` of them, more than
the cores. Every test's services are on free ports and in its own temporary folder, so
the workers share nothing but the machine.

A test whose assertions measure time, a rate at an origin, or CPU would measure the other
workers too, so it is marked ``@pytest.mark.timing("why, in one line")``. The timing-bound
tests have a lane of their own (``Lanes``): the scheduler (``TimingLaneScheduling``) gives
them all to one worker, which runs them one after another on the machine's first CPU,
while the other workers run every other test on the other CPUs (a test's processes
inherit its CPUs). A timing-bound test is then never beside another one, and the rest of
the suite cannot take its CPU. One whose own processes need more than a CPU is marked
``alone=True`` (``needs_the_machine``), and runs last and alone: it holds a lock of the
run exclusively, which every other test holds shared (``RunLock``), so it starts only
once the tests running beside it have ended, and none starts beside it. On a machine of
one CPU, or with a ``--dist`` of the caller's, every timing-bound test runs so. Without xdist
(``-n 0``) tests run one at a time anyway and neither is needed.

The order also starts the longest tests first, so that the run does not end with one
worker finishing a two-minute test while the others idle: ``test/durations.json`` holds
each test's seconds from a whole run (``--store-durations`` writes it again); a test it
does not know counts as a short one of its kind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import fcntl
import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import pytest_timeout
from xdist.scheduler import LoadScopeScheduling

TIMING = "timing"
# The lock the timing lane's tests take one at a time (not RunLock's own files).
TIMING_LANE = "timing-lane"
# The CPUs this process may use, read when the suite starts, before any test narrows them.
MACHINE_CPUS = frozenset(os.sched_getaffinity(0))
ROOT = Path(__file__).resolve().parents[2]
DURATIONS_FILE = ROOT / "test" / "durations.json"
# What a test missing from the durations file is taken to last, by kind (seconds).
UNKNOWN_SERVICE_TEST_S = 5.0
UNKNOWN_TEST_S = 0.05
# Shorter tests without services are left out of the file: they fill the gaps in any order.
STORED_FROM_S = 0.1


def workers_for(cores: int) -> int:
    """How many workers ``-n auto`` starts on ``cores`` CPUs: two a core, since the tests
    mostly wait (four on this project's 2-core machine: the timing lane's, and three on
    the other CPU; docs/development.md has that run's figures).
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` or ``-n N`` choose otherwise."""
    return max(2, 2 * cores)


@dataclasses.dataclass(frozen=True)
class Lanes:
    """The CPU of the timing-bound tests, and those of every other test."""

    timing: frozenset[int]
    rest: frozenset[int]

    @classmethod
    def of(cls, cpus: Iterable[int]) -> Lanes | None:
        """The first CPU for the timing-bound tests, the others for the rest; None on a
        machine of one CPU, where the timing-bound tests need the run lock instead."""
        ordered = sorted(cpus)
        if len(ordered) < 2:
            return None
        return cls(frozenset(ordered[:1]), frozenset(ordered[1:]))

    def cpus_for(self, item: pytest.Item, lane_done: bool = False) -> frozenset[int]:
        """A test's CPUs: every CPU for one that needs the machine, and for every test once
        the timing-bound ones are done."""
        if lane_done or needs_the_machine(item):
            return self.timing | self.rest
        return self.timing if is_timing(item) else self.rest


def timing_ids_path(folder: Path, worker: str) -> Path:
    return folder / f"timing-tests-{worker}.json"


def write_timing_ids(config: pytest.Config, items: Iterable[pytest.Item]) -> None:
    """On a worker, the ids of its timing-bound tests, for the scheduler (which sees ids
    only): every worker collects the same tests, each writes its own file."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    ids = [item.nodeid for item in items if is_timing(item)]
    path = timing_ids_path(run_folder(config), workerinput["workerid"])
    path.write_text(json.dumps(ids))


def lane_done_path(folder: Path) -> Path:
    return folder / "timing-lane-done"


class TimingIds:
    """The timing-bound tests' ids, from the files the workers wrote in ``folder``; and
    once every one has been run, a file that says so (``lane_done_path``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._ids: frozenset[str] | None = None
        self._left: set[str] = set()

    @property
    def ids(self) -> frozenset[str]:
        if self._ids is None:
            # Asked once every worker has collected, so every worker's file is written.
            files = self.folder.glob(timing_ids_path(Path(), "*").name)
            self._ids = frozenset(i for f in files for i in json.loads(f.read_text()))
            self._left = set(self._ids)
            self._note_if_done()
        return self._ids

    def scope(self, nodeid: str) -> str:
        """The scheduler's unit of work for a test: one for all the timing-bound tests."""
        return TIMING if nodeid in self.ids else nodeid

    def ran(self, nodeid: str) -> None:
        if nodeid in self.ids and nodeid in self._left:
            self._left.discard(nodeid)
            self._note_if_done()

    def _note_if_done(self) -> None:
        if not self._left:
            lane_done_path(self.folder).touch()


class TimingLaneScheduling(LoadScopeScheduling):
    """xdist's ``loadscope`` with the timing-bound tests as one scope and every other test
    a scope of its own: one worker runs the timing-bound tests one after another (the
    scope of the most tests goes first), and the others share the rest as they finish
    tests (each is sent more when two or fewer are left to it). Once the last
    timing-bound test has run (or if there is none), the rest may have every CPU."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self._timing = TimingIds(config._tmp_path_factory.getbasetemp())

    def _split_scope(self, nodeid: str) -> str:
        return self._timing.scope(nodeid)

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        super().mark_test_complete(node, item_index, duration)
        self._timing.ran(self.registered_collections[node][item_index])


def is_timing(item: pytest.Item) -> bool:
    return item.get_closest_marker(TIMING) is not None


def needs_the_machine(item: pytest.Item) -> bool:
    """``@pytest.mark.timing(..., alone=True)``: a timing-bound test whose own processes
    need more than one CPU to keep to its bounds; it runs last of its lane, with every CPU,
    once every other test has ended."""
    marker = item.get_closest_marker(TIMING)
    return marker is not None and bool(marker.kwargs.get("alone"))


def check_timing_marker(item: pytest.Item) -> None:
    """A timing mark says why the test is one, in a non-empty string."""
    marker = item.get_closest_marker(TIMING)
    if marker is None:
        return
    reason = marker.args[0] if marker.args else marker.kwargs.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise pytest.UsageError(
            f"{item.nodeid}: @pytest.mark.timing needs a reason, "
            'e.g. @pytest.mark.timing("asserts the gaps between requests at the origin")'
        )


def load_durations(path: Path = DURATIONS_FILE) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        return {}


def estimate_s(item: pytest.Item, durations: Mapping[str, float]) -> float:
    known = durations.get(item.nodeid)
    if known is not None:
        return known
    return UNKNOWN_SERVICE_TEST_S if item.get_closest_marker("integration") else UNKNOWN_TEST_S


def run_order(items: Iterable[pytest.Item], durations: Mapping[str, float]) -> list[pytest.Item]:
    """The tests to run: the longest first, the timing-bound ones last (longest first too,
    and those that need the machine after them).

    The workers are sent tests in this order as they finish theirs, so it is about the
    order in which they start (the timing-bound ones go to their lane in their own order,
    or, without one, run last). Ties keep the collection's order (sorted() is stable),
    which keeps a module's short tests together; the order is the same on every worker,
    as xdist requires.
    """
    return sorted(
        items,
        key=lambda item: (is_timing(item), needs_the_machine(item), -estimate_s(item, durations)),
    )


class RunLock:
    """A readers-writer lock shared by one run's workers: two files in its temporary folder.

    ``flock`` alone would let a steady stream of shared holders starve an exclusive one,
    so a gate file comes first: the exclusive holder keeps the gate while it waits for the
    shared holders to leave and while it runs; a shared holder passes the gate only to
    take its share.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.gate = folder / "timing.gate"
        self.lock = folder / "timing.lock"

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with contextlib.ExitStack() as held:
            with flocked(self.gate, fcntl.LOCK_EX):  # let go once the share is taken
                held.enter_context(flocked(self.lock, fcntl.LOCK_SH))
            yield

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with flocked(self.gate, fcntl.LOCK_EX), flocked(self.lock, fcntl.LOCK_EX):
            yield

    def alone(self, name: str) -> contextlib.AbstractContextManager[None]:
        """The run's lock ``name``, held by one test at a time (and apart from the rest)."""
        # Prefixed, so that no name is the readers-writer lock's own file.
        return flocked(self.folder / f"alone-{name}.lock", fcntl.LOCK_EX)


@contextlib.contextmanager
def flocked(path: Path, how: int) -> Iterator[None]:
    """``path`` locked with ``flock`` (``LOCK_SH`` or ``LOCK_EX``), created if missing; the
    lock goes with the file's descriptor, so a process that dies holds nothing."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, how)
        yield
    finally:
        os.close(fd)


def run_folder(config: pytest.Config) -> Path:
    """On an xdist worker, the run's temporary folder: a worker's is one of the run's
    (<run>/popen-gw0, <run>/popen-gw1, ...)."""
    return Path(config._tmp_path_factory.getbasetemp().parent)


def run_lock(config: pytest.Config) -> RunLock | None:
    """The run's lock on an xdist worker; None when the tests run in one process."""
    if not hasattr(config, "workerinput"):
        return None
    return RunLock(run_folder(config))


@contextlib.contextmanager
def held_alone(config: pytest.Config, name: str) -> Iterator[None]:
    """Hold the run's lock ``name`` exclusively: for tests that write one shared thing
    (pip builds in the source tree, ``build/`` and the egg-info), one at a time."""
    lock = run_lock(config)
    with contextlib.nullcontext() if lock is None else lock.alone(name):
        yield


def timeout_s(item: pytest.Item) -> float | None:
    """The test's pytest-timeout: its ``timeout`` marker's, else the run's (None: none)."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
        if value is not None:
            return float(value)
    value = pytest_timeout.get_env_settings(item.config).timeout
    return None if value is None else float(value)


class Backstop:
    """Ends the process, every thread's stack on stderr first, when a test runs past its
    timeout by ``GRACE_S``: pytest-timeout (method signal) fails a test once and is then
    disarmed, so a teardown that hangs after it hangs the worker, and the run with it, to
    CI's limit. Ended, the worker is "crashed while running" the test, and xdist replaces it.
    """

    GRACE_S = 120.0

    def __init__(self, stderr_fd: int, exit: Callable[[int], object] = os._exit) -> None:
        # A copy of the real stderr, taken before capture: a test's captured stderr would
        # be lost with the process.
        self.stderr_fd = os.dup(stderr_fd)
        self.exit = exit

    @contextlib.contextmanager
    def watch(self, nodeid: str, timeout_s: float) -> Iterator[threading.Timer]:
        limit_s = timeout_s + self.GRACE_S
        timer = threading.Timer(limit_s, self._fire, args=(nodeid, limit_s))
        timer.daemon = True
        timer.start()
        try:
            yield timer
        finally:
            timer.cancel()

    def _fire(self, nodeid: str, limit_s: float) -> None:
        os.write(
            self.stderr_fd,
            f"\n{nodeid} still running after {limit_s:.0f} s; ending its worker\n".encode(),
        )
        faulthandler.dump_traceback(self.stderr_fd, all_threads=True)
        self.exit(1)


class Durations:
    """Each test's seconds (setup, call and teardown), as reported, for ``--store-durations``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.services: set[str] = set()

    def add(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        if "integration" in report.keywords:
            self.services.add(report.nodeid)

    def store(self, path: Path) -> None:
        """Write, by node id, every test that starts services and every other one of at
        least ``STORED_FROM_S`` (the rest are taken as short, which they are)."""
        kept = {
            nodeid: round(seconds, 2)
            for nodeid, seconds in sorted(self.seconds.items())
            if seconds >= STORED_FROM_S or nodeid in self.services
        }
        path.write_text(json.dumps(kept, indent=0) + "\n")
