"""The suite's parallel run (test/harness/parallel.py): its order, its lanes and its lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from test.harness import parallel


@dataclass
class FakeItem:
    nodeid: str
    marks: dict[str, pytest.Mark] = field(default_factory=dict)

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return self.marks.get(name)


def item(nodeid: str, *marks: pytest.MarkDecorator) -> pytest.Item:
    return cast(pytest.Item, FakeItem(nodeid, {m.mark.name: m.mark for m in marks}))


def names(items: list[pytest.Item]) -> list[str]:
    return [i.nodeid for i in items]


def test_the_longest_start_first_and_the_timing_bound_last() -> None:
    items = [
        item("unit_a"),
        item("slow_timing", pytest.mark.timing("r")),
        item("e2e_short", pytest.mark.integration),
        item("unit_b"),
        item("quick_timing", pytest.mark.timing("r")),
        item("machine_timing", pytest.mark.timing("r", alone=True)),
        item("e2e_long", pytest.mark.integration),
        item("unknown_e2e", pytest.mark.integration),
    ]
    durations = {
        "slow_timing": 300.0,
        "quick_timing": 1.0,
        "e2e_short": 2.0,
        "e2e_long": 60.0,
        "unit_b": 0.5,
        "machine_timing": 500.0,
    }
    assert names(parallel.run_order(items, durations)) == [
        "e2e_long",
        "unknown_e2e",  # an unknown test with services: taken as 5 s
        "e2e_short",
        "unit_b",
        "unit_a",  # an unknown test without: taken as short
        "slow_timing",
        "quick_timing",
        "machine_timing",  # after the other timing-bound ones, however long
    ]


def test_ties_keep_the_collection_order() -> None:
    items = [item(f"t{n}") for n in range(20)]
    assert names(parallel.run_order(items, {})) == [f"t{n}" for n in range(20)]


@pytest.mark.parametrize("mark", [pytest.mark.timing(), pytest.mark.timing("  ")])
def test_a_timing_mark_needs_a_reason(mark: pytest.MarkDecorator) -> None:
    with pytest.raises(pytest.UsageError, match="needs a reason"):
        parallel.check_timing_marker(item("t", mark))
    parallel.check_timing_marker(item("t", pytest.mark.timing("asserts gaps")))


def test_durations_keep_every_service_test_and_the_slow_others(tmp_path: Path) -> None:
    durations = parallel.Durations()
    reports: list[tuple[str, float, dict[str, Any]]] = [
        ("fast_unit", 0.01, {}),
        ("fast_unit", 0.01, {}),
        ("slow_unit", 0.3, {}),
        ("fast_e2e", 0.02, {"integration": 1}),
        ("long_e2e", 40.0, {"integration": 1}),
        ("long_e2e", 2.0, {"integration": 1}),  # its teardown
    ]
    for nodeid, seconds, keywords in reports:
        durations.add(
            cast(pytest.TestReport, FakeReport(nodeid=nodeid, duration=seconds, keywords=keywords))
        )
    path = tmp_path / "durations.json"
    durations.store(path)
    assert json.loads(path.read_text()) == {"fast_e2e": 0.02, "long_e2e": 42.0, "slow_unit": 0.3}
    assert parallel.load_durations(path)["long_e2e"] == 42.0
    assert parallel.load_durations(tmp_path / "missing.json") == {}


@dataclass
class FakeReport:
    nodeid: str
    duration: float
    keywords: dict[str, Any]


# --- the lock -------------------------------------------------------------------------

WAIT_S = 10.0


def test_an_exclusive_holder_waits_for_the_shared_ones_and_keeps_new_ones_out(
    tmp_path: Path,
) -> None:
    lock = parallel.RunLock(tmp_path)
    release_first = threading.Event()
    first_holds = threading.Event()
    exclusive_holds = threading.Event()
    release_exclusive = threading.Event()
    late_holds = threading.Event()
    order: list[str] = []

    def shared(holds: threading.Event, release: threading.Event | None, name: str) -> None:
        with lock.shared():
            order.append(name)
            holds.set()
            if release is not None:
                release.wait(WAIT_S)

    def exclusive() -> None:
        with lock.exclusive():
            order.append("exclusive")
            exclusive_holds.set()
            release_exclusive.wait(WAIT_S)

    first = threading.Thread(target=shared, args=(first_holds, release_first, "first"))
    first.start()
    assert first_holds.wait(WAIT_S)
    writer = threading.Thread(target=exclusive)
    writer.start()
    # The writer now holds the gate and waits for the first reader: a new reader waits too.
    assert not exclusive_holds.wait(0.3)
    late = threading.Thread(target=shared, args=(late_holds, None, "late"))
    late.start()
    assert not late_holds.wait(0.3)

    release_first.set()
    assert exclusive_holds.wait(WAIT_S)
    assert not late_holds.wait(0.3)  # nothing beside the exclusive holder
    release_exclusive.set()
    assert late_holds.wait(WAIT_S)
    for thread in (first, writer, late):
        thread.join(WAIT_S)
    assert order == ["first", "exclusive", "late"]


def test_shared_holders_run_side_by_side(tmp_path: Path) -> None:
    lock = parallel.RunLock(tmp_path)
    with lock.shared():
        holds = threading.Event()

        def other() -> None:
            with lock.shared():
                holds.set()

        thread = threading.Thread(target=other)
        thread.start()
        assert holds.wait(WAIT_S)
        thread.join(WAIT_S)


def test_a_named_lock_is_held_by_one_at_a_time(tmp_path: Path) -> None:
    lock = parallel.RunLock(tmp_path)
    second_holds = threading.Event()

    def second() -> None:
        with lock.alone("source-tree"):
            second_holds.set()

    with lock.alone("source-tree"):
        thread = threading.Thread(target=second)
        thread.start()
        assert not second_holds.wait(0.3)
    assert second_holds.wait(WAIT_S)
    thread.join(WAIT_S)


# --- the lanes ------------------------------------------------------------------------


def test_the_timing_bound_tests_get_the_first_cpu_and_the_rest_the_others() -> None:
    lanes = parallel.Lanes.of([7, 3, 5])
    assert lanes == parallel.Lanes(timing=frozenset({3}), rest=frozenset({5, 7}))
    assert lanes.cpus_for(item("t", pytest.mark.timing("r"))) == {3}
    assert lanes.cpus_for(item("u")) == {5, 7}
    assert lanes.cpus_for(item("u"), lane_done=True) == {3, 5, 7}
    assert lanes.cpus_for(item("m", pytest.mark.timing("r", alone=True))) == {3, 5, 7}
    assert parallel.Lanes.of([0]) is None  # one CPU: the lock instead


def test_the_scheduler_reads_which_tests_are_timing_bound_from_every_worker(
    tmp_path: Path,
) -> None:
    for worker in ("gw0", "gw1"):
        parallel.timing_ids_path(tmp_path, worker).write_text(json.dumps(["a::t", "b::t"]))
    timing = parallel.TimingIds(tmp_path)
    assert [timing.scope(n) for n in ("a::t", "a::u", "b::t")] == ["timing", "a::u", "timing"]
    done = parallel.lane_done_path(tmp_path)
    for nodeid in ("a::t", "a::u", "a::t"):
        timing.ran(nodeid)
        assert not done.exists()
    timing.ran("b::t")
    assert done.exists()  # the last one: the others may have every CPU


def test_without_timing_bound_tests_the_lane_is_done_from_the_start(tmp_path: Path) -> None:
    parallel.timing_ids_path(tmp_path, "gw0").write_text("[]")
    assert parallel.TimingIds(tmp_path).scope("a::u") == "a::u"
    assert parallel.lane_done_path(tmp_path).exists()


# A run of its own: a conftest with the suite's hooks, three timing-bound tests, one that
# needs the machine, and six others on three workers. Each test notes its process and
# CPUs; the first timing-bound test and the first other one each wait for the other to
# have started, so the lanes are shown to run side by side, not merely apart; every other
# test marks itself running, and the one that needs the machine finds none running.
LANE_CONFTEST = """
from test.conftest import (
    pytest_collection_modifyitems,
    pytest_configure_node,
    pytest_runtest_protocol,
    pytest_xdist_make_scheduler,
)
"""
LANE_TESTS = """
import json, os, time
from pathlib import Path
import pytest

NOTES = Path(os.environ["LANE_NOTES"])

def note(kind, name):
    cpus = sorted(os.sched_getaffinity(0))
    with open(NOTES / "notes.jsonl", "a") as f:
        f.write(json.dumps({"kind": kind, "name": name, "pid": os.getpid(), "cpus": cpus}) + "\\n")

def meet(mine, theirs):
    (NOTES / mine).touch()
    deadline = time.monotonic() + 60
    while not (NOTES / theirs).exists():
        assert time.monotonic() < deadline, f"{theirs} never started"
        time.sleep(0.01)

@pytest.mark.timing("notes its CPUs")
@pytest.mark.parametrize("n", range(3))
def test_timing(n):
    note("timing", n)
    if n == 0:
        meet("timing-started", "other-started")
    if n == 2:  # the last before the one that needs the machine
        (NOTES / "timing-done").touch()

@pytest.mark.timing("notes its CPUs", alone=True)
def test_machine():
    running = NOTES / "machine-running"
    running.touch()
    try:
        note("machine", 0)
        assert not list(NOTES.glob("running-*")), "a test beside the one that needs the machine"
    finally:
        running.unlink()

@pytest.mark.parametrize("n", range(6))
def test_other(n):
    running = NOTES / f"running-{n}"
    running.touch()
    try:
        note("other", n)
        if n == 0:
            meet("other-started", "timing-started")
        if n == 1:
            # Running when the lane reaches the one that needs the machine: that one must
            # wait for it. A second to show it does (an absence: no event to await).
            meet("other-waits", "timing-done")
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                assert not (NOTES / "machine-running").exists(), "it did not wait"
                time.sleep(0.01)
    finally:
        running.unlink()
"""


@pytest.mark.skipif(len(parallel.MACHINE_CPUS) < 2, reason="a lane needs a CPU of its own")
# In the lane itself, where the first CPU is free for the run's own lane (its processes are
# given every CPU); beside the timing-bound tests, it would take theirs.
@pytest.mark.timing("runs a suite of its own, whose timing lane needs the first CPU")
def test_a_run_gives_the_timing_bound_tests_one_worker_on_a_cpu_of_their_own(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "conftest.py").write_text(textwrap.dedent(LANE_CONFTEST))
    (run / "test_lanes.py").write_text(textwrap.dedent(LANE_TESTS))
    (run / "pytest.ini").write_text(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
        "markers =\n    timing(reason): r\n"
    )
    env = {**os.environ, "LANE_NOTES": str(run), "PYTHONPATH": str(parallel.ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "3", "-p", "no:cacheprovider", "."],
        cwd=run,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.sched_setaffinity(0, parallel.MACHINE_CPUS),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    notes = [json.loads(line) for line in (run / "notes.jsonl").read_text().splitlines()]
    lanes = parallel.Lanes.of(parallel.MACHINE_CPUS)
    assert lanes is not None
    timing = [n for n in notes if n["kind"] == "timing"]
    others = [n for n in notes if n["kind"] == "other"]
    (machine,) = [n for n in notes if n["kind"] == "machine"]
    assert (len(timing), len(others)) == (3, 6)
    # One worker, so one test at a time; the one that needs the machine last, alone.
    assert len({n["pid"] for n in [*timing, machine]}) == 1
    assert set(machine["cpus"]) == lanes.timing | lanes.rest
    assert all(set(n["cpus"]) == lanes.timing for n in timing)
    # The one that met a timing-bound test ran on the others' CPUs; any after the last
    # timing-bound one may have had every CPU.
    assert [set(n["cpus"]) for n in others if n["name"] == 0] == [lanes.rest]
    assert all(set(n["cpus"]) in (lanes.rest, lanes.rest | lanes.timing) for n in others)


def test_workers_are_two_a_core() -> None:
    assert [parallel.workers_for(n) for n in (1, 2, 4)] == [2, 4, 8]


BACKSTOP_CONFTEST = """
from test.conftest import pytest_configure, pytest_runtest_protocol
from test.harness import parallel

parallel.Backstop.GRACE_S = 1.0
"""
BACKSTOP_TESTS = """
import time
import pytest

@pytest.fixture
def hangs_on_teardown():
    yield
    time.sleep(600)  # after pytest-timeout has failed the test: nothing times this

@pytest.mark.timeout(1)
def test_hangs(hangs_on_teardown):
    time.sleep(600)

def test_after():
    pass
"""


def test_a_teardown_that_hangs_past_the_timeout_ends_its_worker_and_not_the_run(
    tmp_path: Path,
) -> None:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(BACKSTOP_CONFTEST))
    (tmp_path / "test_backstop.py").write_text(textwrap.dedent(BACKSTOP_TESTS))
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "1", "-p", "no:cacheprovider", "-rA", "."],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(parallel.ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "test_backstop.py::test_hangs still running after 2 s; ending its worker" in out
    assert "in hangs_on_teardown" in out  # every thread's stack, the hung one among them
    assert "crashed while running 'test_backstop.py::test_hangs'" in out
    assert "PASSED test_backstop.py::test_after" in out
