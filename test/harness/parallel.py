"""The suite on several pytest-xdist workers, and its timing-bound tests alone.

Most of the suite's time is waiting, not computing (a broker group's rebalance, a service
paused for 30 s, a pacing window), and waiting overlaps even on two cores, so
``python -m pytest`` runs ``-n auto`` workers: ``workers_for(cores)`` of them, more than
the cores. Every test's services are on free ports and in its own temporary folder, so
the workers share nothing but the machine.

A test whose assertions measure time, a rate at an origin, or CPU would measure the other
workers too, so it is marked ``@pytest.mark.timing("why, in one line")``. It runs last
(``run_order``) and alone: it holds a lock of the run exclusively, which every other test
holds shared (``RunLock``), so it starts only once the tests running beside it have
ended, and none starts beside it. Without xdist (``-n 0``) tests run one at a time
anyway and the lock is not taken.

The order also starts the longest tests first, so that the run does not end with one
worker finishing a two-minute test while the others idle: ``test/durations.json`` holds
each test's seconds from a whole run (``--store-durations`` writes it again); a test it
does not know counts as a short one of its kind.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pytest

TIMING = "timing"
DURATIONS_FILE = Path(__file__).resolve().parent.parent / "durations.json"
# What a test missing from the durations file is taken to last, by kind (seconds).
UNKNOWN_SERVICE_TEST_S = 5.0
UNKNOWN_TEST_S = 0.05
# Shorter tests without services are left out of the file: they fill the gaps in any order.
STORED_FROM_S = 0.1


def workers_for(cores: int) -> int:
    """How many workers ``-n auto`` starts on ``cores`` CPUs: two a core, since the tests
    mostly wait (four on this project's 2-core machine: docs/development.md has that
    run's figures). ``PYTEST_XDIST_AUTO_NUM_WORKERS`` or ``-n N`` choose otherwise."""
    return max(2, 2 * cores)


def is_timing(item: pytest.Item) -> bool:
    return item.get_closest_marker(TIMING) is not None


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
    """The tests to run: the longest first, the timing-bound ones last (longest first too).

    Each worker takes the next test as it finishes one (``--maxschedchunk 1``), so this is
    the order in which they start. Ties keep the collection's order (sorted() is stable),
    which keeps a module's short tests together; the order is the same on every worker,
    as xdist requires.
    """
    return sorted(items, key=lambda item: (is_timing(item), -estimate_s(item, durations)))


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
        return flocked(self.folder / f"{name}.lock", fcntl.LOCK_EX)


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


def run_lock(config: pytest.Config) -> RunLock | None:
    """The run's lock on an xdist worker; None when the tests run in one process."""
    if not hasattr(config, "workerinput"):
        return None
    # A worker's temporary folder is one of the run's: <run>/gw0, <run>/gw1, ...
    return RunLock(config._tmp_path_factory.getbasetemp().parent)


@contextlib.contextmanager
def held_alone(config: pytest.Config, name: str) -> Iterator[None]:
    """Hold the run's lock ``name`` exclusively: for tests that write one shared thing
    (pip builds in the source tree, ``build/`` and the egg-info), one at a time."""
    lock = run_lock(config)
    with contextlib.nullcontext() if lock is None else lock.alone(name):
        yield


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
